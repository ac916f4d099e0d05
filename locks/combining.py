"""Flat combining over the FIFO lock: whoever holds the lock serves everyone queued behind it.

A hot lock serialises its holders, so every holder pays a process hand-off and its own work
inside the lock. With combining, a caller queues a *request* (opaque text) instead of only its
place in line. When it gets the lock (directly, or by hand-off) it becomes the *combiner*: it
takes the requests queued behind it (`Turn.take`, FIFO, up to a limit), does all their work at
once, answers each (`Turn.reply`) and releases; the lock then goes by hand-off to the next one
in line, which serves the next batch. The lock is taken once per batch instead of once per
request, and a batch is exactly what queued while the previous one was being served.

    outcome = combining.submit(lock, payload)
    if isinstance(outcome, combining.Served):
        return decode(outcome.reply)           # a combiner did our work
    with outcome as turn:                      # our turn: the lock is held
        batch = turn.take(limit=31)            # the requests queued behind us
        ...do our own request and the batch's, e.g. in one transaction...
        turn.reply({r.token: encode(result) for r, result in ...})

(or, where a lost lock is not an error, end the turn with `turn.finish()`, once.)

A request may need other locks held while it is served (a checkout lane's batch needs each of
its products' locks): `submit(lock, payload, needs=[names])`, and the combiner takes them with
its batch, in the same round trip on one Redis server:

    outcome = combining.submit(lane, payload, needs=["product:7"])
    with outcome as turn:
        batch = turn.take(limit=31, lock_of=Lock)   # and every free lock the batch needs
        turn.also                                   # name -> Hold of those it got
        ...serve the requests whose locks are all in turn.also...
        lost = turn.reply({...})                    # releases turn.also in the same call

Each is taken as a non-blocking acquire of that lock would take it: a fence of its own, only if
free and nobody queued for it (FIFO: a queued waiter is handed it instead), renewed like any
hold of `lock_of(name)`, and released (with its hand-off) by `reply`, which tells which were
lost meanwhile. A needed lock that is busy is simply not taken: the caller decides what its
requests do (the checkout hands them back: they take that lock themselves, in its own line).

This is the public API of an optional backend capability (locks/backends/base.py: a backend
with `supports_combining` implements `submit`, `take` and `reply`). The Redis backend has it:
no polling and no lost wake-ups, a waiter BLPOPs its own list, where either the lock (a
hand-off) or its reply arrives. The ordering is the lock's: FIFO, so nobody starves. On a
backend without it, `submit` raises NotImplementedError: check `lock.supports_combining`.

Crashes. A request taken into a batch is recorded as the holder's (the lock's `taken` hash)
until the holder replies. A waiter looks again by itself when the holder's lease ends (as every
waiter of this lock does): while its holder still holds it keeps waiting. Once the hold has
ended without a reply (the combiner crashed, was paused past its lease, or was forced out) the
request is an orphan: the next script that sees the hold gone (the next acquire of the free
lock, a release, a force release) wakes it at once, and it queues again for a new combiner.
So a request can be *worked on* twice: the caller must make its effect idempotent per request,
e.g. a unique key per request id in the same transaction as the work (shop/checkout/combining.py
does this), and decide the outcome of a request that timed out the same way. This module knows
nothing of what requests mean.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from locks.backends import Also, QueuedRequest
from locks.conf import pid
from locks.exceptions import LockNotOwned, LockUnavailable
from locks.hold import Guarded, Hold, Served, current_holder
from locks.keys import validate_needs
from locks.lock import _HOST, Lock, _lock_of, release_all
from locks.stats import recorder

__all__ = ["Guarded", "QueuedRequest", "Served", "Turn", "submit"]


class Turn:
    """The combiner's turn: the lock is held (`hold`); serve the batch, reply, release."""

    def __init__(self, lock: Lock, hold: Hold, *, needs: Sequence[str] = ()) -> None:
        self.lock = lock
        self.hold = hold
        self.needs = tuple(needs)  # the locks our own request needs
        self.taken: list[QueuedRequest] = []
        self.also: dict[str, Hold] = {}  # other locks taken with the batch, by name
        self._recorded = False

    def take(self, limit: int, *, lock_of: Callable[[str], Lock] | None = None) -> list[QueuedRequest]:
        """Take up to `limit` requests queued behind us (FIFO; the first plain waiter stops it).
        With `lock_of`: also every free lock the batch needs (our own request's `needs` and the
        taken requests'), `lock_of(name)` each, into `self.also` (the module docstring)."""
        if lock_of is None:
            if limit <= 0:
                return []
            batch = self.lock._backend.take(self.lock, token=self.hold.token, limit=int(limit))
            self.taken.extend(batch)
            return batch
        holder, started = current_holder(), time.monotonic()
        made: dict[str, Lock] = {}  # one Lock per name: the backend reads it, then it gets the hold

        def once(name: str) -> Lock:
            if name not in made:
                made[name] = lock_of(name)
            return made[name]

        also = Also(lock_of=once, token=os.urandom(16).hex(), owner=f"{_HOST}:{pid()}",
                    mine=tuple(sorted(name for name in self.needs if name not in self.also)))
        batch, grants = self.lock._backend.take_with(self.lock, token=self.hold.token, limit=max(int(limit), 0),
                                                     also=also)
        self.taken.extend(batch)
        for name, grant in grants.items():
            self.also[name] = once(name)._granted(grant, holder, also.token, also.owner, started,
                                                  blocking=False, wait=0.0)
        return batch

    def reply(self, replies: dict[str, str]) -> list[Hold]:
        """Answer taken requests and release the locks taken with the batch (`also`), in one
        round trip. Do it before releasing the turn: a waiter that finds the hold gone without its
        reply queues again. The `also` holds found lost (their lease ended, or one was forced
        out): their writes were fenced. LockUnavailable: nothing was answered or released (the
        waiters queue again when our hold ends; the other locks end with their leases)."""
        going = [hold for hold in self.also.values() if _lock_of(hold)._letting_go(hold)]
        self.also = {}
        if not replies and not going:
            return []
        deadlines = {r.token: r.deadline_ms for r in self.taken if r.token in replies}
        try:
            released = self.lock._backend.reply(self.lock, replies=replies, deadlines=deadlines,
                                                release=[(hold.lock, hold.token) for hold in going])
        except LockUnavailable:
            for hold in going:
                recorder().ended(hold.lock, hold, released=None)
            raise
        lost = []
        for hold, ok in zip(going, released, strict=True):
            try:
                _lock_of(hold)._let_go(hold, released=ok)
            except LockNotOwned:
                lost.append(hold)
        return lost

    def release(self) -> None:
        """Release, and count this turn as one batch of 1 + len(taken) requests in the family's
        stats (even if the release finds the lock lost: the batch was formed and worked on).
        Counted once, however often release is called. LockNotOwned if the lock was lost."""
        try:
            try:
                self._release_also()
            finally:  # our own hold is let go even if the others could not be
                self.hold.release()
        finally:
            self._count()

    def finish(self) -> bool:
        """End the turn: release once and count its batch (as `release`). True if the lock was
        still ours; False if it was lost (the lease ended, another holder, or the turn was ended
        already): nothing to undo there, since the caller's writes were fenced. LockUnavailable
        if Redis cannot be reached (the hold then ends with its lease)."""
        try:
            try:
                self._release_also()
            finally:  # our own hold is let go even if the others could not be
                self.hold.release()
        except LockNotOwned:
            return False
        finally:
            self._count()
        return True

    def _release_also(self) -> None:
        """The locks taken with the batch, if `reply` did not release them (the turn ended early)."""
        if self.also:
            holds, self.also = list(self.also.values()), {}
            release_all(holds)

    def _count(self) -> None:
        if not self._recorded:
            self._recorded = True
            recorder().batch(self.lock, 1 + len(self.taken))

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc[0] is None:
                raise


def submit(lock: Lock, payload: str, *, wait: float | None = None,
           guards: Sequence[str] = (), needs: Sequence[str] = ()) -> Turn | Served | Guarded:
    """Queue `payload` on `lock`: a `Turn` if we got the lock (serve ourselves and the batch),
    or `Served` with the reply a combiner sent. `LockTimeout` if neither came within `wait`:
    the request may still have been worked on (see the module docstring). The lock's backend
    must support combining (`lock.supports_combining`).

    `guards` (`lock.supports_guards`: plain Redis, not a cluster): keys of the lock's
    Redis that, if any exists, stop the request before it queues: `Guarded` with their values.
    A check the caller would make before queueing anyway (a sold-out marker), without its own
    round trip. `needs`: names of other locks whoever serves it must hold (`Turn.take`)."""
    validate_needs(needs)
    got = lock.submit(payload, wait=wait, guards=guards, needs=needs)
    if isinstance(got, Served | Guarded):
        return got
    return Turn(lock, got, needs=needs)
