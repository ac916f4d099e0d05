"""The backend contract on ZooKeeper (a private standalone server), and ZooKeeper's own faults:
a holder that dies or freezes loses the lock with its session; a server restart keeps it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from locks import Lock, LockLost, LockNotOwned, LockUnavailable, inspect
from locks.backends import get_backend
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.conftest import FORK

SESSION = 2.0  # the session timeout the backend fixture sets: a crashed holder's lock lasts this long
SLACK = 10.0  # a loaded machine


@pytest.fixture
def backend(settings, zookeeper):
    if not zookeeper.running:  # a test below stopped it and failed before restarting it
        zookeeper.start()
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "zookeeper", "ZOOKEEPER_HOSTS": zookeeper.hosts,
                      "ZOOKEEPER_SESSION_TIMEOUT": SESSION, "ZOOKEEPER_ROOT": "/locks"}
    backend = get_backend()
    assert backend.name == "zookeeper" and not backend.supports_combining
    return backend


def _wait_for_waiters(name: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = inspect.lock_info(name)
        if info is not None and info.waiters >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} waiter(s) queued for {name}")


def _hold(name: str, ready, queue, done=None) -> None:
    """Hold `name` (lease far longer than the session timeout); report the fence; then, if
    `done` is given, wait for it and report what check() and release() say."""
    lock = Lock(name, ttl=60.0)
    lock.acquire()
    queue.put(lock.held.fence)
    ready.set()
    if done is None:
        time.sleep(600)
        return
    done.wait(60)
    outcome = []
    for step in (lock.held.check, lock.release):
        try:
            step()
            outcome.append("ok")
        except LockLost:
            outcome.append("LockLost")
        except LockNotOwned:
            outcome.append("LockNotOwned")
        except Exception as exc:
            outcome.append(type(exc).__name__)
    queue.put(outcome)


def _wait_and_report(name: str, queue) -> None:
    with Lock(name, ttl=5.0, wait=30.0) as held:
        queue.put((time.monotonic(), held.fence))


def test_a_zookeeper_holder_that_dies_releases_to_the_next_waiter_after_its_session_timeout(backend, name):
    ready, queue, got = FORK.Event(), FORK.Queue(), FORK.Queue()
    holder = FORK.Process(target=_hold, args=(name, ready, queue))
    holder.start()
    assert ready.wait(30)
    dead_fence = queue.get(timeout=5)
    waiter = FORK.Process(target=_wait_and_report, args=(name, got))
    waiter.start()
    try:
        _wait_for_waiters(name, 1)
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        holder.join(10)
        acquired_at, fence = got.get(timeout=SESSION + SLACK)
    finally:
        waiter.join(10)
    handoff = acquired_at - killed
    print(f"hand-off after SIGKILL of the holder: {handoff:.2f}s (session timeout {SESSION}s)")
    # The 60 s lease did not end it: the session did. The server counts the timeout from the
    # last time it heard from the client (a ping every ~timeout/3), so a little before that.
    assert SESSION / 2 <= handoff < SESSION + SLACK, handoff
    assert fence > dead_fence
    assert waiter.exitcode == 0


def test_a_live_holder_that_overruns_its_lease_is_cut_off_by_the_next_waiter(backend, name):
    """The session lives on, but the lease (kept on the server's clock) still ends."""
    holder = Lock(name, ttl=0.5)
    holder.acquire()
    acquired = time.monotonic()
    got = FORK.Queue()
    waiter = FORK.Process(target=_wait_and_report, args=(name, got))
    waiter.start()
    try:
        taken_at, fence = got.get(timeout=SLACK)
    finally:
        waiter.join(10)
    assert taken_at - acquired >= 0.45  # not before the lease ended
    assert fence > holder.held.fence
    with pytest.raises(LockLost):
        holder.held.check()
    with pytest.raises(LockNotOwned):
        holder.release()


def test_a_frozen_holder_loses_the_lock_with_its_session_and_learns_it_when_it_resumes(backend, name):
    ready, done, queue = FORK.Event(), FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_hold, args=(name, ready, queue, done))
    holder.start()
    try:
        assert ready.wait(30)
        frozen_fence = queue.get(timeout=5)
        os.kill(holder.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        lock = Lock(name, ttl=10.0, wait=SESSION + SLACK)
        assert lock.acquire()
        assert time.monotonic() - stopped >= SESSION / 2  # its session ended it (see above)
        assert lock.held.fence > frozen_fence
        os.kill(holder.pid, signal.SIGCONT)
        done.set()
        assert queue.get(timeout=30) == ["LockLost", "LockNotOwned"]
        # The resumed holder's new session took nothing from us.
        lock.held.check()
        assert inspect.lock_info(name).fence == lock.held.fence
        lock.release()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        done.set()
        holder.join(10)


@pytest.mark.alone  # a Java server's restart within the session timeout
def test_a_server_restart_keeps_the_hold_and_the_waiters(backend, zookeeper, name, settings):
    # A session timeout well above a restart (JVM start plus the client's reconnect, 1-2 s): a
    # holder disconnected for a whole session timeout must assume its session gone (see
    # _as_holder), even though a restarted server gives every session a fresh timeout.
    settings.LOCKS = {**settings.LOCKS, "ZOOKEEPER_SESSION_TIMEOUT": 6.0}
    lock = Lock(name, ttl=30.0)
    lock.acquire()
    fence = lock.held.fence
    got = FORK.Queue()
    waiter = FORK.Process(target=_wait_and_report, args=(name, got))
    waiter.start()
    try:
        _wait_for_waiters(name, 1)
        zookeeper.stop()  # SIGKILL
        zookeeper.start()  # same data dir: the same server, its sessions restored
        # The sessions survived the quick restart: the hold is still ours, the waiter still waits.
        # Until the client has reconnected (its backoff; seconds on a loaded machine) the check
        # says "unreachable", as it should; the session outlives that (6 s here).
        reconnect_by = time.monotonic() + SLACK
        while True:
            try:
                lock.held.check()
                break
            except LockUnavailable:
                if time.monotonic() > reconnect_by:
                    raise
                time.sleep(0.1)
        assert Lock(name, ttl=5.0).acquire(blocking=False) is False
        assert got.empty()
        info = inspect.lock_info(name)
        assert info.fence == fence and info.waiters == 1
        lock.release()
        _, waiter_fence = got.get(timeout=SLACK)
        assert waiter_fence > fence
    finally:
        waiter.join(10)
    assert waiter.exitcode == 0
    with Lock(name, ttl=5.0) as again:
        assert again.fence > waiter_fence


def test_a_server_down_means_lock_unavailable_in_bounded_time(backend, zookeeper, name):
    lock = Lock(name, ttl=30.0)
    lock.acquire()
    zookeeper.stop()
    try:
        # The holder cannot know at first; once disconnected for a session timeout, it must
        # assume its session (and the lock) gone.
        with pytest.raises(LockUnavailable):
            lock.held.check()
        started = time.monotonic()
        with pytest.raises(LockUnavailable):
            Lock(name, ttl=5.0).acquire(blocking=False)
        with pytest.raises(LockUnavailable):
            Lock(name, ttl=5.0, wait=60.0).acquire()  # not a 60 s hang
        # Each gives up after about a session timeout without a connection.
        assert time.monotonic() - started < 2 * SESSION + SLACK
        time.sleep(SESSION)
        with pytest.raises(LockLost):
            lock.held.check()
    finally:
        zookeeper.start()
    with pytest.raises(LockNotOwned):
        lock.release()
    # Well before its 30 s lease: the given-up node went with the session, or on reconnection.
    with Lock(name, ttl=5.0, wait=SESSION + SLACK) as again:
        assert again.fence > 0


def test_an_idle_lock_node_is_deleted_and_fences_still_increase(backend, name, monkeypatch):
    """Names used once (idempotency keys) do not pile up; the fence survives the deletion."""
    from locks.backends import zookeeper as zk

    monkeypatch.setattr(zk, "IDLE_DELETE", 0.3)
    monkeypatch.setattr(zk, "SWEEP_EVERY", 0.0)
    path = backend._dir(name)
    with Lock(name, ttl=5.0) as first:
        pass
    client = backend._session().client
    assert client.exists(path) is not None
    time.sleep(0.5)
    with Lock(f"{name}:other", ttl=5.0):  # an acquire sweeps the dirs this process emptied
        pass
    assert client.exists(path) is None
    with Lock(name, ttl=5.0) as again:
        assert again.fence > first.fence
