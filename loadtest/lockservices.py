"""Every lock service on private servers: one registry for `backendbench` and the HTTP faults.

A kind in `SERVICES` starts the servers one lock backend needs (on free ports, stopped by pid at
the end: the servers of loadtest/servers/) and returns a `LockService`: the settings that point
this process's lock at them (`switched()`: forked buyers inherit them), the environment that
points an app server at them (`env`), and the servers themselves, for a fault to kill.
Everything else (MySQL, the cache Redis that keeps sold-out markers and lock statistics) stays
as configured, so the services differ only in the lock.

    with lockservices.running("sentinel") as service, service.switched():
        ...  # this process (and its forked buyers) lock on the Sentinel set
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.test.utils import override_settings

from loadtest.servers.base import RedisProcess


@dataclass
class LockService:
    """A running lock service. Empty: this process's own settings (the shared service)."""

    name: str
    locks: dict[str, Any] = field(default_factory=dict)  # LOCKS updates (BACKEND, REDLOCK_URLS, ...)
    redis_url: str | None = None  # the locks cache alias's Redis (LOCKS_REDIS_URL), for the redis backend
    shop: dict[str, Any] = field(default_factory=dict)  # SHOP updates (COMBINING)
    servers: Any = None  # what was started: a RedisProcess, SentinelSet, RedisClusterSet, ...

    @property
    def env(self) -> dict[str, str]:
        """An app server's environment overrides (loadtest/appservers.py) for this service."""
        env = {f"LOCKS_{key}": ",".join(value) if isinstance(value, list | tuple) else str(value)
               for key, value in self.locks.items()}
        if self.redis_url:
            env["LOCKS_REDIS_URL"] = self.redis_url
        env.update({f"SHOP_{key}": str(value).lower() for key, value in self.shop.items()})
        return env

    def settings(self) -> dict[str, Any]:
        """The `override_settings` arguments that point this process at the service."""
        out: dict[str, Any] = {}
        if self.locks:
            out["LOCKS"] = {**settings.LOCKS, **self.locks}
        if self.redis_url:
            out["CACHES"] = {**settings.CACHES, settings.LOCKS.get("CACHE_ALIAS", "locks"): redis_cache(self.redis_url)}
        if self.shop:
            out["SHOP"] = {**getattr(settings, "SHOP", {}), **self.shop}
        return out

    @contextlib.contextmanager
    def switched(self) -> Iterator[LockService]:
        """Lock on this service until the block ends (forked buyers inherit it)."""
        from locks import backends

        backends.reset()
        try:
            with override_settings(**self.settings()):
                yield self
        finally:
            backends.reset()


def redis_cache(url: str) -> dict[str, Any]:
    """The locks cache alias for `url`, configured as config/settings/redis_locks.py configures LOCKS_REDIS_URL."""
    from config.settings import redis_cache

    return redis_cache(url, "LOCKS_REDIS_URL")


@dataclass(frozen=True)
class Kind:
    name: str
    description: str
    start: Callable[[contextlib.ExitStack], LockService]  # its servers stop when the stack closes


def _up(stack: contextlib.ExitStack, servers: Any) -> Any:
    """Start `servers`, stopped (by pid) when the stack closes, even if the start fails halfway."""
    stack.callback(servers.stop)
    servers.start()
    return servers


def _redis(stack: contextlib.ExitStack, **shop: Any) -> LockService:
    server = _up(stack, RedisProcess())
    return LockService("redis", {"BACKEND": "redis"}, redis_url=server.url, shop=shop, servers=server)


def _sentinel(stack: contextlib.ExitStack, **locks: Any) -> LockService:
    from loadtest.servers.sentinel import SentinelSet

    servers = _up(stack, SentinelSet())
    return LockService("sentinel", {"BACKEND": "redis", **locks}, redis_url=servers.url, servers=servers)


def _cluster(stack: contextlib.ExitStack) -> LockService:
    from loadtest.servers.cluster import RedisClusterSet

    servers = _up(stack, RedisClusterSet())
    return LockService("cluster", {"BACKEND": "redis"}, redis_url=servers.url, servers=servers)


def _redlock(stack: contextlib.ExitStack) -> LockService:
    from loadtest.servers.redlock import RedlockServers

    servers = _up(stack, RedlockServers(5))
    return LockService("redlock", {"BACKEND": "redlock", "REDLOCK_URLS": list(servers.urls)}, servers=servers)


def _zookeeper(stack: contextlib.ExitStack) -> LockService:
    from loadtest.servers.zookeeper import ZooKeeperProcess

    server = _up(stack, ZooKeeperProcess())
    return LockService("zookeeper", {"BACKEND": "zookeeper", "ZOOKEEPER_HOSTS": server.hosts}, servers=server)


def _mysql(stack: contextlib.ExitStack) -> LockService:
    return LockService("mysql", {"BACKEND": "mysql"})


SERVICES: dict[str, Kind] = {k.name: k for k in (
    Kind("redis", "one Redis (private redis-server): the baseline", _redis),
    Kind("redis-per-order", "one Redis, combining off: every order takes the lock itself, as on the "
         "other backends (the lock's own cost)", lambda stack: _redis(stack, COMBINING=False)),
    Kind("sentinel", "Redis Sentinel: master + replica + 3 sentinels, locks on the master", _sentinel),
    Kind("sentinel-wait", "Sentinel with WAIT_REPLICAS=1: every acquire and hand-off waits for the replica",
         lambda stack: _sentinel(stack, WAIT_REPLICAS=1)),
    Kind("cluster", "Redis Cluster: 3 masters + 3 replicas, the lock's keys in one slot", _cluster),
    Kind("redlock", "Redlock over 5 independent Redis masters (majority, fence floor)", _redlock),
    Kind("zookeeper", "ZooKeeper (one server): ephemeral sequential nodes, FIFO, CAS fences", _zookeeper),
    Kind("mysql", "the lock table in MySQL (the shop's own server), GET_LOCK as the wake-up", _mysql),
)}


@contextlib.contextmanager
def started(names: list[str]) -> Iterator[dict[str, LockService]]:
    """Start the servers of every service in `names` (all stopped when the block ends)."""
    with contextlib.ExitStack() as stack:
        yield {name: SERVICES[name].start(stack) for name in names}


@contextlib.contextmanager
def running(name: str | None) -> Iterator[LockService]:
    """One service, started for the block; None: this process's own settings (nothing started)."""
    if name is None:
        yield LockService("shared")
        return
    with started([name]) as found:
        yield found[name]
