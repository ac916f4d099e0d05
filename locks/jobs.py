"""Scheduled jobs that run exactly once per tick in the whole cluster (invariant I8).

    from locks import jobs

    @jobs.register("shop.expire_unpaid", every=60, lease=30)
    def expire_unpaid(ctx: jobs.JobContext) -> str:
        ...                      # ctx.tick, ctx.fence, ctx.check()
        return "expired 3 orders"   # stored as the run's detail

`manage.py run_jobs` runs on every app server. A job's *tick* is floor(unix time / every); for
each tick that is due, a runner

1. takes the job's lock (`Lock("job:<name>", ttl=lease, renew=True)`, without waiting: a busy
   lock means another runner is on it);
2. claims the tick by INSERTing the unique row (job, tick) of `JobRun`. The unique key is the
   last word: even if the Redis lock was lost, two runners can never both claim a tick;
3. runs the job (by default inside one transaction with step 4, so the job's own database
   writes commit only together with its result);
4. records the result with a *fenced* UPDATE (`WHERE fence = ctx.fence`). A runner that was
   paused past its lease and taken over finds 0 rows: it records nothing (`TickLost`) and its
   transaction rolls back.

A runner that dies mid-run leaves a running row. Once its lease has ended (and so has its Redis
lock, which only a live runner renews), another runner takes the tick over with a conditional
UPDATE on the old fence, under a newer fence. A tick is never completed twice.

Each runner also runs the ticks it missed while it was alive (a pause, a slow job), up to
`catch_up` ticks back; ticks that passed while no runner was alive are not back-filled.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from locks.conf import locks_settings
from locks.exceptions import LockLost, LockNotOwned, LockUnavailable
from locks.hold import Hold
from locks.keys import validate_name
from locks.lock import Lock
from locks.models import JobIdleRuns, JobRun

log = logging.getLogger("locks.jobs")

JobFunc = Callable[["JobContext"], Any]

# An idle run's row is deleted (and counted) once its tick is this much older than the oldest a
# runner still looks at (catch_up ticks back): a runner whose clock is behind by less cannot run
# the tick again for want of its row.
CLOCK_SKEW = 300.0


class Idle(str):
    """What a job returns when its tick found nothing to do ("sent 0"): the run is recorded as
    idle, `run_jobs` says nothing of it (unless -v 2), and its row is later folded into the
    job's JobIdleRuns count instead of being kept for 30 days."""


class TickLost(LockLost):
    """Another runner took this tick over (we were paused or slow past the lease): nothing of
    ours was recorded."""


@dataclass(frozen=True)
class Job:
    name: str
    func: JobFunc
    every: float
    lease: float
    atomic: bool = True
    catch_up: int = 100

    def tick_at(self, unix_time: float) -> int:
        return math.floor(unix_time / self.every)

    def tick_start(self, tick: int) -> float:
        return tick * self.every

    @property
    def lock_name(self) -> str:
        return f"job:{self.name}"


@dataclass
class JobContext:
    """What a running job knows: which tick, and the fence its writes may carry."""

    job: Job
    tick: int
    fence: int
    runner: str
    hold: Hold = field(repr=False)

    @property
    def due_at(self) -> datetime:
        return datetime.fromtimestamp(self.job.tick_start(self.tick), tz=UTC)

    def check(self, margin: float = 0.0) -> None:
        """Raise `LockLost` unless we still hold the job's lock; call before slow steps."""
        self.hold.check(margin)


class Registry:
    """The jobs known to this process; apps register theirs in `AppConfig.ready()`."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._guard = threading.Lock()

    @overload
    def register(self, name: str, func: None = None, *, every: float, lease: float | None = None,
                 atomic: bool = True, catch_up: int = 100) -> Callable[[JobFunc], JobFunc]: ...

    @overload
    def register(self, name: str, func: JobFunc, *, every: float, lease: float | None = None,
                 atomic: bool = True, catch_up: int = 100) -> JobFunc: ...

    def register(self, name: str, func: JobFunc | None = None, *, every: float, lease: float | None = None,
                 atomic: bool = True, catch_up: int = 100) -> Callable[[JobFunc], JobFunc] | JobFunc:
        """`register(name, func, every=)`, or `@register(name, every=)` as a decorator.

        `lease`: how long a runner may go silent before its tick is taken over (default: every,
        at most 300 s). `atomic`: run the job and record its result in one transaction; pass
        False for long jobs that commit as they go (and fence their own writes with ctx.fence).
        """
        validate_name(f"job:{name}")
        if not every > 0 or not math.isfinite(every):
            raise ValueError(f"job {name!r}: every must be a positive number of seconds")
        lease = min(float(every), 300.0) if lease is None else float(lease)
        if not lease > 0:
            raise ValueError(f"job {name!r}: lease must be positive")

        def add(f: JobFunc) -> JobFunc:
            with self._guard:
                known = self._jobs.get(name)
                if known is not None and known.func is not f:
                    raise ValueError(f"a job named {name!r} is already registered")
                self._jobs[name] = Job(name, f, float(every), lease, atomic, catch_up)
            return f

        return add if func is None else add(func)

    def unregister(self, name: str) -> None:
        with self._guard:
            self._jobs.pop(name, None)

    def get(self, name: str) -> Job:
        try:
            return self._jobs[name]
        except KeyError:
            raise KeyError(f"no job named {name!r} (registered: {', '.join(sorted(self._jobs)) or 'none'})") from None

    def all(self) -> list[Job]:
        with self._guard:
            return sorted(self._jobs.values(), key=lambda j: j.name)


registry = Registry()
register = registry.register


@dataclass(frozen=True)
class TickResult:
    """What a runner did with one tick: ran it (ok/error), lost it, or left it to another."""

    job: str
    tick: int
    outcome: str  # ok, error, lost (taken over from us), busy (another runner has it), done (by another)
    took_over: bool = False
    detail: str = ""
    idle: bool = False  # ok, and the job found nothing to do (it returned `Idle`)


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _aware(unix_time: float) -> datetime:
    return datetime.fromtimestamp(unix_time, tz=UTC)


class Runner:
    """Runs the due ticks of some jobs (default: all registered). One per process.

    Times come from this host's clock (ticks and leases alike): keep the servers' clocks in
    sync (NTP); a skewed clock can only make a tick late or a takeover early, and the fence
    keeps an early takeover from ever recording twice.
    """

    def __init__(self, jobs: Iterable[Job] | None = None) -> None:
        self._fixed = None if jobs is None else list(jobs)
        self._low: dict[str, int] = {}  # per job: the oldest tick this runner still watches
        self._wake: float = 0.0

    @property
    def jobs(self) -> list[Job]:
        return registry.all() if self._fixed is None else self._fixed

    # -- scheduling ------------------------------------------------------------------------
    def run_due(self, now: float | None = None) -> list[TickResult]:
        """Run every due tick not yet settled (oldest first); sets `next_wake`."""
        if connection.in_atomic_block:
            raise RuntimeError("run jobs outside any transaction: a tick's claim must commit at once")
        now = time.time() if now is None else now
        results: list[TickResult] = []
        wake = math.inf
        for job in self.jobs:
            current = job.tick_at(now)
            low = max(self._low.setdefault(job.name, current), current - job.catch_up + 1)
            rows = {r.tick: r for r in JobRun.objects.filter(job=job.name, tick__gte=low, tick__lte=current)}
            unsettled: list[int] = []
            for tick in range(low, current + 1):
                row = rows.get(tick)
                if row is not None and row.outcome not in JobRun.ACTIVE:
                    continue
                if row is not None and row.lease_until.timestamp() > time.time():
                    unsettled.append(tick)  # another runner is on it: look again when its lease ends
                    wake = min(wake, row.lease_until.timestamp())
                    continue
                result = self.run_tick(job, tick)
                if result.outcome != "done":
                    results.append(result)
                if result.outcome in ("busy", "lost"):
                    unsettled.append(tick)
                    wake = min(wake, time.time() + job.lease)
            self._low[job.name] = unsettled[0] if unsettled else current + 1
            wake = min(wake, job.tick_start(current + 1))
        self._wake = wake
        return results

    @property
    def next_wake(self) -> float:
        """The unix time when something may next be due (a new tick, or a lease that ends)."""
        return self._wake

    def run(self, *, ticks: int | None = None, stop: threading.Event | None = None,
            on_result: Callable[[TickResult], None] | None = None) -> None:
        """Run due ticks until `stop` is set, or after `ticks` passes that began a new tick.

        Sleeps until the next tick or lease end; never polls.
        """
        stop = stop or threading.Event()
        seen: dict[str, int] = {}
        passes = 0
        while not stop.is_set():
            now = time.time()
            current = {job.name: job.tick_at(now) for job in self.jobs}
            new_tick = any(seen.get(name) != tick for name, tick in current.items())
            seen = current
            for result in self.run_due(now):
                if on_result is not None:
                    on_result(result)
            if new_tick:
                passes += 1
                if ticks is not None and passes >= ticks:
                    return
            # +1 ms: wake just after the boundary, not a hair before it.
            stop.wait(max(0.0, self.next_wake - time.time() + 0.001) if self.jobs else 60.0)

    # -- one tick --------------------------------------------------------------------------
    def run_tick(self, job: Job, tick: int) -> TickResult:
        """Take the job's lock, claim the tick (or take it over), run it, record the result."""
        lock = Lock(job.lock_name, ttl=job.lease, renew=True,
                    max_hold=max(job.lease, float(locks_settings.MAX_HOLD)))
        try:
            # A short wait: runners that race for the same tick take turns (the loser then sees
            # it done), while a long-running holder does not stall this runner's other jobs.
            if not lock.acquire(wait=min(job.lease, 1.0)):
                return TickResult(job.name, tick, "busy")
        except LockUnavailable:
            log.warning("job %s: Redis unreachable, tick %s not run", job.name, tick, exc_info=True)
            return TickResult(job.name, tick, "busy")
        hold = lock.held
        assert hold is not None
        try:
            run = self._claim(job, tick, hold.fence)
            if run is None:  # another runner has it: still running (busy), or done
                active = JobRun.objects.filter(job=job.name, tick=tick, outcome__in=JobRun.ACTIVE).exists()
                return TickResult(job.name, tick, "busy" if active else "done")
            return self._execute(job, run, hold)
        finally:
            with suppress(LockNotOwned, LockUnavailable):
                lock.release()

    def _claim(self, job: Job, tick: int, fence: int) -> JobRun | None:
        """INSERT the tick's row, or take over a running row whose lease ended; None if neither."""
        me = runner_id()
        now = timezone.now()
        lease_until = now + timedelta(seconds=job.lease)
        try:
            with transaction.atomic():
                return JobRun.objects.create(
                    job=job.name, tick=tick, due_at=_aware(job.tick_start(tick)), runner=me, fence=fence,
                    started_at=now, lease_until=lease_until, outcome=JobRun.RUNNING,
                )
        except IntegrityError:
            pass
        row = JobRun.objects.filter(job=job.name, tick=tick).first()
        if row is None or row.outcome not in JobRun.ACTIVE or row.lease_until >= now or row.fence >= fence:
            return None
        taken = JobRun.objects.filter(
            pk=row.pk, fence=row.fence, outcome__in=JobRun.ACTIVE, lease_until__lt=now,
        ).update(
            runner=me, fence=fence, started_at=now, lease_until=lease_until, outcome=JobRun.TAKEN_OVER,
            takeovers=row.takeovers + 1, taken_over_from=f"{row.runner} (fence {row.fence})",
        )
        if not taken:
            return None
        log.warning("job %s: tick %s taken over from %s (fence %s)", job.name, tick, row.runner, row.fence)
        row.refresh_from_db()
        return row

    def _execute(self, job: Job, run: JobRun, hold: Hold) -> TickResult:
        ctx = JobContext(job=job, tick=run.tick, fence=run.fence, runner=run.runner, hold=hold)
        took_over = run.takeovers > 0 and run.outcome == JobRun.TAKEN_OVER
        started = time.monotonic()
        try:
            if job.atomic:
                with transaction.atomic():
                    returned = job.func(ctx)
                    detail, idle = _text(returned), isinstance(returned, Idle)
                    _finish(run, ctx, JobRun.OK, started, detail=detail, idle=idle)
            else:
                returned = job.func(ctx)
                detail, idle = _text(returned), isinstance(returned, Idle)
                _finish(run, ctx, JobRun.OK, started, detail=detail, idle=idle)
        except LockLost as exc:  # TickLost too: a newer runner has the tick; we record nothing
            log.warning("job %s: tick %s lost (%s); nothing recorded", job.name, run.tick, exc)
            return TickResult(job.name, run.tick, "lost", took_over)
        except Exception:
            error = traceback.format_exc()
            log.error("job %s: tick %s failed\n%s", job.name, run.tick, error)
            try:
                _finish(run, ctx, JobRun.ERROR, started, error=error)
            except TickLost:
                return TickResult(job.name, run.tick, "lost", took_over)
            return TickResult(job.name, run.tick, JobRun.ERROR, took_over, error.strip().splitlines()[-1])
        if idle:
            fold_idle_runs(job, before=run.tick)
        return TickResult(job.name, run.tick, JobRun.OK, took_over, detail, idle)


def fold_idle_runs(job: Job, *, before: int) -> int:
    """Delete the job's idle rows whose tick no runner can look at again (older than `before` by
    catch_up ticks and CLOCK_SKEW), adding them to its JobIdleRuns count in the same
    transaction; returns how many. Rows of runs that did something or failed are kept."""
    oldest_watched = before - job.catch_up - math.ceil(CLOCK_SKEW / job.every)
    JobIdleRuns.objects.get_or_create(job=job.name)
    with transaction.atomic():
        old = JobRun.objects.filter(job=job.name, idle=True, outcome=JobRun.OK, tick__lt=oldest_watched)
        last = old.aggregate(last=Max("due_at"))["last"]
        folded, _ = old.delete()
        if folded:
            JobIdleRuns.objects.filter(job=job.name).update(runs=F("runs") + folded, last_at=last)
    return folded


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _finish(run: JobRun, ctx: JobContext, outcome: str, started: float, *, detail: str = "", error: str = "",
            idle: bool = False) -> None:
    """The fenced write: only the runner that still has the tick's fence records a result."""
    updated = JobRun.objects.filter(pk=run.pk, fence=ctx.fence, outcome__in=JobRun.ACTIVE).update(
        outcome=outcome, finished_at=timezone.now(), duration=time.monotonic() - started, detail=detail, error=error,
        idle=idle,
    )
    if updated != 1:
        raise TickLost(f"tick {ctx.tick} was taken over by a newer runner", name=ctx.job.lock_name)


# --- the locks app's own job -------------------------------------------------------------
KEEP_RUNS = timedelta(days=30)


@register("locks.prune", every=3600, lease=300)
def prune(ctx: JobContext) -> str:
    """Drop job runs older than KEEP_RUNS, families whose stats expired from the families set
    (stats keys expire on their own; the set is refreshed by every flush and keeps them), and the
    MySQL lock backend's rows free for longer than FENCE_TTL (they only keep a fence)."""
    from django_redis import get_redis_connection

    from locks.backends.mysql import prune_free_rows
    from locks.keys import families_key, stats_key

    runs, _ = JobRun.objects.filter(due_at__lt=timezone.now() - KEEP_RUNS).exclude(
        outcome__in=JobRun.ACTIVE).delete()
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    families = sorted(f.decode() if isinstance(f, bytes) else f for f in client.smembers(families_key()))
    pipe = client.pipeline(transaction=False)
    for family in families:
        pipe.exists(stats_key(family))
    gone = [family for family, exists in zip(families, pipe.execute(), strict=True) if not exists]
    if gone:
        client.srem(families_key(), *gone)
    rows = prune_free_rows(free_for=float(locks_settings.FENCE_TTL))
    return f"{runs} old runs, {len(gone)} expired families, {rows} free lock rows"
