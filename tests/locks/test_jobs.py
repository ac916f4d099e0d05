"""Scheduled jobs (locks/jobs.py): every tick runs exactly once in the cluster (I8).

Real MariaDB, Redis and OS processes. A test job records (job, tick, pid) in a plain table in
the job's transaction, so a result that should not exist would show there as a second row.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.test import Client
from django.utils import timezone
from django_redis import get_redis_connection

from locks import jobs
from locks.conf import locks_settings
from locks.jobs import Job, JobContext, Runner, TickResult, registry
from locks.keys import families_key, stats_key
from locks.models import JobRun
from tests.helpers import FORK, run_processes

pytestmark = pytest.mark.django_db(transaction=True)

EFFECTS = "test_job_effects"


@pytest.fixture
def effects():
    """A plain table (no unique key: a duplicate must be able to show) the test jobs write to."""
    with connection.cursor() as c:
        c.execute(f"DROP TABLE IF EXISTS {EFFECTS}")
        c.execute(f"CREATE TABLE {EFFECTS} (id BIGINT AUTO_INCREMENT PRIMARY KEY, job VARCHAR(200), "
                  f"tick BIGINT, pid INT) ENGINE=InnoDB")
    yield
    connections.close_all()
    with connection.cursor() as c:
        c.execute(f"DROP TABLE IF EXISTS {EFFECTS}")


def effect_rows(job: str) -> list[tuple[int, int]]:
    with connection.cursor() as c:
        c.execute(f"SELECT tick, pid FROM {EFFECTS} WHERE job = %s ORDER BY id", [job])
        return [(int(t), int(p)) for t, p in c.fetchall()]


def record(ctx: JobContext) -> str:
    with connection.cursor() as c:
        c.execute(f"INSERT INTO {EFFECTS} (job, tick, pid) VALUES (%s, %s, %s)", [ctx.job.name, ctx.tick, os.getpid()])
    return f"pid {os.getpid()}"


@pytest.fixture
def make_job():
    """Register test jobs under fresh names; unregistered after the test."""
    names: list[str] = []

    def make(func, *, every: float, lease: float) -> Job:
        name = f"t.job{uuid.uuid4().hex[:10]}"
        jobs.register(name, func, every=every, lease=lease)
        names.append(name)
        return registry.get(name)

    yield make
    for name in names:
        registry.unregister(name)


def pid_of(runner: str) -> int:
    return int(runner.rsplit(":", 1)[1])


def run_until_settled(job: Job, tick: int, timeout: float = 15.0) -> list[TickResult]:
    """This process as a runner: sleep until the runner's next wake (a lease end), run what is due."""
    runner = Runner([job])
    results: list[TickResult] = []
    deadline = time.monotonic() + timeout
    while not JobRun.objects.filter(job=job.name, tick=tick).exclude(outcome__in=JobRun.ACTIVE).exists():
        assert time.monotonic() < deadline, f"tick {tick} not settled within {timeout}s"
        results += runner.run_due(now=job.tick_start(tick))
        time.sleep(max(0.0, min(runner.next_wake - time.time(), 1.0)))
    return results


# --- the scheduler over many ticks -------------------------------------------------------
def _scheduler(job: Job, ticks: int) -> int:
    Runner([job]).run(ticks=ticks)
    return os.getpid()


@pytest.mark.slow
def test_four_runners_run_every_tick_exactly_once(make_job, effects):
    job = make_job(record, every=0.2, lease=2.0)
    pids = run_processes(_scheduler, [(job, 30)] * 4, timeout=60)

    runs = list(JobRun.objects.filter(job=job.name).order_by("tick"))
    ticks = [r.tick for r in runs]
    assert len(ticks) >= 30
    assert ticks == list(range(ticks[0], ticks[-1] + 1)), "a tick is missing (or claimed twice)"
    assert {r.outcome for r in runs} == {JobRun.OK}
    assert {pid_of(r.runner) for r in runs} <= set(pids)

    done = effect_rows(job.name)
    assert Counter(t for t, _ in done) == Counter(ticks), "a tick's effect is missing or doubled"
    assert dict(done) == {r.tick: pid_of(r.runner) for r in runs}, "an effect came from a runner without the tick"


# --- faults: a runner killed, a runner paused ----------------------------------------------
def _run_once(queue) -> None:
    connections.close_all()
    try:
        queue.put([(r.outcome, r.tick) for r in Runner().run_due()])
    finally:
        connections.close_all()


def _victim_job(hang, started, go):
    """The job: record, then (while `hang` is set) tell the test and wait to be released."""

    def func(ctx: JobContext) -> str:
        detail = record(ctx)
        if hang.is_set():
            started.set()
            go.wait(60)
        return detail

    return func


def _start_victim(job: Job, started):
    connections.close_all()
    queue = FORK.Queue()
    proc = FORK.Process(target=_run_once, args=(queue,))
    proc.start()
    assert started.wait(15), "the victim runner never started the job"
    run = JobRun.objects.get(job=job.name)
    assert pid_of(run.runner) == proc.pid and run.outcome == JobRun.RUNNING
    return proc, queue, run


@pytest.fixture
def only_registered():
    """Runner() runs every registered job: keep the built-in ones (locks.prune, and the apps' own,
    e.g. shop.expire_unpaid) out of the fault tests."""
    builtins = registry.all()
    for job in builtins:
        registry.unregister(job.name)
    yield
    for job in builtins:
        jobs.register(job.name, job.func, every=job.every, lease=job.lease, atomic=job.atomic,
                      catch_up=job.catch_up)


def test_a_killed_runner_is_taken_over_after_its_lease(make_job, effects, only_registered):
    hang, started, go = FORK.Event(), FORK.Event(), FORK.Event()
    hang.set()
    job = make_job(_victim_job(hang, started, go), every=3600, lease=1.0)
    proc, _, before = _start_victim(job, started)

    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    hang.clear()
    results = run_until_settled(job, before.tick)

    assert [(r.outcome, r.took_over) for r in results if r.outcome != "busy"] == [(JobRun.OK, True)]
    run = JobRun.objects.get(job=job.name)
    assert run.outcome == JobRun.OK and pid_of(run.runner) == os.getpid()
    assert run.takeovers == 1 and run.taken_over_from == f"{before.runner} (fence {before.fence})"
    assert run.fence > before.fence
    assert run.started_at >= before.lease_until, "taken over before the dead runner's lease ended"
    # The victim's uncommitted write died with it; the tick's one effect is the taker's.
    assert effect_rows(job.name) == [(before.tick, os.getpid())]
    assert Runner([job]).run_due(now=job.tick_start(before.tick)) == [], "a settled tick ran again"


def test_a_paused_runner_cannot_record_after_a_takeover(make_job, effects, only_registered):
    hang, started, go = FORK.Event(), FORK.Event(), FORK.Event()
    hang.set()
    job = make_job(_victim_job(hang, started, go), every=3600, lease=1.0)
    proc, queue, before = _start_victim(job, started)

    os.kill(proc.pid, signal.SIGSTOP)
    try:
        hang.clear()
        results = run_until_settled(job, before.tick)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert [(r.outcome, r.took_over) for r in results if r.outcome != "busy"] == [(JobRun.OK, True)]
    taker = JobRun.objects.get(job=job.name)

    go.set()  # the victim wakes, its job returns, its fenced write finds 0 rows
    assert queue.get(timeout=30) == [("lost", before.tick)]
    proc.join(10)
    assert proc.exitcode == 0

    run = JobRun.objects.get(job=job.name)
    assert (run.runner, run.fence, run.outcome, run.detail) == (taker.runner, taker.fence, JobRun.OK,
                                                               f"pid {os.getpid()}")
    assert run.finished_at == taker.finished_at, "the late runner rewrote the result"
    # Its effect was written in the job's transaction, which rolled back with the refused result.
    assert effect_rows(job.name) == [(before.tick, os.getpid())]


# --- the claim itself ----------------------------------------------------------------------
def _claim(job: Job, tick: int, fence: int) -> bool:
    return Runner([job])._claim(job, tick, fence) is not None


def test_the_unique_key_lets_one_runner_claim_a_tick_even_without_the_lock(make_job):
    """What if the Redis lock failed us (lost data, failover): the INSERT is still the last word."""
    job = make_job(record, every=3600, lease=60.0)
    claimed = run_processes(_claim, [(job, 7, fence) for fence in range(100, 104)])
    assert sorted(claimed) == [False, False, False, True]
    assert JobRun.objects.filter(job=job.name, tick=7).count() == 1


def test_a_takeover_needs_a_newer_fence_and_an_ended_lease(make_job):
    job = make_job(record, every=3600, lease=60.0)
    runner = Runner([job])
    first = runner._claim(job, 1, fence=100)
    assert first is not None
    assert runner._claim(job, 1, fence=200) is None  # lease not over
    JobRun.objects.filter(pk=first.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert runner._claim(job, 1, fence=50) is None  # an older fence never takes over
    taken = runner._claim(job, 1, fence=200)
    assert taken is not None and taken.outcome == JobRun.TAKEN_OVER and taken.takeovers == 1


# --- outcomes ------------------------------------------------------------------------------
def _fails(ctx: JobContext) -> None:
    record(ctx)
    raise ValueError("boom")


def test_a_failing_job_records_its_error_once_and_its_writes_roll_back(make_job, effects):
    job = make_job(_fails, every=3600, lease=5.0)
    runner = Runner([job])
    now = job.tick_start(42)
    [result] = runner.run_due(now=now)
    assert (result.outcome, result.tick, result.detail) == (JobRun.ERROR, 42, "ValueError: boom")
    run = JobRun.objects.get(job=job.name, tick=42)
    assert run.outcome == JobRun.ERROR and "ValueError: boom" in run.error and run.duration is not None
    assert effect_rows(job.name) == []
    assert Runner([job]).run_due(now=now) == [], "an errored tick is settled: it does not run again"


def test_a_runner_catches_up_ticks_it_slept_through(make_job, effects):
    job = make_job(record, every=10, lease=5.0)
    runner = Runner([job])
    assert [r.tick for r in runner.run_due(now=100)] == [10]
    assert [r.tick for r in runner.run_due(now=135)] == [11, 12, 13]
    assert runner.next_wake == 140
    assert runner.run_due(now=136) == []


def test_refuses_to_run_inside_a_transaction(make_job):
    from django.db import transaction

    job = make_job(record, every=10, lease=5.0)
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside any transaction"):
        Runner([job]).run_due()


def test_registration_rules(make_job):
    job = make_job(record, every=10, lease=5.0)
    with pytest.raises(ValueError, match="already registered"):
        jobs.register(job.name, _fails, every=10)
    with pytest.raises(ValueError):
        jobs.register("has space", record, every=10)
    with pytest.raises(ValueError):
        jobs.register("t.zero", record, every=0)
    assert registry.get("locks.prune").every == 3600


# --- idle runs: counted, not kept (issue 37) ------------------------------------------------
def test_idle_runs_are_counted_and_their_rows_not_kept_while_busy_and_failed_runs_are(make_job):
    """A 5-second job wrote ~17,000 rows a day, nearly all "sent 0", kept 30 days. Now an idle
    run's row is deleted and counted once no runner can look at its tick again (catch_up ticks
    and CLOCK_SKEW back); runs that did something or failed keep theirs."""
    from locks.models import JobIdleRuns

    outcome = {}

    def sometimes(ctx: JobContext):
        if outcome.get(ctx.tick) == "boom":
            raise ValueError("boom")
        return outcome.get(ctx.tick) or jobs.Idle("sent 0")

    job = make_job(sometimes, every=5, lease=5.0)
    runner = Runner([job])
    window = job.catch_up + math.ceil(jobs.CLOCK_SKEW / job.every)  # ticks a runner may still look at
    outcome.update({3: "sent 2", 4: "boom"})
    ticks = range(1, 2 * window + 11)
    for tick in ticks:
        result = runner.run_tick(job, tick)
        assert result.outcome in ("ok", "error") and result.idle == (tick not in (3, 4)), result
    last = ticks[-1]
    kept = dict(JobRun.objects.filter(job=job.name).values_list("tick", "outcome"))
    assert kept[3] == "ok" and kept[4] == "error"  # what did something or failed stays
    idle_kept = sorted(t for t in kept if t not in (3, 4))
    assert idle_kept == list(range(last - window, last + 1)), (idle_kept[:3], idle_kept[-3:])
    counted = JobIdleRuns.objects.get(job=job.name)
    assert counted.runs == len(ticks) - 2 - len(idle_kept)
    assert counted.last_at == JobRun.objects.filter(job=job.name, tick=idle_kept[0]).get().due_at - timedelta(
        seconds=job.every)
    # Each tick ran once, idle or not: a folded tick is never run again by a runner.
    assert Runner([job]).run_due(now=job.tick_start(last)) == []


def test_the_job_runs_page_shows_each_jobs_idle_runs(make_job):
    from locks.models import JobIdleRuns

    job = make_job(lambda ctx: jobs.Idle("nothing"), every=5, lease=5.0)
    runner = Runner([job])
    for tick in (1, 2):
        runner.run_tick(job, tick)
    JobIdleRuns.objects.filter(job=job.name).update(runs=17_000)
    admin = get_user_model().objects.create_superuser("jobs-admin", "j@example.com", "pw")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/locks/jobrun/").content.decode()
    summary = page[page.index('id="job-idle-runs"'):]
    summary = summary[:summary.index("</table>")]
    row = re.search(rf"<td>{re.escape(job.name)}</td>\s*<td[^>]*>([\d,]+)</td>", summary)
    assert row and row.group(1).replace(",", "") == str(17_000 + 2), summary


# --- the locks app's own job ---------------------------------------------------------------
def test_prune_drops_old_runs_and_expired_families(make_job):
    old = timezone.now() - timedelta(days=31)
    kept = timezone.now() - timedelta(days=1)
    for tick, due in ((1, old), (2, kept)):
        JobRun.objects.create(job="t.old", tick=tick, due_at=due, runner="h:1", fence=1, started_at=due,
                              lease_until=due, outcome=JobRun.OK)
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    gone, live = f"t:gone{uuid.uuid4().hex[:8]}", f"t:live{uuid.uuid4().hex[:8]}"
    client.sadd(families_key(), gone, live)
    client.hset(stats_key(live), "acquired", 1)

    [result] = Runner([registry.get("locks.prune")]).run_due()
    assert result.outcome == JobRun.OK, result
    assert list(JobRun.objects.filter(job="t.old").values_list("tick", flat=True)) == [2]
    members = {m.decode() for m in client.smembers(families_key())}
    assert live in members and gone not in members
    assert result.detail.startswith("1 old runs, ") and "expired families" in result.detail


# --- admin ---------------------------------------------------------------------------------
def test_admin_lists_runs_read_only_for_staff_who_may_view_them(make_job):
    from django.contrib.auth.models import Permission

    job = make_job(record, every=3600, lease=5.0)
    Runner([job])._claim(job, 5, fence=1)
    staff = get_user_model().objects.create_user("watcher", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/locks/jobrun/").status_code == 403  # is_staff alone is not enough
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="locks", codename="view_jobrun"))
    page = client.get("/admin/locks/jobrun/")
    assert page.status_code == 200 and job.name in page.content.decode()
    filtered = client.get(f"/admin/locks/jobrun/?outcome__exact=running&job={job.name}")
    assert filtered.status_code == 200 and job.name in filtered.content.decode()
    assert client.get("/admin/locks/jobrun/add/").status_code == 403
    outsider = get_user_model().objects.create_user("outsider", password="pw")
    client.force_login(outsider)
    assert client.get("/admin/locks/jobrun/").status_code == 302
