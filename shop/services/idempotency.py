"""Idempotency records: which keys placed an order, known without asking MySQL.

An order placed with an Idempotency-Key writes `shop:<db>:idem:<user>:<hash>` -> order id into
the sold-out markers' Redis before its COMMIT (IDEMPOTENCY_TTL). The sold-out fast path reads it
in the same MGET as the markers: no record means this key never committed an order (so a sold-out
product is refused with no SQL); a record sends the request to the replay lookup in MySQL, so a
retry of the key that bought the last unit still gets its order back. MySQL's unique key on
(user, idempotency_key) stays the last word: a record lost with Redis only costs the fast path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db import connection
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from shop import errors
from shop.conf import shop_settings


def record_key(user_id: int, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"shop:{connection.settings_dict['NAME']}:idem:{user_id}:{digest}"


def write_record(*, user_id: int, key: str, order_id: int, required: bool) -> None:
    """Before the order's COMMIT. `required` (locks on, so sold-out markers are in use): a record
    that cannot be written fails the order (LockUnavailable, rolled back), because without it a
    retry of this key could be refused as sold out instead of getting its order."""
    write_records([(user_id, key, order_id)], required=required)


def write_records(records: list[tuple[int, str, int]], *, required: bool) -> None:
    """`write_record` for (user id, key, order id) of a whole batch, in one round trip."""
    if not records:
        return
    ttl = int(shop_settings.IDEMPOTENCY_TTL)
    try:
        pipe = get_redis_connection(shop_settings.SOLDOUT_CACHE_ALIAS).pipeline(transaction=False)
        for user_id, key, order_id in records:
            pipe.set(record_key(user_id, key), order_id, ex=ttl)
        pipe.execute()
    except RedisError as exc:
        if required:
            raise errors.LockUnavailable(details={"redis": "unreachable"}) from exc


def delete_records(pairs: Iterable[tuple[int, str]]) -> None:
    """Forget the records of (user id, key): for removing test and load-test orders, whose
    records would otherwise stay in a shared Redis for IDEMPOTENCY_TTL."""
    client = get_redis_connection(shop_settings.SOLDOUT_CACHE_ALIAS)
    keys = [record_key(user_id, key) for user_id, key in pairs]
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])
