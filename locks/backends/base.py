"""The small interface every lock backend implements, and what it hands back.

`locks.Lock` stays the front door: it keeps the per-holder bookkeeping (`Hold`, reentrancy,
renewal, statistics, asyncio) and asks a backend only for the primitives below. A backend
keeps the lease (a lock always expires, or ends with its holder's session), refuses a token
that is not the holder's, and issues *fences* that strictly increase per lock name.

Fences from every backend are on one scale: microseconds since the epoch on the coordination
service's clock, or the last fence + 1 if that is larger (`max(last + 1, now_us)`). A user who
switches backend therefore never finds the database's fence columns ahead of the new backend's
fences (which would refuse every write).

Every backend, the built-in Redis one too (locks/backends/redis.py), is reached the same way.
One capability is optional: request combining (`supports_combining`; locks/combining.py is its
public API). A combining backend lets a waiter queue a *request* with its place in line
(`submit`), lets the holder take the requests queued behind it (`take`) and answer them
(`reply`): the Redis backend, whose scripts fuse the queue, the hand-off and the requests.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from locks.hold import CancelToken, Guarded, LockLike, Served


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
class QueuedRequest:
    """A queued combining request the holder took: answer it with `reply({token: ...})`."""

    token: str
    payload: str
    deadline: float  # time.monotonic() in this process after which its waiter has given up
    deadline_ms: int = field(default=0, repr=False)  # the same moment on the lock service's clock
    needs: tuple[str, ...] = ()  # other locks its server must hold (`submit(needs=...)`)


@dataclass(frozen=True)
class Also:
    """The other locks a combiner takes with its batch (`Turn.take(lock_of=...)`): those its own
    request needs (`mine`) and those the taken requests need, each the lock `lock_of(name)`, all
    taken with `token` and `owner`."""

    lock_of: Callable[[str], LockLike]
    token: str
    owner: str
    mine: tuple[str, ...] = ()


@dataclass(frozen=True)
class Released:
    """Who held a lock that was force-released."""

    owner: str
    fence: int
    since_us: int


class LockBackend(ABC):
    """One coordination service. Every method raises `LockUnavailable` when it cannot be reached.

    Methods take the `Lock` (name, keys, ttl, one_shot: `locks.hold.LockLike`) and the hold's
    random `token`. Times are time.monotonic() seconds; `deadline` is when a blocking acquire
    gives up.
    """

    #: LOCKS["BACKEND"] value.
    name: ClassVar[str]
    #: Request combining (`submit`, `take`, `reply`; locks/combining.py): the Redis queue has it;
    #: on the others the shop takes the per-order path.
    supports_combining: ClassVar[bool] = False
    #: `submit` can check guard keys (plain keys of the same server) in the same round trip.
    supports_guards: ClassVar[bool] = False
    #: Waiters can be counted per lock (describe/held report `waiters`).
    counts_waiters: ClassVar[bool] = True
    #: What the dashboard should say about what this backend cannot show ("" if nothing).
    limitations: ClassVar[str] = ""

    @property
    def label(self) -> str:
        """The backend as the dashboard and `manage.py locks` name it."""
        return self.name

    @abstractmethod
    def acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        """Take the lock for `token`; wait (without polling) until `deadline` if blocking.

        None: not acquired in time. A waiter must not starve: FIFO where the service allows it.
        `cancel` (asyncio): stop waiting soon after `cancel.cancelled` turns true (raise
        `locks.hold.Cancelled`), leaving nothing behind.
        """

    @abstractmethod
    def release(self, lock: LockLike, *, token: str) -> bool:
        """Release if `token` still holds it; False if the lease had ended or it is another's."""

    def try_acquire_many(self, items: Sequence[tuple[LockLike, str, str]]) -> list[Grant | None]:
        """Take each (lock, token, owner) that is free, without waiting; a Grant or None each, in
        order. By default one call each; a backend that can batch them (Redis) does."""
        return [self.acquire(lock, token=token, owner=owner, blocking=False, deadline=time.monotonic())
                for lock, token, owner in items]

    def release_many(self, items: Sequence[tuple[LockLike, str]]) -> list[bool]:
        """`release` for each (lock, token), in order; batched where the backend can."""
        return [self.release(lock, token=token) for lock, token in items]

    @abstractmethod
    def extend(self, lock: LockLike, *, token: str, ms: int, replace: bool) -> int:
        """Add `ms` to the lease (or set it to `ms`); the ms left, 0 if `token` no longer holds it."""

    @abstractmethod
    def check(self, lock: LockLike, *, token: str) -> int:
        """The ms left on `token`'s lease; 0 or less if it no longer holds the lock."""

    @abstractmethod
    def locked(self, lock: LockLike) -> bool:
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

    def held_page(self, *, prefix: str = "", cursor: int = 0, count: int = 500) -> tuple[int, list[HeldLock]]:
        """One page of `held` (next cursor, 0 at the end): by default every held lock at once."""
        return 0, self.held(prefix=prefix)

    def held_index_page(self, *, prefix: str = "", cursor: int = 0, count: int = 200,
                        also: Sequence[str] = ()) -> tuple[int, list[HeldLock]]:
        """A page of held locks for the dashboard, which asks on every refresh (cheap reads only).

        By default `held` up to `count`; a backend that can list them more cheaply than
        completely (Redis: the stats' held index, plus the names in `also`) does so.
        """
        return 0, self.held(prefix=prefix, limit=count)

    # -- request combining (optional: supports_combining) ------------------------------------
    def submit(self, lock: LockLike, *, token: str, owner: str, payload: str, deadline: float,
               cancel: CancelToken | None = None, guards: Sequence[str] = (),
               needs: Sequence[str] = ()) -> Grant | Served | Guarded | None:
        """Queue for the lock carrying a request (`payload`): the lock (a `Grant`), or the reply
        a holder sent (`Served`), or None at `deadline`. With `guards` (`supports_guards`): if
        any of those keys exists the request is not queued, and `Guarded` has their values.
        `needs`: names of other locks whoever serves the request must hold (`take_with`)."""
        raise NotImplementedError(f"the {self.name} backend does not combine requests")

    def take(self, lock: LockLike, *, token: str, limit: int) -> list[QueuedRequest]:
        """The holder (`token`) takes up to `limit` requests queued behind it, FIFO (the first
        plain waiter stops it). `LockNotOwned` if the lock is no longer `token`'s."""
        raise NotImplementedError(f"the {self.name} backend does not combine requests")

    def take_with(self, lock: LockLike, *, token: str, limit: int,
                  also: Also) -> tuple[list[QueuedRequest], dict[str, Grant]]:
        """`take`, and the other locks the batch needs (`also.mine` and each request's
        `needs`) that are free, taken without waiting, in name order: their Grants by name.
        By default two steps (`take`, then `try_acquire_many`); Redis does it in one call."""
        batch = self.take(lock, token=token, limit=limit)
        names = sorted({*also.mine, *(name for request in batch for name in request.needs)})
        grants = self.try_acquire_many([(also.lock_of(name), also.token, also.owner) for name in names])
        return batch, {name: grant for name, grant in zip(names, grants, strict=True) if grant is not None}

    def reply(self, lock: LockLike, *, replies: dict[str, str], deadlines: dict[str, int],
              release: Sequence[tuple[LockLike, str]] = ()) -> list[bool]:
        """Answer taken requests by token; `deadlines`: their `QueuedRequest.deadline_ms`. First
        release each (lock, token) of `release` (the locks taken with the batch): whether each
        was still held, as `release_many`."""
        raise NotImplementedError(f"the {self.name} backend does not combine requests")

    def close(self) -> None:  # noqa: B027 - optional: most backends have something to close
        """Drop connections (tests, a forked child)."""


def every_held(backend: LockBackend, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
    """All of `backend.held_page`'s pages (up to `limit` locks), sorted by name."""
    out: list[HeldLock] = []
    cursor = 0
    while True:
        cursor, page = backend.held_page(prefix=prefix, cursor=cursor, count=1000)
        out.extend(page)
        if cursor == 0 or (limit is not None and len(out) >= limit):
            break
    out.sort(key=lambda h: h.name)
    return out[:limit] if limit is not None else out
