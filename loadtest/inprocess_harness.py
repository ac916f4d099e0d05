"""The in-process fault-injection harness: forked buyers of one hot product call
`shop.services.place_order` in a loop and reach their fault points through the checkout's test
hook (shop/plumbing/hooks.py); the parent injects one fault (loadtest/faults.py holds the catalogue),
heals it, and gives the verdict (loadtest/fault_harness.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from django.conf import settings
from django.db import connection
from django.test.utils import override_settings

from loadtest import workload as workloads
from loadtest.fault_harness import (
    FORK,
    Attempt,
    FaultOutcome,
    Journal,
    Scenario,
    apply,
    buy_until,
    check_books,
    finish_buyers,
    liveness,
    spawn_buyers,
)
from loadtest.servers.base import RedisProcess
from loadtest.strategies import ERROR, PLACED, outcome_of_code
from shop.conf import shop_settings

# Shared control word: what the next buyer to reach the fault point does.
ARMED_KILL, ARMED_PAUSE, ARMED_PAUSE_BEFORE_MARK = 1, 2, 3


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

    from shop import errors
    from shop.plumbing import hooks
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



@contextlib.contextmanager
def _caches_on(redis: RedisProcess | None) -> Iterator[None]:
    if redis is None:
        yield
        return
    from config.settings import redis_cache

    with override_settings(CACHES={**settings.CACHES, "default": redis_cache(redis.url),
                                   "locks": redis_cache(redis.url)}):
        yield


# --- one run ----------------------------------------------------------------------------------
def run(scenario: Scenario, config: FaultConfig | None = None, *, keep: bool = False,
        say: Callable[[str], None] = lambda line: None) -> FaultOutcome:
    """Run buyers, inject `scenario`'s fault, heal it, and judge the run."""
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
