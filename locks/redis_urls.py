"""One Redis URL -> one django-redis CACHES entry: a single server, Sentinel or Cluster.

    redis://[:password@]host:6379/0      rediss://...      unix:///run/redis.sock?db=0
    redis+sentinel://[:password@]10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/0
    redis+cluster://[:password@]10.0.0.1:7000,10.0.0.2:7000/0

Sentinel: always the *master* (`?is_master=1` with django-redis's DefaultClient, never its
SentinelClient): SentinelClient sends reads to a replica, and a lock's state read from a lagging
replica could show a held lock free. Cluster: locks/django_redis_cluster.py (django-redis has none).

Retries (redis-py 8 retries a connection error 10 times with exponential backoff, ~7 s against a
dead node): a single server keeps its pool's default (no retry); Sentinel retries a connection
error once, at once (the retry asks the sentinels for the master again, so it reaches a promoted
replica); Cluster retries twice, at once, re-reading the slot map. Each try is bounded by the
socket timeout, so a call on a dead node fails in at most a few socket timeouts.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

EXAMPLES = (
    "redis://127.0.0.1:6379/0, "
    "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster/0 or "
    "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0"
)
SENTINEL_RETRIES = 1


# Django's SafeExceptionReporterFilter.cleansed_substitute: reports and start-up errors look alike.
MASK = "********************"
# scheme://user:password@host or scheme://:password@host. The password runs to the last "@"
# before the host (people do leave an "@" in it unescaped, and the URL still works).
_URL_PASSWORD = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<password>\S+?)(?=@[^@\s/]*(?:[/?#\s]|$))")
# ?password=... in a query string (redis://host/0?password=...)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<password>[^&\s]+)", re.IGNORECASE)


def mask_url_credentials(text: str) -> str:
    """Every password inside a URL in `text` masked: 'mysql://u:pw@h/db' -> 'mysql://u:****...@h/db'.

    The one masking of the project: error reports (config/reporting.py) and every start-up error
    that quotes a URL setting (DATABASE_URL, REDIS_URL, LOCKS_REDIS_URL, the Redlock URLs...)
    go through it, since stderr ends up in container logs.
    """
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def _bad(setting: str, url: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{setting}={mask_url_credentials(url)!r}: {why} (e.g. {EXAMPLES}).")


def _hosts(setting: str, url: str, netloc: str, default_port: int) -> list[tuple[str, int]]:
    """`h1:p1,h2:p2` (after any `user:password@`) -> [(h1, p1), (h2, p2)]."""
    hosts = []
    for item in netloc.rpartition("@")[2].split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = item.strip(), str(default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _bad(setting, url, f"{item!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _credentials(netloc: str) -> dict[str, str]:
    userinfo, at, _ = netloc.rpartition("@")
    if not at:
        return {}
    user, _, password = userinfo.partition(":")
    return {k: unquote(v) for k, v in (("USERNAME", user), ("PASSWORD", password)) if v}


def _db(setting: str, url: str, part: str) -> int:
    if not part:
        return 0
    if not part.isdigit():
        raise _bad(setting, url, f"the database {part!r} is not a number")
    return int(part)


def cache_config(url: str, *, socket_timeout: float, pool_kwargs: dict[str, Any] | None = None,
                 setting: str = "REDIS_URL") -> dict[str, Any]:
    """The CACHES entry for `url`; ImproperlyConfigured (naming `setting`, with examples) if bad."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    pool = dict(pool_kwargs or {})
    options: dict[str, Any] = {
        "CLIENT_CLASS": "django_redis.client.DefaultClient",
        # Every Redis call on the request path is bounded: a frozen or partitioned Redis costs a
        # buyer this long (a 503 lock_unavailable), never a hung worker. Redis answers in
        # microseconds; the lock's waits are timed by the client, not by this.
        "SOCKET_TIMEOUT": socket_timeout,
        "SOCKET_CONNECT_TIMEOUT": socket_timeout,
        "CONNECTION_POOL_KWARGS": pool,
    }
    if scheme in {"redis", "rediss", "unix"}:
        if scheme != "unix" and not parts.hostname:
            raise _bad(setting, url, "no host")
        if scheme == "unix" and not parts.path:
            raise _bad(setting, url, "no socket path")
        return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url, "OPTIONS": options}

    if scheme not in {"redis+sentinel", "redis+cluster"}:
        raise _bad(setting, url, "not a Redis URL")
    if parts.query or parts.fragment:
        raise _bad(setting, url, "options after '?' are not supported here")
    options.update(_credentials(parts.netloc))
    path = [p for p in parts.path.split("/") if p]

    if scheme == "redis+sentinel":
        sentinels = _hosts(setting, url, parts.netloc, 26379)
        if not 1 <= len(path) <= 2:
            raise _bad(setting, url, "a Sentinel URL ends with /<master name>[/<db>]")
        service, db = path[0], _db(setting, url, path[1] if len(path) > 1 else "")
        retry = Retry(NoBackoff(), SENTINEL_RETRIES, supported_errors=(RedisConnectionError,))
        pool["retry"] = retry
        options.update(
            CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
            SENTINELS=sentinels,
            # The sentinels themselves: no password of the master, the same timeouts, no backoff
            # (discovery moves on to the next sentinel instead).
            SENTINEL_KWARGS={"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout,
                             "retry": Retry(NoBackoff(), 0)},
        )
        # django-redis reads the master's name from the URL's host; is_master=1: master only.
        return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://{service}/{db}?is_master=1",
                "OPTIONS": options}

    nodes = _hosts(setting, url, parts.netloc, 6379)
    if len(path) > 1 or _db(setting, url, path[0] if path else "") != 0:
        raise _bad(setting, url, "Redis Cluster has only database 0")
    options.update(
        CLIENT_CLASS="locks.django_redis_cluster.ClusterClient",
        CONNECTION_FACTORY="locks.django_redis_cluster.ClusterConnectionFactory",
        CLUSTER_NODES=nodes,
    )
    host, port = nodes[0]
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://{host}:{port}/0", "OPTIONS": options}


def kind(config: dict[str, Any]) -> str:
    """"cluster", "sentinel" or "single": what a CACHES entry made here (or by hand) talks to."""
    options = config.get("OPTIONS", {})
    factory = options.get("CONNECTION_FACTORY", "")
    if factory.endswith("ClusterConnectionFactory"):
        return "cluster"
    if factory.endswith("SentinelConnectionFactory"):
        return "sentinel"
    return "single"
