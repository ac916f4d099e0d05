"""`locks.capabilities()`: what a Lock of the configured backend reports, without building one."""

from __future__ import annotations

import pytest

import locks


@pytest.mark.parametrize(("backend", "extra"), [("redis", {}), ("mysql", {"MYSQL_DATABASE": "default"})])
def test_capabilities_are_the_locks_own(settings, backend, extra):
    settings.LOCKS = {**settings.LOCKS, "BACKEND": backend, **extra}
    lock = locks.Lock("capabilities:probe")
    assert locks.capabilities() == (lock.supports_combining, lock.supports_guards)
    assert locks.capabilities() == ((True, True) if backend == "redis" else (False, False))
