"""Inspection and metrics, shared through Redis by every process."""

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


def test_held_locks_pages_through_scan(name, private_redis):
    # A private Redis: paging the shared one walks every key other runs left there (a million
    # takes longer than a 10 s lease), and this test is about the pages, not about that walk.
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


@pytest.mark.alone  # 10 ms holds timed
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
    # A lease long enough that the timed-out attempt is over well before it ends, even where a
    # round trip after an idle moment costs tens of ms (with 0.3 s, CI once saw the lease end
    # first: the next waiter got the lock at once, no long wait).
    holder = Lock(name, ttl=1.0)
    held = holder.__enter__()
    assert not Lock(name, wait=0.05).acquire()
    with Lock(name, wait=3.0):  # waits for the rest of the 1 s lease: a long wait
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


# -- combining ---------------------------------------------------------------------------------
def test_queued_requests_are_told_apart_from_plain_waiters_and_the_batch_is_counted(name):
    """Two queued requests, then a plain waiter: the holder's successor serves both requests'
    batch (it stops at the plain waiter), and the batch, flushed by the child's exit, is counted."""
    from tests.locks.conftest import FORK, wait_in_child, wait_until_queued
    from tests.locks.test_combining import start_submitter

    holder = Lock(name, ttl=10.0)
    holder.acquire()
    submitters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(2)]
    plain_q = FORK.Queue()
    plain = FORK.Process(target=wait_in_child, args=(name, plain_q))
    plain.start()
    wait_until_queued(name, 3)
    info = inspect.lock_info(name)
    assert (info.waiters, info.queued_requests, info.plain_waiters) == (3, 2, 1)
    assert not info.queued_requests_more
    assert info.as_dict()["plain_waiters"] == 1
    before = time.time()
    holder.release()  # r0 gets it, takes r1 (then meets the plain waiter), serves both
    got = sorted(q.get(timeout=10)[:3] for _, q in submitters)
    assert got == [("r0", "turn", ["r1"]), ("r1", "served", "echo:r1")]
    plain_q.get(timeout=10)
    for proc in [*(p for p, _ in submitters), plain]:
        proc.join(10)
    summary = inspect.stats_for(name).batch_summary()
    assert (summary["batches"], summary["batched_requests"], summary["batch_sizes"]) == (1, 2, {"2": 1})
    assert before - 1 <= summary["last_batch_at"] <= time.time() + 1  # the child's clock: this machine's
    assert inspect.lock_info(name) is None


def test_a_long_queue_reports_a_bounded_lower_count_of_requests(name):
    """Past one HSCAN page the count is a lower bound, flagged, never a walk of the whole hash."""
    from django_redis import get_redis_connection

    from locks.conf import locks_settings
    from locks.keys import LockKeys

    keys = LockKeys.for_name(name)
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    with Lock(name, ttl=10.0):
        fields = {}
        for i in range(5000):  # as acquire.lua writes them: a waiter and its request
            fields[f"tok{i:08d}"] = "99999999999999|1000|1|x:1"
            fields[f"p|tok{i:08d}"] = "payload"
        client.hset(keys.waiters, mapping=fields)
        client.rpush(keys.queue, *(f"tok{i:08d}" for i in range(5000)))
        try:
            info = inspect.lock_info(name)
        finally:
            client.delete(keys.waiters, keys.queue)
    assert info.waiters == 5000 and info.queued_requests_more
    assert 0 < info.queued_requests < 5000


def test_batch_summary_totals_and_ages():
    a = inspect.LockStats(name="a:*", counters={"batches": 3, "batched_requests": 9}, batch={2: 3},
                          last_batch_ms=5_000)
    b = inspect.LockStats(name="b:*", counters={"batches": 1, "batched_requests": 1}, batch={0: 1},
                          last_batch_ms=9_000)
    quiet = inspect.LockStats(name="c:*")
    assert a.batch_summary()["mean_batch"] == 3.0 and quiet.batch_summary()["mean_batch"] is None
    total = inspect.totals([a, b, quiet]).batch_summary()
    assert total == {"batches": 4, "batched_requests": 10, "mean_batch": 2.5, "batch_p50": 4, "batch_p99": 4,
                     "batch_sizes": {"1": 1, "3-4": 3}, "last_batch_at": 9.0}
    assert [inspect.ago(s) for s in (None, 3.4, 600, 7300)] == ["-", "3 s ago", "10 min ago", "2 h ago"]


def test_leftovers_names_a_held_lock_and_a_key_without_a_ttl(name, redis_client):
    from locks import Lock
    from locks.keys import LockKeys

    with Lock(name, ttl=10) as held:
        assert inspect.leftovers([name]) == [f"lock {name} is still held"]
        keys = LockKeys.for_name(name)
    stats.flush()
    assert inspect.leftovers([name]) == []  # released: every key it left lapses by itself
    redis_client.persist(keys.fence)  # a fence that would live for ever
    try:
        assert inspect.leftovers([name]) == [f"{keys.fence} has no TTL"]
    finally:
        redis_client.delete(keys.fence)
    assert held.fence > 0
