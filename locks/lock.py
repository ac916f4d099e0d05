"""The front door of the locks: `Lock`, a named distributed lock that fences its holders.

Why not redis-py's `Lock` (what django-redis `cache.lock()` returns): it never expires by
default, polls every 0.1 s while waiting (so a waiter sleeps through most releases and the
releasing process barges back in: some processes starve), issues no fencing token, and keys
its token to a thread-local, which asyncio tasks share. This lock:

- is always a lease (a TTL), and its backend (LOCKS["BACKEND"], locks/backends/) issues a
  fencing token per acquisition that strictly increases per name; the built-in Redis backend
  (locks/backends/redis.py) acquires in one round trip, queues waiters FIFO and hands the
  lock directly to the next one, without polling;
- treats a holder as one acquisition (a `Hold`, locks/hold.py), not a thread-local slot:
  threads, asyncio tasks and forked children can never release or extend each other's hold;
- can be reentrant for the same holder, and awaited from asyncio (the wait runs in a worker
  thread that a cancelled task stops at once);
- can renew its lease (bounded by `max_hold`, locks/renewal.py) and tells the holder when it
  lost the lock;
- counts its statistics in the process (locks/stats.py, locks/metrics.py), per lock *family*,
  off the backend's round trips, and logs timeouts, lost locks and long waits (locks/events.py);
- can be one-shot (`one_shot=True`) for names used once, like idempotency keys: then nothing of
  the lock remains in the lock service after its release.

A lease lock can never be safe against pauses on its own (Kleppmann); the fence, checked at
the resource (`UPDATE ... WHERE fence < :fence`), is what makes a late writer harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from redis import Redis

from locks import events
from locks.backends import Grant, LockBackend, get_backend
from locks.conf import locks_settings, pid
from locks.connection import default_client
from locks.exceptions import LockLost, LockNotOwned, LockTimeout, LockUnavailable
from locks.hold import Cancelled, CancelToken, Guarded, Hold, HolderKey, Served, current_holder
from locks.keys import LockKeys, family_of
from locks.renewal import renewer
from locks.stats import recorder

log = logging.getLogger("locks")

_HOST = socket.gethostname()
T = TypeVar("T")


def _seconds(value: object, what: str, *, positive: bool = False) -> float:
    """A finite, non-negative (or positive) number of seconds; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"{what} must be a finite {'positive' if positive else 'non-negative'} number of seconds")
    return seconds


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
        # An explicit `client` is always Redis: the Redis backend on that client.
        self._backend: LockBackend = get_backend(client=client)
        self._holds: dict[HolderKey, Hold] = {}
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"Lock({self.name!r}, ttl={self.ttl}, wait={self.wait})"

    @property
    def client(self) -> Redis:
        """The Redis of its statistics and events (and of the lock itself on the Redis backend)."""
        return self._client if self._client is not None else default_client()

    # -- what the backends and the stats read (locks/hold.py, LockLike): not for callers ---------
    @property
    def _explicit_client(self) -> Redis | None:
        return self._client

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    def _fence_ttl_ms(self) -> int:
        """0 tells the backend the lock is one-shot: the fence key lives for the lease only."""
        return 0 if self.one_shot else max(1, int(locks_settings.FENCE_TTL * 1000))

    def _handoff_ms(self) -> int:
        """The provisional lease a release grants the next waiter (HANDOFF_LEASE, at most ttl)."""
        lease = min(self.ttl, _seconds(locks_settings.HANDOFF_LEASE, "LOCKS['HANDOFF_LEASE']", positive=True))
        return max(1, int(lease * 1000))

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
    def supports_combining(self) -> bool:
        """Its backend queues requests a holder may serve (`submit`, locks/combining.py)."""
        return self._backend.supports_combining

    @property
    def supports_guards(self) -> bool:
        """Its backend reads guard keys in the queueing call (`submit(..., guards=...)`)."""
        return self._backend.supports_guards

    def locked(self) -> bool:
        """Is anyone holding this lock right now?"""
        return self._backend.locked(self)

    def submit(self, payload: str, *, wait: float | None = None, guards: Sequence[str] = (),
               needs: Sequence[str] = ()) -> Hold | Served | Guarded:
        """Queue for the lock carrying a request (combining: see locks/combining.py, its API).

        The lock (a `Hold`: serve the requests queued behind you), or `Served` with the reply a
        holder sent for `payload`; `LockTimeout` if neither came within `wait`. Needs a backend
        that `supports_combining`. `guards` (`Guarded` if any exists), `needs`: `combining.submit`."""
        if not payload:
            raise ValueError("a combining request needs a non-empty payload")
        holder = current_holder()
        existing = self._reentered(holder)
        if existing is not None:
            return existing
        started = time.monotonic()
        token, owner = os.urandom(16).hex(), f"{_HOST}:{pid()}"
        wait = self.wait if wait is None else wait
        got = self._backend.submit(self, token=token, owner=owner, payload=payload, deadline=started + wait,
                                   guards=guards, needs=needs)
        if isinstance(got, Served | Guarded):
            return got
        return self._granted(got, holder, token, owner, started, blocking=True, wait=wait)

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
            raise Cancelled
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
    def _reentered(self, holder: HolderKey) -> Hold | None:
        """The holder's hold, entered once more (reentrant); None if it holds none."""
        with self._guard:
            existing = self._holds.get(holder)
        if existing is None:
            return None
        if not self.reentrant:
            raise RuntimeError(f"{self!r} is already held by this holder; pass reentrant=True to nest holds")
        self._reenter(existing)
        return existing

    def _acquire(self, holder: HolderKey, *, blocking: bool, wait: float,
                 cancel: CancelToken | None = None) -> Hold:
        existing = self._reentered(holder)
        if existing is not None:
            return existing
        started = time.monotonic()
        token, owner = os.urandom(16).hex(), f"{_HOST}:{pid()}"
        grant = None
        try:
            grant = self._backend.acquire(self, token=token, owner=owner, blocking=blocking,
                                          deadline=started + (wait if blocking else 0.0), cancel=cancel)
            return self._granted(grant, holder, token, owner, started, blocking=blocking, wait=wait)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C between the grant and the caller's hold
            try:  # first, and no helper: see RedisBackend._acquire
                if grant is not None:
                    self._abandon(holder, token)
            except (KeyboardInterrupt, SystemExit):  # Ctrl-C twice
                self._abandon(holder, token)
            raise

    def _abandon(self, holder: HolderKey, token: str) -> None:
        """Give back a grant the caller never got (else it lapses with its lease, or is renewed)."""
        with self._guard:
            hold = self._holds.get(holder)
        with contextlib.suppress(Exception):
            if hold is not None and hold.token == token:
                self._release_hold(hold)
            else:
                self._backend.release(self, token=token)

    def _granted(self, grant: Grant | None, holder: HolderKey, token: str, owner: str, started: float, *,
                 blocking: bool, wait: float) -> Hold:
        """The hold a grant makes, or `LockTimeout` (counted and logged) if there was none."""
        if grant is not None:
            return self._new_hold(holder, token, grant.fence, grant.lease_start, grant.lease, started,
                                  contended=grant.contended)
        if blocking:
            recorder().count(self, timeouts=1)
            with contextlib.suppress(Exception):  # the event log is on Redis, which the backend may not need
                events.record_event(self.client, events.TIMEOUT, self.name,
                                    waited=round(time.monotonic() - started, 4), owner=owner)
        raise LockTimeout(f"not acquired within {wait:g}s", name=self.name)

    def _new_hold(self, holder: HolderKey, token: str, fence: int, lease_start: float, lease: float,
                  started: float, *, contended: bool) -> Hold:
        """`lease`: what the backend gave us; shorter than ttl after a hand-off, until we confirm it."""
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
        if not self._letting_go(hold):
            return
        try:
            released = self._backend.release(self, token=hold.token)
        except LockUnavailable:
            recorder().ended(self, hold, released=None)
            raise
        self._let_go(hold, released=released)

    def _letting_go(self, hold: Hold) -> bool:
        """Before a release: False for a nested hold (only its count goes down)."""
        if hold.released:
            raise LockNotOwned("this hold was already released", name=self.name)
        if hold.pid != pid():
            raise LockNotOwned("a forked child cannot release its parent's hold", name=self.name)
        if hold.count > 1:
            hold.count -= 1
            return False
        self._forget(hold)
        return True

    def _let_go(self, hold: Hold, *, released: bool) -> None:
        """After a release: count it; LockNotOwned if the lease had ended or another holds it."""
        recorder().ended(self, hold, released=released)
        if not released:
            hold._lost = True
            events.record_event(self.client, events.LOST, self.name, fence=hold.fence,
                                held=round(time.monotonic() - hold.acquired_at, 4), owner=f"{_HOST}:{hold.pid}")
            raise LockNotOwned("the lock expired or was taken before release", name=self.name)

    def _extend_hold(self, hold: Hold, seconds: float, *, replace: bool) -> float:
        if hold.released or hold.pid != pid():
            raise LockNotOwned("extend of a hold this holder does not own", name=self.name)
        seconds = _seconds(seconds, "extend", positive=True)
        sent = time.monotonic()
        left_ms = self._backend.extend(self, token=hold.token, ms=max(1, int(seconds * 1000)), replace=replace)
        if not left_ms:
            hold._lost = True
            hold.renewing = False
            raise LockNotOwned("cannot extend: the lock expired or belongs to another holder", name=self.name)
        hold.expires_at = sent + int(left_ms) / 1000
        return int(left_ms) / 1000

    def _verify_hold(self, hold: Hold) -> None:
        if hold.released or hold.pid != pid():
            raise LockLost("this hold was released or belongs to another process", name=self.name)
        sent = time.monotonic()
        left_ms = int(self._backend.check(self, token=hold.token))
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


def _by_backend(items: Sequence[T], lock_of: Callable[[T], Lock]) -> list[list[T]]:
    """Locks (or holds) grouped by the service their lock lives on (one batch each), in order."""
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(id(lock_of(item)._backend), []).append(item)
    return list(groups.values())


def try_acquire_all(locks: Sequence[Lock]) -> dict[str, Hold]:
    """Each of `locks` that is free, taken without waiting: its Hold by name (the others are
    skipped). One round trip on Redis where a loop of `acquire(blocking=False)` costs one per
    lock: for a holder that gathers what it can, like a checkout lane (shop/checkout/combining.py)."""
    holder = current_holder()
    holds: dict[str, Hold] = {}
    fresh = []
    for lock in locks:
        if (existing := lock._reentered(holder)) is not None:
            holds[lock.name] = existing
        else:
            fresh.append(lock)
    started, owner = time.monotonic(), f"{_HOST}:{pid()}"
    for group in _by_backend(fresh, lambda lock: lock):
        items = [(lock, os.urandom(16).hex(), owner) for lock in group]
        for (lock, token, _), grant in zip(items, group[0]._backend.try_acquire_many(items), strict=True):
            if grant is not None:
                holds[lock.name] = lock._granted(grant, holder, token, owner, started, blocking=False, wait=0.0)
    return holds


def _lock_of(hold: Hold) -> Lock:
    """The Lock a hold of this module's locks belongs to (a Hold names it as a LockLike)."""
    return cast(Lock, hold.lock)


def release_all(holds: Sequence[Hold]) -> list[Hold]:
    """Release every hold (one round trip on Redis); the ones found lost (the lease had ended or
    another holds the lock), for which a single `release` would raise LockNotOwned."""
    going = [hold for hold in holds if _lock_of(hold)._letting_go(hold)]
    lost: list[Hold] = []
    for group in _by_backend(going, _lock_of):
        try:
            outcomes = _lock_of(group[0])._backend.release_many([(hold.lock, hold.token) for hold in group])
        except LockUnavailable:
            for hold in group:
                recorder().ended(hold.lock, hold, released=None)
            raise
        for hold, released in zip(group, outcomes, strict=True):
            try:
                _lock_of(hold)._let_go(hold, released=released)
            except LockNotOwned:
                lost.append(hold)
    return lost
