"""Fence refusals, counted per lock name: how often the fenced write refused a second holder.

A refusal (`StaleFence`) is the fence doing its job: a holder that lost its lock (paused past
its lease, or overtaken after a failover of the lock service) tried to write after a newer
holder had. The failover load tests report how often that happened during their run, across
every app server, so the count must live where all servers can add to it: one INCR in the
markers' Redis (REDIS_ALIAS, not the lock service, which may be the thing failing),
keyed by database and lock name. A run's lock names are its own (its products, its coupon),
so the keys of a run are exactly its count. Only a refusal pays for it (never the hot path);
a Redis error is logged and forgotten: the count is a statistic, the refusal is what keeps the
books right.
"""

from __future__ import annotations

import logging

from django_redis import get_redis_connection
from redis.exceptions import RedisError

from shop.conf import shop_settings
from shop.ops import metrics
from shop.plumbing import redis_keys

log = logging.getLogger("shop")

TTL = 24 * 3600  # seconds a count is kept after its last refusal


def refused(name: str, *, operation: str) -> None:
    """Count one refusal of a write under lock `name` (here, and in the Prometheus metrics by `operation`)."""
    metrics.fence_refused(operation)
    try:
        client = get_redis_connection(shop_settings.REDIS_ALIAS)
        client.pipeline().incr(redis_keys.fence_refusals(name)).expire(redis_keys.fence_refusals(name), TTL).execute()
    except RedisError as exc:
        log.warning("fence refusal on %s not counted: %s", name, exc)
