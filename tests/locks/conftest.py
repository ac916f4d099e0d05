"""Fixtures for lock tests: the shared Redis, and private redis-server processes we may kill."""

from __future__ import annotations

import multiprocessing
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.db import connections

FORK = multiprocessing.get_context("fork")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server without persistence: stop it, start it, lose everything."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.dir = tempfile.mkdtemp(prefix="redis-test-")  # a replica's sync file lands here

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (./dev.sh installs it)"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def name() -> str:
    """A fresh lock name per test."""
    return f"t:{uuid.uuid4().hex[:12]}"


def run_in_children(target, args_list: list[tuple], timeout: float = 60.0) -> list:
    """Run target(*args, queue) in one forked process per args tuple; return what each put on the queue."""
    connections.close_all()
    queue = FORK.Queue()
    procs = [FORK.Process(target=target, args=(*args, queue)) for args in args_list]
    for p in procs:
        p.start()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"
    return results
