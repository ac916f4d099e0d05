"""Fixtures for lock tests."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest
from django.db import connections

FORK = multiprocessing.get_context("fork")


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
