"""Ending the MySQL transaction of a lock holder paused past its lease (invariant I7).

A holder that stops (GC pause, SIGSTOP, a stalled VM) loses its Redis lease after LOCK_TTL and
the next holder takes the lock, but the paused process's open transaction keeps its InnoDB row
locks (the product row, coupon claims) until it runs again: without this module the product
stalls for the whole pause. Two ways to bound it, chosen by SHOP["STALE_TRANSACTIONS"]:

- "timeout" (MariaDB 10.3+, the default there): every service transaction runs on a session with
  `idle_transaction_timeout = ceil(LOCK_TTL) + 1`. The server itself drops a connection that sits
  idle inside a transaction that long, which rolls it back and frees its rows. No privilege is
  needed and nothing is added to the hot path (one SET per new connection). A live holder is
  never idle that long inside a transaction: its statements and Redis calls take milliseconds.
- "kill" (MySQL 8, which has no such timeout): each holder records `fence connection-id` under
  its lock name in Redis before its transaction (one round trip per hold), and waits at most
  `ceil(LOCK_TTL)` s for a row lock (`innodb_lock_wait_timeout`). A holder whose row wait runs
  out KILLs the connections recorded for its locks with an OLDER fence (their leases are over:
  ours was issued after them), then retries. A user may always kill its own connections; app
  servers using different MySQL users need CONNECTION_ADMIN (MySQL) for it. Without it the KILL
  is refused (error 1095): logged, and the holder waits as before.

Either way the paused process, when it runs again, finds its connection gone: its COMMIT fails
(nothing was written) and its request ids settle what its buyers were told.
"""

from __future__ import annotations

import logging
import math
import threading

from django.db import OperationalError, connection
from django_redis import get_redis_connection
from redis.exceptions import RedisError

import locks
from shop.conf import shop_settings

log = logging.getLogger("shop")

MODES = ("auto", "timeout", "kill", "off")
# How many recent holders of one lock are remembered: a chain of holders that each stalled.
RECORDED = 4
ER_NO_SUCH_THREAD, ER_KILL_DENIED = 1094, 1095
# The holds this thread recorded last: a retry after a row-lock timeout ends their predecessors.
_recorded = threading.local()


def timeout_seconds() -> int:
    """How long a service transaction may sit idle: the lease, rounded up, plus a second."""
    return math.ceil(float(shop_settings.LOCK_TTL)) + 1


def supports_idle_timeout() -> bool:
    """MariaDB 10.3+ has idle_transaction_timeout; MySQL has no equivalent."""
    return bool(connection.mysql_is_mariadb) and connection.mysql_version >= (10, 3)


def mode() -> str:
    chosen = str(shop_settings.STALE_TRANSACTIONS)
    if chosen not in MODES:
        raise ValueError(f'SHOP["STALE_TRANSACTIONS"] = {chosen!r}: expected one of {", ".join(MODES)}')
    if chosen == "auto":
        return "timeout" if connection.vendor == "mysql" and supports_idle_timeout() else "kill"
    return chosen


def prepare_connection() -> str:
    """Before a service transaction: the session settings of the mode, once per connection."""
    if connection.vendor != "mysql":
        return "off"
    connection.ensure_connection()
    raw = connection.connection
    wanted = mode()
    if getattr(raw, "_shop_stale_mode", None) == wanted:
        return wanted
    with connection.cursor() as cursor:
        if wanted == "timeout":
            cursor.execute(f"SET SESSION idle_transaction_timeout = {timeout_seconds()}")
        elif wanted == "kill":
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {math.ceil(float(shop_settings.LOCK_TTL))}")
        if wanted != "timeout" and supports_idle_timeout():
            cursor.execute("SET SESSION idle_transaction_timeout = DEFAULT")
    raw._shop_stale_mode = wanted
    return wanted


def _key(name: str) -> str:
    return f"shop:{connection.settings_dict['NAME']}:holder:{{{name}}}"


def _client():
    return get_redis_connection(shop_settings.SOLDOUT_CACHE_ALIAS)


def record(holds: dict[str, locks.Hold | None]) -> None:
    """Kill mode: remember which MySQL connection works under each hold (its fence)."""
    if prepare_connection() != "kill":
        return
    _recorded.holds = holds
    thread_id = connection.connection.thread_id()
    ttl_ms = int(float(shop_settings.LOCK_TTL) * 1000 * 30)
    try:
        pipe = _client().pipeline(transaction=False)
        for name, hold in holds.items():
            if hold is not None:
                pipe.lpush(_key(name), f"{hold.fence} {thread_id}")
                pipe.ltrim(_key(name), 0, RECORDED - 1)
                pipe.pexpire(_key(name), ttl_ms)
        pipe.execute()
    except RedisError:
        log.warning("stale transactions: holder record not written (Redis); a pause of this holder stalls as before")


def end_older_holders() -> int:
    """Kill mode, after a row-lock wait ran out: KILL the connections recorded under the locks
    this thread recorded last, with an older fence (their leases are over). Returns how many."""
    holds = getattr(_recorded, "holds", None)
    if not holds or mode() != "kill":
        return 0
    own = connection.connection.thread_id() if connection.connection is not None else None
    victims: set[int] = set()
    try:
        for name, hold in holds.items():
            if hold is None:
                continue
            for entry in _client().lrange(_key(name), 0, RECORDED - 1):
                fence, thread_id = (int(part) for part in entry.split())
                if fence < hold.fence and thread_id != own:
                    victims.add(thread_id)
    except (RedisError, ValueError):
        return 0
    killed = 0
    for thread_id in sorted(victims):
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"KILL CONNECTION {int(thread_id)}")
            killed += 1
            log.warning("stale transactions: killed MySQL connection %s of a holder past its lease", thread_id)
        except OperationalError as exc:
            if exc.args and exc.args[0] == ER_KILL_DENIED:
                log.error("stale transactions: KILL %s refused (error 1095): the app servers need one MySQL user "
                          "or CONNECTION_ADMIN; a paused holder stalls its product until it resumes", thread_id)
            elif not exc.args or exc.args[0] != ER_NO_SUCH_THREAD:
                raise
    return killed
