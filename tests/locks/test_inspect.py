"""Inspection and metrics, shared through Redis by every process (point 9)."""

from __future__ import annotations

import os
import socket
import time

import pytest

from locks import Lock, LockNotOwned, inspect, stats
from locks.events import FORCE_RELEASE, LONG_WAIT, LOST, TIMEOUT
from tests.locks.conftest import start_waiter


def test_held_locks_shows_a_lock_held_by_another_process(held_elsewhere):
    name, pid, fence = held_elsewhere
    (info,) = inspect.held_locks(prefix=name)
    assert info.owner == f"{socket.gethostname()}:{pid}"
    assert info.fence == fence
    assert 25 < info.ttl_left <= 30
    assert 0 <= info.held_for < 10
    assert info.waiters == 0
    again = inspect.lock_info(name)
    assert (again.owner, again.fence, again.held_since) == (info.owner, info.fence, info.held_since)


def test_held_locks_forgets_a_released_lock(name):
    with Lock(name, ttl=10.0):
        assert [h.name for h in inspect.held_locks(prefix=name)] == [name]
    assert inspect.held_locks(prefix=name) == []


def test_held_locks_pages_through_scan(name):
    locks = [Lock(f"{name}:{i}", ttl=10.0) for i in range(30)]
    for lock in locks:
        lock.acquire()
    seen, cursor, pages = [], 0, 0
    while True:
        cursor, page = inspect.held_locks_page(prefix=name, cursor=cursor, count=5)
        seen.extend(h.name for h in page)
        pages += 1
        if cursor == 0:
            break
    assert sorted(seen) == sorted(lock.name for lock in locks)
    assert pages > 1
    for lock in locks:
        lock.release()


def test_counters_and_percentiles(name):
    lock = Lock(name, ttl=10.0)
    for _ in range(5):
        with lock:
            time.sleep(0.01)
    with lock:
        assert not Lock(name, wait=0.05).acquire()  # a timeout
    held = lock.__enter__()
    inspect.force_release(name, actor="test")
    with pytest.raises(LockNotOwned):
        held.release()  # counted as lost
    stats.flush()
    stats_row = inspect.stats_for(name)  # a name without numbers is a family of its own
    c = stats_row.counters
    assert c["acquired"] == 7
    assert c["timeouts"] == 1
    assert c["force_released"] == 1
    assert c["lost"] == 1
    assert c["released"] == 6
    q = stats_row.quantiles()
    assert 0.008 < q["hold_p50"] < 0.05  # ~10 ms holds, log buckets are ~19% wide
    assert q["wait_p99"] is not None
    assert stats_row.as_dict()["contention"] == 0.0
    assert stats_row.top_names == [(name, 7)]
    assert name in [s.name for s in inspect.lock_stats(prefix=name)]


def test_contended_acquisitions_and_wait_times_are_counted(name):
    holder = Lock(name, ttl=10.0)
    holder.acquire()
    proc, queue = start_waiter(name)
    time.sleep(0.2)  # a wait long enough to land in a clearly non-zero bucket
    holder.release()
    waited, _ = queue.get(timeout=10)
    proc.join(10)  # the child flushed its stats as it exited
    stats.flush()
    row = inspect.stats_for(name)
    assert row.counters["contended"] == 1 and row.counters["handoffs"] == 1
    assert row.contention == 0.5
    assert 0.1 < waited < 1.0
    assert 0.1 < row.quantiles()["wait_p99"] < 1.5


def test_force_release_wakes_the_next_waiter_and_is_logged(name):
    holder = Lock(name, ttl=30.0)
    holder.acquire()
    proc, queue = start_waiter(name)
    released = inspect.force_release(name, actor="ops")
    assert released is not None and released.owner.endswith(f":{os.getpid()}")
    assert queue.get(timeout=3)[0] < 1.0  # the waiter got it at once, not after the 30 s lease
    proc.join(10)
    events = inspect.recent_events(limit=20)
    assert any(e["kind"] == FORCE_RELEASE and e["name"] == name and e["actor"] == "ops" for e in events)
    assert inspect.force_release(name) is None  # nothing held any more


def test_event_log_records_timeouts_lost_and_long_waits_and_stays_bounded(name, settings):
    settings.LOCKS = {**settings.LOCKS, "LONG_WAIT": 0.05, "EVENT_LOG_SIZE": 5}
    holder = Lock(name, ttl=0.3)
    held = holder.__enter__()
    assert not Lock(name, wait=0.05).acquire()
    with Lock(name, wait=2.0):  # waits for the 0.3 s lease: a long wait
        pass
    with pytest.raises(LockNotOwned):
        held.release()
    kinds = {e["kind"] for e in inspect.recent_events(limit=10) if e["name"] == name}
    assert {TIMEOUT, LONG_WAIT, LOST} <= kinds
    for i in range(10):
        Lock(f"{name}:{i}", wait=0.0)  # no events
        with Lock(name, ttl=5.0):
            Lock(name, wait=0.01).acquire()
    assert len(inspect.recent_events(limit=100)) == 5
