"""Helpers for multi-process tests: the GIL hides races in threads, so we fork."""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections

FORK = multiprocessing.get_context("fork")


def _child(fn: Callable[..., Any], args: tuple, start, queue) -> None:
    connections.close_all()
    try:
        start.wait(30)
        queue.put(("ok", fn(*args)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))
    finally:
        connections.close_all()


def run_processes(fn: Callable[..., Any], args_list: list[tuple], timeout: float = 120.0) -> list[Any]:
    """Run fn(*args) in one forked process per args tuple, all released at once; their results.

    A child's exception fails the test with the child's traceback.
    """
    connections.close_all()
    start, queue = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_child, args=(fn, args, start, queue)) for args in args_list]
    for p in procs:
        p.start()
    start.set()
    results, failures = [], []
    for _ in procs:
        status, value = queue.get(timeout=timeout)
        (results if status == "ok" else failures).append(value)
    for p in procs:
        p.join(timeout=30)
    assert not failures, "a child process failed:\n" + "\n".join(failures)
    return results


def make_users(n: int, prefix: str = "buyer") -> list:
    User = get_user_model()
    User.objects.bulk_create([User(username=f"{prefix}-{i}", password="!") for i in range(n)])
    return list(User.objects.filter(username__startswith=f"{prefix}-").order_by("pk"))
