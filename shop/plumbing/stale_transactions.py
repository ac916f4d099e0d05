"""Ending the MySQL transaction of a lock holder paused past its lease (invariant I7).

A holder that stops (GC pause, SIGSTOP, a stalled VM) loses its Redis lease after LOCK_TTL and
the next holder takes the lock at once, but the paused process's open transaction keeps its InnoDB
row locks (the product row, coupon claims) until it runs again: without this module the product
stalls for the whole pause. Two ways to bound it, chosen by SHOP["STALE_TRANSACTIONS"]:

- "timeout" (MariaDB 10.3+, the default there): a service transaction runs with the session's
  `idle_transaction_timeout = ceil(LOCK_TTL) + 1`. The server itself drops a connection that sits
  idle inside a transaction that long, which rolls it back and frees its rows. No privilege is
  needed. A live holder is never idle that long: its statements and Redis calls take milliseconds.
- "kill" (MySQL 8, which has no such timeout): a service transaction waits at most
  `ceil(LOCK_TTL)` s for a row lock (`innodb_lock_wait_timeout`), and each holder records
  `fence connection-id server token` under its lock name in Redis before its transaction, and
  removes it when its hold ends. A holder whose row wait runs out tries once more while a watcher,
  on a connection of its own, looks at what blocks it (`sys.innodb_lock_waits`, on MySQL 8 and
  MariaDB alike) and KILLs that one connection if, and only if, it is recorded under one of our
  locks with an older fence (its lease is over: ours was issued after it), on this very server
  (host, port and boot time: connection ids start again after a restart), its transaction began
  before our hold did, and it is still inside that hold: it holds the record's MySQL named lock
  (`GET_LOCK('shop-hold:<token>')`, taken with the record and released on that connection when
  the hold ends, whatever Redis does). The record's removal from Redis is best effort: a record
  that outlives its hold names a pooled connection that may run anything next, and the named
  lock says it is no longer the holder's. Anything else blocking the row (an operator's
  transaction, a forged or stale record) is left alone and waited for, as before. Kill mode needs
  the PROCESS privilege (to see other sessions' transactions) and one MySQL user for every app
  server, or CONNECTION_ADMIN; a refused KILL (error 1095) is logged and the holder waits as
  before.

Either way the paused process, when it runs again, finds its connection gone: its COMMIT fails
(nothing was written) and its request ids settle what its buyers were told.

The session settings bound service transactions only (those of `durable_transaction`, which run
under product and coupon locks). They are set as a service transaction begins, when the
connection does not have them yet, and put back to the server's defaults before the connection
runs anything else that could be bounded by them (an admin form's or a job's transaction; in kill
mode any statement), so the pooled connection serves everything else unbounded. A connection that
only serves checkouts pays one SET, once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import MySQLdb
from django.db import connection
from django_redis import get_redis_connection
from redis.exceptions import RedisError

import locks
from shop.conf import shop_settings
from shop.plumbing import redis_keys

log = logging.getLogger("shop")

MODES = ("auto", "timeout", "kill", "off")
# How many recent holders of one lock are remembered: a chain of holders that each stalled.
RECORDED = 4
ER_NO_SUCH_THREAD, ER_KILL_DENIED = 1094, 1095
# How often the watcher looks at the lock waits, and how much a server's boot time read twice may
# differ (it is "now - Uptime", both in whole seconds).
WATCH_EVERY = 0.02
BOOT_TIME_SLACK = 2

_BOUNDS = {
    "timeout": ("SET SESSION idle_transaction_timeout = {}", "SET SESSION idle_transaction_timeout = DEFAULT"),
    "kill": ("SET SESSION innodb_lock_wait_timeout = {}", "SET SESSION innodb_lock_wait_timeout = DEFAULT"),
}

# Per thread (a thread has its own Django connection): inside a service transaction; the holds
# recorded last, with their entries; whether the next service transaction is watched.
_state = threading.local()


def timeout_seconds() -> int:
    """How long a service transaction may sit idle: the lease, rounded up, plus a second."""
    return math.ceil(float(shop_settings.LOCK_TTL)) + 1


def lock_wait_seconds() -> int:
    """Kill mode: how long a service transaction waits for a row lock before it looks why."""
    return math.ceil(float(shop_settings.LOCK_TTL))


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


# --- bounds of a service transaction --------------------------------------------------------
def _set_bounds(raw, wanted: str) -> None:
    """Put the session's bounds to `wanted`'s (none for "off"), undoing another mode's first."""
    have = getattr(raw, "_shop_bounds", None)
    if have == wanted:
        return
    with raw.cursor() as cursor:
        if have in _BOUNDS:
            cursor.execute(_BOUNDS[have][1])
        if wanted in _BOUNDS:
            seconds = timeout_seconds() if wanted == "timeout" else lock_wait_seconds()
            cursor.execute(_BOUNDS[wanted][0].format(seconds))
    raw._shop_bounds = wanted if wanted in _BOUNDS else None


def unbound_other_work(execute, sql, params, many, context):
    """A Django execute wrapper on every connection: a statement outside a service transaction
    runs on the server's defaults. Only the first such statement after a service transaction
    pays (one SET); a timeout bound is harmless to autocommit statements, so it waits for a
    transaction."""
    wrapper = context["connection"]
    raw = wrapper.connection
    have = getattr(raw, "_shop_bounds", None)
    if have is not None and not getattr(_state, "inside", False) and (
            have == "kill" or not wrapper.get_autocommit()):
        with wrapper.wrap_database_errors:  # a lost connection is Django's error, as for the statement
            _set_bounds(raw, "off")
    return execute(sql, params, many, context)


def install(sender=None, connection=None, **kwargs) -> None:
    """`connection_created` receiver: every MySQL connection gets `unbound_other_work`."""
    if connection is None or connection.vendor != "mysql":
        return
    if unbound_other_work not in connection.execute_wrappers:
        connection.execute_wrappers.append(unbound_other_work)


@contextmanager
def service_transaction() -> Iterator[str]:
    """Around a service transaction (shop.plumbing.transactions.durable_transaction): its bounds,
    and the watch for a stale holder when the previous attempt's row wait ran out."""
    if connection.vendor != "mysql":
        yield "off"
        return
    connection.ensure_connection()
    install(connection=connection)
    wanted = mode()
    with connection.wrap_database_errors:
        _set_bounds(connection.connection, wanted)
    watch = getattr(_state, "watch", False)
    _state.watch = False
    watcher = _Watcher.start_for(_state_holds()) if watch and wanted == "kill" else None
    _state.inside = True
    try:
        yield wanted
    finally:
        _state.inside = False
        if watcher is not None:
            watcher.stop()


def lock_wait_timed_out() -> None:
    """A retry loop saw a row-lock wait run out (1205): in kill mode the next attempt of this
    thread is watched for a stale holder."""
    _state.watch = True


# --- kill mode: who holds what --------------------------------------------------------------
def _key(name: str) -> str:
    return redis_keys.holder(name)


def _client():
    return get_redis_connection(shop_settings.REDIS_ALIAS)


def _server_identity(raw) -> str:
    """host:port:boot time of the server this connection is on (once per connection)."""
    identity = getattr(raw, "_shop_server", None)
    if identity is None:
        with raw.cursor() as cursor:
            cursor.execute("SELECT @@hostname, @@port, UNIX_TIMESTAMP()")
            host, port, now = cursor.fetchone()
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
            uptime = int(cursor.fetchone()[1])
        identity = raw._shop_server = f"{host}:{port}:{int(now) - uptime}"
    return identity


def _same_server(a: str, b: str) -> bool:
    host_a, _, boot_a = a.rpartition(":")
    host_b, _, boot_b = b.rpartition(":")
    try:
        return host_a == host_b and abs(int(boot_a) - int(boot_b)) <= BOOT_TIME_SLACK
    except ValueError:
        return False


def _state_holds() -> dict[str, locks.Hold]:
    return getattr(_state, "holds", {})


def record(holds: dict[str, locks.Hold | None]) -> None:
    """Kill mode: remember which MySQL connection works under each hold (its fence), until
    `forget`; the connection takes the record's hold lock. One MySQL and one Redis round trip."""
    live = {name: hold for name, hold in holds.items() if hold is not None}
    _state.holds, _state.entries = {}, {}
    if not live or connection.vendor != "mysql" or mode() != "kill":
        return
    connection.ensure_connection()
    raw = connection.connection
    token = secrets.token_hex(16)
    with connection.wrap_database_errors:
        server = _server_identity(raw)
        _end_hold_lock()  # a record() without its forget(): that hold is over
        with raw.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [hold_lock_name(token)])
            if cursor.fetchone()[0] != 1:
                log.warning("stale transactions: hold lock not taken; a pause of this holder stalls as before")
                return
    _state.hold_lock = (raw, hold_lock_name(token))
    entries = {name: f"{hold.fence} {raw.thread_id()} {server} {token}" for name, hold in live.items()}
    ttl_ms = int(float(shop_settings.LOCK_TTL) * 1000 * 30)
    try:
        pipe = _client().pipeline(transaction=False)
        for name, entry in entries.items():
            pipe.lpush(_key(name), entry)
            pipe.ltrim(_key(name), 0, RECORDED - 1)
            pipe.pexpire(_key(name), ttl_ms)
        pipe.execute()
    except RedisError:
        log.warning("stale transactions: holder record not written (Redis); a pause of this holder stalls as before")
        _end_hold_lock()
        return
    _state.holds, _state.entries = live, entries


def hold_lock_name(token: str) -> str:
    """The MySQL named lock a holder's connection keeps for exactly its hold (random: unguessable
    without reading the record)."""
    return f"shop-hold:{token}"


def _end_hold_lock() -> None:
    """Release this thread's hold lock on the connection that took it. If that fails the
    connection is closed: the server then releases the lock, and the record names no live hold."""
    raw, name = getattr(_state, "hold_lock", (None, None))
    _state.hold_lock = (None, None)
    if raw is None or connection.connection is not raw:
        return  # that connection was closed (or replaced): its named locks went with it
    try:
        with raw.cursor() as cursor:
            cursor.execute("DO RELEASE_LOCK(%s)", [name])
    except MySQLdb.Error:
        log.warning("stale transactions: hold lock not released; the connection is closed")
        with contextlib.suppress(Exception):  # a broken connection may fail to close: it is gone either way
            connection.close()


def forget(holds: dict[str, locks.Hold | None] | list[locks.Hold]) -> None:
    """Kill mode: the holds ended; their records go, and the connection releases their hold lock,
    which voids a record that Redis failed to remove (it would otherwise point a later KILL at
    whatever the pooled connection does next). One Redis and one MySQL round trip."""
    names = [h.name for h in holds if h is not None] if isinstance(holds, list) else list(holds)
    entries = getattr(_state, "entries", {})
    mine = {name: entries[name] for name in names if name in entries}
    if not mine:
        return
    try:
        pipe = _client().pipeline(transaction=False)
        for name, entry in mine.items():
            pipe.lrem(_key(name), 1, entry)
        pipe.execute()
    except RedisError:
        log.warning("stale transactions: holder record not removed (Redis); it lapses with its TTL")
    for name in mine:
        entries.pop(name, None)
        _state_holds().pop(name, None)
    if not entries:
        _end_hold_lock()  # the record is now void, whether or not Redis removed it


@dataclass(frozen=True)
class Candidate:
    """A connection recorded under one of our locks by an older holder."""

    thread_id: int
    fence: int
    lock: str
    token: str = ""


def candidates(holds: dict[str, locks.Hold], *, own: int, server: str) -> dict[int, Candidate]:
    """The connections recorded under `holds`' locks with an older fence, on this server. A record
    without a hold lock's token (an older release's) cannot be checked, so it names no one."""
    found: dict[int, Candidate] = {}
    pipe = _client().pipeline(transaction=False)
    for name in holds:
        pipe.lrange(_key(name), 0, RECORDED - 1)
    for (name, hold), entries in zip(holds.items(), pipe.execute(), strict=True):
        for entry in entries:
            parts = (entry.decode() if isinstance(entry, bytes) else entry).split()
            if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
                continue
            fence, thread_id = int(parts[0]), int(parts[1])
            if fence < hold.fence and thread_id != own and _same_server(parts[2], server):
                found.setdefault(thread_id, Candidate(thread_id=thread_id, fence=fence, lock=name, token=parts[3]))
    return found


class _Watcher:
    """While our service transaction waits for a row, find what blocks it and KILL that one
    connection if it is a stale holder's (see the module's docstring). A thread with its own
    MySQL connection: ours is busy waiting."""

    # Per blocker: whether its transaction began before our hold, and whether it still holds the
    # hold lock of the record that names it (read in the same statement, just before a KILL).
    _QUERY = ("SELECT blocking_pid, blocking_trx_started <= NOW(6) - INTERVAL %s MICROSECOND, "
              "IS_USED_LOCK(CASE blocking_pid {cases} END) <=> blocking_pid "
              "FROM sys.innodb_lock_waits WHERE waiting_pid = %s")

    def __init__(self, *, params: dict, waiter: int, holds: dict[str, locks.Hold], suspects: dict[int, Candidate],
                 until: float) -> None:
        self.params, self.waiter, self.holds, self.suspects, self.until = params, waiter, holds, suspects, until
        self.stopped = threading.Event()
        self.killed: int | None = None
        self.thread = threading.Thread(target=self._run, name="shop-stale-holder-watch", daemon=True)

    @classmethod
    def start_for(cls, holds: dict[str, locks.Hold]) -> _Watcher | None:
        if not holds:
            return None
        raw = connection.connection
        try:
            suspects = candidates(holds, own=raw.thread_id(), server=_server_identity(raw))
        except RedisError:
            return None
        if not suspects:
            return None
        watcher = cls(params=connection.get_connection_params(), waiter=raw.thread_id(), holds=holds,
                      suspects=suspects, until=time.monotonic() + lock_wait_seconds() + 1.0)
        watcher.thread.start()
        return watcher

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)

    def _run(self) -> None:
        try:
            db = MySQLdb.connect(**self.params)
        except MySQLdb.Error as exc:
            log.warning("stale transactions: the watcher could not connect (%s)", exc)
            return
        try:
            while not self.stopped.wait(WATCH_EVERY) and time.monotonic() < self.until:
                if self._look(db):
                    return
        except MySQLdb.Error as exc:
            log.warning("stale transactions: the watcher could not read the lock waits (%s); "
                        "kill mode needs the PROCESS privilege", exc)
        finally:
            db.close()

    def _look(self, db) -> bool:
        """True when done: the blocker was killed, or the row is blocked by someone we leave alone."""
        held_for = min(time.monotonic() - hold.acquired_at for hold in self.holds.values())
        cases = " ".join(["WHEN %s THEN %s"] * len(self.suspects))
        names = [arg for s in self.suspects.values() for arg in (s.thread_id, hold_lock_name(s.token))]
        with db.cursor() as cursor:
            cursor.execute(self._QUERY.format(cases=cases), [int(held_for * 1_000_000), *names, self.waiter])
            rows = cursor.fetchall()
        if not rows:
            return False  # not waiting (yet, or any more)
        for blocking_pid, began_before_our_hold, still_in_its_hold in rows:
            suspect = self.suspects.get(int(blocking_pid))
            if suspect is not None and began_before_our_hold and still_in_its_hold:
                self._kill(db, suspect)
                return True
        log.warning("stale transactions: MySQL connection %s blocks %s but is no stale holder of it; "
                    "not killed", ", ".join(str(row[0]) for row in rows), ", ".join(self.holds))
        return True

    def _kill(self, db, suspect: Candidate) -> None:
        try:
            with db.cursor() as cursor:
                cursor.execute(f"KILL CONNECTION {int(suspect.thread_id)}")
            self.killed = suspect.thread_id
            log.warning("stale transactions: killed MySQL connection %s, a holder of %s (fence %s) past its lease",
                        suspect.thread_id, suspect.lock, suspect.fence)
        except MySQLdb.OperationalError as exc:
            if exc.args and exc.args[0] == ER_KILL_DENIED:
                log.error("stale transactions: KILL %s refused (error 1095): the app servers need one MySQL user "
                          "or CONNECTION_ADMIN; a paused holder stalls its product until it resumes",
                          suspect.thread_id)
            elif not exc.args or exc.args[0] != ER_NO_SUCH_THREAD:
                raise


# What kill mode needs of the MySQL user (the system check says it: shop/ops/checks.py).
KILL_PRIVILEGES = "PROCESS (to see which connection blocks a row) and, across MySQL users, CONNECTION_ADMIN"
