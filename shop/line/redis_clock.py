"""Redis's clock, where a line's places are dated, as an offset to this process's monotonic
clock: the door (and the app, for a web checkout) dates an arrival on it itself, exactly, however
long its call then waits on its way to Redis (docs/design.md, "The line").

The reading kept is the one with the smallest round trip of the last READINGS (one every
REFRESH s), so its error is at most half that round trip (a CPU-starved process's slow readings
are passed over), plus the clocks' drift since (NTP: at most 500 ppm).
"""

from __future__ import annotations

import time

from django_redis import get_redis_connection

from shop.conf import shop_settings

REFRESH, READINGS = 0.5, 8
_readings: list[tuple[float, float, float]] = []  # (half round trip s, offset s, read at)


def offset() -> float:
    """Redis's time (TIME, seconds) minus time.monotonic(), as of the best recent reading (one
    TIME round trip every REFRESH s). Raises RedisError if Redis cannot be reached."""
    global _readings
    readings = _readings
    if not readings or time.monotonic() - readings[-1][2] >= REFRESH:
        sent = time.monotonic()
        seconds, micros = get_redis_connection(shop_settings.REDIS_ALIAS).time()
        back = time.monotonic()
        reading = ((back - sent) / 2, seconds + micros / 1e6 - (sent + back) / 2, back)
        readings = [*readings[-(READINGS - 1):], reading]
        _readings = readings  # swapped whole: other threads read it meanwhile
    return min(readings)[1]
