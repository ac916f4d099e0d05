"""Redlock: one lock over N independent Redis masters (LOCKS_BACKEND=redlock).

Acquire: the acquire script runs on every master IN PARALLEL (a thread pool; each master has
its own redis-py client with no retries and REDLOCK_TIMEOUT as its socket timeouts, so a dead
master costs one timeout, not N, and never redis-py's 7 s of backed-off retries). The lock is
ours when a majority granted it within its validity, `ttl - elapsed - drift * ttl - 2 ms`;
otherwise every master is undone (token-checked) and we wait or retry. Release, extend and
check run token-checked on every master; extend/check succeed on a majority. Fewer than a
majority reachable: `LockUnavailable`, at once.

Fence (strictly increasing per lock name, on the shared microseconds-since-epoch scale):
each master keeps `fence:{name}`. Its acquire script returns `f = max(stored + 1, TIME_us)`
after storing it; the client takes `F = max(f)` over the granting majority G, then writes F as
a floor (`SET fence max(stored, F)`, and F into its lock hash) to ALL masters, and needs the
ack of every master of G (else the grant is undone) before the validity check and returning.

Why a later holder B (one that asks after A's release or expiry) gets `F_B > F_A`, by counters
alone: B's majority meets G_A in some master m. B's acquire ran on m only after A's lock there
ended: by A's release (after the grant, so after the floor) or by expiry (after A's validity,
which ended after the floor acks). So m stored `>= F_A` and answered `> F_A`, and F_B is the max.
Masters restarted EMPTY: the floor went to all masters, so while the masters that acked it and
kept it number more than N - majority (5 masters, all acked, 2 restarted: 3 left, and 3 + 3 > 5),
every majority still meets one of them: still counters alone.
What rests on clocks: when every master of B's majority that stored `>= F_A` has restarted empty
since, those answer `TIME_us`, which is `> F_A` only if their clock reads later than the clock
that minted F_A did (clocks in sync to better than the time between the two acquisitions, never
stepped back; counters run ahead of TIME only by +1 per acquisition within one microsecond).
Redlock's exclusion itself rests on clocks too (bounded drift of the lease), and on a master not
rejoining empty while a lock it granted is still valid (restart it after the longest ttl:
Redlock's "delayed restart").

Waiting (no polling): a refused attempt registers the waiter (ZADD token -> give-up time on
every master that refused it, which also gives the dashboard its waiter count). A release that
deleted the lock on a master where someone waits pushes one wake-up to that master's wake list
and reserves the lock there for HANDOFF_LEASE (`:handoff`): until a woken waiter takes it,
newcomers (the releaser's next attempt too) are refused and queue up, so nobody barges past the
queue; a woken waiter that died only costs the reservation. A waiter BLPOPs the wake list of
ONE master: the first, in URL order, that refused its last attempt. It registered there before
the holder's release there, so that release leaves a wake-up for it (a list keeps it until
popped: no wake-up is lost). Usually every waiter picks the same master, and Redis serves
blocked BLPOPs in FIFO order: hand-offs are FIFO in practice (no FIFO ticket on a majority: a
queue kept consistent across masters would cost a round trip per waiter per release). The
BLPOP's timeout is min(deadline, the end of the holder's lease or reservation), so a crashed
holder is passed over when its lease ends. A split vote (nobody holds a majority) retries
after a short random delay, as Redlock does. A piece given back (an undo) wakes a waiter but
reserves nothing. Cancellation (asyncio): the wait sleeps in one poll() on the BLPOP socket and
the CancelToken's pipe, so it ends at once; an attempt in flight ends within one REDLOCK_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import random
import select
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from locks.backends.base import Grant, HeldLock, LockBackend, Released
from locks.conf import locks_settings
from locks.exceptions import HolderChanged, LockUnavailable
from locks.hold import Cancelled
from locks.keys import LockKeys, name_from_key

if TYPE_CHECKING:
    from locks.hold import CancelToken, LockLike

# KEYS: lock, fence, waiters, handoff. ARGV: token, ttl_ms, owner, fence_ttl_ms, wait_ms (0: not
# waiting), woken ('1': this caller was woken by a release, the hand-off reservation is for it).
# {1, fence} granted; {0, pttl} held by another, or reserved for a woken waiter (the caller is
# registered as a waiter when wait_ms > 0).
# The first value of ACQUIRE's reply on one master; RELEASE, EXTEND and CHECK answer OK or not.
GOT, HELD = 1, 0
OK = 1

ACQUIRE = """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local holder = redis.call('HGET', KEYS[1], 'token')
local busy_ms = nil
if holder and holder ~= ARGV[1] then
  busy_ms = redis.call('PTTL', KEYS[1])
elseif not holder and ARGV[6] ~= '1' then
  local reserved = redis.call('PTTL', KEYS[4])
  if reserved > 0 then busy_ms = reserved end
end
if busy_ms then
  local wait_ms = tonumber(ARGV[5])
  if wait_ms > 0 then
    redis.call('ZADD', KEYS[3], now_ms + wait_ms, ARGV[1])
    if redis.call('PTTL', KEYS[3]) < wait_ms + 1000 then redis.call('PEXPIRE', KEYS[3], wait_ms + 1000) end
  end
  return {0, busy_ms}
end
redis.call('DEL', KEYS[4])
local f = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now_us)
local fs = string.format('%d', f)
redis.call('SET', KEYS[2], fs, 'PX', ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fs, 'since_us', string.format('%d', now_us))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return {1, fs}
"""

# KEYS: fence, lock, waiters. ARGV: F, fence_ttl_ms, token. Raise the fence floor to F, stamp our
# lock hash, and drop the waiter entry that a refusing master made for us.
FLOOR = """
redis.call('ZREM', KEYS[3], ARGV[3])
local stored = tonumber(redis.call('GET', KEYS[1]) or '0')
if stored < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
if redis.call('HGET', KEYS[2], 'token') == ARGV[3] then redis.call('HSET', KEYS[2], 'fence', ARGV[1]) end
return 1
"""

# KEYS: lock, waiters, wake, handoff. ARGV: token, keep ('1': we keep waiting, stay registered),
# reserve_ms (0: none). 1 if our lock was deleted here; then, if anyone waits, one waiter is woken
# and the lock is reserved for it (newcomers refused) for reserve_ms: no barging past the queue.
RELEASE = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] ~= '1' then redis.call('ZREM', KEYS[2], ARGV[1]) end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
if redis.call('ZCARD', KEYS[2]) > 0 then
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, 0)
  redis.call('PEXPIRE', KEYS[3], 60000)
  if ARGV[3] ~= '0' then redis.call('SET', KEYS[4], '1', 'PX', ARGV[3]) end
end
return 1
"""

# KEYS: lock. ARGV: token, ms, mode (0 check, 1 add, 2 replace). The ms left, 0 if not ours.
EXTEND = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local left = redis.call('PTTL', KEYS[1])
if left <= 0 then return 0 end
if ARGV[3] == '2' then left = tonumber(ARGV[2]) elseif ARGV[3] == '1' then left = left + tonumber(ARGV[2]) end
if ARGV[3] ~= '0' then redis.call('PEXPIRE', KEYS[1], left) end
return left
"""

# KEYS: lock, waiters. {hash as a flat list, pttl, live waiters}.
DESCRIBE = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('ZCOUNT', KEYS[2], now_ms, '+inf')}
"""

_FAILED = object()  # a master's reply when it could not be reached (or answered an error)
SPLIT_RETRY = 0.05  # upper bound of the random delay after a split vote (seconds)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Master:
    """One Redis master: its own client (no retries, short timeouts) and its scripts."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0))
        self.scripts = {name: self.client.register_script(src) for name, src in (
            ("acquire", ACQUIRE), ("floor", FLOOR), ("release", RELEASE), ("extend", EXTEND),
            ("describe", DESCRIBE))}

    def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return self.scripts[script](keys=keys, args=args)


class RedlockBackend(LockBackend):
    name = "redlock"
    supports_combining = False
    counts_waiters = True
    limitations = ("Redlock: waiters are counted per master (the largest count is shown); a master must not "
                   "restart empty while a lock it granted is still valid.")

    def __init__(self, *, redlock_urls: list[str] | tuple[str, ...], redlock_clock_drift: float = 0.01,
                 redlock_timeout: float = 0.2) -> None:
        urls = [u.strip() for u in (redlock_urls.split(",") if isinstance(redlock_urls, str) else redlock_urls)
                if u and u.strip()]
        if not urls:
            raise ImproperlyConfigured("LOCKS['REDLOCK_URLS'] (LOCKS_REDLOCK_URLS) names no Redis master, e.g. "
                                       "redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0,redis://10.0.0.3:6379/0")
        self.timeout = float(redlock_timeout)
        self.drift = float(redlock_clock_drift)
        self.masters = [_Master(url, self.timeout) for url in urls]
        self.quorum = len(self.masters) // 2 + 1
        self._pool = ThreadPoolExecutor(max_workers=4 * len(self.masters), thread_name_prefix="redlock")

    # -- talking to the masters -----------------------------------------------------------
    def _on_all(self, call: Callable[[_Master], Any], only: list[int] | None = None) -> list[Any]:
        """`call(master)` on every master (or the indexes `only`) in parallel; _FAILED where it failed."""
        indexes = range(len(self.masters)) if only is None else only

        def safe(master: _Master) -> Any:
            try:
                return call(master)
            except Exception:  # unreachable, timed out, LOADING...: this master does not count
                return _FAILED

        futures = {i: self._pool.submit(safe, self.masters[i]) for i in indexes}
        return [futures[i].result() if i in futures else _FAILED for i in range(len(self.masters))]

    def _unavailable(self, name: str, replies: list[Any]) -> LockUnavailable:
        up = sum(r is not _FAILED for r in replies)
        return LockUnavailable(f"Redlock: only {up} of {len(self.masters)} Redis masters answered within "
                               f"{self.timeout:g}s; a majority ({self.quorum}) is needed", name=name)

    def _need_quorum(self, name: str, replies: list[Any]) -> None:
        if sum(r is not _FAILED for r in replies) < self.quorum:
            raise self._unavailable(name, replies)

    @staticmethod
    def _fence_ttl_ms(lock: LockLike) -> int:
        return max(lock._fence_ttl_ms(), lock._ttl_ms)

    # -- acquire ----------------------------------------------------------------------------
    def acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        keys = lock.keys
        contended = woken = False
        try:
            while True:
                if cancel is not None and cancel.cancelled:
                    raise Cancelled
                sent = time.monotonic()
                wait_ms = int((deadline - sent) * 1000) + 1000 if blocking else 0
                args = [token, lock._ttl_ms, owner, self._fence_ttl_ms(lock), max(wait_ms, 0), "1" if woken else "0"]

                def run(m: _Master, a: list[Any] = args) -> Any:
                    return m.run("acquire", _keys(keys, "lock", "fence", "waiters", "handoff"), a)

                replies = self._on_all(run)
                granted = [i for i, r in enumerate(replies) if r is not _FAILED and int(r[0]) == GOT]
                if len(granted) >= self.quorum:
                    grant = self._confirm(lock, token, sent, replies, granted, contended)
                    if grant is not None:
                        return grant
                else:
                    self._need_quorum(lock.name, replies)
                # Undo where we may hold a piece (granted, or no answer: it may have run there).
                pieces = [i for i, r in enumerate(replies) if r is _FAILED or int(r[0]) == GOT]
                if pieces:
                    self._undo(lock, token, only=pieces, keep_waiting=True)
                if not blocking or time.monotonic() >= deadline:
                    break
                contended = True
                refused = sorted(max(int(r[1]), 0) for r in replies if r is not _FAILED and int(r[0]) == HELD)
                if len(refused) >= self.quorum:
                    # Another holder has a majority: sleep until woken, or until enough of its
                    # masters have let the lease go (it may have crashed).
                    lease_end = sent + refused[self.quorum - len(granted) - 1] / 1000 + 0.002
                    # On a master that refused us: our registration there preceded the holder's
                    # release there, which therefore pushes a wake-up for us (none is lost).
                    waited_on = next(i for i, r in enumerate(replies) if r is not _FAILED and int(r[0]) == HELD)
                    woken = self._wait(waited_on, keys.wake, min(deadline, lease_end), deadline, cancel) or woken
                else:
                    # A split vote (or our lock lost to the validity check): nobody has a
                    # majority; retry soon, at a random moment so the contenders spread out.
                    _sleep(min(deadline, time.monotonic() + random.uniform(0.002, SPLIT_RETRY)), cancel)
        except BaseException:
            # Cancelled, interrupted or refused: leave nothing behind (lock pieces, waiter entries).
            with contextlib.suppress(Exception):
                self._undo(lock, token)
            raise
        if blocking:  # leave the waiter lists (a try-lock never joined them, nor kept a piece)
            self._undo(lock, token)
        return None

    def _confirm(self, lock: LockLike, token: str, sent: float, replies: list[Any], granted: list[int],
                 contended: bool) -> Grant | None:
        """Granted by a majority: floor the fence everywhere, check the validity. None: undo and retry."""
        keys = lock.keys
        fence = max(int(replies[i][1]) for i in granted)
        acks = self._on_all(lambda m: m.run("floor", [keys.fence, keys.lock, keys.waiters],
                                            [fence, self._fence_ttl_ms(lock), token]))
        if any(acks[i] is _FAILED for i in granted):
            return None  # a granting master missed the floor: F might not bind every later fence
        margin = self.drift * lock.ttl + 0.002
        validity = lock.ttl - (time.monotonic() - sent) - margin
        if validity <= 0:
            return None
        # The lease counts from `sent` (before any master started it), shortened by the drift.
        return Grant(fence=fence, lease_start=sent - margin, lease=lock.ttl, contended=contended)

    def _undo(self, lock: LockLike, token: str, *, only: list[int] | None = None, keep_waiting: bool = False) -> None:
        """Release `token`'s pieces (on the masters `only`, default all); unregister the waiter
        unless it keeps waiting (then it must stay registered, or no release would wake it).
        A piece given back wakes a waiter but reserves nothing: it was never a real hold."""
        keys = lock.keys
        self._on_all(lambda m: m.run("release", _keys(keys, "lock", "waiters", "wake", "handoff"),
                                     [token, "1" if keep_waiting else "0", 0]), only=only)

    def _wait(self, index: int, wake_key: str, until: float, deadline: float, cancel: CancelToken | None) -> bool:
        """BLPOP the wake list of master `index` until `until` (monotonic), without polling. True: woken."""
        pool = self.masters[index].client.connection_pool
        conn: Any = None  # redis-py's Connection: its socket (private) is polled here
        try:
            conn = pool.get_connection()
            block = max(deadline - time.monotonic() + 0.05, 0.01)
            conn.send_command("BLPOP", wake_key, f"{block:.3f}")
            poller = select.poll()
            poller.register(conn._sock, select.POLLIN)
            if cancel is not None:
                poller.register(cancel.fileno(), select.POLLIN)
            while True:
                if cancel is not None and cancel.cancelled:
                    raise Cancelled
                left = until - time.monotonic()
                if left <= 0:
                    break
                fired = {fd for fd, _ in poller.poll(left * 1000)}
                if cancel is not None and cancel.cancelled:
                    raise Cancelled
                if conn._sock.fileno() in fired:
                    reply = conn.read_response()
                    pool.release(conn)
                    conn = None
                    return bool(reply)
        except (redis.RedisError, OSError, AttributeError):
            # The master went away under us: fall back to a plain timed sleep (one timeout long).
            _sleep(min(until, time.monotonic() + self.timeout), cancel)
        finally:
            if conn is not None:  # still in flight: hang up (the server drops the BLPOP with us)
                conn.disconnect()
                pool.release(conn)
        return False

    # -- release / extend / check -----------------------------------------------------------
    def release(self, lock: LockLike, *, token: str) -> bool:
        keys = lock.keys
        replies = self._on_all(lambda m: m.run("release", _keys(keys, "lock", "waiters", "wake", "handoff"),
                                               [token, "0", lock._handoff_ms()]))
        self._need_quorum(lock.name, replies)
        return sum(1 for r in replies if r is not _FAILED and int(r) == OK) >= self.quorum

    def _lease_left(self, lock: LockLike, token: str, ms: int, mode: str) -> int:
        sent = time.monotonic()
        replies = self._on_all(lambda m: m.run("extend", [lock.keys.lock], [token, ms, mode]))
        self._need_quorum(lock.name, replies)
        lefts = sorted((int(r) for r in replies if r is not _FAILED and int(r) > 0), reverse=True)
        if len(lefts) < self.quorum:
            return 0
        # A majority holds it for at least the quorum-th longest lease; less the drift and the trip.
        left = lefts[self.quorum - 1] - int(self.drift * lefts[self.quorum - 1]) - 2
        left -= int((time.monotonic() - sent) * 1000)
        return max(left, 1)

    def extend(self, lock: LockLike, *, token: str, ms: int, replace: bool) -> int:
        return self._lease_left(lock, token, ms, "2" if replace else "1")

    def check(self, lock: LockLike, *, token: str) -> int:
        return self._lease_left(lock, token, 0, "0")

    def locked(self, lock: LockLike) -> bool:
        return self._holder(lock.name) is not None

    # -- dashboard --------------------------------------------------------------------------
    def _holder(self, name: str) -> tuple[HeldLock, str] | None:
        """The hold that a majority of masters agree on, with its token; None if free."""
        keys = LockKeys.for_name(name)
        replies = self._on_all(lambda m: m.run("describe", [keys.lock, keys.waiters], []))
        self._need_quorum(name, replies)
        pieces: list[tuple[dict[str, str], int]] = []
        waiters = 0
        for reply in replies:
            if reply is _FAILED:
                continue
            flat, pttl, live = reply
            waiters = max(waiters, int(live))
            if isinstance(flat, dict):  # RESP3 may hand back a map
                data = {_text(k): _text(v) for k, v in flat.items()}
            else:
                data = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
            if data.get("token") and int(pttl) > 0:
                pieces.append((data, int(pttl)))
        votes = Counter(d["token"] for d, _ in pieces)
        if not votes:
            return None
        token, count = votes.most_common(1)[0]
        if count < self.quorum:
            return None
        mine = [(d, p) for d, p in pieces if d["token"] == token]
        since = min(int(d.get("since_us", 0)) for d, _ in mine) / 1e6
        ttl_left = sorted((p for _, p in mine), reverse=True)[self.quorum - 1] / 1000
        held = HeldLock(name=name, owner=mine[0][0].get("owner", "?"), fence=max(int(d["fence"]) for d, _ in mine),
                        held_since=since, held_for=max(0.0, time.time() - since), ttl_left=ttl_left,
                        waiters=waiters)
        return held, token

    def describe(self, name: str) -> HeldLock | None:
        found = self._holder(name)
        return None if found is None else found[0]

    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        """SCAN enough masters that every lock held on a majority is seen (N - majority + 1)."""
        bound = 1000 if limit is None else limit
        match = f"{locks_settings.KEY_PREFIX}lock:{{{prefix}*}}"

        def scan(master: _Master) -> set[str]:
            names: set[str] = set()
            cursor = 0
            for _ in range(50):  # bounded: at most 50 SCAN pages per master
                cursor, raw = master.client.scan(cursor=cursor, match=match, count=1000, _type="hash")
                names.update(name_from_key(_text(k)) for k in raw)
                if cursor == 0 or len(names) >= bound:
                    break
            return names

        replies = self._on_all(scan)
        self._need_quorum(prefix or "*", replies)
        names: set[str] = set()
        answered = 0
        for reply in replies:
            if reply is not _FAILED and answered < len(self.masters) - self.quorum + 1:
                names |= reply
                answered += 1
        out = []
        for name in sorted(names):
            found = self._holder(name)
            if found is not None:
                out.append(found[0])
            if len(out) >= bound:
                break
        return out

    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        found = self._holder(name)
        if found is None:
            return None
        held, token = found
        if expected_fence is not None and held.fence != int(expected_fence):
            raise HolderChanged(f"the holder changed: {held.owner} holds it now with fence {held.fence}, not fence "
                                f"{expected_fence}", name=name, owner=held.owner, fence=held.fence)
        keys = LockKeys.for_name(name)
        # Token-checked on every master: a hold that replaced this one in between is left alone.
        handoff_ms = max(1, int(float(locks_settings.HANDOFF_LEASE) * 1000))
        replies = self._on_all(lambda m: m.run("release", _keys(keys, "lock", "waiters", "wake", "handoff"),
                                               [token, "0", handoff_ms]))
        if not any(r is not _FAILED and int(r) == OK for r in replies):
            return None
        return Released(held.owner, held.fence, int(held.held_since * 1e6))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for master in self.masters:
            with contextlib.suppress(Exception):
                master.client.close()


def _keys(keys: LockKeys, *names: str) -> list[str]:
    """The Redis keys of one lock by name; `handoff` is the reservation for a woken waiter."""
    return [f"{keys.lock}:handoff" if n == "handoff" else getattr(keys, n) for n in names]


def _sleep(until: float, cancel: CancelToken | None) -> None:
    """Sleep until `until` (monotonic); with a CancelToken, wake at once when it is cancelled."""
    left = until - time.monotonic()
    if cancel is None:
        time.sleep(max(left, 0.0))
        return
    if left > 0:
        select.select([cancel.fileno()], [], [], left)
    if cancel.cancelled:
        raise Cancelled
