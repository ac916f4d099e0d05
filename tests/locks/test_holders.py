"""A holder is one acquisition: threads, asyncio tasks and forked children are strangers."""

from __future__ import annotations

import asyncio
import threading

import pytest

from locks import Lock, LockNotOwned
from locks.keys import LockKeys
from tests.locks.conftest import FORK


def test_another_thread_cannot_release_or_extend_my_lock(name, redis_client):
    lock = Lock(name, ttl=5.0)
    lock.acquire()
    errors = []

    def stranger() -> None:
        for call in (lock.release, lambda: lock.extend(5.0)):
            try:
                call()
            except LockNotOwned as exc:
                errors.append(exc)

    t = threading.Thread(target=stranger)
    t.start()
    t.join()
    assert len(errors) == 2
    assert redis_client.exists(LockKeys.for_name(name).lock)
    lock.release()


def test_two_threads_sharing_one_lock_object_exclude_each_other(name):
    lock = Lock(name, ttl=5.0, wait=0.05)
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire()))
    t.start()
    t.join()
    assert got == [False]
    lock.release()


@pytest.mark.alone  # a 0.2 s lease must outlive a 0.05 s sleep
def test_asyncio_tasks_cannot_release_each_others_lock(name):
    async def main() -> None:
        lock = Lock(name, ttl=0.2, wait=2.0)
        a_acquired, b_acquired = asyncio.Event(), asyncio.Event()

        async def task_a() -> None:
            await lock.aacquire()
            a_acquired.set()
            await b_acquired.wait()  # our lease ran out meanwhile and B took the lock
            with pytest.raises(LockNotOwned):
                await lock.arelease()

        async def task_b() -> None:
            await a_acquired.wait()
            async with lock as held:  # waits for A's lease (0.2 s) to end
                b_acquired.set()
                await asyncio.sleep(0.05)
                assert not held.lost
                assert lock.held is held  # this task's own hold, not A's
            return held

        await asyncio.gather(task_a(), task_b())

    asyncio.run(main())


def test_asyncio_task_holds_are_separate_on_one_loop(name):
    async def main() -> list[bool]:
        lock = Lock(name, ttl=5.0, wait=0.05)
        async with lock:
            # Another task on the same loop (same thread) is another holder: it waits and times out.
            other = asyncio.create_task(lock.aacquire())
            return [await other]

    assert asyncio.run(main()) == [False]


def _child_tries(lock, hold, queue):
    outcomes = []
    for call in (lock.release, hold.release, lambda: hold.extend(5.0), lambda: lock.extend(5.0)):
        try:
            call()
            outcomes.append("done")
        except LockNotOwned:
            outcomes.append("refused")
    queue.put(outcomes)


def test_a_forked_child_cannot_release_or_extend_its_parents_lock(name, redis_client):
    lock = Lock(name, ttl=5.0)
    hold = lock.__enter__()
    queue = FORK.Queue()
    proc = FORK.Process(target=_child_tries, args=(lock, hold, queue))
    proc.start()
    assert queue.get(timeout=10) == ["refused"] * 4
    proc.join(10)
    assert redis_client.hget(LockKeys.for_name(name).lock, "token").decode() == hold.token
    lock.release()
