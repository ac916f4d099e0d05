"""What the crowd is told, counted for the whole cluster: the lock dashboard's "Overload" panel.

Prometheus has the same counts per process (shop/ops/metrics.py); the admin dashboard needs them for
every server at once and without a Prometheus. A count is a local increment (the worker's main
loop counts the requests it answers `busy`: no I/O there); the shop's gunicorn worker adds them
to Redis once a second (`flush`), in 10-second buckets kept for an hour, which `panel` sums.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from django_redis import get_redis_connection
from redis.exceptions import RedisError

from shop.conf import shop_settings
from shop.plumbing import redis_keys

BUCKET = 10  # seconds
KEEP = 3600
# How long admitted requests waited for a thread: upper bounds in ms of the histogram's buckets.
WAIT_BOUNDS_MS = (1, 5, 10, 20, 50, 100, 200, 500, 1000)
ROWS = (
    ("shed:queue_full", "Busy: the worker's queue for a thread was full"),
    ("shed:queue_delay", "Busy: waited too long for a thread"),
    ("shed:full", "Busy: this server's lines were full (before the app)"),
    ("shed:admission", "Busy: this server's lines were full (in the app)"),
    ("shed:door_full", "Busy: the line's door had more orders waiting than it holds"),
    ("line:worker_waiting", "In line: a waiting ticket answered by the worker (no app)"),
    ("door:answered", "The line's door answered an order itself (in line, cut, sold out)"),
    ("door:kept", "The line's door's answer given again to the same token's retry"),
    ("door:held", "A token's retry sooner than the door told it, held until then"),
    ("door:soon", "An order whose turn waited only for a lagging door, held a moment and asked again"),
    ("door:turn", "The line's door let a buyer through to its turn"),
    ("door:app", "The line's door left an order to the app"),
    ("deadline:arrival", "Deadline passed before the order started"),
    ("deadline:take", "Deadline passed in line (taken too late)"),
    ("deadline:commit", "Deadline passed before COMMIT (not committed)"),
)

_counts: Counter[str] = Counter()
_guard = threading.Lock()


def count(what: str, n: int = 1) -> None:
    with _guard:
        _counts[what] += n


def waited(seconds: float) -> None:
    """An admitted request waited this long for a thread."""
    ms = seconds * 1000
    bound = next((b for b in WAIT_BOUNDS_MS if ms <= b), None)
    count(f"wait:{bound if bound is not None else 'inf'}")


def _key(bucket: int) -> str:
    return redis_keys.overload_counts(bucket)


def flush() -> None:
    """Add this process's counts to the cluster's (one round trip); kept for the next flush if
    Redis cannot take them."""
    with _guard:
        counts = dict(_counts)
        _counts.clear()
    if not counts:
        return
    key = _key(int(time.time()) // BUCKET)
    try:
        pipe = get_redis_connection(shop_settings.REDIS_ALIAS).pipeline(transaction=False)
        for what, n in counts.items():
            pipe.hincrby(key, what, n)
        pipe.expire(key, KEEP)
        pipe.execute()
    except RedisError:
        with _guard:
            _counts.update(counts)


def totals(seconds: int) -> Counter[str]:
    """The cluster's counts over the last `seconds` (whole buckets)."""
    now = int(time.time()) // BUCKET
    buckets = [now - i for i in range(max(1, seconds // BUCKET))]
    pipe = get_redis_connection(shop_settings.REDIS_ALIAS).pipeline(transaction=False)
    for bucket in buckets:
        pipe.hgetall(_key(bucket))
    out: Counter[str] = Counter()
    for data in pipe.execute():
        out.update({(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in data.items()})
    return out


def wait_percentile(counts: Counter[str], q: float) -> str:
    """The bucket bound under which a `q` share of the waits for a thread fell, as text."""
    bounds = [*WAIT_BOUNDS_MS, "inf"]
    total = sum(counts.get(f"wait:{b}", 0) for b in bounds)
    if not total:
        return "-"
    seen = 0
    for b in bounds:
        seen += counts.get(f"wait:{b}", 0)
        if seen >= q * total:
            return f"≤ {b} ms" if b != "inf" else f"> {WAIT_BOUNDS_MS[-1]} ms"
    return "-"


def panel() -> dict:
    """The lock dashboard's "Overload" panel (LOCKS["DASHBOARD_PANELS"])."""
    try:
        minute, last = totals(60), totals(BUCKET)
    except RedisError as exc:
        return {"id": "overload", "title": "Overload", "note": f"Redis is unreachable: {exc}", "headers": [],
                "rows": []}
    admitted = sum(v for k, v in minute.items() if k.startswith("wait:"))
    rows = [[label, last.get(what, 0), minute.get(what, 0), round(minute.get(what, 0) / 60, 1)]
            for what, label in ROWS]
    rows.append(["Requests that got a thread", sum(v for k, v in last.items() if k.startswith("wait:")), admitted,
                 round(admitted / 60, 1)])
    rows.append(["Their wait for a thread, p50 / p99 (last minute)", "", f"{wait_percentile(minute, 0.5)} / "
                 f"{wait_percentile(minute, 0.99)}", ""])
    return {"id": "overload", "title": "Overload", "headers": ["", "last 10 s", "last minute", "per second"],
            "rows": rows,
            "note": "every server; busy answers are 503 with Retry-After: nothing was done for those buyers. "
                    "All the time, not only in a crowd's first seconds: add servers. Deadline ones: "
                    "no order was committed for them (docs/operations.md, 'A crowd bigger than the servers')"}
