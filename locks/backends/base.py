"""The small interface every lock backend implements, and what it hands back.

`locks.Lock` stays the front door: it keeps the per-holder bookkeeping (`Hold`, reentrancy,
renewal, statistics, asyncio) and asks a backend only for the primitives below. A backend
keeps the lease (a lock always expires, or ends with its holder's session), refuses a token
that is not the holder's, and issues *fences* that strictly increase per lock name.

Fences from every backend are on one scale: microseconds since the epoch on the coordination
service's clock, or the last fence + 1 if that is larger (`max(last + 1, now_us)`). A user who
switches backend therefore never finds the database's fence columns ahead of the new backend's
fences (which would refuse every write).

The built-in Redis backend (one Redis, Sentinel or Cluster) is the lock's own code in
locks/lock.py and its Lua scripts: it fuses acquire, FIFO queue, hand-off and request combining
into single scripts, so it is `native` and the Lock drives it directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from locks.lock import CancelToken, Lock


@dataclass(frozen=True)
class Grant:
    """A lock granted by a backend.

    `lease_start`: time.monotonic() at or before the moment the lease began (conservative: the
    time the request that won it was sent), `lease`: its length in seconds. `contended`: the
    caller had to wait for another holder.
    """

    fence: int
    lease_start: float
    lease: float
    contended: bool = False


@dataclass
class HeldLock:
    """A held lock as the dashboard and `manage.py locks` show it (every backend)."""

    name: str
    owner: str
    fence: int
    held_since: float  # unix seconds
    held_for: float
    ttl_left: float
    waiters: int
    queued_requests: int = 0  # waiters that carry a combining request (the holder may serve them)
    queued_requests_more: bool = False  # the count is a lower bound (see inspect.REQUESTS_SCAN)

    @property
    def plain_waiters(self) -> int:
        """Waiters that want the lock itself (a batch stops at the first of them)."""
        return max(self.waiters - self.queued_requests, 0)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "plain_waiters": self.plain_waiters}


@dataclass(frozen=True)
class Released:
    """Who held a lock that was force-released."""

    owner: str
    fence: int
    since_us: int


class LockBackend(ABC):
    """One coordination service. Every method raises `LockUnavailable` when it cannot be reached.

    Methods take the `Lock` (name, keys, ttl, one_shot) and the hold's random `token`. Times are
    time.monotonic() seconds; `deadline` is when a blocking acquire gives up.
    """

    #: LOCKS["BACKEND"] value.
    name: ClassVar[str]
    #: The Lock drives it through its own Redis scripts (locks/lock.py): only the Redis backend.
    native: ClassVar[bool] = False
    #: Request combining (locks/combining.py) needs the Redis queue; others take the per-order path.
    supports_combining: ClassVar[bool] = False
    #: Waiters can be counted per lock (describe/held report `waiters`).
    counts_waiters: ClassVar[bool] = True
    #: What the dashboard should say about what this backend cannot show ("" if nothing).
    limitations: ClassVar[str] = ""

    @abstractmethod
    def acquire(self, lock: Lock, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        """Take the lock for `token`; wait (without polling) until `deadline` if blocking.

        None: not acquired in time. A waiter must not starve: FIFO where the service allows it.
        `cancel` (asyncio): stop waiting soon after `cancel.cancelled` turns true (raise
        `locks.lock._Cancelled`), leaving nothing behind.
        """

    @abstractmethod
    def release(self, lock: Lock, *, token: str) -> bool:
        """Release if `token` still holds it; False if the lease had ended or it is another's."""

    @abstractmethod
    def extend(self, lock: Lock, *, token: str, ms: int, replace: bool) -> int:
        """Add `ms` to the lease (or set it to `ms`); the ms left, 0 if `token` no longer holds it."""

    @abstractmethod
    def check(self, lock: Lock, *, token: str) -> int:
        """The ms left on `token`'s lease; 0 or less if it no longer holds the lock."""

    @abstractmethod
    def locked(self, lock: Lock) -> bool:
        """Is anyone holding the lock now?"""

    @abstractmethod
    def describe(self, name: str) -> HeldLock | None:
        """The holder of `name`, or None if it is free."""

    @abstractmethod
    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        """Held locks whose name starts with `prefix`, sorted by name."""

    @abstractmethod
    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        """Free `name` now (its holder's fence is stale from here on). None if it was free.

        With `expected_fence`, only that hold is released: raise `locks.HolderChanged` if another
        hold has the lock now.
        """

    def close(self) -> None:  # noqa: B027 - optional: most backends have something to close
        """Drop connections (tests, a forked child)."""
