"""Every lock backend on private servers, for measuring them side by side (`manage.py backendbench`).

A `Setup` starts the servers one backend needs (on free ports, stopped by pid at the end: the
servers of locks/servers/) and returns the settings that point the lock at them. The run then
forks its buyers with those settings, so every buyer process talks to the same servers.
Everything else (MySQL, the cache Redis that keeps sold-out markers and lock statistics) stays
as configured, so the backends differ only in the lock.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.test.utils import override_settings

from locks.servers.base import RedisProcess


def redis_cache(url: str) -> dict[str, Any]:
    """The locks cache alias for `url`, configured as shop/settings.py configures LOCKS_REDIS_URL."""
    from shop.settings import _redis_cache

    return _redis_cache(url)


@dataclass(frozen=True)
class Setup:
    name: str
    description: str
    # -> "LOCKS" updates, "CACHE" (the locks alias), "SHOP" updates, "servers" (for faults)
    start: Callable[[contextlib.ExitStack], dict[str, Any]]


def _locks_on_redis(url: str, **locks: Any) -> dict[str, Any]:
    return {"LOCKS": {"BACKEND": "redis", **locks}, "CACHE": redis_cache(url)}


def _redis(stack: contextlib.ExitStack) -> dict[str, Any]:
    server = RedisProcess()
    server.start()
    stack.callback(server.stop)
    return _locks_on_redis(server.url)


def _sentinel(stack: contextlib.ExitStack, **locks: Any) -> dict[str, Any]:
    from locks.servers.sentinel import SentinelSet

    servers = SentinelSet()
    stack.callback(servers.stop)
    servers.start()
    return {**_locks_on_redis(servers.url, **locks), "servers": servers}


def _cluster(stack: contextlib.ExitStack) -> dict[str, Any]:
    from locks.servers.cluster import RedisClusterSet

    servers = RedisClusterSet()
    stack.callback(servers.stop)
    servers.start()
    return {**_locks_on_redis(servers.url), "servers": servers}


def _redlock(stack: contextlib.ExitStack) -> dict[str, Any]:
    from locks.servers.redlock import RedlockServers

    servers = RedlockServers(5)
    stack.callback(servers.stop)
    servers.start()
    return {"LOCKS": {"BACKEND": "redlock", "REDLOCK_URLS": servers.urls}, "servers": servers}


def _zookeeper(stack: contextlib.ExitStack) -> dict[str, Any]:
    from locks.servers.zookeeper import ZooKeeperProcess

    server = ZooKeeperProcess()
    stack.callback(server.stop)
    server.start()
    return {"LOCKS": {"BACKEND": "zookeeper", "ZOOKEEPER_HOSTS": server.hosts}, "servers": server}


def _mysql(stack: contextlib.ExitStack) -> dict[str, Any]:
    return {"LOCKS": {"BACKEND": "mysql"}}


SETUPS: dict[str, Setup] = {s.name: s for s in (
    Setup("redis", "one Redis (private redis-server): the baseline", _redis),
    Setup("redis-per-order", "one Redis, combining off: every order takes the lock itself, as on the "
          "other backends (the lock's own cost)", lambda stack: {**_redis(stack), "SHOP": {"COMBINING": False}}),
    Setup("sentinel", "Redis Sentinel: master + replica + 3 sentinels, locks on the master", _sentinel),
    Setup("sentinel-wait", "Sentinel with WAIT_REPLICAS=1: every acquire and hand-off waits for the replica",
          lambda stack: _sentinel(stack, WAIT_REPLICAS=1)),
    Setup("cluster", "Redis Cluster: 3 masters + 3 replicas, the lock's keys in one slot", _cluster),
    Setup("redlock", "Redlock over 5 independent Redis masters (majority, fence floor)", _redlock),
    Setup("zookeeper", "ZooKeeper (one server): ephemeral sequential nodes, FIFO, CAS fences", _zookeeper),
    Setup("mysql", "the lock table in MySQL (the shop's own server), GET_LOCK as the wake-up", _mysql),
)}


@contextlib.contextmanager
def started(names: list[str]) -> Iterator[dict[str, dict[str, Any]]]:
    """Start the servers of every backend in `names` (all stopped when the block ends)."""
    with contextlib.ExitStack() as stack:
        yield {name: SETUPS[name].start(stack) for name in names}


@contextlib.contextmanager
def switched(found: dict[str, Any]) -> Iterator[None]:
    """Point the lock at one started backend until the block ends (forked buyers inherit it)."""
    from locks import backends

    caches = copy.deepcopy(settings.CACHES)
    if "CACHE" in found:
        caches[settings.LOCKS.get("CACHE_ALIAS", "locks")] = found["CACHE"]
    shop = {**getattr(settings, "SHOP", {}), **found.get("SHOP", {})}
    backends.reset()
    try:
        with override_settings(LOCKS={**settings.LOCKS, **found["LOCKS"]}, CACHES=caches, SHOP=shop):
            yield
    finally:
        backends.reset()
