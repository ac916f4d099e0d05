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

from collections.abc import Sequence

from locks.backends import QueuedRequest
from locks.exceptions import LockNotOwned
from locks.hold import Guarded, Hold, Served
from locks.lock import Lock
from locks.stats import recorder

__all__ = ["Guarded", "QueuedRequest", "Served", "Turn", "submit"]


class Turn:
    """The combiner's turn: the lock is held (`hold`); serve the batch, reply, release."""

    def __init__(self, lock: Lock, hold: Hold) -> None:
        self.lock = lock
        self.hold = hold
        self.taken: list[QueuedRequest] = []
        self._recorded = False

    def take(self, limit: int) -> list[QueuedRequest]:
        """Take up to `limit` requests queued behind us (FIFO; the first plain waiter stops it)."""
        if limit <= 0:
            return []
        batch = self.lock._backend.take(self.lock, token=self.hold.token, limit=int(limit))
        self.taken.extend(batch)
        return batch

    def reply(self, replies: dict[str, str]) -> None:
        """Answer taken requests (one round trip). Do it before releasing: a waiter that finds the
        hold gone without its reply queues again."""
        if not replies:
            return
        deadlines = {r.token: r.deadline_ms for r in self.taken if r.token in replies}
        self.lock._backend.reply(self.lock, replies=replies, deadlines=deadlines)

    def release(self) -> None:
        """Release, and count this turn as one batch of 1 + len(taken) requests in the family's
        stats (even if the release finds the lock lost: the batch was formed and worked on).
        Counted once, however often release is called. LockNotOwned if the lock was lost."""
        try:
            self.hold.release()
        finally:
            self._count()

    def finish(self) -> bool:
        """End the turn: release once and count its batch (as `release`). True if the lock was
        still ours; False if it was lost (the lease ended, another holder, or the turn was ended
        already): nothing to undo there, since the caller's writes were fenced. LockUnavailable
        if Redis cannot be reached (the hold then ends with its lease)."""
        try:
            self.hold.release()
        except LockNotOwned:
            return False
        finally:
            self._count()
        return True

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
           guards: Sequence[str] = ()) -> Turn | Served | Guarded:
    """Queue `payload` on `lock`: a `Turn` if we got the lock (serve ourselves and the batch),
    or `Served` with the reply a combiner sent. `LockTimeout` if neither came within `wait`:
    the request may still have been worked on (see the module docstring). The lock's backend
    must support combining (`lock.supports_combining`).

    `guards` (`lock.supports_guards`: plain Redis, not a cluster): keys of the lock's
    Redis that, if any exists, stop the request before it queues: `Guarded` with their values.
    A check the caller would make before queueing anyway (a sold-out marker), without its own
    round trip."""
    got = lock.submit(payload, wait=wait, guards=guards)
    if isinstance(got, Served | Guarded):
        return got
    return Turn(lock, got)
