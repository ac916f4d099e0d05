"""Combining checkout: the buyers of one hot product are served in batches by the lock holder.

The path of one single-product order (SHOP["COMBINING"], locks on):

    place_order (checkout.py): validate -> sold-out marker / replay (one MGET) -> place_combined:
      submit the request on the product's lock (locks/combining.py)
        Served -> the combiner's reply: our order, or our typed error
        our Turn -> batch = [ours] + the requests queued behind us (up to COMBINE_BATCH), then
          serve_batch, ONE durable transaction under the product's lock:
            drop requests past their deadline; replay known idempotency keys;
            read the product row once (price, active, stock; FOR UPDATE);
            coupon claims of the batch (rows locked in id order);
            allocate FIFO: a request that does not fit what is left is refused out_of_stock,
              later smaller ones may still fit;
            ONE guarded, fenced UPDATE for the batch total (stock >= total AND fence < :fence);
            bulk INSERT orders, lines, ledger rows and the request ids (CheckoutRequest);
            use the coupon claims; idempotency records; check the lease; COMMIT
          reply to every request taken, release: the lock goes by hand-off to the next in line,
          who serves the next batch
      a buyer whose wait runs out (or who cannot tell what happened) *settles* its request id:
        INSERT CheckoutRequest(request_id, order=NULL) succeeds -> nothing was committed and
        nothing can be any more (a late combiner fails on the unique key): lock_timeout;
        it collides -> the order was committed: the buyer gets it.

Every outcome is determinable: a combiner that crashes mid-batch commits nothing (its
waiters queue again when its lease ends and the next combiner serves them); one paused past its
lease is refused by the fence, its lease check, or the request ids' unique key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, OperationalError, connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone
from redis.exceptions import RedisError

import locks
from locks import combining
from shop import errors
from shop.conf import shop_settings
from shop.models import CheckoutRequest, Coupon, CouponClaim, Order, OrderLine, Product, StockLedger
from shop.services import fences, hooks, idempotency, limits, soldout, stale_transactions
from shop.services.coupons import coupon_error
from shop.services.locking import (
    ER_LOCK_WAIT_TIMEOUT,
    RETRYABLE_MYSQL,
    StaleFence,
    check_before_commit,
    product_lock,
    release_safely,
    shop_lock,
)
from shop.services.orders import pay_by_from
from shop.services.transactions import durable_transaction

log = logging.getLogger("shop")

CENTS = Decimal("0.01")
# A request whose buyer gives up sooner than this is not committed (it could not be told).
DEADLINE_MARGIN = 0.05


@dataclass
class BatchRequest:
    """One buyer's order in a batch. `token` is None for the combiner's own request."""

    id: str
    user_id: int
    quantity: int
    code: str | None
    key: str | None
    digest: str
    deadline: float  # time.monotonic() of the combiner
    token: str | None = None

    def payload(self) -> str:
        return json.dumps({"id": self.id, "u": self.user_id, "q": self.quantity, "c": self.code,
                           "k": self.key, "d": self.digest}, separators=(",", ":"))

    @classmethod
    def from_taken(cls, taken: combining.Request) -> BatchRequest:
        data = json.loads(taken.payload)
        return cls(id=data["id"], user_id=data["u"], quantity=data["q"], code=data["c"], key=data["k"],
                   digest=data["d"], deadline=taken.deadline, token=taken.token)


Result = dict  # {"order": {...}} | {"error": {...}} | {"again": 1}


def _placed(order: Order, *, replayed: bool, request: BatchRequest, row: dict | None) -> Result:
    """The buyer's answer: the order and, with the product's row, its whole receipt (the one
    line, sku, name, coupon code, time), so the API answers without reading the order back."""
    placed = {"id": order.pk, "subtotal": str(order.subtotal), "discount": str(order.discount),
              "total": str(order.total), "coupon": order.coupon_id, "replayed": replayed,
              "status": order.status, "pay_by": order.pay_by.isoformat() if order.pay_by else None,
              "paid_at": order.paid_at.isoformat() if order.paid_at else None}
    if row is not None:
        placed["receipt"] = {"created_at": order.created_at.isoformat(), "code": request.code,
                             "sku": row["sku"], "name": row["name"], "quantity": request.quantity,
                             "unit_price": str((order.subtotal / request.quantity).quantize(CENTS))}
    return {"order": placed}


def _failed(exc: errors.ShopError) -> Result:
    return {"error": exc.as_dict()}


# --- the buyer ------------------------------------------------------------------------------
def place_combined(*, user, product_id: int, quantity: int, code: str | None, key: str | None,
                   digest: str) -> Order:
    """Queue this order on the product's lock; serve a batch if the lock comes to us."""
    lock = shop_lock(product_lock(product_id))
    deadline = time.monotonic() + float(shop_settings.LOCK_WAIT)
    mine = BatchRequest(id=uuid.uuid4().hex, user_id=user.pk, quantity=quantity, code=code, key=key,
                        digest=digest, deadline=deadline)
    payload = mine.payload()
    for _ in range(int(shop_settings.RETRIES) + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            got = combining.submit(lock, payload, wait=left)
        except locks.LockTimeout:
            break
        except locks.LockUnavailable as exc:
            # Redis failed us, but a combiner may have taken our request: find out in MySQL.
            if (order := _settle(mine.id, user)) is not None:
                return order
            raise errors.LockUnavailable(details={"lock": lock.name}) from exc
        if isinstance(got, combining.Served):
            result = json.loads(got.reply)
        else:
            result = _take_turn(got, product_id=product_id, mine=mine)
        if "again" in result:
            continue
        if "error" in result:
            error = result["error"]
            if error["code"] == errors.DatabaseUnavailable.code and error["details"].get("outcome") == "unknown":
                if (order := _settle(mine.id, user)) is not None:
                    return order
                raise errors.DatabaseUnavailable(details={"outcome": "not_written"})
            raise errors.ERRORS_BY_CODE[error["code"]](error["message"], details=error["details"])
        return _order_from(result["order"], user=user, product_id=product_id, key=key, digest=digest)
    if (order := _settle(mine.id, user)) is not None:
        return order  # committed by a combiner whose reply we did not wait for
    raise errors.LockTimeout(details={"lock": lock.name})


def _order_from(data: dict, *, user, product_id: int, key: str | None, digest: str) -> Order:
    """The Order a combiner's reply describes. With a receipt it is complete (`receipt_ready`):
    its coupon, line and product are filled in, so rendering it sends no query."""
    order = Order(pk=data["id"], user=user, subtotal=Decimal(data["subtotal"]), discount=Decimal(data["discount"]),
                  total=Decimal(data["total"]), coupon_id=data["coupon"], idempotency_key=key,
                  request_digest=digest, status=data["status"],
                  pay_by=datetime.fromisoformat(data["pay_by"]) if data["pay_by"] else None,
                  paid_at=datetime.fromisoformat(data["paid_at"]) if data["paid_at"] else None)
    order._state.adding = False
    order.replayed = data["replayed"]
    receipt = data.get("receipt")
    order.receipt_ready = receipt is not None
    if receipt is not None:
        order.created_at = datetime.fromisoformat(receipt["created_at"])
        if order.coupon_id is not None:
            order.coupon = Coupon(pk=order.coupon_id, code=receipt["code"])
        product = Product(pk=product_id, sku=receipt["sku"], name=receipt["name"])
        line = OrderLine(order=order, product=product, quantity=receipt["quantity"],
                         unit_price=Decimal(receipt["unit_price"]))
        order._prefetched_objects_cache = {"lines": [line]}
    return order


def _settle(request_id: str, user) -> Order | None:
    """Claim our request id as given up. None: nothing was committed for it, and nothing will be.
    The order: a combiner committed it (its INSERT of the same id came first)."""
    try:
        with durable_transaction():
            CheckoutRequest.objects.create(request_id=request_id)
        return None
    except IntegrityError:
        claim = CheckoutRequest.objects.select_related("order").get(request_id=request_id)
        if claim.order is None:
            return None
        claim.order.replayed = False
        return claim.order


# --- the combiner ---------------------------------------------------------------------------
def _take_turn(turn: combining.Turn, *, product_id: int, mine: BatchRequest) -> Result:
    """Serve our request and the batch queued behind us; reply to each; release."""
    try:
        taken: list[BatchRequest] = []
        try:
            try:
                taken = [BatchRequest.from_taken(r) for r in turn.take(int(shop_settings.COMBINE_BATCH) - 1)]
            except locks.LockUnavailable as exc:
                # Redis went away under us: nothing committed. Requests the take may have moved
                # are woken when our hold ends without replying, and queue again.
                raise errors.LockUnavailable(details={"lock": turn.hold.name, "redis": "unreachable"}) from exc
            results = serve_batch(product_id=product_id, batch=[mine, *taken], turn=turn)
        except errors.ShopError as exc:  # the database went away: every request shares the outcome
            results = {r.id: _failed(exc) for r in [mine, *taken]}
        except Exception:
            # Unexpected: the transaction rolled back, nothing was written. Tell the others to
            # come again (their own turn will show the error if it persists), then raise.
            _reply(turn, {r.token: json.dumps({"again": 1}) for r in taken if r.token})
            raise
        _reply(turn, {r.token: json.dumps(results[r.id], separators=(",", ":")) for r in taken if r.token})
    finally:
        release_safely(turn.hold)
        with contextlib.suppress(locks.LockNotOwned):
            turn.release()  # the hold is already released: this counts the batch (lock stats, metrics)
    return results[mine.id]


def _reply(turn: combining.Turn, replies: dict[str, str]) -> None:
    try:
        turn.reply(replies)
    except (RedisError, locks.LockUnavailable):
        # They wait on; when our hold ends without their reply they queue again, and the next
        # combiner finds their request ids committed (or not) and answers them.
        log.warning("combining: replies to %d buyers failed (Redis); they will be answered again", len(replies))


def serve_batch(*, product_id: int, batch: list[BatchRequest], turn: combining.Turn) -> dict[str, Result]:
    """Commit the batch in one transaction (retried on deadlocks); a result per request id."""
    hold = turn.hold
    results: dict[str, Result] = {}
    pending = list(batch)
    stale_transactions.record({hold.name: hold})
    isolate = False
    for _ in range(int(shop_settings.RETRIES) + 1):
        try:
            done, left_stock = _commit(product_id=product_id, pending=pending, hold=hold, isolate=isolate)
        except IntegrityError:
            # One request's rows hit a unique or foreign key (its buyer gave up since we looked,
            # its key placed an order on another product's lock, its account is gone): write
            # again with each request on its own, so that request alone is refused (I9).
            isolate = True
            continue
        except OperationalError as exc:
            if not exc.args or exc.args[0] not in RETRYABLE_MYSQL:
                raise
            if exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
                stale_transactions.end_older_holders()  # a combiner paused past its lease keeps the row
            continue
        except (StaleFence, locks.LockLost) as exc:
            if isinstance(exc, StaleFence):
                fences.refused(exc.lock, operation="combining")
            return {**results, **{r.id: {"again": 1} for r in pending}}
        results.update(done)
        if left_stock == 0:
            _mark_sold_out(product_id, hold)
        return results
    return {**results, **{r.id: _failed(errors.Conflict(details={"retries": int(shop_settings.RETRIES)}))
                          for r in pending}}


def _commit(*, product_id: int, pending: list[BatchRequest], hold: locks.Hold,
            isolate: bool = False) -> tuple[dict[str, Result], int | None]:
    results: dict[str, Result] = {}
    now = time.monotonic()
    live = []
    for r in pending:
        if r.token is not None and r.deadline - now < DEADLINE_MARGIN:
            results[r.id] = _failed(errors.LockTimeout(details={"lock": hold.name}))
        else:
            live.append(r)

    with durable_transaction():
        hooks.call("before_update", {hold.name: hold})
        # The row lock first: every combiner of this product (and a paused one that wakes)
        # passes here, so what we read next is exact until we commit.
        row = Product.objects.select_for_update().filter(pk=product_id).values(
            "price", "active", "stock", "fence", "sku", "name", "max_per_user").first()
        # A request served before, by a combiner that crashed or stalled before replying (its
        # buyer queued again), is answered from what was committed, never allocated again.
        live = _drop_settled(live, results, row)
        live = _drop_replays(live, results, row)
        if row is None or not row["active"]:
            error = (errors.UnknownProduct(details={"product_ids": [product_id]}) if row is None
                     else errors.InactiveProduct(details={"product_ids": [product_id]}))
            results.update({r.id: _failed(error) for r in live})
            return results, None
        if row["fence"] >= hold.fence:
            raise StaleFence(hold.name)  # a newer holder wrote the row: our lock is gone
        claims = _coupon_claims(live, results)
        live = [r for r in live if r.id not in results]

        left = row["stock"]
        cap = row["max_per_user"]
        # Purchase caps: counted under the row lock taken above, then kept up to date per buyer
        # as the batch is allocated, so two requests of one buyer in a batch count together.
        have = limits.bought(product_id=product_id, user_ids={r.user_id for r in live}) if cap is not None else {}
        max_unpaid = limits.max_unpaid()
        unpaid = limits.unpaid(user_ids={r.user_id for r in live}) if max_unpaid is not None and live else {}
        placed: list[BatchRequest] = []
        for r in live:  # FIFO: ours first, then in queue order
            if max_unpaid is not None and unpaid.get(r.user_id, 0) >= max_unpaid:
                results[r.id] = _failed(limits.too_many_unpaid(limit=max_unpaid, unpaid=unpaid[r.user_id]))
            elif cap is not None and have.get(r.user_id, 0) + r.quantity > cap:
                results[r.id] = _failed(limits.exceeded(product_id=product_id, limit=cap,
                                                        bought=have.get(r.user_id, 0), requested=r.quantity))
            elif r.quantity <= left:
                placed.append(r)
                left -= r.quantity
                have[r.user_id] = have.get(r.user_id, 0) + r.quantity
                unpaid[r.user_id] = unpaid.get(r.user_id, 0) + 1
            else:
                state = "sold out" if left == 0 else f"only {left} left"
                results[r.id] = _failed(errors.OutOfStock(
                    f"Not enough stock: product {product_id}: {state}.",
                    details={"lines": [{"product_id": product_id, "requested": r.quantity, "available": left}]}))
        if not placed:
            return results, left

        price = row["price"]
        written = _write_orders(placed, product_id=product_id, price=price, claims=claims, hold=hold,
                                results=results, row=row, isolate=isolate)
        total = sum(r.quantity for r, _ in written)
        if total:
            updated = Product.objects.filter(pk=product_id, active=True, stock__gte=total,
                                             fence__lt=hold.fence).update(stock=F("stock") - total, fence=hold.fence)
            if not updated:
                raise StaleFence(hold.name)  # the row changed behind our lock: read it again
        used = []
        stamp = timezone.now()
        for r, o in written:
            if (claim := claims.get(r.id)) is not None:
                claim.used_at, claim.order = stamp, o
                used.append(claim)
        if used:
            CouponClaim.objects.bulk_update(used, ["used_at", "order"])
        idempotency.write_records([(r.user_id, r.key, o.pk) for r, o in written if r.key], required=True)
        hooks.call("before_commit", {hold.name: hold})
        check_before_commit({hold.name: hold})
        for r, o in written:
            results[r.id] = _placed(o, replayed=False, request=r, row=row)
    return results, row["stock"] - total


def _write_orders(placed: list[BatchRequest], *, product_id: int, price: Decimal, claims: dict[str, CouponClaim],
                  hold: locks.Hold, results: dict[str, Result], row: dict,
                  isolate: bool) -> list[tuple[BatchRequest, Order]]:
    """INSERT the orders, lines, ledger rows and request ids of the allocated requests.

    All at once (multi-row INSERTs) unless `isolate`: after such a write failed on a unique or
    foreign key, each request is written in a savepoint of its own, so a request whose rows
    cannot be written is refused alone and the rest of the batch still commits (I9).
    """
    pay_by = pay_by_from()  # the batch commits together: one deadline for all of it
    if not isolate:
        return _insert_orders(placed, product_id=product_id, price=price, claims=claims, hold=hold, pay_by=pay_by)
    written = []
    for r in placed:
        try:
            with transaction.atomic():  # a savepoint: this request's rows alone
                written += _insert_orders([r], product_id=product_id, price=price, claims=claims, hold=hold,
                                          pay_by=pay_by)
        except IntegrityError:
            _refuse_unwritable(r, results, row)
    return written


def _insert_orders(placed: list[BatchRequest], *, product_id: int, price: Decimal, claims: dict[str, CouponClaim],
                   hold: locks.Hold, pay_by: datetime) -> list[tuple[BatchRequest, Order]]:
    orders = []
    for r in placed:
        subtotal = price * r.quantity
        claim = claims.get(r.id)
        discount = min(claim.coupon.discount, subtotal) if claim is not None else CENTS * 0
        orders.append(Order(user_id=r.user_id, subtotal=subtotal, discount=discount, total=subtotal - discount,
                            coupon_id=claim.coupon_id if claim is not None else None,
                            idempotency_key=r.key, request_digest=r.digest,
                            status=Order.Status.PENDING_PAYMENT, pay_by=pay_by))
    Order.objects.bulk_create(orders)  # the ORM here: it reads back the new ids
    pairs = list(zip(placed, orders, strict=True))
    created = connection.ops.adapt_datetimefield_value(timezone.now())
    _insert_rows(OrderLine, ("order", "product", "quantity", "unit_price"),
                 [(o.pk, product_id, r.quantity, price) for r, o in pairs])
    _insert_rows(StockLedger, ("product", "quantity", "reason", "order", "fence", "actor", "created_at"),
                 [(product_id, -r.quantity, StockLedger.Reason.ORDER.value, o.pk, hold.fence, f"user:{r.user_id}",
                   created) for r, o in pairs])
    _insert_rows(CheckoutRequest, ("request_id", "order", "created_at"), [(r.id, o.pk, created) for r, o in pairs])
    return pairs


def _refuse_unwritable(r: BatchRequest, results: dict[str, Result], row: dict) -> None:
    """Why this request's rows failed: its id was settled meanwhile (the buyer gave up), its key
    placed an order meanwhile (replay or conflict), or its own rows are bad (a deleted account)."""
    for explain in (_drop_settled, _drop_replays):
        explain([r], results, row)
        if r.id in results:
            return
    log.warning("combining: request %s of user %s cannot be written; refused alone", r.id, r.user_id)
    results[r.id] = _failed(errors.OrderNotWritable())


def _insert_rows(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> None:
    """One multi-row INSERT from plain values. bulk_create builds and compiles a model instance
    per row, which was most of a batch's client CPU (cProfile, docs/benchmarks.md); rows that
    need no id back are written this way (values already in their database form)."""
    if not rows:
        return
    qn = connection.ops.quote_name
    columns = ", ".join(qn(model._meta.get_field(f).column) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {qn(model._meta.db_table)} ({columns}) VALUES " + ", ".join([one] * len(rows)),
                       [value for row in rows for value in row])


def _drop_settled(live: list[BatchRequest], results: dict[str, Result], row: dict | None) -> list[BatchRequest]:
    """Requests whose id is already claimed: by an order (a crashed combiner committed it) or
    by a buyer who gave up. Either way they are not committed again."""
    claimed = dict(CheckoutRequest.objects.filter(request_id__in=[r.id for r in live])
                   .values_list("request_id", "order_id"))
    if not claimed:
        return live
    orders = Order.objects.in_bulk([oid for oid in claimed.values() if oid is not None])
    for r in live:
        if r.id in claimed:
            oid = claimed[r.id]
            results[r.id] = (_placed(orders[oid], replayed=False, request=r, row=row) if oid is not None
                             else _failed(errors.LockTimeout(details={"gave_up": True})))
    return [r for r in live if r.id not in claimed]


def _drop_replays(live: list[BatchRequest], results: dict[str, Result], row: dict | None) -> list[BatchRequest]:
    """Idempotency keys: a key that already placed an order gets it back (or a conflict if the
    body differs); a second request with the same key in this batch is refused as a conflict."""
    keyed = [r for r in live if r.key]
    if not keyed:
        return live
    query = Q()
    for r in keyed:
        query |= Q(user_id=r.user_id, idempotency_key=r.key)
    known = {(o.user_id, o.idempotency_key): o for o in Order.objects.filter(query)}
    seen: set[tuple[int, str]] = set()
    for r in keyed:
        pair = (r.user_id, r.key)
        if (order := known.get(pair)) is not None:
            results[r.id] = (_placed(order, replayed=True, request=r, row=row) if order.request_digest == r.digest
                             else _failed(errors.IdempotencyConflict(details={"order_id": order.pk})))
        elif pair in seen:
            # Its twin in this batch is being placed right now; the client retries and replays it.
            results[r.id] = _failed(errors.Conflict(details={"idempotency_key": "in flight"}))
        seen.add(pair)
    return [r for r in live if r.id not in results]


def _coupon_claims(live: list[BatchRequest], results: dict[str, Result]) -> dict[str, CouponClaim]:
    """The unused claim each coupon request will use, rows locked (in id order: no deadlocks
    with other products' batches); a request without a usable claim is refused."""
    wanted = [r for r in live if r.code]
    if not wanted:
        return {}
    coupons = {c.code: c for c in Coupon.objects.filter(code__in={r.code for r in wanted})}
    usable = []
    for r in wanted:
        if (error := coupon_error(coupons.get(r.code), r.code)) is not None:
            results[r.id] = _failed(error)
        else:
            usable.append(r)
    if not usable:
        return {}
    rows = (CouponClaim.objects.select_for_update().select_related("coupon")
            .filter(coupon_id__in={coupons[r.code].pk for r in usable}, user_id__in={r.user_id for r in usable},
                    used_at__isnull=True).order_by("pk"))
    by_pair = {(c.coupon_id, c.user_id): c for c in rows}
    claims: dict[str, CouponClaim] = {}
    for r in usable:
        claim = by_pair.pop((coupons[r.code].pk, r.user_id), None)  # pop: one claim, one order
        if claim is None:
            results[r.id] = _failed(errors.CouponNotClaimed(details={"coupon_code": r.code}))
        else:
            claims[r.id] = claim
    return claims


def _mark_sold_out(product_id: int, hold: locks.Hold) -> None:
    """Stock read 0 under the lock: mark it, with the hold's fence as proof (soldout.py)."""
    try:
        hold.check(verify=True)
    except (locks.LockLost, locks.LockUnavailable):
        return
    soldout.mark(product_id, fence=hold.fence)
