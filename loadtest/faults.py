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

A scenario is a fault plugged into the harness (loadtest/inprocess_harness.py): its `fault`
builds a `Fault` (`inject` and `heal` callables, loadtest/fault_harness.py) from the run's
`Context`; the harness injects it, waits the fault's length and heals it. The buyers reach their
fault points through the checkout's test hook (shop/plumbing/hooks.py). The HTTP harness
(loadtest/httpfaults.py) plugs its faults in the same way and shares the buyers' plumbing and the
verdict.

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
import os
import random
import signal
import time
from collections.abc import Callable

from django.db import connection

from loadtest.fault_harness import Fault, FaultOutcome, NotInjected, Scenario, outage
from loadtest.inprocess_harness import ARMED_KILL, ARMED_PAUSE, Context, FaultConfig, run
from shop.conf import shop_settings


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
    from shop.plumbing.lock_names import checkout_queue

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


def run_scenario(name: str, config: FaultConfig | None = None, *, keep: bool = False,
                 say: Callable[[str], None] = lambda line: None) -> FaultOutcome:
    """One scenario of the catalogue, by name."""
    return run(SCENARIOS[name], config, keep=keep, say=say)
