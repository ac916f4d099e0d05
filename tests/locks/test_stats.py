"""Keys that outlive their use: one-shot locks, stats by family, top-N names."""

from __future__ import annotations

import random
import time
import uuid

import pytest
import redis
from django_redis import get_redis_connection

from locks import Lock, LockNotOwned, inspect, stats
from locks.conf import locks_settings
from locks.keys import LockKeys, families_key, family_of, hot_key
from tests.helpers import free_port
from tests.locks.conftest import FORK, run_in_children, wait_until_queued


@pytest.fixture
def fresh_prefix(settings) -> str:
    """A key prefix of this test's own: the families and stats it sees are only its own."""
    prefix = f"{settings.LOCKS['KEY_PREFIX']}st{uuid.uuid4().hex[:8]}:"
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": prefix}
    return prefix


@pytest.fixture
def one_shot_name() -> str:
    return f"oneshot:{random.randrange(10**9)}:user:{random.randrange(10**9)}"


def keys_containing(text: str) -> list[str]:
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    return sorted(k.decode() for k in client.scan_iter(match=f"*{text}*", count=1000))


def test_family_of_replaces_numeric_segments():
    assert family_of("product:42") == "product:*"
    assert family_of("coupon:3:user:9") == "coupon:*:user:*"
    assert family_of("report") == "report"
    assert family_of("t:x1a2") == "t:x1a2"
    assert Lock("idem:7:abc123", family="idem").family == "idem"
    with pytest.raises(ValueError):
        Lock("x:1", family="{bad}")


def test_a_one_shot_lock_leaves_no_key_after_release(one_shot_name):
    lock = Lock(one_shot_name, ttl=5.0, one_shot=True)
    with lock as held:
        assert held.fence > 0
        assert keys_containing(one_shot_name)  # the lock and its fence, while held
    stats.flush()
    assert keys_containing(one_shot_name) == []
    with lock as again:  # used again: the fence still increases (it follows the Redis clock)
        assert again.fence > held.fence
    stats.flush()
    assert keys_containing(one_shot_name) == []


def _wait_one_shot(name: str, queue) -> None:
    with Lock(name, ttl=5.0, wait=10.0, one_shot=True) as held:
        queue.put((held.waited, held.fence))


def test_a_one_shot_lock_leaves_no_key_after_a_hand_off(one_shot_name):
    holder = Lock(one_shot_name, ttl=5.0, one_shot=True)
    held = holder.__enter__()
    queue = FORK.Queue()
    proc = FORK.Process(target=_wait_one_shot, args=(one_shot_name, queue))
    proc.start()
    wait_until_queued(one_shot_name)
    holder.release()
    _, fence = queue.get(timeout=10)
    proc.join(10)
    assert proc.exitcode == 0 and fence > held.fence
    stats.flush()
    assert keys_containing(one_shot_name) == []


def test_a_one_shot_lock_leaves_no_key_after_timeouts(one_shot_name):
    holder = Lock(one_shot_name, ttl=5.0, one_shot=True)
    holder.acquire()
    assert not Lock(one_shot_name, wait=0.05, one_shot=True).acquire()  # a waiter gives up
    holder.release()
    stats.flush()
    assert keys_containing(one_shot_name) == []
    # A holder that never releases: its lease runs out, and so does everything else.
    Lock(one_shot_name, ttl=0.2, one_shot=True).acquire()
    time.sleep(0.4)
    stats.flush()
    assert keys_containing(one_shot_name) == []


def test_a_one_shot_lock_counts_in_its_family_but_keeps_no_name(fresh_prefix, one_shot_name):
    for _ in range(3):
        with Lock(one_shot_name, one_shot=True):
            pass
    stats.flush()
    row = inspect.family_stats("oneshot:*:user:*")
    assert row.counters["acquired"] == 3 and row.counters["released"] == 3
    assert row.top_names == []


def test_many_distinct_names_leave_one_family_row_and_a_bounded_top_n(fresh_prefix, settings):
    settings.LOCKS = {**settings.LOCKS, "STATS_TOP_N": 20}
    names = [f"coupon:{i % 7}:user:{i}" for i in range(200)]
    for name in [names[5], names[5], *names]:  # names[5] is the busiest
        with Lock(name, ttl=5.0):
            pass
    stats.flush()
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    assert inspect.families() == ["coupon:*:user:*"]
    (row,) = inspect.lock_stats()
    assert row.name == "coupon:*:user:*" and row.counters["acquired"] == 202
    assert client.zcard(hot_key("coupon:*:user:*")) <= 20
    assert row.top_names[0] == (names[5], 3)
    # Besides the locks' own keys (their fences), only the shared stats keys exist.
    shared = {f"{fresh_prefix}lockstats:{{coupon:*:user:*}}", hot_key("coupon:*:user:*"), families_key(),
              f"{fresh_prefix}lockheld"}
    others = {k.decode() for k in client.scan_iter(match=f"{fresh_prefix}*", count=1000)
              if not k.startswith(f"{fresh_prefix}lock:{{".encode())}
    assert others <= shared
    for key in [f"{fresh_prefix}lockstats:{{coupon:*:user:*}}", hot_key("coupon:*:user:*"), families_key()]:
        assert 0 < client.ttl(key) <= locks_settings.METRICS_TTL


def _lock_many(names: list[str], n: int, queue) -> None:
    rng = random.Random()
    done = 0
    for _ in range(n):
        with Lock(rng.choice(names), ttl=5.0, wait=20.0):
            done += 1
    queue.put(done)  # the process flushes its stats as it exits


def test_stats_from_several_processes_add_up_to_what_the_clients_counted(fresh_prefix):
    names = [f"product:{i}" for i in range(3)]
    counted = run_in_children(_lock_many, [(names, 150)] * 4)
    stats.flush()
    row = inspect.family_stats("product:*")
    assert row.counters["acquired"] == sum(counted) == 600
    assert row.counters["released"] == 600 and sum(row.hold.values()) == 600
    assert sum(inspect.acquisitions(names).values()) == 600
    assert sum(row.wait.values()) == 600  # every acquisition has a wait (0 when uncontended)


def test_the_held_index_follows_holds_and_forgets_released_ones(fresh_prefix, name):
    lock = Lock(name, ttl=10.0)
    with lock:
        stats.flush()
        _, held = inspect.held_index_page()
        assert [h.name for h in held] == [name]
    stats.flush()
    assert inspect.held_index_page() == (0, [])
    assert not get_redis_connection(locks_settings.CACHE_ALIAS).zcard(f"{fresh_prefix}lockheld")


def test_the_stats_flush_is_rate_limited_not_per_acquire(fresh_prefix, name, settings):
    """Acquire and release write only the lock's own keys; stats arrive with the next flush."""
    settings.LOCKS = {**settings.LOCKS, "STATS_FLUSH_INTERVAL": 0.2}
    with Lock(name):
        pass
    assert LockKeys.for_name(name).lock  # (a valid name)
    deadline = time.monotonic() + 5
    while inspect.family_stats(name).counters["acquired"] != 1:
        assert time.monotonic() < deadline, "the background flush never ran"
        time.sleep(0.05)


def test_an_unreachable_redis_does_not_hold_up_the_other_clients_stats(fresh_prefix, name, settings):
    """A client whose Redis is gone (a stopped server; redis-py retries with backoff for seconds)
    must not delay the flush of the healthy ones: the CI failure of the test above."""
    settings.LOCKS = {**settings.LOCKS, "STATS_FLUSH_INTERVAL": 0.2}
    dead = redis.Redis(port=free_port())
    stats.recorder().count(Lock(f"{name}-dead", client=dead), timeouts=1)
    time.sleep(0.5)  # the flusher is now busy trying the dead one
    with Lock(name):
        pass
    deadline = time.monotonic() + 3
    while inspect.family_stats(name).counters["acquired"] != 1:
        assert time.monotonic() < deadline, "the healthy client's stats waited for the dead Redis"
        time.sleep(0.05)


def test_a_long_flush_interval_set_once_does_not_keep_the_flusher_asleep(fresh_prefix, name, settings):
    """A test (or an override) that set an hour-long interval left the flusher in an hour-long
    wait: every later background flush of the suite never came (found in the full run)."""
    settings.LOCKS = {**settings.LOCKS, "STATS_FLUSH_INTERVAL": 3600}
    with Lock(f"{name}-before"):
        pass
    time.sleep(0.3)  # the flusher is now asleep with the long interval
    settings.LOCKS = {**settings.LOCKS, "STATS_FLUSH_INTERVAL": 0.2}
    with Lock(name):
        pass
    deadline = time.monotonic() + 4
    while inspect.family_stats(name).counters["acquired"] != 1:
        assert time.monotonic() < deadline, "the flusher slept through the shorter interval"
        time.sleep(0.05)


# -- combining batches -----------------------------------------------------------------------
def test_batch_size_buckets_are_exact_powers_of_two():
    from locks import histogram

    sizes = {1: "1", 2: "2", 3: "3-4", 4: "3-4", 5: "5-8", 8: "5-8", 9: "9-16", 16: "9-16", 17: "17-32",
             32: "17-32", 33: "33-64"}
    for size, label in sizes.items():
        assert histogram.batch_bucket_label(histogram.batch_bucket_of(size)) == label, size
    buckets = {0: 50, 2: 49, 5: 1}  # 50 alone, 49 of 3-4, one of 17-32
    assert histogram.batch_percentile(buckets, 0.5) == 1
    assert histogram.batch_percentile(buckets, 0.99) == 4
    assert histogram.batch_percentile(buckets, 1.0) == 32
    assert histogram.batch_percentile({}, 0.5) is None


def test_a_turn_counts_one_batch_of_its_own_request_and_all_it_took(fresh_prefix, name):
    """Requests taken over several take() calls make one batch; a repeated release counts it once."""
    from locks.combining import submit
    from locks.keys import stats_key
    from tests.locks.test_combining import start_submitter

    turn = submit(Lock(name, ttl=5.0), "mine")
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(3)]
    before_ms = int(time.time() * 1000)
    with turn:
        first, rest = turn.take(limit=2), turn.take(limit=10)
        assert len(first) == 2 and len(rest) == 1
        turn.reply({r.token: "ok" for r in first + rest})
    after_ms = int(time.time() * 1000)
    with pytest.raises(LockNotOwned):
        turn.release()  # released again: an error, and no second batch
    for proc, queue in waiters:
        assert queue.get(timeout=10)[1] == "served"
        proc.join(5)
    with submit(Lock(name, ttl=5.0), "alone"):  # nobody queued: a batch of 1
        pass
    with Lock(name):  # a plain hold is no batch
        pass
    stats.flush()
    raw = get_redis_connection(locks_settings.CACHE_ALIAS).hgetall(stats_key(name))
    fields = {k.decode(): int(v) for k, v in raw.items()}
    assert (fields["batches"], fields["batched_requests"], fields["b0"], fields["b2"]) == (2, 5, 1, 1)
    assert not {k for k in fields if k.startswith("b") and k[1:].isdigit()} - {"b0", "b2"}
    assert before_ms <= fields["last_batch_ms"] <= int(time.time() * 1000)
    summary = inspect.family_stats(name).batch_summary()
    assert summary["batch_sizes"] == {"1": 1, "3-4": 1} and summary["mean_batch"] == 2.5
    assert summary["last_batch_at"] >= after_ms / 1000  # the latest batch, the lone one


def _lone_batches(name: str, n: int, queue) -> None:
    from locks.combining import submit

    for _ in range(n):
        with submit(Lock(name, ttl=5.0, wait=20.0), "x"):
            pass
    queue.put(n)  # the exit of this child flushes its counts (multiprocessing's exit hook)


def test_batches_from_several_processes_add_up(fresh_prefix, name):
    counted = run_in_children(_lone_batches, [(name, 25)] * 3)
    summary = inspect.family_stats(name).batch_summary()
    assert summary["batches"] == sum(counted) == 75
    assert summary["batched_requests"] >= 75 and summary["last_batch_at"] is not None
    # Each batch is 1 + what queued behind the combiner (other children's requests, served by it).
    row = inspect.family_stats(name)
    assert sum(row.batch.values()) == 75


def test_the_last_batch_time_kept_for_a_failed_flush_stays_the_latest():
    from locks.stats import Recorder, _Pending

    pending = _Pending()
    pending.latest["f"] = {"last_batch_ms": 2000}
    Recorder._put_back(pending, {"counters": {}, "names": {}, "latest": {"f": {"last_batch_ms": 1000}}, "gone": []})
    assert pending.latest["f"]["last_batch_ms"] == 2000
