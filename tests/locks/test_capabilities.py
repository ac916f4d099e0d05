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


def test_the_backend_follows_settings_locks_even_when_assigned_without_the_signal():
    """The backend is kept per settings generation (moved by setting_changed) and per LOCKS
    object: a forked benchmark worker assigns settings.LOCKS directly (loadtest/lockbench.py)."""
    from django.conf import settings as django_settings

    from locks.backends import get_backend

    before = django_settings.LOCKS
    assert get_backend().name == "redis"
    try:
        django_settings.LOCKS = {**before, "BACKEND": "mysql"}  # no setting_changed
        assert get_backend().name == "mysql"
    finally:
        django_settings.LOCKS = before
    assert get_backend().name == "redis"
