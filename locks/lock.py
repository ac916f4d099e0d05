"""A Redis lock that hands off fairly, fences its holders and always expires.

Why not redis-py's `Lock` (what django-redis `cache.lock()` returns): it never expires by
default, polls every 0.1 s while waiting (so a waiter sleeps through most releases and the
releasing process barges back in: some processes starve), issues no fencing token, and keys
its token to a thread-local, which asyncio tasks share. This lock:

- acquires in one round trip (one Lua script: SET-if-free with a TTL, plus a fencing token);
- queues waiters FIFO in Redis; a release hands the lock *directly* to the head waiter and
  wakes only that waiter, through a list it BLPOPs, so nobody polls and nobody starves;
- hands off *provisionally*: the waiter is granted a short lease (HANDOFF_LEASE) and confirms
  it to its own ttl when it wakes. Of the three known ways to skip a waiter that died queued,
  waiter heartbeats cost every waiter a write per interval, and Redisson's fair lock (waiter
  timeouts in a sorted set, pruned by whoever acquires next) still hands the lock to a dead
  waiter whose timeout has not passed; a provisional grant costs nothing unless the waiter is
  dead, and then only the short lease;
- lets a waiter sleep until the lease it was told of ends, then look again: it times that
  itself on the socket (Redis's own blocking timeouts fire on a 100 ms timer), so a crashed
  holder costs its lease and a few ms. If the lock passes to a shorter lease meanwhile, a push
  on the lock's wake list makes one live waiter look again at once;
- bounds every Redis read by the client's socket timeout: a long wait is a chain of reads;
- issues fences that strictly increase per name, even after Redis loses its data, because
  they are derived from the Redis clock in microseconds and the last fence issued;
- treats a holder as one acquisition (a `Hold`), not a thread-local slot: threads, asyncio
  tasks and forked children can never release or extend each other's hold;
- can renew its lease (bounded by `max_hold`) and tells the holder when it lost the lock;
- counts its statistics in the process (locks/stats.py), per lock *family*, off the scripts:
  each script touches only the keys of its own lock (one Redis Cluster slot), and an acquire
  pays for no stats writes;
- can be one-shot (`one_shot=True`) for names used once, like idempotency keys: then nothing of
  the lock remains in Redis after its release.

A lease lock can never be safe against pauses on its own (Kleppmann); the fence, checked at
the resource (`UPDATE ... WHERE fence < :fence`), is what makes a late writer harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import os
import select
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from django_redis import get_redis_connection
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from locks import events
from locks.backends import LockBackend, get_backend
from locks.conf import locks_settings
from locks.exceptions import LockLost, LockNotOwned, LockTimeout, LockUnavailable
from locks.keys import LockKeys, family_of
from locks.renewal import renewer
from locks.scripts import script
from locks.stats import recorder

log = logging.getLogger("locks")

# Redis Cluster during a failover also answers CLUSTERDOWN/MASTERDOWN (every slot, for about a
# second between a master's FAIL and its replica's promotion), or has no node for a slot yet:
# for the caller, like a connection error, the service cannot be reached for now.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, ClusterDownError, SlotNotCoveredError,
                TryAgainError)
_HOST = socket.gethostname()


# Redis clock minus our wall clock (ms), per connection pool, learned from each acquire's reply.
_clock_offsets: dict[int, float] = {}
# Allowance for the offset's error and clock jitter. The offset is learned as (Redis time in a
# reply) - (our time when the reply arrived), which underestimates it by up to a round trip, so
# the give-up time errs early; the best (largest) estimate is kept unless the clocks stepped.
GIVE_UP_SLACK_MS = 50


def _learn_clock(pool: Any, redis_now_ms: int) -> None:
    if pool is None:
        return
    sample = redis_now_ms - time.time() * 1000
    known = _clock_offsets.get(id(pool))
    _clock_offsets[id(pool)] = sample if known is None or abs(sample - known) > 1000 else max(known, sample)


def _give_up_ms(pool: Any) -> int:
    """The Redis time after which the caller has given up on a call sent now (0: unknown)."""
    if pool is None:
        return 0
    offset = _clock_offsets.get(id(pool))
    timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    if offset is None or not timeout:
        return 0
    return int(time.time() * 1000 + offset + float(timeout) * 1000 + GIVE_UP_SLACK_MS)


def default_client() -> Redis:
    return get_redis_connection(locks_settings.CACHE_ALIAS)


def node_client(client: Redis | RedisCluster, key: str) -> Redis:
    """The plain client of the server that holds `key`: `client` itself, or on Redis Cluster the
    client of the master that owns key's slot (as the cluster client last learned the slot map).

    For what a cluster client cannot route: a BLPOP we read ourselves and WAIT, which must run on
    one server's connection; and the per-server clock offset. Every key of one lock is in one
    slot ({name} hash tag), so one lock talks to one master.
    """
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client


def pool_of(client: Redis | RedisCluster | None, key: str) -> Any:
    """The connection pool of the server that holds `key` (None for a client without one)."""
    if client is None:
        return None
    return getattr(node_client(client, key), "connection_pool", None)


# --- who is holding -------------------------------------------------------------------------
# Thread idents and task ids are reused once their owner dies; a serial number attached to the
# live Thread/Task object is not, so a new thread can never inherit a dead thread's hold.
_serials = itertools.count(1)
_thread_serials: weakref.WeakKeyDictionary[threading.Thread, int] = weakref.WeakKeyDictionary()
_task_serials: weakref.WeakKeyDictionary[asyncio.Task, int] = weakref.WeakKeyDictionary()
_serial_guard = threading.Lock()

HolderKey = tuple[int, int, int]


def _serial_of(table: weakref.WeakKeyDictionary, obj: Any) -> int:
    with _serial_guard:
        serial = table.get(obj)
        if serial is None:
            serial = table[obj] = next(_serials)
        return serial


def current_holder() -> HolderKey:
    """(pid, thread, asyncio task) of the caller: the identity a hold belongs to."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    task_serial = _serial_of(_task_serials, task) if task is not None else 0
    return (os.getpid(), _serial_of(_thread_serials, threading.current_thread()), task_serial)


class ReplicasLagging(Exception):
    """WAIT_REPLICAS is set and too few replicas acknowledged the lock write in time."""


class _Cancelled(Exception):
    """The asyncio task that asked for the lock was cancelled while its thread waited."""


def text(value: bytes | str) -> str:
    """Replies are bytes, or str from a client built with decode_responses=True."""
    return value.decode() if isinstance(value, bytes) else value


def _seconds(value: object, what: str, *, positive: bool = False) -> float:
    """A finite, non-negative (or positive) number of seconds; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"{what} must be a finite {'positive' if positive else 'non-negative'} number of seconds")
    return seconds


class CancelToken:
    """Lets another thread stop a waiting acquire at once (asyncio cancellation).

    A self-pipe, so the waiting thread sleeps in one poll() on its Redis socket and this pipe
    (no slicing, no polling). `deliver`/`cancel` settle the race between "acquired" and
    "cancelled" under one mutex: exactly one side ends up owning an acquired hold.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        self._mutex = threading.Lock()
        self.cancelled = False
        self.delivered: Hold | None = None

    def fileno(self) -> int:
        return self._r

    def cancel(self) -> Hold | None:
        """Cancel; returns a hold the thread already delivered (the caller must give it back)."""
        with self._mutex:
            self.cancelled = True
            with contextlib.suppress(OSError):
                os.write(self._w, b"x")
            return self.delivered

    def deliver(self, hold: Hold) -> bool:
        """False if cancelled first: then the acquiring thread gives the hold back itself."""
        with self._mutex:
            if self.cancelled:
                return False
            self.delivered = hold
            return True

    def close(self) -> None:
        """Once only: _aacquire may call it twice, and by the second call the fd numbers may
        belong to a new socket of the still-running acquire (seen on the MySQL backend)."""
        with self._mutex:
            fds, self._r, self._w = (self._r, self._w), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class _Signal:
    """A waiter's own hand-off list and the lock's wake list, BLPOPped on a connection of the pool.

    We time the wait ourselves (poll on the socket) instead of relying on BLPOP's timeout:
    Redis checks blocking timeouts from its cron, `hz` times a second, so a BLPOP oversleeps by
    up to 100 ms; and a blocking read must not run into the client's socket timeout, which
    stays short so that a frozen Redis is noticed. The BLPOP stays in flight while we look at
    the lock from another connection; we hang up on it (the server drops it with the
    connection) only when we stop waiting without its answer.
    """

    def __init__(self, client: Redis, keys: list[str], cancel: CancelToken | None,
                 wait_replicas: tuple[int, int] | None = None) -> None:
        self.client = client
        self.pool: Any = None
        self.keys = keys
        self.cancel = cancel
        self.wait_replicas = wait_replicas
        self.conn: Any = None

    def wait(self, until: float, server_deadline: float) -> str | None:
        """The next message on the list, or None once `until` (monotonic) has passed."""
        if self.conn is None:
            # Looked up now, not at __init__: on a cluster, the acquire script that just ran
            # through the cluster client has refreshed the slot map if a failover moved it.
            self.pool = pool_of(self.client, self.keys[0])
            self.conn = self.pool.get_connection()
            block = max(server_deadline - time.monotonic(), 0.001)
            try:
                self.conn.send_command("BLPOP", *self.keys, f"{block:.3f}")
            except BaseException:
                self.abort()
                raise
        try:
            while not self._readable(until - time.monotonic()):
                if time.monotonic() >= until:
                    return None
            reply = self.conn.read_response()
            if reply and self.wait_replicas is not None and text(reply[1]).startswith("g|"):
                # Our BLPOP came after the releaser's grant, so WAIT on this connection covers it.
                self.conn.send_command("WAIT", *self.wait_replicas)
                acked = self.conn.read_response()
                if acked < self.wait_replicas[0]:
                    raise ReplicasLagging(f"only {acked} of {self.wait_replicas[0]} replicas acknowledged the hand-off")
        except BaseException:
            self.abort()
            raise
        self.pool.release(self.conn)
        self.conn = None
        return text(reply[1]) if reply else None

    def _readable(self, timeout: float) -> bool:
        timeout = max(timeout, 0.0)
        cancel = self.cancel
        if cancel is None:
            return self.conn.can_read(timeout=timeout)
        if cancel.cancelled:
            raise _Cancelled
        if self.conn.can_read(timeout=0):
            return True
        sock = getattr(self.conn, "_sock", None)
        if sock is None:  # not a plain socket connection: fall back to short slices
            if self.conn.can_read(timeout=min(timeout, 0.05)):
                return True
        else:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            poller.register(cancel.fileno(), select.POLLIN)
            poller.poll(timeout * 1000)
        if cancel.cancelled:
            raise _Cancelled
        return self.conn.can_read(timeout=0)

    def abort(self) -> None:
        """Stop waiting: hang up on a BLPOP still in flight."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            conn.disconnect()
            self.pool.release(conn)


@dataclass(frozen=True)
class Served:
    """A request (combining) that a lock holder served: the lock was never ours."""

    reply: str
    waited: float


# --- one acquisition ------------------------------------------------------------------------
@dataclass(eq=False)
class Hold:
    """One acquisition of a lock. Only this object (in this process) can release or extend it."""

    lock: Lock
    token: str
    fence: int
    ttl: float
    acquired_at: float  # monotonic
    expires_at: float  # monotonic; a conservative (early) estimate of when the lease ends
    waited: float
    holder: HolderKey
    renew_fraction: float = 1 / 3
    max_hold: float = 60.0
    renewing: bool = False
    renew: bool = False  # keep renewing (else renew only once, to confirm a short hand-off lease)
    count: int = 1
    released: bool = False
    _lost: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return self.lock.name

    @property
    def pid(self) -> int:
        return self.holder[0]

    @property
    def lost(self) -> bool:
        """True once the holder can no longer count on the lock (renewal failed or lease over)."""
        return self._lost or (not self.released and time.monotonic() >= self.expires_at)

    def remaining(self) -> float:
        """Seconds of validity left, measured conservatively from before the acquire was sent."""
        if self._lost or self.released:
            return 0.0
        return max(0.0, self.expires_at - time.monotonic())

    def check(self, margin: float = 0.0, *, verify: bool = True) -> None:
        """Raise `LockLost` unless we still hold the lock for `margin` more seconds (call before COMMIT).

        Asks Redis (one round trip): only Redis knows of a force release, or of a lease that
        ran out while this process was paused. The fence at the resource still has the last
        word on anything that happens after this check, so a caller whose write is fenced may
        pass `verify=False` and check only what this process knows (renewal failures, its own
        clock), saving the round trip inside its critical section.
        """
        if self.lost or self.remaining() <= margin:
            raise LockLost("the lock was lost or its lease ran out", name=self.name)
        if verify:
            self.lock._verify_hold(self)
        if self.remaining() <= margin:
            raise LockLost("the lease runs out too soon", name=self.name)

    def extend(self, seconds: float, *, replace: bool = False) -> float:
        return self.lock._extend_hold(self, seconds, replace=replace)

    def release(self) -> None:
        self.lock._release_hold(self)

    def _renew_once(self) -> None:
        self.lock._renew_hold(self)


# --- the lock -------------------------------------------------------------------------------
class Lock:
    """A named distributed lock. See the module docstring for the design.

    >>> lock = Lock("product:42", ttl=10.0, wait=3.0)
    >>> with lock as held:
    ...     held.fence, held.remaining()

    `ttl`: lease in seconds (always set; default LOCKS["DEFAULT_TTL"]).
    `wait`: how long a blocking acquire waits before `LockTimeout` (default LOCKS["DEFAULT_WAIT"]).
    `renew`: keep the lease alive from a background thread, at most `max_hold` seconds in all.
    `reentrant`: the same holder (thread or asyncio task of this process) may acquire again;
    the lock is freed when the last hold is released.
    `family`: the stats row this lock counts in (default: `family_of(name)`, every all-digit
    `:`-segment as `*`: `coupon:3:user:9` -> `coupon:*:user:*`). Pass it when the name carries
    other unbounded parts (hashes, uuids), or every name becomes a family of its own.
    `one_shot`: for names used once or rarely (idempotency keys, a user's coupon claim). Nothing
    of the lock outlives its use: the fence key lives only as long as the lease and is deleted
    at release, and the name is not kept among its family's busiest names (the family's counters
    still count it). Fences still increase: with no stored fence they come from the Redis clock
    in microseconds, which moves on between two uses of the name; only a Redis clock stepped
    backwards (NTP step, failover to a host whose clock lags) between two uses could issue a
    smaller fence, so use one-shot only where a stale writer is refused by other means too
    (the idempotency key's unique index, the claim's unique (coupon, user) row).
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        renew: bool = False,
        max_hold: float | None = None,
        reentrant: bool = False,
        client: Redis | None = None,
        key_prefix: str | None = None,
        family: str | None = None,
        one_shot: bool = False,
    ) -> None:
        self.keys = LockKeys.for_name(name, key_prefix)
        self.name = name
        if family is not None and (not isinstance(family, str) or not family
                                   or any(c in family for c in "{} ") or len(family) > 200):
            raise ValueError(f"lock family {family!r} must be a short non-empty string without braces or spaces")
        self.family = family_of(name) if family is None else family
        self.one_shot = bool(one_shot)
        self.ttl = _seconds(locks_settings.DEFAULT_TTL if ttl is None else ttl, "ttl", positive=True)
        self.wait = _seconds(locks_settings.DEFAULT_WAIT if wait is None else wait, "wait")
        self.renew = renew
        self.max_hold = _seconds(locks_settings.MAX_HOLD if max_hold is None else max_hold, "max_hold")
        if renew and self.max_hold < self.ttl:
            raise ValueError("max_hold must be at least ttl")
        self.reentrant = reentrant
        self._client = client
        # None: the built-in Redis backend, driven here (an explicit `client` is always Redis).
        backend = None if client is not None else get_backend()
        self._backend: LockBackend | None = None if backend is None or backend.native else backend
        self._holds: dict[HolderKey, Hold] = {}
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"Lock({self.name!r}, ttl={self.ttl}, wait={self.wait})"

    @property
    def client(self) -> Redis:
        return self._client if self._client is not None else default_client()

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    def _fence_ttl_ms(self) -> int:
        """0 tells the scripts the lock is one-shot: the fence key lives for the lease only."""
        return 0 if self.one_shot else max(1, int(locks_settings.FENCE_TTL * 1000))

    # -- public API ------------------------------------------------------------------------
    @property
    def held(self) -> Hold | None:
        """The caller's current hold on this lock, if any."""
        with self._guard:
            return self._holds.get(current_holder())

    def _wait_arg(self, blocking: bool, wait: float | None) -> float:
        if not blocking:
            if wait is not None:
                raise ValueError("a non-blocking acquire does not wait: pass blocking=False or wait=, not both")
            return 0.0
        return self.wait if wait is None else _seconds(wait, "wait")

    def acquire(self, blocking: bool = True, wait: float | None = None) -> bool:
        """True if acquired. Blocking: waits up to `wait` seconds, then returns False."""
        wait = self._wait_arg(blocking, wait)
        try:
            self._acquire(current_holder(), blocking=blocking, wait=wait)
        except LockTimeout:
            return False
        return True

    def release(self) -> None:
        """Release the caller's hold. `LockNotOwned` if it has none, or the lease had ended."""
        hold = self.held
        if hold is None:
            raise LockNotOwned("release of a lock this holder does not hold", name=self.name)
        self._release_hold(hold)

    def extend(self, seconds: float, *, replace: bool = False) -> float:
        """Add `seconds` to the caller's lease (or set it, `replace=True`); returns seconds left."""
        hold = self.held
        if hold is None:
            raise LockNotOwned("extend of a lock this holder does not hold", name=self.name)
        return self._extend_hold(hold, seconds, replace=replace)

    @property
    def backend(self) -> LockBackend:
        return self._backend if self._backend is not None else get_backend()

    def locked(self) -> bool:
        """Is anyone holding this lock right now?"""
        if self._backend is not None:
            return self._backend.locked(self)
        try:
            return bool(self.client.exists(self.keys.lock))
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=self.name) from exc

    def __enter__(self) -> Hold:
        return self._acquire(current_holder(), blocking=True, wait=self.wait)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc_type is None:
                raise
            # The block already failed (often with LockLost from check()): its error is the news.

    async def __aenter__(self) -> Hold:
        return await self._aacquire(blocking=True, wait=self.wait)

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            await self.arelease()
        except LockNotOwned:
            if exc_type is None:
                raise

    async def aacquire(self, blocking: bool = True, wait: float | None = None) -> bool:
        """The asyncio twin of `acquire`. Cancelling the awaiting task leaves the queue at once.

        Pass the time limit as `wait=`, not through `asyncio.wait_for(lock.aacquire(), t)`:
        wait_for runs the coroutine in a child task, so the hold would belong to that task and
        the caller could not release it (cancellation is still clean: nothing is left behind).
        """
        try:
            await self._aacquire(blocking=blocking, wait=self._wait_arg(blocking, wait))
        except LockTimeout:
            return False
        return True

    async def _aacquire(self, *, blocking: bool, wait: float) -> Hold:
        # The wait runs in a worker thread (redis-py is blocking). If our task is cancelled the
        # thread is told at once; whichever of "acquired" and "cancelled" comes first wins.
        holder = current_holder()
        cancel = CancelToken()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, functools.partial(
            self._acquire_for_task, holder, blocking=blocking, wait=wait, cancel=cancel))
        try:
            return await future
        except asyncio.CancelledError:
            hold = cancel.cancel()
            if hold is not None:  # it was ours already: give it back, off the event loop
                loop.run_in_executor(None, self._give_back, hold)
            future.add_done_callback(lambda _: cancel.close())
            raise
        finally:
            if future.done():
                cancel.close()

    def _acquire_for_task(self, holder: HolderKey, *, blocking: bool, wait: float, cancel: CancelToken) -> Hold:
        hold = self._acquire(holder, blocking=blocking, wait=wait, cancel=cancel)
        if not cancel.deliver(hold):
            self._give_back(hold)
            raise _Cancelled
        return hold

    def _give_back(self, hold: Hold) -> None:
        with contextlib.suppress(LockNotOwned, LockUnavailable):
            self._release_hold(hold)

    async def arelease(self) -> None:
        hold = self.held
        if hold is None:
            raise LockNotOwned("release of a lock this holder does not hold", name=self.name)
        await asyncio.to_thread(self._release_hold, hold)

    # -- acquisition -----------------------------------------------------------------------
    def _acquire(self, holder: HolderKey, *, blocking: bool, wait: float,
                 cancel: CancelToken | None = None, payload: str = "") -> Hold:
        """A Hold; with a `payload` (combining, locks/combining.py) possibly `Served` instead."""
        with self._guard:
            existing = self._holds.get(holder)
        if existing is not None:
            if not self.reentrant:
                raise RuntimeError(
                    f"{self!r} is already held by this holder; pass reentrant=True to nest holds"
                )
            self._reenter(existing)
            return existing
        if self._backend is not None:
            if payload:
                raise RuntimeError(f"the {self._backend.name} backend does not combine requests")
            return self._acquire_from_backend(self._backend, holder, blocking=blocking, wait=wait, cancel=cancel)

        started = time.monotonic()
        deadline = started + (wait if blocking else 0.0)
        token = os.urandom(16).hex()
        owner = f"{_HOST}:{os.getpid()}"
        client = self.client
        keys = self.keys
        key_list = [keys.lock, keys.fence, keys.queue, keys.waiters, keys.wake, keys.taken]
        fence_ttl = self._fence_ttl_ms()
        handoff_ms = self._handoff_ms()
        signal = _Signal(client, [keys.signal(token), keys.wake], cancel, self._wait_replicas())
        queued = False
        try:
            while True:
                sent = time.monotonic()
                left_ms = int((deadline - sent) * 1000) if blocking else 0
                args = [token, self.ttl_ms, owner, max(left_ms, 0), keys.signal_prefix, fence_ttl, handoff_ms]
                acquired, value, now_ms, since_ms = self._run_acquire(client, key_list, args, payload)
                if acquired == 1:
                    signal.abort()
                    lease_start = sent + (int(since_ms) - int(now_ms)) / 1000
                    return self._new_hold(holder, token, int(value), lease_start, self.ttl, started,
                                          contended=queued)
                if not blocking or left_ms <= 0:
                    break
                queued = True
                # Wait for a hand-off, and look again by ourselves when the holder's lease ends:
                # if it died, nobody will hand over. Timed here, to the millisecond.
                lease_end = sent + max(int(value), 0) / 1000 + 0.001
                message = signal.wait(until=min(deadline, lease_end), server_deadline=deadline + 0.05)
                if message is not None and message.startswith("g|"):
                    _, fence_s, granted_ms, lease_ms = message.split("|")
                    # The lease began when the releaser granted it (Redis clock). Map that to our
                    # clock conservatively through the reply of our last acquire attempt.
                    lease_start = min(sent + (int(granted_ms) - int(now_ms)) / 1000, time.monotonic())
                    return self._new_hold(holder, token, int(fence_s), lease_start, int(lease_ms) / 1000, started,
                                          contended=True)
                if message is not None and message.startswith("d|"):
                    return Served(message[2:], waited=time.monotonic() - started)  # type: ignore[return-value]
                if time.monotonic() >= deadline:
                    break
                # A nudge ("r": a shorter lease now) or our own timer: look again.
            signal.abort()
            if queued:
                sent = time.monotonic()
                got = self._cancel(client, token)
                if isinstance(got, Served):
                    return got  # type: ignore[return-value]
                if got is not None:
                    # Handed over at the very last moment: it is ours; don't strand it.
                    fence, now_ms, since_ms = got
                    return self._new_hold(holder, token, fence, sent + (since_ms - now_ms) / 1000,
                                          self._handoff_s(), started, contended=True)
        except ReplicasLagging as exc:
            signal.abort()
            self._release_token(client, token)
            raise LockUnavailable(str(exc), name=self.name) from exc
        except BaseException as exc:
            # Interrupted (cancelled, Ctrl-C, a timeout around us, Redis gone) while queued: leave
            # the queue, and if a hand-off raced in, give the lock straight back.
            signal.abort()
            # Leave the queue, unless Redis itself just failed us: a second call would only
            # wait out another socket timeout, and a waiter that never confirms a hand-off is
            # passed over after HANDOFF_LEASE anyway.
            if queued and not isinstance(exc, _UNREACHABLE):
                with contextlib.suppress(Exception):
                    if isinstance(self._cancel(client, token), tuple):
                        self._release_token(client, token)
            if isinstance(exc, _UNREACHABLE):
                raise LockUnavailable(f"Redis unreachable: {exc}", name=self.name) from exc
            raise
        waited = time.monotonic() - started
        if blocking:
            recorder().count(self, timeouts=1)
            events.record_event(client, events.TIMEOUT, self.name, waited=round(waited, 4), owner=owner)
        raise LockTimeout(f"not acquired within {wait:g}s", name=self.name)

    def _acquire_from_backend(self, backend: LockBackend, holder: HolderKey, *, blocking: bool, wait: float,
                              cancel: CancelToken | None) -> Hold:
        started = time.monotonic()
        token = os.urandom(16).hex()
        owner = f"{_HOST}:{os.getpid()}"
        grant = backend.acquire(self, token=token, owner=owner, blocking=blocking,
                                deadline=started + (wait if blocking else 0.0), cancel=cancel)
        if grant is not None:
            return self._new_hold(holder, token, grant.fence, grant.lease_start, grant.lease, started,
                                  contended=grant.contended)
        if blocking:
            recorder().count(self, timeouts=1)
            with contextlib.suppress(Exception):  # the event log is on Redis, which this backend may not need
                events.record_event(self.client, events.TIMEOUT, self.name,
                                    waited=round(time.monotonic() - started, 4), owner=owner)
        raise LockTimeout(f"not acquired within {wait:g}s", name=self.name)

    def _handoff_s(self) -> float:
        return min(self.ttl, _seconds(locks_settings.HANDOFF_LEASE, "LOCKS['HANDOFF_LEASE']", positive=True))

    def _handoff_ms(self) -> int:
        return max(1, int(self._handoff_s() * 1000))

    def _wait_replicas(self) -> tuple[int, int] | None:
        n = int(locks_settings.WAIT_REPLICAS)
        return (n, int(locks_settings.WAIT_REPLICAS_TIMEOUT * 1000)) if n > 0 else None

    def _run_acquire(self, client: Redis, key_list: list[str], args: list, payload: str = "") -> list:
        """The acquire script; with WAIT_REPLICAS, pipelined with WAIT on the same connection.

        It carries the Redis time after which we will have given up on it (our socket timeout):
        a frozen Redis that wakes runs every command still in its socket buffers, and an acquire
        we abandoned would otherwise queue a phantom waiter that each live buyer then waits a
        hand-off lease for. The script drops a request that arrives that late.
        """
        pool = pool_of(client, key_list[0])
        args = [*args, _give_up_ms(pool), payload]
        replicas = self._wait_replicas()
        if replicas is None:
            reply = script("acquire")(keys=key_list, args=args, client=client)
        else:
            # WAIT counts the writes of its own connection: one server's pipeline, the lock's
            # master on a cluster (a cluster pipeline would send the keyless WAIT anywhere).
            pipe = node_client(client, key_list[0]).pipeline(transaction=False)
            script("acquire")(keys=key_list, args=args, client=pipe)
            pipe.execute_command("WAIT", *replicas)
            try:
                reply, acked = pipe.execute()
            except (*_UNREACHABLE, MovedError, AskError) as exc:
                if isinstance(client, RedisCluster):
                    # We bypassed the cluster client, so it has not seen the failure: have it
                    # re-read the slot map now, or every try would go to the dead master again.
                    with contextlib.suppress(Exception):
                        client.nodes_manager.initialize()
                raise LockUnavailable(f"the lock's master is unreachable or moved: {exc}", name=self.name) from exc
            if reply[0] == 1 and acked < replicas[0]:
                raise ReplicasLagging(f"only {acked} of {replicas[0]} replicas acknowledged the lock")
        _learn_clock(pool, int(reply[2]))
        if reply[0] == -1:  # our clock estimate was off (we had not given up): nothing was done
            raise LockUnavailable("the acquire reached Redis after its give-up time; clock offset relearned",
                                  name=self.name)
        return reply

    def _cancel(self, client: Redis, token: str) -> tuple[int, int, int] | Served | None:
        """Leave the queue. The lock if it was handed over just now, a reply if a holder served
        this request just now (combining), else None."""
        keys = self.keys
        got = script("cancel")(
            keys=[keys.lock, keys.queue, keys.waiters, keys.wake, keys.taken],
            args=[token, keys.signal_prefix],
            client=client,
        )
        if got[0] == 2:
            return Served(text(got[1]), waited=0.0)
        return (int(got[1]), int(got[2]), int(got[3])) if got[0] else None

    def _release_token(self, client: Redis | None, token: str) -> bool:
        if self._backend is not None:
            return self._backend.release(self, token=token)
        keys = self.keys
        return bool(script("release")(
            keys=[keys.lock, keys.fence, keys.queue, keys.waiters, keys.wake, keys.taken],
            args=[token, keys.signal_prefix, self._fence_ttl_ms(), self._handoff_ms()],
            client=client,
        ))

    def _new_hold(self, holder: HolderKey, token: str, fence: int, lease_start: float, lease: float,
                  started: float, *, contended: bool) -> Hold:
        """`lease`: what Redis gave us; shorter than ttl after a hand-off, until we confirm it."""
        now = time.monotonic()
        hold = Hold(
            lock=self,
            token=token,
            fence=fence,
            ttl=self.ttl,
            acquired_at=now,
            expires_at=lease_start + lease,
            waited=now - started,
            holder=holder,
            renew_fraction=float(locks_settings.RENEW_FRACTION),
            max_hold=self.max_hold,
            renew=self.renew,
        )
        with self._guard:
            self._holds[holder] = hold
        recorder().acquired(self, hold, contended=contended)
        if hold.waited >= float(locks_settings.LONG_WAIT):
            recorder().count(self, long_waits=1)
            events.record_event(self.client, events.LONG_WAIT, self.name, waited=round(hold.waited, 4),
                                fence=fence, owner=f"{_HOST}:{holder[0]}")
        if self.renew or lease < self.ttl:
            # A short hand-off lease is confirmed to the full ttl by the renewer, off the hot
            # path: a holder done before then (the usual case) never pays the round trip.
            hold.renewing = True
            renewer().add(hold)
        return hold

    def _reenter(self, hold: Hold) -> None:
        """A nested acquire by the same holder: confirm the lease in Redis and refresh it."""
        self._extend_hold(hold, self.ttl, replace=True)
        hold.count += 1

    # -- release / extend ------------------------------------------------------------------
    def _forget(self, hold: Hold) -> None:
        hold.released = True
        hold.renewing = False
        with self._guard:
            if self._holds.get(hold.holder) is hold:
                del self._holds[hold.holder]

    def _release_hold(self, hold: Hold) -> None:
        if hold.released:
            raise LockNotOwned("this hold was already released", name=self.name)
        if hold.pid != os.getpid():
            raise LockNotOwned("a forked child cannot release its parent's hold", name=self.name)
        if hold.count > 1:
            hold.count -= 1
            return
        self._forget(hold)
        try:
            released = self._release_token(self._client if self._backend is not None else self.client, hold.token)
        except _UNREACHABLE as exc:
            recorder().ended(self, hold, released=None)
            raise LockUnavailable(f"Redis unreachable during release: {exc}", name=self.name) from exc
        recorder().ended(self, hold, released=released)
        if not released:
            hold._lost = True
            events.record_event(self.client, events.LOST, self.name, fence=hold.fence,
                                held=round(time.monotonic() - hold.acquired_at, 4), owner=f"{_HOST}:{hold.pid}")
            raise LockNotOwned("the lock expired or was taken before release", name=self.name)

    def _extend_hold(self, hold: Hold, seconds: float, *, replace: bool) -> float:
        if hold.released or hold.pid != os.getpid():
            raise LockNotOwned("extend of a hold this holder does not own", name=self.name)
        seconds = _seconds(seconds, "extend", positive=True)
        sent = time.monotonic()
        try:
            if self._backend is not None:
                left_ms = self._backend.extend(self, token=hold.token, ms=max(1, int(seconds * 1000)),
                                               replace=replace)
            else:
                left_ms = script("extend")(
                    keys=[self.keys.lock],
                    args=[hold.token, max(1, int(seconds * 1000)), "1" if replace else "0"],
                    client=self.client,
                )
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during extend: {exc}", name=self.name) from exc
        if not left_ms:
            hold._lost = True
            hold.renewing = False
            raise LockNotOwned("cannot extend: the lock expired or belongs to another holder", name=self.name)
        hold.expires_at = sent + int(left_ms) / 1000
        return int(left_ms) / 1000

    def _verify_hold(self, hold: Hold) -> None:
        if hold.released or hold.pid != os.getpid():
            raise LockLost("this hold was released or belongs to another process", name=self.name)
        sent = time.monotonic()
        try:
            if self._backend is not None:
                left_ms = int(self._backend.check(self, token=hold.token))
            else:
                left_ms = int(script("check")(keys=[self.keys.lock], args=[hold.token], client=self.client))
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during check: {exc}", name=self.name) from exc
        if left_ms <= 0:
            hold._lost = True
            hold.renewing = False
            raise LockLost("the lock is no longer ours (expired, or force-released)", name=self.name)
        hold.expires_at = sent + left_ms / 1000  # measured after `sent`: a conservative estimate

    def _renew_hold(self, hold: Hold) -> None:
        if hold.released:
            hold.renewing = False
            return
        try:
            self._extend_hold(hold, self.ttl, replace=True)
            if not hold.renew:
                hold.renewing = False  # a hand-off lease, now confirmed: nothing more to do
        except LockNotOwned:
            log.warning("lock %s: renewal found the lock gone; the holder is told (hold.lost)", self.name)
            events.record_event(self.client, events.LOST, self.name, fence=hold.fence,
                                owner=f"{_HOST}:{hold.pid}", during="renewal")
            hold.renewing = False
