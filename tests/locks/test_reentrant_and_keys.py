"""Reentrancy on request, and one Redis Cluster slot per lock."""

from __future__ import annotations

import asyncio
import threading

import pytest
from redis.crc import key_slot

from locks import Lock
from locks.keys import LockKeys
from tests.locks.conftest import start_waiter


def test_reentrant_lock_counts_holds_and_frees_at_the_last_release(name, redis_client):
    lock = Lock(name, ttl=5.0, reentrant=True)
    key = LockKeys.for_name(name).lock
    with lock as outer:
        with lock as inner:
            assert inner is outer and inner.count == 2
        assert redis_client.exists(key)
        assert Lock(name, wait=0.05).acquire() is False  # still held after the inner release
    assert not redis_client.exists(key)


def test_reentrant_lock_is_per_holder_not_shared_across_threads(name):
    lock = Lock(name, ttl=5.0, wait=0.05, reentrant=True)
    got = []
    with lock:
        t = threading.Thread(target=lambda: got.append(lock.acquire()))
        t.start()
        t.join()
    assert got == [False]


def test_reentrant_lock_is_per_asyncio_task(name):
    async def main() -> list[bool]:
        lock = Lock(name, ttl=5.0, wait=0.05, reentrant=True)
        async with lock:
            nested = await lock.aacquire()  # same task: re-enters
            other = await asyncio.create_task(lock.aacquire())  # another task: waits, times out
            await lock.arelease()
            return [nested, other]

    assert asyncio.run(main()) == [True, False]


def test_every_key_of_one_lock_is_in_one_cluster_slot(name, redis_client):
    keys = LockKeys.for_name(name)
    # A lease longer than the SCAN below: it walks the whole shared keyspace, which takes seconds
    # when that holds a few hundred thousand keys (whatever else uses this Redis).
    holder = Lock(name, ttl=60.0)
    holder.acquire()
    waiter, queue = start_waiter(name)  # queued: its queue, waiters and signal keys exist now
    seen = {k.decode() for k in redis_client.scan_iter(match=f"*{{{name}}}*", count=1000)}
    holder.release()
    assert queue.get(timeout=10)
    waiter.join(10)
    assert {keys.lock, keys.fence, keys.queue, keys.waiters} <= seen
    assert {key_slot(k.encode()) for k in seen} == {key_slot(keys.lock.encode())}
    assert keys.lock.endswith(f"lock:{{{name}}}")


def test_a_locks_keys_follow_the_key_prefix_setting_though_kept_per_name(name, settings):
    """Keys are kept per name (a lock per order asks for the same ones): the prefix is part of
    what they are kept by, so a changed LOCKS["KEY_PREFIX"] gives the new keys at once."""
    before = LockKeys.for_name(name)
    assert LockKeys.for_name(name) is before
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": "other:"}
    after = LockKeys.for_name(name)
    assert after.lock == f"other:lock:{{{name}}}" and after.fence == f"other:lock:{{{name}}}:fence"
    assert Lock(name).keys.queue == f"other:lock:{{{name}}}:queue"
    assert LockKeys.for_name(name, "given:").waiters == f"given:lock:{{{name}}}:waiters"


def test_a_bad_lock_name_is_refused_every_time_it_is_asked_for():
    for _ in range(2):  # the second time too: a refused name is never kept
        with pytest.raises(ValueError, match="braces"):
            LockKeys.for_name("product:{1}")


def test_names_used_once_do_not_crowd_a_hot_name_out_of_the_kept_keys(name):
    for i in range(10_001):  # more one-shot names (idempotency keys) than are kept
        LockKeys.for_name(f"once:{i}")
    hot = LockKeys.for_name(name)
    assert LockKeys.for_name(name) is hot
