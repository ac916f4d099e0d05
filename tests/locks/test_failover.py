"""Failover safety (WAIT for replicas) and waiters that are interrupted while queued."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import redis

from locks import Lock, LockUnavailable
from locks.keys import LockKeys
from tests.helpers import RedisServer
from tests.locks.conftest import FORK, wait_until_queued


class Replica(RedisServer):
    def __init__(self, master_port: int) -> None:
        super().__init__()
        self.master_port = master_port

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir,
             "--replicaof", "127.0.0.1", str(self.master_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client, master = redis.Redis(port=self.port), redis.Redis(port=self.master_port)
        for _ in range(300):
            try:
                # Synced, and acknowledging the master's writes: just after a quick sync a write's
                # WAIT may go unanswered for up to a second (until the replica's first ACK).
                if client.info("replication").get("master_link_status") == "up":
                    master.set("replica:ready", 1)
                    acked = master.wait(1, 100)
                    master.delete("replica:ready")
                    if acked == 1:
                        return
            except redis.ConnectionError:
                pass
            time.sleep(0.02)
        raise RuntimeError("replica did not sync")


def test_with_wait_replicas_a_lock_is_only_granted_once_a_replica_has_it(name, redis_server, settings):
    settings.LOCKS = {**settings.LOCKS, "WAIT_REPLICAS": 1, "WAIT_REPLICAS_TIMEOUT": 0.2}
    replica = Replica(redis_server.port)
    replica.start()
    client = redis_server.client()
    lock = Lock(name, ttl=10.0, client=client)
    try:
        with lock as held:
            # What a promoted replica would know: the lock, with our token.
            assert replica.client().hget(LockKeys.for_name(name).lock, "token").decode() == held.token
        replica.stop()
        with pytest.raises(LockUnavailable, match="replicas"):
            lock.acquire()
        # The unconfirmed acquisition was given back, not left behind.
        assert not client.exists(LockKeys.for_name(name).lock)
    finally:
        replica.stop()


def _queue_then_wait(name, ready, queue):
    # A suite started in the background by a shell without job control (nohup ... &) runs with
    # SIGINT ignored, and forked children inherit that: be the interactive program this test is about.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lock = Lock(name, ttl=10.0, wait=30.0)
    ready.set()
    try:
        lock.acquire()
    except KeyboardInterrupt:
        queue.put("interrupted")


def test_an_interrupted_waiter_leaves_the_queue_and_strands_nothing(name, redis_client):
    keys = LockKeys.for_name(name)
    holder = Lock(name, ttl=10.0)
    holder.acquire()
    ready, queue = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_queue_then_wait, args=(name, ready, queue))
    proc.start()
    assert ready.wait(10)
    wait_until_queued(name)
    os.kill(proc.pid, signal.SIGINT)
    assert queue.get(timeout=10) == "interrupted"
    proc.join(10)
    assert redis_client.llen(keys.queue) == 0
    holder.release()
    # Nobody is waiting any more: the lock is free, not handed to the departed waiter.
    assert not redis_client.exists(keys.lock)
