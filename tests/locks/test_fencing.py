"""Fencing tokens strictly increase per name, across processes and Redis data loss."""

from __future__ import annotations

import threading
import time

from locks import Lock, stats
from tests.locks.conftest import run_in_children


def test_fences_increase_across_acquisitions(name):
    lock = Lock(name)
    fences = []
    for _ in range(50):
        with lock as held:
            fences.append(held.fence)
    assert fences == sorted(fences) and len(set(fences)) == 50


def _take_many(name, n, queue):
    lock = Lock(name, ttl=5.0, wait=20.0)
    out = []
    for _ in range(n):
        with lock as held:
            out.append((time.monotonic(), held.fence))
    queue.put(out)


def test_fences_follow_acquisition_order_across_processes_and_threads(name):
    thread_fences: list[tuple[float, int]] = []

    def in_thread() -> None:
        lock = Lock(name, ttl=5.0, wait=20.0)
        for _ in range(30):
            with lock as held:
                thread_fences.append((time.monotonic(), held.fence))

    thread = threading.Thread(target=in_thread)
    results = run_in_children(_take_many, [(name, 30)] * 4, then=thread.start)  # no fork while it runs
    thread.join()
    events = sorted([e for r in results for e in r] + thread_fences)
    fences = [f for _, f in events]
    assert len(fences) == 150
    # Ordered by the moment each holder was inside the lock, the fences only go up.
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)


def test_fences_keep_increasing_after_flushall(name, redis_server):
    client = redis_server.client()
    lock = Lock(name, client=client)
    before = []
    for _ in range(5):
        with lock as held:
            before.append(held.fence)
    client.flushall()
    with lock as held:
        assert held.fence > max(before)


def test_fences_keep_increasing_after_a_restart_without_persistence(name, redis_server):
    lock = Lock(name, client=redis_server.client())
    with lock as held:
        last = held.fence
    stats.flush()  # its stats go to the server that is about to lose them, not to the restarted one
    redis_server.stop()
    redis_server.start()
    lock = Lock(name, client=redis_server.client())
    assert lock.client.dbsize() == 0  # everything, fence counter included, is gone
    with lock as held:
        assert held.fence > last


def test_fences_are_per_name_and_a_stale_fence_can_be_told(name):
    with Lock(name) as a:
        pass
    with Lock(name + "-other") as b:
        pass
    with Lock(name) as c:
        pass
    assert c.fence > a.fence
    assert b.fence > 0
