"""One acquisition of a lock, and who may own it: the types every floor of locks/ shares.

Here, below the front door (locks/lock.py) and the backends, so that stats, metrics, renewal
and the backends can type against a hold and a lock without importing either module:

- `Hold`: one acquisition; only it (in this process) can release or extend what it holds.
- `current_holder()`: the identity a hold belongs to, (pid, thread, asyncio task), by serial
  numbers that are never reused (a new thread cannot inherit a dead thread's hold).
- `CancelToken` / `Cancelled`: how an asyncio task stops a waiting acquire in its worker thread.
- `Served`: the answer a combining request got from a holder instead of the lock.
- `LockLike`: the few attributes of a `Lock` the lower floors read (a Protocol, not the class).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from locks.conf import pid
from locks.exceptions import LockLost

if TYPE_CHECKING:
    from redis import Redis

    from locks.keys import LockKeys


class LockLike(Protocol):
    """What backends, stats, metrics and a `Hold` use of a `locks.Lock`."""

    name: str
    family: str  # the stats row it counts in (`product:*`)
    keys: LockKeys
    ttl: float
    one_shot: bool

    @property
    def _ttl_ms(self) -> int: ...

    @property
    def _explicit_client(self) -> Redis | None:
        """The Redis client given to Lock(client=...); None: the LOCKS cache alias's."""

    def _fence_ttl_ms(self) -> int:
        """How long a fence key outlives the lock (0: one-shot, only for the lease)."""

    def _handoff_ms(self) -> int:
        """The provisional lease a release hands to the next waiter."""

    # The calls a Hold makes back into its lock (the front door keeps the bookkeeping).
    def _release_hold(self, hold: Hold) -> None: ...

    def _extend_hold(self, hold: Hold, seconds: float, *, replace: bool) -> float: ...

    def _verify_hold(self, hold: Hold) -> None: ...

    def _renew_hold(self, hold: Hold) -> None: ...


# --- who is holding -------------------------------------------------------------------------
# Thread idents and task ids are reused once their owner dies; a serial number attached to the
# live Thread/Task object is not, so a new thread can never inherit a dead thread's hold.
_serials = itertools.count(1)
_thread_serials: weakref.WeakKeyDictionary[threading.Thread, int] = weakref.WeakKeyDictionary()
_task_serials: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_serial_guard = threading.Lock()

HolderKey = tuple[int, int, int]


def _serial_of(table: weakref.WeakKeyDictionary[Any, int], obj: Any) -> int:
    with _serial_guard:
        serial = table.get(obj)
        if serial is None:
            serial = table[obj] = next(_serials)
        return serial


def current_holder() -> HolderKey:
    """(pid, thread, asyncio task) of the caller: the identity a hold belongs to. Asked several
    times per lock: no exception raised outside an event loop, no getpid() call."""
    loop = asyncio._get_running_loop()
    task = asyncio.current_task(loop) if loop is not None else None
    task_serial = _serial_of(_task_serials, task) if task is not None else 0
    return (pid(), _serial_of(_thread_serials, threading.current_thread()), task_serial)


# --- cancelling a wait (asyncio) ------------------------------------------------------------
class Cancelled(Exception):
    """The asyncio task that asked for the lock was cancelled while its thread waited.

    A backend raises it from a wait once `CancelToken.cancelled` is set, leaving nothing behind.
    """


class CancelToken:
    """Lets another thread stop a waiting acquire at once (asyncio cancellation).

    A self-pipe, so the waiting thread sleeps in one poll() on its socket and this pipe (no
    slicing, no polling). `deliver`/`cancel` settle the race between "acquired" and "cancelled"
    under one mutex: exactly one side ends up owning an acquired hold.
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


@dataclass(frozen=True)
class Served:
    """A request (combining) that a lock holder served: the lock was never ours."""

    reply: str
    waited: float


@dataclass(frozen=True)
class Guarded:
    """A request (combining) not queued because one of its guard keys existed: the values of all
    its guard keys (None for a missing one), in the order given."""

    values: tuple[str | None, ...]


# --- one acquisition ------------------------------------------------------------------------
@dataclass(eq=False)
class Hold:
    """One acquisition of a lock. Only this object (in this process) can release or extend it."""

    lock: LockLike
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

        Asks the lock service (one round trip): only it knows of a force release, or of a lease
        that ran out while this process was paused. The fence at the resource still has the last
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
