"""Fixtures for lock tests."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Callable

import pytest
from django.db import connections
from django_redis import get_redis_connection

from locks import Lock, stats
from locks.conf import locks_settings
from locks.keys import LockKeys

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def name() -> str:
    """A fresh lock name per test; never an all-digit segment, so it is its own stats family."""
    return f"t:x{uuid.uuid4().hex[:12]}"


def run_in_children(target, args_list: list[tuple], timeout: float = 60.0, *,
                    then: Callable[[], object] | None = None) -> list:
    """Run target(*args, queue) in one forked process per args tuple; return what each put on the
    queue. `then` runs once they are all forked (e.g. starting a thread that contends with them: a
    fork while a thread of this process holds a lock, the Redis pool's or the stats', can leave the
    child waiting on it forever)."""
    connections.close_all()
    queue = FORK.Queue()
    procs = [FORK.Process(target=target, args=(*args, queue)) for args in args_list]
    for p in procs:
        p.start()
    if then is not None:
        then()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"
    return results


def wait_in_child(name: str, queue) -> None:
    """Child process: wait for the lock, then report (seconds waited, fence)."""
    with Lock(name, wait=20.0) as held:
        queue.put((held.waited, held.fence))


def _hold_in_child(name: str, ready, done, queue) -> None:
    with Lock(name, ttl=30.0) as held:
        stats.flush()  # publish the hold in the held index now, not at the next flush
        queue.put((os.getpid(), held.fence))
        ready.set()
        done.wait(30)


@pytest.fixture
def held_elsewhere(name):
    """The lock `name`, held by another process for 30 s; yields (name, pid, fence)."""
    ready, done, queue = FORK.Event(), FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_hold_in_child, args=(name, ready, done, queue))
    proc.start()
    assert ready.wait(10)
    pid, fence = queue.get(timeout=5)
    yield name, pid, fence
    done.set()
    proc.join(10)


def wait_until_queued(name: str, n: int = 1) -> None:
    """Block until `n` waiters are queued for `name` (a child process has really started waiting)."""
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    key = LockKeys.for_name(name).queue
    for _ in range(1000):
        if client.llen(key) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"no {n} waiter(s) queued for {name}")


def start_waiter(name: str):
    """A child process waiting for `name`; returns (process, queue of (waited, fence)) once it is queued."""
    queue = FORK.Queue()
    proc = FORK.Process(target=wait_in_child, args=(name, queue))
    proc.start()
    wait_until_queued(name)
    return proc, queue
