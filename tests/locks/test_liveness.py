"""The lock stays live under faults: dead waiters, dead holders, long waits, cancellations.

Timing-sensitive, so every test here runs against a private, idle redis-server (a busy shared
one hides wake-up delays: Redis runs its timers `hz` times a second). Crashes are SIGKILL of
real processes.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import statistics
import time

import pytest
import redis
from django.conf import settings as django_settings

from locks import Lock, LockLost, inspect
from locks.keys import LockKeys
from tests.helpers import RedisServer
from tests.locks.conftest import FORK, wait_until_queued


@pytest.fixture
def idle_redis(settings):
    """The locks' cache alias on a private redis-server, with a short socket timeout as in production."""
    server = RedisServer()
    server.start()
    caches = {**django_settings.CACHES}
    caches["locks"] = {**caches["locks"], "LOCATION": server.url,
                       "OPTIONS": {**caches["locks"]["OPTIONS"], "SOCKET_TIMEOUT": 0.5}}
    settings.CACHES = caches
    yield server
    server.stop()


def _hold(name, ttl, seconds, ready, queue):
    with Lock(name, ttl=ttl) as held:
        ready.set()
        queue.put(held.fence)
        time.sleep(seconds)


def _wait_then_report(name, wait, ttl, then_die, queue):
    lock = Lock(name, ttl=ttl, wait=wait)
    try:
        held = lock._acquire(lock_holder(), blocking=True, wait=wait)
    except Exception as exc:  # reported, so the test shows what went wrong
        queue.put(("error", repr(exc), time.monotonic()))
        return
    queue.put(("ok", held.fence, time.monotonic()))
    if then_die:
        queue.close()
        queue.join_thread()  # flushed: now die holding, with a lease nobody releases
        os.kill(os.getpid(), signal.SIGKILL)
    lock.release()


def lock_holder():
    from locks.lock import current_holder

    return current_holder()


def _start(target, *args):
    queue = FORK.Queue()
    proc = FORK.Process(target=target, args=(*args, queue))
    proc.start()
    return proc, queue


# --- 1. waits longer than the socket timeout -----------------------------------------------
def test_a_wait_longer_than_the_socket_timeout_works(name, idle_redis):
    ready, queue = FORK.Event(), FORK.Queue()
    # The holder's lease (3 s) ends before our wait (6 s): the read is bounded by the lease,
    # not by our deadline, which is the case that ran into the socket timeout.
    holder = FORK.Process(target=_hold, args=(name, 3.0, 2.0, ready, queue))
    holder.start()
    assert ready.wait(10)
    started = time.monotonic()
    with Lock(name, wait=6.0) as held:  # blocks ~2 s on one read: 4x the 0.5 s socket timeout
        waited = time.monotonic() - started
        assert held.fence > queue.get(timeout=5)
    holder.join(10)
    assert 1.5 < waited < 3.0


# --- 2. a dead queued waiter is skipped -----------------------------------------------------
@pytest.mark.parametrize("dead_waiters", [1, 2])
def test_a_killed_queued_waiter_is_passed_over_within_a_second(name, idle_redis, dead_waiters):
    holder = Lock(name, ttl=30.0)
    holder.acquire()
    doomed = []
    for i in range(dead_waiters):
        doomed.append(_start(_wait_then_report, name, 20.0, 10.0, False))
        wait_until_queued(name, i + 1)
    live, live_queue = _start(_wait_then_report, name, 20.0, 10.0, False)
    wait_until_queued(name, dead_waiters + 1)
    for proc, _ in doomed:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
    released_at = time.monotonic()
    holder.release()
    status, _, acquired_at = live_queue.get(timeout=30)
    live.join(10)
    assert status == "ok"
    # Each dead waiter costs at most the hand-off lease (0.5 s), not its 10 s ttl.
    assert acquired_at - released_at < 0.5 * dead_waiters + 0.5


# --- 3. prompt wake-up when a holder dies ---------------------------------------------------
def _crash_holding(name, ttl, holding):
    Lock(name, ttl=ttl).acquire()
    holding.set()  # an Event, not a Queue: a queue's feeder thread would die with us unsent
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.alone  # wake-ups timed to a few ms
def test_the_head_waiter_gets_a_dead_holders_lock_within_milliseconds_of_its_lease(name, idle_redis):
    client = idle_redis.client()
    # What this machine itself adds: a lock taken after sleeping as long as the waiter will (a
    # virtual machine's idle CPUs wake in 0.1-30 ms). Redis's own 100 ms timer would add ~50 ms
    # (median) to that; ours, a few ms.
    woken = []
    for i in range(7):
        time.sleep(0.4)
        started = time.monotonic()
        with Lock(f"{name}-idle-{i}"):
            woken.append(time.monotonic() - started)
    lates = []
    for i in range(7):
        lock_name = f"{name}-{i}"
        holding = FORK.Event()
        proc = FORK.Process(target=_crash_holding, args=(lock_name, 0.4, holding))
        proc.start()
        assert holding.wait(10)
        proc.join(5)
        pttl = client.pttl(LockKeys.for_name(lock_name).lock)
        assert pttl > 0
        lease_ends = time.monotonic() + pttl / 1000
        with Lock(lock_name, wait=5.0):
            lates.append(time.monotonic() - lease_ends)
    # Redis's own blocking timeouts tick every 100 ms (median ~50 ms late); ours are timed here.
    assert statistics.median(lates) < 0.020 + statistics.median(woken), (lates, woken)
    assert max(lates) < 0.060 + max(woken), (lates, woken)


# --- 12. no oversleeping after a shorter lease follows a longer one -------------------------
@pytest.mark.alone  # wake-ups timed to a few ms
def test_a_waiter_does_not_oversleep_when_a_short_lease_holder_dies(name, idle_redis):
    holder = Lock(name, ttl=4.0)
    holder.acquire()
    short, short_queue = _start(_wait_then_report, name, 20.0, 0.5, True)
    wait_until_queued(name, 1)
    last, last_queue = _start(_wait_then_report, name, 20.0, 10.0, False)
    wait_until_queued(name, 2)  # it sleeps towards the end of the 4 s lease
    released_at = time.monotonic()
    holder.release()  # -> the 0.5 s holder, which dies holding
    status, _, _ = short_queue.get(timeout=10)
    assert status == "ok"
    short.join(5)
    status, _, acquired_at = last_queue.get(timeout=10)
    last.join(5)
    assert status == "ok"
    assert acquired_at - released_at < 1.0  # ~0.5 s, not the 4 s it was first told


# --- 4. clients and arguments ---------------------------------------------------------------
def test_a_client_with_decode_responses_works_everywhere(name, idle_redis):
    client = redis.Redis(port=idle_redis.port, decode_responses=True)
    lock = Lock(name, ttl=5.0, client=client)
    with lock as held:
        assert held.fence > 0
        info = inspect.lock_info(name, client=client)
        assert info is not None and info.fence == held.fence
        assert [h.name for h in inspect.held_locks(client=client)] == [name]
        held.check()
        assert held.extend(1.0) > 0
    # A hand-off through the signal list, with the same kind of client.
    lock.acquire()
    proc, queue = _start(_wait_with_decoding_client, name, idle_redis.port)
    wait_until_queued_on(client, name)
    lock.release()
    assert queue.get(timeout=10)[0] == "ok"
    proc.join(5)
    inspect.lock_stats(client=client)
    inspect.recent_events(client=client)
    lock.acquire()
    assert inspect.force_release(name, client=client) is not None


def _wait_with_decoding_client(name, port, queue):
    lock = Lock(name, ttl=5.0, wait=10.0, client=redis.Redis(port=port, decode_responses=True))
    with lock as held:
        queue.put(("ok", held.fence))


def wait_until_queued_on(client, name):
    for _ in range(1000):
        if client.llen(LockKeys.for_name(name).queue):
            return
        time.sleep(0.005)
    raise AssertionError("nobody queued")


@pytest.mark.parametrize("value", [-1, -0.001, math.nan, math.inf, -math.inf, "1", True])
@pytest.mark.parametrize("argument", ["ttl", "wait", "max_hold"])
def test_bad_seconds_are_refused(name, argument, value):
    with pytest.raises(ValueError):
        Lock(name, **{argument: value})


@pytest.mark.parametrize("value", [-1, math.nan, math.inf])
def test_bad_wait_at_acquire_and_bad_extend_are_refused(name, value):
    lock = Lock(name, ttl=5.0)
    with pytest.raises(ValueError):
        lock.acquire(wait=value)
    with lock as held, pytest.raises(ValueError):
        held.extend(value)


# --- 13. blocking=False with a wait ---------------------------------------------------------
def test_a_non_blocking_acquire_with_a_wait_is_refused(name):
    with pytest.raises(ValueError, match="blocking"):
        Lock(name).acquire(blocking=False, wait=1)
    with pytest.raises(ValueError, match="blocking"):
        asyncio.run(Lock(name).aacquire(blocking=False, wait=1))


# --- 5. a force release is noticed by the holder --------------------------------------------
def test_check_raises_lock_lost_after_a_force_release(name, idle_redis):
    lock = Lock(name, ttl=30.0)
    with pytest.raises(LockLost), lock as held:
        held.check()
        inspect.force_release(name, actor="test")
        held.check()


# --- 11. a cancelled async acquire leaves nothing behind ------------------------------------
@pytest.mark.parametrize("renew", [False, True])
def test_cancelling_a_waiting_aacquire_leaves_the_queue_and_never_holds(name, idle_redis, renew):
    client = idle_redis.client()
    keys = LockKeys.for_name(name)
    holder = Lock(name, ttl=30.0)
    holder.acquire()

    async def scenario():
        task = asyncio.create_task(Lock(name, ttl=5.0, renew=renew).aacquire(wait=20.0))
        for _ in range(400):
            await asyncio.sleep(0.005)
            if client.llen(keys.queue):
                break
        assert client.llen(keys.queue) == 1
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The waiting thread left the queue at once, not at its 20 s deadline.
        for _ in range(200):
            if not client.llen(keys.queue):
                break
            await asyncio.sleep(0.005)
        return time.monotonic() - cancelled_at

    left_after = asyncio.run(scenario())
    assert client.llen(keys.queue) == 0 and left_after < 0.5
    holder.release()
    # Nobody was handed the lock: it is free, and nobody renews a hold nobody owns.
    assert not client.exists(keys.lock)
    time.sleep(0.3)
    assert Lock(name).acquire(blocking=False)


def test_wait_for_around_aacquire_times_out_cleanly(name, idle_redis):
    client = idle_redis.client()
    keys = LockKeys.for_name(name)
    holder = Lock(name, ttl=30.0)
    holder.acquire()

    async def scenario():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(Lock(name).aacquire(wait=20.0), 0.2)

    asyncio.run(scenario())
    time.sleep(0.1)
    assert client.llen(keys.queue) == 0
    holder.release()
    assert not client.exists(keys.lock)


@pytest.mark.alone  # wake-ups timed to a few ms
def test_the_safe_way_is_a_wait_argument(name, idle_redis):
    holder = Lock(name, ttl=30.0)
    holder.acquire()

    async def scenario():
        lock = Lock(name)
        started = time.monotonic()
        assert not await lock.aacquire(wait=0.2)
        return time.monotonic() - started

    assert 0.2 <= asyncio.run(scenario()) < 0.4
    holder.release()


def test_asyncio_timeout_acquires_in_the_callers_own_task(name, idle_redis):
    """The other safe way: `asyncio.timeout` runs in our task, so we own (and release) the hold."""

    async def scenario():
        lock = Lock(name, ttl=5.0)
        async with asyncio.timeout(1.0):
            assert await lock.aacquire()
        await lock.arelease()  # LockNotOwned if a child task had taken it

    asyncio.run(scenario())
    assert not idle_redis.client().exists(LockKeys.for_name(name).lock)


# --- 6. a frozen Redis leaves no phantom waiters ---------------------------------------------
def test_an_acquire_that_timed_out_in_a_freeze_does_not_queue_when_redis_wakes(name, idle_redis):
    """A command the client gave up on (socket timeout) still sits in Redis's socket buffer and
    runs when a frozen Redis wakes. An acquire that then queued a waiter nobody is behind cost
    every live buyer a hand-off lease (0.5 s) per phantom: seconds of stall after a freeze."""
    from locks import LockUnavailable
    from locks.keys import LockKeys

    client = redis.Redis.from_url(idle_redis.url)
    with Lock(name, ttl=30.0):  # held, so the next acquire would queue
        Lock(f"{name}-warm", wait=0).acquire()  # a first exchange with Redis (as any running worker had)
        idle_redis.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(LockUnavailable):
                Lock(name, wait=2.0).acquire()
            time.sleep(0.3)  # the freeze outlasts the client's socket timeout
        finally:
            idle_redis.proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)  # Redis runs what was buffered
        keys = LockKeys.for_name(name)
        assert client.llen(keys.queue) == 0, "a phantom waiter was queued"
        assert not [k for k in client.hkeys(keys.waiters) if k != b"~"]
