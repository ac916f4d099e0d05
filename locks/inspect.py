"""What is held, by whom, and how contended: read from Redis, so every process sees the same.

Listing uses SCAN (never KEYS) and pipelines the per-lock reads, so a page of 10,000 held
locks costs a handful of round trips and never blocks Redis.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from locks import events, histogram
from locks.conf import locks_settings
from locks.exceptions import LockUnavailable
from locks.keys import LockKeys, events_key, name_from_key
from locks.lock import default_client
from locks.scripts import script

COUNTERS = ("acquired", "contended", "handoffs", "released", "timeouts", "lost", "force_released")


@dataclass
class HeldLock:
    name: str
    owner: str
    fence: int
    held_since: float  # unix seconds (Redis clock)
    held_for: float
    ttl_left: float
    waiters: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LockStats:
    name: str
    counters: dict[str, int] = field(default_factory=dict)
    wait: dict[int, int] = field(default_factory=dict, repr=False)
    hold: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def contention(self) -> float:
        acquired = self.counters.get("acquired", 0)
        return self.counters.get("contended", 0) / acquired if acquired else 0.0

    def quantiles(self) -> dict[str, float | None]:
        return {
            "wait_p50": histogram.percentile(self.wait, 0.50),
            "wait_p99": histogram.percentile(self.wait, 0.99),
            "hold_p50": histogram.percentile(self.hold, 0.50),
            "hold_p99": histogram.percentile(self.hold, 0.99),
        }

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{c: self.counters.get(c, 0) for c in COUNTERS},
                "contention": round(self.contention, 4), **self.quantiles()}


def _client(client: Redis | None) -> Redis:
    return client if client is not None else default_client()


def _prefix() -> str:
    return locks_settings.KEY_PREFIX


def _decode(d: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in d.items()}


def _read_held(client: Redis, keys: list[str]) -> list[HeldLock]:
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.llen(f"{key}:queue")
    pipe.time()
    replies = pipe.execute()
    secs, usecs = replies[-1]
    now = secs + usecs / 1e6
    out = []
    for i, key in enumerate(keys):
        data, pttl, waiters = replies[3 * i : 3 * i + 3]
        if not data or pttl is None or pttl == -2:
            continue  # released between SCAN and read
        d = _decode(data)
        since = int(d.get("since_us", 0)) / 1e6
        out.append(HeldLock(
            name=name_from_key(key),
            owner=d.get("owner", "?"),
            fence=int(d.get("fence", 0)),
            held_since=since,
            held_for=max(0.0, now - since),
            ttl_left=pttl / 1000 if pttl >= 0 else -1.0,
            waiters=int(waiters),
        ))
    return out


def held_locks_page(*, prefix: str = "", cursor: int = 0, count: int = 500,
                    client: Redis | None = None) -> tuple[int, list[HeldLock]]:
    """One SCAN page of held locks whose name starts with `prefix`: (next_cursor, locks)."""
    c = _client(client)
    match = f"{_prefix()}lock:{{{prefix}*}}"
    try:
        # SCAN's COUNT bounds the keys examined, not the matches returned: in a big keyspace a
        # call may match nothing. Keep going (boundedly) so a page is empty only at the end.
        keys: list[str] = []
        for _ in range(50):
            cursor, raw = c.scan(cursor=cursor, match=match, count=count, _type="hash")
            keys.extend(k.decode() for k in raw)
            if cursor == 0 or len(keys) >= count:
                break
        return int(cursor), _read_held(c, keys)
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc


def held_locks(*, prefix: str = "", limit: int | None = None, client: Redis | None = None) -> list[HeldLock]:
    """All held locks (up to `limit`), sorted by name."""
    out: list[HeldLock] = []
    cursor = 0
    while True:
        cursor, page = held_locks_page(prefix=prefix, cursor=cursor, count=1000, client=client)
        out.extend(page)
        if cursor == 0 or (limit is not None and len(out) >= limit):
            break
    out.sort(key=lambda h: h.name)
    return out[:limit] if limit is not None else out


def lock_info(name: str, *, client: Redis | None = None) -> HeldLock | None:
    c = _client(client)
    try:
        found = _read_held(c, [LockKeys.for_name(name).lock])
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
    return found[0] if found else None


def _parse_stats(name: str, raw: dict[bytes, bytes]) -> LockStats:
    """The scripts store only what cannot be derived; the rest is computed here.

    Only contended acquisitions are put in a wait bucket (an uncontended one waited 0), and
    every finished hold is in a hold bucket, so `released` = holds - force releases.
    """
    fields = {k: int(v) for k, v in _decode(raw).items()}
    counters = {c: fields.get(c, 0) for c in COUNTERS}
    wait = histogram.parse(fields, "w")
    hold = histogram.parse(fields, "h")
    uncontended = counters["acquired"] - sum(wait.values())
    if uncontended > 0:
        wait[0] = wait.get(0, 0) + uncontended
    counters["released"] = max(0, sum(hold.values()) - counters["force_released"])
    counters["handoffs"] = counters["contended"]
    return LockStats(name=name, counters=counters, wait=wait, hold=hold)


def lock_stats(*, prefix: str = "", client: Redis | None = None) -> list[LockStats]:
    """Counters and histograms of every lock name seen (within the metrics TTL)."""
    c = _client(client)
    match = f"{_prefix()}lockstats:{{{prefix}*}}"
    try:
        keys = sorted({k.decode() for k in c.scan_iter(match=match, count=1000, _type="hash")})
        pipe = c.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        replies = pipe.execute() if keys else []
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc
    return [_parse_stats(name_from_key(k, "lockstats"), r) for k, r in zip(keys, replies, strict=True) if r]


def stats_for(name: str, *, client: Redis | None = None) -> LockStats:
    c = _client(client)
    try:
        raw = c.hgetall(LockKeys.for_name(name).stats)
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
    return _parse_stats(name, raw)


def totals(stats: list[LockStats]) -> LockStats:
    total = LockStats(name="(all)")
    for s in stats:
        for k, v in s.counters.items():
            total.counters[k] = total.counters.get(k, 0) + v
    total.wait = histogram.merge(s.wait for s in stats)
    total.hold = histogram.merge(s.hold for s in stats)
    return total


def recent_events(*, limit: int = 100, kinds: tuple[str, ...] = events.KINDS,
                  client: Redis | None = None) -> list[dict[str, Any]]:
    c = _client(client)
    try:
        raw = c.lrange(events_key(), 0, max(0, int(locks_settings.EVENT_LOG_SIZE) - 1))
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc
    out = []
    for item in raw:
        entry = json.loads(item)
        if entry.get("kind") in kinds:
            out.append(entry)
            if len(out) >= limit:
                break
    return out


def force_release(name: str, *, actor: str = "", client: Redis | None = None) -> HeldLock | None:
    """Free `name` whoever holds it; the next waiter gets it at once. Returns who held it.

    The old holder's fence is now stale, so its late writes are refused at the database.
    """
    c = _client(client)
    keys = LockKeys.for_name(name)
    before = lock_info(name, client=c)
    try:
        held = script("force_release")(
            keys=[keys.lock, keys.fence, keys.queue, keys.waiters, keys.stats],
            args=[keys.signal_prefix, int(locks_settings.FENCE_TTL * 1000),
                  int(locks_settings.METRICS_TTL * 1000) if locks_settings.METRICS else 0],
            client=c,
        )
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
    if not held:
        return None
    owner, fence, since_us = held[0].decode(), int(held[1]), int(held[2])
    events.record_event(c, events.FORCE_RELEASE, name, owner=owner, fence=fence,
                        actor=actor or f"{socket.gethostname()}:{os.getpid()}")
    if before is not None and before.fence == fence:
        return before
    return HeldLock(name=name, owner=owner, fence=fence, held_since=since_us / 1e6,
                    held_for=max(0.0, time.time() - since_us / 1e6), ttl_left=0.0, waiters=0)
