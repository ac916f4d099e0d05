"""The `LOCKS` setting, with defaults (the DRF `api_settings` idea, without the caching).

Values are read from `settings.LOCKS` on every access, so `override_settings` and tests that
change the prefix work without a reload hook. The lookups are dict reads: cheap. What is built
from settings and kept (the backend, a thread's Redis client) is kept per `generation()`, which
every change of LOCKS or CACHES moves on.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Which coordination service holds the locks (locks/backends/): "redis" (one Redis, Sentinel
    # or Cluster, through CACHE_ALIAS), "redlock", "zookeeper" or "mysql".
    "BACKEND": "redis",
    # redlock: the independent Redis masters (redis:// URLs; 3, 5 or 7 of them), the clock drift
    # allowed for (a fraction of the ttl) and the per-master timeout (seconds).
    "REDLOCK_URLS": [],
    "REDLOCK_CLOCK_DRIFT": 0.01,
    "REDLOCK_TIMEOUT": 0.2,
    # zookeeper: the ensemble ("host:port,host:port"), the session timeout (seconds: a crashed
    # or frozen holder loses its lock after this long) and the root znode of the locks.
    "ZOOKEEPER_HOSTS": "127.0.0.1:2181",
    "ZOOKEEPER_SESSION_TIMEOUT": 4.0,
    "ZOOKEEPER_ROOT": "/locks",
    # zookeeper digest auth, "user:password" (None: none). With it every lock node is created
    # with an ACL that gives that user all rights and nobody else any (locks/backends/zookeeper.py).
    "ZOOKEEPER_AUTH": None,
    # mysql: the DATABASES alias whose server keeps the lock table (its own connections, in
    # autocommit: a lock is never part of the caller's transaction).
    "MYSQL_DATABASE": "default",
    # django-redis cache alias whose connection pool the locks use.
    "CACHE_ALIAS": "default",
    # Prepended to every key, e.g. "shop:" -> "shop:lock:{product:42}".
    "KEY_PREFIX": "",
    # Lease (seconds) when Lock(ttl=...) is not given. A lock always expires.
    "DEFAULT_TTL": 10.0,
    # How long acquire waits (seconds) when Lock(wait=...) is not given.
    "DEFAULT_WAIT": 3.0,
    # A release hands the lock to the next waiter with this (shorter) lease, which the waiter
    # confirms to its own ttl if it holds that long. A waiter that died while queued (SIGKILL,
    # OOM) is thus passed over after this long, not after its whole ttl.
    "HANDOFF_LEASE": 0.5,
    # Renewal: extend every ttl * RENEW_FRACTION; never renew past MAX_HOLD seconds in total.
    "RENEW_FRACTION": 1 / 3,
    "MAX_HOLD": 60.0,
    # Metrics kept in Redis (counters and histograms per lock family, plus the top names of
    # each family); one TTL for all of them. Each process counts in memory and flushes at most
    # every STATS_FLUSH_INTERVAL seconds (locks/stats.py); a SIGKILLed process loses that much.
    "METRICS": True,
    "METRICS_TTL": 7 * 24 * 3600,
    "STATS_FLUSH_INTERVAL": 1.0,
    "STATS_TOP_N": 50,
    # Bounded event log (timeouts, lost locks, force releases, long waits).
    "EVENT_LOG_SIZE": 1000,
    # Extra panels of the lock dashboard, from the project using the locks: dotted paths of
    # callables returning {"id", "title", "note", "headers": [...], "rows": [[...], ...]}, called
    # on every refresh (e.g. the shop's "shop.edge.overload.panel").
    "DASHBOARD_PANELS": [],
    "LONG_WAIT": 1.0,
    # Failover safety (Redisson's checkLockSyncedSlaves): after taking a lock, WAIT until this
    # many replicas have it, or give it back and raise LockUnavailable. 0 = don't wait.
    "WAIT_REPLICAS": 0,
    "WAIT_REPLICAS_TIMEOUT": 0.25,  # keep it below the socket timeout (REDIS_SOCKET_TIMEOUT, 0.5 s)
    # The fence counter outlives the lock by this much; TIME-derived fences cover its loss.
    # One-shot locks (Lock(one_shot=True)) keep it only for the lease.
    "FENCE_TTL": 30 * 24 * 3600,
}


# Django's LazySettings keeps each setting it read in its own __dict__ and drops it when that
# setting is set or overridden: read LOCKS from there first (as shop/conf.py does). A read through
# `settings.LOCKS` costs ~3 us, and a lock reads a dozen settings per acquisition.
_read_settings: dict[str, Any] = object.__getattribute__(settings, "__dict__")
_UNSET = object()


class LockSettings:
    def __getattr__(self, name: str) -> Any:
        configured = _read_settings.get("LOCKS")
        if configured is None:
            configured = getattr(settings, "LOCKS", {})
        value = configured.get(name, _UNSET)
        if value is _UNSET:
            if name not in DEFAULTS:
                raise AttributeError(f"unknown LOCKS setting {name!r}")
            return DEFAULTS[name]
        return value


locks_settings = LockSettings()

_generations = itertools.count(1)
_generation = 0


def generation() -> int:
    """Moves on whenever LOCKS or CACHES change (override_settings, tests): what was built from
    them is built again."""
    return _generation


def configured() -> object:
    """The LOCKS dict as set now (None until read): what is kept per `generation()` checks it is
    still the same object too, for code that assigns `settings.LOCKS` without the signal (a forked
    benchmark worker)."""
    return _read_settings.get("LOCKS")


def _settings_changed(*, setting: str, **_: object) -> None:
    global _generation
    if setting in ("LOCKS", "CACHES"):
        _generation = next(_generations)


setting_changed.connect(_settings_changed, dispatch_uid="locks.conf.generation")


def pid() -> int:
    """This process's id, kept: `os.getpid()` is a system call, and a lock asks for it several
    times (who holds, the kept backend and client). A forked child's is set by a fork hook;
    `stats`, which asks in its own fork hook, imports this module first, so this hook runs first."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


_pid = os.getpid()
os.register_at_fork(after_in_child=_forked)
