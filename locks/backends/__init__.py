"""Lock backends, chosen by LOCKS["BACKEND"] (env LOCKS_BACKEND): redis, redlock, zookeeper, mysql.

`get_backend()` returns this process's instance for the current settings: one per (settings,
pid), so a forked child never shares its parent's sockets or sessions, and a test that changes
LOCKS gets a backend for the new values. `get_backend(client=...)`: the Redis backend on that
Redis client (a `Lock(client=...)`, or a read of one Redis), whatever LOCKS["BACKEND"] says.
"""

from __future__ import annotations

import contextlib
import threading
from importlib import import_module
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from locks.backends.base import Also, Grant, HeldLock, LockBackend, QueuedRequest, Released, every_held
from locks.conf import configured, generation, locks_settings, pid

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["BACKENDS", "Also", "Grant", "HeldLock", "LockBackend", "QueuedRequest", "Released", "every_held",
           "get_backend"]

BACKENDS = {
    "redis": "locks.backends.redis.RedisBackend",
    "redlock": "locks.backends.redlock.RedlockBackend",
    "zookeeper": "locks.backends.zookeeper.ZooKeeperBackend",
    "mysql": "locks.backends.mysql.MySQLBackend",
}
# The LOCKS settings each backend is built from: a change to one of them builds a new instance.
OPTIONS = {
    "redis": (),
    "redlock": ("REDLOCK_URLS", "REDLOCK_CLOCK_DRIFT", "REDLOCK_TIMEOUT"),
    "zookeeper": ("ZOOKEEPER_HOSTS", "ZOOKEEPER_SESSION_TIMEOUT", "ZOOKEEPER_ROOT", "ZOOKEEPER_AUTH"),
    "mysql": ("MYSQL_DATABASE",),
}

_instances: dict[tuple[object, ...], LockBackend] = {}
_last: tuple[int, int, LockBackend, object] | None = None  # (generation, pid, backend, LOCKS) of the last lookup
_guard = threading.Lock()


def backend_class(name: str) -> type[LockBackend]:
    path = BACKENDS.get(name)
    if path is None:
        raise ImproperlyConfigured(
            f"LOCKS['BACKEND'] (LOCKS_BACKEND) is {name!r}; use one of: {', '.join(BACKENDS)}."
        )
    module, _, cls = path.rpartition(".")
    found: type[LockBackend] = getattr(import_module(module), cls)
    return found


def _freeze(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def get_backend(*, client: Redis | None = None) -> LockBackend:
    if client is not None:
        return backend_class("redis")(client=client)  # type: ignore[call-arg]  # the Redis backend's own argument
    last = _last
    if last is not None and last[0] == generation() and last[1] == pid() and last[3] is configured():
        return last[2]  # settings unchanged: every lock of an order asks, so not rebuilt per call
    return _lookup()


def _lookup() -> LockBackend:
    global _last
    seen = generation()
    name = locks_settings.BACKEND  # (read first: it puts LOCKS where `configured` looks)
    key = (name, pid(), *(_freeze(getattr(locks_settings, o)) for o in OPTIONS.get(name, ())))
    backend = _instances.get(key)
    if backend is None:
        with _guard:
            backend = _instances.get(key)
            if backend is None:
                options = {o.lower(): getattr(locks_settings, o) for o in OPTIONS.get(name, ())}
                backend = _instances[key] = backend_class(name)(**options)
    _last = (seen, pid(), backend, configured())
    return backend


def capabilities() -> tuple[bool, bool]:
    """(supports_combining, supports_guards) of the configured backend: what `Lock(...)` would
    report, without building a lock (a caller that asks per request, like the checkout)."""
    global _capabilities
    backend = get_backend()
    known = _capabilities
    if known is not None and known[0] is backend and known[1] == generation():
        return known[2]  # asked per order: supports_guards looks at the client's type
    found = (backend.supports_combining, backend.supports_guards)
    _capabilities = (backend, generation(), found)
    return found


_capabilities: tuple[LockBackend, int, tuple[bool, bool]] | None = None


def reset() -> None:
    """Close and forget every backend of this process (tests)."""
    global _last
    with _guard:
        _last = None
        for backend in _instances.values():
            with contextlib.suppress(Exception):  # a dead connection must not fail a teardown
                backend.close()
        _instances.clear()
