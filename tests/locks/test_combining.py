"""Combining (locks/combining.py): the holder serves the requests queued behind it.

Real Redis, real processes: each requester is a forked child that submits and reports what it
got back (its reply, or that it got the lock itself, or a timeout).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django_redis import get_redis_connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from locks import Lock, LockTimeout
from locks.combining import Guarded, Served, Turn, submit
from locks.conf import locks_settings
from locks.keys import LockKeys
from tests.locks.conftest import FORK, wait_until_queued


def _submit_in_child(name: str, payload: str, wait: float, queue) -> None:
    lock = Lock(name, ttl=1.0, wait=wait, renew=True)
    started = time.monotonic()
    try:
        got = submit(lock, payload)
    except LockTimeout:
        queue.put((payload, "timeout", None, time.monotonic() - started))
        return
    if isinstance(got, Served):
        queue.put((payload, "served", got.reply, time.monotonic() - started))
        return
    with got as turn:  # our own turn: serve whatever queued behind us, echoing
        batch = turn.take(limit=10)
        turn.reply({r.token: f"echo:{r.payload}" for r in batch})
    queue.put((payload, "turn", [r.payload for r in batch], time.monotonic() - started))


def start_submitter(name: str, payload: str, *, wait: float = 10.0, queued_before: int | None = 0):
    """A child that submits `payload`; returned once it is queued (unless `queued_before` is None:
    a holder that takes requests as they come may dequeue it before we could see it)."""
    queue = FORK.Queue()
    proc = FORK.Process(target=_submit_in_child, args=(name, payload, wait, queue))
    proc.start()
    if queued_before is not None:
        wait_until_queued(name, queued_before + 1)
    return proc, queue


def _client():
    return get_redis_connection(locks_settings.CACHE_ALIAS)


def test_the_holder_takes_the_queued_requests_in_order_and_answers_each(name):
    turn = submit(Lock(name, ttl=5.0), "mine")
    assert isinstance(turn, Turn)
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(3)]
    with turn:
        batch = turn.take(limit=10)
        assert [r.payload for r in batch] == ["r0", "r1", "r2"]
        assert all(r.deadline > time.monotonic() for r in batch)
        turn.reply({r.token: f"done:{r.payload}" for r in batch})
    got = [q.get(timeout=10) for _, q in waiters]
    assert [(p, kind, reply) for p, kind, reply, _ in got] == [
        ("r0", "served", "done:r0"), ("r1", "served", "done:r1"), ("r2", "served", "done:r2")
    ]
    for proc, _ in waiters:
        proc.join(5)
    keys = LockKeys.for_name(name)
    assert _client().exists(keys.lock, keys.queue, keys.waiters) == 0  # nothing left behind


def test_take_respects_its_limit_and_the_rest_get_the_next_turn(name):
    turn = submit(Lock(name, ttl=5.0), "mine")
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(3)]
    with turn:
        batch = turn.take(limit=2)
        turn.reply({r.token: "ok" for r in batch})
    got = sorted(q.get(timeout=10)[:3] for _, q in waiters)
    # r2 was not taken: the release handed it the lock, and it served itself (nobody behind it).
    assert got == [("r0", "served", "ok"), ("r1", "served", "ok"), ("r2", "turn", [])]


def test_a_plain_waiter_stops_the_batch_and_keeps_its_place(name):
    turn = submit(Lock(name, ttl=5.0), "mine")
    first, q_first = start_submitter(name, "before")
    plain_q = FORK.Queue()

    def plain(queue):
        with Lock(name, wait=10.0):
            queue.put("plain got it")

    plain_proc = FORK.Process(target=plain, args=(plain_q,))
    plain_proc.start()
    wait_until_queued(name, 2)
    after, q_after = start_submitter(name, "after", queued_before=2)
    with turn:
        batch = turn.take(limit=10)
        assert [r.payload for r in batch] == ["before"]  # stops at the plain waiter: FIFO
        turn.reply({batch[0].token: "ok"})
    assert q_first.get(timeout=10)[:3] == ("before", "served", "ok")
    assert plain_q.get(timeout=10) == "plain got it"
    assert q_after.get(timeout=10)[:3] == ("after", "turn", [])
    for p in (first, plain_proc, after):
        p.join(5)


def _hold_take_then_stop(name: str, ready, queue) -> None:
    """Take the batch and then freeze (the test kills or pauses us): no reply is ever sent."""
    lock = Lock(name, ttl=0.5, wait=10.0, renew=True)
    turn = submit(lock, "holder")
    assert isinstance(turn, Turn)
    ready.set()
    while not turn.take(limit=10):
        time.sleep(0.01)
    queue.put("taken")
    time.sleep(60)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_a_request_whose_combiner_dies_or_stalls_is_served_by_the_next(name, fault):
    ready, holder_q = FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_hold_take_then_stop, args=(name, ready, holder_q))
    holder.start()
    assert ready.wait(10)
    proc, q = start_submitter(name, "r0", queued_before=None)
    assert holder_q.get(timeout=10) == "taken"
    os.kill(holder.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    try:
        payload, kind, _, waited = q.get(timeout=10)
    finally:
        if fault == "pause":
            os.kill(holder.pid, signal.SIGKILL)
        holder.join(5)
    # The holder's lease (0.5 s, no longer renewed) ran out with r0 in its batch and no reply:
    # r0 queued again and, first in line, got the lock to serve itself.
    assert (payload, kind) == ("r0", "turn")
    assert waited < 0.5 + 1.0
    proc.join(5)


def _take_renew_and_reply_late(name: str, ready, queue) -> None:
    lock = Lock(name, ttl=0.3, wait=10.0, renew=True)
    with submit(lock, "holder") as turn:
        ready.set()
        while not (batch := turn.take(limit=10)):
            time.sleep(0.01)
        time.sleep(1.2)  # four leases: the watchdog renews; the waiter looks again meanwhile
        turn.reply({r.token: "late but alive" for r in batch})
    queue.put("done")


@pytest.mark.alone  # a 0.3 s lease kept by its watchdog
def test_a_taken_request_waits_for_a_live_combiner_past_its_lease_without_queueing_again(name):
    ready, holder_q = FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_take_renew_and_reply_late, args=(name, ready, holder_q))
    holder.start()
    assert ready.wait(10)
    proc, q = start_submitter(name, "r0", queued_before=None)
    assert q.get(timeout=10)[:3] == ("r0", "served", "late but alive")
    assert holder_q.get(timeout=10) == "done"
    holder.join(5)
    proc.join(5)
    keys = LockKeys.for_name(name)
    assert _client().exists(keys.lock, keys.queue, keys.waiters) == 0  # it never queued twice


def test_a_taken_request_times_out_if_no_reply_comes_within_its_wait(name):
    turn = submit(Lock(name, ttl=10.0), "mine")
    proc, q = start_submitter(name, "r0", wait=0.5)
    with turn:
        assert [r.payload for r in turn.take(limit=10)] == ["r0"]
        payload, kind, _, waited = q.get(timeout=10)
    assert (payload, kind) == ("r0", "timeout")
    assert 0.5 <= waited < 1.5
    proc.join(5)


def test_a_payload_is_required():
    with pytest.raises(ValueError, match="payload"):
        submit(Lock("t:xpayload"), "")


@pytest.mark.django_db(transaction=True)
def test_combining_is_a_capability_only_a_combining_backend_has(name, settings):
    assert Lock(name).supports_combining  # the Redis backend
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "mysql"}
    lock = Lock(name, wait=1.0)
    assert not lock.supports_combining
    with pytest.raises(NotImplementedError, match="does not combine requests"):
        submit(lock, "request")
    assert lock.held is None and not lock.locked()  # nothing was queued or taken


def test_a_guard_key_that_exists_stops_the_request_before_it_queues(name):
    client = _client()
    marker, other = f"{name}:marker", f"{name}:absent"
    client.set(marker, "sold-out", ex=60)
    holder = Lock(name, ttl=5.0)
    holder.acquire()  # held: without its guard the request would queue behind this hold
    got = submit(Lock(name, wait=5.0), "request", guards=[other, marker])
    assert got == Guarded(values=(None, "sold-out"))
    keys = LockKeys.for_name(name)
    assert client.exists(keys.queue, keys.waiters) == 0  # never queued
    holder.release()
    assert not Lock(name).locked()


def test_guards_that_do_not_exist_let_the_request_queue_and_are_not_read_again(name):
    client = _client()
    marker = f"{name}:marker"
    turn = submit(Lock(name, ttl=5.0), "mine", guards=[marker])
    assert isinstance(turn, Turn)  # free and unguarded: the lock is ours
    waiter, queue = start_submitter_guarded(name, "r0", guards=[marker])
    client.set(marker, "sold-out", ex=60)  # set after it queued: the queued request is not stopped
    with turn:
        (request,) = turn.take(limit=10)
        turn.reply({request.token: "done"})
    assert queue.get(timeout=10)[:3] == ("r0", "served", "done")
    waiter.join(5)


def _submit_guarded_in_child(name: str, payload: str, guards: list[str], queue) -> None:
    got = submit(Lock(name, ttl=1.0, wait=10.0), payload, guards=guards)
    queue.put((payload, "served", got.reply) if isinstance(got, Served) else (payload, type(got).__name__, None))


def start_submitter_guarded(name: str, payload: str, *, guards: list[str]):
    queue = FORK.Queue()
    proc = FORK.Process(target=_submit_guarded_in_child, args=(name, payload, guards, queue))
    proc.start()
    wait_until_queued(name, 1)
    return proc, queue


def test_guards_are_refused_where_one_script_cannot_read_them(name, settings):
    lock = Lock(name, wait=1.0)
    assert lock.supports_guards  # one Redis server
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "mysql"}
    assert not Lock(name).supports_guards


def _combine_then_die(name: str, queue) -> None:
    """Queue for the lock with a short lease; when handed it, take the batch and die at once
    (no reply, no release, no confirmation of the hand-off lease)."""
    turn = submit(Lock(name, ttl=0.5, wait=10.0), "combiner")
    assert isinstance(turn, Turn)
    turn.take(limit=10)
    os.kill(os.getpid(), signal.SIGKILL)


def test_requests_told_of_a_long_lease_are_not_stranded_when_a_short_lease_combiner_dies(name):
    # The requests queue while a long lease (30 s) holds the lock, so each one's own timer says
    # "look again in 30 s". The lock then passes to a combiner with a short lease that takes
    # them all and dies: nothing will ever reply or hand over to them, and their timers are far
    # off. They must learn at once that their batch is orphaned, queue again and be served.
    gate = Lock(name, ttl=30.0)
    gate.acquire()
    combiner = FORK.Process(target=_combine_then_die, args=(name, FORK.Queue()))
    combiner.start()
    wait_until_queued(name, 1)
    submitters = [start_submitter(name, f"r{i}", wait=10.0, queued_before=i + 1) for i in range(3)]
    released = time.monotonic()
    gate.release()
    combiner.join(5)
    assert combiner.exitcode == -signal.SIGKILL
    got = sorted(q.get(timeout=15) for _, q in submitters)
    # Each was answered soon after the dead combiner's lease (0.5 s): one got the lock and served
    # whoever had queued again by its take; a slower one queued after it and had its own turn.
    kinds = [kind for _, kind, _, _ in got]
    assert "timeout" not in kinds and "turn" in kinds, kinds
    assert time.monotonic() - released < 0.5 + 1.0
    for proc, _ in submitters:
        proc.join(5)


@pytest.mark.parametrize("call", ["take", "reply"])
def test_a_turn_whose_redis_is_gone_raises_lock_unavailable(name, redis_server, call):
    # Seen in the restart-redis fault run: a combiner's take() during the outage raised redis-py's
    # ConnectionError, which reached the buyer as an unexpected error instead of a retryable 503.
    from locks import LockUnavailable

    client = redis_server.client()
    # As the shop's pool of a single server has it (locks/redis_urls.py): short timeouts, no retry
    # (redis.Redis's own default retries a refused connection 10 times with backoff: ~4 s here).
    client.connection_pool.connection_kwargs.update(socket_timeout=0.5, socket_connect_timeout=0.5,
                                                    retry=Retry(NoBackoff(), 0))
    turn = submit(Lock(name, ttl=5.0, client=client), "mine")
    assert isinstance(turn, Turn)
    redis_server.stop()
    with pytest.raises(LockUnavailable):
        turn.take(limit=10) if call == "take" else turn.reply({"t0": "x"})


def _batches(name: str) -> tuple[int, int]:
    """(batches, batched requests) counted for `name`'s family, flushed."""
    from locks import stats
    from locks.keys import stats_key

    stats.flush()
    raw = _client().hgetall(stats_key(name))
    fields = {k.decode(): int(v) for k, v in raw.items()}
    return fields.get("batches", 0), fields.get("batched_requests", 0)


def test_finish_ends_a_turn_once_and_counts_its_batch_once(name):
    """The checkout's end of a turn: one release, one batch; finishing again is no error and
    changes nothing."""
    turn = submit(Lock(name, ttl=5.0), "mine")
    assert isinstance(turn, Turn)
    proc, queue = start_submitter(name, "r0")
    batch = turn.take(limit=10)
    turn.reply({r.token: "ok" for r in batch})
    assert turn.finish() is True
    assert turn.finish() is False  # already ended
    assert queue.get(timeout=10)[1:3] == ("served", "ok")
    proc.join(5)
    with Lock(name, ttl=1.0, wait=0.5):  # released: free at once
        pass
    assert _batches(name) == (1, 2)  # ours and the one it took


def test_finish_of_a_turn_whose_lease_ended_says_lost_and_still_counts_its_batch(name):
    turn = submit(Lock(name, ttl=0.2), "mine")
    assert isinstance(turn, Turn)
    time.sleep(0.4)  # the lease ends: the lock is no longer ours
    assert turn.finish() is False
    assert turn.hold.released
    assert _batches(name) == (1, 1)


def _take_when_told_then_reply_when_told(name: str, ready, take_now, go, queue) -> None:
    """A combiner that takes its batch when told, then (after the test paused it past its lease
    and let it go on) replies late, as a holder back from a GC pause does."""
    turn = submit(Lock(name, ttl=0.5, wait=10.0, renew=True), "holder")
    assert isinstance(turn, Turn)
    ready.set()
    assert take_now.wait(10)
    batch = turn.take(limit=10)
    queue.put([r.payload for r in batch])
    assert go.wait(30)
    turn.reply({r.token: "late" for r in batch})
    queue.put(("finished", turn.finish()))


def _hold_plainly_until_told(name: str, release, queue) -> None:
    with Lock(name, ttl=10.0, wait=10.0):
        queue.put("plain got it")
        assert release.wait(30)


def test_a_request_served_late_by_a_paused_combiner_leaves_no_place_in_the_queue(name):
    """The paused combiner's lease ran out with r0 in its batch, so r0 queued again behind the
    next holder; then the combiner woke and replied. r0 is served, and its second place must go
    with it: left in the queue, a release would hand the lock to a waiter who is gone, and every
    waiter behind it would wait out that hand-off lease (in a drop: seconds without a sale)."""
    ready, take_now, go, holder_q = FORK.Event(), FORK.Event(), FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_take_when_told_then_reply_when_told, args=(name, ready, take_now, go, holder_q))
    holder.start()
    assert ready.wait(10)
    proc, q = start_submitter(name, "r0", queued_before=0)
    release, plain_q = FORK.Event(), FORK.Queue()
    plain = FORK.Process(target=_hold_plainly_until_told, args=(name, release, plain_q))
    plain.start()
    wait_until_queued(name, 2)
    take_now.set()
    assert holder_q.get(timeout=10) == ["r0"]  # the plain waiter behind r0 stops the batch
    keys = LockKeys.for_name(name)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        assert plain_q.get(timeout=10) == "plain got it"  # the paused holder's lease ran out
        wait_until_queued(name, 1)  # r0, told its combiner is gone, queued again
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    go.set()
    assert q.get(timeout=10)[:3] == ("r0", "served", "late")
    assert holder_q.get(timeout=10) == ("finished", False)  # its lock was lost; its writes were fenced
    assert _client().llen(keys.queue) == 0
    release.set()
    plain.join(10)
    assert _client().exists(keys.lock) == 0  # released to nobody: free at once
    for p in (holder, proc):
        p.join(5)


def _submit_pausing_before_it_looks_again(name: str, go, looking, queue) -> None:
    """A waiter that stops itself (as a GC pause would) just before it looks at the lock again,
    after its own timer ran out."""
    from locks.backends.redis import RedisBackend

    assert go.wait(10)
    real = RedisBackend._run_acquire
    calls = []

    def run_acquire(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            looking.set()  # an Event: a queue's feeder thread would stop with us, unsent
            os.kill(os.getpid(), signal.SIGSTOP)
        return real(self, *args, **kwargs)

    RedisBackend._run_acquire = run_acquire
    got = submit(Lock(name, ttl=1.0, wait=10.0), "r0")
    queue.put(("served", got.reply) if isinstance(got, Served) else ("not served", type(got).__name__))


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_reply_that_reaches_a_waiter_as_it_looks_again_does_not_queue_it_again(name):
    """The reply reached the waiter's blocked read (Redis popped it from its list) while the waiter,
    its timer run out, was about to look at the lock again. Its request is answered, not queued:
    a second place would later be handed the lock with nobody to take it (seen in a drop: the
    lane's grants went unread, 0.5 s each)."""
    go, looking, q = FORK.Event(), FORK.Event(), FORK.Queue()
    waiter = FORK.Process(target=_submit_pausing_before_it_looks_again, args=(name, go, looking, q))
    waiter.start()  # before our renewer's thread exists: a fork must not copy a lock it holds
    turn = submit(Lock(name, ttl=2.0, renew=True), "mine")  # the waiter looks again in 1.3-2 s
    assert isinstance(turn, Turn)
    go.set()
    try:
        wait_until_queued(name, 1)
        batch = turn.take(limit=10)
        assert [r.payload for r in batch] == ["r0"]
        assert looking.wait(10)  # the lease it was told of ended
        deadline = time.monotonic() + 5
        while not _stopped(waiter.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        turn.reply({batch[0].token: "ok"})  # served to its blocked read while it is paused
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
    assert q.get(timeout=10) == ("served", "ok")
    waiter.join(5)
    keys = LockKeys.for_name(name)
    assert _client().llen(keys.queue) == 0
    assert turn.finish()
    assert _client().exists(keys.lock, keys.queue, keys.waiters) == 0


def test_a_needed_locks_name_travels_comma_separated_so_a_comma_in_one_is_refused(name):
    with pytest.raises(ValueError, match="comma"):
        submit(Lock(name), "x", wait=1.0, needs=["product:1,product:2"])
    with pytest.raises(ValueError):
        submit(Lock(name), "x", wait=1.0, needs=["{bad}"])
    assert not Lock(name).locked()  # refused before anything reached Redis
