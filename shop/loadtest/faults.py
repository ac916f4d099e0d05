"""The fault-injection load test: buyers of one hot product, one real fault, then the verdict.

Several forked buyer processes call `shop.services.place_order` for one product in a loop and
journal every request (start, end, outcome) through a pipe of their own (no shared lock a killed
or stopped buyer could leave taken). A few seconds in, the parent injects one fault, for real:

    kill-holder            SIGKILL a buyer inside its critical section (lock held, row updated)
    pause-holder           SIGSTOP a buyer inside its critical section past its lease, then SIGCONT
    long-pause             the same for 10 s, far past the lock wait: its open MySQL transaction
                           is ended within a second of its lease (shop/services/stale_transactions.py)
    kill-waiter            SIGKILL a buyer while it is queued for the lock (found in the lock's
                           waiters hash in Redis)
    kill-mysql-connection  KILL a buyer's MySQL connection from an admin connection
    restart-redis          the run's Redis (a private redis-server) killed, restarted empty
    freeze-redis           the run's Redis SIGSTOPped for 6 s (longer than the 5 s socket timeout
                           Redis clients often have), then SIGCONTed
    restock-in-pause       the product sells out; the buyer that read "0 left" is SIGSTOPped
                           before writing the sold-out marker, an operator restocks, the buyer wakes

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait

from django.conf import settings
from django.db import connection, connections
from django.test.utils import override_settings

from locks.servers.base import RedisProcess
from shop.conf import shop_settings
from shop.loadtest import workload as workloads
from shop.loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, PLACED, outcome_of_code

FORK = multiprocessing.get_context("fork")

# Shared control word: what the next buyer to reach the fault point does.
ARMED_KILL, ARMED_PAUSE, ARMED_PAUSE_BEFORE_MARK = 1, 2, 3
REFUSAL_PAUSE = 0.005  # a refused buyer waits this long before trying again (a real client would)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    redis: bool = False  # runs on a private redis-server the scenario may kill or freeze
    sell_out: bool = False  # small stock: the product sells out, then is restocked
    outage: bool = False  # no order can be placed during the fault (the lock's Redis is away)
    length: float | None = None  # the fault's length if not FaultConfig.fault_length


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-holder", "SIGKILL a buyer holding the product lock (after its UPDATE, before COMMIT)"),
    Scenario("pause-holder", "SIGSTOP a buyer holding the product lock past its lease, then SIGCONT"),
    # Far past the lease AND the lock wait: its open MySQL transaction must not stall the product.
    Scenario("long-pause", "SIGSTOP a buyer mid-transaction for 10 s, then SIGCONT", length=10.0),
    Scenario("kill-waiter", "SIGKILL a buyer while it is queued for the product lock"),
    Scenario("kill-mysql-connection", "KILL a buyer's MySQL connection mid-run"),
    Scenario("restart-redis", "kill the run's Redis and restart it empty", redis=True, outage=True),
    # Longer than the 5 s socket timeout Redis clients often have: a worker must not hang on it.
    Scenario("freeze-redis", "SIGSTOP the run's Redis for 6 s, then SIGCONT", redis=True, outage=True, length=6.0),
    Scenario("restock-in-pause", "the buyer that saw 0 left pauses before marking sold out; a restock "
             "lands meanwhile", sell_out=True),
)}


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


@dataclass
class Request:
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


def liveness(requests: list[Request], *, in_stock: list[tuple[float, float]], healed_at: float,
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
    requests: list[Request]
    oversold: int
    violations: list[str]
    liveness: Liveness
    stall_limit: float
    notes: list[str] = field(default_factory=list)

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


@contextlib.contextmanager
def _caches_on(redis: RedisProcess | None) -> Iterator[None]:
    if redis is None:
        yield
        return
    from shop.settings import _redis_cache

    with override_settings(CACHES={**settings.CACHES, "default": _redis_cache(redis.url),
                                   "locks": _redis_cache(redis.url)}):
        yield


# --- buyers ---------------------------------------------------------------------------------
def _buyer(index: int, product_id: int, user_ids: list[int], stop_at: float, armed, out: Connection) -> None:
    """A forked buyer: place orders until stop_at, journaling each one (and fault events)."""
    from django.contrib.auth import get_user_model

    from shop import errors
    from shop.services import hooks, place_order, soldout

    def take(mode: int) -> bool:
        with armed.get_lock():
            if armed.value != mode:
                return False
            armed.value = 0
            return True

    def hook(stage: str, holds) -> None:
        if stage != "before_commit":
            return
        if take(ARMED_KILL):
            out.send(("fault", "killed", os.getpid(), time.monotonic()))
            os.kill(os.getpid(), signal.SIGKILL)
        if take(ARMED_PAUSE):
            out.send(("fault", "paused", os.getpid(), time.monotonic()))
            os.kill(os.getpid(), signal.SIGSTOP)

    real_mark = soldout.mark

    def mark(*args, **kwargs):
        if take(ARMED_PAUSE_BEFORE_MARK):
            out.send(("fault", "paused", os.getpid(), time.monotonic()))
            os.kill(os.getpid(), signal.SIGSTOP)
        return real_mark(*args, **kwargs)

    hooks.checkout_hook = hook
    soldout.mark = mark
    users = list(get_user_model().objects.filter(pk__in=user_ids))
    rng = random.Random(index)
    reported = None
    sent = 0
    try:
        while time.monotonic() < stop_at:
            connection.ensure_connection()
            thread_id = connection.connection.thread_id()  # the MySQL connection id, no round trip
            if thread_id != reported:
                out.send(("connection", thread_id))
                reported = thread_id
            start = time.monotonic()
            order_id = None
            # Every request carries an Idempotency-Key, journaled before it is sent: if this
            # buyer dies with the request in flight (its order may have been committed by a
            # combiner meanwhile), the verdict settles it as a retrying client would.
            sent += 1
            key = f"fault-{index}-{sent}"
            out.send(("begin", key))
            try:
                order_id = place_order(user=rng.choice(users), lines=[(product_id, 1)], idempotency_key=key).order.pk
                outcome = PLACED
            except errors.ShopError as exc:
                outcome = outcome_of_code(exc.code)
            except Exception as exc:  # journaled as an error: the verdict fails on it
                outcome = ERROR
                out.send(("error", repr(exc)[:300]))
            out.send(("request", start, time.monotonic(), outcome, order_id))
            if outcome != PLACED:
                time.sleep(REFUSAL_PAUSE)
    except Exception:  # the journal itself failed (the parent is gone): nothing left to do
        return
    finally:
        out.close()


class _Journal:
    """Reads every buyer's pipe in a thread; the main thread injects the fault meanwhile."""

    def __init__(self, pipes: dict[int, Connection]) -> None:
        self.pipes = dict(pipes)
        self.requests: list[Request] = []
        self.events: list[tuple[str, int, float]] = []
        self.errors: list[str] = []
        self.connection_ids: dict[int, int] = {}
        self.victims: set[int] = set()  # buyers that stopped or killed themselves for the fault
        self.in_flight: dict[int, str] = {}  # buyer -> Idempotency-Key of the request it has sent
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        by_conn = {conn: index for index, conn in self.pipes.items()}
        while by_conn:
            for conn in wait(list(by_conn), timeout=0.5):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del by_conn[conn]
                    continue
                with self.changed:
                    kind = message[0]
                    if kind == "request":
                        self.requests.append(Request(*message[1:], buyer=by_conn[conn]))
                        self.in_flight.pop(by_conn[conn], None)
                    elif kind == "begin":
                        self.in_flight[by_conn[conn]] = message[1]
                    elif kind == "fault":
                        self.events.append((message[1], message[2], message[3]))
                        self.victims.add(by_conn[conn])
                    elif kind == "connection":
                        self.connection_ids[by_conn[conn]] = message[1]
                    elif kind == "error":
                        self.errors.append(message[1])
                    self.changed.notify_all()

    def wait_for_event(self, timeout: float) -> tuple[str, int, float] | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return self.events[-1]


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
    from shop.invariants import check_invariants
    from shop.models import Order
    from shop.services import restock

    length = scenario.length or config.fault_length
    needed = config.fault_at + length + 4  # buying goes on for 4 s after the fault heals
    if scenario.sell_out:  # the restock waits out the paused buyer's lease first
        needed += float(shop_settings.LOCK_TTL) + 0.2
    config = replace(config, fault_length=length, duration=max(config.duration, needed))
    stock = config.sell_out_stock if scenario.sell_out else config.stock
    work = workloads.create(workloads.new_run_id(), products=1, stock=stock, users=config.users)
    product_id = work.product_ids[0]
    armed = FORK.Value("i", ARMED_PAUSE_BEFORE_MARK if scenario.sell_out else 0)
    connections.close_all()  # the buyers must not share the parent's MySQL connection
    started = time.monotonic()
    stop_at = started + config.duration
    pipes, procs = {}, {}
    for index in range(config.buyers):
        reader, writer = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=_buyer, args=(index, product_id, work.user_ids, stop_at, armed, writer),
                            daemon=True)
        proc.start()
        writer.close()
        pipes[index], procs[index] = reader, proc
    journal = _Journal(pipes)
    faults, notes = 0, []
    healed_at = started + config.fault_at
    in_stock = [(started + 0.5, stop_at)]  # the first half second: buyers starting up
    grace = 0.0
    restocked = 0
    try:
        time.sleep(max(config.fault_at - (time.monotonic() - started), 0))
        faults, healed_at, notes, restock_window = _inject(scenario, config, journal, procs, armed, redis,
                                                           product_id, restock, say)
        if restock_window is not None:
            restocked = config.restock
            in_stock, grace = [restock_window], 1.0
        elif scenario.outage:  # nothing can sell while the lock's Redis is away: measure around it
            in_stock = [(started + 0.5, started + config.fault_at), (healed_at, stop_at)]
    finally:
        for proc in procs.values():
            proc.join(max(stop_at - time.monotonic(), 0) + 30)
            if proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.join(5)
        journal.thread.join(10)
    requests = sorted(journal.requests, key=lambda r: r.start)
    if scenario.sell_out and in_stock:
        # Stock existed from the restock's COMMIT until the restocked units were sold again.
        start, _ = in_stock[0]
        last = max((r.end for r in requests if r.outcome == PLACED and r.start >= start), default=start)
        current = workloads.books(work)[0].current
        in_stock = [(start, stop_at if current > 0 else last)]
    time.sleep(shop_settings.LOCK_TTL + 0.2)  # a killed holder's lease runs out: no lock left over
    book = workloads.books(work)[0]
    oversold = book.sold - (book.initial + restocked - book.current)
    # A buyer killed with a request in flight never heard its answer; its client would retry
    # with the same key and get the order if one was committed (combining may have committed it
    # for the buyer before it died). Settle those keys the same way, from the database.
    unanswered = [key for buyer, key in journal.in_flight.items() if procs[buyer].exitcode == -signal.SIGKILL]
    settled = list(Order.objects.filter(idempotency_key__in=unanswered).values_list("pk", flat=True))
    violations = check_invariants(
        product_ids=work.product_ids, initial_stock=work.initial_stock,
        seen_order_ids=[r.order_id for r in requests if r.order_id is not None] + settled,
    )
    violations += [f"buyer error: {e}" for e in journal.errors[:5]]
    figures = liveness(requests, in_stock=in_stock, healed_at=healed_at, grace=grace,
                       victims=frozenset(journal.victims))
    if not keep:
        workloads.cleanup(work)
    return FaultOutcome(scenario=scenario, faults=faults, requests=requests, oversold=oversold,
                        violations=violations, liveness=figures,
                        stall_limit=float(shop_settings.LOCK_WAIT) + 1.0, notes=notes)


def _inject(scenario: Scenario, config: FaultConfig, journal: _Journal, procs: dict, armed, redis,
            product_id: int, restock, say) -> tuple[int, float, list[str], tuple[float, float] | None]:
    """Inject the scenario's fault. Returns (faults injected, when it healed, notes, restock window)."""
    name = scenario.name
    length = config.fault_length
    if name in ("kill-holder", "pause-holder", "long-pause"):
        armed.value = ARMED_KILL if name == "kill-holder" else ARMED_PAUSE
        event = journal.wait_for_event(10)
        if event is None:
            return 0, time.monotonic(), ["no buyer reached the fault point"], None
        what, pid, at = event
        if what == "paused":
            time.sleep(max(at + length - time.monotonic(), 0))
            os.kill(pid, signal.SIGCONT)
            say(f"{name}: buyer {pid} paused {length:g} s inside its critical section")
            return 1, time.monotonic(), [], None
        say(f"{name}: buyer {pid} killed inside its critical section")
        return 1, at, [], None
    if name == "kill-waiter":
        pids = {proc.pid for proc in procs.values()}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            queued = [pid for pid in _queued_pids(product_id) if pid in pids]
            if queued:
                victim = random.Random(config.seed).choice(queued)
                os.kill(victim, signal.SIGKILL)
                say(f"kill-waiter: buyer {victim} killed while queued for the lock")
                return 1, time.monotonic(), [], None
            time.sleep(0.005)
        return 0, time.monotonic(), ["no buyer was queued for the lock"], None
    if name == "kill-mysql-connection":
        with journal.changed:
            ids = dict(journal.connection_ids)
        if not ids:
            return 0, time.monotonic(), ["no buyer reported its connection"], None
        victim = ids[random.Random(config.seed).choice(sorted(ids))]
        with connection.cursor() as cursor:
            cursor.execute(f"KILL {int(victim)}")
        say(f"kill-mysql-connection: connection {victim} killed")
        return 1, time.monotonic(), [], None
    if name == "restart-redis":
        redis.stop()
        time.sleep(length)
        redis.start()
        say(f"restart-redis: down {length:g} s, back empty")
        return 1, time.monotonic(), [], None
    if name == "freeze-redis":
        redis.freeze()
        time.sleep(length)
        redis.resume()
        say(f"freeze-redis: frozen {length:g} s")
        return 1, time.monotonic(), [], None
    if name == "restock-in-pause":
        event = journal.wait_for_event(10)  # armed from the start: the first buyer to see 0 pauses
        if event is None:
            return 0, time.monotonic(), ["the product never sold out"], None
        _, pid, at = event
        time.sleep(shop_settings.LOCK_TTL + 0.2)  # its lease runs out: the restock can lock
        restock(product=_product(product_id), quantity=config.restock, actor="fault-injection")
        committed = time.monotonic()
        time.sleep(max(at + length - time.monotonic(), 0.2))
        os.kill(pid, signal.SIGCONT)
        say(f"restock-in-pause: buyer {pid} paused before marking sold out; restocked "
            f"{config.restock} at +{committed - at:.2f} s")
        return 1, committed, [], (committed, time.monotonic() + config.duration)
    raise ValueError(f"unknown scenario {name!r}")


def _queued_pids(product_id: int) -> list[int]:
    """Pids of the processes queued for the product's lock (the waiters hash: token ->
    "deadline|ttl|enqueued|host:pid")."""
    from django_redis import get_redis_connection

    from locks.conf import locks_settings
    from locks.keys import LockKeys
    from shop.services.locking import product_lock

    raw = get_redis_connection(locks_settings.CACHE_ALIAS).hgetall(LockKeys.for_name(product_lock(product_id)).waiters)
    pids = []
    for token, info in raw.items():
        if token in (b"~", "~"):
            continue
        owner = (info.decode() if isinstance(info, bytes) else info).split("|", 3)[-1]
        with contextlib.suppress(ValueError):
            pids.append(int(owner.rsplit(":", 1)[-1]))
    return pids


def _product(product_id: int):
    from shop.models import Product

    return Product.objects.get(pk=product_id)


def table(outcomes: list[FaultOutcome]) -> str:
    head = ["scenario", "faults", "orders", "oversold", "longest stall", "longest request",
            "refused in stock", "busy (503)", "orders after heal", "verdict"]
    rows = [[o.scenario.name, str(o.faults), f"{o.orders:,}", str(o.oversold),
             f"{o.liveness.longest_stall:.2f} s", f"{o.liveness.longest_request:.2f} s",
             str(o.liveness.refused_in_stock), f"{o.liveness.busy:,}", f"{o.liveness.after_heal:,}",
             "PASS" if o.passed else "FAIL: " + "; ".join(o.problems)] for o in outcomes]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
