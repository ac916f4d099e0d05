"""A bounded log of noteworthy lock events (timeouts, lost locks, force releases, long waits,
statistics resets).

Kept in one Redis list shared by every process. Writing is best effort: an event log must
never turn a successful operation into a failure.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from locks.conf import locks_settings
from locks.keys import events_key

log = logging.getLogger("locks")

TIMEOUT = "timeout"
LOST = "lost"
FORCE_RELEASE = "force_release"
LONG_WAIT = "long_wait"
STATS_RESET = "stats_reset"  # an operator reset the statistics (name "*", the actor and families)
KINDS = (TIMEOUT, LOST, FORCE_RELEASE, LONG_WAIT, STATS_RESET)


def record_event(client: Redis, kind: str, name: str, **info: Any) -> None:
    entry = {"at": time.time(), "kind": kind, "name": name, **info}
    size = int(locks_settings.EVENT_LOG_SIZE)
    key = events_key()
    try:
        pipe = client.pipeline(transaction=False)
        pipe.lpush(key, json.dumps(entry, default=str))
        pipe.ltrim(key, 0, size - 1)
        pipe.expire(key, int(locks_settings.METRICS_TTL))
        pipe.execute()
    except RedisError:
        log.warning("could not record lock event %s for %s", kind, name, exc_info=True)
