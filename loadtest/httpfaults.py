"""Fault injection with several app servers: buyers over HTTP, a real fault, then the verdict.

N gunicorn servers (loadtest/appservers.py) share the database and the lock service. Forked
buyer processes POST orders for one hot product, each to its own server (buyer i -> server
i mod N), every request with an Idempotency-Key, and journal every answer through a pipe. A few
seconds in, the parent injects the scenario's fault:

    kill-app-server      SIGKILL one server, master and workers, mid-request: its clients see a
                         connection error (requests in flight are cut). A buyer whose server died
                         moves to the remaining ones, as behind a load balancer, and sends the cut
                         request again *with the same Idempotency-Key*: the answer is the order
                         the dead server committed (a replay, 200) or a fresh placement (201).
                         A checkout the dead server held the product lock for stalls the product
                         until the lock's lease runs out (LOCK_TTL): that stall is measured.
    restart-redis-http   the servers' lock Redis (a private redis-server) killed, restarted empty

A scenario is a fault plugged into this harness as into the in-process one
(loadtest/inprocess_harness.py): `service` names the lock service the servers share, from the
registry of loadtest/lockservices.py (None: this process's own), which starts its servers
and says how to point the app servers at it; `fault` builds the `Fault` (inject/heal
callables) from the running app servers and service. The Sentinel, Cluster, Redlock and
ZooKeeper failovers plug in the same way.

The verdict is the one of loadtest/fault_harness.py (0 oversold, I1-I6 with the orders the
clients were told about, stall and hung-request bounds, nobody refused as sold out while stock
existed, orders after the fault), plus the figures of this kind of fault: how long until
orders flowed again, answers refused during the fault, requests cut, retries and replays, and
fence refusals (a second holder's write refused: shop/plumbing/fence_refusals.py).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from loadtest import appservers, lockservices
from loadtest import workload as workloads
from loadtest.fault_harness import (
    Attempt,
    Fault,
    FaultOutcome,
    Journal,
    Scenario,
    apply,
    buy_until,
    check_books,
    finish_buyers,
    liveness,
    outage,
    spawn_buyers,
    table,
)
from loadtest.lockservices import LockService
from loadtest.strategies import BUSY, ERROR, OUTCOMES, PLACED, outcome_of_code
from shop.conf import shop_settings

__all__ = ["SCENARIOS", "HttpFaultConfig", "HttpFaultOutcome", "HttpScenario", "run_scenario", "table"]

REQUEST_TIMEOUT = 15.0  # seconds; a request that takes longer is journaled as an error
SETTLE_FOR = 10.0  # seconds a client keeps retrying a cut request (same key) for a definitive answer


# --- the plug-in interface ------------------------------------------------------------------
@dataclass
class Context:
    servers: appservers.AppServers
    service: LockService
    config: HttpFaultConfig
    product_id: int  # the hot product of the run


@dataclass(frozen=True, kw_only=True)
class HttpScenario(Scenario):
    service: str | None = None  # the lock service (lockservices.SERVICES); None: this process's own


@dataclass(frozen=True)
class HttpFaultConfig:
    servers: int = 3
    server_workers: int = 2
    server_threads: int = 4
    buyers: int = 6
    duration: float = 10.0  # seconds of buying
    fault_at: float = 3.0  # seconds into the run
    fault_length: float = 2.0  # seconds an outage lasts before heal()
    stock: int = 1_000_000
    users: int = 50
    seed: int = 0


# --- the scenarios --------------------------------------------------------------------------
HOLDER_WAIT = 3.0  # seconds kill-app-server waits for one of the victim's workers to hold the lock


def _lock_holder_pid(product_id: int) -> int | None:
    """The pid of the process holding the product's lock (owner "host:pid"), if any."""
    from locks.inspect import lock_info
    from shop.plumbing.lock_names import product_lock

    with contextlib.suppress(Exception):
        held = lock_info(product_lock(product_id))
        if held is not None:
            return int(held.owner.rsplit(":", 1)[-1])
    return None


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def kill_app_server(ctx: Context) -> Fault:
    """Kill the victim server while one of its workers holds the hot product's lock (seen in the
    lock service; up to HOLDER_WAIT s, else at once): its checkout dies mid-flight, lock held."""
    victim = random.Random(ctx.config.seed).randrange(len(ctx.servers))
    server = ctx.servers[victim]

    def inject() -> tuple[str, float]:
        url, group = server.url, server.pid
        deadline = time.monotonic() + HOLDER_WAIT
        holder = None
        while time.monotonic() < deadline:
            pid = _lock_holder_pid(ctx.product_id)
            if pid is not None and _in_group(pid, group):
                holder = pid
                break
            time.sleep(0.001)
        server.kill()
        held = (f"while its worker {holder} held the product lock" if holder is not None
                else f"(none of its workers was seen holding the product lock in {HOLDER_WAIT:g} s)")
        return f"server {victim} ({url}) killed, master and workers (SIGKILL), {held}", server.killed_at

    return Fault(inject=inject)


def restart_locks_redis(ctx: Context) -> Fault:
    redis, length = ctx.service.servers, ctx.config.fault_length
    return outage(redis.stop, redis.start, down_note=f"lock Redis on port {redis.port} killed",
                  up_note=lambda _: f"lock Redis restarted empty after {length:g} s")


# --- the lock backends' own faults -----------------------------------------------------------
def restart_zookeeper(ctx: Context) -> Fault:
    """The ZooKeeper server SIGKILLed and restarted on its data (shorter than the session timeout:
    the sessions, and the locks with them, survive)."""
    server, length = ctx.service.servers, ctx.config.fault_length
    return outage(server.stop, server.start, down_note=f"zookeeper: server on port {server.port} killed (SIGKILL)",
                  up_note=lambda took: f"zookeeper: restarted after {length:g} s (answering {took:.2f} s after "
                                       "the start)")


def _failover(ctx: Context, kind: str) -> Fault:
    """SIGKILL the master that has the product's lock; healed when a replica is promoted."""
    from locks.keys import LockKeys
    from shop.plumbing.lock_names import product_lock

    servers = ctx.service.servers

    def inject() -> tuple[str, float]:
        if kind == "sentinel":
            master = servers.kill_master()
        else:
            master = servers.kill_master_of(LockKeys.for_name(product_lock(ctx.product_id)).lock)
        return f"{kind}: master on port {master.port} killed (SIGKILL)", servers.killed_at

    def heal() -> tuple[str, float]:
        took = servers.wait_for_failover(timeout=30.0)
        return f"{kind}: a replica was promoted {took:.2f} s after the kill", servers.killed_at + took

    return Fault(inject=inject, heal=heal, outage=True)


def kill_two_redlock_masters(ctx: Context) -> Fault:
    """2 of 5 masters SIGKILLed (a majority is left: the sale goes on), later restarted empty."""
    masters = ctx.service.servers
    length = ctx.config.fault_length

    def inject() -> tuple[str, float]:
        masters.kill(0)
        masters.kill(1)
        return "redlock: masters 0 and 1 of 5 killed (SIGKILL); 3 left", time.monotonic()

    def heal() -> tuple[str, float]:
        masters.restart(0)
        masters.restart(1)
        return f"redlock: masters 0 and 1 restarted empty after {length:g} s", time.monotonic()

    return Fault(inject=inject, heal=heal, outage=False)


SCENARIOS: dict[str, HttpScenario] = {s.name: s for s in (
    HttpScenario("kill-app-server", "SIGKILL one of 3 app servers (master + workers) mid-request; its buyers "
                 "retry the same Idempotency-Key on the others", fault=kill_app_server),
    HttpScenario("restart-redis-http", "3 app servers: kill their lock Redis, restart it empty",
                 fault=restart_locks_redis, service="redis"),
    HttpScenario("sentinel-failover", "3 app servers on Redis Sentinel: kill the master; the sentinels promote "
                 "the replica, which may not have the lock (asynchronous replication)",
                 fault=lambda ctx: _failover(ctx, "sentinel"), service="sentinel"),
    HttpScenario("cluster-failover", "3 app servers on a Redis Cluster: kill the master of the product "
                 "lock's slot; its replica takes over", fault=lambda ctx: _failover(ctx, "cluster"),
                 service="cluster"),
    HttpScenario("redlock-kill-2", "3 app servers on Redlock over 5 masters: kill 2 (a majority is left), "
                 "restart them empty", fault=kill_two_redlock_masters, service="redlock"),
    HttpScenario("zookeeper-restart", "3 app servers on ZooKeeper: kill the server, restart it on its data",
                 fault=restart_zookeeper, service="zookeeper"),
)}


# --- a buyer --------------------------------------------------------------------------------
_CONNECTION_ERRORS = (ConnectionError, http.client.HTTPException, TimeoutError)


def _post(url: str, token: str, product_id: int, key: str) -> tuple[int, dict]:
    """(HTTP status, JSON body); raises a connection error if the server is gone or went away."""
    request = urllib.request.Request(
        f"{url}/api/orders/", method="POST",
        data=json.dumps({"lines": [{"product_id": product_id, "quantity": 1}]}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json",
                 "Authorization": f"Bearer {token}", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            body = json.load(exc)
        except ValueError:
            body = {}
        return exc.code, body if isinstance(body, dict) else {}
    except urllib.error.URLError as exc:  # connecting or sending failed: refused, reset
        raise _Unreachable(type(exc.reason).__name__) from exc


class _Unreachable(ConnectionError):
    """urllib's URLError around the socket error; args[0] is that error's class name."""


def _outcome(status: int, body: dict) -> tuple[str, int | None]:
    if status in (200, 201):
        return PLACED, int(body["id"])
    if status == 503:
        return BUSY, None
    error = body.get("error") or {}
    return outcome_of_code(error.get("code", "") if isinstance(error, dict) else "", status), None


def _buyer(index: int, urls: list[str], tokens: list[str], product_id: int, run_id: str, stop_at: float,
           out: Connection) -> None:
    """A forked buyer: POST orders to its server until stop_at; on a connection error, mark that
    server dead and send the same request (same key) to another one, until a definitive answer."""
    rng = random.Random(index)
    alive = list(urls)

    def once(sent: int) -> tuple:
        key = f"http-{run_id}-{index}-{sent}"
        token = rng.choice(tokens)
        out.send(("begin", key))
        start = time.monotonic()
        cut = False
        while True:
            url = alive[index % len(alive)]
            try:
                status, body = _post(url, token, product_id, key)
            except _CONNECTION_ERRORS as exc:
                kind = exc.args[0] if isinstance(exc, _Unreachable) else type(exc).__name__
                out.send(("cut", key, urls.index(url), time.monotonic(), kind))
                cut = True
                if url in alive and len(alive) > 1:
                    alive.remove(url)  # as a load balancer would: this server is gone
                elif time.monotonic() > stop_at + SETTLE_FOR:
                    return start, ERROR, None, urls.index(url), cut
                else:
                    time.sleep(0.05)
                continue
            outcome, order_id = _outcome(status, body)
            if cut:
                out.send(("retry", key, status == 200, outcome))
                # A client retries a busy answer to a cut request with the same key until it
                # knows: the dead server may have committed it, or the lock it held may pass.
                if outcome == BUSY and time.monotonic() < stop_at + SETTLE_FOR:
                    time.sleep(0.05)
                    continue
            return start, outcome, order_id, urls.index(url), cut

    buy_until(stop_at, out, once)


class _Journal(Journal):
    def __init__(self, pipes: dict[int, Connection]) -> None:
        self.servers: dict[int, dict[str, int]] = {}  # server index -> outcome -> answers
        self.cut: list[tuple[str, int, float, str]] = []  # (key, server index, when, error)
        self.retries: list[tuple[str, bool, str]] = []  # (key, replayed, outcome)
        self.unsettled: list[str] = []  # keys cut and never answered definitively
        super().__init__(pipes)

    def _note(self, buyer: int, message: tuple) -> None:
        kind = message[0]
        if kind == "cut":
            self.cut.append(message[1:])
        elif kind == "retry":
            self.retries.append(message[1:])
        elif kind == "request":
            start, end, outcome, order_id, server, cut = message[1:]
            self.requests.append(Attempt(start, end, outcome, order_id, buyer=buyer))
            counts = self.servers.setdefault(server, dict.fromkeys(OUTCOMES, 0))
            counts[outcome] += 1
            key = self.in_flight.pop(buyer, None)
            if cut and outcome != PLACED and key is not None:
                self.unsettled.append(key)


# --- the outcome ----------------------------------------------------------------------------
@dataclass(kw_only=True)
class HttpFaultOutcome(FaultOutcome):
    """A `FaultOutcome` and the figures of a fault over HTTP."""

    scenario: HttpScenario
    config: HttpFaultConfig
    injected_at: float  # seconds into the run
    recovery: float | None  # seconds from the fault (or its heal) until an order asked after it was placed
    fault_stall: float  # the longest gap in placed orders around the fault (an outage's length included)
    refused_during_fault: int  # non-placed answers from the fault to the recovery
    cut: int  # requests cut in flight (connection reset or closed before the answer)
    connect_refused: int  # requests a dead server's port refused (nothing was sent)
    retries: int  # cut requests sent again with the same key (to another server)
    replays: int  # ... answered with the order a server had already committed for that key (200)
    settled: int  # cut requests never answered definitively, settled from the database by key
    fence_refusals: int  # writes the fence refused during the run (shop/plumbing/fence_refusals.py)
    servers: dict[str, dict[str, int]]  # URL -> outcome -> answers (by the server that answered)

    COLUMNS = ("scenario", "orders", "oversold", "longest stall", "stall at fault", "recovery",
               "refused in fault", "cut", "conn. refused", "retries", "replays", "fence refusals", "verdict")

    def row(self) -> list[Any]:
        return [self.scenario.name, self.orders, self.oversold, f"{self.liveness.longest_stall:.2f} s",
                f"{self.fault_stall:.2f} s", "-" if self.recovery is None else f"{self.recovery:.2f} s",
                self.refused_during_fault, self.cut, self.connect_refused, self.retries, self.replays,
                self.fence_refusals, self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "injected_at": self.injected_at, "recovery_s": self.recovery, "fault_stall_s": self.fault_stall,
            "refused_during_fault": self.refused_during_fault, "cut_in_flight": self.cut,
            "connect_refused": self.connect_refused, "retries": self.retries,
            "replays": self.replays, "settled_from_db": self.settled, "fence_refusals": self.fence_refusals,
            "servers": self.servers,
        }


# --- one scenario ---------------------------------------------------------------------------
def run_scenario(name: str, config: HttpFaultConfig | None = None, *, keep: bool = False,
                 say: Callable[[str], None] = lambda line: None) -> HttpFaultOutcome:
    scenario = SCENARIOS[name]
    config = config or HttpFaultConfig()
    # This process looks at the lock service the servers use (lock holders, I6, cleanup).
    with lockservices.running(scenario.service) as service, service.switched():
        servers = appservers.AppServers(config.servers, workers=config.server_workers,
                                        threads=config.server_threads, env=service.env)
        servers.start()
        try:
            say(f"{config.servers} app servers up: {', '.join(servers.urls)}")
            return _run(scenario, config, servers, service, keep=keep, say=say)
        finally:
            servers.stop()


def _run(scenario: HttpScenario, config: HttpFaultConfig, servers: appservers.AppServers, service: LockService, *,
         keep: bool, say: Callable[[str], None]) -> HttpFaultOutcome:
    needed = config.fault_at + config.fault_length + 4  # buying goes on for 4 s after the fault heals
    config = replace(config, duration=max(config.duration, needed))
    work = workloads.create(workloads.new_run_id(), products=1, stock=config.stock, users=config.users)
    try:
        return _drive(scenario, config, servers, service, work, say=say, keep=keep)
    except BaseException:
        if not keep:
            workloads.cleanup(work)
        raise


def _drive(scenario: HttpScenario, config: HttpFaultConfig, servers: appservers.AppServers, service: LockService,
           work: workloads.Workload, *, keep: bool, say: Callable[[str], None]) -> HttpFaultOutcome:
    from loadtest.scenarios import _tokens
    from shop.reads import selectors

    product_id = work.product_ids[0]
    tokens = list(_tokens(work.user_ids).values())
    urls = servers.urls
    fault = scenario.fault(Context(servers=servers, service=service, config=config, product_id=product_id))
    started = time.monotonic()
    stop_at = started + config.duration
    pipes, procs = spawn_buyers(config.buyers, _buyer, urls, tokens, product_id, work.run_id, stop_at)
    journal = _Journal(pipes)
    notes: list[str] = []
    try:
        time.sleep(max(started + config.fault_at - time.monotonic(), 0))
        done = apply(fault, length=config.fault_length, say=say)
        notes.extend(done.notes)
    finally:
        finish_buyers(procs, timeout=max(stop_at - time.monotonic(), 0) + SETTLE_FOR + REQUEST_TIMEOUT + 5,
                      notes=notes)
        journal.thread.join(10)
    requests = sorted(journal.requests, key=lambda r: r.start)
    # A cut request whose retries never got a definitive answer (busy to the end): its client
    # would retry the key later and get the order if one was committed. Settle it the same way.
    oversold, violations, settled = check_books(work, requests, journal.unsettled)
    in_stock = ([(started + 0.5, done.injected), (done.healed, stop_at)] if fault.outage
                else [(started + 0.5, stop_at)])
    figures = liveness(requests, in_stock=in_stock, healed_at=done.healed)
    placed = sorted(r.end for r in requests if r.outcome == PLACED)
    after = [r.end for r in requests if r.outcome == PLACED and r.start >= done.healed]
    recovery = min(after) - done.healed if after else None
    # The stall the fault caused: the longest gap in placed orders from the last one before the
    # fault until the stall bound after it healed (a dead holder's lease, an outage's length).
    stall_limit = float(shop_settings.LOCK_WAIT) + 1.0
    # An order sent before the fault may be answered just after it (committed before it): it
    # counts as before the fault, not as a sale during it.
    before = max((r.end for r in requests if r.outcome == PLACED and r.start <= done.injected),
                 default=started)
    window_end = min(done.healed + stall_limit, stop_at)
    points = [before, *(t for t in placed if before < t < window_end), window_end]
    fault_stall = max(b - a for a, b in itertools.pairwise(points))
    until = done.healed + recovery if recovery is not None else stop_at
    refused = sum(1 for r in requests if r.outcome != PLACED and done.injected <= r.end <= until)
    fence_refusals = selectors.fence_refusals(lock_names=workloads.lock_names(work))
    if not keep:
        workloads.cleanup(work)  # its fence refusal counts too
    return HttpFaultOutcome(
        scenario=scenario, config=config, faults=done.faults, requests=requests,
        oversold=oversold, violations=violations, liveness=figures,
        stall_limit=stall_limit, injected_at=done.injected - started, recovery=recovery, fault_stall=fault_stall,
        refused_during_fault=refused,
        cut=sum(1 for c in journal.cut if c[3] != "ConnectionRefusedError"),
        connect_refused=sum(1 for c in journal.cut if c[3] == "ConnectionRefusedError"),
        retries=len({key for key, _, _ in journal.retries}),
        replays=len({key for key, replayed, _ in journal.retries if replayed}),
        settled=settled, fence_refusals=fence_refusals,
        servers={urls[i]: counts for i, counts in sorted(journal.servers.items())}, notes=notes,
    )


def servers_lines(outcome: HttpFaultOutcome) -> list[str]:
    """One line per server: its answers by outcome."""
    return [f"{url}: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            for url, counts in outcome.servers.items()]
