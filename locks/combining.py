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

No polling and no lost wake-ups: a waiter BLPOPs its own list, where either the lock (a
hand-off) or its reply arrives. The ordering is the lock's: FIFO, so nobody starves.

Crashes. A request taken into a batch is recorded as the holder's (the lock's `taken` hash)
until the holder replies. A waiter looks again by itself when the holder's lease ends (as every
waiter of this lock does): while its holder still holds it keeps waiting. Once the hold has
ended without a reply (the combiner crashed, was paused past its lease, or was forced out) the
request is an orphan: the next script that sees the hold gone (the next acquire of the free
lock, a release, a force release) wakes it at once, and it queues again for a new combiner.
So a request can be *worked on* twice: the caller must make its effect idempotent per request,
e.g. a unique key per request id in the same transaction as the work (shop/services/combining.py
does this), and decide the outcome of a request that timed out the same way. This module knows
nothing of what requests mean.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from locks.exceptions import LockNotOwned, LockUnavailable
from locks.lock import _UNREACHABLE, Hold, Lock, Served, _clock_offsets, current_holder, pool_of, text
from locks.scripts import script
from locks.stats import recorder

__all__ = ["Request", "Served", "Turn", "submit"]

# A reply lives this long after its waiter's deadline, then Redis drops it.
REPLY_GRACE_MS = 10_000


@dataclass(frozen=True)
class Request:
    """A queued request the combiner took: answer it with `Turn.reply({token: ...})`."""

    token: str
    payload: str
    deadline: float  # time.monotonic() in this process after which its waiter has given up


class Turn:
    """The combiner's turn: the lock is held (`hold`); serve the batch, reply, release."""

    def __init__(self, lock: Lock, hold: Hold) -> None:
        self.lock = lock
        self.hold = hold
        self.taken: list[Request] = []
        self._deadlines: dict[str, int] = {}  # token -> deadline (Redis ms), for the reply's expiry
        self._recorded = False

    def take(self, limit: int) -> list[Request]:
        """Take up to `limit` requests queued behind us (FIFO; the first plain waiter stops it)."""
        if limit <= 0:
            return []
        keys = self.lock.keys
        sent = time.monotonic()
        try:
            got = script("take")(keys=[keys.lock, keys.queue, keys.waiters, keys.taken],
                                 args=[self.hold.token, int(limit)], client=self.lock.client)
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"take: Redis unreachable: {exc}", name=self.lock.name) from exc
        if int(got[0]) == -1:
            raise LockNotOwned("take: the lock is no longer ours", name=self.lock.name)
        now_ms = int(got[0])
        batch = []
        for i in range(1, len(got), 3):
            token, deadline_ms, payload = text(got[i]), int(got[i + 1]), text(got[i + 2])
            self._deadlines[token] = deadline_ms
            batch.append(Request(token=token, payload=payload, deadline=sent + (deadline_ms - now_ms) / 1000))
        self.taken.extend(batch)
        return batch

    def reply(self, replies: dict[str, str]) -> None:
        """Answer taken requests (one round trip). Do it before releasing: a waiter that finds the
        hold gone without its reply queues again."""
        if not replies:
            return
        keys = self.lock.keys
        pipe = self.lock.client.pipeline(transaction=False)
        offset = _clock_offsets.get(id(pool_of(self.lock.client, keys.lock)))  # the lock's server (cluster: its master)
        now_ms = time.time() * 1000 + (offset or 0)
        for token, reply in replies.items():
            signal = keys.signal(token)
            pipe.rpush(signal, "d|" + reply)
            left = self._deadlines.get(token, now_ms) - now_ms
            pipe.pexpire(signal, max(int(left), 0) + REPLY_GRACE_MS)
        pipe.hdel(keys.taken, *replies)  # answered: no longer ours to orphan
        try:
            pipe.execute()
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"reply: Redis unreachable: {exc}", name=self.lock.name) from exc

    def release(self) -> None:
        """Release, and count this turn as one batch of 1 + len(taken) requests in the family's
        stats (even if the release finds the lock lost: the batch was formed and worked on).
        Counted once, however often release is called."""
        try:
            self.hold.release()
        finally:
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


def submit(lock: Lock, payload: str, *, wait: float | None = None) -> Turn | Served:
    """Queue `payload` on `lock`: a `Turn` if we got the lock (serve ourselves and the batch),
    or `Served` with the reply a combiner sent. `LockTimeout` if neither came within `wait`:
    the request may still have been worked on (see the module docstring)."""
    if not payload:
        raise ValueError("a combining request needs a non-empty payload")
    wait = lock.wait if wait is None else wait
    got = lock._acquire(current_holder(), blocking=True, wait=wait, payload=payload)
    if isinstance(got, Served):
        return got
    return Turn(lock, got)
