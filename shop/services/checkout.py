"""place_order: the path of one checkout, from the buyer's request to its receipt. The steps, in
order, are docs/design.md, "The path of one checkout"; the Redis lock keeps the buyers of one
product in an orderly queue outside MySQL, the writer's guarded UPDATE is what makes oversell
impossible (shop/checkout/writer.py)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

import locks
from locks.combining import Guarded
from shop import errors, line
from shop.checkout import allocation, combining, protocol, writer
from shop.checkout.protocol import Again, Alone, Placed, Refused, Request, Result
from shop.conf import shop_settings
from shop.edge import account_age, admission, deadlines
from shop.models import UPCOMING, drop_state
from shop.ops import metrics
from shop.plumbing import clock, redis_keys, soldout
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import held, refuse_outer_transaction
from shop.plumbing.retries import LOST_LOCK
from shop.plumbing.transactions import connection_errors
from shop.reads import selectors
from shop.reads.receipts import Receipt
from shop.validation import validate_code, validate_idempotency_key, validate_lines

log = logging.getLogger("shop")


def request_digest(lines: list[tuple[int, int]], coupon_code: str | None) -> str:
    """What an Idempotency-Key's order is compared with on a replay (stored with the order)."""
    return _digest(tuple(lines), coupon_code)


@functools.lru_cache(maxsize=4096)
def _digest(lines: tuple[tuple[int, int], ...], coupon_code: str | None) -> str:
    """Kept per body: buyers send the same few carts (one product, one unit) again and again."""
    body = json.dumps({"lines": sorted(lines), "coupon": coupon_code or ""}, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _replay(*, user, key: str, digest: str) -> Receipt | None:
    """The order a key already produced, or None; a different body conflicts."""
    order = selectors.order_complete(user=user, idempotency_key=key)
    if order is None:
        return None
    if order.request_digest != digest:
        raise errors.IdempotencyConflict(details={"order_id": order.pk})
    return Receipt.of_order(order, replayed=True)


@metrics.checkout_outcome  # outermost: sees DatabaseUnavailable from connection_errors
@connection_errors()
def place_order(
    *,
    user,
    lines: list[tuple[int, int]],
    coupon_code: str | None = None,
    idempotency_key: str | None = None,
    use_lock: bool | None = None,
    deadline: float | None = None,
    line_ticket: str | None = None,
    arrived_ms: int | None = None,
    arrived_us: int | None = None,
) -> Receipt:
    """Place an order, all or nothing.

    `deadline`: time.monotonic() when the answer is due (shop/deadlines.py; default: the
    server's budget from now). Raises a `shop.errors.ShopError` for every refusal, with nothing
    written: `busy` when the order cannot be started in time (this process lets no more buyers
    wait, or the deadline has passed), `lock_timeout` when it waited in line until its deadline,
    `in_line` (not a failure: 202) when a product is in a drop's line and it is not this buyer's
    turn yet. `line_ticket`: the Line-Ticket the buyer was given (refused if not its own).
    `arrived_ms`: when the buyer came (its arrival stamp, already checked, or when its request
    reached the machine: shop/line/arrivals.py `arrived`), and `arrived_us` the same on Redis's
    clock if known: a place it takes in a line dates from then.
    """
    refuse_outer_transaction("place_order")
    if deadline is None:
        deadline = time.monotonic() + deadlines.budget()
    lines = validate_lines(lines)
    code = validate_code(coupon_code) if coupon_code is not None else None
    key = validate_idempotency_key(idempotency_key) if idempotency_key is not None else None
    digest = request_digest(lines, code)
    product_ids = [pid for pid, _ in lines]
    account_age.check(user=user, product_ids=product_ids)  # a drop's minimum account age: before any lock
    record_key = redis_keys.idempotency_record(user.pk, key) if key is not None else None
    use_locks = shop_settings.USE_LOCKS if use_lock is None else use_lock
    can_combine, can_guard = locks.capabilities()  # what the lock service can do
    # One product: queue on its lock; whoever holds it commits everyone queued at once. (The
    # queue is a Redis one: on Redlock, ZooKeeper or MySQL every order takes the lock itself.)
    combined = use_locks and shop_settings.COMBINING and len(lines) == 1 and can_combine
    # Fast path: a product known to be sold out is refused without the lock or MySQL, unless this
    # key already placed an order (then it gets that order back). The markers and the record are
    # read by the queueing script itself where it can (guards: no round trip of their own), else
    # by one MGET first. Either way before any refusal for load: "sold out" is always answered.
    guards = (soldout.guard_keys(product_ids, record_key=record_key)
              if combined and can_guard and soldout.shares_lock_redis() else [])

    def fast_path() -> Receipt | None:
        try:
            fast = soldout.markers_and_record(product_ids, record_key=record_key)
        except soldout.SoldOutCheckFailed as exc:
            raise errors.LockUnavailable(details={"redis": "unreachable"}) from exc  # not a second wait
        return _fast_path(fast, user=user, key=key, digest=digest, lines=lines)

    if not guards and (replayed := fast_path()) is not None:
        return replayed

    def served(*, gate: bool) -> Receipt:
        late = deadlines.passed(deadline)
        if late or (gate and not admission.enter(product_ids)):
            if guards and (replayed := fast_path()) is not None:  # not checked yet
                return replayed
            if late:
                metrics.deadline_expired("arrival")
                raise errors.Busy(details={"reason": "deadline", "retry_after": errors.Busy.retry_after})
            raise admission.refusal()
        try:
            mine = Request(id=protocol.new_request_id(), user_id=user.pk, lines=tuple(lines), code=code, key=key,
                           digest=digest, deadline=deadlines.line_wait_until(deadline), recorded=combined)
            result = _in_line(mine, combined=combined, guards=guards, use_locks=use_locks, user=user, key=key,
                              digest=digest, record_key=record_key)
        finally:
            if gate:
                admission.leave(product_ids)
        if isinstance(result, Receipt):
            return result
        if isinstance(result, Refused):
            raise result.error()
        return _receipt(result, user=user, key=key)

    # A drop's line (shop/line/): after the cheap answers, before admission. A buyer whose turn it
    # is in the line of every product of its order skips this process's admission: the line's
    # window bounds them already, and the gate's places stay for everyone else, so a drop's crowd
    # never makes other products' buyers `busy`.
    configs = line.lined(product_ids) if shop_settings.LINES else {}
    if not configs:
        return served(gate=True)
    turns = _take_turns(configs, user=user, lines=lines, deadline=deadline, ticket=line_ticket, fast_path=fast_path,
                        arrived_ms=arrived_ms, arrived_us=arrived_us)
    if isinstance(turns, Receipt):
        return turns
    if not turns:
        return served(gate=True)
    outcome = line.RETRY
    try:
        receipt = served(gate=len(turns) < len(lines))
        outcome = line.DONE
        line.answered(turns, outcome="placed")
        return receipt
    except errors.ShopError as exc:
        if exc.status < 500:  # answered (refused); a retryable one keeps its turn
            outcome = line.DONE
            line.answered(turns, outcome="refused")
        raise
    finally:
        line.finish(turns, outcome=outcome, user_id=user.pk, lines=configs)


def _take_turns(configs: dict[int, line.LineConfig], *, user, lines: list[tuple[int, int]], deadline: float,
                ticket: str | None, fast_path: Callable[[], Receipt | None],
                arrived_ms: int | None = None, arrived_us: int | None = None) -> list[line.Position] | Receipt:
    """This buyer's turn in the line of each lined product of its order (the turns begun), or the
    answer it gets instead: in line (InLine), sold out, a replay of its key's order."""
    mine = None
    if ticket:
        mine = line.read_ticket(ticket, user_id=user.pk)
        if mine is None:
            raise errors.InvalidLineTicket(details={"Line-Ticket": "not valid for this account"})
    started: list[line.Position] = []
    try:
        for pid, quantity in lines:
            if (config := configs.get(pid)) is None:
                continue
            try:
                position = line.join(config=config, user_id=user.pk, start=True, until=deadline, ticket=mine,
                                     arrived_ms=arrived_ms, arrived_us=arrived_us)
            except RedisError as exc:
                raise errors.LockUnavailable(details={"redis": "unreachable"}) from exc
            if position.state == line.STARTED:
                started.append(position)
            elif position.state == line.NOT_OPEN:
                # One product: refused here, without the lock. A cart: the writer says which of
                # its lines cannot be sold, in its order of reasons.
                row, now = {"active": True, "opens_at": config.opens_at, "closes_at": config.closes_at}, clock.now()
                if len(lines) == 1 and drop_state(config.opens_at, config.closes_at, now) == UPCOMING:
                    raise allocation.not_on_sale([pid], {pid: row}, now)
            elif position.state in (line.WAITING, line.PRE_QUEUED):
                raise errors.InLine(details=position.details())
            elif (replayed := fast_path()) is not None:  # sold out, cut or busy: but a replay first
                line.finish(started, outcome=line.RETRY, user_id=user.pk, lines=configs)
                return replayed
            elif position.state == line.IN_CHECKOUT:
                raise errors.Busy(details={"reason": "in_checkout", "retry_after": errors.Busy.retry_after})
            else:  # cut (the units left cannot reach this place) or sold out
                metrics.soldout_rejected()
                line.answered([position], outcome="sold_out")
                raise errors.OutOfStock(details={
                    "lines": [{"product_id": pid, "requested": quantity, "available": 0}],
                    "line": {"product_id": pid, "place": position.place, "state": position.state}})
    except BaseException:
        line.finish(started, outcome=line.RETRY, user_id=user.pk, lines=configs)
        raise
    return started


def _in_line(mine: Request, *, combined: bool, guards: list[str], use_locks: bool, user, key: str | None,
             digest: str, record_key: str | None) -> Result | Receipt:
    """Queue on the product's lock (combined) or take the order's locks, until the request's
    line deadline; the writer's result (or a replay the queueing script's guards found)."""
    product_ids = [pid for pid, _ in mine.lines]
    tries = LOST_LOCK.budget()
    while True:
        # A stale fence or a lost lock (the writer answers AGAIN) queues or locks again, by the
        # one retry policy; deadlocks and lock-wait timeouts are retried inside the writer.
        result = (combining.queue(mine, wait=mine.deadline - time.monotonic(), guards=guards) if combined
                  else protocol.ALONE)
        if isinstance(result, Guarded):  # a marker or a record: not queued
            fast = soldout.fast_path_of(product_ids, result.values, record_key=record_key)
            if (replayed := _fast_path(fast, user=user, key=key, digest=digest, lines=list(mine.lines))) is not None:
                return replayed
            guards = []  # a record without its order (the order was deleted): queue after all
            result = combining.queue(mine, wait=mine.deadline - time.monotonic())
        if isinstance(result, Alone):  # not combined, or handed back by a lane's holder: lock it ourselves
            result = _alone(mine, combined=combined, use_locks=use_locks)
        if not isinstance(result, Again):
            return result
        log.info("place_order: again (%d) after a lost lock", tries.used + 1)
        if not tries.spend(pause=not combined):  # a queue paces itself: no pause
            return (combining.queue(mine, wait=0) if combined
                    else Refused.of(errors.Conflict(details={"retries": tries.retries})))


def _alone(mine: Request, *, combined: bool, use_locks: bool) -> Result:
    """Take the order's product locks ourselves and write it as a batch of one. A combined
    request that fails here (its wait ran out, Redis failed) settles its id first: it was
    queued, so a holder that took it and lost its lock may still commit it."""
    product_ids = [pid for pid, _ in mine.lines]
    try:
        with held([product_lock(pid) for pid in product_ids], use_locks=use_locks, until=mine.deadline) as holds:
            result = writer.write([mine], holds={pid: holds[product_lock(pid)] for pid in product_ids})[mine.id]
    except (errors.LockTimeout, errors.LockUnavailable) as exc:
        if not combined:
            raise
        result = Refused.of(exc)
    return combining.settle_failure(mine, result) if combined else result


def _fast_path(fast: soldout.FastPath, *, user, key: str | None, digest: str,
               lines: list[tuple[int, int]]) -> Receipt | None:
    """The replay of this key's order if Redis has its record (or could not tell), else None;
    OutOfStock if a product is marked sold out."""
    if key is not None and fast.has_record is not False and (
            replayed := _replay(user=user, key=key, digest=digest)) is not None:
        return replayed
    if fast.marked:
        metrics.soldout_rejected()
        short = [{"product_id": pid, "requested": qty, "available": 0} for pid, qty in lines if pid in fast.marked]
        raise errors.OutOfStock.of(short)
    return None


def _receipt(placed: Placed, *, user, key: str | None) -> Receipt:
    """The writer's (or combiner's) result as the buyer's receipt: built from the result where it
    carries the lines (a placed order: no query), read back where it does not (a replay)."""
    if placed.lines is None:
        return Receipt.of_order(selectors.order_complete(user=user, order_id=placed.order_id),
                                replayed=placed.replayed)
    return Receipt(order_id=placed.order_id, status=placed.status, subtotal=placed.subtotal,
                   discount=placed.discount, total=placed.total, coupon_code=placed.coupon_code,
                   idempotency_key=key, created_at=placed.created_at, pay_by=placed.pay_by, paid_at=placed.paid_at,
                   lines=placed.lines, replayed=placed.replayed)
