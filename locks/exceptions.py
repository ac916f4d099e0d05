"""Lock errors. Every one carries the lock name, so logs say which lock misbehaved."""

from __future__ import annotations


class LockError(Exception):
    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(f"{message} (lock {name!r})")
        self.name = name


class LockTimeout(LockError):
    """Not acquired within `wait` seconds: someone else holds it. Retry later."""


class LockNotOwned(LockError):
    """Release/extend by a holder that no longer owns the lock (expired, forced, or never held)."""


class LockLost(LockNotOwned):
    """The holder learned (renewal failed, TTL ran out) that it lost the lock before finishing."""


class LockUnavailable(LockError):
    """Redis cannot be reached: nothing is known about the lock, so nothing may proceed."""


class HolderChanged(LockError):
    """A force release named the holder it expected (by fence), and another one holds the lock now."""

    def __init__(self, message: str, *, name: str, owner: str, fence: int) -> None:
        super().__init__(message, name=name)
        self.owner = owner
        self.fence = fence
