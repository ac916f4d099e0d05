"""Helpers for multi-process tests: the GIL hides races in threads, so we fork."""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis
from django.contrib.auth import get_user_model
from django.db import connections

from loadtest.servers.base import free_port

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
             "--dir", self.dir,
             # A replica is synced at once, not after Redis's default 5 s wait for more of them
             # (as loadtest/servers/base.py starts its servers).
             "--repl-diskless-sync-delay", "0"],
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

    def freeze(self) -> None:
        """SIGSTOP: connections are accepted (the kernel's backlog) but nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


def kill_own_connection() -> None:
    """KILL this thread's MySQL connection from a second one (what a DBA, a proxy, a failover or
    the server's idle_transaction_timeout does)."""
    import MySQLdb
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (connection_id,) = cursor.fetchone()
    admin = MySQLdb.connect(host="127.0.0.1", port=3306, user="root", passwd="")
    try:
        admin.cursor().execute(f"KILL {int(connection_id)}")
    finally:
        admin.close()


def order_of(receipt):
    """The saved Order behind a receipt that place_order returned (to pay, cancel or refund it)."""
    from shop.models import Order

    return Order.objects.get(pk=receipt.order_id)


def take_turn(product, user_id: int):
    """A buyer of a drop's line in the checkout (its turn begun, not finished): what a slow request
    looks like to the line."""
    from shop import line

    return line.join(config=line.config_of(product), user_id=user_id, start=True, until=time.monotonic() + 60)
