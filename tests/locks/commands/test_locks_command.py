"""`manage.py locks`: list, stats, events, watch, force release."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from django.core.management import CommandError, call_command

from locks import Lock, LockLost, stats
from locks.lock import current_holder
from locks.models import ForceRelease
from tests.locks.conftest import start_waiter


def run(*args: str, stdin: str | None = None, monkeypatch=None) -> str:
    out = io.StringIO()
    if stdin is not None:
        monkeypatch.setattr("builtins.input", lambda prompt="": stdin)
    call_command("locks", *args, stdout=out)
    return out.getvalue()


def test_lists_held_locks_and_stats(name):
    with Lock(name, ttl=10.0) as held:
        stats.flush()  # held locks are listed from the index the stats flush keeps
        out = run("--prefix", name)
        assert name in out and str(held.fence) in out
        assert name in run("--prefix", name, "--all")  # found by SCAN, without the index
    stats.flush()
    out = run("--prefix", name)
    assert "Held locks (0)" in out and "(all)" in out and f"busiest: {name} (1)" in out
    assert "wait p50 ms" in out and "hold p99 ms" in out and "(times in ms)" not in out  # units per column


def test_json_output(name):
    with Lock(name, ttl=10.0) as held:
        stats.flush()
        data = json.loads(run("--prefix", name, "--json"))
    assert data["held"][0]["name"] == name and data["held"][0]["fence"] == held.fence
    assert data["totals"]["acquired"] >= 1


def test_watch_refreshes_n_times(name):
    out = run("--prefix", name, "--watch", "0.01", "--iterations", "3")
    assert out.count("Held locks") == 3


def test_release_asks_then_frees_and_wakes_the_waiter(name, db, monkeypatch):
    holder = Lock(name, ttl=30.0)
    holder.acquire()
    proc, queue = start_waiter(name)
    with pytest.raises(CommandError, match="not released"):
        run("release", name, stdin="n", monkeypatch=monkeypatch)
    assert holder.locked()
    out = run("release", name, stdin="y", monkeypatch=monkeypatch)
    assert "released" in out
    assert queue.get(timeout=5)[0] < 2.0  # woken at once, not after the 30 s lease
    proc.join(10)
    assert "force_release" in run("events", "--limit", "5")


def test_release_writes_the_same_audit_row_as_the_admin(name, db):
    holder = Lock(name, ttl=30.0)
    holder.acquire()
    fence = holder._holds[next(iter(holder._holds))].fence
    run("release", name, "--yes", "--actor", "ops-alice")
    audit = ForceRelease.objects.get()
    assert (audit.lock_name, audit.fence, audit.actor_name, audit.waiters) == (name, fence, "ops-alice", 0)
    assert audit.owner.endswith(f":{os.getpid()}") and audit.held_for >= 0


def test_release_with_a_stale_fence_refuses(name, db):
    lock = Lock(name, ttl=30.0)
    held = lock._acquire(current_holder(), blocking=True, wait=1.0)
    with pytest.raises(CommandError, match="holder changed"):
        run("release", name, "--yes", "--fence", str(held.fence - 1))
    held.check()
    assert not ForceRelease.objects.exists()
    run("release", name, "--yes", "--fence", str(held.fence))
    with pytest.raises(LockLost):
        held.check()
    audit = ForceRelease.objects.get()
    assert audit.fence == held.fence and "@" in audit.actor_name  # default actor: user@host


def test_interactive_release_acts_on_the_holder_it_showed(name, db, monkeypatch):
    first = Lock(name, ttl=30.0)
    first.acquire()
    second = Lock(name, ttl=30.0)

    def swap_holder(prompt=""):
        first.release()  # while the operator reads the prompt, the lock changes hands
        second.acquire()
        return "y"

    monkeypatch.setattr("builtins.input", swap_holder)
    with pytest.raises(CommandError, match="holder changed"):
        call_command("locks", "release", name, stdout=io.StringIO())
    assert second.locked()
    second.release()


def test_release_without_yes_or_name(name):
    with pytest.raises(CommandError, match="not held"):
        run("release", name, "--yes")
    with pytest.raises(CommandError, match="usage"):
        run("release")
    with pytest.raises(CommandError):
        run("release", "bad{name}", "--yes")


@pytest.mark.parametrize("args", [["--limit", "0"], ["--watch", "0"]])
def test_bad_arguments(args):
    with pytest.raises(CommandError):
        run(*args)


def test_redis_down_is_a_clear_error(settings, redis_server):
    caches = {**settings.CACHES, "locks": {**settings.CACHES["locks"], "LOCATION": redis_server.url}}
    settings.CACHES = caches
    redis_server.stop()
    with pytest.raises(CommandError, match="unreachable"):
        run()


def test_shows_queued_requests_and_the_combining_batches(name):
    """Two children queue requests behind our hold; after we serve them (a batch of 3) the
    Combining section, and --json, have the family's batch."""
    from locks.combining import submit
    from tests.locks.test_combining import start_submitter

    turn = submit(Lock(name, ttl=10.0), "mine")
    stats.flush()
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(2)]
    out = run("--prefix", name)
    assert out.splitlines()[0] == "Lock backend: redis"
    held = out[out.index("Held locks") : out.index("Lock stats")]
    [line] = [line for line in held.splitlines() if line.startswith(name)]
    assert held.splitlines()[1].split()[-2:] == ["waiters", "requests"]
    assert line.split()[-2:] == ["2", "2"]  # waiters, of which queued requests
    assert json.loads(run("--prefix", name, "--json"))["held"][0]["queued_requests"] == 2
    assert "Combining (0 families)" in out
    with turn:
        turn.reply({r.token: "ok" for r in turn.take(limit=10)})
    for proc, queue in waiters:
        assert queue.get(timeout=10)[1] == "served"
        proc.join(5)
    stats.flush()
    out = run("--prefix", name)
    combining = out[out.index("Combining (1 families)"):]
    [row] = [line for line in combining.splitlines() if line.startswith(name)]
    assert row.split()[1:5] == ["1", "3", "3.00", "4"] and "s ago" in row and row.endswith("3-4: 1")
    family = json.loads(run("--prefix", name, "--json"))["stats"][0]
    assert (family["batches"], family["batched_requests"], family["batch_sizes"]) == (1, 3, {"3-4": 1})
    assert time.time() - family["last_batch_at"] < 5


def test_sort_orders_the_stats_table_and_limit_cuts_it(db):
    import uuid

    tag = uuid.uuid4().hex[:8]
    busy, quiet = f"t:xzz{tag}", f"t:xaa{tag}"  # the busier one sorts last by name
    for _ in range(3):
        with Lock(busy, ttl=5.0):
            pass
    with Lock(quiet, ttl=5.0):
        pass
    stats.flush()

    def order(*args: str) -> list[str]:
        return [line.split()[0] for line in run("--prefix", "t:x", "--limit", "500", *args).splitlines()
                if line.split() and line.split()[0] in (busy, quiet)]

    assert order() == [busy, quiet]  # default: most acquisitions first
    assert order("--sort", "name") == [quiet, busy]
    data = json.loads(run("--prefix", "t:x", "--sort", "name", "--limit", "1", "--json"))
    assert len(data["stats"]) == 1
    with pytest.raises(CommandError, match="invalid choice"):
        run("--sort", "nope")
