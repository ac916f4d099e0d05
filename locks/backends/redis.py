"""The built-in Redis backend: one Redis, a Sentinel-monitored master, or a Redis Cluster.

The lock's Redis code lives in locks/lock.py and locks/scripts/*.lua (acquire, FIFO queue,
provisional hand-off and request combining are fused into single scripts), so this backend is
`native`: the Lock drives Redis itself. Which Redis is the `locks` cache alias's connection
(`LOCKS_REDIS_URL`: redis://, redis+sentinel://, redis+cluster://, see locks/redis_urls.py).
Every key of one lock carries the hash tag {name}, so every script stays in one Cluster slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from locks.backends.base import Grant, HeldLock, LockBackend, Released

if TYPE_CHECKING:
    from locks.lock import CancelToken, Lock


class RedisBackend(LockBackend):
    name = "redis"
    native = True
    supports_combining = True

    def _native_only(self) -> None:
        raise RuntimeError("the Redis backend is driven by locks.lock.Lock itself")

    def acquire(self, lock: Lock, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        self._native_only()

    def release(self, lock: Lock, *, token: str) -> bool:
        self._native_only()

    def extend(self, lock: Lock, *, token: str, ms: int, replace: bool) -> int:
        self._native_only()

    def check(self, lock: Lock, *, token: str) -> int:
        self._native_only()

    def locked(self, lock: Lock) -> bool:
        return lock.locked()

    def describe(self, name: str) -> HeldLock | None:
        from locks import inspect

        return inspect.lock_info(name)

    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        from locks import inspect

        return inspect.held_locks(prefix=prefix, limit=limit)

    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        from locks import inspect

        held = inspect.force_release(name, expected_fence=expected_fence)
        return None if held is None else Released(held.owner, held.fence, int(held.held_since * 1e6))
