"""`manage.py run_jobs`: --once, --ticks, --list and its errors (the admin's Job runs twin)."""

from __future__ import annotations

import io
import os
import re
import socket
import uuid

import pytest
from django.core.management import CommandError, call_command

from locks import jobs
from locks.jobs import JobContext, registry
from locks.models import JobRun

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("run_jobs", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def job_name():
    name = f"t.cmd{uuid.uuid4().hex[:10]}"
    yield name
    registry.unregister(name)


def test_once_runs_the_due_tick_once_and_list_shows_it(job_name):
    seen: list[int] = []

    def job(ctx: JobContext) -> str:
        seen.append(ctx.tick)
        return f"tick {ctx.tick} done"

    jobs.register(job_name, job, every=3600, lease=30)
    out = run("--once", "--job", job_name)
    [tick] = seen
    assert f"{job_name} tick {tick}: ok: tick {tick} done" in out

    again = run("--once", "--job", job_name)
    assert f"tick {tick}:" not in again and seen.count(tick) == 1, "--once ran a settled tick again"

    listing = run("--list", "--job", job_name)
    assert f"{job_name} (every 3600s, lease 30s)" in listing
    row = re.search(rf"^\s+{tick} \S+ \S+ (\S+)\s+\S+ \S+\s+(\S+) (\S+)\s+0$", listing, re.M)
    assert row, listing
    assert row.group(1) == f"{socket.gethostname()}:{os.getpid()}" and row.group(3) == "ok"
    assert float(row.group(2)) >= 0


def test_list_shows_errors_takeovers_and_unregistered_jobs(job_name):
    jobs.register(job_name, lambda ctx: 1 / 0, every=3600, lease=30)
    assert ": error: ZeroDivisionError: division by zero" in run("--once", "--job", job_name)
    JobRun.objects.create(job="t.gone", tick=3, due_at="2026-01-01T00:00:00Z", runner="web-2:77", fence=5,
                          started_at="2026-01-01T00:00:01Z", lease_until="2026-01-01T00:00:31Z",
                          outcome=JobRun.TAKEN_OVER, takeovers=1, taken_over_from="web-1:12 (fence 4)")
    listing = run("--list")
    assert "error: ZeroDivisionError: division by zero" in listing
    assert "t.gone (not registered here)" in listing
    assert "taken_over (lease over)" in listing and "taken over from web-1:12 (fence 4)" in listing
    assert "locks.prune (every 3600s, lease 300s)" in listing


def test_an_idle_tick_prints_nothing_unless_asked_with_v2(job_name):
    """Issue 37: 2-4 "ok: sent 0" lines every 5 s drowned the dev server's mail in the terminal they
    share. A tick that found nothing to do (the job returned `jobs.Idle`) is quiet; -v 2 shows it;
    one that did something or failed is always printed."""
    other = f"{job_name}-busy"
    jobs.register(job_name, lambda ctx: jobs.Idle("sent 0, failed 0"), every=3600, lease=30)
    jobs.register(other, lambda ctx: "sent 2, failed 0", every=3600, lease=30)
    try:
        out = run("--once", "--job", job_name, "--job", other)
        assert "sent 0" not in out and f"{other} tick" in out and "ok: sent 2, failed 0" in out, out
        JobRun.objects.filter(job__in=[job_name, other]).delete()
        loud = io.StringIO()
        call_command("run_jobs", "--once", "--job", job_name, verbosity=2, stdout=loud)
        assert f"{job_name} tick" in loud.getvalue() and "ok: sent 0, failed 0" in loud.getvalue()
        assert JobRun.objects.get(job=job_name).idle is True
    finally:
        registry.unregister(other)


def test_ticks_runs_consecutive_ticks_then_stops(job_name):
    ran: list[int] = []
    jobs.register(job_name, lambda ctx: ran.append(ctx.tick), every=0.1, lease=1.0)
    out = run("--ticks", "3", "--job", job_name)
    assert out.startswith(f"running 1 job: {job_name}")
    assert len(ran) >= 3 and ran == list(range(ran[0], ran[0] + len(ran)))
    assert list(JobRun.objects.filter(job=job_name).order_by("tick").values_list("tick", flat=True)) == ran


def test_bad_arguments():
    with pytest.raises(CommandError, match=r"no job named 't\.nope'"):
        run("--once", "--job", "t.nope")
    with pytest.raises(CommandError, match="--ticks must be at least 1"):
        run("--ticks", "0")
