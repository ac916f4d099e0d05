"""A Redis lock that hands off fairly, fences its holders and always expires.

Why not redis-py's `Lock` (what django-redis `cache.lock()` returns): it never expires by
default, polls every 0.1 s while waiting (so a waiter sleeps through most releases and the
releasing process barges back in: some processes starve), issues no fencing token, and keys
its token to a thread-local, which asyncio tasks share. This lock:

- acquires in one round trip (one Lua script: SET-if-free with a TTL, plus a fencing token);
- queues waiters FIFO in Redis; a release hands the lock *directly* to the next live waiter
  and wakes only that waiter, through a list it BLPOPs, so nobody polls and nobody starves;
  a waiter's BLPOP is bounded by the holder's remaining TTL, so a crashed holder costs at
  most its lease, never a lost wake-up;
- issues fences that strictly increase per name, even after Redis loses its data, because
  they are derived from the Redis clock in microseconds and the last fence issued;
- treats a holder as one acquisition (a `Hold`), not a thread-local slot: threads, asyncio
  tasks and forked children can never release or extend each other's hold;
- can renew its lease (bounded by `max_hold`) and tells the holder when it lost the lock.

A lease lock can never be safe against pauses on its own (Kleppmann); the fence, checked at
the resource (`UPDATE ... WHERE fence < :fence`), is what makes a late writer harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from django_redis import get_redis_connection
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from locks import events
from locks.conf import locks_settings
from locks.exceptions import LockLost, LockNotOwned, LockTimeout, LockUnavailable
from locks.keys import LockKeys
from locks.renewal import renewer
from locks.scripts import script

log = logging.getLogger("locks")

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_HOST = socket.gethostname()


def default_client() -> Redis:
    return get_redis_connection(locks_settings.CACHE_ALIAS)


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


def _wait_for_signal(client: Redis, key: str, block: float, *, final: bool,
                     wait_replicas: tuple[int, int] | None = None) -> bytes | None:
    """BLPOP our own signal list for up to `block` seconds; the popped payload, or None.

    Redis checks blocking timeouts from its cron (10 times a second by default), so a BLPOP
    can oversleep by up to 100 ms. When this wait ends at the caller's deadline (`final`) we
    watch the socket ourselves and hang up at the deadline: the server drops the BLPOP with
    the connection, and the caller's cancel script finds out whether a hand-off won the race.
    """
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("BLPOP", key, f"{max(block, 0.001):.3f}")
        if final and not conn.can_read(timeout=max(block, 0.0)):
            conn.disconnect()
            return None
        reply = conn.read_response()
        if reply and wait_replicas is not None:
            # Our BLPOP came after the releaser's grant, so WAIT on this connection covers it.
            conn.send_command("WAIT", *wait_replicas)
            acked = conn.read_response()
            if acked < wait_replicas[0]:
                raise ReplicasLagging(f"only {acked} of {wait_replicas[0]} replicas acknowledged the hand-off")
    except ReplicasLagging:
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return reply[1] if reply else None


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

    def check(self, margin: float = 0.0) -> None:
        """Raise `LockLost` unless the lease is still good for `margin` seconds (call before COMMIT)."""
        if self.lost or self.remaining() <= margin:
            raise LockLost("the lock was lost or its lease ran out", name=self.name)

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
    ) -> None:
        self.keys = LockKeys.for_name(name, key_prefix)
        self.name = name
        self.ttl = float(locks_settings.DEFAULT_TTL if ttl is None else ttl)
        self.wait = float(locks_settings.DEFAULT_WAIT if wait is None else wait)
        if self.ttl <= 0:
            raise ValueError("ttl must be positive: a lock always expires")
        if self.wait < 0:
            raise ValueError("wait cannot be negative")
        self.renew = renew
        self.max_hold = float(locks_settings.MAX_HOLD if max_hold is None else max_hold)
        if renew and self.max_hold < self.ttl:
            raise ValueError("max_hold must be at least ttl")
        self.reentrant = reentrant
        self._client = client
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

    def _metrics_ttl_ms(self) -> int:
        return int(locks_settings.METRICS_TTL * 1000) if locks_settings.METRICS else 0

    def _fence_ttl_ms(self) -> int:
        return int(locks_settings.FENCE_TTL * 1000)

    # -- public API ------------------------------------------------------------------------
    @property
    def held(self) -> Hold | None:
        """The caller's current hold on this lock, if any."""
        with self._guard:
            return self._holds.get(current_holder())

    def acquire(self, blocking: bool = True, wait: float | None = None) -> bool:
        """True if acquired. Blocking: waits up to `wait` seconds, then returns False."""
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

    def locked(self) -> bool:
        """Is anyone holding this lock right now?"""
        try:
            return bool(self.client.exists(self.keys.lock))
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=self.name) from exc

    def __enter__(self) -> Hold:
        return self._acquire(current_holder(), blocking=True, wait=None)

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    async def __aenter__(self) -> Hold:
        holder = current_holder()
        return await asyncio.to_thread(self._acquire, holder, blocking=True, wait=None)

    async def __aexit__(self, *exc_info: object) -> None:
        await self.arelease()

    async def aacquire(self, blocking: bool = True, wait: float | None = None) -> bool:
        holder = current_holder()
        try:
            await asyncio.to_thread(self._acquire, holder, blocking=blocking, wait=wait)
        except LockTimeout:
            return False
        return True

    async def arelease(self) -> None:
        hold = self.held
        if hold is None:
            raise LockNotOwned("release of a lock this holder does not hold", name=self.name)
        await asyncio.to_thread(self._release_hold, hold)

    # -- acquisition -----------------------------------------------------------------------
    def _acquire(self, holder: HolderKey, *, blocking: bool, wait: float | None) -> Hold:
        with self._guard:
            existing = self._holds.get(holder)
        if existing is not None:
            if not self.reentrant:
                raise RuntimeError(
                    f"{self!r} is already held by this holder; pass reentrant=True to nest holds"
                )
            self._reenter(existing)
            return existing

        wait = self.wait if wait is None else float(wait)
        started = time.monotonic()
        deadline = started + (wait if blocking else 0.0)
        token = os.urandom(16).hex()
        owner = f"{_HOST}:{os.getpid()}"
        client = self.client
        keys = self.keys
        key_list = [keys.lock, keys.fence, keys.queue, keys.waiters, keys.stats]
        fence_ttl, metrics_ttl = self._fence_ttl_ms(), self._metrics_ttl_ms()
        signal = keys.signal(token)
        queued = False
        try:
            while True:
                sent = time.monotonic()
                left_ms = int((deadline - sent) * 1000) if blocking else 0
                args = [token, self.ttl_ms, owner, max(left_ms, 0), keys.signal_prefix, fence_ttl, metrics_ttl]
                acquired, value, now_ms, since_ms = self._run_acquire(client, key_list, args)
                if acquired:
                    lease_start = sent + (int(since_ms) - int(now_ms)) / 1000
                    return self._new_hold(holder, token, int(value), lease_start, started)
                if not blocking or left_ms <= 0:
                    break
                queued = True
                # Wait for a hand-off, but never longer than the holder's lease: if it crashed,
                # nobody will hand over and we must try again when its key expires.
                pttl = int(value) / 1000 if int(value) > 0 else 0.001
                block = min(deadline - time.monotonic(), pttl + 0.002)
                if block <= 0:
                    break
                popped = _wait_for_signal(client, signal, block, final=deadline - time.monotonic() <= block,
                                          wait_replicas=self._wait_replicas())
                if popped is not None:
                    fence_s, granted_ms = popped.decode().split("|")
                    # The lease began when the releaser granted it (Redis clock). Map that to our
                    # clock conservatively through the reply of our last acquire attempt.
                    lease_start = sent + (int(granted_ms) - int(now_ms)) / 1000
                    return self._new_hold(holder, token, int(fence_s), min(lease_start, time.monotonic()),
                                          started)
            if queued:
                sent = time.monotonic()
                got = self._cancel(client, token, metrics_ttl)
                if got is not None:
                    # Handed over at the very last moment: it is ours; don't strand it.
                    fence, now_ms, since_ms = got
                    return self._new_hold(holder, token, fence, sent + (since_ms - now_ms) / 1000, started)
        except ReplicasLagging as exc:
            self._release_token(client, token)
            raise LockUnavailable(str(exc), name=self.name) from exc
        except BaseException as exc:
            # Interrupted (Ctrl-C, a timeout around us, Redis gone) while queued: leave the queue,
            # and if a hand-off raced in, give the lock straight back instead of stranding it.
            if queued:
                with contextlib.suppress(Exception):
                    if self._cancel(client, token, metrics_ttl) is not None:
                        self._release_token(client, token)
            if isinstance(exc, _UNREACHABLE):
                raise LockUnavailable(f"Redis unreachable: {exc}", name=self.name) from exc
            raise
        waited = time.monotonic() - started
        if blocking:
            events.record_event(client, events.TIMEOUT, self.name, waited=round(waited, 4), owner=owner)
        raise LockTimeout(f"not acquired within {wait:g}s", name=self.name)

    def _wait_replicas(self) -> tuple[int, int] | None:
        n = int(locks_settings.WAIT_REPLICAS)
        return (n, int(locks_settings.WAIT_REPLICAS_TIMEOUT * 1000)) if n > 0 else None

    def _run_acquire(self, client: Redis, key_list: list[str], args: list) -> list:
        """The acquire script; with WAIT_REPLICAS, pipelined with WAIT on the same connection."""
        replicas = self._wait_replicas()
        if replicas is None:
            return script("acquire")(keys=key_list, args=args, client=client)
        pipe = client.pipeline(transaction=False)
        script("acquire")(keys=key_list, args=args, client=pipe)
        pipe.execute_command("WAIT", *replicas)
        reply, acked = pipe.execute()
        if reply[0] and acked < replicas[0]:
            raise ReplicasLagging(f"only {acked} of {replicas[0]} replicas acknowledged the lock")
        return reply

    def _cancel(self, client: Redis, token: str, metrics_ttl: int) -> tuple[int, int, int] | None:
        keys = self.keys
        got = script("cancel")(
            keys=[keys.lock, keys.queue, keys.waiters, keys.stats],
            args=[token, keys.signal_prefix, metrics_ttl],
            client=client,
        )
        return (int(got[1]), int(got[2]), int(got[3])) if got[0] else None

    def _release_token(self, client: Redis, token: str) -> bool:
        keys = self.keys
        return bool(script("release")(
            keys=[keys.lock, keys.fence, keys.queue, keys.waiters, keys.stats],
            args=[token, keys.signal_prefix, self._fence_ttl_ms(), self._metrics_ttl_ms()],
            client=client,
        ))

    def _new_hold(self, holder: HolderKey, token: str, fence: int, lease_start: float, started: float) -> Hold:
        now = time.monotonic()
        hold = Hold(
            lock=self,
            token=token,
            fence=fence,
            ttl=self.ttl,
            acquired_at=now,
            expires_at=lease_start + self.ttl,
            waited=now - started,
            holder=holder,
            renew_fraction=float(locks_settings.RENEW_FRACTION),
            max_hold=self.max_hold,
        )
        with self._guard:
            self._holds[holder] = hold
        if hold.waited >= float(locks_settings.LONG_WAIT):
            events.record_event(self.client, events.LONG_WAIT, self.name, waited=round(hold.waited, 4),
                                fence=fence, owner=f"{_HOST}:{holder[0]}")
        if self.renew:
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
            released = self._release_token(self.client, hold.token)
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during release: {exc}", name=self.name) from exc
        if not released:
            hold._lost = True
            events.record_event(self.client, events.LOST, self.name, fence=hold.fence,
                                held=round(time.monotonic() - hold.acquired_at, 4), owner=f"{_HOST}:{hold.pid}")
            raise LockNotOwned("the lock expired or was taken before release", name=self.name)

    def _extend_hold(self, hold: Hold, seconds: float, *, replace: bool) -> float:
        if hold.released or hold.pid != os.getpid():
            raise LockNotOwned("extend of a hold this holder does not own", name=self.name)
        if seconds <= 0:
            raise ValueError("extend by a positive number of seconds")
        sent = time.monotonic()
        try:
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

    def _renew_hold(self, hold: Hold) -> None:
        if hold.released:
            hold.renewing = False
            return
        try:
            self._extend_hold(hold, self.ttl, replace=True)
        except LockNotOwned:
            log.warning("lock %s: renewal found the lock gone; the holder is told (hold.lost)", self.name)
            events.record_event(self.client, events.LOST, self.name, fence=hold.fence,
                                owner=f"{_HOST}:{hold.pid}", during="renewal")
            hold.renewing = False
