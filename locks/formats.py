"""How the lock pages write durations and moments: one place, so the dashboard, its JSON (which
its refresh script shows as it is), the event log, the job runs and the force-release audit agree.
The templates reach these through the `locks_format` filters (locks/templatetags)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import dateformat, timezone

# (below this many seconds, the unit, seconds per unit); the last one takes the rest.
_UNITS = ((1.0, "ms", 0.001), (120.0, "s", 1.0), (7200.0, "min", 60.0), (float("inf"), "h", 3600.0))

WHEN_FORMAT = "Y-m-d H:i:s T"  # 2026-11-26 21:38:46 UTC, in the site's time zone


def _short(number: float) -> str:
    """Three significant digits at most, two decimals at most, no trailing zeros."""
    digits = 0 if number >= 100 else 1 if number >= 10 else 2
    text = f"{number:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float | None) -> str:
    """0.000674 -> "0.67 ms", 0.0273 -> "27.3 ms", 14.756 -> "14.8 s", 754 -> "12.6 min", None -> "-"."""
    if seconds is None:
        return "-"
    seconds = max(float(seconds), 0.0)
    for below, unit, size in _UNITS:
        text = _short(seconds / size)
        if float(text) * size < below:  # 0.9996 s is "1 s", not "1000 ms"
            return f"{text} {unit}"
    raise AssertionError("unreachable: the last unit has no upper bound")


def when(value: datetime | float | None) -> str:
    """A moment (an aware datetime, or unix seconds) as "2026-11-26 21:38:46 UTC" in the site's
    time zone; None -> "-"."""
    if value is None:
        return "-"
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(float(value), tz=UTC)
    return dateformat.format(timezone.localtime(value), WHEN_FORMAT)
