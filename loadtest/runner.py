"""Run a strategy from many OS processes, started together, and record every request.

Why processes, not threads: the GIL would serialise the clients and hide the races we want to
provoke. Every worker is forked (so it inherits the settings, including a test database
name), opens its own MySQL and Redis connections, waits at a barrier with the others and the
parent, then records (start, end, outcome, SQL queries, lock acquisitions) for each request.
`time.monotonic()` is one system-wide clock on Linux, so the records of all processes line up.

A run is one or more phases (the sell-out storm is "sell until sold out", then "storm").
Between phases every worker waits at the barrier while the parent reads the server-side
counters (MySQL status, lock statistics), so a phase's deltas belong to that phase alone.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from threading import BrokenBarrierError

from django.db import OperationalError, connection, connections

from loadtest import cpu, strategies
from loadtest.strategies import OUTCOMES, Options
from locks import inspect as lock_inspect
from locks import stats as lock_stats
from locks.conf import locks_settings

FORK = multiprocessing.get_context("fork")
STALL_TIMEOUT = 120.0  # seconds without a finished request before the run is declared hung
MAX_ERROR_MESSAGES = 20

# One request: (start, end, outcome index in OUTCOMES, SQL queries, lock acquisitions).
Record = tuple[float, float, int, int, int]


class RunError(Exception):
    """A worker crashed or the run hung; the message carries the worker's traceback."""


@dataclass
class Phase:
    """`requests` in all (shared by the workers), or `duration` seconds, or until sold out."""

    name: str
    requests: int | None = None
    duration: float | None = None
    until_sold_out: bool = False
    max_duration: float = 300.0  # a safety stop for until_sold_out phases

    def __post_init__(self) -> None:
        if self.requests is None and self.duration is None and not self.until_sold_out:
            raise ValueError("a phase needs requests, a duration, or until_sold_out")


@dataclass
class Plan:
    strategy: str
    options: Options
    processes: int
    product_ids: list[int]
    user_ids: list[int]
    phases: list[Phase]
    quantity: tuple[int, int] = (1, 1)
    lines_per_order: int = 1
    lock_names: list[str] = field(default_factory=list)  # the service's lock names, for its stats
    cpu_profile: str | None = None  # a directory: each worker writes its cProfile (CPU clock) there
    app_groups: list[int] = field(default_factory=list)  # app servers' process groups, for their CPU
    users_in_order: bool = False  # request k is made by user k mod users (each user in turn), not at random
    seed: int = 0


@dataclass
class Progress:
    phase: Phase
    elapsed: float
    counts: dict[str, int]

    @property
    def done(self) -> int:
        return sum(self.counts.values())


@dataclass
class PhaseRun:
    phase: Phase
    records: list[list[Record]]  # per worker
    server_before: dict[str, float]
    server_after: dict[str, float]
    client_cpu: float = 0.0  # CPU seconds the workers used in this phase (all of them)
    rejected: dict[str, int] = field(default_factory=dict)  # business refusals by error code, all workers

    @property
    def server_delta(self) -> dict[str, float]:
        return {k: self.server_after.get(k, 0) - v for k, v in self.server_before.items()}


@dataclass
class RunResult:
    plan: Plan
    phases: list[PhaseRun]
    order_ids: list[int]  # every order a worker saw placed
    errors: list[str]  # the first few unexpected exceptions, as text
    servers: dict[str, dict[str, int]] = field(default_factory=dict)  # http: outcomes per app server URL


@dataclass
class _WorkerResult:
    index: int
    phases: list[list[Record]]
    order_ids: list[int]
    errors: list[str]
    servers: dict[str, dict[str, int]] = field(default_factory=dict)
    cpu: list[float] = field(default_factory=list)  # CPU seconds per phase
    rejected: list[dict[str, int]] = field(default_factory=list)  # per phase: refusals by code


# --- server-side counters -------------------------------------------------------------------
MYSQL_STATUS = ("Questions", "Com_select", "Com_update", "Com_insert")


def server_counters(lock_names: list[str], app_groups: list[int] | None = None) -> dict[str, float]:
    """MySQL global status (server-wide: includes other clients), the service's lock counters,
    and the CPU the local mysqld and Redis (and the app servers of `app_groups`) used so far
    (loadtest/cpu.py).

    Lock acquisitions are the names' counts among their families' busiest names (exact while a
    run locks at most LOCKS["STATS_TOP_N"] names of a family); workers flush their lock stats
    before they report a phase finished, so the counts are complete when this is read.
    """
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS WHERE Variable_name IN (%s, %s, %s, %s)", list(MYSQL_STATUS))
        out = {f"mysql_{name.lower()}": int(value) for name, value in cursor.fetchall()}
    out["lock_acquired"] = sum(lock_inspect.acquisitions(lock_names).values())
    return {**out, **cpu.server_cpu_ms(app_groups)}


# --- the worker -----------------------------------------------------------------------------
def _pick(rng: random.Random, plan: Plan, ticket: int) -> tuple[int, list[tuple[int, int]]]:
    products = rng.sample(plan.product_ids, plan.lines_per_order) if plan.product_ids else []
    lines = sorted((pid, rng.randint(*plan.quantity)) for pid in products)
    user = plan.user_ids[ticket % len(plan.user_ids)] if plan.users_in_order else rng.choice(plan.user_ids)
    return user, lines


def _worker(index: int, plan: Plan, barrier, counts, issued, finished, results) -> None:
    rng = random.Random(plan.seed * 1000 + index)
    width = len(OUTCOMES)
    queries = 0

    def count_queries(execute, sql, params, many, context):
        nonlocal queries
        queries += 1
        return execute(sql, params, many, context)

    out = _WorkerResult(index=index, phases=[], order_ids=[], errors=[])
    strategy = None
    profiler = cpu.start_profile() if plan.cpu_profile else None
    try:
        strategy = strategies.get(plan.strategy)(dataclasses.replace(plan.options, worker=index))
        with connection.execute_wrapper(count_queries):
            for phase in plan.phases:
                barrier.wait(timeout=STALL_TIMEOUT)
                cpu_start = cpu.process_cpu()
                strategy.rejected.clear()
                records: list[Record] = []
                deadline = time.monotonic() + (phase.duration if phase.duration is not None else phase.max_duration)
                ticket = index
                while time.monotonic() < deadline:
                    if phase.requests is not None:
                        with issued.get_lock():
                            ticket = issued.value
                            if ticket >= phase.requests:
                                break
                            issued.value += 1
                    user_id, lines = _pick(rng, plan, ticket)
                    q0, a0 = queries, strategy.acquisitions
                    start = time.monotonic()
                    try:
                        outcome, order_id = strategy.place(user_id, lines)
                    except Exception as exc:  # recorded, never fatal: the run must finish and be checked
                        busy = strategies.is_busy_error(exc)
                        outcome, order_id = (strategies.BUSY if busy else strategies.ERROR), None
                        if outcome == strategies.ERROR and len(out.errors) < MAX_ERROR_MESSAGES:
                            out.errors.append(f"{type(exc).__name__}: {exc}")
                        if isinstance(exc, OperationalError):
                            connection.close()  # maybe broken; the next query reconnects
                    end = time.monotonic()
                    code = OUTCOMES.index(outcome)
                    records.append((start, end, code, queries - q0, strategy.acquisitions - a0))
                    counts[index * width + code] += 1
                    if order_id is not None:
                        out.order_ids.append(order_id)
                    if phase.until_sold_out and outcome == strategies.OUT_OF_STOCK:
                        break
                    ticket += plan.processes  # used when timed: tickets interleave across workers
                out.phases.append(records)
                out.cpu.append(cpu.process_cpu() - cpu_start)
                out.rejected.append(dict(strategy.rejected))
                lock_stats.flush()  # the parent reads the lock counters once every worker is done
                with finished.get_lock():
                    finished.value += 1
        out.servers = getattr(strategy, "servers", {})
        if profiler is not None:
            cpu.save_profile(profiler, plan.cpu_profile, index)
        results.put(out)
    except BrokenBarrierError:
        pass  # the parent gave up on the run
    except BaseException:
        results.put(RunError(f"worker {index} crashed:\n{traceback.format_exc()}"))
    finally:
        if strategy is not None:
            strategy.close()
        connections.close_all()


# --- the parent -----------------------------------------------------------------------------
class _Workers:
    """The forked workers and what they reported; any crash surfaces as `RunError`."""

    def __init__(self, plan: Plan) -> None:
        n = plan.processes
        self.barrier = FORK.Barrier(n + 1)
        self.counts = FORK.Array("q", n * len(OUTCOMES), lock=False)
        self.issued = FORK.Value("q", 0)
        self.finished = FORK.Value("i", 0)
        self.queue = FORK.Queue()
        self.procs = [FORK.Process(target=_worker, daemon=True, args=(
            i, plan, self.barrier, self.counts, self.issued, self.finished, self.queue)) for i in range(n)]
        self.reported: list[_WorkerResult] = []

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def check(self, block: float = 0.0) -> None:
        """Collect what the workers put on the queue; raise if one crashed or died."""
        try:
            while True:
                item = self.queue.get(timeout=block) if block else self.queue.get_nowait()
                if isinstance(item, RunError):
                    raise item
                self.reported.append(item)
                block = 0.0
        except queue.Empty:
            pass
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        if dead:
            raise RunError(f"worker process {dead[0].pid} died with exit code {dead[0].exitcode}")

    def totals(self, base: list[int]) -> dict[str, int]:
        width, n = len(OUTCOMES), len(self.procs)
        return {o: sum(self.counts[w * width + k] - base[w * width + k] for w in range(n))
                for k, o in enumerate(OUTCOMES)}

    def release_together(self) -> None:
        """Wait until every worker waits at the barrier, then pass it with them: all start at once."""
        deadline = time.monotonic() + STALL_TIMEOUT
        while self.barrier.n_waiting < len(self.procs):
            self.check()
            if time.monotonic() > deadline:
                raise RunError("the workers did not reach the start line")
            time.sleep(0.01)
        self.barrier.wait(timeout=STALL_TIMEOUT)

    def stop(self) -> None:
        self.barrier.abort()
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def join(self) -> None:
        for p in self.procs:
            p.join(timeout=10)
        self.queue.close()


def run(plan: Plan, progress: Callable[[Progress], None] | None = None, interval: float = 0.25) -> RunResult:
    """Fork `plan.processes` workers, run every phase, and collect their records."""
    if plan.processes < 1:
        raise ValueError("at least one process")
    if plan.product_ids and not 1 <= plan.lines_per_order <= len(plan.product_ids):
        raise ValueError("lines per order must be between 1 and the number of products")
    connections.close_all()  # never share a MySQL socket with the children
    workers = _Workers(plan)
    workers.start()
    n = plan.processes
    phase_runs: list[tuple[Phase, dict[str, float], dict[str, float]]] = []
    try:
        for number, phase in enumerate(plan.phases):
            before = server_counters(plan.lock_names, plan.app_groups)
            workers.issued.value = 0
            base = list(workers.counts)
            workers.release_together()
            started = last_change = time.monotonic()
            last_done = -1
            while workers.finished.value < n * (number + 1):
                workers.check(block=interval)
                now = time.monotonic()
                totals = workers.totals(base)
                done = sum(totals.values())
                if done != last_done:
                    last_done, last_change = done, now
                elif now - last_change > STALL_TIMEOUT:
                    raise RunError(f"no request finished for {STALL_TIMEOUT:.0f} s: the run hung")
                if progress is not None:
                    progress(Progress(phase=phase, elapsed=now - started, counts=totals))
            if progress is not None:
                progress(Progress(phase=phase, elapsed=time.monotonic() - started, counts=workers.totals(base)))
            # The servers' CPU as the phase ends, not also their idle time in the wait below.
            ended = cpu.server_cpu_ms(plan.app_groups)
            if plan.strategy == "http":
                # The server's processes flush their lock counters every STATS_FLUSH_INTERVAL from
                # a thread; read the phase's counters once its last acquisitions have landed, or
                # they count in the next phase (a sell-out's last orders in the storm).
                time.sleep(1.5 * float(locks_settings.STATS_FLUSH_INTERVAL))
            phase_runs.append((phase, before, {**server_counters(plan.lock_names, plan.app_groups), **ended}))
        deadline = time.monotonic() + STALL_TIMEOUT
        while len(workers.reported) < n:
            workers.check(block=0.5)
            if time.monotonic() > deadline:
                raise RunError("a worker never reported its results")
    except BaseException:
        workers.stop()
        raise
    finally:
        workers.join()
    reported = sorted(workers.reported, key=lambda r: r.index)
    return RunResult(
        plan=plan,
        phases=[PhaseRun(phase=ph, records=[w.phases[i] for w in reported], server_before=b, server_after=a,
                         client_cpu=sum(w.cpu[i] for w in reported),
                         rejected=_add(w.rejected[i] for w in reported))
                for i, (ph, b, a) in enumerate(phase_runs)],
        order_ids=[oid for w in reported for oid in w.order_ids],
        errors=[e for w in reported for e in w.errors][:MAX_ERROR_MESSAGES],
        servers=_merge_servers(w.servers for w in reported),
    )


def _add(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by code added up over the workers, the most frequent first."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total.most_common())


def _merge_servers(per_worker) -> dict[str, dict[str, int]]:
    """Every worker's outcomes per app server, added up (http with several servers)."""
    out: dict[str, dict[str, int]] = {}
    for servers in per_worker:
        for url, counts in servers.items():
            total = out.setdefault(url, dict.fromkeys(OUTCOMES, 0))
            for outcome, n in counts.items():
                total[outcome] += n
    return dict(sorted(out.items()))
