"""Idempotency records: which keys placed an order, known without asking MySQL.

An order placed with an Idempotency-Key writes `shop:<db>:idem:<user>:<hash>` -> order id into
the sold-out markers' Redis before its COMMIT (IDEMPOTENCY_TTL). The sold-out fast path reads it
in the same MGET as the markers: no record means this key never committed an order (so a sold-out
product is refused with no SQL); a record sends the request to the replay lookup in MySQL, so a
retry of the key that bought the last unit still gets its order back. MySQL's unique key on
(user, idempotency_key) stays the last word: a record lost with Redis only costs the fast path.
"""

from __future__ import annotations

from django_redis import get_redis_connection
from redis.exceptions import RedisError

from shop import errors
from shop.conf import shop_settings
from shop.plumbing import redis_keys


def write_records(records: list[tuple[int, str, int]], *, required: bool) -> None:
    """Before the batch's COMMIT, for (user id, key, order id) of its keyed orders, in one round
    trip. `required` (locks on, so sold-out markers are in use): records that cannot be written
    fail the batch (LockUnavailable, rolled back), because without them a retry of a key could
    be refused as sold out instead of getting its order."""
    if not records:
        return
    ttl = int(shop_settings.IDEMPOTENCY_TTL)
    try:
        pipe = get_redis_connection(shop_settings.REDIS_ALIAS).pipeline(transaction=False)
        for user_id, key, order_id in records:
            pipe.set(redis_keys.idempotency_record(user_id, key), order_id, ex=ttl)
        pipe.execute()
    except RedisError as exc:
        if required:
            raise errors.LockUnavailable(details={"redis": "unreachable"}) from exc
