"""Bounded lease renewal, and telling the holder when it lost the lock."""

from __future__ import annotations

import os
import time

import pytest

from locks import Lock, LockLost, LockNotOwned
from locks.keys import LockKeys
from tests.locks.conftest import FORK

# Leases of 0.4-0.6 s kept by a watchdog thread: under pytest-xdist the other workers wait (a busy
# machine delayed a renewal past its lease once in CI).
pytestmark = pytest.mark.alone


def test_renewal_keeps_a_long_critical_section_alive(name, redis_client):
    lock = Lock(name, ttl=0.6, renew=True, max_hold=10.0)
    with lock as held:
        time.sleep(2.0)  # more than three leases
        assert not held.lost
        held.check()
        assert redis_client.hget(LockKeys.for_name(name).lock, "token").decode() == held.token
    assert not redis_client.exists(LockKeys.for_name(name).lock)


def test_without_renewal_the_same_section_loses_the_lock(name):
    lock = Lock(name, ttl=0.6)
    held = lock.__enter__()
    time.sleep(1.0)
    assert held.lost
    with pytest.raises(LockLost):
        held.check()
    with pytest.raises(LockNotOwned):
        lock.__exit__(None, None, None)


def test_renewal_stops_at_max_hold(name, redis_client):
    lock = Lock(name, ttl=0.5, renew=True, max_hold=1.0)
    held = lock.__enter__()
    time.sleep(2.0)
    assert not redis_client.exists(LockKeys.for_name(name).lock)  # a hung holder does not keep it
    assert held.lost
    with pytest.raises(LockNotOwned):
        held.release()


def test_renewal_stops_at_release(name, redis_client):
    lock = Lock(name, ttl=0.5, renew=True)
    with lock as held:
        pass
    assert not held.renewing
    # A new holder with a short lease is not kept alive by the old hold's renewer.
    other = Lock(name, ttl=0.4)
    other.acquire()
    time.sleep(0.8)
    assert not redis_client.exists(LockKeys.for_name(name).lock)


def test_renewal_failure_is_reported_before_commit(name, redis_client):
    lock = Lock(name, ttl=0.6, renew=True)
    held = lock.__enter__()
    # Someone takes the lock away (a force release, a failover that lost the key...).
    redis_client.delete(LockKeys.for_name(name).lock)
    time.sleep(0.5)  # the renewer's next tick (every ttl/3) finds it gone
    assert held.lost
    with pytest.raises(LockLost):
        held.check()
    with pytest.raises(LockNotOwned):
        lock.release()


def _exit_while_holding(name):
    Lock(name, ttl=0.5, renew=True).acquire()
    os._exit(0)


def test_renewal_stops_when_the_process_exits(name, redis_client):
    proc = FORK.Process(target=_exit_while_holding, args=(name,))
    proc.start()
    proc.join(10)
    time.sleep(0.7)
    assert not redis_client.exists(LockKeys.for_name(name).lock)


def _child_sleeps(queue):
    time.sleep(1.2)  # if the child renewed the parent's hold, the lock would outlive the parent
    queue.put(os.getpid())


def test_a_forked_child_does_not_renew_its_parents_hold(name, redis_client):
    lock = Lock(name, ttl=0.6, renew=True)
    held = lock.__enter__()
    queue = FORK.Queue()
    child = FORK.Process(target=_child_sleeps, args=(queue,))
    child.start()
    # The parent stops renewing (as if it hung); only the child could keep the lease alive now.
    held.renewing = False
    queue.get(timeout=10)
    child.join(10)
    assert not redis_client.exists(LockKeys.for_name(name).lock)
