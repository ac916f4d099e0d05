"""The fault-injection load test: buyers of one hot product, one real fault, then the verdict.

Several forked buyer processes call `shop.services.place_order` for one product in a loop and
journal every request (start, end, outcome) through a pipe of their own (no shared lock a killed
or stopped buyer could leave taken). A few seconds in, the parent injects one fault, for real:

    kill-holder            SIGKILL a buyer inside its critical section (lock held, row updated)
    pause-holder           SIGSTOP a buyer inside its critical section past its lease, then SIGCONT
    long-pause             the same for 10 s, far past the lock wait: its open MySQL transaction
                           is ended within a second of its lease (shop/plumbing/stale_transactions.py)
    kill-waiter            SIGKILL a buyer while it is queued for the lock (found in the lock's
                           waiters hash in Redis)
    kill-mysql-connection  KILL a buyer's MySQL connection from an admin connection
    restart-redis          the run's Redis (a private redis-server) killed, restarted empty
    freeze-redis           the run's Redis SIGSTOPped for 6 s (longer than the 5 s socket timeout
                           Redis clients often have), then SIGCONTed
    restock-in-pause       the product sells out; the buyer that read "0 left" is SIGSTOPped
                           before writing the sold-out marker, an operator restocks, the buyer wakes

A scenario is a fault plugged into the harness: its `fault` builds a `Fault` (`inject` and
`heal` callables) from the run's `Context`; the harness injects it, waits the fault's length
and heals it. The buyers reach their fault points through the checkout's test hook
(shop/hooks.py). The HTTP harness (loadtest/httpfaults.py) plugs its faults in
the same way and shares the buyers' plumbing, the verdict and the outcome type below.

The verdict (`Liveness.problems`): nothing oversold and I1-I6 hold (the books), and the sale
stayed live: the longest stall (no order placed while stock existed) at most LOCK_WAIT + 1 s,
no request hung longer than that either (the fault's own victim aside), no buyer refused as
sold out while stock existed (after a restock: from 1 s after its COMMIT), no unexpected
errors, and orders placed after the fault healed. While the lock's Redis is away (restart,
freeze) nothing can sell, by design: the stall is measured before the outage and from the
moment it heals. Busy answers (503s: lock or database unavailable, lock wait timeout) are
counted, not failures: they are the retryable answer a fault is allowed to cost.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from django.conf import settings
from django.db import connection, connections
from django.test.utils import override_settings

from loadtest import report
from loadtest import workload as workloads
from loadtest.servers.base import RedisProcess
from loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, PLACED, outcome_of_code
from shop.conf import shop_settings

FORK = multiprocessing.get_context("fork")

# Shared control word: what the next buyer to reach the fault point does.
ARMED_KILL, ARMED_PAUSE, ARMED_PAUSE_BEFORE_MARK = 1, 2, 3
REFUSAL_PAUSE = 0.005  # a refused buyer waits this long before trying again (a real client would)


# --- the plug-in interface (both harnesses) -------------------------------------------------
@dataclass
class Fault:
    """One fault: `inject()` and `heal()` do it and return (a line for the log, the
    time.monotonic() moment it took effect: a kill, not the wait for the exit after it). The
    harness heals the fault's length after the injection. No `heal`: the system heals itself
    (a lease runs out, the remaining servers take over). `outage`: nothing can sell while it
    lasts (the lock service is away), so the stall is measured around it. `inject` raises
    `NotInjected` if the moment never came (no buyer reached the fault point)."""

    inject: Callable[[], tuple[str, float]]
    heal: Callable[[], tuple[str, float]] | None = None
    outage: bool = False


class NotInjected(Exception):
    """The fault could not be injected; the message says why (the verdict fails the run)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fault: Callable[[Any], Fault]  # builds the fault from the harness's context
    redis: bool = False  # runs on a private redis-server the scenario may kill or freeze
    sell_out: bool = False  # small stock: the product sells out, then is restocked
    length: float | None = None  # the fault's length if not FaultConfig.fault_length


@dataclass
class Injection:
    """What happened when the harness applied a fault."""

    faults: int  # 1 if injected, 0 if not
    injected: float  # monotonic
    healed: float  # monotonic; the injection itself if it heals on its own
    notes: list[str]


def apply(fault: Fault, *, length: float, say: Callable[[str], None]) -> Injection:
    """Inject `fault`, and heal it `length` seconds later (if it has a `heal`)."""
    try:
        note, injected = fault.inject()
    except NotInjected as exc:
        now = time.monotonic()
        return Injection(0, now, now, [str(exc)])
    notes = [note]
    say(note)
    healed = injected
    if fault.heal is not None:
        time.sleep(max(injected + length - time.monotonic(), 0))
        note, healed = fault.heal()
        notes.append(note)
        say(note)
    return Injection(1, injected, healed, notes)


def outage(down: Callable[[], object], up: Callable[[], object], *, down_note: str,
           up_note: Callable[[object], str]) -> Fault:
    """A service away for the fault's length: `down()` to inject, `up()` (its result to
    `up_note`) to heal."""

    def inject() -> tuple[str, float]:
        down()
        return down_note, time.monotonic()

    def heal() -> tuple[str, float]:
        return up_note(up()), time.monotonic()

    return Fault(inject=inject, heal=heal, outage=True)


# --- the run's journal and outcome (both harnesses) -----------------------------------------
@dataclass
class Attempt:
    start: float
    end: float
    outcome: str
    order_id: int | None = None
    buyer: int = -1  # index of the buyer process


@dataclass
class Liveness:
    longest_stall: float
    longest_request: float
    refused_in_stock: int
    busy: int
    errors: int
    after_heal: int

    def problems(self, *, stall_limit: float) -> list[str]:
        out = []
        if self.longest_stall > stall_limit:
            out.append(f"stalled {self.longest_stall:.2f} s > {stall_limit:.2f} s")
        if self.longest_request > stall_limit:
            out.append(f"a request hung {self.longest_request:.2f} s > {stall_limit:.2f} s")
        if self.refused_in_stock:
            out.append(f"{self.refused_in_stock} buyers refused as sold out while stock existed")
        if self.errors:
            out.append(f"{self.errors} unexpected errors")
        if not self.after_heal:
            out.append("no order placed after the fault healed")
        return out


def liveness(requests: list[Attempt], *, in_stock: list[tuple[float, float]], healed_at: float,
             grace: float = 0.0, victims: frozenset[int] = frozenset()) -> Liveness:
    """Liveness figures of a journal. `in_stock`: the windows in which stock existed and orders
    could be placed (an outage of the lock's Redis is cut out); refusals in their first `grace`
    seconds are allowed (a restock's marker removal racing the check). The requests of `victims`
    (the buyers the fault stopped) do not count as hung requests."""
    placed = sorted(r.end for r in requests if r.outcome == PLACED)
    stall = 0.0
    for start, end in in_stock:
        points = [start, *(t for t in placed if start < t < end), end]
        stall = max([stall, *(b - a for a, b in itertools.pairwise(points))])
    refused = sum(1 for r in requests if r.outcome == OUT_OF_STOCK
                  and any(start + grace <= r.start and r.end <= end for start, end in in_stock))
    return Liveness(
        longest_stall=stall,
        longest_request=max((r.end - r.start for r in requests if r.buyer not in victims), default=0.0),
        refused_in_stock=refused,
        busy=sum(1 for r in requests if r.outcome == BUSY),
        errors=sum(1 for r in requests if r.outcome == ERROR),
        after_heal=sum(1 for r in requests if r.outcome == PLACED and r.start >= healed_at),
    )


@dataclass
class FaultOutcome:
    scenario: Scenario
    faults: int
    requests: list[Attempt]
    oversold: int
    violations: list[str]
    liveness: Liveness
    stall_limit: float
    notes: list[str] = field(default_factory=list)

    COLUMNS = ("scenario", "faults", "orders", "oversold", "longest stall", "longest request",
               "refused in stock", "busy (503)", "orders after heal", "verdict")

    @property
    def orders(self) -> int:
        return sum(1 for r in self.requests if r.outcome == PLACED)

    @property
    def problems(self) -> list[str]:
        out = list(self.violations)
        if self.oversold:
            out.insert(0, f"oversold by {self.oversold}")
        if not self.faults:
            out.append("the fault was never injected")
        return out + self.liveness.problems(stall_limit=self.stall_limit)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL: " + "; ".join(self.problems)

    def row(self) -> list[Any]:
        """Its row under COLUMNS (report.table)."""
        figures = self.liveness
        return [self.scenario.name, self.faults, self.orders, self.oversold, f"{figures.longest_stall:.2f} s",
                f"{figures.longest_request:.2f} s", figures.refused_in_stock, figures.busy, figures.after_heal,
                self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name, "passed": self.passed, "problems": self.problems,
            "orders": self.orders, "oversold": self.oversold, "faults": self.faults,
            "longest_stall_s": self.liveness.longest_stall, "longest_request_s": self.liveness.longest_request,
            "busy": self.liveness.busy, "notes": self.notes,
        }


def table(outcomes: Sequence[FaultOutcome]) -> str:
    """One row per outcome, in the columns of its kind (in-process or over HTTP)."""
    return report.table(type(outcomes[0]).COLUMNS, [o.row() for o in outcomes]) if outcomes else ""


# --- the buyers' plumbing (both harnesses) --------------------------------------------------
def spawn_buyers(count: int, target: Callable[..., None], *args: Any) -> tuple[dict[int, Connection], dict]:
    """Fork `count` buyers, `target(index, *args, out)`, each journaling through a pipe of its own."""
    connections.close_all()  # the buyers must not share the parent's MySQL connection
    pipes, procs = {}, {}
    for index in range(count):
        reader, writer = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=target, args=(index, *args, writer), daemon=True)
        proc.start()
        writer.close()
        pipes[index], procs[index] = reader, proc
    return pipes, procs


def buy_until(stop_at: float, out: Connection, once: Callable[[int], tuple]) -> None:
    """A forked buyer's loop: `once(n)` sends its n-th request (n from 1) and returns (start,
    outcome, the rest of its journal entry); a refused buyer pauses before the next one. Ends at
    `stop_at`, or when the journal fails (the parent is gone); closes the pipe either way."""
    sent = 0
    try:
        while time.monotonic() < stop_at:
            sent += 1
            start, outcome, *rest = once(sent)
            out.send(("request", start, time.monotonic(), outcome, *rest))
            if outcome != PLACED:
                time.sleep(REFUSAL_PAUSE)
    except Exception:  # the journal itself failed (the parent is gone): nothing left to do
        return
    finally:
        out.close()


def finish_buyers(procs: dict, *, timeout: float, notes: list[str]) -> None:
    """Wait for every buyer; one still running after `timeout` is woken (if stopped) and killed."""
    deadline = time.monotonic() + timeout
    for proc in procs.values():
        proc.join(max(deadline - time.monotonic(), 0))
        if proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.join(5)
            notes.append(f"buyer {proc.pid} did not finish: killed")


class Journal:
    """Reads every buyer's pipe in a thread while the parent injects the fault. A subclass
    notes its own kinds of message (`_note`); "begin" (the key of the request a buyer has sent)
    is common."""

    def __init__(self, pipes: dict[int, Connection]) -> None:
        self.requests: list[Attempt] = []
        self.in_flight: dict[int, str] = {}  # buyer -> Idempotency-Key of the request it has sent
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(dict(pipes),), daemon=True)
        self.thread.start()

    def _read(self, pipes: dict[int, Connection]) -> None:
        by_conn = {conn: index for index, conn in pipes.items()}
        while by_conn:
            for conn in wait(list(by_conn), timeout=0.5):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del by_conn[conn]
                    continue
                with self.changed:
                    if message[0] == "begin":
                        self.in_flight[by_conn[conn]] = message[1]
                    else:
                        self._note(by_conn[conn], message)
                    self.changed.notify_all()

    def _note(self, buyer: int, message: tuple) -> None:
        raise NotImplementedError


def check_books(work: workloads.Workload, requests: list[Attempt], unanswered: list[str], *,
                restocked: int = 0) -> tuple[int, list[str], int]:
    """(oversold, invariant violations, requests settled from the database) once the run is over.

    A buyer that never heard its answer (killed, or its server was) would retry with the same
    key and get the order if one was committed (a combiner may have committed it for the buyer
    before it died): those keys are settled the same way, from the database.
    """
    from shop.invariants import check_invariants
    from shop.models import Order

    time.sleep(float(shop_settings.LOCK_TTL) + 0.2)  # a killed holder's lease runs out: no lock left over
    book = workloads.books(work)[0]
    oversold = book.sold - (book.initial + restocked - book.current)
    settled = list(Order.objects.filter(idempotency_key__in=unanswered).values_list("pk", flat=True))
    violations = check_invariants(
        product_ids=work.product_ids, initial_stock=work.initial_stock,
        seen_order_ids=[r.order_id for r in requests if r.order_id is not None] + settled,
    )
    return oversold, violations, len(settled)


# --- the in-process harness -----------------------------------------------------------------
@dataclass(frozen=True)
class FaultConfig:
    buyers: int = 6
    duration: float = 8.0  # seconds of buying
    fault_at: float = 2.5  # seconds into the run
    fault_length: float = 2.0  # pause / freeze / outage length (seconds)
    stock: int = 1_000_000
    sell_out_stock: int = 40
    restock: int = 1_000_000  # lasts the run: a stale sold-out marker would refuse buyers to the end
    users: int = 50
    seed: int = 0


class _Journal(Journal):
    def __init__(self, pipes: dict[int, Connection]) -> None:
        self.events: list[tuple[str, int, float]] = []
        self.errors: list[str] = []
        self.connection_ids: dict[int, int] = {}
        self.victims: set[int] = set()  # buyers that stopped or killed themselves for the fault
        super().__init__(pipes)

    def _note(self, buyer: int, message: tuple) -> None:
        kind = message[0]
        if kind == "request":
            self.requests.append(Attempt(*message[1:], buyer=buyer))
            self.in_flight.pop(buyer, None)
        elif kind == "fault":
            self.events.append((message[1], message[2], message[3]))
            self.victims.add(buyer)
        elif kind == "connection":
            self.connection_ids[buyer] = message[1]
        elif kind == "error":
            self.errors.append(message[1])

    def wait_for_event(self, timeout: float) -> tuple[str, int, float] | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return self.events[-1]


@dataclass
class Context:
    config: FaultConfig
    journal: _Journal
    procs: dict  # buyer index -> process
    armed: Any  # the shared control word (ARMED_*)
    redis: RedisProcess | None  # the run's private Redis (scenario.redis)
    product_id: int


def _buyer(index: int, product_id: int, user_ids: list[int], stop_at: float, armed, out: Connection) -> None:
    """A forked buyer: place orders until stop_at, journaling each one (and fault events)."""
    from django.contrib.auth import get_user_model

    from shop import errors, hooks
    from shop.services import place_order

    def take(mode: int) -> bool:
        with armed.get_lock():
            if armed.value != mode:
                return False
            armed.value = 0
            return True

    def stop_here(mode: int, how: signal.Signals) -> None:
        if take(mode):
            out.send(("fault", "killed" if how == signal.SIGKILL else "paused", os.getpid(), time.monotonic()))
            os.kill(os.getpid(), how)

    def hook(stage: str, holds) -> None:
        if stage == "before_commit":
            stop_here(ARMED_KILL, signal.SIGKILL)
            stop_here(ARMED_PAUSE, signal.SIGSTOP)
        elif stage == "before_sold_out_mark":
            stop_here(ARMED_PAUSE_BEFORE_MARK, signal.SIGSTOP)

    hooks.checkout_hook = hook
    users = list(get_user_model().objects.filter(pk__in=user_ids))
    rng = random.Random(index)
    reported = None

    def once(sent: int) -> tuple:
        nonlocal reported
        connection.ensure_connection()
        thread_id = connection.connection.thread_id()  # the MySQL connection id, no round trip
        if thread_id != reported:
            out.send(("connection", thread_id))
            reported = thread_id
        start = time.monotonic()
        # Every request carries an Idempotency-Key, journaled before it is sent: if this buyer
        # dies with the request in flight (its order may have been committed by a combiner
        # meanwhile), the verdict settles it as a retrying client would.
        key = f"fault-{index}-{sent}"
        out.send(("begin", key))
        try:
            return start, PLACED, place_order(user=rng.choice(users), lines=[(product_id, 1)],
                                              idempotency_key=key).order_id
        except errors.ShopError as exc:
            return start, outcome_of_code(exc.code), None
        except Exception as exc:  # journaled as an error: the verdict fails on it
            out.send(("error", repr(exc)[:300]))
            return start, ERROR, None

    buy_until(stop_at, out, once)


# --- the in-process scenarios: one fault each -----------------------------------------------
def _stop_in_critical_section(mode: int, name: str) -> Callable[[Context], Fault]:
    """kill-holder / pause-holder / long-pause: the next buyer to reach its COMMIT kills or stops
    itself there, lock held and row updated; a paused one is woken (SIGCONT) when the fault heals."""

    def build(ctx: Context) -> Fault:
        victim: list[int] = []

        def inject() -> tuple[str, float]:
            ctx.armed.value = mode
            event = ctx.journal.wait_for_event(10)
            if event is None:
                raise NotInjected("no buyer reached the fault point")
            what, pid, at = event
            victim.append(pid)
            return f"{name}: buyer {pid} {what} inside its critical section", at

        def heal() -> tuple[str, float]:
            os.kill(victim[0], signal.SIGCONT)
            return f"{name}: buyer {victim[0]} resumed after {ctx.config.fault_length:g} s", time.monotonic()

        return Fault(inject=inject, heal=heal if mode == ARMED_PAUSE else None)

    return build


def kill_waiter(ctx: Context) -> Fault:
    def inject() -> tuple[str, float]:
        pids = {proc.pid for proc in ctx.procs.values()}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            queued = [pid for pid in _queued_pids(ctx.product_id) if pid in pids]
            if queued:
                victim = random.Random(ctx.config.seed).choice(queued)
                os.kill(victim, signal.SIGKILL)
                return f"kill-waiter: buyer {victim} killed while queued for the lock", time.monotonic()
            time.sleep(0.005)
        raise NotInjected("no buyer was queued for the lock")

    return Fault(inject=inject)


def kill_mysql_connection(ctx: Context) -> Fault:
    def inject() -> tuple[str, float]:
        with ctx.journal.changed:
            ids = dict(ctx.journal.connection_ids)
        if not ids:
            raise NotInjected("no buyer reported its connection")
        victim = ids[random.Random(ctx.config.seed).choice(sorted(ids))]
        with connection.cursor() as cursor:
            cursor.execute(f"KILL {int(victim)}")
        return f"kill-mysql-connection: connection {victim} killed", time.monotonic()

    return Fault(inject=inject)


def restart_redis(ctx: Context) -> Fault:
    redis, length = ctx.redis, ctx.config.fault_length
    return outage(redis.stop, redis.start, down_note=f"restart-redis: the run's Redis (port {redis.port}) killed",
                  up_note=lambda _: f"restart-redis: back empty after {length:g} s")


def freeze_redis(ctx: Context) -> Fault:
    redis, length = ctx.redis, ctx.config.fault_length
    return outage(redis.freeze, redis.resume, down_note=f"freeze-redis: the run's Redis (port {redis.port}) frozen",
                  up_note=lambda _: f"freeze-redis: resumed after {length:g} s")


def restock_in_pause(ctx: Context) -> Fault:
    """Armed from the start: the first buyer to read 0 left stops before writing the sold-out
    marker. Once its lease has run out an operator restocks; the buyer wakes after that."""
    from shop.models import Product
    from shop.services import restock

    paused: list[tuple[int, float]] = []
    restocked_at: list[float] = []

    def inject() -> tuple[str, float]:
        event = ctx.journal.wait_for_event(10)
        if event is None:
            raise NotInjected("the product never sold out")
        _, pid, at = event
        paused.append((pid, at))
        time.sleep(max(at + shop_settings.LOCK_TTL + 0.2 - time.monotonic(), 0))  # its lease runs out
        restock(product=Product.objects.get(pk=ctx.product_id), quantity=ctx.config.restock, actor="fault-injection")
        restocked_at.append(time.monotonic())
        return (f"restock-in-pause: buyer {pid} paused before marking sold out; restocked {ctx.config.restock} "
                f"at +{restocked_at[0] - at:.2f} s"), at

    def heal() -> tuple[str, float]:
        pid, _ = paused[0]
        time.sleep(max(restocked_at[0] + 0.2 - time.monotonic(), 0))
        os.kill(pid, signal.SIGCONT)
        return f"restock-in-pause: buyer {pid} resumed", restocked_at[0]  # stock exists from the restock on

    return Fault(inject=inject, heal=heal)


def _queued_pids(product_id: int) -> list[int]:
    """Pids of the processes queued for the product's lock, or its lane's (the waiters hash:
    token -> "deadline|ttl|enqueued|host:pid")."""
    from django_redis import get_redis_connection

    from locks.conf import locks_settings
    from locks.keys import LockKeys
    from shop.lock_names import checkout_queue

    name = checkout_queue(product_id)
    raw = get_redis_connection(locks_settings.CACHE_ALIAS).hgetall(LockKeys.for_name(name).waiters)
    pids = []
    for token, info in raw.items():
        if token in (b"~", "~"):
            continue
        owner = (info.decode() if isinstance(info, bytes) else info).split("|", 3)[-1]
        with contextlib.suppress(ValueError):
            pids.append(int(owner.rsplit(":", 1)[-1]))
    return pids


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-holder", "SIGKILL a buyer holding the product lock (after its UPDATE, before COMMIT)",
             _stop_in_critical_section(ARMED_KILL, "kill-holder")),
    Scenario("pause-holder", "SIGSTOP a buyer holding the product lock past its lease, then SIGCONT",
             _stop_in_critical_section(ARMED_PAUSE, "pause-holder")),
    # Far past the lease AND the lock wait: its open MySQL transaction must not stall the product.
    Scenario("long-pause", "SIGSTOP a buyer mid-transaction for 10 s, then SIGCONT",
             _stop_in_critical_section(ARMED_PAUSE, "long-pause"), length=10.0),
    Scenario("kill-waiter", "SIGKILL a buyer while it is queued for the product lock", kill_waiter),
    Scenario("kill-mysql-connection", "KILL a buyer's MySQL connection mid-run", kill_mysql_connection),
    Scenario("restart-redis", "kill the run's Redis and restart it empty", restart_redis, redis=True),
    # Longer than the 5 s socket timeout Redis clients often have: a worker must not hang on it.
    Scenario("freeze-redis", "SIGSTOP the run's Redis for 6 s, then SIGCONT", freeze_redis, redis=True, length=6.0),
    Scenario("restock-in-pause", "the buyer that saw 0 left pauses before marking sold out; a restock "
             "lands meanwhile", restock_in_pause, sell_out=True),
)}


@contextlib.contextmanager
def _caches_on(redis: RedisProcess | None) -> Iterator[None]:
    if redis is None:
        yield
        return
    from shop.settings import redis_cache

    with override_settings(CACHES={**settings.CACHES, "default": redis_cache(redis.url),
                                   "locks": redis_cache(redis.url)}):
        yield


# --- one scenario ---------------------------------------------------------------------------
def run_scenario(name: str, config: FaultConfig | None = None, *, keep: bool = False,
                 say: Callable[[str], None] = lambda line: None) -> FaultOutcome:
    scenario = SCENARIOS[name]
    config = config or FaultConfig()
    redis = RedisProcess() if scenario.redis else None
    if redis is not None:
        redis.start()
    try:
        with _caches_on(redis):
            return _run(scenario, config, redis, keep=keep, say=say)
    finally:
        if redis is not None:
            redis.stop()


def _run(scenario: Scenario, config: FaultConfig, redis: RedisProcess | None, *, keep: bool,
         say: Callable[[str], None]) -> FaultOutcome:
    length = scenario.length or config.fault_length
    needed = config.fault_at + length + 4  # buying goes on for 4 s after the fault heals
    if scenario.sell_out:  # the restock waits out the paused buyer's lease first
        needed += float(shop_settings.LOCK_TTL) + 0.2
    config = replace(config, fault_length=length, duration=max(config.duration, needed))
    stock = config.sell_out_stock if scenario.sell_out else config.stock
    work = workloads.create(workloads.new_run_id(), products=1, stock=stock, users=config.users)
    product_id = work.product_ids[0]
    armed = FORK.Value("i", ARMED_PAUSE_BEFORE_MARK if scenario.sell_out else 0)
    started = time.monotonic()
    stop_at = started + config.duration
    pipes, procs = spawn_buyers(config.buyers, _buyer, product_id, work.user_ids, stop_at, armed)
    journal = _Journal(pipes)
    fault = scenario.fault(Context(config=config, journal=journal, procs=procs, armed=armed, redis=redis,
                                   product_id=product_id))
    notes: list[str] = []
    try:
        time.sleep(max(config.fault_at - (time.monotonic() - started), 0))
        done = apply(fault, length=length, say=say)
        notes.extend(done.notes)
    finally:
        finish_buyers(procs, timeout=max(stop_at - time.monotonic(), 0) + 30, notes=notes)
        journal.thread.join(10)
    requests = sorted(journal.requests, key=lambda r: r.start)
    in_stock, grace, restocked = [(started + 0.5, stop_at)], 0.0, 0  # the first half second: buyers starting up
    if scenario.sell_out and done.faults:
        # Stock existed from the restock's COMMIT until the restocked units were sold again.
        last = max((r.end for r in requests if r.outcome == PLACED and r.start >= done.healed), default=done.healed)
        current = workloads.books(work)[0].current
        in_stock, grace, restocked = [(done.healed, stop_at if current > 0 else last)], 1.0, config.restock
    elif fault.outage:  # nothing can sell while the lock's Redis is away: measure around it
        in_stock = [(started + 0.5, started + config.fault_at), (done.healed, stop_at)]
    unanswered = [key for buyer, key in journal.in_flight.items() if procs[buyer].exitcode == -signal.SIGKILL]
    oversold, violations, _ = check_books(work, requests, unanswered, restocked=restocked)
    violations += [f"buyer error: {e}" for e in journal.errors[:5]]
    figures = liveness(requests, in_stock=in_stock, healed_at=done.healed, grace=grace,
                       victims=frozenset(journal.victims))
    if not keep:
        workloads.cleanup(work)
    return FaultOutcome(scenario=scenario, faults=done.faults, requests=requests, oversold=oversold,
                        violations=violations, liveness=figures,
                        stall_limit=float(shop_settings.LOCK_WAIT) + 1.0, notes=notes)
