"""Reentrancy on request, and one Redis Cluster slot per lock."""

from __future__ import annotations

import asyncio
import threading

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
