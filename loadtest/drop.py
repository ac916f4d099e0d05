"""A drop's crowd, open loop over HTTP: who gets the units, how soon the others hear, at what cost.

`manage.py loadtest --url URL --profile drop` (issue 36's measurement; docs/benchmarks.md). A
product with `units` units, one per buyer, opens a few seconds after the setup; its buyers arrive
at scheduled times spread evenly over the first `arrival_seconds` after the opening (or over the
pre-queue before it), in a shuffled order of two kinds:

- a PERSON sends one request at a time with one Idempotency-Key; told to wait (503, 429, 202, or
  "not open yet"), it waits the Retry-After it was given (plus up to 100 ms) and asks again,
  sending back the cookies and the `Line-Ticket` header the server gave it (a line's place). It
  stops at a final answer (placed, sold out, any other refusal), or gives up: it starts no attempt
  after `patience` seconds (an attempt waits up to 10 s for its answer, longer than the server's
  deadline, so an order placed for a buyer who never heard of it is the server's doing);
- a SCRIPT keeps 3 attempts in flight, each a new connection with a new key, and sends again
  50 ms after each answer whatever Retry-After said, until it sees an order placed, "sold out" or
  another refusal (the cap); the answers of its attempts still in flight then are counted too.

Arrival is when a buyer first sent (its lateness against the schedule is reported: the
generator must keep up). The figures are computed from the buyers' records by the functions
below (`fifo_share`, `advantage`, ...), and the books are read from the database afterwards.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
import resource
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from loadtest import openloop
from loadtest.openloop import percentile

PERSON, SCRIPT = "person", "script"
WON, LOST, GAVE_UP = "won", "lost", "gave_up"
SCRIPT_INFLIGHT = 3  # a script's attempts in flight
SCRIPT_EVERY = 0.05  # seconds between a script's answer and its next attempt
JITTER = 0.1  # up to this much is added to a person's Retry-After
NO_RETRY_AFTER = 1.0  # seconds a person waits when told to wait without a Retry-After
RETRY_CODES = ("not_open_yet",)  # refusals that say "later", not "no": asked again


@dataclass(frozen=True)
class Buyer:
    index: int  # 0.. in the run; the account is tokens[index]
    kind: str
    arrival: float  # scheduled, seconds from the opening (negative: in the pre-queue)


@dataclass(frozen=True)
class DropPlan:
    url: str
    product_id: int
    units: int
    buyers: list[Buyer]
    tokens: list[str]
    run_id: str
    clients: int = 3
    patience: float = 30.0  # seconds a buyer starts new attempts for
    user_ids: tuple[int, ...] = ()  # the accounts of tokens[index] (to read their places)
    answer_wait: float = 10.0  # seconds an attempt waits for its answer

    def person_key(self, index: int) -> str:
        return f"dp-{self.run_id}-{index}"

    def script_key(self, index: int, attempt: int) -> str:
        return f"ds-{self.run_id}-{index}-{attempt}"


def crowd(*, people: int, scripts: int, arrival_seconds: float, prequeue_seconds: float = 0.0,
          seed: int = 0) -> list[Buyer]:
    """The buyers, their kinds shuffled, arriving evenly over the window: [0, arrival_seconds)
    after the opening, or [-prequeue_seconds, 0) before it when there is a pre-queue."""
    kinds = [PERSON] * people + [SCRIPT] * scripts
    random.Random(seed).shuffle(kinds)
    n = len(kinds)
    start, span = (-prequeue_seconds, prequeue_seconds) if prequeue_seconds > 0 else (0.0, arrival_seconds)
    return [Buyer(i, kind, start + span * i / max(n, 1)) for i, kind in enumerate(kinds)]


def split_load(load: float, capacity: float, seconds: float, *, people: int, scripts: int) -> tuple[int, int]:
    """(people, scripts) for `load` x C arrivals over `seconds`, in the ratio people : scripts."""
    total = max(1, round(load * capacity * seconds))
    share = scripts / max(people + scripts, 1)
    s = round(total * share)
    return total - s, s


# --- what a buyer saw --------------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    buyer: int
    key: str
    sent: float  # seconds from the opening
    answered: float | None  # None: no answer (gave up waiting, connection error)
    status: int = 0  # 0: no answer
    outcome: str = openloop.CONN_ERROR
    code: str = ""
    order_id: int | None = None
    retry_after: str | None = None  # the Retry-After it was given


@dataclass(frozen=True)
class Record:
    """One buyer's story: when it arrived, when it heard its final answer, what that was."""

    index: int
    kind: str
    scheduled: float
    arrival: float | None  # when it first sent (None: never sent, the run ended first)
    result: str  # WON, LOST or GAVE_UP
    final_at: float | None  # when it heard its final answer (a WON's first placed answer)
    first_status: int  # the status of its first answer (0: none)


@dataclass
class DropResult:
    plan: DropPlan
    records: list[Record] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    client_cpu: float = 0.0


def is_final(status: int, code: str) -> bool:
    """A person stops asking at this answer: placed, or a refusal that is not "not now"."""
    if status in (200, 201):
        return True
    return 400 <= status < 500 and status != 429 and code not in RETRY_CODES


def retry_after(headers: dict[str, str]) -> float:
    """Seconds a person waits before asking again: the Retry-After given (delta-seconds)."""
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return NO_RETRY_AFTER


def set_cookies(head: str, jar: dict[str, str]) -> None:
    """Keep the cookies of an answer's Set-Cookie lines in `jar` (an empty value deletes one)."""
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() != "set-cookie":
            continue
        pair = value.strip().split(";", 1)[0]
        cookie, eq, content = pair.partition("=")
        if not eq or not cookie.strip():
            continue
        if content.strip():
            jar[cookie.strip()] = content.strip()
        else:
            jar.pop(cookie.strip(), None)


# --- the exchange ------------------------------------------------------------------------------
class _Exchange(openloop._Exchange):
    """openloop's one request on a new connection, the answer's head kept whole (Set-Cookie may
    come more than once)."""

    def data_received(self, data: bytes) -> None:
        self.data += data
        if (answer := openloop._complete(self.data)) is not None and not self.done.done():
            head = bytes(self.data[: self.data.find(b"\r\n\r\n")]).decode("latin-1")
            self.done.set_result((*answer, head))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            answer = openloop._complete(self.data, eof=True)
            if answer is not None:
                head = bytes(self.data[: self.data.find(b"\r\n\r\n")]).decode("latin-1")
                self.done.set_result((*answer, head))
            else:
                self.done.set_exception(exc or ConnectionResetError("closed before a whole answer"))


def _request(*, host: str, product_id: int, token: str, key: str, cookies: dict[str, str] | None = None,
             ticket: str | None = None) -> bytes:
    body = f'{{"lines": [{{"product_id": {product_id}, "quantity": 1}}]}}'.encode()
    extra = ""
    if cookies:
        extra += "Cookie: " + "; ".join(f"{k}={v}" for k, v in cookies.items()) + "\r\n"
    if ticket:
        extra += f"Line-Ticket: {ticket}\r\n"
    return (f"POST /api/orders/ HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


async def _buy(plan: DropPlan, mine: list[Buyer], t_open: float) -> tuple[list[Record], list[Attempt]]:
    parts = urlsplit(plan.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    sources = openloop._locals(host, 8)
    loop = asyncio.get_running_loop()
    rand = random.Random(mine[0].index if mine else 0)
    records: list[Record] = []
    attempts: list[Attempt] = []

    def now() -> float:
        return loop.time() - t_open

    async def ask(buyer: Buyer, key: str, cookies=None, ticket=None):
        """One attempt: its record, and (status, headers, code, head) or None without an answer
        within `plan.answer_wait` (longer than the server's deadline, so no attempt is cut short
        while the server may still place its order: an order its buyer never saw is the server's)."""
        request = _request(host=parts.netloc, product_id=plan.product_id, token=plan.tokens[buyer.index],
                           key=key, cookies=cookies, ticket=ticket)
        sent = now()
        done = loop.create_future()
        transport = None
        try:
            async with asyncio.timeout(plan.answer_wait):  # one timer for the whole exchange
                transport, _ = await loop.create_connection(
                    lambda: _Exchange(request, done), host, port,
                    local_addr=(sources[rand.randrange(len(sources))], 0) if sources[0] else None)
                status, headers, body, head = await done
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            attempts.append(Attempt(buyer.index, key, sent, None, code=type(exc).__name__))
            return None
        finally:
            if not done.done():  # cut short: nobody reads what the connection's end would set
                done.cancel()
            if transport is not None:
                transport.close()
        outcome, code, order_id = openloop.classify(status, body)
        attempts.append(Attempt(buyer.index, key, sent, now(), status, outcome, code, order_id,
                                headers.get("retry-after")))
        return status, headers, code, head

    async def person(buyer: Buyer) -> None:
        await asyncio.sleep(max(0.0, buyer.arrival - now()))
        arrival = now()
        until = arrival + plan.patience
        jar: dict[str, str] = {}
        ticket = None
        first = 0
        while now() < until:
            answer = await ask(buyer, plan.person_key(buyer.index), jar, ticket)
            if answer is None:
                wait = NO_RETRY_AFTER
            else:
                status, headers, code, head = answer
                first = first or status
                set_cookies(head, jar)
                ticket = headers.get("line-ticket") or ticket
                if is_final(status, code):
                    records.append(Record(buyer.index, PERSON, buyer.arrival, arrival,
                                          WON if status in (200, 201) else LOST, now(), first))
                    return
                wait = retry_after(headers) if "retry-after" in headers else NO_RETRY_AFTER
            await asyncio.sleep(min(wait + rand.uniform(0, JITTER), max(until - now(), 0)))
        records.append(Record(buyer.index, PERSON, buyer.arrival, arrival, GAVE_UP, None, first))

    async def script(buyer: Buyer) -> None:
        await asyncio.sleep(max(0.0, buyer.arrival - now()))
        arrival = now()
        until = arrival + plan.patience
        counter = iter(range(10**9))
        seen: dict[str, float] = {}  # WON / LOST -> when first heard
        first = 0

        async def slot() -> None:
            nonlocal first
            while now() < until and not seen:
                answer = await ask(buyer, plan.script_key(buyer.index, next(counter)))
                if answer is not None:
                    status, _, code, _ = answer
                    first = first or status
                    if status in (200, 201):
                        seen.setdefault(WON, now())
                    elif is_final(status, code):
                        seen.setdefault(LOST, now())
                if not seen:
                    await asyncio.sleep(SCRIPT_EVERY)

        await asyncio.gather(*(slot() for _ in range(SCRIPT_INFLIGHT)))
        result = WON if WON in seen else LOST if LOST in seen else GAVE_UP
        records.append(Record(buyer.index, SCRIPT, buyer.arrival, arrival, result, seen.get(result), first))

    await asyncio.gather(*((person if b.kind == PERSON else script)(b) for b in mine))
    return records, attempts


def _client(plan: DropPlan, mine: list[Buyer], t_open: float, queue) -> None:
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per buyer and attempt
        records, attempts = asyncio.run(_buy(plan, mine, t_open))
        queue.put(("ok", (records, attempts, time.process_time())))
    except BaseException as exc:  # the parent reports it
        queue.put(("error", repr(exc)))


def run(plan: DropPlan, *, t_open: float) -> DropResult:
    """Send the crowd from `plan.clients` forked processes; `t_open` is the opening, a
    time.monotonic() value (buyer k goes to process k mod clients)."""
    from django.db import connections

    connections.close_all()
    queue = openloop.FORK.Queue()
    procs = [openloop.FORK.Process(target=_client, args=(plan, plan.buyers[k::plan.clients], t_open, queue),
                                   daemon=True) for k in range(plan.clients)]
    result = DropResult(plan=plan)
    last = max((b.arrival for b in plan.buyers), default=0.0)
    total = max(t_open - time.monotonic(), 0) + last + plan.patience + plan.answer_wait + 60
    for records, attempts, cpu in openloop.gather(procs, queue, timeout=total):
        result.records += records
        result.attempts += attempts
        result.client_cpu += cpu
    result.records.sort(key=lambda r: r.index)
    result.attempts.sort(key=lambda a: a.sent)
    return result


# --- the figures -------------------------------------------------------------------------------
def fifo_share(records: Sequence[Record], units: int) -> float | None:
    """Of the winners, the share among the first `units` arrivals (1.0: first come, first served;
    about units / crowd by chance). None without a winner."""
    arrived = sorted((r for r in records if r.arrival is not None), key=lambda r: (r.arrival, r.index))
    first = {r.index for r in arrived[:units]}
    winners = [r for r in records if r.result == WON]
    return sum(1 for r in winners if r.index in first) / len(winners) if winners else None


def placed_in_arrival_order(records: Sequence[Record], placed: Sequence[int], units: int) -> float | None:
    """Of the first `units` arrivals (as the buyers sent), the share that holds one of the line's
    first `units` places (`placed`: buyer indexes in place order). 1.0: the server stamped places
    in the order requests were sent; FIFO share can be no better than this. None without places."""
    if not placed:
        return None
    arrived = sorted((r for r in records if r.arrival is not None), key=lambda r: (r.arrival, r.index))[:units]
    first = set(placed[:units])
    return sum(1 for r in arrived if r.index in first) / len(arrived) if arrived else None


def won_in_place_order(records: Sequence[Record], placed: Sequence[int], units: int) -> float | None:
    """Of the winners, the share holding one of the first `units` places: 1.0 when the line
    served its places in order (whatever order they were stamped in). None without winners."""
    first = set(placed[:units])
    winners = [r for r in records if r.result == WON]
    return sum(1 for r in winners if r.index in first) / len(winners) if winners and placed else None


def win_rate(records: Sequence[Record], kind: str) -> float | None:
    of_kind = [r for r in records if r.kind == kind]
    return sum(1 for r in of_kind if r.result == WON) / len(of_kind) if of_kind else None


def advantage(records: Sequence[Record]) -> float | None:
    """A script's chance over a person's (1.0: retrying buys nothing). None if either is
    undefined or people never won."""
    scripts, people = win_rate(records, SCRIPT), win_rate(records, PERSON)
    return scripts / people if scripts is not None and people else None


def time_to_final(records: Sequence[Record], *, kind: str, result: str) -> list[float]:
    """Seconds from each such buyer's arrival to its final answer."""
    return [r.final_at - r.arrival for r in records
            if r.kind == kind and r.result == result and r.final_at is not None and r.arrival is not None]


def p50_p99(values: Sequence[float]) -> tuple[float | None, float | None]:
    return percentile(values, 0.50), percentile(values, 0.99)


def sales(attempts: Sequence[Attempt]) -> list[float]:
    """When each order was first seen placed (one time per order id), in order."""
    first: dict[int, float] = {}
    for a in attempts:
        if a.outcome == openloop.PLACED and a.answered is not None:
            first[a.order_id] = min(a.answered, first.get(a.order_id, a.answered))
    return sorted(first.values())


def losers_told_within(records: Sequence[Record], last_sale: float | None, seconds: float) -> float | None:
    """The share of losers whose final answer came at most `seconds` after the last unit sold."""
    losers = [r for r in records if r.result == LOST and r.final_at is not None]
    if not losers or last_sale is None:
        return None
    return sum(1 for r in losers if r.final_at <= last_sale + seconds) / len(losers)


def requests_per_unit(attempts: Sequence[Attempt], sold: int) -> float | None:
    return len(attempts) / sold if sold else None


def answers(attempts: Sequence[Attempt]) -> dict[str, int]:
    """Every answer by status, and by the shop's code where there is one ("409 out_of_stock")."""
    counts = Counter(f"{a.status} {a.code}".strip() if a.status else f"no answer {a.code}".strip() for a in attempts)
    return dict(sorted(counts.items()))


def waited_then_won(records: Sequence[Record]) -> int:
    """People whose first answer said "not now" (503, 202) and who still won."""
    return sum(1 for r in records if r.kind == PERSON and r.first_status in (202, 503) and r.result == WON)


def busy_then_won(records: Sequence[Record]) -> int:
    """People whose first answer was 503 (busy: "you lost", before the line kept arrivals) and who
    still won."""
    return sum(1 for r in records if r.kind == PERSON and r.first_status == 503 and r.result == WON)


def goodput(sold_at: Sequence[float]) -> float | None:
    """Units sold a second while stock lasted: from the first sale to the last."""
    if len(sold_at) < 2 or sold_at[-1] <= sold_at[0]:
        return None
    return (len(sold_at) - 1) / (sold_at[-1] - sold_at[0])


def first_second(attempts: Sequence[Attempt], sold_at: Sequence[float]) -> dict[str, float | int | None]:
    """The drop's first second: units sold in it, and the latency of the answers to what was sent in it."""
    latencies = [a.answered - a.sent for a in attempts if 0 <= a.sent < 1.0 and a.answered is not None]
    p50, p99 = p50_p99(latencies)
    return {"units": sum(1 for t in sold_at if 0 <= t < 1.0), "sent": sum(1 for a in attempts if 0 <= a.sent < 1.0),
            "p50": p50, "p99": p99}


def send_lag(records: Sequence[Record]) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, max) of how late the generator sent a buyer's first request against its schedule."""
    lags = [r.arrival - r.scheduled for r in records if r.arrival is not None]
    return percentile(lags, 0.50), percentile(lags, 0.99), max(lags, default=None)


def retry_afters(attempts: Sequence[Attempt]) -> dict[str, int]:
    """The Retry-After values the buyers were given, and how often."""
    counts = Counter(a.retry_after for a in attempts if a.retry_after is not None)
    return dict(sorted(counts.items(), key=lambda kv: (len(kv[0]), kv[0])))


# --- the books ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DropBooks:
    units: int  # the drop's stock before
    sold: int  # stock before - stock after
    orders: int  # the run's orders of the product (reserving)
    seen: int  # distinct orders whose buyer saw them placed
    accounts_over_cap: int  # accounts with more than one order
    not_orders: int  # placed answers naming no order of the product
    unseen: int  # orders whose buyer never saw them placed
    # Orders committed more than the server's budget + LATE_SLACK after their request was last sent.
    # The client's clock: the server's deadline starts later, when a worker takes the connection,
    # so on a starved machine this counts orders that kept their deadline. Shown, not a failure:
    # what a buyer is owed (an order is never placed for one who left) is `unseen`.
    late: int
    committed: tuple[float, ...] = ()  # when each order was placed (created_at), seconds from the opening, in order
    # What the buyer heard of the request of each unseen order (its key's last attempt before the
    # commit: "script TimeoutError", "person ConnectionResetError", ...): where the answer was lost.
    unseen_heard: dict[str, int] = field(default_factory=dict)
    # What breaks the line's invariants (shop/line/invariants.py, docs/design.md "The line": L1-L3).
    line: tuple[str, ...] = ()
    placed: tuple[int, ...] = ()  # the buyers (indexes) in the order of their places in the line

    @property
    def problems(self) -> list[str]:
        out = list(self.line)
        if self.sold > self.units or self.sold != self.orders:
            out.append(f"units sold {self.sold} != orders {self.orders} (stock {self.units})")
        if self.orders != self.seen:
            out.append(f"orders {self.orders} != placed answers seen {self.seen}")
        for name in ("accounts_over_cap", "not_orders", "unseen"):
            if getattr(self, name):
                out.append(f"{name.replace('_', ' ')}: {getattr(self, name)}")
        return out


LATE_SLACK = 1.0  # seconds


def books(result: DropResult, *, wall_open: float, budget: float) -> DropBooks:
    """Read the product's orders and stock and hold them against what the buyers saw."""
    from shop.models import Order, Product
    from shop.services.lines import line_places, line_violations

    plan = result.plan
    product = Product.objects.get(pk=plan.product_id)
    stock = product.stock
    rows = list(Order.objects.filter(lines__product_id=plan.product_id, status__in=("pending_payment", "paid",
                                                                                       "placed"))
                .values_list("pk", "user_id", "idempotency_key", "created_at").distinct())
    seen = {a.order_id for a in result.attempts if a.outcome in (openloop.PLACED, openloop.REPLAYED)}
    ids = {pk for pk, *_ in rows}
    sends: dict[str, list[float]] = {}
    for a in result.attempts:
        sends.setdefault(a.key, []).append(a.sent)
    late = 0
    for _, _, key, created in rows:  # against the last send of its key before the commit
        at = created.timestamp() - wall_open
        before = [s for s in sends.get(key, []) if s <= at]
        late += bool(before) and at > max(before) + budget + LATE_SLACK
    kinds = {b.index: b.kind for b in plan.buyers}
    heard: Counter[str] = Counter()
    for pk, _, key, created in rows:
        if pk not in seen:
            mine = [a for a in result.attempts if a.key == key and a.sent <= created.timestamp() - wall_open]
            last = max(mine, key=lambda a: a.sent, default=None)
            heard[f"{kinds[last.buyer]} {last.code or last.status}" if last else "no request seen"] += 1
    per_user = Counter(user for _, user, _, _ in rows)
    index_of = {uid: n for n, uid in enumerate(plan.user_ids)}
    placed = tuple(index_of[uid] for uid in line_places(product=product) if uid in index_of)
    return DropBooks(units=plan.units, sold=plan.units - stock, orders=len(rows), seen=len(seen & ids),
                     accounts_over_cap=sum(1 for n in per_user.values() if n > 1), not_orders=len(seen - ids),
                     unseen=len(ids - seen), late=late, unseen_heard=dict(heard.most_common()),
                     line=tuple(line_violations(product=product)), placed=placed,
                     committed=tuple(sorted(created.timestamp() - wall_open for *_, created in rows)))


# --- a whole run ---------------------------------------------------------------------------------
@dataclass
class DropRun:
    capacity: float
    capacity_measured: bool
    people: int
    scripts: int
    arrival_seconds: float
    prequeue_seconds: float
    load: float | None
    result: DropResult
    books: DropBooks
    deadline: float
    prequeue_order: str = "shuffle"

    def figures(self) -> dict[str, object]:
        """Every figure of the report (what --json writes beside the setup)."""
        rec, att = self.result.records, self.result.attempts
        answered = sales(att)
        # When units sold: by the orders' own times (the server's), which a late client cannot delay.
        sold_at = list(self.books.committed) or answered
        last = sold_at[-1] if sold_at else None
        times = {f"{kind}s {result}": p50_p99(time_to_final(rec, kind=kind, result=result))
                 for kind in (PERSON, SCRIPT) for result in (WON, LOST)}
        good = goodput(sold_at)
        lag_p50, lag_p99, lag_max = send_lag(rec)
        return {
            "fifo_share": fifo_share(rec, self.result.plan.units),
            "placed_in_arrival_order": placed_in_arrival_order(rec, self.books.placed, self.result.plan.units),
            "won_in_place_order": won_in_place_order(rec, self.books.placed, self.result.plan.units),
            "chance": self.result.plan.units / max(len(rec), 1),
            "script_advantage": advantage(rec),
            "win_rate": {PERSON: win_rate(rec, PERSON), SCRIPT: win_rate(rec, SCRIPT)},
            "time_to_final": {k: {"p50": v[0], "p99": v[1]} for k, v in times.items()},
            "gave_up": {kind: sum(1 for r in rec if r.kind == kind and r.result == GAVE_UP)
                        for kind in (PERSON, SCRIPT)},
            "first_sale_at": sold_at[0] if sold_at else None,
            "last_sale_at": last,
            "last_placed_answer_at": answered[-1] if answered else None,
            "losers_told_within_1s_of_last_sale": losers_told_within(rec, last, 1.0),
            "requests": len(att),
            "requests_per_unit": requests_per_unit(att, len(sold_at)),
            # Its floor: every buyer sends at least one request (the issue's crowd: 11.7 a unit).
            "buyers_per_unit": len(rec) / len(sold_at) if sold_at else None,
            "answers": answers(att),
            "retry_after": retry_afters(att),
            "waited_then_won": waited_then_won(rec),
            "busy_then_won": busy_then_won(rec),
            "goodput": good,
            "goodput_x_capacity": good / self.capacity if good and self.capacity else None,
            "first_second": first_second(att, sold_at),
            "send_lag_p50": lag_p50,
            "send_lag_p99": lag_p99,
            "send_lag_max": lag_max,
            "client_cpu": self.result.client_cpu,
        }

    def as_dict(self) -> dict[str, object]:
        plan = self.result.plan
        return {"profile": "drop", "units": plan.units, "people": self.people, "scripts": self.scripts,
                "arrival_seconds": self.arrival_seconds, "prequeue_seconds": self.prequeue_seconds,
                "prequeue_order": self.prequeue_order,
                "load": self.load, "capacity": self.capacity, "capacity_measured": self.capacity_measured,
                "patience": plan.patience, "clients": plan.clients, "deadline": self.deadline,
                **self.figures(), "books": {**{k: v for k, v in asdict(self.books).items()
                                                       if k not in ("committed", "placed")},
                                            "problems": self.books.problems}}


def issue_tokens(user_ids: Sequence[int]) -> list[str]:
    """An API token per account, in one statement (ApiToken.issue writes one row a call)."""
    from shop.models import ApiToken

    raws = ["shp_" + secrets.token_urlsafe(32) for _ in user_ids]
    ApiToken.objects.bulk_create(ApiToken(user_id=uid, name="drop", prefix=raw[:12], key_hash=ApiToken.hash(raw))
                                 for uid, raw in zip(user_ids, raws, strict=True))
    return raws


def drop(url: str, *, units: int = 300, people: int = 3000, scripts: int = 500, arrival_seconds: float = 1.0,
         prequeue_seconds: float = 0.0, load: float | None = None, capacity: float | None = None,
         patience: float = 30.0, clients: int = 6, lead: float = 3.0, seed: int = 0,
         prequeue_order: str = "shuffle") -> DropRun:
    """Set the drop up on the server's database, send its crowd, read the books, clean up.
    `load` x C sizes the crowd instead of `people` + `scripts` (in their ratio); C is measured
    closed loop first (as `spike` does) unless given. The drop opens `lead` s after the setup
    (plus the pre-queue). With a pre-queue the product's pre-queue window covers every early
    arrival, put in line at the opening in `prequeue_order` ("shuffle" or "fifo", the operator's
    choice)."""
    from django.contrib.auth import get_user_model

    from loadtest import workload
    from shop.edge import deadlines
    from shop.models import Product

    measured = capacity is None
    window = prequeue_seconds if prequeue_seconds > 0 else arrival_seconds
    probe_buyers = 32
    w = workload.create(workload.new_run_id(), products=2, stock=units, users=probe_buyers)
    drop_id, probe = w.product_ids
    try:
        Product.objects.filter(pk=probe).update(stock=10**9)
        w.initial_stock[probe] = 10**9
        if capacity is None:
            base = openloop.Plan(url=url, phases=[], tokens=issue_tokens(w.user_ids), run_id=w.run_id,
                                 clients=clients)
            capacity = openloop.measure_capacity(base, product_id=probe, buyers=probe_buyers)
        if load is not None:
            people, scripts = split_load(load, float(capacity or 0), window, people=people, scripts=scripts)
        buyers = crowd(people=people, scripts=scripts, arrival_seconds=arrival_seconds,
                       prequeue_seconds=prequeue_seconds, seed=seed)
        User = get_user_model()
        User.objects.bulk_create(User(username=f"{w.tag}d{n}", password="!") for n in range(len(buyers)))
        ids = list(User.objects.filter(username__startswith=f"{w.tag}d").order_by("pk").values_list("pk", flat=True))
        tokens = issue_tokens(ids)
        plan = DropPlan(url=url, product_id=drop_id, units=units, buyers=buyers, tokens=tokens, run_id=w.run_id,
                        clients=clients, patience=patience, user_ids=tuple(ids))
        # The opening, on the server's clock (the wall clock) and on the generator's (monotonic).
        until = lead + prequeue_seconds
        wall_open, t_open = time.time() + until, time.monotonic() + until
        Product.objects.filter(pk=drop_id).update(
            max_per_user=1, opens_at=dt.datetime.fromtimestamp(wall_open, tz=dt.UTC),
            line_prequeue_seconds=math.ceil(prequeue_seconds) + 1 if prequeue_seconds > 0 else 0,
            line_order=prequeue_order)
        result = run(plan, t_open=t_open)
        deadline = deadlines.budget()
        return DropRun(capacity=float(capacity or 0), capacity_measured=measured, people=people, scripts=scripts,
                       arrival_seconds=arrival_seconds, prequeue_seconds=prequeue_seconds, load=load, result=result,
                       books=books(result, wall_open=wall_open, budget=deadline), deadline=deadline,
                       prequeue_order=prequeue_order)
    finally:
        workload.cleanup(w)
