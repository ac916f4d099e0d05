"""The MySQL/MariaDB lock backend: a row per lock name, for sites that run no Redis for locks.

The table (`locks.models.LockRow`, `locks_lockrow`) is the lease and the fence: a row per name
with the holder's token, owner, lease end and fence, all times on the database server's clock
(µs since the epoch). Taking the lock is one statement, `INSERT ... ON DUPLICATE KEY UPDATE`,
that takes the row only if its lease has passed and sets, in the same statement,
`fence = GREATEST(fence + 1, now_us)`: the shared fence scale, strictly increasing per name.
The fence comes back in the OK packet through `LAST_INSERT_ID(expr)`, so an uncontended acquire
is one round trip after the wake lock.

Waiting uses MySQL's named locks (`GET_LOCK`) as the wake-up, never polling the table. The
holder also holds the named lock of the name (the *wake lock*, a hash: MariaDB allows 64
characters) on its own connection for as long as it holds the row, and releases it just after
the row. A waiter sleeps in `GET_LOCK(wake, t)` on its own connection, t = min(deadline, the
holder's lease end): it wakes when the holder releases, when the holder's connection dies (a
SIGKILLed holder: the server drops its named locks) or when the lease ends; then it takes the
row and keeps the wake lock while it holds. A released row (token '') is left to whoever has the
wake lock, so a releaser cannot barge back in ahead of the waiter that was just woken; a row
whose lease ended is anyone's. force_release ends the lease and KILLs the holder's connection,
which drops its wake lock, so waiters do not stay behind a stale holder that is still alive.

Fairness: a waiter sends one GET_LOCK for its whole wait, and MariaDB grants a named lock to
its waiters in arrival order (observed: 6 waiters queued 100 ms apart were granted 0..5, three
times out of three), so waiters are served FIFO; a release hands the wake lock straight to the
head waiter, and the releaser cannot barge back in (the released row waits for the wake lock's
holder). Waiters are counted from the process list: the connections asleep in GET_LOCK.
An asyncio cancellation KILLs the waiter's GET_LOCK from another connection (the server does
not notice a client that hung up during GET_LOCK: without the KILL it would sleep on).

A holder that took a row without the wake lock (over an ended lease while the stale holder's
connection still had it, or in the instant between a waiter's GET_LOCK and its take) has
holder_conn 0 in its row: its waiters then look again every NO_WAKE_SLICE instead of being
woken, and at its release the row goes to whoever has the wake lock by then, which restores
the normal hand-off. Rare, and bounded.

Every connection is this backend's own (raw MySQLdb, autocommit, read timeout), built from
`connections[alias].settings_dict` when it connects, never the caller's Django connection: a
lock is never part of the caller's transaction, and a rollback never releases it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import MySQLdb
from django.db import connections

from locks.backends.base import Grant, HeldLock, LockBackend, Released
from locks.conf import locks_settings
from locks.exceptions import HolderChanged, LockUnavailable
from locks.hold import Cancelled

if TYPE_CHECKING:
    from locks.hold import CancelToken, LockLike

# The server's clock, µs since the epoch (the connections run in UTC, so no DST step is possible
# in the conversion). NOW(6) is fixed for the whole statement.
NOW_US = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"

# A socket read never waits longer than this: a frozen server is noticed. A GET_LOCK wait is
# timed by select(), and given up REPLY_SLACK seconds after its own timeout.
READ_TIMEOUT = 10
REPLY_SLACK = 2.0
# How often a waiter of an asyncio task looks whether the task was cancelled (in the process).
CANCEL_CHECK = 0.05
# The waiters of a holder without the wake lock (see above) look again this often instead.
NO_WAKE_SLICE = 0.25
# Idle connections kept per process for holds, and the idle time after which one is pinged.
MAX_IDLE = 16
PING_AFTER = 30.0

_UNREACHABLE = (MySQLdb.OperationalError, MySQLdb.InterfaceError)
ER_LOCK_DEADLOCK = 1213
DEADLOCK_RETRIES = 3

# Connections a forked child inherited, disowned (see _Conn.disown) and kept referenced.
_orphans: list[Any] = []
# Every backend of this process, so that a forked child disowns their connections at once.
_backends: weakref.WeakSet[MySQLBackend] = weakref.WeakSet()

_TAKE = f"""
INSERT INTO locks_lockrow (name, token, owner, fence, lease_until, since, holder_conn)
VALUES (%(name)s, %(token)s, %(owner)s, LAST_INSERT_ID({NOW_US}), {NOW_US} + %(ttl_us)s, {NOW_US},
        IF(%(wake)s, CONNECTION_ID(), 0))
ON DUPLICATE KEY UPDATE
  fence = IF(lease_until <= {NOW_US} - IF(token = '', %(grace_us)s, 0),
             LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), fence),
  owner = IF(lease_until <= {NOW_US} - IF(token = '', %(grace_us)s, 0), VALUES(owner), owner),
  since = IF(lease_until <= {NOW_US} - IF(token = '', %(grace_us)s, 0), VALUES(since), since),
  holder_conn = IF(lease_until <= {NOW_US} - IF(token = '', %(grace_us)s, 0), VALUES(holder_conn), holder_conn),
  token = IF(lease_until <= {NOW_US} - IF(token = '', %(grace_us)s, 0), VALUES(token), token),
  lease_until = IF(token = VALUES(token), VALUES(lease_until), lease_until)
"""
# ON DUPLICATE KEY UPDATE assigns left to right, each seeing the columns already assigned: the
# condition is evaluated on the old row until `token` changes, and `lease_until` goes last.
# A released row (token '') is taken only by the wake lock's holder (grace 0), or by anyone
# once it has been free for the hand-off grace (the woken waiter froze or died before taking it).

_HELD = f"token <> '' AND lease_until > {NOW_US}"
_COLUMNS = f"name, owner, fence, since, {NOW_US} - since, lease_until - {NOW_US}"


def wake_lock_name(database: str, name: str) -> str:
    """The named lock of `name` in `database` (named locks are server-wide; at most 64 characters)."""
    return "locks:" + hashlib.sha1(f"{database}\0{name}".encode()).hexdigest()


class _Conn:
    """One raw connection of this process, and what it knows about itself."""

    def __init__(self, raw: Any, database: str) -> None:
        self.raw = raw
        self.database = database
        self.pid = os.getpid()
        self.id = raw.thread_id()
        self.used = time.monotonic()

    def run(self, sql: str, args: Any = None) -> tuple[int, int, tuple[Any, ...]]:
        """(affected rows, LAST_INSERT_ID of the statement, rows).

        A statement InnoDB chose as a deadlock victim was rolled back whole (autocommit): it is
        run again, rather than reported as the server being unavailable.
        """
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                with self.raw.cursor() as cursor:
                    count = cursor.execute(sql, args)
                    rows = cursor.fetchall()
                    last = cursor.lastrowid
                break
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != ER_LOCK_DEADLOCK or attempt == DEADLOCK_RETRIES:
                    raise
        self.used = time.monotonic()
        return count, last, rows

    def scalar(self, sql: str, args: Any = None) -> Any:
        rows = self.run(sql, args)[2]
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self.raw.close()
        else:
            self.disown()

    def disown(self) -> None:
        """In a forked child: point our copy of the socket at /dev/null, so that nothing the
        child does (not even the COM_QUIT sent when the object is freed) reaches the server on
        the parent's connection, which would end the parent's holds."""
        with contextlib.suppress(Exception):
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, self.raw.fileno())
            os.close(null)
        _orphans.append(self)


class _Held:
    """A hold's own connection, and whether it holds the name's wake lock."""

    def __init__(self, conn: _Conn, wake: bool) -> None:
        self.conn = conn
        self.wake = wake


class MySQLBackend(LockBackend):
    name = "mysql"
    supports_combining = False
    # Waiters are the connections asleep in GET_LOCK on the name (information_schema.PROCESSLIST).
    counts_waiters = True
    limitations = ("MySQL backend: waiters are counted from the server's process list (connections asleep in "
                   "GET_LOCK): a waiter of another MySQL user is seen only with the PROCESS privilege.")

    def __init__(self, mysql_database: str = "default") -> None:
        self.alias = mysql_database
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        # Connections not in use, and the connection of each hold (by token). No thread-locals:
        # a forked child would free the other threads' ones, with a COM_QUIT to the server.
        self._idle: list[_Conn] = []
        self._holds: dict[str, _Held] = {}
        _backends.add(self)

    # -- connections -------------------------------------------------------------------------
    def _after_fork(self) -> None:
        """A forked child: disown every connection of the parent (os.register_at_fork below)."""
        if self._pid == os.getpid():
            return
        self._mutex = threading.Lock()  # it may have been held by another thread of the parent
        for conn in [*self._idle, *(held.conn for held in self._holds.values())]:
            conn.disown()
        self._pid, self._idle, self._holds = os.getpid(), [], {}

    def _connect(self, name: str) -> _Conn:
        settings = connections[self.alias].settings_dict
        options = settings.get("OPTIONS") or {}
        kwargs: dict[str, Any] = {
            "db": settings["NAME"],
            "charset": options.get("charset", "utf8mb4"),
            "connect_timeout": int(options.get("connect_timeout", 5)),
            "read_timeout": READ_TIMEOUT,
            "write_timeout": READ_TIMEOUT,
            "autocommit": True,
            "init_command": "SET time_zone = '+00:00', innodb_lock_wait_timeout = 5",
        }
        host = settings.get("HOST") or "localhost"
        kwargs["unix_socket" if host.startswith("/") else "host"] = host
        if settings.get("PORT"):
            kwargs["port"] = int(settings["PORT"])
        if settings.get("USER"):
            kwargs["user"] = settings["USER"]
        if settings.get("PASSWORD"):
            kwargs["passwd"] = settings["PASSWORD"]
        for key in ("unix_socket", "ssl", "ssl_mode", "read_default_file", "read_default_group"):
            if key in options:
                kwargs[key] = options[key]
        try:
            raw = MySQLdb.connect(**kwargs)
            # No gap locks: concurrent takes of neighbouring names never block each other.
            raw.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            return _Conn(raw, settings["NAME"])
        except MySQLdb.Error as exc:
            raise LockUnavailable(f"MySQL unreachable ({self.alias}): {exc}", name=name) from exc

    def _fresh(self, conn: _Conn | None) -> bool:
        """A connection that idled a while may have been dropped (wait_timeout, a restart)."""
        if conn is None or conn.pid != os.getpid():
            return False
        if time.monotonic() - conn.used < PING_AFTER:
            return True
        try:
            conn.raw.ping()
        except MySQLdb.Error:
            conn.close()
            return False
        conn.used = time.monotonic()
        return True

    def _run(self, name: str, sql: str, args: Any = None) -> tuple[int, int, tuple[Any, ...]]:
        """One statement that needs no wake lock, on a pooled connection."""
        conn = self._take_conn(name)
        try:
            result = conn.run(sql, args)
        except _UNREACHABLE as exc:
            conn.close()
            raise LockUnavailable(f"MySQL unreachable ({self.alias}): {exc}", name=name) from exc
        except BaseException:
            conn.close()
            raise
        self._give_conn(conn)
        return result

    def _take_conn(self, name: str) -> _Conn:
        self._after_fork()
        while True:
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(name)
            if self._fresh(conn):
                return conn

    def _give_conn(self, conn: _Conn) -> None:
        with self._mutex:
            if conn.pid == self._pid and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        self._after_fork()
        with self._mutex:
            conns = [*self._idle, *(held.conn for held in self._holds.values())]
            self._idle, self._holds = [], {}
        for conn in conns:
            conn.close()

    @staticmethod
    def _wake_name(conn: _Conn, name: str) -> str:
        return wake_lock_name(conn.database, name)

    # -- acquire -----------------------------------------------------------------------------
    def acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        name = lock.name
        conn = self._take_conn(name)
        mine: _Conn | None = conn  # to give back at the end: not once a hold keeps it
        wake = self._wake_name(conn, name)
        have_wake = clean = False
        contended = False
        args = {"name": name, "token": token, "owner": owner[:200], "ttl_us": lock._ttl_ms * 1000,
                "grace_us": int(float(locks_settings.HANDOFF_LEASE) * 1e6)}
        try:
            while True:
                if not have_wake:
                    have_wake = conn.scalar("SELECT GET_LOCK(%s, 0)", [wake]) == 1
                sent = time.monotonic()
                taken, fence, _ = conn.run(_TAKE, {**args, "wake": have_wake,
                                                   "grace_us": 0 if have_wake else args["grace_us"]})
                if taken:
                    if not have_wake:
                        have_wake = self._claim_wake(conn, wake, name, token)
                    with self._mutex:
                        self._holds[token] = _Held(conn, have_wake)
                    mine = None
                    clean = True
                    return Grant(fence=int(fence), lease_start=sent, lease=lock.ttl, contended=contended)
                if not blocking or time.monotonic() >= deadline:
                    clean = True
                    return None
                contended = True
                until = min(deadline, time.monotonic() + self._wait_for(conn, name))
                if have_wake:
                    # Woken, yet the row is another's: its holder died (the server dropped its
                    # wake lock, the lease still runs) or took an ended lease without the wake
                    # lock. Neither can wake us: sleep until the time _wait_for gave.
                    self._sleep(until, cancel)
                else:
                    have_wake = self._wait_wake(conn, wake, until, cancel)
        except _UNREACHABLE as exc:
            raise LockUnavailable(f"MySQL unreachable ({self.alias}): {exc}", name=name) from exc
        finally:
            if mine is not None:
                self._leave(mine, wake if have_wake else None, clean)

    def _leave(self, conn: _Conn, wake: str | None, clean: bool) -> None:
        """Give the wake lock back and the connection to the pool; drop a connection in doubt."""
        if clean:
            try:
                if wake is not None:
                    conn.run("DO RELEASE_LOCK(%s)", [wake])
                self._give_conn(conn)
                return
            except MySQLdb.Error:
                pass
        conn.close()  # the server drops the named lock with the connection

    def _claim_wake(self, conn: _Conn, wake: str, name: str, token: str) -> bool:
        """We took an ended lease without the wake lock; have it if its holder has let go by now."""
        if conn.scalar("SELECT GET_LOCK(%s, 0)", [wake]) != 1:
            return False
        conn.run("UPDATE locks_lockrow SET holder_conn = CONNECTION_ID() WHERE name = %s AND token = %s",
                 [name, token])
        return True

    def _wait_for(self, conn: _Conn, name: str) -> float:
        """How long to wait before looking at the row again (seconds), given who has it."""
        rows = conn.run(f"SELECT token = '', lease_until - {NOW_US}, holder_conn FROM locks_lockrow "
                        "WHERE name = %s", [name])[2]
        grace = float(locks_settings.HANDOFF_LEASE)
        if not rows:
            return grace  # gone (one-shot) a moment ago: whoever has the wake lock inserts it
        left_us: int  # microseconds (BIGINT)
        released, left_us, holder_conn = rows[0]
        if released:
            # The wake lock's holder takes it; anyone may once it has been free for the grace.
            return max(0.0, (left_us / 1e6) + grace) + 0.001
        left = max(0.0, left_us / 1e6) + 0.001
        # holder_conn 0: the holder has no wake lock, its release wakes nobody: look again soon.
        # Otherwise it has the wake lock (a release wakes us) or its connection died (we have
        # the wake lock now, and it will never release): its lease end is the time to look.
        return left if holder_conn else min(left, NO_WAKE_SLICE)

    def _wait_wake(self, conn: _Conn, wake: str, until: float, cancel: CancelToken | None) -> bool:
        """Sleep in one GET_LOCK until the wake lock is ours (True) or `until` (monotonic) passes.

        One GET_LOCK for the whole wait keeps our place in the server's queue of waiters (it
        grants them in arrival order: a waiter that asked again would go to the back). We send
        it and wait for the reply ourselves (select), so an asyncio cancellation stops the wait
        at once (KILL QUERY from another connection; the caller then drops this connection) and
        a server that stops answering cannot keep us past `until`.
        """
        left = until - time.monotonic()
        if left <= 0:
            return False
        if cancel is not None and cancel.cancelled:
            raise Cancelled
        raw = conn.raw
        raw.send_query(b"SELECT GET_LOCK(" + raw.literal(wake) + f", {left:.3f})".encode())
        give_up = time.monotonic() + left + REPLY_SLACK
        while not self._reply_ready(raw, give_up, cancel):
            if cancel is not None and cancel.cancelled:
                with contextlib.suppress(LockUnavailable):
                    self._run(wake, "KILL QUERY %s", [conn.id])
                raise Cancelled
            if time.monotonic() >= give_up:
                raise MySQLdb.OperationalError(2013, f"no reply to GET_LOCK within {left + REPLY_SLACK:.1f}s")
        raw.read_query_result()
        rows = raw.store_result().fetch_row()
        conn.used = time.monotonic()
        return bool(rows) and rows[0][0] == 1

    @staticmethod
    def _reply_ready(raw: Any, give_up: float, cancel: CancelToken | None) -> bool:
        """Wait until the server answers, `give_up` passes or `cancel` fires (asyncio).

        `cancel` is looked at every CANCEL_CHECK seconds (a local check, no statement): its
        pipe is closed by the event loop as soon as the task is cancelled, possibly while we
        wait, and a closed fd number is soon another socket's.
        """
        while True:
            if cancel is not None and cancel.cancelled:
                return False
            left = give_up - time.monotonic()
            if left <= 0:
                return False
            if select.select([raw.fileno()], [], [], min(left, CANCEL_CHECK) if cancel else left)[0]:
                return not (cancel is not None and cancel.cancelled)

    @staticmethod
    def _sleep(until: float, cancel: CancelToken | None) -> None:
        left = max(0.0, until - time.monotonic())
        if cancel is None:
            time.sleep(left)
            return
        until = time.monotonic() + left
        while not cancel.cancelled and time.monotonic() < until:
            time.sleep(min(CANCEL_CHECK, max(0.0, until - time.monotonic())))
        if cancel.cancelled:
            raise Cancelled

    # -- the holder's calls ------------------------------------------------------------------
    def release(self, lock: LockLike, *, token: str) -> bool:
        self._after_fork()
        with self._mutex:
            held = self._holds.pop(token, None)
        name = lock.name
        # Released (token ''): left to whoever has the wake lock (the waiter our RELEASE_LOCK
        # wakes, or one woken earlier that found us holding without the wake lock), so the
        # releaser cannot barge back in; anyone may take it after the hand-off grace.
        sql = (f"DELETE FROM locks_lockrow WHERE name = %s AND token = %s AND lease_until > {NOW_US}"
               if lock.one_shot else
               f"UPDATE locks_lockrow SET token = '', lease_until = {NOW_US} "
               f"WHERE name = %s AND token = %s AND lease_until > {NOW_US}")
        if held is not None:
            conn = held.conn
            try:
                count = conn.run(sql, [name, token])[0]
                if held.wake:
                    conn.run("DO RELEASE_LOCK(%s)", [self._wake_name(conn, name)])
            except _UNREACHABLE:
                conn.close()  # killed by a force release, or the server restarted: try another
            else:
                self._give_conn(conn)
                return count > 0
        return self._run(name, sql, [name, token])[0] > 0

    def extend(self, lock: LockLike, *, token: str, ms: int, replace: bool) -> int:
        name = lock.name
        count = self._run(name, f"UPDATE locks_lockrow SET lease_until = IF(%s, {NOW_US}, lease_until) + %s "
                                f"WHERE name = %s AND token = %s AND lease_until > {NOW_US}",
                          [bool(replace), ms * 1000, name, token])[0]
        if not count:
            return 0
        return ms if replace else max(self.check(lock, token=token), 1)

    def check(self, lock: LockLike, *, token: str) -> int:
        rows = self._run(lock.name, f"SELECT lease_until - {NOW_US} FROM locks_lockrow WHERE name = %s AND token = %s",
                         [lock.name, token])[2]
        return int(rows[0][0]) // 1000 if rows else 0

    def locked(self, lock: LockLike) -> bool:
        return bool(self._run(lock.name, f"SELECT 1 FROM locks_lockrow WHERE name = %s AND {_HELD}", [lock.name])[2])

    # -- inspection (the dashboard, manage.py locks) -----------------------------------------
    def _waiters(self, name: str, wakes: list[str]) -> dict[str, int]:
        """How many connections sleep in GET_LOCK on each of these wake locks.

        A waiter sleeps in one GET_LOCK for its whole wait, so this misses only a waiter between
        two statements, or one that was woken and waits out a dead holder's lease.
        """
        if not wakes:
            return {}
        rows = self._run(name, "SELECT SUBSTRING(INFO, 18, 46), COUNT(*) FROM information_schema.PROCESSLIST "
                               "WHERE STATE = 'User lock' AND INFO LIKE %s GROUP BY 1",
                         ["SELECT GET_LOCK('locks:%"])[2]
        counts = {wake: int(n) for wake, n in rows}
        return {wake: counts.get(wake, 0) for wake in wakes}

    def _held_locks(self, name: str, rows: tuple[Any, ...]) -> list[HeldLock]:
        database = connections[self.alias].settings_dict["NAME"]
        wakes = [wake_lock_name(database, row[0]) for row in rows]
        waiters = self._waiters(name, wakes)
        return [
            HeldLock(name=lock_name, owner=owner, fence=int(fence), held_since=since / 1e6, held_for=held_us / 1e6,
                     ttl_left=left_us / 1e6, waiters=waiters[wake])
            for (lock_name, owner, fence, since, held_us, left_us), wake in zip(rows, wakes, strict=True)
        ]

    def describe(self, name: str) -> HeldLock | None:
        rows = self._run(name, f"SELECT {_COLUMNS} FROM locks_lockrow WHERE name = %s AND {_HELD}", [name])[2]
        return self._held_locks(name, rows)[0] if rows else None

    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        sql = f"SELECT {_COLUMNS} FROM locks_lockrow WHERE name LIKE %s AND {_HELD} ORDER BY name"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._held_locks(prefix or "*", self._run(prefix or "*", sql, [pattern])[2])

    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        for _ in range(10):
            rows = self._run(name, f"SELECT owner, fence, since, holder_conn FROM locks_lockrow "
                                   f"WHERE name = %s AND {_HELD}", [name])[2]
            if not rows:
                return None
            owner, fence, since, holder_conn = rows[0]
            if expected_fence is not None and int(fence) != expected_fence:
                raise HolderChanged(f"held by {owner} with fence {fence}, not fence {expected_fence}",
                                    name=name, owner=owner, fence=int(fence))
            # End the lease (the row keeps its token: the stale holder can no longer release,
            # extend or check it, and anyone may take it).
            if self._run(name, f"UPDATE locks_lockrow SET lease_until = {NOW_US} "
                               f"WHERE name = %s AND fence = %s AND {_HELD}", [name, fence])[0]:
                self._kill_wake_holder(name, int(holder_conn))
                return Released(owner=owner, fence=int(fence), since_us=int(since))
        raise LockUnavailable("the lock changed hands ten times during a force release", name=name)

    def _kill_wake_holder(self, name: str, holder_conn: int) -> None:
        """Drop the stale holder's wake lock, or its waiters would sleep until its old lease end.

        Only if that connection still holds this name's wake lock: a connection id is reused
        after a server restart, and the check keeps us from killing anyone else's connection.
        """
        if not holder_conn:
            return
        database = connections[self.alias].settings_dict["NAME"]
        with contextlib.suppress(LockUnavailable, MySQLdb.Error):
            rows = self._run(name, "SELECT IS_USED_LOCK(%s)", [wake_lock_name(database, name)])[2]
            if rows and rows[0][0] == holder_conn:
                self._run(name, "KILL CONNECTION %s", [holder_conn])


def prune_free_rows(*, free_for: float, alias: str | None = None) -> int:
    """Delete the rows of locks that have been free for `free_for` seconds (the `locks.prune` job).

    A row keeps its name's fence, so it is kept as long as Redis keeps a fence key (FENCE_TTL);
    after that the name's next fence comes from the clock again (still on the shared scale).
    One statement: a row taken meanwhile has its lease in the future and is not deleted.
    """
    with connections[alias or locks_settings.MYSQL_DATABASE].cursor() as cursor:
        cursor.execute(f"DELETE FROM locks_lockrow WHERE lease_until < {NOW_US} - %s", [int(free_for * 1e6)])
        deleted: int = cursor.rowcount
        return deleted


def _disown_after_fork() -> None:
    for backend in list(_backends):
        backend._after_fork()


os.register_at_fork(after_in_child=_disown_after_fork)
