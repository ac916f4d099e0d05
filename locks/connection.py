"""The Redis the locks talk to: clients, the server clock as this process knows it, replies.

Redis is reached through django-redis connection settings (the LOCKS["CACHE_ALIAS"] cache), so
Sentinel, Cluster and pools are configured the Django way (locks/redis_urls.py). Kept below the
backends and the stats so that each reaches the same client and clock without importing the
lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypeGuard, cast

from django_redis import get_redis_connection
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from locks.conf import configured, generation, locks_settings, pid

# Redis Cluster during a failover also answers CLUSTERDOWN/MASTERDOWN (every slot, for about a
# second between a master's FAIL and its replica's promotion), or has no node for a slot yet:
# for the caller, like a connection error, the service cannot be reached for now.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, ClusterDownError, SlotNotCoveredError,
               TryAgainError)


def default_client() -> Redis:
    """The LOCKS cache alias's client. django-redis keeps one per thread, found through the
    cache handler on every call (~4 us); kept here per thread until the settings change."""
    cached = getattr(_clients, "last", None)
    if cached is not None and cached[0] == generation() and cached[1] == pid() and cached[3] is configured():
        known: Redis = cached[2]
        return known
    seen = generation()
    client: Redis = get_redis_connection(locks_settings.CACHE_ALIAS)
    _clients.last = (seen, pid(), client, configured())
    return client


_clients = threading.local()


def is_cluster(client: object) -> TypeGuard[RedisCluster]:
    """`isinstance(client, RedisCluster)`, without typing's Protocol check for a plain Redis: that
    isinstance walks RedisCluster's protocol base, 2-4 us a call, several calls per order."""
    return type(client) is not Redis and isinstance(client, RedisCluster)


def node_client(client: Redis | RedisCluster, key: str) -> Redis:
    """The plain client of the server that holds `key`: `client` itself, or on Redis Cluster the
    client of the master that owns key's slot (as the cluster client last learned the slot map).

    For what a cluster client cannot route: a BLPOP we read ourselves and WAIT, which must run on
    one server's connection; and the per-server clock offset. Every key of one lock is in one
    slot ({name} hash tag), so one lock talks to one master.
    """
    if is_cluster(client):
        return client.get_redis_connection(client.get_node_from_key(key))
    return cast(Redis, client)


def pool_of(client: Redis | RedisCluster | None, key: str) -> Any:
    """The connection pool of the server that holds `key` (None for a client without one)."""
    if client is None:
        return None
    return getattr(node_client(client, key), "connection_pool", None)


def text(value: bytes | str) -> str:
    """Replies are bytes, or str from a client built with decode_responses=True."""
    return value.decode() if isinstance(value, bytes) else value


# --- the server's clock ---------------------------------------------------------------------
# Redis clock minus our wall clock (ms), per connection pool, learned from each acquire's reply.
_clock_offsets: dict[int, float] = {}
# Allowance for the offset's error and clock jitter. The offset is learned as (Redis time in a
# reply) - (our time when the reply arrived), which underestimates it by up to a round trip, so
# the give-up time errs early; the best (largest) estimate is kept unless the clocks stepped.
GIVE_UP_SLACK_MS = 50


def learn_clock(pool: Any, redis_now_ms: int) -> None:
    """Note the server time (ms) a reply carried, for the server behind `pool`."""
    if pool is None:
        return
    sample = redis_now_ms - time.time() * 1000
    known = _clock_offsets.get(id(pool))
    _clock_offsets[id(pool)] = sample if known is None or abs(sample - known) > 1000 else max(known, sample)


def give_up_ms(pool: Any) -> int:
    """The Redis time after which the caller has given up on a call sent now (0: unknown)."""
    if pool is None:
        return 0
    offset = _clock_offsets.get(id(pool))
    timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    if offset is None or not timeout:
        return 0
    return int(time.time() * 1000 + offset + float(timeout) * 1000 + GIVE_UP_SLACK_MS)
