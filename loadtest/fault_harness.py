"""What both fault-injection harnesses share (the in-process one, loadtest/inprocess_harness.py,
and the one over HTTP, loadtest/httpfaults.py): the plug-in interface of a fault (`Fault`:
inject and heal), the run's journal (`Attempt`) and its verdict (`liveness`, `FaultOutcome`),
and the buyers' plumbing (forked buyers journaling through pipes of their own, the books checked
with I1-I6 once the run is over).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from django.db import connections

from loadtest import report
from loadtest import workload as workloads
from loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, PLACED
from shop.conf import shop_settings

FORK = multiprocessing.get_context("fork")

REFUSAL_PAUSE = 0.005  # a refused buyer waits this long before trying again (a real client would)


# --- the plug-in interface -------------------------------------------------
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


# --- the run's journal and outcome -----------------------------------------
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


# --- the buyers' plumbing --------------------------------------------------
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
    from shop.models import Order
    from shop.ops.invariants import check_invariants

    time.sleep(float(shop_settings.LOCK_TTL) + 0.2)  # a killed holder's lease runs out: no lock left over
    book = workloads.books(work)[0]
    oversold = book.sold - (book.initial + restocked - book.current)
    # This run's orders only: the keys (`fault-<buyer>-<n>`) repeat from run to run on one database.
    settled = list(Order.objects.filter(idempotency_key__in=unanswered, user_id__in=work.user_ids,
                                        lines__product_id__in=work.product_ids).distinct().values_list("pk", flat=True))
    violations = check_invariants(
        product_ids=work.product_ids, initial_stock=work.initial_stock,
        seen_order_ids=[r.order_id for r in requests if r.order_id is not None] + settled,
    )
    return oversold, violations, len(settled)
