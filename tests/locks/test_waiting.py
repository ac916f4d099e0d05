"""Waiting hands off without polling, never strands a waiter, and honours `wait`."""

from __future__ import annotations

import os
import statistics
import time

import pytest

import locks.backends.redis as redis_backend
from locks import Lock, LockTimeout
from locks.keys import LockKeys
from tests.locks.conftest import FORK, wait_until_queued


def _wait_and_report(name, ready, queue, delay_before_blpop=0.0):
    if delay_before_blpop:
        original = redis_backend._Signal.wait

        def late(self, *args, **kwargs):
            # The release lands here: after our failed attempt, before we start waiting.
            if self.conn is None:
                time.sleep(delay_before_blpop)
            return original(self, *args, **kwargs)

        redis_backend._Signal.wait = late
    lock = Lock(name, ttl=10.0, wait=10.0)
    ready.set()
    with lock as held:
        queue.put((time.monotonic(), held.fence, held.waited))


def _start_waiter(name, **kwargs):
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_wait_and_report, args=(name, ready, queue), kwargs=kwargs)
    proc.start()
    assert ready.wait(10)
    return proc, queue


@pytest.mark.alone  # wake-ups timed to a few ms
def test_a_waiter_in_another_process_acquires_within_milliseconds_of_release(name, redis_client):
    delays = []
    for i in range(8):
        lock = Lock(f"{name}-{i}", ttl=10.0)
        lock.acquire()
        proc, queue = _start_waiter(f"{name}-{i}")
        wait_until_queued(f"{name}-{i}")
        released_at = time.monotonic()
        lock.release()
        acquired_at, _, _ = queue.get(timeout=10)
        proc.join(10)
        delays.append(acquired_at - released_at)
    # Polling at redis-py's 0.1 s would put the median near 50 ms; a hand-off wakes at once.
    assert statistics.median(delays) < 0.025, delays
    assert max(delays) < 0.09, delays


def test_a_release_before_the_waiter_blocks_does_not_strand_it(name, redis_client):
    lock = Lock(name, ttl=10.0)
    lock.acquire()
    proc, queue = _start_waiter(name, delay_before_blpop=0.5)
    wait_until_queued(name)
    released_at = time.monotonic()
    lock.release()  # the waiter is between its failed attempt and its BLPOP
    acquired_at, _, _ = queue.get(timeout=15)
    proc.join(10)
    # It finds the hand-off as soon as it looks (~0.5 s), long before the 10 s lease would end.
    assert acquired_at - released_at < 1.5


def _crash_while_holding(name, ttl):
    Lock(name, ttl=ttl).acquire()
    os._exit(0)  # no release, no cleanup: the lease is all that is left


def test_a_crashed_holders_lock_frees_itself_at_its_ttl(name):
    proc = FORK.Process(target=_crash_while_holding, args=(name, 0.5))
    proc.start()
    proc.join(10)
    started = time.monotonic()
    with Lock(name, wait=5.0):
        waited = time.monotonic() - started
    assert waited < 1.5  # the lease (0.5 s) plus scheduling, not the 5 s wait


@pytest.mark.alone  # wake-ups timed to a few ms
@pytest.mark.parametrize("wait", [0.05, 0.3, 1.0])
def test_wait_is_honoured_without_oversleeping(name, wait):
    with Lock(name, ttl=10.0):
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            Lock(name, wait=wait).__enter__()
        elapsed = time.monotonic() - started
    assert wait <= elapsed < wait + 0.06


def test_a_timed_out_waiter_leaves_the_queue(name, redis_client):
    keys = LockKeys.for_name(name)
    with Lock(name, ttl=10.0):
        assert not Lock(name, wait=0.1).acquire()
        assert redis_client.llen(keys.queue) == 0
        assert redis_client.hlen(keys.waiters) == 0


def test_waiters_are_served_in_arrival_order(name, redis_client):
    holder = Lock(name, ttl=10.0)
    holder.acquire()
    procs = []
    for i in range(4):
        procs.append(_start_waiter(name))
        wait_until_queued(name, i + 1)
    holder.release()
    results = [q.get(timeout=10) for _, q in procs]
    for p, _ in procs:
        p.join(10)
    fences = [fence for _, fence, _ in results]
    assert fences == sorted(fences)  # first queued, first served: fences in arrival order


@pytest.mark.parametrize("cancellable", [False, True])
def test_a_waiter_whose_connection_is_cut_hears_of_it_at_once(redis_server, cancellable):
    """The wait polls its socket itself (not redis-py's can_read): a hang-up must still end it at
    once (LockUnavailable), not at its deadline or the holder's lease."""
    import asyncio
    import threading

    from locks import LockUnavailable

    client = redis_server.client()
    holder = Lock("cut-wait", ttl=30.0, client=client)
    assert holder.acquire(blocking=False)
    outcome: list = []

    def wait() -> None:
        started = time.monotonic()
        lock = Lock("cut-wait", ttl=30.0, wait=20.0, client=redis_server.client())
        try:
            if cancellable:  # the asyncio twin: its wait polls a cancel pipe beside the socket
                asyncio.run(lock.aacquire())
            else:
                lock.acquire()
            outcome.append(("acquired", time.monotonic() - started))
        except Exception as exc:
            outcome.append((type(exc).__name__, time.monotonic() - started))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    admin = redis_server.client()
    deadline = time.monotonic() + 10
    while not (blpops := [c for c in admin.client_list() if c.get("cmd") == "blpop"]):
        assert time.monotonic() < deadline, "the waiter never blocked"
        time.sleep(0.01)
    cut = time.monotonic()
    admin.client_kill_filter(_id=blpops[0]["id"])
    thread.join(15)
    assert outcome and outcome[0][0] == LockUnavailable.__name__, outcome
    assert time.monotonic() - cut < 2.0, "the cut was noticed only at the deadline"
    holder.release()
