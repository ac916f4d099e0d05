"""Sold-out markers: reject orders for a sold-out product without the lock or MySQL.

A marker must never outlive the stock it describes. An order marks a product only after reading
its stock as 0 under the product's lock, and only with proof that no refill came after that
read: every refill (restock, cancel) records its lock fence as the product's *refill floor*
before it commits, and the marker is written by a script that refuses a fence at or below that
floor. Fences of one lock only grow, so a buyer paused past its lease (GC, SIGSTOP) that wakes
after a restock holds an older fence than the restock's and cannot mark. A refill also deletes
the marker before it commits, under the same lock, so no buyer is refused once it has
committed. Markers live in Redis with a TTL; a Redis error skips the fast path (see
`sold_out`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django_redis import get_redis_connection
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

import locks
from locks.conf import locks_settings
from shop.conf import shop_settings
from shop.plumbing import hooks, redis_keys

log = logging.getLogger("shop")

# KEYS: marker, floor. ARGV: fence of the buyer's hold, marker TTL. 1 if marked.
_MARK = """
local floor = redis.call('GET', KEYS[2])
if floor and tonumber(floor) >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""
# KEYS: marker, floor. ARGV: fence of the refill's hold, floor TTL. Raise the floor, drop the marker.
_REFILL = """
local floor = redis.call('GET', KEYS[2])
if not floor or tonumber(floor) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
end
redis.call('DEL', KEYS[1])
return 1
"""
# A floor must outlive any pause of a buyer that read stock 0 before the refill.
FLOOR_TTL = 7 * 24 * 3600


class SoldOutCheckFailed(Exception):
    """Redis could not answer the sold-out check; see `sold_out`."""


def _marker_keys(product_id: int) -> list[str]:
    return [redis_keys.sold_out_marker(product_id), redis_keys.refill_floor(product_id)]


def _client():
    return get_redis_connection(shop_settings.REDIS_ALIAS)


def shares_lock_redis() -> bool:
    """Markers and locks in one Redis: a failed marker check means the lock cannot work either."""
    caches = settings.CACHES
    mine = caches.get(shop_settings.REDIS_ALIAS, {}).get("LOCATION")
    return mine is not None and mine == caches.get(locks_settings.CACHE_ALIAS, {}).get("LOCATION")


@dataclass(frozen=True)
class FastPath:
    marked: set[int]  # products marked sold out
    has_record: bool | None  # the idempotency record exists; None: not asked, or Redis could not tell


def markers_and_record(product_ids: Iterable[int], *, record_key: str | None = None) -> FastPath:
    """One MGET: the sold-out markers of these products, and an idempotency record.

    If Redis cannot answer: raises SoldOutCheckFailed when the locks live in the same Redis
    (the locked path would only wait on it again), else nothing is marked and the locked path
    decides.
    """
    ids = list(product_ids)
    keys = guard_keys(ids, record_key=record_key)
    try:
        client = _client()
        # On Redis Cluster the keys are in several slots, which one MGET may not span: redis-py's
        # mget_nonatomic sends one MGET per slot (the markers need no atomic snapshot).
        values = client.mget_nonatomic(keys) if isinstance(client, RedisCluster) else client.mget(keys)
    except RedisError as exc:
        if shares_lock_redis():
            raise SoldOutCheckFailed(str(exc)) from exc
        return FastPath(marked=set(), has_record=None)
    return fast_path_of(ids, values, record_key=record_key)


def records_exist(record_keys: Sequence[str]) -> list[bool | None]:
    """Whether each of these idempotency records exists (one read: MGET, or one per slot on
    Cluster); None for each if Redis cannot tell."""
    if not record_keys:
        return []
    try:
        client = _client()
        values = client.mget_nonatomic(record_keys) if isinstance(client, RedisCluster) else client.mget(record_keys)
    except RedisError:
        return [None] * len(record_keys)
    return [value is not None for value in values]


def guard_keys(product_ids: Iterable[int], *, record_key: str | None = None) -> list[str]:
    """The keys `markers_and_record` reads, for a lock's submit to check instead (guards, see
    locks/combining.py): then the check costs no round trip of its own. Only where the markers
    live in the locks' Redis and that is one server (`shares_lock_redis`, `supports_guards`)."""
    return [redis_keys.sold_out_marker(pid) for pid in product_ids] + ([record_key] if record_key is not None else [])


def fast_path_of(product_ids: Iterable[int], values: Sequence[object], *, record_key: str | None = None) -> FastPath:
    """The FastPath of the values of `guard_keys` (an MGET's, or a guarded submit's)."""
    marked = {pid for pid, flag in zip(product_ids, values, strict=False) if flag is not None}
    if marked:
        _seen_sold_out(marked)
    return FastPath(marked=marked, has_record=None if record_key is None else values[-1] is not None)


# Which products are sold out, known to every process within a quarter of a second: while its
# lines are full, the shop's gunicorn worker still lets orders of these reach the app, which
# answers them "sold out" (or replays a key's order) at once; other orders are refused `busy`
# before the app. A hint only (the app checks the markers itself): an index in Redis (a sorted
# set, product id -> when its marker lapses) next to the markers, read by each process at most
# every KNOWN_REFRESH seconds, plus what the process saw itself.
KNOWN_REFRESH = 0.25
_known: dict[int, float] = {}  # product id -> time.time() its marker lapses


def _seen_sold_out(product_ids: Iterable[int]) -> None:
    until = time.time() + float(shop_settings.SOLDOUT_TTL)
    for pid in product_ids:
        _known[pid] = until


def known_sold_out(product_ids: Iterable[int]) -> bool:
    """Every one of these products is sold out, as far as this process knows (see above). No
    I/O: `refresh_known` reads the index (the shop's gunicorn worker calls it from a thread)."""
    ids = list(product_ids)
    now = time.time()
    return bool(ids) and all(_known.get(pid, 0.0) > now for pid in ids)


def refresh_known() -> None:
    """Read the index of sold-out products into this process's `known_sold_out`."""
    try:
        rows = _client().zrangebyscore(redis_keys.sold_out_index(), time.time(), "+inf", withscores=True)
    except RedisError:
        return  # a hint: without it, orders are refused busy while the lines are full, or answered by the app
    fresh = {int(member): score for member, score in rows}
    for pid in [pid for pid in _known if pid not in fresh]:
        _known.pop(pid, None)
    _known.update(fresh)


def sold_out(product_ids: Iterable[int]) -> set[int]:
    """The subset marked sold out (see `markers_and_record`)."""
    return markers_and_record(product_ids).marked


def mark(product_id: int, *, fence: int) -> bool:
    """Call only while holding the product's lock (with that hold's fence), after reading its
    committed stock as 0. False if a refill came after the hold began (or Redis is away)."""
    hooks.call("before_sold_out_mark", {})
    ttl = int(shop_settings.SOLDOUT_TTL)
    try:
        marked = bool(_client().eval(_MARK, 2, *_marker_keys(product_id), fence, ttl))
        if marked:  # the index is a hint in a key of its own (another slot on a cluster)
            _client().zadd(redis_keys.sold_out_index(), {str(product_id): time.time() + ttl})
        return marked
    except RedisError:
        log.warning("could not mark product %s sold out", product_id, exc_info=True)
        return False


def mark_under(product_id: int, hold: locks.Hold | None) -> None:
    """Its stock read 0 under `hold` (the checkout's COMMIT, an adjustment to 0): mark it, with the
    hold's fence as proof. Without locks (hold None) markers are not used; a hold already lost
    has nothing left to prove (the next buyer to read 0 marks it)."""
    if hold is None:
        return
    try:
        hold.check(verify=True)
    except (locks.LockLost, locks.LockUnavailable):
        return
    mark(product_id, fence=hold.fence)


def refilled(product_ids: Iterable[int], *, fence: int | None) -> None:
    """Call under the products' locks before committing a refill. Raises if Redis is down.

    `fence` is the refill's hold fence (None when locks are off: markers are not used then).
    """
    client = _client()
    ids = list(product_ids)
    for pid in ids:
        if fence is None:
            client.delete(redis_keys.sold_out_marker(pid))
        else:
            client.eval(_REFILL, 2, *_marker_keys(pid), fence, max(FLOOR_TTL, int(shop_settings.SOLDOUT_TTL)))
    if ids:
        client.zrem(redis_keys.sold_out_index(), *[str(pid) for pid in ids])
        for pid in ids:
            _known.pop(pid, None)
