"""Shared fixtures. Everything runs against the real MariaDB and Redis.

Each test session gets its own lock key prefix, so parallel runs on one machine never see each
other's locks, and the prefix's keys are deleted at the end.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django_redis import get_redis_connection


@pytest.fixture(scope="session", autouse=True)
def _lock_key_prefix():
    prefix = f"test{os.getpid()}:"
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": prefix}
    yield prefix
    client = get_redis_connection(settings.LOCKS["CACHE_ALIAS"])
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


@pytest.fixture
def redis_client():
    return get_redis_connection(settings.LOCKS["CACHE_ALIAS"])
