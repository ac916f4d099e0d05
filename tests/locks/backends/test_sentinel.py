"""The built-in Redis lock on Redis Sentinel (master + replica + 3 sentinels, private ports)."""

from __future__ import annotations

import pytest

from locks.servers.sentinel import SentinelSet
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.backends.ha import use_redis_url


@pytest.fixture(scope="module")
def sentinel_set():
    servers = SentinelSet()
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture
def backend(settings, sentinel_set):
    return use_redis_url(settings, sentinel_set.url)
