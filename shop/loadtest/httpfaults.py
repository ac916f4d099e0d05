"""Fault injection with several app servers: buyers over HTTP, a real fault, then the verdict.

N gunicorn servers (shop/loadtest/appservers.py) share the database and the lock service. Forked
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

A scenario is a fault plugged into this harness: `service` starts (and stops) the coordination
service the servers share and says which environment they run with (LOCKS_BACKEND, ...) and
which processes a fault may kill; `fault` builds the `Fault` (inject/heal callables) from the
running servers and service. Sentinel, Redlock or ZooKeeper failovers plug in the same way.

The verdict is the one of shop/loadtest/faults.py (0 oversold, I1-I6 with the orders the
clients were told about, stall and hung-request bounds, nobody refused as sold out while stock
existed, orders after the fault), plus the figures of this kind of fault: how long until
orders flowed again, answers refused during the fault, requests cut, retries and replays, and
fence refusals (a second holder's write refused: shop/services/fences.py).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import multiprocessing
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait

from django.db import connections
from django.test.utils import override_settings

from locks.servers.base import RedisProcess, ServerProcess
from shop.conf import shop_settings
from shop.loadtest import appservers
from shop.loadtest import workload as workloads
from shop.loadtest.faults import Liveness, Request, liveness
from shop.loadtest.strategies import BUSY, ERROR, OUTCOMES, PLACED, outcome_of_code

FORK = multiprocessing.get_context("fork")
REFUSAL_PAUSE = 0.005  # a refused buyer waits this long before trying again
REQUEST_TIMEOUT = 15.0  # seconds; a request that takes longer is journaled as an error
SETTLE_FOR = 10.0  # seconds a client keeps retrying a cut request (same key) for a definitive answer


# --- the plug-in interface ------------------------------------------------------------------
@dataclass
class Service:
    """The coordination service the app servers share in a scenario.

    `env`: the servers' environment overrides (LOCKS_BACKEND, LOCKS_REDIS_URL, ...); empty: the
    settings of this process. `processes`: what a fault may kill or restart. `settings`: Django
    settings this process runs its checks with (lock state), to look at the same service."""

    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, ServerProcess] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)


@dataclass
class Fault:
    """One fault: `inject()` and `heal()` do it and return (a line for the log, the
    time.monotonic() moment it took effect: a kill, not the wait for the exit after it). No
    `heal`: the system heals itself (the remaining servers take over). `outage`: nothing can
    sell while it lasts (the lock service is away), so the stall is measured around it."""

    inject: Callable[[], tuple[str, float]]
    heal: Callable[[], tuple[str, float]] | None = None
    outage: bool = False


@dataclass
class Context:
    servers: appservers.AppServers
    service: Service
    config: HttpFaultConfig
    product_id: int  # the hot product of the run


@dataclass(frozen=True)
class HttpScenario:
    name: str
    description: str
    fault: Callable[[Context], Fault]
    service: Callable[[], AbstractContextManager[Service]]


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
@contextlib.contextmanager
def shared_service() -> Iterator[Service]:
    """The servers use this process's own settings (its database, Redis and lock backend)."""
    yield Service()


@contextlib.contextmanager
def private_locks_redis() -> Iterator[Service]:
    """A private redis-server (no persistence: it restarts empty) as the lock Redis of every server."""
    from django.conf import settings

    from shop.settings import _redis_cache

    redis = RedisProcess()
    redis.start()
    try:
        yield Service(env={"LOCKS_BACKEND": "redis", "LOCKS_REDIS_URL": redis.url}, processes={"redis": redis},
                      settings={"CACHES": {**settings.CACHES, "locks": _redis_cache(redis.url)},
                                "LOCKS": {**settings.LOCKS, "BACKEND": "redis"}})
    finally:
        redis.stop()


HOLDER_WAIT = 3.0  # seconds kill-app-server waits for one of the victim's workers to hold the lock


def _lock_holder_pid(product_id: int) -> int | None:
    """The pid of the process holding the product's lock (owner "host:pid"), if any."""
    from locks.inspect import lock_info
    from shop.services.locking import product_lock

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
    redis = ctx.service.processes["redis"]
    length = ctx.config.fault_length

    def inject() -> tuple[str, float]:
        redis.stop()
        return f"lock Redis on port {redis.port} killed", time.monotonic()

    def heal() -> tuple[str, float]:
        redis.start()
        return f"lock Redis restarted empty after {length:g} s", time.monotonic()

    return Fault(inject=inject, heal=heal, outage=True)


# --- the lock backends' own faults -----------------------------------------------------------
def _locks_service(url: str, processes: dict[str, object], **locks: object) -> Service:
    """Every server's lock on the Redis at `url` (one server, Sentinel or Cluster)."""
    from django.conf import settings

    from shop.settings import _redis_cache

    return Service(env={"LOCKS_BACKEND": "redis", "LOCKS_REDIS_URL": url}, processes=processes,
                   settings={"CACHES": {**settings.CACHES, "locks": _redis_cache(url)},
                             "LOCKS": {**settings.LOCKS, "BACKEND": "redis", **locks}})


@contextlib.contextmanager
def sentinel_service() -> Iterator[Service]:
    """A Sentinel set (master, replica, 3 sentinels): the lock Redis of every server."""
    from locks.servers.sentinel import SentinelSet

    with SentinelSet() as sentinel:
        yield _locks_service(sentinel.url, {"sentinel": sentinel})


@contextlib.contextmanager
def cluster_service() -> Iterator[Service]:
    """A Redis Cluster (3 masters, 3 replicas): the lock Redis of every server."""
    from locks.servers.cluster import RedisClusterSet

    with RedisClusterSet() as cluster:
        yield _locks_service(cluster.url, {"cluster": cluster})


@contextlib.contextmanager
def redlock_service() -> Iterator[Service]:
    """Five independent Redis masters; every server takes its locks by Redlock over them."""
    from django.conf import settings

    from locks.servers.redlock import RedlockServers

    with RedlockServers(5) as masters:
        yield Service(env={"LOCKS_BACKEND": "redlock", "LOCKS_REDLOCK_URLS": ",".join(masters.urls)},
                      processes={"redlock": masters},
                      settings={"LOCKS": {**settings.LOCKS, "BACKEND": "redlock", "REDLOCK_URLS": masters.urls}})


@contextlib.contextmanager
def zookeeper_service() -> Iterator[Service]:
    """A private ZooKeeper server; every server's locks are its ephemeral sequential nodes."""
    from django.conf import settings

    from locks.servers.zookeeper import ZooKeeperProcess

    server = ZooKeeperProcess()
    server.start()
    try:
        yield Service(env={"LOCKS_BACKEND": "zookeeper", "LOCKS_ZOOKEEPER_HOSTS": server.hosts},
                      processes={"zookeeper": server},
                      settings={"LOCKS": {**settings.LOCKS, "BACKEND": "zookeeper", "ZOOKEEPER_HOSTS": server.hosts}})
    finally:
        server.stop()


def restart_zookeeper(ctx: Context) -> Fault:
    """The ZooKeeper server SIGKILLed and restarted on its data (shorter than the session timeout:
    the sessions, and the locks with them, survive)."""
    server = ctx.service.processes["zookeeper"]
    length = ctx.config.fault_length

    def inject() -> tuple[str, float]:
        server.stop()
        return f"zookeeper: server on port {server.port} killed (SIGKILL)", time.monotonic()

    def heal() -> tuple[str, float]:
        took = server.start()
        return f"zookeeper: restarted after {length:g} s (answering {took:.2f} s after the start)", time.monotonic()

    return Fault(inject=inject, heal=heal, outage=True)


def _failover(ctx: Context, kind: str) -> Fault:
    """SIGKILL the master that has the product's lock; healed when a replica is promoted."""
    from locks.keys import LockKeys
    from shop.services.locking import product_lock

    servers = ctx.service.processes[kind]

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
    masters = ctx.service.processes["redlock"]
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
                 "retry the same Idempotency-Key on the others", fault=kill_app_server, service=shared_service),
    HttpScenario("restart-redis-http", "3 app servers: kill their lock Redis, restart it empty",
                 fault=restart_locks_redis, service=private_locks_redis),
    HttpScenario("sentinel-failover", "3 app servers on Redis Sentinel: kill the master; the sentinels promote "
                 "the replica, which may not have the lock (asynchronous replication)",
                 fault=lambda ctx: _failover(ctx, "sentinel"), service=sentinel_service),
    HttpScenario("cluster-failover", "3 app servers on a Redis Cluster: kill the master of the product "
                 "lock's slot; its replica takes over", fault=lambda ctx: _failover(ctx, "cluster"),
                 service=cluster_service),
    HttpScenario("redlock-kill-2", "3 app servers on Redlock over 5 masters: kill 2 (a majority is left), "
                 "restart them empty", fault=kill_two_redlock_masters, service=redlock_service),
    HttpScenario("zookeeper-restart", "3 app servers on ZooKeeper: kill the server, restart it on its data",
                 fault=restart_zookeeper, service=zookeeper_service),
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
    return outcome_of_code(error.get("code", "") if isinstance(error, dict) else ""), None


def _buyer(index: int, urls: list[str], tokens: list[str], product_id: int, run_id: str, stop_at: float,
           out: Connection) -> None:
    """A forked buyer: POST orders to its server until stop_at; on a connection error, mark that
    server dead and send the same request (same key) to another one, until a definitive answer."""
    rng = random.Random(index)
    alive = list(urls)
    sent = 0

    def server() -> str:
        return alive[index % len(alive)]

    try:
        while time.monotonic() < stop_at:
            sent += 1
            key = f"http-{run_id}-{index}-{sent}"
            token = rng.choice(tokens)
            out.send(("begin", key))
            start = time.monotonic()
            cut = False
            while True:
                url = server()
                try:
                    status, body = _post(url, token, product_id, key)
                except _CONNECTION_ERRORS as exc:
                    kind = exc.args[0] if isinstance(exc, _Unreachable) else type(exc).__name__
                    out.send(("cut", key, urls.index(url), time.monotonic(), kind))
                    cut = True
                    if url in alive and len(alive) > 1:
                        alive.remove(url)  # as a load balancer would: this server is gone
                    elif time.monotonic() > stop_at + SETTLE_FOR:
                        outcome, order_id = ERROR, None
                        break
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
                break
            out.send(("request", start, time.monotonic(), outcome, order_id, urls.index(url), cut))
            if outcome != PLACED:
                time.sleep(REFUSAL_PAUSE)
    except Exception:  # the journal itself failed (the parent is gone): nothing left to do
        return
    finally:
        out.close()


class _Journal:
    """Reads every buyer's pipe in a thread while the parent injects the fault."""

    def __init__(self, pipes: dict[int, Connection]) -> None:
        self.requests: list[Request] = []
        self.servers: dict[int, dict[str, int]] = {}  # server index -> outcome -> answers
        self.cut: list[tuple[str, int, float, str]] = []  # (key, server index, when, error)
        self.retries: list[tuple[str, bool, str]] = []  # (key, replayed, outcome)
        self.unsettled: list[str] = []  # keys cut and never answered definitively
        self.in_flight: dict[int, str] = {}
        self.lock = threading.Lock()
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
                buyer = by_conn[conn]
                with self.lock:
                    self._note(buyer, message)

    def _note(self, buyer: int, message: tuple) -> None:
        kind = message[0]
        if kind == "begin":
            self.in_flight[buyer] = message[1]
        elif kind == "cut":
            self.cut.append(message[1:])
        elif kind == "retry":
            self.retries.append(message[1:])
        elif kind == "request":
            start, end, outcome, order_id, server, cut = message[1:]
            self.requests.append(Request(start, end, outcome, order_id, buyer=buyer))
            counts = self.servers.setdefault(server, dict.fromkeys(OUTCOMES, 0))
            counts[outcome] += 1
            key = self.in_flight.pop(buyer, None)
            if cut and outcome != PLACED and key is not None:
                self.unsettled.append(key)


# --- the outcome ----------------------------------------------------------------------------
@dataclass
class HttpFaultOutcome:
    scenario: HttpScenario
    config: HttpFaultConfig
    faults: int
    requests: list[Request]
    oversold: int
    violations: list[str]
    liveness: Liveness
    stall_limit: float
    injected_at: float  # seconds into the run
    recovery: float | None  # seconds from the fault (or its heal) until an order asked after it was placed
    fault_stall: float  # the longest gap in placed orders around the fault (an outage's length included)
    refused_during_fault: int  # non-placed answers from the fault to the recovery
    cut: int  # requests cut in flight (connection reset or closed before the answer)
    connect_refused: int  # requests a dead server's port refused (nothing was sent)
    retries: int  # cut requests sent again with the same key (to another server)
    replays: int  # ... answered with the order a server had already committed for that key (200)
    settled: int  # cut requests never answered definitively, settled from the database by key
    fence_refusals: int  # writes the fence refused during the run (shop/services/fences.py)
    servers: dict[str, dict[str, int]]  # URL -> outcome -> answers (by the server that answered)
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

    def as_dict(self) -> dict[str, object]:
        return {
            "scenario": self.scenario.name, "passed": self.passed, "problems": self.problems,
            "orders": self.orders, "oversold": self.oversold, "faults": self.faults,
            "injected_at": self.injected_at, "recovery_s": self.recovery, "fault_stall_s": self.fault_stall,
            "refused_during_fault": self.refused_during_fault, "cut_in_flight": self.cut,
            "connect_refused": self.connect_refused, "retries": self.retries,
            "replays": self.replays, "settled_from_db": self.settled, "fence_refusals": self.fence_refusals,
            "longest_stall_s": self.liveness.longest_stall, "longest_request_s": self.liveness.longest_request,
            "busy": self.liveness.busy, "servers": self.servers, "notes": self.notes,
        }


# --- one scenario ---------------------------------------------------------------------------
def run_scenario(name: str, config: HttpFaultConfig | None = None, *, keep: bool = False,
                 say: Callable[[str], None] = lambda line: None) -> HttpFaultOutcome:
    scenario = SCENARIOS[name]
    config = config or HttpFaultConfig()
    with scenario.service() as service:
        servers = appservers.AppServers(config.servers, workers=config.server_workers,
                                        threads=config.server_threads, env=service.env)
        servers.start()
        try:
            say(f"{config.servers} app servers up: {', '.join(servers.urls)}")
            # This process looks at the lock service the servers use (lock holders, I6, cleanup).
            with override_settings(**service.settings):
                return _run(scenario, config, servers, service, keep=keep, say=say)
        finally:
            servers.stop()


def _run(scenario: HttpScenario, config: HttpFaultConfig, servers: appservers.AppServers, service: Service, *,
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


def _drive(scenario: HttpScenario, config: HttpFaultConfig, servers: appservers.AppServers, service: Service,
           work: workloads.Workload, *, keep: bool, say: Callable[[str], None]) -> HttpFaultOutcome:
    from shop.loadtest.scenarios import _tokens
    from shop.services import fences

    product_id = work.product_ids[0]
    tokens = list(_tokens(work.user_ids).values())
    urls = servers.urls
    fault = scenario.fault(Context(servers=servers, service=service, config=config, product_id=product_id))
    connections.close_all()  # the buyers must not share the parent's MySQL connection
    started = time.monotonic()
    stop_at = started + config.duration
    pipes, procs = {}, {}
    for index in range(config.buyers):
        reader, writer = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=_buyer, args=(index, urls, tokens, product_id, work.run_id, stop_at, writer),
                            daemon=True)
        proc.start()
        writer.close()
        pipes[index], procs[index] = reader, proc
    journal = _Journal(pipes)
    notes: list[str] = []
    injected = healed = None
    try:
        time.sleep(max(started + config.fault_at - time.monotonic(), 0))
        note, injected = fault.inject()
        healed = injected
        notes.append(note)
        say(note)
        if fault.heal is not None:
            time.sleep(max(injected + config.fault_length - time.monotonic(), 0))
            note, healed = fault.heal()
            notes.append(note)
            say(note)
    finally:
        for proc in procs.values():
            proc.join(max(stop_at - time.monotonic(), 0) + SETTLE_FOR + REQUEST_TIMEOUT + 5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
                notes.append(f"buyer {proc.pid} did not finish: killed")
        journal.thread.join(10)
    requests = sorted(journal.requests, key=lambda r: r.start)
    return _verdict(scenario, config, work, requests, journal, urls, started, stop_at, injected, healed,
                        fault, notes, fences.refusals(workloads.lock_names(work)), keep=keep)


def _verdict(scenario, config, work, requests, journal, urls, started, stop_at, injected, healed, fault, notes,
             fence_refusals, *, keep) -> HttpFaultOutcome:
    from shop.invariants import check_invariants
    from shop.models import Order

    time.sleep(float(shop_settings.LOCK_TTL) + 0.2)  # a killed holder's lease runs out: no lock left over
    book = workloads.books(work)[0]
    oversold = book.sold - (book.initial - book.current)
    # A cut request whose retries never got a definitive answer (busy to the end): its client
    # would retry the key later and get the order if one was committed. Settle it the same way.
    settled = list(Order.objects.filter(idempotency_key__in=journal.unsettled).values_list("pk", flat=True))
    violations = check_invariants(
        product_ids=work.product_ids, initial_stock=work.initial_stock,
        seen_order_ids=[r.order_id for r in requests if r.order_id is not None] + settled,
    )
    in_stock = [(started + 0.5, injected), (healed, stop_at)] if fault.outage else [(started + 0.5, stop_at)]
    figures = liveness(requests, in_stock=in_stock, healed_at=healed)
    placed = sorted(r.end for r in requests if r.outcome == PLACED)
    after = [r.end for r in requests if r.outcome == PLACED and r.start >= healed]
    recovery = min(after) - healed if after else None
    # The stall the fault caused: the longest gap in placed orders from the last one before the
    # fault until the stall bound after it healed (a dead holder's lease, an outage's length).
    stall_limit = float(shop_settings.LOCK_WAIT) + 1.0
    before = max((t for t in placed if t <= injected), default=started)
    window_end = min(healed + stall_limit, stop_at)
    points = [before, *(t for t in placed if before < t < window_end), window_end]
    fault_stall = max(b - a for a, b in itertools.pairwise(points))
    until = healed + recovery if recovery is not None else stop_at
    refused = sum(1 for r in requests if r.outcome != PLACED and injected <= r.end <= until)
    if not keep:
        workloads.cleanup(work)  # its fence refusal counts too
    return HttpFaultOutcome(
        scenario=scenario, config=config, faults=1 if injected is not None else 0, requests=requests,
        oversold=oversold, violations=violations, liveness=figures,
        stall_limit=stall_limit, injected_at=injected - started, recovery=recovery, fault_stall=fault_stall,
        refused_during_fault=refused,
        cut=sum(1 for c in journal.cut if c[3] != "ConnectionRefusedError"),
        connect_refused=sum(1 for c in journal.cut if c[3] == "ConnectionRefusedError"),
        retries=len({key for key, _, _ in journal.retries}),
        replays=len({key for key, replayed, _ in journal.retries if replayed}),
        settled=len(settled), fence_refusals=fence_refusals,
        servers={urls[i]: counts for i, counts in sorted(journal.servers.items())}, notes=notes,
    )


def table(outcomes: list[HttpFaultOutcome]) -> str:
    head = ["scenario", "orders", "oversold", "longest stall", "stall at fault", "recovery",
            "refused in fault", "cut", "conn. refused", "retries", "replays", "fence refusals", "verdict"]
    rows = [[o.scenario.name, f"{o.orders:,}", str(o.oversold), f"{o.liveness.longest_stall:.2f} s",
             f"{o.fault_stall:.2f} s", "-" if o.recovery is None else f"{o.recovery:.2f} s",
             str(o.refused_during_fault), str(o.cut), str(o.connect_refused), str(o.retries), str(o.replays),
             str(o.fence_refusals),
             "PASS" if o.passed else "FAIL: " + "; ".join(o.problems)] for o in outcomes]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def servers_lines(outcome: HttpFaultOutcome) -> list[str]:
    """One line per server: its answers by outcome."""
    return [f"{url}: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            for url, counts in outcome.servers.items()]

