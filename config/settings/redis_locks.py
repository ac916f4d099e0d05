"""Redis (CACHES, through django-redis: pools, Sentinel and Cluster the Django way) and the lock
service (LOCKS, read by locks/conf.py; the backends are locks/backends/)."""

from config.settings.environment import value
from locks import redis_urls

# REDIS_URL and LOCKS_REDIS_URL: redis://, rediss://, unix://, redis+sentinel://h:p,h:p/master/0
# or redis+cluster://h:p,h:p/0 (locks/redis_urls.py turns each into a CACHES entry).
REDIS_URL = value("REDIS_URL")
LOCKS_REDIS_URL = value("LOCKS_REDIS_URL")  # REDIS_URL unless set
REDIS_SOCKET_TIMEOUT = value("REDIS_SOCKET_TIMEOUT")
_max_connections = value("REDIS_MAX_CONNECTIONS")


def redis_cache(location: str, setting: str = "REDIS_URL") -> dict:
    """The CACHES entry for a Redis URL (also how tests and load tests configure their own)."""
    return redis_urls.cache_config(location, setting=setting, socket_timeout=REDIS_SOCKET_TIMEOUT, pool_kwargs={
        "max_connections": _max_connections,
        "health_check_interval": 30,
    })


CACHES = {
    "default": redis_cache(REDIS_URL, "REDIS_URL"),
    # Locks get their own alias: never IGNORE_EXCEPTIONS, never a replica or a shard.
    "locks": redis_cache(LOCKS_REDIS_URL, "LOCKS_REDIS_URL"),
}

# --- which coordination service holds the locks (locks/backends/; the names are its registry) --
LOCKS_BACKEND = value("LOCKS_BACKEND")
LOCKS_REDLOCK_URLS = value("LOCKS_REDLOCK_URLS")  # redlock: at least 3
LOCKS_ZOOKEEPER_HOSTS = value("LOCKS_ZOOKEEPER_HOSTS")
# ZooKeeper digest auth, "user:password": the lock nodes are then created readable and writable
# by that user only (locks/backends/zookeeper.py). Never printed.
LOCKS_ZOOKEEPER_AUTH = value("LOCKS_ZOOKEEPER_AUTH")

LOCKS = {
    "BACKEND": LOCKS_BACKEND,
    "REDLOCK_URLS": LOCKS_REDLOCK_URLS,
    "ZOOKEEPER_HOSTS": LOCKS_ZOOKEEPER_HOSTS,
    "ZOOKEEPER_AUTH": LOCKS_ZOOKEEPER_AUTH,
    "ZOOKEEPER_SESSION_TIMEOUT": value("LOCKS_ZOOKEEPER_SESSION_TIMEOUT"),
    # Redis with replicas (Sentinel, Cluster): grant a lock only once this many replicas have it.
    "WAIT_REPLICAS": value("LOCKS_WAIT_REPLICAS"),
    "CACHE_ALIAS": "locks",
    "KEY_PREFIX": value("LOCKS_KEY_PREFIX"),
    "DEFAULT_TTL": value("LOCKS_DEFAULT_TTL"),
    "DEFAULT_WAIT": value("LOCKS_DEFAULT_WAIT"),
    # The lock dashboard also shows what a crowd is told (busy answers, deadlines): shop/edge/overload.py.
    "DASHBOARD_PANELS": ["shop.edge.overload.panel"],
}
