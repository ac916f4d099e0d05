"""The built-in Redis lock on Redis Cluster (3 masters + 3 replicas, private ports)."""

from __future__ import annotations

import pytest

from locks.servers.cluster import RedisClusterSet
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.backends.ha import use_redis_url


@pytest.fixture(scope="module")
def redis_cluster():
    servers = RedisClusterSet()
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture
def backend(settings, redis_cluster):
    return use_redis_url(settings, redis_cluster.url)
