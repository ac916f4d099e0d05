"""What is held, by whom, and how contended: read from Redis, so every process sees the same.

Two ways to list held locks. `held_index_page` reads the small index the stats recorders keep
(`<p>lockheld`, holds published at each flush, see locks/stats.py) plus whatever names the
caller passes (the busiest names of each family): what the dashboard uses on every refresh, so
it never walks the keyspace. `held_locks` / `held_locks_page` SCAN the keyspace (never KEYS):
complete and immediate (the index lags by up to a flush interval), for the CLI's `--all` and
for one-off checks. Both pipeline the per-lock reads.

Statistics are per lock family (`product:*`), with the top names of each family by
acquisitions; see locks/stats.py for how they are counted and flushed.

Combining (locks/combining.py): a held lock's row says how many of its waiters queue a
*request* for the holder to serve (`queued_requests`, the "p|<token>" fields of its waiters
hash) and how many wait for the lock itself; a family's row has its batches (count, mean size,
size histogram and quantiles, time of the last one).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from locks import events, histogram
from locks.backends import HeldLock, LockBackend, get_backend
from locks.conf import locks_settings
from locks.exceptions import HolderChanged, LockUnavailable
from locks.keys import (
    LockKeys,
    events_key,
    families_key,
    family_of,
    held_key,
    hot_key,
    name_from_key,
    name_from_member,
    stats_key,
)
from locks.lock import Lock, default_client, text
from locks.scripts import script
from locks.stats import recorder

COUNTERS = ("acquired", "contended", "handoffs", "released", "timeouts", "lost", "force_released", "long_waits",
            "batches", "batched_requests")
# One HSCAN page (MATCH "p|*") per held lock counts its queued requests: exact up to a few
# hundred waiters (a listpack hash comes whole; a bigger one, one page of this many slots);
# beyond, a lower bound (`queued_requests_more`, shown as "N+"), so a 10 000-waiter queue costs
# one bounded read per refresh, not a walk of the whole hash.
REQUESTS_SCAN = 1000


@dataclass
class LockStats:
    """The stats of one lock family (`name` is the family, e.g. `product:*`)."""

    name: str
    counters: dict[str, int] = field(default_factory=dict)
    wait: dict[int, int] = field(default_factory=dict, repr=False)
    hold: dict[int, int] = field(default_factory=dict, repr=False)
    top_names: list[tuple[str, int]] = field(default_factory=list)  # busiest names, by acquisitions
    batch: dict[int, int] = field(default_factory=dict, repr=False)  # combining batch sizes, histogram.batch_*
    last_batch_ms: int | None = None  # unix ms of the latest combining batch

    @property
    def mean_batch(self) -> float | None:
        """Requests served per batch, the combiner's own included (1.0: nobody was queued)."""
        batches = self.counters.get("batches", 0)
        return self.counters.get("batched_requests", 0) / batches if batches else None

    def batch_summary(self) -> dict[str, Any]:
        """Combining: batches, mean size, p50/p99 (upper bounds of their buckets), the histogram
        as {"3-4": n, ...} in size order, and the last batch time (unix seconds)."""
        mean = self.mean_batch
        return {
            "batches": self.counters.get("batches", 0),
            "batched_requests": self.counters.get("batched_requests", 0),
            "mean_batch": None if mean is None else round(mean, 2),
            "batch_p50": histogram.batch_percentile(self.batch, 0.50),
            "batch_p99": histogram.batch_percentile(self.batch, 0.99),
            "batch_sizes": {histogram.batch_bucket_label(b): self.batch[b] for b in sorted(self.batch)},
            "last_batch_at": None if self.last_batch_ms is None else self.last_batch_ms / 1000,
        }

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
                "contention": round(self.contention, 4), **self.quantiles(), **self.batch_summary(),
                "top_names": [{"name": n, "acquired": a} for n, a in self.top_names]}


def ago(seconds: float | None) -> str:
    """12.3 -> "12 s ago": the last batch, as an operator reads it (clocks of one fleet: NTP-close)."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def _client(client: Redis | None) -> Redis:
    return client if client is not None else default_client()


def _prefix() -> str:
    return locks_settings.KEY_PREFIX


def backend_info() -> dict[str, str]:
    """Which backend holds the locks, and what it cannot show (the dashboard and `manage.py locks` say it)."""
    backend = get_backend()
    label = backend.name
    if backend.native:
        client = default_client()
        kind = type(client).__name__
        if "Cluster" in kind:
            label = "redis (cluster)"
        elif "sentinel" in type(client.connection_pool).__name__.lower():
            label = "redis (sentinel)"
    return {"name": backend.name, "label": label, "limitations": backend.limitations}


def _other_backend() -> LockBackend | None:
    """The configured backend if it is not the built-in Redis one (whose state is read here)."""
    backend = get_backend()
    return None if backend.native else backend


def _decode(d: dict[bytes, bytes] | dict[str, str]) -> dict[str, str]:
    return {text(k): text(v) for k, v in d.items()}


def _read_held(client: Redis, keys: list[str]) -> list[HeldLock]:
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.llen(f"{key}:queue")
        pipe.hscan(f"{key}:waiters", 0, match="p|*", count=REQUESTS_SCAN)
    cluster = isinstance(client, RedisCluster)
    if not cluster:
        pipe.time()
    replies = pipe.execute()
    # A cluster pipeline refuses keyless commands: TIME is asked of one node after it (the
    # masters' clocks are NTP-close; held_for is a display figure).
    secs, usecs = client.time() if cluster else replies[-1]
    now = secs + usecs / 1e6
    out = []
    for i, key in enumerate(keys):
        data, pttl, waiters, (more, requests) = replies[4 * i : 4 * i + 4]
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
            queued_requests=len(requests),
            queued_requests_more=int(more) != 0,
        ))
    return out


def held_locks_page(*, prefix: str = "", cursor: int = 0, count: int = 500,
                    client: Redis | None = None) -> tuple[int, list[HeldLock]]:
    """One SCAN page of held locks whose name starts with `prefix`: (next_cursor, locks)."""
    if client is None and (backend := _other_backend()) is not None:
        return 0, backend.held(prefix=prefix)
    c = _client(client)
    match = f"{_prefix()}lock:{{{prefix}*}}"
    try:
        if isinstance(c, RedisCluster):
            # One cursor per master: a single number cannot carry them, so a cluster's "page" is
            # the whole walk, every master scanned to its end (scan_iter), and the cursor is 0.
            keys = [text(k) for k in c.scan_iter(match=match, count=count, _type="hash")]
            return 0, _read_held(c, keys)
        # SCAN's COUNT bounds the keys examined, not the matches returned: in a big keyspace a
        # call may match nothing. Keep going (boundedly) so a page is empty only at the end.
        keys: list[str] = []
        for _ in range(50):
            cursor, raw = c.scan(cursor=cursor, match=match, count=count, _type="hash")
            keys.extend(text(k) for k in raw)
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
    if client is None and (backend := _other_backend()) is not None:
        return backend.describe(name)
    c = _client(client)
    try:
        found = _read_held(c, [LockKeys.for_name(name).lock])
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
    return found[0] if found else None


def _parse_stats(name: str, raw: dict[bytes, bytes]) -> LockStats:
    """The recorders store only what cannot be derived; the rest is computed here.

    Only contended acquisitions are put in a wait bucket (an uncontended one waited 0), and
    every finished hold is in a hold bucket, so `released` = holds - force releases.
    """
    fields = {k: int(v) for k, v in _decode(raw).items()}
    counters = {c: fields.get(c, 0) for c in COUNTERS}
    wait = histogram.parse(fields, "w")
    hold = histogram.parse(fields, "h")
    batch = histogram.parse(fields, "b")
    uncontended = counters["acquired"] - sum(wait.values())
    if uncontended > 0:
        wait[0] = wait.get(0, 0) + uncontended
    counters["released"] = max(0, sum(hold.values()) - counters["force_released"])
    counters["handoffs"] = counters["contended"]
    return LockStats(name=name, counters=counters, wait=wait, hold=hold, batch=batch,
                     last_batch_ms=fields.get("last_batch_ms"))


def family_matches(family: str, prefix: str) -> bool:
    """Could a name starting with `prefix` count in `family`? (`product:4` -> `product:*`.)"""
    if not prefix:
        return True
    shape = family_of(prefix)
    return family.startswith(shape) or shape.startswith(family)


def families(*, client: Redis | None = None) -> list[str]:
    """Every family with stats (within the metrics TTL)."""
    c = _client(client)
    try:
        return sorted(text(f) for f in c.smembers(families_key()))
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc


def lock_stats(*, prefix: str = "", top: int = 10, client: Redis | None = None) -> list[LockStats]:
    """Counters, histograms and the `top` busiest names of every family that may hold `prefix`.

    One SMEMBERS and one pipeline (an HGETALL and a ZREVRANGE per family): no keyspace SCAN.
    """
    c = _client(client)
    names = [f for f in families(client=c) if family_matches(f, prefix)]
    try:
        pipe = c.pipeline(transaction=False)
        for family in names:
            pipe.hgetall(stats_key(family))
            pipe.zrevrange(hot_key(family), 0, max(int(locks_settings.STATS_TOP_N), top) - 1, withscores=True)
        replies = pipe.execute() if names else []
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc
    out = []
    for i, family in enumerate(names):
        raw, hot = replies[2 * i], replies[2 * i + 1]
        if not raw:
            continue
        stats = _parse_stats(family, raw)
        stats.top_names = [(text(n), int(a)) for n, a in hot if text(n).startswith(prefix)][:top]
        out.append(stats)
    return out


def family_stats(family: str, *, top: int = 10, client: Redis | None = None) -> LockStats:
    c = _client(client)
    try:
        pipe = c.pipeline(transaction=False)
        pipe.hgetall(stats_key(family))
        pipe.zrevrange(hot_key(family), 0, top - 1, withscores=True)
        raw, hot = pipe.execute()
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=family) from exc
    stats = _parse_stats(family, raw)
    stats.top_names = [(text(n), int(a)) for n, a in hot]
    return stats


def stats_for(name: str, *, family: str | None = None, client: Redis | None = None) -> LockStats:
    """The stats row that counts `name`: its family's (`family_of(name)` unless given).

    Counters are kept per family, not per name; `acquisitions()` has a name's own count.
    """
    LockKeys.for_name(name)  # validates the name
    return family_stats(family_of(name) if family is None else family, client=client)


def acquisitions(names: list[str], *, family: str | None = None, client: Redis | None = None) -> dict[str, int]:
    """Acquisitions of each name, from its family's busiest names (0 if not among them, or one-shot)."""
    c = _client(client)
    try:
        pipe = c.pipeline(transaction=False)
        for name in names:
            pipe.zscore(hot_key(family_of(name) if family is None else family), name)
        replies = pipe.execute() if names else []
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name="*") from exc
    return {name: int(score or 0) for name, score in zip(names, replies, strict=True)}


def held_index_page(*, prefix: str = "", cursor: int = 0, count: int = 200, also: list[str] = (),
                    client: Redis | None = None) -> tuple[int, list[HeldLock]]:
    """One page of held locks from the held index (ZSCAN of one small key), plus the names in `also`.

    The index knows a hold from the first stats flush after it began (<= STATS_FLUSH_INTERVAL);
    `also` (e.g. the busiest names) catches the short holds of hot locks in between. Entries
    whose lock is gone are skipped: every row is read from the lock itself. Another backend
    than Redis lists its held locks itself (one page).
    """
    if client is None and (backend := _other_backend()) is not None:
        return 0, backend.held(prefix=prefix, limit=count)
    c = _client(client)
    try:
        cursor, members = c.zscan(held_key(), cursor=cursor, match=f"{prefix}*", count=count)
        names = {name_from_member(text(m)) for m, _ in members}
        names.update(n for n in also if n.startswith(prefix))
        held = _read_held(c, [LockKeys.for_name(n).lock for n in sorted(names)])
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc
    return int(cursor), held


def totals(stats: list[LockStats]) -> LockStats:
    total = LockStats(name="(all)")
    for s in stats:
        for k, v in s.counters.items():
            total.counters[k] = total.counters.get(k, 0) + v
    total.wait = histogram.merge(s.wait for s in stats)
    total.hold = histogram.merge(s.hold for s in stats)
    total.batch = histogram.merge(s.batch for s in stats)
    total.last_batch_ms = max((s.last_batch_ms for s in stats if s.last_batch_ms is not None), default=None)
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


def force_release(name: str, *, actor: str = "", expected_fence: int | None = None, family: str | None = None,
                  client: Redis | None = None) -> HeldLock | None:
    """Free `name`; the next waiter gets it at once. Returns who held it (None: nobody did).

    With `expected_fence`, only the hold with that fence is released, atomically: an operator
    who confirmed "release the holder I see" never ends a newer holder's hold (HolderChanged).
    The old holder's fence is now stale, so its late writes are refused at the database. The
    release is counted in the stats of `family` (default `family_of(name)`).
    """
    if client is None and (backend := _other_backend()) is not None:
        before = backend.describe(name)
        released = backend.force_release(name, expected_fence=expected_fence)
        if released is None:
            return None
        recorder().force_released(Lock(name, family=family), since_us=released.since_us,
                                  now_us=int(time.time() * 1e6))
        events.record_event(default_client(), events.FORCE_RELEASE, name, owner=released.owner,
                            fence=released.fence, actor=actor or f"{socket.gethostname()}:{os.getpid()}")
        if before is not None and before.fence == released.fence:
            return before
        return HeldLock(name=name, owner=released.owner, fence=released.fence, held_since=released.since_us / 1e6,
                        held_for=max(0.0, time.time() - released.since_us / 1e6), ttl_left=0.0, waiters=0)
    c = _client(client)
    keys = LockKeys.for_name(name)
    before = lock_info(name, client=c)
    try:
        held = script("force_release")(
            keys=[keys.lock, keys.fence, keys.queue, keys.waiters, keys.wake, keys.taken],
            args=[keys.signal_prefix, int(locks_settings.FENCE_TTL * 1000),
                  max(1, int(float(locks_settings.HANDOFF_LEASE) * 1000)),
                  "0" if expected_fence is None else str(int(expected_fence))],
            client=c,
        )
    except RedisError as exc:
        raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
    if not held:
        return None
    if text(held[0]) == "changed":
        owner, fence = text(held[1]), int(held[2])
        raise HolderChanged(f"the holder changed: {owner} holds it now with fence {fence}, not fence "
                            f"{expected_fence}", name=name, owner=owner, fence=fence)
    owner, fence, since_us = text(held[0]), int(held[1]), int(held[2])
    recorder().force_released(Lock(name, family=family, client=client), since_us=since_us,
                              now_us=int(time.time() * 1e6))
    events.record_event(c, events.FORCE_RELEASE, name, owner=owner, fence=fence,
                        actor=actor or f"{socket.gethostname()}:{os.getpid()}")
    if before is not None and before.fence == fence:
        return before
    return HeldLock(name=name, owner=owner, fence=fence, held_since=since_us / 1e6,
                    held_for=max(0.0, time.time() - since_us / 1e6), ttl_left=0.0, waiters=0)
