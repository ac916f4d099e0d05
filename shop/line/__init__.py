"""The line of a drop: one place per account, let through to the checkout in place order.

A product with a drop window (`opens_at`) has a line per drop, in the shop's Redis
(`redis_keys.line`, one Cluster slot with the product's sold-out marker). A buyer's first order
request takes a place; retries, new Idempotency-Keys and parallel connections of the same account
get the same one. One script call (line.lua) per order request decides, atomically:

- before opens_at, inside the product's pre-queue window: the pre-queue (`pre_queue`), which
  takes the first places at the opening, shuffled or in arrival order; before the window:
  `not_open` (the checkout refuses not_open_yet as ever);
- otherwise the buyer's place, and whether it is its turn: at most SHOP["LINE_WINDOW"] buyers of
  the line are let through and not yet answered at once, the earliest places first (`started`);
  the others wait (`waiting`: place, number ahead, an estimate from the drain rate). A turn not
  taken within LINE_TURN seconds, or a checkout that never answered (its server died), lapses.
- a place that the units left (stock plus unpaid reservations) cannot reach, counting every
  buyer ahead as one unit, is told sold out at once (`cut`) and so is every later one, until
  everyone before the cut was answered: if units are left then, the cut is lifted and the
  earliest places go first again. A product marked sold out answers `sold_out` to every place.

Places are the Redis time of arrival in µs (kept increasing, like the lock's fences), and the
buyer is given a signed ticket of its place (shop/line/tickets.py). If Redis loses the line (a
restart without persistence, a failover to a replica that lagged), a buyer who comes back with
its ticket takes back the place it had, and everyone new comes after every place given before:
nobody gets ahead of a buyer who held an earlier place. The writer's guarded UPDATE still decides
every unit, so a lost line can never oversell.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from pathlib import Path

from django.db.models import Q
from django.db.models.signals import post_save
from django_redis import get_redis_connection
from redis.commands.core import Script

from shop.conf import shop_settings
from shop.line import arrivals
from shop.line.tickets import PLACE, PRE_QUEUE, Ticket, not_yet, read
from shop.models import Product
from shop.ops import metrics
from shop.plumbing import clock, redis_keys
from shop.reads import selectors

__all__ = ["Front", "Joining", "LineConfig", "Position", "Status", "Ticket", "every_line", "finish", "forget", "fronts",
           "join", "join_many", "lined", "not_yet", "now_serving", "read_ticket", "report_doors", "status"]

log = logging.getLogger("shop")

# What `join` answers.
NOT_OPEN, PRE_QUEUED, WAITING, CUT, SOLD_OUT = "not_open", "pre_queue", "waiting", "cut", "sold_out"
STARTED, ADMITTED, IN_CHECKOUT = "started", "admitted", "in_checkout"
# How a started turn ended (`finish`): answered (placed or refused), or to be tried again.
DONE, RETRY = "done", "retry"
# A line's keys live this long after its last call.
TTL = 24 * 3600
# A turn in the checkout lapses this long after its request's deadline (its server died).
CHECKOUT_MARGIN = 1.0


@dataclass(frozen=True)
class LineConfig:
    """What a line needs of its product: read from MySQL at most every LINE_REFRESH s per process."""

    product_id: int
    opens_at: datetime
    closes_at: datetime | None
    prequeue_seconds: int
    fifo: bool
    paused: bool

    @property
    def drop(self) -> int:
        return int(self.opens_at.timestamp())

    @classmethod
    def of(cls, product_id: int, opens_at: datetime, closes_at: datetime | None, prequeue_seconds: int,
           order: str, paused: bool) -> LineConfig:
        """From a product's line fields, in `selectors.LINE_FIELDS` order."""
        return cls(product_id=product_id, opens_at=opens_at, closes_at=closes_at, prequeue_seconds=prequeue_seconds,
                   fifo=order == "fifo", paused=paused)


@dataclass(frozen=True)
class Position:
    """One buyer in one line, as `join` found it."""

    state: str
    product_id: int
    drop: int
    score: int = 0  # the place: arrival in Redis µs (or the pre-queue's order)
    place: int | None = None  # 1 = the first place of the line
    ahead: int = 0  # buyers before this one not answered yet
    now_serving: int = 0  # the last place let through
    serving: int = 0  # its score (what `tickets.not_yet` compares with)
    rate: float = 0.0  # the drain rate its estimate divides by (`drain_rate`)
    soon: bool = False  # waiting only for a lagging door's watermark (line.lua `advance`): ask again shortly
    prequeue_size: int = 0
    opens_at: datetime | None = None
    ticket: str = ""

    @property
    def estimated_wait(self) -> float:
        """Seconds until this buyer's turn: until the opening, or the turns before it at the
        line's drain rate (the default rate before anyone finished)."""
        if self.state == PRE_QUEUED and self.opens_at is not None:
            return max(0.0, (self.opens_at - clock.now()).total_seconds())
        if self.state != WAITING:
            return 0.0
        turns = max(1, self.ahead + 1 - int(shop_settings.LINE_WINDOW))
        return turns / (self.rate or float(shop_settings.LINE_DEFAULT_RATE))

    @property
    def retry_after(self) -> int:
        return max(1, min(int(shop_settings.LINE_RETRY_MAX), math.ceil(self.estimated_wait)))

    def details(self) -> dict:
        """The buyer's answer: the API's {"line": ...} (errors.InLine)."""
        waiting = self.state == WAITING
        found = {"product_id": self.product_id, "state": "waiting" if waiting else self.state,
                 "place": self.place, "ahead": self.ahead if waiting else None,
                 "now_serving": self.now_serving if waiting else None,
                 "estimated_wait": round(self.estimated_wait, 2), "retry_after": self.retry_after,
                 "ticket": self.ticket}
        if self.state == PRE_QUEUED:
            found["opens_at"] = self.opens_at.isoformat() if self.opens_at else None
            found["pre_queue"] = self.prequeue_size
        return found


# --- which products have a line: a per-process view of MySQL, at most LINE_REFRESH s old -------
_configs: dict[int, LineConfig] = {}
_read_at = -math.inf
_guard = threading.Lock()


def lined(product_ids: Iterable[int]) -> dict[int, LineConfig]:
    """The lines of these products (those with a drop window not over), by product id. No I/O
    but one query per process every LINE_REFRESH seconds; a product scheduled meanwhile sells
    without a line until then (the writer still keeps its window)."""
    global _configs, _read_at
    if time.monotonic() - _read_at >= float(shop_settings.LINE_REFRESH):
        with _guard:
            if time.monotonic() - _read_at >= float(shop_settings.LINE_REFRESH):
                _configs = {c.product_id: c for c in _read_configs()}  # swapped whole: threads read it meanwhile
                _read_at = time.monotonic()
    configs = _configs
    return {pid: configs[pid] for pid in product_ids if pid in configs}


def _read_configs() -> list[LineConfig]:
    return [LineConfig.of(*row) for row in selectors.line_rows(now=clock.now())]


def forget(**_: object) -> None:
    """Read the lines again on the next order (this process changed a product)."""
    global _read_at
    _read_at = -math.inf


post_save.connect(forget, sender=Product, dispatch_uid="shop.line.forget")


# --- the script --------------------------------------------------------------------------------
@cache
def _script() -> Script:
    """A redis-py Script, as the locks load theirs (EVALSHA, loaded again on NOSCRIPT)."""
    return Script(None, (Path(__file__).parent / "line.lua").read_bytes())


def client():
    """The shop's Redis, where the lines live (SHOP["REDIS_ALIAS"])."""
    return get_redis_connection(shop_settings.REDIS_ALIAS)


def keys(product_id: int, drop: int) -> list[str]:
    """A line's keys, in line.lua's KEYS order: meta, places, waiting, turns, states, pre-queue,
    the product's sold-out marker, and the doors' watermarks."""
    base = redis_keys.line(product_id, drop)
    return [base, f"{base}:places", f"{base}:waiting", f"{base}:turns", f"{base}:states", f"{base}:prequeue",
            redis_keys.sold_out_marker(product_id), f"{base}:doors"]


def _run(config: LineConfig, op: str, *args: object, on=None, lag_ms: int | None = None, door: str = "") -> list | int:
    """line.lua's `op` on this line; `on`: a pipeline to queue it on (its reply comes with the rest);
    `lag_ms`: the age of the oldest arrival the caller (`door`, a process's line door) holds and has
    not brought to the line yet (0: caught up)."""
    head = [op, TTL, int(shop_settings.LINE_WINDOW), int(float(shop_settings.LINE_TURN) * 1000),
            1 if config.paused else 0, int(float(shop_settings.LINE_SETTLE_FROM or 0) * 1000),
            "" if lag_ms is None else f"{max(0, int(lag_ms))}/{door}"]
    return _script()(keys=keys(config.product_id, config.drop), args=[*head, *args], client=on or client())


def read_ticket(text: str, *, user_id: int) -> Ticket | None:
    """A Line-Ticket the buyer sent, if this shop signed it for this account; None, counted as
    refused, if not (forged, altered, another account's)."""
    ticket = read(text, user_id=user_id)
    if ticket is None:
        metrics.line_ticket_refused()
    return ticket


def join(*, config: LineConfig, user_id: int, start: bool, until: float, ticket: Ticket | None = None,
         counted: bool = True, arrived_ms: int | None = None, arrived_us: int | None = None) -> Position:
    """Take (or find) this account's place and, if it is its turn and `start`, begin the turn: it
    is then in the checkout until `finish` (or its lapse, `until` (monotonic) + a margin).
    `counted` False: a look at the place (the waiting page's poll), not an order's answer.
    `arrived_ms`: the time of an arrival stamp the buyer brought (shop/line/arrivals.py, checked):
    a new place is taken as of then, if the stamp is young enough and not before the pre-queue's
    window; `arrived_us`, the same on Redis's clock if the caller knows it (`Joining`). Raises
    RedisError if the line cannot be reached."""
    return join_many([Joining(config=config, user_id=user_id, start=start, until=until, ticket=ticket,
                              counted=counted, arrived_ms=arrived_ms, arrived_us=arrived_us)])[0]


@dataclass(frozen=True)
class Joining:
    """One buyer's `join` (its arguments), for `join_many`."""

    config: LineConfig
    user_id: int
    start: bool
    until: float
    ticket: Ticket | None = None
    counted: bool = True
    arrived_ms: int | None = None
    # The same arrival on Redis's clock in µs (`redis_clock.offset`), when the caller knows it exactly
    # (the door: the kernel's receive time): the place is dated by it, however long the call
    # waits before it reaches Redis (its batch's other calls, a pipeline behind others).
    arrived_us: int | None = None
    lag_ms: int | None = None  # the door's lag (`_run`)
    door: str = ""  # the door's name (`_run`)


def join_many(joinings: list[Joining]) -> list[Position]:
    """`join` for several buyers, in order, in one round trip to Redis (the line's door takes a
    crowd's places this way). Raises RedisError if the lines cannot be reached."""
    now_ms = int(clock.now().timestamp() * 1000)
    calls = []
    for j in joinings:
        mine = j.ticket is not None and (j.ticket.product_id, j.ticket.drop) == (j.config.product_id, j.config.drop)
        window_ms = int(j.config.opens_at.timestamp() * 1000) - j.config.prequeue_seconds * 1000
        arrived = arrivals.honoured(j.arrived_ms, now_ms=now_ms, window_ms=window_ms)
        calls.append((j, j.ticket if mine else None, arrived))
    if len(calls) == 1:
        replies = [_join(calls[0][0], claim=calls[0][1], arrived=calls[0][2], now_ms=now_ms)]
    else:
        pipe = client().pipeline(transaction=False)
        for j, claim, arrived in calls:
            _join(j, claim=claim, arrived=arrived, now_ms=now_ms, on=pipe)
        replies = pipe.execute()
    return [_joined(j, claim=claim, arrived=arrived, now_ms=now_ms, reply=reply)
            for (j, claim, arrived), reply in zip(calls, replies, strict=True)]


def _joined(j: Joining, *, claim: Ticket | None, arrived: int | None, now_ms: int, reply: list) -> Position:
    """One buyer's position from its reply to line.lua's join (and the follow-ups it asks for)."""
    config, user_id = j.config, j.user_id
    state = _text(reply[0])
    units_due = state not in (NOT_OPEN, PRE_QUEUED) and bool(int(reply[7]))
    if state != NOT_OPEN and int(reply[3 if state == PRE_QUEUED else 9]) and not _lost_before(config):
        _run(config, "release")  # a new line, not one Redis lost: nobody need be held back
        if state == WAITING:  # held back just now: its turn may have come
            reply = _join(j, claim=claim, arrived=arrived, now_ms=now_ms)
            state = _text(reply[0])
    found = Position(state=state, product_id=config.product_id, drop=config.drop, opens_at=config.opens_at)
    if state == NOT_OPEN:
        return found
    if state == PRE_QUEUED:
        score = int(reply[1])
        return _ticketed(Position(state=state, product_id=config.product_id, drop=config.drop, score=score,
                                  prequeue_size=int(reply[2]), opens_at=config.opens_at), PRE_QUEUE, user_id)
    if units_due or int(reply[7]):
        _refresh_units(config)
    if j.counted:
        metrics.line_answered(state)
    if state == STARTED:
        metrics.line_let_through(config.product_id)
    return _ticketed(Position(state=state, product_id=config.product_id, drop=config.drop, score=int(reply[1]),
                              place=int(reply[2]), ahead=int(reply[3]), now_serving=int(reply[4]),
                              serving=int(reply[5]), rate=drain_rate(int(reply[6]), int(reply[10])),
                              soon=state == WAITING and bool(int(reply[11])), opens_at=config.opens_at),
                     PLACE, user_id)


def _join(j: Joining, *, claim: Ticket | None, arrived: int | None, now_ms: int, on=None) -> list:
    config = j.config
    checkout_ms = int((max(0.0, j.until - time.monotonic()) + CHECKOUT_MARGIN) * 1000)
    # The latest the database's clock may read now (shop/plumbing/clock.py): "not open yet" only when the
    # opening is surely ahead; at the edge the order goes on, and the writer decides it exactly
    # under the row lock (docs/design.md, "One clock for drop windows").
    latest_ms = now_ms + int(clock.uncertainty() * 1000)
    return _run(config, "join", j.user_id, 1 if j.start else 0, checkout_ms, latest_ms,
                int(config.opens_at.timestamp() * 1000), config.prequeue_seconds * 1000, 1 if config.fifo else 0,
                secrets.randbits(52), claim.kind if claim else "", claim.score if claim else "",
                int(float(shop_settings.LINE_UNITS_REFRESH) * 1000), hold_seconds() * 1000,
                arrived if arrived is not None else "", now_ms,
                j.arrived_us if arrived is not None and j.arrived_us is not None else "", on=on, lag_ms=j.lag_ms,
                door=j.door)


def report_doors(configs: Iterable[LineConfig], *, lag_ms: int, door: str) -> None:
    """Tell these lines how far behind this door is without a buyer to join (0: caught up, the
    line may let places through that its last lag held back). One round trip."""
    pipe = client().pipeline(transaction=False)
    for config in configs:
        _run(config, "door", on=pipe, lag_ms=lag_ms, door=door)
    pipe.execute()


def hold_seconds() -> int:
    """How long a line Redis lost lets nobody through: every waiting buyer comes back within its
    Retry-After (at most LINE_RETRY_MAX) and takes its place back from its ticket first."""
    return int(shop_settings.LINE_RETRY_MAX) + 1


def _lost_before(config: LineConfig) -> bool:
    """This drop had a line before this one was made (Redis lost it), as MySQL remembers: the
    first line of a drop records its start (one UPDATE, once per line)."""
    first = (Product.objects.filter(pk=config.product_id)
             .filter(Q(line_started_at__isnull=True) | Q(line_started_at__lt=config.opens_at))
             .update(line_started_at=clock.now()))
    return not first


def _ticketed(position: Position, kind: str, user_id: int) -> Position:
    text = Ticket(product_id=position.product_id, drop=position.drop, kind=kind, score=position.score).text(
        user_id=user_id)
    return replace(position, ticket=text)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _refresh_units(config: LineConfig) -> None:
    """The stock and the units this line can still sell (stock + unpaid reservations), from
    MySQL (this caller was picked to refresh them)."""
    try:
        stock, reserved = selectors.stock_and_reserved(product_id=config.product_id)
        _run(config, "units", stock + reserved, stock)
    except Exception:
        log.warning("line of product %s: could not refresh its units", config.product_id, exc_info=True)


def stock_left(left: dict[int, int]) -> None:
    """The checkout's writer committed a batch: the stock it left of each product (read under
    the product's lock). The lines of those in a drop let through no more buyers than that."""
    for product_id, stock in left.items():
        if (config := _configs.get(product_id)) is not None:
            try:
                _run(config, "stock", stock)
            except Exception:
                log.warning("line of product %s: could not record its stock", product_id, exc_info=True)


def finish(positions: Iterable[Position], *, outcome: str, user_id: int, lines: dict[int, LineConfig]) -> None:
    """End these started turns: DONE (the buyer was answered: the turn counts as finished, once)
    or RETRY (nothing was decided, e.g. busy: the buyer keeps its turn for LINE_TURN s). Never
    raises: a turn not ended here lapses by itself."""
    for position in positions:
        try:
            _run(lines[position.product_id], "finish", user_id, outcome)
        except Exception:
            log.warning("line of product %s: could not end a turn", position.product_id, exc_info=True)


def every_line() -> dict[int, LineConfig]:
    """Every line of a drop not over, by product id (`lined`'s view: MySQL every LINE_REFRESH s)."""
    lined(())
    return dict(_configs)


@dataclass(frozen=True)
class Front:
    """A line's front as a front door reads it a few times a second (`fronts`): enough to answer a
    waiting ticket "not your turn yet" without the app, with an estimate of its place."""

    product_id: int
    drop: int
    serving: int  # the score of the last place let through
    let_through: int  # places let through so far (the answer's now_serving)
    in_turn: int
    waiting: int
    first_waiting: int  # the score of the earliest waiting place (0: none)
    last: int  # the latest place's score
    cut: int | None
    rate: float
    window: int
    default_rate: float
    retry_max: int

    def let_through_to(self, ticket: Ticket) -> bool:
        """Whether the line has let this ticket's place through (it may be answered already: the
        app decides). Pure: the main loop's."""
        return ((ticket.product_id, ticket.drop) == (self.product_id, self.drop) and ticket.kind == PLACE
                and not not_yet(ticket, self.serving) and (self.cut is None or ticket.score < self.cut))

    def not_yet(self, ticket: Ticket, text: str) -> dict | None:
        """The 202's details for this ticket if its place is not reached yet and not past the cut
        (the app answers those sold out); else None (the app decides). Pure: the main loop's."""
        if ((ticket.product_id, ticket.drop) != (self.product_id, self.drop) or ticket.kind != PLACE
                or not not_yet(ticket, self.serving) or (self.cut is not None and ticket.score >= self.cut)):
            return None
        start = self.first_waiting or self.serving
        span = max(1, self.last - start)
        between = min(self.waiting, max(0, round(self.waiting * (ticket.score - start) / span)))
        ahead = self.in_turn + between
        wait = max(1, ahead + 1 - self.window) / (self.rate or self.default_rate)
        return {"product_id": self.product_id, "state": "waiting", "place": self.let_through + between + 1,
                "ahead": ahead, "now_serving": self.let_through, "estimated_wait": round(wait, 2),
                "retry_after": max(1, min(self.retry_max, math.ceil(wait))), "ticket": text}


_RING, _SPAN = 8, 5  # line.lua's ring of finished turns per second, and the seconds its rate spans
RATE_PRIOR = 0.5  # seconds of LINE_DEFAULT_RATE that a line's early drain rate leans on


def drain_rate(finished: int, span_ms: int) -> float:
    """Turns finished a second lately, what a waiting buyer's estimate divides by. A line's first
    few turns over a tenth of a second say little (one finished in 0.1 s is not 10 a second: that
    told its last places to come back in 5 s, and their units waited), so the estimate starts
    from LINE_DEFAULT_RATE, weighed as RATE_PRIOR seconds of it, and follows the line as it drains."""
    default = float(shop_settings.LINE_DEFAULT_RATE)
    if finished <= 0:
        return default
    return round((finished + default * RATE_PRIOR) / (span_ms / 1000 + RATE_PRIOR), 3)


def fronts(configs: Iterable[LineConfig]) -> dict[int, Front]:
    """The fronts of these lines (those open), by product id: one pipelined read of Redis."""
    configs = list(configs)
    if not configs:
        return {}
    ring = [f"{x}{i}" for i in range(_RING) for x in "tr"]
    pipe = client().pipeline(transaction=False)
    pipe.time()
    for config in configs:
        meta, places, waiting, turns = keys(config.product_id, config.drop)[:4]
        pipe.hmget(meta, "opened", "front", "last", "cut", "opened_ms", "opened_s", *ring)
        pipe.zcard(places)
        pipe.zcard(waiting)
        pipe.zcard(turns)
        pipe.zrange(waiting, 0, 0, withscores=True)
    replies = pipe.execute()
    now_s = int(replies[0][0])
    now_ms = now_s * 1000 + int(replies[0][1]) // 1000
    found = {}
    for n, config in enumerate(configs):
        meta, places, waiting, turns, first = replies[1 + 5 * n:6 + 5 * n]
        if meta[0] not in (b"1", "1"):
            continue  # not open yet: the pre-queue is the app's
        fields = [int(float(v)) if v is not None else None for v in meta[1:6]]
        front, last, cut, opened_ms, opened_s = fields
        opened_ms = opened_ms or (opened_s or now_s) * 1000  # a line opened before opened_ms was kept
        slots = dict(zip(ring, [int(v) if v is not None else None for v in meta[6:]], strict=True))
        done = sum(slots[f"r{(now_s - i) % _RING}"] or 0 for i in range(_SPAN + 1)
                   if slots[f"t{(now_s - i) % _RING}"] == now_s - i)
        span_ms = max(1, now_ms - max(opened_ms, (now_s - _SPAN) * 1000))  # as line.lua's finished_lately
        found[config.product_id] = Front(
            product_id=config.product_id, drop=config.drop, serving=front or 0, let_through=places - waiting,
            in_turn=turns, waiting=waiting, first_waiting=int(first[0][1]) if first else 0, last=last or 0, cut=cut,
            rate=drain_rate(done, span_ms), window=int(shop_settings.LINE_WINDOW),
            default_rate=float(shop_settings.LINE_DEFAULT_RATE), retry_max=int(shop_settings.LINE_RETRY_MAX))
    return found


def now_serving(config: LineConfig) -> int:
    """The score of the last place let through (0: nobody yet): what a front door compares a
    ticket with (`tickets.not_yet`), read a few times a second. One HGET."""
    value = client().hget(redis_keys.line(config.product_id, config.drop), "front")
    return int(value) if value is not None else 0


def answered(positions: Iterable[Position], *, outcome: str) -> None:
    """Count the time from these places (the buyers' first requests) to their final answer."""
    now_us = time.time() * 1_000_000
    for position in positions:
        if position.state != PRE_QUEUED and position.score:
            metrics.line_answered_finally(outcome, (now_us - position.score) / 1_000_000)


@dataclass(frozen=True)
class Status:
    """A line as an operator sees it (`manage.py shop line`)."""

    product_id: int
    drop: int
    opened: bool
    places: int  # places taken
    waiting: int
    in_turn: int  # let through, not answered yet
    prequeue: int
    prequeued: int  # pre-queue members placed at the opening
    now_serving: int
    serving: int
    cut: int | None  # places from this score on are told sold out
    finished: int
    lapsed: int
    rate: float
    units: int | None
    sold_out: bool
    paused: bool

    @property
    def wait_at_back(self) -> float:
        """The estimated wait of a buyer joining now."""
        turns = max(1, self.waiting + self.in_turn + 1 - int(shop_settings.LINE_WINDOW))
        return turns / (self.rate or float(shop_settings.LINE_DEFAULT_RATE))


def status(config: LineConfig) -> Status:
    r = _run(config, "status")
    cut, units = int(r[6]), int(r[10])
    return Status(product_id=config.product_id, drop=config.drop, opened=_text(r[11]) == "1", places=int(r[0]),
                  waiting=int(r[1]), in_turn=int(r[2]), prequeue=int(r[3]), prequeued=int(_text(r[13])),
                  now_serving=int(r[5]), serving=int(r[4]), cut=None if cut < 0 else cut, finished=int(r[7]),
                  lapsed=int(r[8]), rate=int(r[9]) / 1000, units=None if units < 0 else units, sold_out=bool(r[12]),
                  paused=config.paused)


def config_of(product: Product) -> LineConfig | None:
    """The line of this product's drop (None without a drop), read now (for commands and tests)."""
    if product.opens_at is None:
        return None
    return LineConfig.of(*(getattr(product, f) for f in selectors.LINE_FIELDS))
