"""Sold-out markers: reject orders for a sold-out product without the lock or MySQL.

A marker is set only by an order that saw the product's committed stock at 0 while holding the
product's lock, and removed by restock/cancel *before* they commit, under the same lock. So no
order can re-mark a product between a refill's removal and its commit, and a marker never
outlives the refill. Markers live in Redis with a TTL; any Redis error just skips the fast path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import connection
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from shop.conf import shop_settings

log = logging.getLogger("shop")


def _key(product_id: int) -> str:
    # Namespaced by database: two databases (dev and test, two shops) may share one Redis.
    return f"shop:{connection.settings_dict['NAME']}:soldout:{product_id}"


def _client():
    return get_redis_connection(shop_settings.SOLDOUT_CACHE_ALIAS)


def sold_out(product_ids: Iterable[int]) -> set[int]:
    """The subset marked sold out; empty if Redis cannot tell (then the locked path decides)."""
    ids = list(product_ids)
    try:
        flags = _client().mget([_key(pid) for pid in ids])
    except RedisError:
        return set()
    return {pid for pid, flag in zip(ids, flags, strict=True) if flag is not None}


def mark(product_id: int) -> None:
    """Call only while holding the product's lock, after reading its committed stock as 0."""
    try:
        _client().set(_key(product_id), "1", ex=int(shop_settings.SOLDOUT_TTL))
    except RedisError:
        log.warning("could not mark product %s sold out", product_id, exc_info=True)


def unmark(product_ids: Iterable[int]) -> None:
    """Call under the products' locks before committing a refill. Raises if Redis is down."""
    keys = [_key(pid) for pid in product_ids]
    if keys:
        _client().delete(*keys)
