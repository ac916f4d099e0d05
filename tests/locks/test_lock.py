"""The basic contract: acquire, release, extend, TTLs, errors."""

from __future__ import annotations

import time

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from locks import Lock, LockNotOwned, LockTimeout, LockUnavailable
from locks.keys import LockKeys


def test_acquire_sets_a_ttl_and_release_deletes(name, redis_client):
    lock = Lock(name, ttl=10.0, wait=0)
    with lock as held:
        key = LockKeys.for_name(name).lock
        assert 9000 < redis_client.pttl(key) <= 10000
        assert redis_client.hget(key, "token").decode() == held.token
        assert 9.0 < held.remaining() <= 10.0
        assert held.fence > 0
    assert not redis_client.exists(key)


class CountingRedis(redis.Redis):
    """A client that counts the commands it sends (each one is a round trip)."""

    sent: list[str]

    def execute_command(self, *args, **options):
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


def test_acquire_and_release_are_one_round_trip_each(name, redis_server):
    client = CountingRedis(port=redis_server.port)
    client.sent = []
    lock = Lock(name, ttl=5.0, client=client)
    assert lock.acquire(blocking=False)
    assert client.sent in (["EVALSHA"], ["EVALSHA", "SCRIPT LOAD", "EVALSHA"])  # first use loads the script
    lock.release()
    client.sent = []
    assert lock.acquire(blocking=False)
    lock.release()
    # Metrics (counters, wait and hold histograms) ride inside the same scripts: no extra trips.
    assert client.sent == ["EVALSHA", "EVALSHA"]


def test_release_of_a_lock_never_held_raises(name):
    with pytest.raises(LockNotOwned):
        Lock(name).release()


def test_release_twice_raises(name):
    lock = Lock(name)
    lock.acquire()
    lock.release()
    with pytest.raises(LockNotOwned):
        lock.release()


def test_a_non_owner_cannot_delete_someone_elses_lock(name, redis_client):
    key = LockKeys.for_name(name).lock
    lock = Lock(name, ttl=5.0)
    held = lock.__enter__()
    # The lease passes to someone else (as after an expiry and a new acquisition).
    redis_client.hset(key, "token", "someone-else")
    with pytest.raises(LockNotOwned):
        held.release()
    assert redis_client.hget(key, "token") == b"someone-else"
    assert lock.held is None
    redis_client.delete(key)


def test_expired_holder_cannot_release_the_next_holders_lock(name, redis_client):
    first = Lock(name, ttl=0.2)
    held = first.__enter__()
    time.sleep(0.3)
    assert held.lost
    second = Lock(name, ttl=5.0)
    assert second.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        held.release()
    assert redis_client.hget(LockKeys.for_name(name).lock, "token").decode() == second.held.token
    second.release()


def test_extend_adds_or_replaces(name, redis_client):
    key = LockKeys.for_name(name).lock
    lock = Lock(name, ttl=10.0)
    with lock:
        left = lock.extend(10.0)
        assert 19.0 < left <= 20.0 and 19000 < redis_client.pttl(key) <= 20000
        left = lock.extend(3.0, replace=True)
        assert 2.9 < left <= 3.0 and 2900 < redis_client.pttl(key) <= 3000


def test_extend_of_an_expired_lock_raises_and_changes_nothing(name, redis_client):
    key = LockKeys.for_name(name).lock
    lock = Lock(name, ttl=0.2)
    held = lock.__enter__()
    time.sleep(0.3)
    other = Lock(name, ttl=5.0)
    assert other.acquire(blocking=False)
    before = redis_client.pttl(key)
    with pytest.raises(LockNotOwned):
        held.extend(30.0)
    assert redis_client.pttl(key) <= before
    assert redis_client.hget(key, "token").decode() == other.held.token
    other.release()


def test_extend_without_holding_raises(name):
    with pytest.raises(LockNotOwned):
        Lock(name).extend(1.0)


def test_context_manager_does_not_run_the_body_when_not_acquired(name):
    ran = False
    with Lock(name, ttl=5.0), pytest.raises(LockTimeout) as err, Lock(name, wait=0.05):
        ran = True
    assert not ran
    assert err.value.name == name


def test_exit_after_the_lease_ran_out_raises(name):
    with pytest.raises(LockNotOwned), Lock(name, ttl=0.1):
        time.sleep(0.2)


def test_nonblocking_acquire_returns_false_when_held(name):
    with Lock(name):
        assert Lock(name).acquire(blocking=False) is False


def test_non_reentrant_lock_refuses_a_nested_acquire(name):
    lock = Lock(name)
    with lock, pytest.raises(RuntimeError, match="reentrant"):
        lock.acquire()


@pytest.mark.parametrize("bad", ["", "a{b}", "x*", "has space", "a" * 201])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError):
        Lock(bad)


@pytest.mark.parametrize("kwargs", [{"ttl": 0}, {"ttl": -1}, {"wait": -1}, {"renew": True, "ttl": 10, "max_hold": 5}])
def test_bad_arguments_are_refused(name, kwargs):
    with pytest.raises(ValueError):
        Lock(name, **kwargs)


def test_redis_down_raises_lock_unavailable(name, redis_server):
    lock = Lock(name, client=redis_server.client())
    redis_server.stop()
    with pytest.raises(LockUnavailable) as err:
        lock.acquire()
    assert isinstance(err.value.__cause__, RedisConnectionError | OSError)


def test_errors_carry_the_lock_name(name):
    with pytest.raises(LockNotOwned) as err:
        Lock(name).release()
    assert err.value.name == name and name in str(err.value)


def test_an_acquire_that_arrives_after_its_give_up_time_is_sent_again(name):
    """The acquire script drops a request that reaches Redis after the time its caller would have
    given up (a frozen Redis replaying its socket buffer must not queue phantom waiters). A
    caller that was only slow to send (stalled before the send: a busy machine, a GC pause) or
    whose estimate of Redis's clock was off (a clock step) has not given up: it relearns the
    clock and sends again, instead of failing with LockUnavailable (seen in CI under load)."""
    from locks import connection as locks_connection
    from locks.connection import pool_of

    lock = Lock(name, ttl=5.0)
    assert lock.acquire(blocking=False)  # learns the clock
    lock.release()
    pool = pool_of(lock.client, lock.keys.lock)
    locks_connection._clock_offsets[id(pool)] -= 5000  # we think Redis's clock is 5 s behind
    assert lock.acquire(blocking=False)
    lock.release()
