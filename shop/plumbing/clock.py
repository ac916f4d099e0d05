"""The shop's one clock: the database's (docs/design.md, "One clock for drop windows").

App servers' clocks disagree (a fast one would sell before a drop opens, a slow one after it
ends), so the database's decides: the checkout writer reads it in the statement that locks the
product rows, and "End sale now" stamps it after its row locks (`db_now`). Everything before the
writer (the pages' countdowns and badges, the cart's flags, the admin's checks, Retry-After) reads
`now`: the same clock without a round trip, from this process's monotonic clock and its offset
to the database's, measured on first use and again every REFRESH seconds. The app's wall clock is
not read at all, so setting it wrong, or stepping it, moves nothing.

The error of `now` is at most half the round trip of the query that measured the offset (a
fraction of a millisecond on a LAN), plus the drift of the two clocks since (NTP slews a clock by
at most 500 ppm: 2.5 ms over REFRESH seconds, microseconds in practice). A new reading replaces
the last one only if its bound is smaller, so a query slowed by load does not spoil the clock.
`uncertainty` says the bound.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import NamedTuple

from django.db import DatabaseError, connection
from django.db.transaction import TransactionManagementError
from django.utils import timezone

log = logging.getLogger("shop")

# Seconds between two readings of the database's clock (one query each, per process).
REFRESH = 5.0
# How fast two clocks kept by NTP may part: it slews a clock by at most 500 ppm.
MAX_DRIFT = 500e-6
# The database's UTC time now, whatever the session's time zone (MySQL 8 and MariaDB alike): the
# start of the statement.
DB_NOW_SQL = "UTC_TIMESTAMP(6)"
# The same when a row is read: a SELECT ... FOR UPDATE that waited for a row lock started before
# the wait, so its UTC_TIMESTAMP is older than the lock; SYSDATE is the moment itself, but in the
# session's time zone, so the wait (SYSDATE - NOW, both in that zone) is added to the start. (A
# wait across a daylight-saving change of that zone would be off by the change: run the database
# server in UTC, or a zone without one.)
ROW_NOW_SQL = f"TIMESTAMPADD(MICROSECOND, TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)), {DB_NOW_SQL})"


class _Reading(NamedTuple):
    offset: float  # the database's time minus our monotonic time, in seconds
    at: float  # our monotonic time when it was read
    error: float  # half the round trip of the query that read it

    def bound(self, when: float) -> float:
        return self.error + MAX_DRIFT * (when - self.at)


_reading: _Reading | None = None
_tried = -REFRESH  # monotonic time of the last try to read it (a reading kept or not, a failure)
_lock = threading.Lock()


def _unlock_in_child() -> None:
    """A fork copies the lock as it was: held, if another thread was reading the clock."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_in_child)


def db_now() -> datetime:
    """The database's time, read with a query of its own (exact: where it decides, not per page).
    Read after a transaction's row locks, it is later than any order committed before them."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {DB_NOW_SQL}")
        return aware(cursor.fetchone()[0])


def now() -> datetime:
    """The database's time now, without a round trip (one every REFRESH seconds)."""
    return datetime.fromtimestamp(time.monotonic() + _current().offset, UTC)


def uncertainty() -> float:
    """How far `now` may be from the database's clock, in seconds."""
    return _current().bound(time.monotonic())


def aware(value: datetime) -> datetime:
    """A time of DB_NOW_SQL or ROW_NOW_SQL (a naive DATETIME in UTC) as an aware UTC time."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _current() -> _Reading:
    """The reading to use, read again when REFRESH seconds passed. One thread reads while the
    others go on with the last reading; before the first, they wait for it."""
    reading = _reading
    if reading is not None and time.monotonic() - _tried < REFRESH:
        return reading
    if not _lock.acquire(blocking=reading is None):
        return reading
    try:
        if _reading is None or time.monotonic() - _tried >= REFRESH:
            _refresh()
        return _reading
    finally:
        _lock.release()


def _refresh() -> None:
    global _reading, _tried
    try:
        new = _measure()
    except (DatabaseError, TransactionManagementError):  # down, or a broken transaction
        if _reading is None:
            raise  # never read: no clock to go on with
        # The last reading stays good (it drifts by MAX_DRIFT at most); tried again a REFRESH
        # later, so a database that is down is not asked on every call.
        log.warning("clock: the database's time could not be read; the reading of %.0f s ago stays",
                    time.monotonic() - _reading.at, exc_info=True)
    else:
        if _reading is None or new.error <= _reading.bound(new.at):
            _reading = new
    _tried = time.monotonic()


def _measure() -> _Reading:
    """One reading of the database's clock against ours, taken at the middle of the round trip,
    so it is right to within half of it (connecting first: a new connection's handshake is no
    part of the round trip)."""
    connection.ensure_connection()
    start = time.monotonic()
    when = db_now()
    end = time.monotonic()
    return _Reading(offset=when.timestamp() - (start + end) / 2, at=end, error=(end - start) / 2)


def shop_time(when: datetime) -> str:
    """A time as the shop states it without JavaScript: "2026-12-01 10:00 UTC", in the shop's
    time zone (settings.TIME_ZONE)."""
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M %Z")
