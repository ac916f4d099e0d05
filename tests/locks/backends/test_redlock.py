"""The backend contract on Redlock over 5 private Redis masters, and Redlock's own faults.

Faults are real: masters are SIGKILLed, and restarted EMPTY (no persistence). Every fault test
restores all masters when it ends, so later tests start with 5 masters up.
"""

from __future__ import annotations

import time

import pytest

from loadtest.servers.redlock import RedlockServers
from locks import Lock, LockUnavailable
from locks.backends import get_backend
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here


@pytest.fixture(scope="module")
def masters():
    with RedlockServers(5) as servers:
        yield servers


@pytest.fixture
def backend(settings, masters):
    masters.restore()
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "redlock", "REDLOCK_URLS": masters.urls,
                      "REDLOCK_TIMEOUT": 0.2}
    backend = get_backend()
    assert backend.name == "redlock" and not backend.supports_combining
    return backend


@pytest.fixture
def faults(masters):
    """Kill or restart masters freely: all of them are up again afterwards."""
    yield masters
    masters.restore()


def _other_holder_refused(name: str) -> bool:
    return Lock(name, ttl=5.0).acquire(blocking=False) is False


def test_keeps_working_with_two_of_five_masters_killed(backend, faults, name):
    with Lock(name, ttl=5.0) as before:
        pass
    faults.kill(0)
    faults.kill(3)
    fences = [before.fence]
    for _ in range(3):
        lock = Lock(name, ttl=5.0)
        assert lock.acquire(blocking=False)
        assert _other_holder_refused(name)
        assert lock.locked()
        fences.append(lock.held.fence)
        lock.release()
    assert fences == sorted(set(fences)), fences


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_refuses_quickly_with_three_of_five_masters_down(backend, faults, name, fault):
    for i in (1, 2, 4):
        getattr(faults.masters[i], fault)()  # SIGKILL (refused at once) or SIGSTOP (nothing answers)
    started = time.monotonic()
    with pytest.raises(LockUnavailable, match="majority"):
        Lock(name, ttl=5.0, wait=10.0).acquire()
    # Bounded by a few per-master timeouts (0.2 s), not by redis-py's ~7 s of retries or the 10 s wait.
    assert time.monotonic() - started < 3.0
    with pytest.raises(LockUnavailable):
        Lock(name, ttl=5.0).locked()


@pytest.mark.parametrize("restarts", [[(0, 1)], [(0, 1), (2, 3)], [(3, 4), (0, 4)]])
def test_fences_increase_across_masters_restarted_empty(backend, faults, name, restarts):
    with Lock(name, ttl=5.0) as held:
        fences = [held.fence]
    for pair in restarts:
        for i in pair:
            faults.restart(i)  # back EMPTY: its fence counter is gone
        with Lock(name, ttl=5.0) as held:
            fences.append(held.fence)
            assert _other_holder_refused(name)
    assert fences == sorted(set(fences)), fences


def test_a_release_never_frees_another_holders_lock(backend, name):
    first = Lock(name, ttl=0.3)
    assert first.acquire(blocking=False)
    stale = first.held
    time.sleep(0.5)  # the lease ends without a release
    second = Lock(name, ttl=5.0)
    assert second.acquire(blocking=False)
    assert not get_backend().release(first, token=stale.token)
    assert second.locked()
    assert _other_holder_refused(name)
    info = get_backend().describe(name)
    assert info is not None and info.fence == second.held.fence > stale.fence
    second.release()
    assert not second.locked()


def test_a_dead_master_costs_one_timeout_not_n(backend, faults, name):
    """Two frozen masters (SIGSTOP: nothing answers) are asked in parallel: one timeout."""
    faults.masters[1].freeze()
    faults.masters[2].freeze()
    started = time.monotonic()
    with Lock(name, ttl=5.0) as held:
        assert held.fence > 0
    # acquire + floor + release each wait one 0.2 s timeout at most; sequential calls would wait 6.
    assert time.monotonic() - started < 2.0


def test_the_fence_floor_survives_restarts_without_help_from_the_clock(backend, faults, name):
    """A counter that runs ahead of every clock (as a master with a fast clock leaves it) lives on
    one master only; that master and another restart EMPTY. Only the floor written to every
    master after the grant keeps the next fence above it: their clocks (TIME_us) are far behind."""
    from locks.keys import LockKeys

    ahead = int(time.time() * 1e6) + 3600 * 10**6  # an hour ahead of every clock here
    faults.masters[2].client().set(LockKeys.for_name(name).fence, ahead)
    with Lock(name, ttl=5.0) as held:
        first = held.fence
    assert first > ahead
    faults.restart(2)
    faults.restart(0)
    with Lock(name, ttl=5.0) as held:
        assert held.fence > first


def test_describe_counts_the_waiters_and_a_timed_out_waiter_leaves(backend, name):
    import threading

    holder = Lock(name, ttl=10.0)
    holder.acquire()
    try:
        waiter = threading.Thread(target=lambda: Lock(name, ttl=5.0, wait=1.0).acquire())
        waiter.start()
        deadline = time.monotonic() + 5.0
        while get_backend().describe(name).waiters < 1:
            assert time.monotonic() < deadline, "the waiter was never counted"
            time.sleep(0.02)
        waiter.join(10)
        assert get_backend().describe(name).waiters == 0
    finally:
        holder.release()
    assert get_backend().describe(name) is None
