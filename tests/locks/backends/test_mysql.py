"""The backend contract on the MySQL backend (the lock table in the test database), and what is
particular to it: the wake lock (GET_LOCK) instead of polling, a stale holder's wake lock
killed by a force release, one-shot rows, the server unreachable."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time

import MySQLdb
import pytest
from django.db import connections

from loadtest.servers.base import free_port
from locks import Lock, LockNotOwned, LockUnavailable, inspect
from locks.backends import get_backend
from locks.backends import mysql as mysql_backend
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.conftest import FORK

# The lock table is in the test database: make pytest-django create it even when only tests
# that never touch the ORM are selected (-k). Each test's ORM work (none, mostly) rolls back;
# the lock's own connections commit on their own.
pytestmark = pytest.mark.django_db


@pytest.fixture
def backend(settings, django_db_setup, django_db_blocker):
    """The lock table lives in the test database, which pytest-django creates for the session;
    the backend's own connections read its name from connections['default'] when they connect."""
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "mysql", "MYSQL_DATABASE": "default"}
    backend = get_backend()
    assert backend.name == "mysql" and not backend.supports_combining
    with django_db_blocker.unblock():
        assert connections["default"].settings_dict["NAME"].startswith("test_")
    return backend


def _row(name: str) -> tuple | None:
    """The lock's row, read on a connection of the test's own (committed data)."""
    settings = connections["default"].settings_dict
    conn = MySQLdb.connect(host=settings["HOST"] or "localhost", port=int(settings["PORT"] or 3306),
                           user=settings["USER"], passwd=settings["PASSWORD"] or "", db=settings["NAME"],
                           autocommit=True)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT token, fence, lease_until, holder_conn FROM locks_lockrow WHERE name = %s", [name])
            return cursor.fetchone()
    finally:
        conn.close()


def _hold(name: str, ttl: float, seconds: float, ready, queue) -> None:
    lock = Lock(name, ttl=ttl)
    lock.acquire()
    queue.put(lock.held.fence)
    ready.set()
    time.sleep(seconds)
    try:
        lock.release()
        queue.put("released")
    except LockNotOwned:
        queue.put("not owned")


def _waiting_in_get_lock(name: str) -> list[tuple[int, int]]:
    """(connection id, ms in the statement) of every connection asleep in GET_LOCK on `name`."""
    settings = connections["default"].settings_dict
    conn = MySQLdb.connect(host=settings["HOST"] or "localhost", port=int(settings["PORT"] or 3306),
                           user=settings["USER"], passwd=settings["PASSWORD"] or "", autocommit=True)
    wake = mysql_backend.wake_lock_name(settings["NAME"], name)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT ID, TIME_MS FROM information_schema.PROCESSLIST "
                           "WHERE STATE = 'User lock' AND INFO LIKE %s", [f"SELECT GET_LOCK('{wake}'%"])
            return [(int(i), int(ms)) for i, ms in cursor.fetchall()]
    finally:
        conn.close()


def test_a_waiter_sleeps_in_one_get_lock_and_is_woken_by_the_release(backend, name):
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold, args=(name, 30.0, 2.0, ready, queue))
    proc.start()
    try:
        assert ready.wait(30)
        holder_fence = queue.get(timeout=5)
        got: list = []
        started = time.monotonic()
        waiter = threading.Thread(target=lambda: got.append(_take_and_release(name)))
        waiter.start()
        time.sleep(1.5)
        # One statement, asleep in the server for (nearly) the whole wait so far: no polling.
        [(_, in_statement_ms)] = _waiting_in_get_lock(name)
        assert in_statement_ms > 1000, in_statement_ms
        info = inspect.lock_info(name)
        assert info is not None and info.fence == holder_fence and info.waiters == 1
        assert [h.waiters for h in inspect.held_locks(prefix=name)] == [1]
        waiter.join(20)
        fence, at = got[0]
        assert fence > holder_fence
        # Woken by the release after ~2 s: not by its 15 s deadline nor the 30 s lease.
        assert 1.5 < at - started < 6.0, at - started
        assert queue.get(timeout=10) == "released"
    finally:
        proc.join(10)


def test_a_sigkilled_holders_wake_lock_goes_with_its_connection(backend, name):
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold, args=(name, 2.0, 600, ready, queue))
    proc.start()
    assert ready.wait(30)
    dead_fence = queue.get(timeout=5)
    holder_conn = _row(name)[3]
    assert holder_conn > 0
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    killed = time.monotonic()
    with Lock(name, ttl=5.0, wait=15.0) as held:
        waited = time.monotonic() - killed
        assert held.fence > dead_fence
    # Not before the dead holder's lease (2 s from its acquire) ended, and soon after it.
    assert waited < 2.0 + 5.0, waited
    assert _row(name)[2] > 0


def test_a_force_release_wakes_the_waiters_of_a_live_stale_holder(backend, name):
    """The stale holder is alive and keeps its connection: without the KILL of its connection
    (which drops its wake lock) the waiter would sleep in GET_LOCK until the 30 s lease end."""
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold, args=(name, 30.0, 3.0, ready, queue))
    proc.start()
    try:
        assert ready.wait(30)
        stale_fence = queue.get(timeout=5)
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(_take_and_release(name)))
        waiter.start()
        time.sleep(0.3)  # the waiter is asleep in GET_LOCK
        released = inspect.force_release(name, expected_fence=stale_fence)
        assert released is not None and released.fence == stale_fence
        forced = time.monotonic()
        waiter.join(20)
        fence, at = got[0]
        assert fence > stale_fence
        assert at - forced < 2.0, at - forced
        # The stale holder, woken from its sleep, finds it no longer owns the lock.
        assert queue.get(timeout=10) == "not owned"
    finally:
        proc.join(10)


def _take_and_release(name: str) -> tuple[int, float]:
    with Lock(name, ttl=5.0, wait=15.0) as held:
        return held.fence, time.monotonic()


def test_one_shot_locks_leave_no_row_and_fences_still_increase(backend, name):
    fences = []
    for _ in range(3):
        with Lock(name, ttl=5.0, one_shot=True) as held:
            assert _row(name) is not None
            fences.append(held.fence)
        assert _row(name) is None
    assert fences == sorted(set(fences))
    assert fences[0] > (time.time() - 60) * 1e6


def test_a_released_row_keeps_its_fence(backend, name):
    with Lock(name, ttl=5.0) as first:
        pass
    token, fence, _, _ = _row(name)
    assert token == "" and fence == first.fence
    with Lock(name, ttl=5.0) as second:
        assert second.fence > first.fence


@pytest.mark.django_db(transaction=True)
def test_the_lock_is_not_part_of_the_callers_transaction(backend, name):
    from django.db import transaction

    with transaction.atomic():
        lock = Lock(name, ttl=5.0)
        lock.acquire()
        # Another connection sees the lock at once: it was committed outside our transaction.
        assert _row(name)[0] != ""
        transaction.set_rollback(True)
    assert lock.locked()
    lock.release()


def test_an_unreachable_server_raises_lock_unavailable_quickly(backend, settings, name):
    connections.settings["locks_down"] = {**connections["default"].settings_dict, "PORT": str(free_port())}
    try:
        settings.LOCKS = {**settings.LOCKS, "MYSQL_DATABASE": "locks_down"}
        lock = Lock(name, ttl=5.0, wait=10.0)
        started = time.monotonic()
        with pytest.raises(LockUnavailable):
            lock.acquire()
        with pytest.raises(LockUnavailable):
            lock.locked()
        with pytest.raises(LockUnavailable):
            inspect.lock_info(name)
        assert time.monotonic() - started < 5.0
    finally:
        with contextlib.suppress(AttributeError, KeyError):
            del connections["locks_down"]
        del connections.settings["locks_down"]


@pytest.mark.django_db(transaction=True)
def test_prune_deletes_only_rows_free_for_longer_than_the_fence_ttl(backend, name):
    from locks.backends.mysql import prune_free_rows

    with Lock(f"{name}:old", ttl=5.0):
        pass
    with Lock(f"{name}:recent", ttl=5.0):
        pass
    held = Lock(f"{name}:held", ttl=30.0)
    held.acquire()
    with connections["default"].cursor() as cursor:  # freed 31 days ago
        cursor.execute("UPDATE locks_lockrow SET lease_until = lease_until - %s WHERE name = %s",
                       [31 * 24 * 3600 * 10**6, f"{name}:old"])
    assert prune_free_rows(free_for=30 * 24 * 3600) >= 1
    assert _row(f"{name}:old") is None
    assert _row(f"{name}:recent") is not None and _row(f"{name}:held") is not None
    assert held.locked()
    held.release()


def test_a_cancelled_asyncio_waiter_leaves_no_get_lock_behind(backend, name):
    async def scenario() -> None:
        holder = Lock(name, ttl=10.0)
        await holder.aacquire()
        waiter = asyncio.create_task(Lock(name, ttl=5.0, wait=30.0).aacquire())
        await asyncio.sleep(0.5)
        assert len(_waiting_in_get_lock(name)) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        cancelled = time.monotonic()
        while _waiting_in_get_lock(name) and time.monotonic() - cancelled < 5.0:
            await asyncio.sleep(0.02)
        # Its GET_LOCK was stopped on the server (KILL QUERY), not left asleep until its 30 s timeout.
        assert _waiting_in_get_lock(name) == []
        await holder.arelease()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def _wait_and_report(name: str, index: int, queue) -> None:
    with Lock(name, ttl=5.0, wait=30.0):
        queue.put(index)
        time.sleep(0.02)


def test_waiters_are_served_in_arrival_order(backend, name):
    """MariaDB grants a named lock to its GET_LOCK waiters in arrival order, and a waiter stays
    in one GET_LOCK for its whole wait: the lock passes FIFO."""
    holder = Lock(name, ttl=30.0)
    holder.acquire()
    queue = FORK.Queue()
    procs = []
    try:
        for index in range(4):
            proc = FORK.Process(target=_wait_and_report, args=(name, index, queue))
            proc.start()
            procs.append(proc)
            waited = time.monotonic()
            while len(_waiting_in_get_lock(name)) < index + 1:  # it is queued: start the next one
                assert time.monotonic() - waited < 10
                time.sleep(0.01)
    finally:
        holder.release()
    assert [queue.get(timeout=20) for _ in procs] == [0, 1, 2, 3]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0


def test_a_holder_paused_past_its_lease_loses_the_lock_and_it_still_passes_on(backend, name):
    """The paused holder's connection keeps the wake lock: the next holder takes the ended lease
    without it, and its own waiters, whom nobody can wake, find the lock by looking again."""
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold, args=(name, 1.0, 2.0, ready, queue))
    proc.start()
    assert ready.wait(30)
    stale_fence = queue.get(timeout=5)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        first = Lock(name, ttl=5.0, wait=10.0)
        assert first.acquire()  # after the paused holder's 1 s lease
        first_fence = first.held.fence
        assert first_fence > stale_fence
        assert _row(name)[3] == 0  # taken without the wake lock
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(_take_and_release(name)))
        waiter.start()
        time.sleep(0.3)
        first.release()
        released = time.monotonic()
        waiter.join(15)
        fence, at = got[0]
        assert fence > first_fence
        assert at - released < 2.0, at - released
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert queue.get(timeout=10) == "not owned"
    proc.join(10)
    # The stale holder let go of its wake lock at its release: the next holder has it again.
    with Lock(name, ttl=5.0):
        assert _row(name)[3] > 0


def _free_inherited_connections(queue) -> None:
    """A forked child that frees every MySQL connection it inherited (COM_QUIT and close)."""
    for conn in mysql_backend._orphans:
        conn.raw.close()
    queue.put(len(mysql_backend._orphans))


def test_a_forked_child_never_closes_its_parents_connections(backend, name):
    lock = Lock(name, ttl=10.0)
    lock.acquire()
    assert lock.locked()  # a pooled connection too, besides the hold's own
    queue = FORK.Queue()
    proc = FORK.Process(target=_free_inherited_connections, args=(queue,))
    proc.start()
    assert queue.get(timeout=10) >= 2
    proc.join(10)
    # The parent's hold still has its connection, and with it the wake lock.
    settings = connections["default"].settings_dict
    holder_conn = _row(name)[3]
    conn = MySQLdb.connect(host=settings["HOST"] or "localhost", port=int(settings["PORT"] or 3306),
                           user=settings["USER"], passwd=settings["PASSWORD"] or "", autocommit=True)
    with conn.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [mysql_backend.wake_lock_name(settings["NAME"], name)])
        assert cursor.fetchone()[0] == holder_conn
    conn.close()
    assert lock.locked()
    lock.release()


class _FreezableProxy:
    """A TCP proxy to MariaDB that can stop passing bytes on (a frozen or partitioned server)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self.flowing.wait()
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.flowing.set()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def test_a_waiter_gives_up_with_lock_unavailable_when_the_server_stops_answering(backend, settings, name):
    default = connections["default"].settings_dict
    proxy = _FreezableProxy((default["HOST"] or "127.0.0.1", int(default["PORT"] or 3306)))
    connections.settings["locks_proxy"] = {**default, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
    try:
        settings.LOCKS = {**settings.LOCKS, "MYSQL_DATABASE": "locks_proxy"}
        holder = Lock(name, ttl=30.0)
        holder.acquire()
        waiter = Lock(name, ttl=5.0, wait=1.0)
        failed: list = []
        thread = threading.Thread(target=lambda: failed.append(_acquire_error(waiter)))
        thread.start()
        time.sleep(0.3)  # asleep in GET_LOCK(…, 1.0)
        proxy.flowing.clear()
        started = time.monotonic()
        thread.join(20)
        # Its GET_LOCK's reply never comes: it gives up by its own timer (1 s + REPLY_SLACK),
        # not after the socket's read timeout or never.
        assert isinstance(failed[0], LockUnavailable), failed
        assert time.monotonic() - started < 1.0 + mysql_backend.REPLY_SLACK + 2.0
        proxy.flowing.set()
        holder.release()
    finally:
        proxy.close()
        get_backend().close()
        with contextlib.suppress(AttributeError, KeyError):
            del connections["locks_proxy"]
        del connections.settings["locks_proxy"]


def _acquire_error(lock: Lock) -> BaseException | bool:
    try:
        return lock.acquire()
    except BaseException as exc:
        return exc
