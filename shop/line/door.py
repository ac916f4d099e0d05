"""The line's door: an API order of a product in a drop's line takes its place before Django.

In a drop's first seconds the crowd arrives faster than the app servers can run requests, and a
place taken only when a request reaches a view goes to whoever the worker happened to let in
first, not to whoever came first. So the shop's worker (shop/gunicorn_worker.py) hands such an
order to a thread that does only this: read the token, check the order as the API would, and
take the buyer's place as of the moment the worker read the request (`line.join`, one script
call). A buyer who must wait gets the API's own 202 from here, at a fraction of a request's
cost; everything else (its turn, sold out, before the pre-queue, any doubt) goes on to the app,
which answers it as it always did. Nothing here writes but the place; a request the app would
refuse as bad input gets no place (it goes to the app, which refuses it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Literal

from shop import errors, line, validation
from shop.api import tokens
from shop.conf import shop_settings
from shop.edge import account_age, order_requests
from shop.line import arrivals, redis_clock, tickets
from shop.ops import metrics
from shop.plumbing import redis_keys, soldout

log = logging.getLogger("shop")

APP, TURN = "app", "turn"
# How long the worker may give the same answer again to the same token's retries (scripts send
# several at once and retry every few ms) without asking the line: "not yet" and "in the checkout"
# change with the line's front, a cut place only if the cut is lifted (rare, and then it is lifted
# for everyone after everyone before it was answered).
KEEP_WAITING, KEEP_CUT = 0.25, 1.0


@dataclass(frozen=True)
class Answer:
    """An answer the door gives (the API's JSON; the worker writes it out with the site's
    headers), and how long it may be given again to the same token's retries."""

    status: bytes  # "202 Accepted"
    body: dict
    keep: float
    retry_after: int | None = None
    ticket: str = ""
    # Waiting only for a lagging door's watermark: the worker may hold the request and bring it
    # to the door again shortly (its turn is near), instead of sending this answer.
    soon: bool = False

    def headers(self) -> bytes:
        """Its header lines besides the worker's own."""
        extra = b"Retry-After: %d\r\n" % self.retry_after if self.retry_after is not None else b""
        return extra + (b"Line-Ticket: " + self.ticket.encode() + b"\r\n" if self.ticket else b"")


Verdict = Answer | Literal["app", "turn"]


def door(request: bytes, *, arrived_ms: int, until: float, arrived_us: int | None = None) -> Verdict:
    """What to do with an API order's bytes (come whole at `arrived_ms`, the shop's clock, and at
    `arrived_us` on Redis's clock if known: `redis_clock.offset`): the answer to send (202 in line,
    409 cut, 503 in the checkout), TURN (it is this buyer's turn: on to the app, which starts it),
    or APP (the app decides). Raises on I/O trouble (the caller sends it to the app)."""
    return doors([(request, arrived_ms, arrived_us)], until=until)[0]


@dataclass
class Watermarks:
    """What one door (a process's: `name`) told which lines of how far behind it is, so that it
    can tell them again with its next batch, and that it caught up (shop/line/line.lua, `advance`:
    a lagging door's watermark holds later places back until the door says more)."""

    name: str = ""
    # product -> (when it told it, the lag it told, its line)
    told: dict[int, tuple[float, int, line.LineConfig]] = field(default_factory=dict)

    def others(self, now: float, product_ids: set[int]) -> list[line.LineConfig]:
        """The lines told within LIVE s that this batch does not join: they hear its lag too."""
        return [config for pid, (at, _, config) in self.told.items() if pid not in product_ids and now - at <= LIVE]

    def caught_up(self) -> None:
        """The door's queue is empty: lines still holding places behind its last lag may move on
        (one round trip, only if it lagged; never raises: the door's thread)."""
        settle_ms = int(float(shop_settings.LINE_SETTLE_FROM or 0) * 1000)
        now = time.monotonic()
        lagged = [config for at, lag, config in self.told.values() if lag >= settle_ms and now - at <= LIVE]
        self.told = {pid: told for pid, told in self.told.items() if now - told[0] <= LIVE and told[1] < settle_ms}
        if lagged and settle_ms > 0:
            try:
                line.report_doors(lagged, lag_ms=0, door=self.name)
            except Exception:
                log.warning("the line's door could not say it caught up; its watermark lapses", exc_info=True)
                return
            for config in lagged:
                self.told[config.product_id] = (now, 0, config)


LIVE = 2.0  # seconds a line keeps a door's watermark (line.lua's DOOR_LIVE)


def doors(requests: list[tuple[bytes, int, int | None]], *, until: float,
          marks: Watermarks | None = None) -> list[Verdict]:
    """`door` for several requests at once, in the order given (the order they were read): one
    read of their tokens, one round trip for their places. `marks`: this door's watermarks, told
    with the places (and to the lines it told before, which this batch does not join)."""
    orders = [_order(request) for request, *_ in requests]
    users = tokens.users_for_tokens(sorted({found[2] for found in orders if found is not None}))
    verdicts: list[Verdict] = [APP] * len(requests)
    joining: list[tuple[int, int, int, str | None, line.Joining]] = []  # (its index, product, quantity, key, the join)
    young: list[tuple[object, int]] = []
    credentials: dict[int, bytes] = {}
    for n, ((request, arrived_ms, arrived_us), found) in enumerate(zip(requests, orders, strict=True)):
        user = users.get(found[2]) if found is not None else None
        if found is None or user is None:
            continue  # not an order the door takes, or a bad token: the app answers (400, 401...)
        product_id, quantity, _, key = found
        config = line.lined([product_id]).get(product_id)
        if config is None or config.paused:
            continue
        try:
            account_age.check(user=user, product_ids=[product_id], signal=False)
        except errors.ShopError:
            continue  # the app answers 403 as it always does
        text, brought, auth = order_requests.headers(request, (b"line-ticket", b"line-arrival", b"authorization"))
        ticket = tickets.read(text.decode("latin-1"), user_id=user.pk) if text else None
        if text and ticket is None:
            continue  # not this account's ticket: the app refuses it (400)
        young.append((user, product_id))
        credentials[n] = arrivals.credential(authorization=auth, session=None)
        stamped = arrivals.read(brought, credential=credentials[n]) if brought else None
        joining.append((n, product_id, quantity, key, line.Joining(
            config=config, user_id=user.pk, start=False, until=until, counted=False, ticket=ticket,
            arrived_ms=min(arrived_ms, stamped) if stamped is not None else arrived_ms,
            arrived_us=arrived_us if stamped is None or stamped >= arrived_ms else None)))
    account_age.signal_young_buyers(young)
    # How late these places reach the line (the oldest arrival's age now): this door's watermark,
    # which holds later places back while it lags (shop/line/line.lua, `advance`).
    known = [j.arrived_us for *_, j in joining if j.arrived_us is not None]
    lag_ms = (max(0, int((time.monotonic() + redis_clock.offset()) * 1000) - min(known) // 1000)
              if known else None)
    door_name = marks.name if marks is not None else ""
    positions = line.join_many([replace(j, lag_ms=lag_ms, door=door_name) for *_, j in joining]) if joining else []
    if marks is not None and lag_ms is not None:
        now = time.monotonic()
        joined = {j.config.product_id: j.config for *_, j in joining}
        if others := marks.others(now, set(joined)):
            try:  # the places are taken: a lost report only lets its watermark stand a little longer
                line.report_doors(others, lag_ms=lag_ms, door=door_name)
                joined.update((config.product_id, config) for config in others)
            except Exception:
                log.warning("the line's door could not tell its other lines its lag", exc_info=True)
        for pid, config in joined.items():
            marks.told[pid] = (now, lag_ms, config)
    sold_out = []
    for (n, product_id, quantity, key, j), position in zip(joining, positions, strict=True):
        if position.state == line.SOLD_OUT:
            sold_out.append((n, product_id, quantity, redis_keys.idempotency_record(j.user_id, key) if key else None))
        else:
            verdicts[n] = _verdict(position, product_id=product_id, quantity=quantity,
                                   credential=credentials[n])
    # Sold out: the app's fast path, and first as there the replay of an order this key placed.
    keyed = [record for *_, record in sold_out if record is not None]
    found = dict(zip(keyed, soldout.records_exist(keyed), strict=True))
    for n, product_id, quantity, record in sold_out:
        if record is None or found[record] is False:
            metrics.soldout_rejected()
            short = [{"product_id": product_id, "requested": quantity, "available": 0}]
            verdicts[n] = _error(errors.OutOfStock.of(short), 0)
    return verdicts


def _verdict(position: line.Position, *, product_id: int, quantity: int, credential: bytes) -> Verdict:
    if position.state in (line.WAITING, line.PRE_QUEUED):
        metrics.line_answered(position.state)
        ticket = tickets.bound(position.ticket, credential=credential)
        return Answer(b"202 Accepted", {"line": {**position.details(), "ticket": ticket}}, KEEP_WAITING,
                      retry_after=position.retry_after, ticket=ticket, soon=position.soon)
    if position.state == line.CUT:
        # The units left cannot reach this place, and it never had a turn (a buyer who had one is
        # `admitted` again, whatever the cut): no order of it to replay. The app's answer.
        metrics.line_answered(position.state)
        metrics.soldout_rejected()
        line.answered([position], outcome="sold_out")
        refused = errors.OutOfStock(details={
            "lines": [{"product_id": product_id, "requested": quantity, "available": 0}],
            "line": {"product_id": product_id, "place": position.place, "state": position.state}})
        return _error(refused, KEEP_CUT)
    if position.state == line.IN_CHECKOUT:
        # Another request of this buyer is in the checkout (a script's parallel attempt): the
        # app's answer, retryable. (The app would first look for an order this key placed
        # before; such a replay is told to retry, and gets its order once the checkout is done.)
        return _error(errors.Busy(details={"reason": "in_checkout", "retry_after": errors.Busy.retry_after}),
                      KEEP_WAITING)
    return TURN if position.state == line.ADMITTED else APP


def _error(refused: errors.ShopError, keep: float) -> Answer:
    """The API's error envelope (shop/api.py `error_response`)."""
    status = {409: b"409 Conflict", 503: b"503 Service Unavailable"}[refused.status]
    return Answer(status, {"error": {"code": refused.code, "message": refused.message, "details": refused.details}},
                  keep, retry_after=refused.retry_after)


def _order(request: bytes) -> tuple[int, int, str, str | None] | None:
    """(product id, quantity, bearer token, Idempotency-Key) of a well-formed API order of one product, as the API would
    accept it (JSON body, its fields and an Idempotency-Key checked by the API's own rules);
    None for anything else."""
    kind, auth, key = order_requests.headers(request, (b"content-type", b"authorization", b"idempotency-key"))
    if (kind or b"").split(b";")[0].strip().lower() != b"application/json":
        return None
    scheme, _, raw = (auth or b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not raw.strip() or len(raw) > 200:
        return None
    raw_body = order_requests.body(request)
    data = order_requests.order_json(raw_body) if raw_body else None
    if not isinstance(data, dict):
        return None
    try:
        lines, _ = validation.order_body(data)
        if key is not None:
            validation.validate_idempotency_key(key.decode("latin-1"))
    except (errors.ShopError, UnicodeDecodeError):
        return None
    if len(lines) != 1:
        return None
    return lines[0][0], lines[0][1], raw.strip(), key.decode("latin-1") if key is not None else None
