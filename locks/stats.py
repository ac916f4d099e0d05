"""Lock statistics, counted in each process and flushed to Redis at most once a second.

Why not inside the lock scripts, as before: on Redis Cluster a script may only touch keys of one
slot, i.e. of one lock, so a script cannot add to a family-wide row or to a global index. And
per-name rows do not scale: every `coupon:N:user:M` or idempotency key ever locked left a stats
hash (and a fence key) for days. So:

- A `Lock` records, in memory, what it saw: acquisitions (contended or not, with the wait the
  client measured), finished holds (hold time), timeouts, lost locks and long waits.
- A daemon thread flushes them at most every LOCKS["STATS_FLUSH_INTERVAL"] seconds, in ONE
  pipeline per Redis client (each client's in a short-lived thread of its own, so a Redis that
  is down, retried with backoff for seconds, never delays another's): HINCRBY on
  `<p>lockstats:{family}` (counters and the log2 histogram buckets of locks/histogram.py,
  among them the combining batches: `batches`, `batched_requests`, `b<k>`; plus HSET of
  `last_batch_ms`, see `Recorder.batch`),
  ZINCRBY `<p>lockhot:{family}` name (acquisitions),
  trimmed to the top LOCKS["STATS_TOP_N"] names, SADD `<p>lockfamilies`; TTL METRICS_TTL.
  One-shot locks add to their family's row only: their names are never kept.
- The same flush publishes this process's current holds in `<p>lockheld` (a sorted set:
  "<name> <token>" -> lease end in unix ms) and removes the ones released since, so the
  dashboard lists held locks from this small index, never by SCANning the keyspace.

Trade-offs, on purpose: the numbers in Redis lag by up to one flush interval; a process killed
with SIGKILL loses at most its last interval of counters (a normal exit flushes: atexit, and
multiprocessing's exit hook for forked workers); the hot-name counts are exact for names that
stay in the top N and approximate (lost) for names that fall out of it. A forked child starts
with an empty recorder (the parent flushes its own counts). `flush()` flushes now (tests,
commands, a load-test worker before it reports).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from locks import histogram, metrics
from locks.conf import locks_settings, pid
from locks.connection import default_client
from locks.exceptions import LockUnavailable
from locks.keys import families_key, held_key, held_member, hot_key, stats_key

if TYPE_CHECKING:
    from redis import Redis

    from locks.hold import Hold, LockLike

log = logging.getLogger("locks")

MAX_FAILURES = 5
# How long flush() waits for the clients' writes (a healthy Redis takes milliseconds).
FLUSH_WAIT = 2.0
# Pending names kept per family while Redis is unreachable (the rest are dropped, not the counters).
_MAX_PENDING_NAMES = 1000


@dataclass
class _Pending:
    """What one (Redis client, key prefix) has to flush."""

    counters: dict[str, Counter[str]] = field(default_factory=dict)  # family -> field -> n
    names: dict[str, Counter[str]] = field(default_factory=dict)  # family -> name -> acquisitions
    latest: dict[str, dict[str, int]] = field(default_factory=dict)  # family -> field -> latest value (HSET)
    live: dict[int, Hold] = field(default_factory=dict)  # id(hold) -> hold, not yet released
    published: dict[int, str] = field(default_factory=dict)  # id(hold) -> member in the held index
    gone: list[str] = field(default_factory=list)  # published members whose hold ended
    failures: int = 0  # flushes in a row that could not reach this Redis

    def empty(self) -> bool:
        return not (self.counters or self.names or self.latest or self.live or self.gone)


class Recorder:
    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._pending: dict[tuple[Any, str], _Pending] = {}
        self._thread: threading.Thread | None = None
        self._inflight: set[tuple[Any, str]] = set()  # clients a flush thread is writing to now
        self._pid = pid()
        self._exit_hooked = False

    # -- recording (the lock's hot path: a mutex and a few dict updates) --------------------
    def _slot(self, lock: LockLike) -> _Pending:
        return self._slot_of(lock._explicit_client, lock.keys.prefix)

    def _slot_of(self, client: Redis | None, prefix: str) -> _Pending:
        key = (client, prefix)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending()
        return pending

    def _count(self, pending: _Pending, family: str, **fields: int) -> None:
        counters = pending.counters.get(family)
        if counters is None:
            counters = pending.counters[family] = Counter()
        for name, n in fields.items():
            counters[name] += n

    # acquired() and ended() run on every lock operation, inside the caller's critical section:
    # plain dict arithmetic, no keyword dicts, the flusher checked only when it may be missing.
    def acquired(self, lock: LockLike, hold: Hold, *, contended: bool) -> None:
        family = lock.family
        wait_bucket = f"w{histogram.bucket_of(hold.waited * 1e6)}" if contended else None
        with self._mutex:
            pending = self._slot(lock)
            counters = pending.counters.get(family)
            if counters is None:
                counters = pending.counters[family] = Counter()
            counters["acquired"] += 1
            if wait_bucket is not None:
                counters["contended"] += 1
                counters[wait_bucket] += 1
            if not lock.one_shot:
                names = pending.names.get(family)
                if names is None:
                    names = pending.names[family] = Counter()
                names[lock.name] += 1
            pending.live[id(hold)] = hold
            if self._thread is None or not self._exit_hooked:
                self._start()
        metrics.acquired(lock, hold, contended=contended)  # Prometheus (locks/metrics.py)

    def ended(self, lock: LockLike, hold: Hold, *, released: bool | None) -> None:
        """A hold is over: released (its hold time is counted), found lost at release (False), or
        its release could not reach Redis (None: it lapses with its lease; nothing is counted)."""
        field = None
        if released is not None:
            field = f"h{histogram.bucket_of((time.monotonic() - hold.acquired_at) * 1e6)}" if released else "lost"
        with self._mutex:
            pending = self._slot(lock)
            if field is not None:
                counters = pending.counters.get(lock.family)
                if counters is None:
                    counters = pending.counters[lock.family] = Counter()
                counters[field] += 1
            self._forget(pending, hold)
            if self._thread is None or not self._exit_hooked:
                self._start()
        metrics.ended(lock, hold, released=released)

    @staticmethod
    def _forget(pending: _Pending, hold: Hold) -> None:
        pending.live.pop(id(hold), None)
        member = pending.published.pop(id(hold), None)
        if member is not None:
            pending.gone.append(member)

    def count(self, lock: LockLike, **fields: int) -> None:
        """Other counters: timeouts, long_waits, lost (during renewal is not counted: release is)."""
        with self._mutex:
            self._count(self._slot(lock), lock.family, **fields)
            self._start()
        metrics.count(lock, fields)

    def batch(self, lock: LockLike, size: int) -> None:
        """A combiner's turn ended having served `size` requests (its own + those it took).

        Counted: `batches`, `batched_requests` (so mean = batched_requests / batches), the
        batch-size bucket `b<k>` (locks/histogram.py) and `last_batch_ms`, the unix time of the
        latest batch. That one is written with HSET, not as a max: each process flushes within
        an interval of its batch, so a later flush of an older batch can set it back by at most
        about one flush interval (more only while Redis is unreachable), which a "3 s ago" does
        not show; a max would cost a script or a key of its own per family.
        """
        bucket = f"b{histogram.batch_bucket_of(size)}"
        now_ms = int(time.time() * 1000)
        family = lock.family
        with self._mutex:
            pending = self._slot(lock)
            self._count(pending, family, batches=1, batched_requests=size, **{bucket: 1})  # once a batch
            latest = pending.latest.setdefault(family, {})
            latest["last_batch_ms"] = max(latest.get("last_batch_ms", 0), now_ms)
            if self._thread is None or not self._exit_hooked:
                self._start()
        metrics.batch(lock, size)

    def force_released(self, family: str, *, since_us: int, now_us: int, client: Redis | None = None) -> None:
        """An operator freed a lock of `family`: a finished hold and a force release, flushed at
        once (to `client`, default the LOCKS cache alias's Redis)."""
        bucket = histogram.bucket_of(max(now_us - since_us, 0))
        with self._mutex:
            self._count(self._slot_of(client, locks_settings.KEY_PREFIX), family, force_released=1,
                        **{f"h{bucket}": 1})
        metrics.force_released(family, since_us=since_us, now_us=now_us)
        self.flush()

    # -- flushing --------------------------------------------------------------------------
    def _start(self) -> None:
        """Under the mutex: make sure the flusher runs in this process."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="locks-stats", daemon=True)
            self._thread.start()
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(self.flush, at_exit=True)
            try:  # forked multiprocessing workers leave through os._exit: no atexit there
                from multiprocessing import util

                util.Finalize(None, self.flush, kwargs={"at_exit": True}, exitpriority=100)
            except Exception:  # pragma: no cover - best effort
                pass

    def _run(self) -> None:
        # Sleep in slices of at most a second and read the interval again each time: a long
        # interval set once (a test, a settings override) must not keep the flusher asleep after
        # it is shortened again.
        last = time.monotonic()
        while True:
            interval = max(float(locks_settings.STATS_FLUSH_INTERVAL), 0.01)
            with self._wake:
                self._wake.wait(max(min(interval - (time.monotonic() - last), 1.0), 0.0))
            if self._pid != pid():
                return
            if time.monotonic() - last >= max(float(locks_settings.STATS_FLUSH_INTERVAL), 0.01):
                last = time.monotonic()
                self._flush_each_in_its_thread()

    def _flush_each_in_its_thread(self) -> None:
        """One short-lived thread per Redis client with something to write, none while the last
        one for that client still runs: a Redis that is gone can take seconds per attempt
        (redis-py retries with backoff), and the other clients' stats must not wait for it."""
        with self._mutex:
            keys = [key for key, p in self._pending.items() if not p.empty() and key not in self._inflight]
            self._inflight.update(keys)
        for key in keys:
            threading.Thread(target=self._flush_in_thread, args=(key,), name="locks-stats-flush",
                             daemon=True).start()

    def _flush_in_thread(self, key: tuple[Any, str]) -> None:
        try:
            self._flush(only=key)
        finally:
            with self._mutex:
                self._inflight.discard(key)

    def flush(self, *, at_exit: bool = False) -> None:
        """Write everything counted so far: one pipeline per Redis client. Never raises.

        A batch that cannot be written is kept for the next flush, MAX_FAILURES times at most:
        counts are best effort, and a Redis that stays away must not grow the process. At exit,
        clients whose last flush failed are skipped: a dead Redis must not delay the exit.
        Otherwise each client is written in its own thread and the call waits FLUSH_WAIT seconds at
        most: a Redis that is gone (a plain redis-py client retries a refused connection with
        backoff for ~4 s) must not hold up the others' stats, which a caller of flush() expects.
        """
        if at_exit:
            self._flush(at_exit=True)
            return
        with self._mutex:
            keys = [key for key, p in self._pending.items() if not p.empty()]
        threads = [threading.Thread(target=self._flush, kwargs={"only": key}, name="locks-stats-flush", daemon=True)
                   for key in keys]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + FLUSH_WAIT
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def _flush(self, *, only: tuple[Any, str] | None = None, at_exit: bool = False) -> None:
        if self._pid != pid():
            return
        with self._mutex:
            work = [(client, prefix, p) for (client, prefix), p in self._pending.items()
                    if not p.empty() and (only is None or only == (client, prefix))
                    and not (at_exit and p.failures)]
            taken = [(client, prefix, p, self._take(p)) for client, prefix, p in work]
        for client, prefix, pending, batch in taken:
            if batch is None:
                continue
            try:
                self._write(client, prefix, batch)
                pending.failures = 0
                with self._mutex:  # a client seen once (a test's, a script's) is not kept forever
                    if pending.empty() and not pending.published and self._pending.get((client, prefix)) is pending:
                        del self._pending[(client, prefix)]
            except Exception as exc:  # a flush must never break the process that locks
                if at_exit:
                    continue  # logging may be shut down already; nothing to keep them for
                pending.failures += 1
                keep = isinstance(exc, RedisError | OSError) and pending.failures <= MAX_FAILURES
                log.warning("lock stats: flush failed (%s); %s", exc,
                            "keeping the counts for the next one" if keep else "dropping these counts")
                if keep:
                    with self._mutex:
                        self._put_back(self._pending.setdefault((client, prefix), pending), batch)

    @staticmethod
    def _take(pending: _Pending) -> dict[str, Any] | None:
        now_ms = int(time.time() * 1000)
        publish = {}
        for hid, hold in list(pending.live.items()):
            left = hold.remaining()
            if left <= 0:  # lease over and never released (the holder moved on): stop publishing it
                Recorder._forget(pending, hold)
                continue
            member = held_member(hold.name, hold.token)
            pending.published[hid] = member
            publish[member] = now_ms + int(left * 1000)
        batch = {"counters": pending.counters, "names": pending.names, "latest": pending.latest, "publish": publish,
                 "gone": pending.gone, "now_ms": now_ms}
        pending.counters, pending.names, pending.latest, pending.gone = {}, {}, {}, []
        if not (batch["counters"] or batch["names"] or batch["latest"] or publish or batch["gone"]):
            return None
        return batch

    @staticmethod
    def _put_back(pending: _Pending, batch: dict[str, Any]) -> None:
        for family, counters in batch["counters"].items():
            pending.counters.setdefault(family, Counter()).update(counters)
        for family, names in batch["names"].items():
            mine = pending.names.setdefault(family, Counter())
            mine.update(names)
            if len(mine) > _MAX_PENDING_NAMES:
                pending.names[family] = Counter(dict(mine.most_common(_MAX_PENDING_NAMES)))
        for family, latest in batch["latest"].items():
            kept = pending.latest.setdefault(family, {})
            for name, value in latest.items():
                kept[name] = max(kept.get(name, 0), value)
        pending.gone.extend(batch["gone"])

    @staticmethod
    def _write(client: Redis | None, prefix: str, batch: dict[str, Any]) -> None:
        if client is None:
            client = default_client()
        ttl = int(locks_settings.METRICS_TTL)
        top_n = max(int(locks_settings.STATS_TOP_N), 1)
        pipe = client.pipeline(transaction=False)
        families = set(batch["counters"]) | set(batch["names"]) | set(batch["latest"])
        if families and locks_settings.METRICS:
            for family, counters in batch["counters"].items():
                key = stats_key(family, prefix)
                for name, n in counters.items():
                    pipe.hincrby(key, name, n)
                pipe.expire(key, ttl)
            for family, latest in batch["latest"].items():
                key = stats_key(family, prefix)
                pipe.hset(key, mapping=latest)
                pipe.expire(key, ttl)
            for family, names in batch["names"].items():
                key = hot_key(family, prefix)
                for name, n in names.items():
                    pipe.zincrby(key, n, name)
                pipe.zremrangebyrank(key, 0, -(top_n + 1))
                pipe.expire(key, ttl)
            pipe.sadd(families_key(prefix), *sorted(families))
            pipe.expire(families_key(prefix), ttl)
        index = held_key(prefix)
        if batch["gone"]:
            pipe.zrem(index, *batch["gone"])
        if batch["publish"]:
            pipe.zadd(index, batch["publish"])
        if batch["gone"] or batch["publish"]:
            # Entries of processes that died holding: gone a few seconds after their lease.
            pipe.zremrangebyscore(index, "-inf", batch["now_ms"] - 5000)
            pipe.expire(index, ttl)
        pipe.execute()


_recorder = Recorder()


def recorder() -> Recorder:
    return _recorder


def flush() -> None:
    """Write this process's pending lock statistics to Redis now."""
    _recorder.flush()


def reset(*, client: Redis | None = None, prefix: str | None = None) -> list[str]:
    """Forget the statistics of every family (counters, histograms, busiest names): after a
    load test, so the dashboard shows the sale and not the test. Returns the families reset.

    Held locks, fences and the event log are state, not statistics: untouched. Counts that a
    process recorded but had not flushed yet arrive after the reset (at most one flush interval
    of activity). One DEL per key (never a multi-key DEL): on Redis Cluster the keys of two
    families live in different slots. Redis unreachable: `LockUnavailable`, nothing reset.
    """
    if client is None:
        client = default_client()
    key = families_key(prefix)
    try:
        families = sorted(f.decode() if isinstance(f, bytes) else f for f in client.smembers(key))
        if families:
            pipe = client.pipeline(transaction=False)
            for family in families:
                pipe.delete(stats_key(family, prefix))
                pipe.delete(hot_key(family, prefix))
                pipe.srem(key, family)
            pipe.execute()
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc
    return families


def _after_fork_in_child() -> None:
    global _recorder
    _recorder = Recorder()


os.register_at_fork(after_in_child=_after_fork_in_child)
