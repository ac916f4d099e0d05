"""`manage.py locks`: list, stats, events, watch, force release (point 10)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from locks import Lock
from tests.locks.conftest import start_waiter


def run(*args: str, stdin: str | None = None, monkeypatch=None) -> str:
    out = io.StringIO()
    if stdin is not None:
        monkeypatch.setattr("builtins.input", lambda prompt="": stdin)
    call_command("locks", *args, stdout=out)
    return out.getvalue()


def test_lists_held_locks_and_stats(name):
    with Lock(name, ttl=10.0) as held:
        out = run("--prefix", name)
        assert name in out and str(held.fence) in out
    out = run("--prefix", name)
    assert "Held locks (0)" in out and "(all)" in out


def test_json_output(name):
    with Lock(name, ttl=10.0) as held:
        data = json.loads(run("--prefix", name, "--json"))
    assert data["held"][0]["name"] == name and data["held"][0]["fence"] == held.fence
    assert data["totals"]["acquired"] >= 1


def test_watch_refreshes_n_times(name):
    out = run("--prefix", name, "--watch", "0.01", "--iterations", "3")
    assert out.count("Held locks") == 3


def test_release_asks_then_frees_and_wakes_the_waiter(name, monkeypatch):
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
