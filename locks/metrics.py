"""Prometheus metrics of the locks, labelled by lock FAMILY only (`product:*`), never a name.

Why beside locks/stats.py, not instead of it: the stats rows in Redis feed the admin lock
dashboard (per family, with the busiest names); Prometheus wants per-process counters and
histograms it scrapes from every server and sums. The `Recorder` calls one function here per
event it records, so both see the same events and nothing is counted twice.

Cost on the hot path: a dict lookup for the family's cached children, then a counter increment
and a histogram observation (a mutex and a few float additions; in multi-process mode an mmap
write). Family labels are capped at MAX_FAMILIES per process (the rest count as `other`), so
a caller that forgets `Lock(family=...)` on hashed names cannot blow up the series count.

Gauges that describe the shared state (queue depth of the hot locks, the backend in use) are
read from the lock service at scrape time (`locks.inspect.ScrapeCollector`), not kept per
process: every server reports the same value, so a dashboard takes their max, not their sum.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

if TYPE_CHECKING:
    from locks.hold import Hold, LockLike

log = logging.getLogger("locks")

MAX_FAMILIES = 100
OTHER = "other"
# Seconds: a checkout holds a product lock for a few ms; a waiter may wait up to LOCK_WAIT (3 s).
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

ACQUISITIONS = Counter("locks_acquisitions", "Locks acquired, contended (waited in the queue) or not.",
                       ["family", "contended"])
HANDOFFS = Counter("locks_handoffs", "Locks passed by their releasing holder to the first waiter (every "
                   "contended acquisition is one: a waiter is only ever granted the lock by a hand-off).",
                   ["family"])
WAIT = Histogram("locks_wait_seconds", "Time from asking for a lock to holding it (acquisitions only; "
                 "timeouts are counted in locks_timeouts_total).", ["family"], buckets=TIME_BUCKETS)
HOLD = Histogram("locks_hold_seconds", "Time a lock was held, acquisition to release (or to a force release).",
                 ["family"], buckets=TIME_BUCKETS)
TIMEOUTS = Counter("locks_timeouts", "Waits that ran out without the lock.", ["family"])
LONG_WAITS = Counter("locks_long_waits", "Acquisitions that waited LOCKS['LONG_WAIT'] or more.", ["family"])
LOST = Counter("locks_lost", "Holds found gone at release: the lease ran out and the lock moved on (the fence "
               "kept the writes safe).", ["family"])
FORCE_RELEASES = Counter("locks_force_releases", "Locks freed by an operator (admin or manage.py locks).",
                         ["family"])
BATCH = Histogram("locks_batch_size", "Requests a combiner served in one turn (its own plus those it took).",
                  ["family"], buckets=BATCH_BUCKETS)

_children: dict[str, tuple[Any, ...]] = {}
_children_mutex = threading.Lock()


def _for(family: str) -> tuple[Any, ...]:
    """The labelled children of one family, made once (labels() costs more than an inc)."""
    got = _children.get(family)
    if got is None:
        with _children_mutex:
            got = _children.get(family)
            if got is None:
                if len(_children) >= MAX_FAMILIES:
                    family = OTHER
                    got = _children.get(OTHER)
                if got is None:
                    got = _children[family] = (
                        ACQUISITIONS.labels(family, "false"), ACQUISITIONS.labels(family, "true"),
                        HANDOFFS.labels(family), WAIT.labels(family), HOLD.labels(family), LOST.labels(family),
                    )
    return got


def _failed(exc: Exception) -> None:
    """A metric that cannot be written (say PROMETHEUS_MULTIPROC_DIR was removed) never breaks a
    lock operation: logged once per process, then silent."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("lock metrics: could not record (%s); further failures are not logged", exc)


_warned = False


# One function per `Recorder` event, same arguments, called once per event it records.
def acquired(lock: LockLike, hold: Hold, *, contended: bool) -> None:
    try:
        uncontended_n, contended_n, handoffs, wait, _, _ = _for(lock.family)
        if contended:
            contended_n.inc()
            handoffs.inc()
        else:
            uncontended_n.inc()
        wait.observe(hold.waited)
    except Exception as exc:
        _failed(exc)


def ended(lock: LockLike, hold: Hold, *, released: bool | None) -> None:
    """Released: its hold time; found lost at release (False): lost; Redis unreachable (None): nothing."""
    try:
        if released:
            _for(lock.family)[4].observe(time.monotonic() - hold.acquired_at)
        elif released is False:
            _for(lock.family)[5].inc()
    except Exception as exc:
        _failed(exc)


_COUNTS = {"timeouts": TIMEOUTS, "long_waits": LONG_WAITS, "lost": LOST}


def count(lock: LockLike, fields: dict[str, int]) -> None:
    """`Recorder.count`'s counters, by field name (timeouts, long_waits, lost); others are not exported."""
    try:
        family = _family(lock.family)
        for name, n in fields.items():
            if (metric := _COUNTS.get(name)) is not None:
                metric.labels(family).inc(n)
    except Exception as exc:
        _failed(exc)


def batch(lock: LockLike, size: int) -> None:
    try:
        BATCH.labels(_family(lock.family)).observe(size)
    except Exception as exc:
        _failed(exc)


def force_released(family: str, *, since_us: int, now_us: int) -> None:
    """An operator freed a lock of `family`: a force release, and the hold it ended (as the stats count it)."""
    try:
        family = _family(family)
        FORCE_RELEASES.labels(family).inc()
        HOLD.labels(family).observe(max(now_us - since_us, 0) / 1e6)
    except Exception as exc:
        _failed(exc)


def _family(family: str) -> str:
    """The label `family` counts under: itself, or OTHER past the cap (see `_for`)."""
    _for(family)
    return family if family in _children else OTHER
