"""Open-loop load over HTTP: orders sent at their scheduled times, whatever became of earlier ones.

A crowd does not wait for the server to answer one buyer before the next arrives; a closed-loop
client does, and so slows down with the server and hides an overload. Here every request has a
time in a schedule (phases of constant rates), is sent then on a new connection with its own
Idempotency-Key, and its latency counts from that scheduled time: a request the client process
could only send late (it was busy) is charged for the lateness too, so nothing hides the wait.
A buyer gives up after `patience` seconds: a request with no answer by then is "abandoned".

Several forked client processes share the schedule (process k sends every n-th request), so
the generator keeps up; what it really sent is reported beside what was scheduled. Connections
come from several loopback addresses (127.0.0.2...) when the server is on 127.0.0.1, so tens of
thousands of short connections do not run out of source ports.

    result = run(Plan(url=..., phases=[Phase("1x", rate=700, seconds=8, product_id=p)], tokens=[...]))
    summary(result, phase)        # offered, goodput, latencies, busy answers, abandoned, ...

The books say the rest: `unseen(...)` lists the orders committed for requests whose buyer never
saw the answer (abandoned, or a connection error): a crowd's success must not sell to buyers who
left. `unseen_by_answer(...)` says what each of those buyers got instead: a failure answer for a
committed order is the server contradicting itself (I5); an abandoned request is the server's
lateness only if it had the request for longer than its deadline (it counts from when it took the
request; a connection the server's kernel accepted late, or a client that sent late, left it less).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

FORK = multiprocessing.get_context("fork")

# What a request's answer was, by HTTP status and the shop's error code.
PLACED, REPLAYED, SOLD_OUT, REJECTED = "placed", "replayed", "sold_out", "rejected"
BUSY, TIMEOUT, UNAVAILABLE, ERROR = "busy", "timeout", "unavailable", "error"
ABANDONED, CONN_ERROR = "abandoned", "conn_error"
OUTCOMES = (PLACED, REPLAYED, SOLD_OUT, REJECTED, BUSY, TIMEOUT, UNAVAILABLE, ERROR, ABANDONED, CONN_ERROR)
UNANSWERED = (ABANDONED, CONN_ERROR)
CAPACITY_FIRST = 10**9  # request indexes of the closed-loop capacity run start here


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # requests per second, sent evenly
    seconds: float
    product_id: int


@dataclass(frozen=True)
class Plan:
    url: str
    phases: list[Phase]
    tokens: list[str]  # the buyers' API tokens; request i is sent by buyer i mod len
    run_id: str
    clients: int = 3  # sending processes
    patience: float = 10.0  # seconds a buyer waits for an answer
    prefer_wait: float | None = None  # sent as "Prefer: wait=N" when set
    pause: float = 0.0  # seconds between phases (nothing sent)

    def key(self, index: int) -> str:
        """Request `index`'s Idempotency-Key: the books find its order by it (capacity runs,
        CAPACITY_FIRST and up, have keys of their own)."""
        return f"{'cap' if index >= CAPACITY_FIRST else 'ol'}-{self.run_id}-{index}"

    def schedule(self) -> list[tuple[int, int, float]]:
        """(index, phase, offset in seconds from the start) of every request."""
        out, start = [], 0.0
        for p, phase in enumerate(self.phases):
            n = round(phase.rate * phase.seconds)
            out += [(len(out) + k, p, start + k / phase.rate) for k in range(n)]
            start += phase.seconds + self.pause
        return out

    def phase_start(self, p: int) -> float:
        return sum(ph.seconds + self.pause for ph in self.phases[:p])


@dataclass(frozen=True)
class Sent:
    index: int
    phase: int
    scheduled: float  # seconds from the run's start
    started: float  # when the client really began (seconds from the start)
    latency: float  # answer time - scheduled time (patience for the unanswered)
    outcome: str
    status: int = 0
    code: str = ""
    order_id: int | None = None
    retry_after: str | None = None
    connected: float | None = None  # when the connection was established (seconds from the start)


@dataclass
class Result:
    plan: Plan
    sent: list[Sent] = field(default_factory=list)
    client_cpu: float = 0.0  # CPU seconds the client processes used (the generator's own cost)

    def of_phase(self, p: int) -> list[Sent]:
        return [s for s in self.sent if s.phase == p]


# --- one exchange ----------------------------------------------------------------------------
def _request_bytes(plan: Plan, index: int, product_id: int, host: str) -> bytes:
    body = json.dumps({"lines": [{"product_id": product_id, "quantity": 1}]}).encode()
    token = plan.tokens[index % len(plan.tokens)]
    prefer = f"Prefer: wait={plan.prefer_wait:g}\r\n" if plan.prefer_wait is not None else ""
    return (f"POST /api/orders/ HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nIdempotency-Key: {plan.key(index)}\r\n{prefer}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class _Exchange(asyncio.Protocol):
    """One request on a new connection, its answer read to the end: a bare protocol rather than
    asyncio's streams, whose per-connection objects cost the generator a third of its CPU."""

    def __init__(self, request: bytes, done: asyncio.Future) -> None:
        self.request, self.done, self.data = request, done, bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.data += data
        if (answer := _complete(self.data)) is not None and not self.done.done():
            self.done.set_result(answer)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            answer = _complete(self.data, eof=True)
            if answer is not None:
                self.done.set_result(answer)
            else:
                self.done.set_exception(exc or ConnectionResetError("closed before a whole answer"))


def _complete(data: bytearray, *, eof: bool = False) -> tuple[int, dict[str, str], bytes] | None:
    """(status, headers, body) once `data` holds a whole answer, else None."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    lines = bytes(data[:head_end]).decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = bytes(data[head_end + 4:])
    if (length := headers.get("content-length")) is not None:
        return (status, headers, body[:int(length)]) if len(body) >= int(length) else None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, at = b"", 0
        while True:
            line_end = body.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(body[at:line_end].split(b";")[0], 16)
            if size == 0:
                return status, headers, out
            if len(body) < line_end + 2 + size + 2:
                return None
            out += body[line_end + 2:line_end + 2 + size]
            at = line_end + 2 + size + 2
    return (status, headers, body) if eof else None


async def _exchange(host: str, port: int, local: str | None, request: bytes,
                    connected: list[float] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request's answer; the loop's time the connection was established is appended to
    `connected` (kept when the answer never comes)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _Exchange(request, done), host, port,
                                                local_addr=(local, 0) if local else None)
    if connected is not None:
        connected.append(loop.time())
    try:
        return await done
    finally:
        transport.close()


def classify(status: int, body: bytes) -> tuple[str, str, int | None]:
    """(outcome, error code, order id) of an answer. A refusal is rejected or an error by the same
    rule as the closed-loop runs (`strategies.outcome_of_code`)."""
    from loadtest.strategies import REJECTED as REFUSED
    from loadtest.strategies import outcome_of_code

    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    error = (data.get("error") or {}) if isinstance(data, dict) else {}
    code = error.get("code", "")
    if code == "busy":  # where it was refused: the server's queue, or the app's admission/deadline
        details = error.get("details") or {}
        code = f"busy:{details.get('where', 'app')}:{details.get('reason', '?')}"
    if status == 201:
        return PLACED, "", data.get("id")
    if status == 200:
        return REPLAYED, "", data.get("id")
    if code == "out_of_stock":
        return SOLD_OUT, code, None
    if code.startswith("busy"):
        return BUSY, code, None
    if code == "lock_timeout":
        return TIMEOUT, code, None
    if status == 503:
        return UNAVAILABLE, code, None
    if outcome_of_code(code, status) == REFUSED:
        return REJECTED, code, None
    return ERROR, code or str(status), None


# --- a sending process -----------------------------------------------------------------------
def _locals(host: str, count: int) -> list[str | None]:
    if host in ("127.0.0.1", "localhost"):
        return [f"127.0.0.{2 + i % 250}" for i in range(count)]
    return [None]


async def _send_all(plan: Plan, mine: list[tuple[int, int, float]], t0: float) -> list[Sent]:
    parts = urlsplit(plan.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    host_header = parts.netloc
    sources = _locals(host, 8)
    loop = asyncio.get_running_loop()
    out: list[Sent] = []

    async def one(index: int, p: int, offset: float) -> None:
        started = loop.time() - t0
        request = _request_bytes(plan, index, plan.phases[p].product_id, host_header)
        left = offset + plan.patience - started
        connected: list[float] = []
        try:
            status, headers, body = await asyncio.wait_for(
                _exchange(host, port, sources[index % len(sources)], request, connected), timeout=max(left, 0.001))
        except TimeoutError:
            out.append(Sent(index, p, offset, started, plan.patience, ABANDONED,
                            connected=connected[0] - t0 if connected else None))
            return
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            out.append(Sent(index, p, offset, started, loop.time() - t0 - offset, CONN_ERROR,
                            connected=connected[0] - t0 if connected else None))
            return
        kind, code, order_id = classify(status, body)
        out.append(Sent(index, p, offset, started, loop.time() - t0 - offset, kind, status, code, order_id,
                        headers.get("retry-after"), connected[0] - t0))

    tasks = []
    for index, p, offset in mine:
        delay = t0 + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one(index, p, offset)))
    await asyncio.gather(*tasks)
    return out


def _client(plan: Plan, mine: list[tuple[int, int, float]], t0: float, queue) -> None:
    try:
        sent = asyncio.run(_send_all(plan, mine, t0))
        queue.put(("ok", (sent, time.process_time())))
    except BaseException as exc:  # the parent reports it
        queue.put(("error", repr(exc)))


def run(plan: Plan, *, start_in: float = 1.0) -> Result:
    """Send the plan's schedule from `plan.clients` forked processes; every request's fate."""
    from django.db import connections

    schedule = plan.schedule()
    connections.close_all()  # children never share the parent's database connection
    t0 = time.monotonic() + start_in
    queue = FORK.Queue()
    procs = [FORK.Process(target=_client, args=(plan, schedule[k::plan.clients], t0, queue), daemon=True)
             for k in range(plan.clients)]
    result = Result(plan=plan)
    total = sum(ph.seconds for ph in plan.phases) + plan.pause * len(plan.phases) + plan.patience + start_in + 60
    for sent, cpu in gather(procs, queue, timeout=total):
        result.sent += sent
        result.client_cpu += cpu
    result.sent.sort(key=lambda s: s.index)
    return result


def gather(procs: list, queue, *, timeout: float) -> list[Any]:
    """Start the client processes and collect what each one put on `queue` ("ok", value); one
    that failed ("error", why) fails the run, once all have answered."""
    for proc in procs:
        proc.start()
    values, errors = [], []
    for _ in procs:
        status, value = queue.get(timeout=timeout)
        (values if status == "ok" else errors).append(value)
    for proc in procs:
        proc.join(10)
    if errors:
        raise RuntimeError("a client process failed: " + "; ".join(errors))
    return values


# --- capacity: closed-loop ---------------------------------------------------------------------
async def _closed_loop(plan: Plan, product_id: int, buyers: int, seconds: float, first: int) -> int:
    parts = urlsplit(plan.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    sources = _locals(host, 8)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    placed = 0
    counter = iter(range(first, first + 10**9))

    async def buyer() -> None:
        nonlocal placed
        while loop.time() < end:
            index = next(counter)
            try:
                status, _, body = await asyncio.wait_for(_exchange(
                    host, port, sources[index % len(sources)], _request_bytes(plan, index, product_id, parts.netloc)),
                    timeout=plan.patience)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                continue
            if classify(status, body)[0] == PLACED:
                placed += 1

    await asyncio.gather(*(buyer() for _ in range(buyers)))
    return placed


def measure_capacity(plan: Plan, *, product_id: int, buyers: int = 32, seconds: float = 5.0) -> float:
    """Orders per second the server places for `buyers` closed-loop clients (each waits for its
    answer before it sends again): the capacity C that the open-loop phases are multiples of."""
    started = time.monotonic()
    placed = asyncio.run(_closed_loop(plan, product_id, buyers, seconds, first=CAPACITY_FIRST))
    return placed / max(time.monotonic() - started, 1e-9)


# --- what it says ------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Summary:
    phase: Phase
    scheduled: int
    offered_rate: float  # requests per second scheduled
    sent_rate: float  # requests per second the clients really started within the phase
    send_lag_p99: float | None
    counts: dict[str, int]
    goodput: float  # orders per second whose buyer saw them placed within patience
    p50: float | None  # every answer's latency from its scheduled time
    p99: float | None
    within_deadline: float  # share of requests answered within `deadline` seconds
    busy_p99: float | None  # latency of the "busy" answers
    sold_out_p99: float | None
    first_second_p99: float | None  # requests scheduled in the phase's first second
    rejected: dict[str, int] = field(default_factory=dict)  # rejected answers by error code, most first


def summarize(result: Result, p: int, *, deadline: float) -> Summary:
    phase, sent = result.plan.phases[p], result.of_phase(p)
    start = result.plan.phase_start(p)
    counts = Counter(s.outcome for s in sent)
    answered = [s.latency for s in sent if s.outcome not in UNANSWERED]
    in_phase = [s for s in sent if s.started <= start + phase.seconds]
    return Summary(
        phase=phase, scheduled=len(sent), offered_rate=len(sent) / phase.seconds,
        sent_rate=len(in_phase) / phase.seconds,
        send_lag_p99=percentile([s.started - s.scheduled for s in sent], 0.99),
        counts={k: counts.get(k, 0) for k in OUTCOMES},
        goodput=counts.get(PLACED, 0) / phase.seconds,
        p50=percentile(answered, 0.50), p99=percentile(answered, 0.99),
        within_deadline=(sum(1 for s in sent if s.outcome not in UNANSWERED and s.latency <= deadline)
                         / max(len(sent), 1)),
        busy_p99=percentile([s.latency for s in sent if s.outcome == BUSY], 0.99),
        sold_out_p99=percentile([s.latency for s in sent if s.outcome == SOLD_OUT], 0.99),
        first_second_p99=percentile([s.latency for s in sent if s.outcome not in UNANSWERED
                                     and s.scheduled < start + 1.0], 0.99),
        rejected=dict(Counter(s.code for s in sent if s.outcome == REJECTED).most_common()),
    )


def unseen(result: Result, p: int | None = None) -> tuple[int, int]:
    """(orders committed for this run's requests (of phase `p`), of which their buyer never saw
    placed): read from the books by the requests' Idempotency-Keys."""
    from shop.models import Order

    sent = result.sent if p is None else result.of_phase(p)
    asked = {result.plan.key(s.index) for s in sent}
    seen = {result.plan.key(s.index) for s in sent if s.outcome in (PLACED, REPLAYED)}
    keys = [k for k in Order.objects.filter(idempotency_key__startswith=f"ol-{result.plan.run_id}-")
            .values_list("idempotency_key", flat=True) if k in asked]
    return len(keys), sum(1 for k in keys if k not in seen)


# What a buyer whose order was committed got instead of seeing it (`unseen_by_answer`).
LEFT_EARLY = "abandoned (reached the server late)"  # its whole deadline did not fit in the patience left
LEFT_LATE = "abandoned (past the server's deadline)"


def unseen_by_answer(result: Result, p: int | None = None, *, deadline: float) -> dict[str, int]:
    """The orders committed for this run's requests (of phase `p`) whose buyer did not see them,
    by what the buyer got instead: an answer's outcome and code (a failure told for a committed
    order: the server broke I5), `CONN_ERROR`, or abandoned, split by how long the server had
    the request before the buyer left (from the connection's establishment; `deadline`: the
    server's): LEFT_EARLY when that was less than its deadline (the time went before the server
    had it: a late send, SYN retries on a full backlog), else LEFT_LATE (the server was late)."""
    from shop.models import Order

    patience = result.plan.patience
    sent = {result.plan.key(s.index): s for s in (result.sent if p is None else result.of_phase(p))}
    keys = Order.objects.filter(idempotency_key__startswith=f"ol-{result.plan.run_id}-").values_list(
        "idempotency_key", flat=True)
    out: Counter[str] = Counter()
    for key in keys:
        s = sent.get(key)
        if s is None or s.outcome in (PLACED, REPLAYED):
            continue
        if s.outcome == ABANDONED:
            had = None if s.connected is None else s.scheduled + patience - s.connected
            out[LEFT_EARLY if had is not None and had < deadline else LEFT_LATE] += 1
        elif s.outcome == CONN_ERROR:
            out[CONN_ERROR] += 1
        else:
            out[f"{s.outcome}:{s.code}" if s.code else s.outcome] += 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# --- a crowd: the profiles of `loadtest --url URL --profile spike|flash` ---------------------
SPIKE = (0.5, 1.0, 2.0, 4.0, 10.0, 0.5)  # multiples of the capacity, one phase each
FLASH = (4.0, 10.0)  # one flash sale each, on a product of its own
FLASH_STOCK = 1000


@dataclass
class Crowd:
    """What `crowd` measured: the capacity, each phase, the books."""

    profile: str
    capacity: float
    result: Result
    summaries: list[Summary]
    unseen: list[tuple[int, int]]  # per phase: (orders committed, of which unseen by their buyer)
    oversold: int
    sold_out_at: list[float | None]  # per phase: seconds into it of the first "sold out" answer
    deadline: float
    unseen_by: list[dict[str, int]] = field(default_factory=list)  # per phase: unseen_by_answer


def crowd(url: str, *, profile: str, capacity: float | None = None, rate: float | None = None,
          seconds: float = 8.0, clients: int = 3, patience: float = 10.0, users: int = 300,
          prefer_wait: float | None = None) -> Crowd:
    """Create the buyers and products, measure the capacity C (unless given), send the profile's
    phases open-loop, read the books, clean up. `profile`: "spike" (SPIKE x C on one product),
    "flash" (FLASH x C, each on a product of FLASH_STOCK units) or "rate" (`rate` for `seconds`)."""
    from loadtest import workload
    from shop.edge import deadlines
    from shop.models import ApiToken, Product

    # The phases' products (a flash sale's have FLASH_STOCK units), then one for the capacity run.
    products = len(FLASH) if profile == "flash" else 1
    w = workload.create(workload.new_run_id(), products=products + 1,
                        stock=FLASH_STOCK if profile == "flash" else 10**9, users=users)
    *_, probe = w.product_ids
    Product.objects.filter(pk=probe).update(stock=10**9)
    w.initial_stock[probe] = 10**9
    try:
        tokens = [ApiToken.issue(user_id=uid) for uid in w.user_ids]
        base = Plan(url=url, phases=[], tokens=tokens, run_id=w.run_id, clients=clients, patience=patience,
                    prefer_wait=prefer_wait)
        if profile == "rate":
            capacity = capacity or float(rate or 0)
            phases = [Phase(f"{rate:g}/s", rate=float(rate or 0), seconds=seconds, product_id=w.product_ids[0])]
        else:
            if capacity is None:  # on a product of its own: the flash products keep their stock
                capacity = measure_capacity(base, product_id=probe)
            multiples = FLASH if profile == "flash" else SPIKE
            phases = [Phase(f"{'flash ' if profile == 'flash' else ''}{m:g}x", rate=m * capacity, seconds=seconds,
                            product_id=w.product_ids[i if profile == "flash" else 0])
                      for i, m in enumerate(multiples)]
        plan = replace(base, phases=phases, pause=2.0 if profile == "flash" else 0.0)
        result = run(plan)
        deadline = deadlines.budget() if prefer_wait is None else min(deadlines.budget(), prefer_wait)
        summaries = [summarize(result, p, deadline=deadline) for p in range(len(phases))]
        sold_out_at = [min((s.scheduled - plan.phase_start(p) for s in result.of_phase(p) if s.outcome == SOLD_OUT),
                           default=None) for p in range(len(phases))]
        return Crowd(profile=profile, capacity=float(capacity or 0), result=result, summaries=summaries,
                     unseen=[unseen(result, p) for p in range(len(phases))],
                     oversold=sum(max(b.oversold, 0) for b in workload.books(w)), sold_out_at=sold_out_at,
                     deadline=deadline,
                     unseen_by=[unseen_by_answer(result, p, deadline=deadline) for p in range(len(phases))])
    finally:
        workload.cleanup(w)
