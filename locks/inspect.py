"""What is held, by whom, and how contended: the same answer in every process.

Held locks are asked of the backend in use (locks/backends/): every read here dispatches to it
(`client=`: the Redis backend on that client). Two ways to list them. `held_index_page` is
what the dashboard uses on every refresh: cheap reads only (the Redis backend reads the small
index the stats recorders keep, `<p>lockheld`, plus the names the caller passes, the busiest
of each family; see locks/stats.py). `held_locks` / `held_locks_page` are complete and
immediate (Redis: a SCAN of the keyspace, never KEYS; the index lags by up to a flush
interval), for the CLI's `--all` and for one-off checks.

Statistics are per lock family (`product:*`), with the top names of each family by
acquisitions, read from the Redis that every process flushes them to (locks/stats.py),
whichever backend holds the locks. A force release is counted there by family too.

Combining (locks/combining.py): a held lock's row says how many of its waiters queue a
*request* for the holder to serve (`queued_requests`) and how many wait for the lock itself; a
family's row has its batches (count, mean size, size histogram and quantiles, time of the last
one).

`ScrapeCollector`: the Prometheus gauges read from the lock service at scrape time (the
backend in use, the queue depth of the hot locks); locks/metrics.py has the per-process
counters.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from redis import Redis
from redis.exceptions import RedisError

from locks import events, histogram
from locks.backends import HeldLock, LockBackend, every_held, get_backend
from locks.conf import locks_settings
from locks.connection import default_client, text
from locks.exceptions import LockUnavailable
from locks.keys import LockKeys, events_key, families_key, family_of, held_key, hot_key, stats_key
from locks.stats import recorder

__all__ = ["HeldLock", "LockStats", "ScrapeCollector"]

log = logging.getLogger("locks")

COUNTERS = ("acquired", "contended", "handoffs", "released", "timeouts", "lost", "force_released", "long_waits",
            "batches", "batched_requests")
# Scrape-time queue depth: families read, and how many of each family's busiest names.
QUEUE_FAMILIES = ("product:*",)
QUEUE_TOP = 10


@dataclass
class LockStats:
    """The stats of one lock family (`name` is the family, e.g. `product:*`)."""

    name: str
    counters: dict[str, int] = field(default_factory=dict)
    wait: dict[int, int] = field(default_factory=dict, repr=False)
    hold: dict[int, int] = field(default_factory=dict, repr=False)
    top_names: list[tuple[str, int]] = field(default_factory=list)  # busiest names, by acquisitions
    batch: dict[int, int] = field(default_factory=dict, repr=False)  # combining batch sizes, histogram.batch_*
    last_batch_ms: int | None = None  # unix ms of the latest combining batch

    @property
    def mean_batch(self) -> float | None:
        """Requests served per batch, the combiner's own included (1.0: nobody was queued)."""
        batches = self.counters.get("batches", 0)
        return self.counters.get("batched_requests", 0) / batches if batches else None

    def batch_summary(self) -> dict[str, Any]:
        """Combining: batches, mean size, p50/p99 (upper bounds of their buckets), the histogram
        as {"3-4": n, ...} in size order, and the last batch time (unix seconds)."""
        mean = self.mean_batch
        return {
            "batches": self.counters.get("batches", 0),
            "batched_requests": self.counters.get("batched_requests", 0),
            "mean_batch": None if mean is None else round(mean, 2),
            "batch_p50": histogram.batch_percentile(self.batch, 0.50),
            "batch_p99": histogram.batch_percentile(self.batch, 0.99),
            "batch_sizes": {histogram.batch_bucket_label(b): self.batch[b] for b in sorted(self.batch)},
            "last_batch_at": None if self.last_batch_ms is None else self.last_batch_ms / 1000,
        }

    @property
    def contention(self) -> float:
        acquired = self.counters.get("acquired", 0)
        return self.counters.get("contended", 0) / acquired if acquired else 0.0

    def quantiles(self) -> dict[str, float | None]:
        return {
            "wait_p50": histogram.percentile(self.wait, 0.50),
            "wait_p99": histogram.percentile(self.wait, 0.99),
            "hold_p50": histogram.percentile(self.hold, 0.50),
            "hold_p99": histogram.percentile(self.hold, 0.99),
        }

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{c: self.counters.get(c, 0) for c in COUNTERS},
                "contention": round(self.contention, 4), **self.quantiles(), **self.batch_summary(),
                "top_names": [{"name": n, "acquired": a} for n, a in self.top_names]}


def ago(seconds: float | None) -> str:
    """12.3 -> "12 s ago": the last batch, as an operator reads it (clocks of one fleet: NTP-close)."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


# A hold is marked "stuck?" once held longer than STUCK_FACTOR times its family's hold p99, and
# never before STUCK_FLOOR seconds (docs/operations.md, "When a lock is stuck").
STUCK_FACTOR = 10
STUCK_FLOOR = 1.0


def stuck_after(hold_p99: float | None) -> float:
    """Seconds after which a hold of a family with this hold p99 looks stuck: 10 x p99, at least
    1 s (a checkout's 27 ms p99 -> 1 s; a job family's 4 s p99 -> 40 s). The floor keeps a family
    of millisecond holds from flagging every GC pause; a family with no finished hold yet gets it."""
    return max(STUCK_FACTOR * (hold_p99 or 0.0), STUCK_FLOOR)


def _client(client: Redis | None) -> Redis:
    return client if client is not None else default_client()


def _backend(client: Redis | None) -> LockBackend:
    """The backend in use, or the Redis backend on `client`."""
    return get_backend(client=client)


def backend_info() -> dict[str, str]:
    """Which backend holds the locks, and what it cannot show (the dashboard and `manage.py locks` say it)."""
    backend = get_backend()
    return {"name": backend.name, "label": backend.label, "limitations": backend.limitations}


def _decode(d: dict[bytes, bytes] | dict[str, str]) -> dict[str, str]:
    return {text(k): text(v) for k, v in d.items()}


def held_locks_page(*, prefix: str = "", cursor: int = 0, count: int = 500,
                    client: Redis | None = None) -> tuple[int, list[HeldLock]]:
    """One page of held locks whose name starts with `prefix`: (next_cursor, locks)."""
    return _backend(client).held_page(prefix=prefix, cursor=cursor, count=count)


def held_locks(*, prefix: str = "", limit: int | None = None, client: Redis | None = None) -> list[HeldLock]:
    """All held locks (up to `limit`), sorted by name."""
    return every_held(_backend(client), prefix=prefix, limit=limit)


def lock_info(name: str, *, client: Redis | None = None) -> HeldLock | None:
    return _backend(client).describe(name)


def _parse_stats(name: str, raw: dict[bytes, bytes]) -> LockStats:
    """The recorders store only what cannot be derived; the rest is computed here.

    Only contended acquisitions are put in a wait bucket (an uncontended one waited 0), and
    every finished hold is in a hold bucket, so `released` = holds - force releases.
    """
    fields = {k: int(v) for k, v in _decode(raw).items()}
    counters = {c: fields.get(c, 0) for c in COUNTERS}
    wait = histogram.parse(fields, "w")
    hold = histogram.parse(fields, "h")
    batch = histogram.parse(fields, "b")
    uncontended = counters["acquired"] - sum(wait.values())
    if uncontended > 0:
        wait[0] = wait.get(0, 0) + uncontended
    counters["released"] = max(0, sum(hold.values()) - counters["force_released"])
    counters["handoffs"] = counters["contended"]
    return LockStats(name=name, counters=counters, wait=wait, hold=hold, batch=batch,
                     last_batch_ms=fields.get("last_batch_ms"))


def family_matches(family: str, prefix: str) -> bool:
    """Could a name starting with `prefix` count in `family`? (`product:4` -> `product:*`.)"""
    if not prefix:
        return True
    shape = family_of(prefix)
    return family.startswith(shape) or shape.startswith(family)


def families(*, client: Redis | None = None) -> list[str]:
    """Every family with stats (within the metrics TTL)."""
    c = _client(client)
    try:
        return sorted(text(f) for f in c.smembers(families_key()))
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc


def lock_stats(*, prefix: str = "", top: int = 10, client: Redis | None = None) -> list[LockStats]:
    """Counters, histograms and the `top` busiest names of every family that may hold `prefix`.

    One SMEMBERS and one pipeline (an HGETALL and a ZREVRANGE per family): no keyspace SCAN.
    """
    c = _client(client)
    names = [f for f in families(client=c) if family_matches(f, prefix)]
    try:
        pipe = c.pipeline(transaction=False)
        for family in names:
            pipe.hgetall(stats_key(family))
            pipe.zrevrange(hot_key(family), 0, max(int(locks_settings.STATS_TOP_N), top) - 1, withscores=True)
        replies = pipe.execute() if names else []
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc
    out = []
    for i, family in enumerate(names):
        raw, hot = replies[2 * i], replies[2 * i + 1]
        if not raw:
            continue
        stats = _parse_stats(family, raw)
        stats.top_names = [(text(n), int(a)) for n, a in hot if text(n).startswith(prefix)][:top]
        out.append(stats)
    return out


def family_stats(family: str, *, top: int = 10, client: Redis | None = None) -> LockStats:
    c = _client(client)
    try:
        pipe = c.pipeline(transaction=False)
        pipe.hgetall(stats_key(family))
        pipe.zrevrange(hot_key(family), 0, top - 1, withscores=True)
        raw, hot = pipe.execute()
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=family) from exc
    stats = _parse_stats(family, raw)
    stats.top_names = [(text(n), int(a)) for n, a in hot]
    return stats


def stats_for(name: str, *, family: str | None = None, client: Redis | None = None) -> LockStats:
    """The stats row that counts `name`: its family's (`family_of(name)` unless given).

    Counters are kept per family, not per name; `acquisitions()` has a name's own count.
    """
    LockKeys.for_name(name)  # validates the name
    return family_stats(family_of(name) if family is None else family, client=client)


def acquisitions(names: list[str], *, family: str | None = None, client: Redis | None = None) -> dict[str, int]:
    """Acquisitions of each name, from its family's busiest names (0 if not among them, or one-shot)."""
    c = _client(client)
    try:
        pipe = c.pipeline(transaction=False)
        for name in names:
            pipe.zscore(hot_key(family_of(name) if family is None else family), name)
        replies = pipe.execute() if names else []
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc
    return {name: int(score or 0) for name, score in zip(names, replies, strict=True)}


def held_index_page(*, prefix: str = "", cursor: int = 0, count: int = 200, also: Sequence[str] = (),
                    client: Redis | None = None) -> tuple[int, list[HeldLock]]:
    """One page of held locks for the dashboard: cheap reads only (see the module docstring).

    The Redis backend reads the held index (it knows a hold from the first stats flush after it
    began, <= STATS_FLUSH_INTERVAL) plus the names in `also` (e.g. the busiest names, which
    catch the short holds of hot locks in between); another backend lists its held locks
    itself (one page).
    """
    return _backend(client).held_index_page(prefix=prefix, cursor=cursor, count=count, also=also)


def totals(stats: list[LockStats]) -> LockStats:
    total = LockStats(name="(all)")
    for s in stats:
        for k, v in s.counters.items():
            total.counters[k] = total.counters.get(k, 0) + v
    total.wait = histogram.merge(s.wait for s in stats)
    total.hold = histogram.merge(s.hold for s in stats)
    total.batch = histogram.merge(s.batch for s in stats)
    total.last_batch_ms = max((s.last_batch_ms for s in stats if s.last_batch_ms is not None), default=None)
    return total


def recent_events(*, limit: int = 100, kinds: tuple[str, ...] = events.KINDS,
                  client: Redis | None = None) -> list[dict[str, Any]]:
    c = _client(client)
    try:
        raw = c.lrange(events_key(), 0, max(0, int(locks_settings.EVENT_LOG_SIZE) - 1))
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc
    out = []
    for item in raw:
        entry = json.loads(item)
        if entry.get("kind") in kinds:
            out.append(entry)
            if len(out) >= limit:
                break
    return out


def force_release(name: str, *, actor: str = "", expected_fence: int | None = None, family: str | None = None,
                  client: Redis | None = None) -> HeldLock | None:
    """Free `name`; the next waiter gets it at once. Returns who held it (None: nobody did).

    With `expected_fence`, only the hold with that fence is released, atomically: an operator
    who confirmed "release the holder I see" never ends a newer holder's hold (HolderChanged).
    The old holder's fence is now stale, so its late writes are refused at the database. The
    release is counted in the stats of `family` (default `family_of(name)`).
    """
    backend = _backend(client)
    before = backend.describe(name)
    released = backend.force_release(name, expected_fence=expected_fence)
    if released is None:
        return None
    recorder().force_released(family_of(name) if family is None else family, since_us=released.since_us,
                              now_us=int(time.time() * 1e6), client=client)
    events.record_event(_client(client), events.FORCE_RELEASE, name, owner=released.owner, fence=released.fence,
                        actor=actor or f"{socket.gethostname()}:{os.getpid()}")
    if before is not None and before.fence == released.fence:
        return before
    return HeldLock(name=name, owner=released.owner, fence=released.fence, held_since=released.since_us / 1e6,
                    held_for=max(0.0, time.time() - released.since_us / 1e6), ttl_left=0.0, waiters=0)


# --- computed at scrape time ----------------------------------------------------------------
class ScrapeCollector:
    """The lock backend in use, and the queue depth of each hot family's busiest locks.

    Queue depth: the waiters queued on the QUEUE_TOP busiest names of each QUEUE_FAMILIES family
    (names from the stats' hot list, so a lock busy before the last stats flush), summed. A few
    round trips per scrape; if the lock service cannot answer, the gauge is left out, never a 500.
    """

    def __init__(self, families: tuple[str, ...] = QUEUE_FAMILIES, top: int = QUEUE_TOP) -> None:
        self.families = families
        self.top = top

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("locks_backend", "The lock backend this server uses (LOCKS['BACKEND']).")
        info.add_metric([], {"backend": str(locks_settings.BACKEND)})
        yield info
        depth = GaugeMetricFamily("locks_queue_depth", "Waiters queued on the busiest locks of a family now "
                                  "(the same on every server: take the max, not the sum).", labels=["family"])
        by_lock = GaugeMetricFamily("locks_queue_depth_by_lock", "Waiters queued on each of the busiest locks of a "
                                    "family now (the same on every server: take the max).", labels=["lock"])
        for family in self.families:
            try:
                waiters = queue_depths(family, top=self.top)
            except Exception as exc:  # a scrape must answer whatever the lock service does
                log.warning("metrics: queue depth of %s unavailable (%s)", family, exc)
                continue
            depth.add_metric([family], sum(waiters.values()))
            for name, n in waiters.items():
                by_lock.add_metric([name], n)
        yield depth
        yield by_lock


def queue_depths(family: str, *, top: int = QUEUE_TOP) -> dict[str, int]:
    """Waiters queued now on each of the family's `top` busiest names."""
    names = [name for name, _ in family_stats(family, top=top).top_names]
    return {name: info.waiters for name in names if (info := lock_info(name)) is not None}


def queue_depth(family: str, *, top: int = QUEUE_TOP) -> int:
    return sum(queue_depths(family, top=top).values())


def leftovers(names: Sequence[str], *, client: Redis | None = None) -> list[str]:
    """What a finished run must not leave, for these lock names: a key of theirs without a TTL
    (the lock, its fence, queue, waiters, wake, taken and signal keys; their families' stats and
    busiest names; the shared family set and held index), or one of them still held. The
    library's own knowledge of its keys: a project's invariant check (I6) asks it here."""
    c = _client(client)
    out = []
    for name in names:
        keys = LockKeys.for_name(name)
        for key in c.scan_iter(match=f"{keys.lock}*", count=1000):
            if c.pttl(key) == -1:
                out.append(f"{text(key)} has no TTL")
        if c.exists(keys.lock):
            out.append(f"lock {name} is still held")
    shared = {stats_key(family_of(n)) for n in names} | {hot_key(family_of(n)) for n in names}
    shared |= {families_key(), held_key()}
    for key in sorted(shared):
        if c.pttl(key) == -1:
            out.append(f"{key} has no TTL")
    return out
