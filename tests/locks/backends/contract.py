"""The contract every lock backend keeps, run against each one on real servers.

A backend's test module does `from tests.locks.backends.contract import *` and defines the
fixture `backend`: the LOCKS settings switched to that backend, its servers running (private
ports, stopped by pid). pytest then collects these tests once per backend module.

What is checked is what the shop relies on: exclusion between OS processes, fences that
strictly increase (on the microseconds-since-epoch scale shared by every backend), a waiter
woken by a release without polling out its wait, a crashed holder's lock passing on after its
lease, a stale holder unable to release or extend a newer holder's lock, inspection and force
release for the dashboard, asyncio cancellation that leaves nothing behind, and the checkout
never overselling with the backend under it.

At module level it imports `locks` and nothing else of this repository (the shop and the test
helpers only inside the tests that need them), so tests/locks/test_wheel.py runs it, as it is,
against the locks app installed from its wheel in a project without the shop.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import time

import pytest

from locks import HolderChanged, Lock, LockLost, LockNotOwned, combining, inspect, release_all, stats, try_acquire_all
from locks.backends import get_backend

FORK = multiprocessing.get_context("fork")

__all__ = [
    "test_contract_a_blocked_acquire_times_out",
    "test_contract_a_combiner_takes_the_locks_its_batch_needs_with_the_batch",
    "test_contract_a_sigkilled_holder_passes_the_lock_on_after_its_lease",
    "test_contract_a_stale_holder_cannot_release_or_extend_the_new_holders_lock",
    "test_contract_a_waiter_is_woken_by_the_release",
    "test_contract_acquire_release_and_a_second_holder_is_refused",
    "test_contract_asyncio_cancellation_leaves_nothing_behind",
    "test_contract_describe_held_and_force_release",
    "test_contract_extend_and_check",
    "test_contract_fences_strictly_increase_on_the_shared_scale",
    "test_contract_processes_exclude_each_other_and_fences_follow_the_order",
    "test_contract_reentrant_holds_nest",
    "test_contract_the_batchs_locks_are_renewed_lost_and_released_like_any_hold",
    "test_contract_the_checkout_never_oversells_on_this_backend",
    "test_contract_the_dashboard_and_the_locks_command_show_the_holder",
    "test_contract_try_acquire_all_takes_the_free_locks_and_release_all_lets_them_go",
]

# How long a SIGKILLed holder may keep a lock on any backend: its lease (ttl below) or, on
# ZooKeeper, the session timeout the backend fixture sets; plus slack for a loaded machine.
CRASH_LEASE = 1.0
CRASH_SLACK = 10.0


def _now_us() -> int:
    return int(time.time() * 1e6)


def test_contract_acquire_release_and_a_second_holder_is_refused(backend, name):
    lock = Lock(name, ttl=5.0)
    with lock as held:
        assert held.fence > 0
        assert lock.locked()
        assert Lock(name, ttl=5.0).acquire(blocking=False) is False
    assert not lock.locked()
    other = Lock(name, ttl=5.0)
    assert other.acquire(blocking=False)
    other.release()


def test_contract_fences_strictly_increase_on_the_shared_scale(backend, name):
    before = _now_us()
    fences = []
    for _ in range(5):
        with Lock(name, ttl=5.0) as held:
            fences.append(held.fence)
    assert fences == sorted(set(fences)), fences
    # One scale for every backend (microseconds since the epoch, or above): a switch of backend
    # never leaves the database's fence columns ahead of the new backend's fences.
    assert fences[0] >= before - 60_000_000, (fences[0], before)


def _take_turns(name: str, rounds: int, start, queue) -> None:
    start.wait(30)
    spans = []
    for _ in range(rounds):
        with Lock(name, ttl=10.0, wait=30.0) as held:
            entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
            time.sleep(0.002)
            spans.append((entered, time.monotonic(), held.fence))
    queue.put(spans)


def test_contract_processes_exclude_each_other_and_fences_follow_the_order(backend, name):
    start, queue = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_take_turns, args=(name, 15, start, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    spans = sorted(span for _ in procs for span in queue.get(timeout=120))
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert len(spans) == 60
    for (_, left_end, left_fence), (right_start, _, right_fence) in itertools.pairwise(spans):
        assert right_start >= left_end, "two processes held the lock at once"
        assert right_fence > left_fence, "a later holder got a smaller fence"


def _hold_for(name: str, seconds: float, ready) -> None:
    with Lock(name, ttl=30.0):
        ready.set()
        time.sleep(seconds)


def test_contract_a_waiter_is_woken_by_the_release(backend, name):
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_for, args=(name, 0.3, ready))
    proc.start()
    try:
        assert ready.wait(30)
        started = time.monotonic()
        with Lock(name, ttl=5.0, wait=20.0) as held:
            waited = time.monotonic() - started
            assert held.waited > 0
        # Woken by the release (after ~0.3 s), not by its own 20 s deadline or the holder's 30 s lease.
        assert waited < 5.0, waited
    finally:
        proc.join(10)


def _hold_until(name: str, ready, done) -> None:
    with Lock(name, ttl=30.0):
        ready.set()
        done.wait(30)


def _wait_for(name: str, queue) -> None:
    with Lock(name, ttl=5.0, wait=20.0) as held:
        queue.put(held.fence)


def test_contract_try_acquire_all_takes_the_free_locks_and_release_all_lets_them_go(backend, name):
    """What a checkout lane does: take what is free at once (a busy lock is skipped, never
    waited for), write, and let everything go together."""
    names = [f"{name}-{c}" for c in "abc"]
    ready, done = FORK.Event(), FORK.Event()
    busy = FORK.Process(target=_hold_until, args=(names[1], ready, done))  # busy until we are done
    busy.start()
    try:
        assert ready.wait(30)
        started = time.monotonic()
        holds = try_acquire_all([Lock(n, ttl=5.0) for n in names])
        assert time.monotonic() - started < 1.0  # the busy one was not waited for
        assert sorted(holds) == [names[0], names[2]]
        for n in (names[0], names[2]):
            assert inspect.lock_info(n).fence == holds[n].fence
    finally:
        done.set()
        busy.join(10)
    queue = FORK.Queue()
    waiter = FORK.Process(target=_wait_for, args=(names[0], queue))
    waiter.start()
    time.sleep(0.3)  # queued behind our hold
    inspect.force_release(names[2])  # a hold that ended under us: reported, not raised
    lost = release_all(list(holds.values()))
    assert [h.name for h in lost] == [names[2]]
    assert queue.get(timeout=10) > holds[names[0]].fence  # the waiter was handed the lock
    waiter.join(10)
    assert all(inspect.lock_info(n) is None for n in names)


def test_contract_a_blocked_acquire_times_out(backend, name):
    holder = Lock(name, ttl=10.0)
    holder.acquire()
    try:
        started = time.monotonic()
        assert Lock(name, ttl=5.0, wait=0.3).acquire() is False
        elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 5.0, elapsed
        assert Lock(name, ttl=5.0).acquire(blocking=False) is False
    finally:
        holder.release()
    # Nothing of the timed-out waiter is left behind: the lock is free at once.
    lock = Lock(name, ttl=5.0)
    assert lock.acquire(blocking=False)
    lock.release()


def _hold_and_report(name: str, ttl: float, ready, queue) -> None:
    lock = Lock(name, ttl=ttl)
    lock.acquire()
    queue.put(lock.held.fence)
    ready.set()
    time.sleep(600)


def test_contract_a_sigkilled_holder_passes_the_lock_on_after_its_lease(backend, name):
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold_and_report, args=(name, CRASH_LEASE, ready, queue))
    proc.start()
    assert ready.wait(30)
    dead_fence = queue.get(timeout=5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    killed = time.monotonic()
    with Lock(name, ttl=5.0, wait=CRASH_LEASE + CRASH_SLACK) as held:
        assert held.fence > dead_fence
    assert time.monotonic() - killed < CRASH_LEASE + CRASH_SLACK


def test_contract_a_stale_holder_cannot_release_or_extend_the_new_holders_lock(backend, name):
    stale = Lock(name, ttl=5.0)
    stale.acquire()
    old = stale.held
    # The operator (or the lease) ends the stale hold; a new holder takes the lock.
    inspect.force_release(name)
    new = Lock(name, ttl=5.0)
    assert new.acquire(wait=5.0)
    assert new.held.fence > old.fence
    with pytest.raises(LockLost):
        old.check()
    with pytest.raises(LockNotOwned):
        old.extend(5.0)
    with pytest.raises(LockNotOwned):
        stale.release()
    assert new.locked()
    assert new.held.remaining() > 0
    new.release()


def test_contract_extend_and_check(backend, name):
    with Lock(name, ttl=2.0) as held:
        left = held.extend(10.0, replace=True)
        assert 8.0 < left <= 10.0
        held.check()
        assert held.remaining() > 8.0


def test_contract_reentrant_holds_nest(backend, name):
    lock = Lock(name, ttl=5.0, reentrant=True)
    with lock as outer, lock as inner:
        assert outer is inner
        assert inner.count == 2
    assert not lock.locked()


def test_contract_describe_held_and_force_release(backend, name):
    lock = Lock(name, ttl=10.0)
    lock.acquire()
    fence = lock.held.fence
    info = inspect.lock_info(name)
    assert info is not None
    assert info.fence == fence
    assert info.owner.endswith(f":{os.getpid()}")
    assert 0 < info.ttl_left <= 10.0
    assert name in [h.name for h in inspect.held_locks(prefix=name)]
    with pytest.raises(HolderChanged):
        inspect.force_release(name, expected_fence=fence - 1)
    assert lock.locked()
    released = inspect.force_release(name, expected_fence=fence)
    assert released is not None and released.fence == fence
    assert not lock.locked()
    assert inspect.lock_info(name) is None
    assert inspect.force_release(name) is None
    with Lock(name, ttl=5.0) as again:
        assert again.fence > fence


@pytest.mark.django_db
def test_contract_the_dashboard_and_the_locks_command_show_the_holder(backend, name, admin_client):
    from io import StringIO

    from django.core.management import call_command

    with Lock(name, ttl=10.0) as held:
        out = StringIO()
        call_command("locks", "--all", "--prefix", name, stdout=out)
        text = out.getvalue()
        assert text.splitlines()[0].startswith(f"Lock backend: {backend.name}")
        # The held section only: once the stats flush (in the background, within a second) has
        # run, the stats section has a row for the name's family, which may be the name itself.
        held_section = text.split("Held locks", 1)[1].split("\n\n", 1)[0]
        [line] = [line for line in held_section.splitlines() if line.startswith(name)]
        assert str(held.fence) in line
        stats.flush()  # the dashboard lists holds from the index the stats flush publishes (<= 1 s)
        page = admin_client.get("/admin/locks/lockdashboard/", {"prefix": name})
        assert page.status_code == 200
        body = page.content.decode()
        assert name in body and str(held.fence) in body
        assert f"Lock backend: <strong>{backend.name}" in body


def test_contract_asyncio_cancellation_leaves_nothing_behind(backend, name):
    async def scenario() -> int:
        holder = Lock(name, ttl=10.0)
        await holder.aacquire()
        waiter = asyncio.create_task(Lock(name, ttl=5.0, wait=30.0).aacquire())
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder.arelease()
        # The cancelled waiter leaves (its thread may still be on its way out, and give back a
        # hand-off that raced in): the lock is free for anyone soon, not after a lease of its own.
        started = time.monotonic()
        async with Lock(name, ttl=5.0, wait=5.0) as again:
            assert time.monotonic() - started < 2.0
            return again.fence

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) > 0


def _buy(user_id: int, product_id: int) -> list[int]:
    from django.contrib.auth import get_user_model

    from shop import errors
    from shop.services import place_order

    user = get_user_model().objects.get(pk=user_id)
    placed, refused = [], 0
    for _ in range(200):
        try:
            placed.append(place_order(user=user, lines=[(product_id, 1)]).order_id)
        except errors.OutOfStock:
            refused += 1
            if refused >= 2:
                break
        except (errors.LockTimeout, errors.Conflict):
            continue
    return placed


@pytest.mark.django_db(transaction=True)
def test_contract_the_checkout_never_oversells_on_this_backend(backend, settings):
    from decimal import Decimal

    from shop.models import Product
    from shop.ops.invariants import check_invariants
    from tests.helpers import make_users, run_processes

    combining = get_backend().supports_combining
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": combining}
    product = Product.objects.create(sku=f"BK-{os.getpid()}-{time.monotonic_ns()}", name="Backend test",
                                     price=Decimal("5.00"), stock=40)
    users = make_users(6, prefix=f"bk{time.monotonic_ns()}")
    results = run_processes(_buy, [(u.pk, product.pk) for u in users])
    seen = [pk for placed in results for pk in placed]
    assert len(seen) == 40
    product.refresh_from_db()
    assert product.stock == 0
    assert check_invariants(product_ids=[product.pk], initial_stock={product.pk: 40}, seen_order_ids=seen) == []


# --- combining with the other locks a batch needs (a checkout lane: submit(needs=), take(lock_of=)) ---
def _submit_needing(lane: str, payload: str, needs: list[str], queue) -> None:
    got = combining.submit(Lock(lane, ttl=10.0), payload, wait=20.0, needs=needs)
    queue.put(got.reply if isinstance(got, combining.Served) else "turn")
    if not isinstance(got, combining.Served):
        got.finish()


def _queued_requests(lane: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while (info := inspect.lock_info(lane)) is None or info.queued_requests < n:
        assert time.monotonic() < deadline, "the requests did not queue"
        time.sleep(0.02)


def _short_lock(name: str) -> Lock:
    return Lock(name, ttl=5.0)


def test_contract_a_combiner_takes_the_locks_its_batch_needs_with_the_batch(backend, name):
    """Each needed lock is taken as a non-blocking acquire would take it: a fence of its own
    above the last one, only if free (a held one is skipped, not waited for) and only if nobody
    queued for it (a lock whose holder lapsed with a waiter queued goes to that waiter)."""
    lane, mine, free, busy, lapsed = (f"{name}-{c}" for c in ("lane", "mine", "free", "busy", "lapsed"))
    if not get_backend().supports_combining:
        with pytest.raises(NotImplementedError):
            Lock(lane).submit("x", wait=1.0, needs=[mine])
        return
    with Lock(free, ttl=5.0) as before:  # a fence to be above
        last_fence = before.fence
    ready, done, queue, handed = FORK.Event(), FORK.Event(), FORK.Queue(), FORK.Queue()
    holder = FORK.Process(target=_hold_until, args=(busy, ready, done))
    holder.start()
    assert ready.wait(30)
    lapsing = Lock(lapsed, ttl=0.4)
    assert lapsing.acquire(blocking=False)  # never released: its lease lapses with a waiter queued
    waiter = FORK.Process(target=_wait_for, args=(lapsed, handed))
    waiter.start()
    turn = combining.submit(Lock(lane, ttl=10.0), "mine", wait=5.0, needs=[mine])
    assert isinstance(turn, combining.Turn)
    senders = [FORK.Process(target=_submit_needing, args=(lane, f"r{i}", [n], queue))
               for i, n in enumerate((free, busy, lapsed))]
    try:
        for p in senders:
            p.start()
        _queued_requests(lane, 3)
        while inspect.lock_info(lapsed) is None or inspect.lock_info(lapsed).waiters < 1:
            time.sleep(0.02)
        os.kill(waiter.pid, signal.SIGSTOP)  # queued, and its own timer cannot take the lock at the lease's end
        time.sleep(0.6)  # the lapsed lock's lease is over; its waiter is still queued
        batch = turn.take(10, lock_of=_short_lock)
        os.kill(waiter.pid, signal.SIGCONT)
        assert sorted(r.payload for r in batch) == ["r0", "r1", "r2"]
        assert {r.payload: r.needs for r in batch} == {"r0": (free,), "r1": (busy,), "r2": (lapsed,)}
        assert sorted(turn.also) == sorted([mine, free]), (sorted(turn.also), mine, free)
        assert turn.also[free].fence > last_fence
        for n in (mine, free):
            assert inspect.lock_info(n).fence == turn.also[n].fence
            assert Lock(n, ttl=5.0).acquire(blocking=False) is False  # ours: excluded
        assert handed.get(timeout=10) > 0  # the lapsed lock went to its queued waiter, not to us
        lost = turn.reply({r.token: f"done:{r.payload}" for r in batch})
        assert lost == []
        assert turn.also == {}
        assert inspect.lock_info(mine) is None and inspect.lock_info(free) is None  # released with the reply
        assert sorted(queue.get(timeout=10) for _ in senders) == ["done:r0", "done:r1", "done:r2"]
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
        done.set()
        for p in (*senders, holder, waiter):
            p.join(10)
        turn.finish()


def test_contract_the_batchs_locks_are_renewed_lost_and_released_like_any_hold(backend, name):
    lane, kept, cut = f"{name}-lane", f"{name}-kept", f"{name}-cut"
    if not get_backend().supports_combining:
        assert Lock(lane).supports_combining is False
        return
    turn = combining.submit(Lock(lane, ttl=10.0), "mine", wait=5.0, needs=[kept, cut])
    assert isinstance(turn, combining.Turn)
    try:
        assert turn.take(10, lock_of=lambda n: Lock(n, ttl=0.6, renew=True, max_hold=30.0)) == []
        assert sorted(turn.also) == [cut, kept]
        time.sleep(1.5)  # well past the 0.6 s lease: renewed meanwhile
        turn.also[kept].check()
        force_released = inspect.force_release(cut)  # lost under us: reported, not raised
        assert force_released is not None
        lost = turn.reply({})
        assert [h.name for h in lost] == [cut]
        assert inspect.lock_info(kept) is None
    finally:
        turn.finish()
    # A turn ended without a reply still lets them go.
    turn = combining.submit(Lock(lane, ttl=10.0), "again", wait=5.0, needs=[kept])
    turn.take(10, lock_of=_short_lock)
    assert kept in turn.also
    assert turn.finish()
    assert inspect.lock_info(kept) is None
