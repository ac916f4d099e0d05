"""The one checkout writer: commits a batch of order requests under their products' held locks.

Every order goes through `write` (docs/design.md, "The path of one checkout"): a single-product order
queued on its product's lock is written in its combiner's batch (shop/checkout/combining.py); a
cart over several products, a backend without combining or SHOP["COMBINING"] off is a batch of
one under its sorted product locks (shop/services/checkout.py). One durable transaction:

    drop requests past their buyer's deadline;
    SELECT the batch's product rows FOR UPDATE (sorted ids): what we read is exact until COMMIT;
    a newer holder wrote a row (its fence >= ours): our lock is gone, the batch comes Again;
    hidden products and drops not open or over are refused, against the one time of the attempt
    that the orders are stamped with: the database's, read by that SELECT once the rows are
    locked (so no order's created_at is outside its product's window, whatever our own clock says);
    coupon claims (rows FOR UPDATE in pk order), the unpaid limit, purchase caps;
    allocate FIFO: a request is placed only if every line fits what is left;
    INSERT orders (RETURNING id), lines, ledger rows, request ids (multi-row statements);
    ONE guarded, fenced UPDATE per product for the batch total;
    use the coupon claims; idempotency records; a sale that closed meanwhile rolls back (the next
    attempt refuses it); check the leases; COMMIT.
    After: mark products whose stock reached 0 sold out (with the hold's fence as proof).

Replays and settled request ids are not looked up first: the unique keys on (user, idempotency
key) and on the request id refuse a duplicate, and the write is then repeated with each request
in a savepoint of its own (`isolate`), where a request that collides is explained (its order
replayed, or its buyer gave up) and refused alone: I9, each request answered on its own merits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, InterfaceError, OperationalError, connection, models, transaction
from django.db.models import Q
from django.utils import timezone

import locks
from shop import errors, rules
from shop import line as lines_of_drops
from shop.checkout import purchase_limits
from shop.checkout.protocol import AGAIN, Placed, Refused, Request, Result
from shop.conf import shop_settings
from shop.models import CheckoutRequest, Coupon, CouponClaim, Order, OrderLine, Product, StockLedger
from shop.ops import metrics
from shop.plumbing import clock, fence_refusals, hooks, idempotency, soldout, stale_transactions
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import StaleFence, check_before_commit
from shop.plumbing.transactions import (
    ER_LOCK_WAIT_TIMEOUT,
    RETRYABLE_MYSQL,
    backoff,
    drop_connection,
    durable_transaction,
    lost_connection,
)
from shop.reads.receipts import ReceiptLine as Line
from shop.rules import coupon_error, pay_by_from

log = logging.getLogger("shop")

# A request whose buyer gives up sooner than this is not taken into a batch (it could not be told),
# and none with less than COMMIT_MARGIN left is committed (the COMMIT and the reply take that).
DEADLINE_MARGIN = 0.05
COMMIT_MARGIN = 0.02


Holds = dict[int, "locks.Hold | None"]  # product id -> its hold (None: locks are off)


def write(requests: list[Request], *, holds: Holds) -> dict[str, Result]:
    """Commit `requests` (FIFO) for the products of `holds`, whose locks the caller holds.

    One result per request id. Deadlocks and lock-wait timeouts are retried here (under the same
    locks); a stale fence or a lost lock answers every request not yet answered `AGAIN`.

    A batch written again because of one request's own trouble (its deadline passed, its rows hit
    a unique key) uses none of the retries: one request costs only itself (I9). Each such pass
    drops a request or switches to `isolate`, so there are at most as many as requests, plus one.
    """
    results: dict[str, Result] = {}
    pending = list(requests)
    isolate = False
    retries = int(shop_settings.RETRIES)
    n = 0  # retries used
    while n <= retries:
        try:
            done, left = _commit(pending, holds=holds, isolate=isolate)
        except IntegrityError:
            # A request's rows hit a unique or foreign key (its key placed an order meanwhile, its
            # buyer gave up, its account is gone): write again, each request on its own (I9).
            if isolate:  # isolated, no request's rows fail the batch: this one is the batch's own
                n += 1
            isolate = True
            continue
        except OperationalError as exc:
            if not exc.args or exc.args[0] not in RETRYABLE_MYSQL:
                raise
            if exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
                stale_transactions.lock_wait_timed_out()  # a holder paused past its lease may keep the row
            log.info("checkout: retry %d after mysql %s", n + 1, exc.args[0])
            backoff(n)
            n += 1
            continue
        except (StaleFence, locks.LockLost) as exc:
            if isinstance(exc, StaleFence):
                fence_refusals.refused(exc.lock, operation="place_order")
            return {**results, **{r.id: AGAIN for r in pending}}
        except _Closed:
            n += 1
            continue  # written again: now past its close, that product's requests are refused
        except _Late as exc:
            # Their deadline passed while the batch was written: nothing of it committed; the
            # others are written again without them (no order is committed past its deadline).
            late = set(exc.ids)
            for r in pending:
                if r.id in late:
                    metrics.deadline_expired("commit")
                    results[r.id] = _too_late(r)
            pending = [r for r in pending if r.id not in late]
            if not pending:
                return results
            continue
        hooks.call("after_commit", _by_name(holds))
        _explain_refusals(pending, done)
        for pid, stock in left.items():
            if stock == 0:
                soldout.mark_under(pid, holds.get(pid))
        lines_of_drops.stock_left(left)  # a drop's line lets through no more buyers than units are left
        return {**results, **done}
    conflict = Refused.of(errors.Conflict(details={"retries": retries}))
    return {**results, **{r.id: conflict for r in pending}}


class _Late(Exception):
    """Requests of the batch whose deadline passed before its COMMIT."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(ids)
        self.ids = ids


class _Closed(Exception):
    """A product of the batch closed its sale between the window check and the COMMIT."""


def _too_late(r: Request) -> Refused:
    """A request that waited in line until its deadline: `lock_timeout`, nothing written."""
    return Refused.of(errors.LockTimeout(details={"lock": product_lock(r.lines[0][0]), "deadline": True}))


def _by_name(holds: Holds) -> dict[str, locks.Hold | None]:
    return {product_lock(pid): hold for pid, hold in holds.items()}


def _commit(pending: list[Request], *, holds: Holds, isolate: bool) -> tuple[dict[str, Result], dict[int, int]]:
    """One attempt: results by request id, and the stock left of each product read."""
    results: dict[str, Result] = {}
    now = time.monotonic()
    live = []
    for r in pending:
        if r.deadline - now < DEADLINE_MARGIN:
            metrics.deadline_expired("take")
            results[r.id] = _too_late(r)
        else:
            live.append(r)
    named = _by_name(holds)
    with durable_transaction():
        hooks.call("before_update", named)
        # The one time of this attempt, the database's, read with the rows once they are locked:
        # the drop windows are compared with it and the orders stamped with it (shop/plumbing/clock.py).
        rows, at = _lock_rows(sorted(holds))
        if isolate:  # the rare second pass: answer settled ids and known keys before allocating
            live = _drop_settled(live, results)
            live = _drop_replays(live, results)
        for pid, hold in holds.items():
            if hold is not None and pid in rows and rows[pid]["fence"] >= hold.fence:
                raise StaleFence(hold.name)  # a newer holder wrote the row: our lock is gone
        live = _refuse_unsold(live, results, rows, at)
        claims = _coupon_claims(live, results)
        live = [r for r in live if r.id not in results]
        stock = {pid: row["stock"] for pid, row in rows.items() if Product.row_on_sale(row, at)}  # the sellable ones
        placed = _allocate(live, results, rows, dict(stock))
        if not placed:
            return results, stock
        written = _write_orders(placed, rows=rows, claims=claims, holds=holds, results=results, isolate=isolate,
                                at=at)
        if not written:  # every request was refused alone (isolate): nothing to take
            return results, stock
        totals: dict[int, int] = {}
        for r, _ in written:
            for pid, qty in r.lines:
                totals[pid] = totals.get(pid, 0) + qty
        _take_stock(totals, holds)
        _use_claims(written, claims)
        idempotency.write_records([(r.user_id, r.key, o.order_id) for r, o in written if r.key],
                                  required=any(h is not None for h in holds.values()))
        hooks.call("before_commit", named)
        if late := [r.id for r, _ in written if r.deadline - time.monotonic() < COMMIT_MARGIN]:
            raise _Late(late)  # rolls back: written again without them
        if _closed_since(rows, totals):
            raise _Closed()  # rolls back: no order is committed after its sale closed
        check_before_commit(named)
        hooks.call("at_commit", named)
        results.update({r.id: o for r, o in written})
    return results, {pid: n - totals.get(pid, 0) for pid, n in stock.items()}


_ROW_FIELDS = ("id", "price", *Product.ON_SALE_FIELDS, "stock", "fence", "sku", "name", "max_per_user")


def _lock_rows(product_ids: list[int]) -> tuple[dict[int, dict], datetime]:
    """The products' rows, locked FOR UPDATE in id order (plain SQL: the ORM's compile of this
    statement was a large share of an order's client CPU), and the database's time once the last
    of them was locked, read by the same statement (no round trip of its own). The window's
    times come back naive (the database's UTC): made aware, as the ORM would."""
    qn = connection.ops.quote_name
    cols = ", ".join(qn(Product._meta.get_field(f).column) for f in _ROW_FIELDS)
    marks = ", ".join(["%s"] * len(product_ids))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {cols}, {clock.ROW_NOW_SQL} FROM {qn(Product._meta.db_table)} "
                       f"WHERE {qn('id')} IN ({marks}) ORDER BY {qn('id')} FOR UPDATE", product_ids)
        fetched = cursor.fetchall()
    rows = {row[0]: dict(zip(_ROW_FIELDS, row[:-1], strict=True)) for row in fetched}
    for row in rows.values():
        for f in ("opens_at", "closes_at"):
            if row[f] is not None and timezone.is_naive(row[f]):
                row[f] = timezone.make_aware(row[f], connection.timezone)
    # No row (every product gone): nothing is on sale, and the time only stamps refusals.
    at = clock.aware(max(row[-1] for row in fetched)) if fetched else clock.now()
    return rows, at


def _closed_since(rows: dict[int, dict], totals: dict[int, int]) -> bool:
    """Whether a product written in this attempt closed its sale since the window check (a slow
    batch, a paused writer): then nothing of the attempt may commit. The database's clock without
    a round trip (`clock.now`): this runs just before COMMIT, for every batch."""
    closes = [rows[pid]["closes_at"] for pid in totals if rows[pid]["closes_at"] is not None]
    return bool(closes) and clock.now() >= min(closes)


def _take_stock(totals: dict[int, int], holds: Holds) -> None:
    """THE write of stock, one statement for the batch's products: each row guarded (never below
    0) and, under a lock, fenced (only a holder newer than the row's last writer may write it)."""
    qn = connection.ops.quote_name
    ids = sorted(totals)
    stock_case, fence_case, guards, args_stock, args_fence, args_guard = [], [], [], [], [], []
    for pid in ids:
        hold = holds.get(pid)
        stock_case.append("WHEN %s THEN stock - %s")
        args_stock += [pid, totals[pid]]
        if hold is None:
            guards.append("(id = %s AND stock >= %s)")
            args_guard += [pid, totals[pid]]
        else:
            fence_case.append("WHEN %s THEN %s")
            args_fence += [pid, hold.fence]
            guards.append("(id = %s AND stock >= %s AND fence < %s)")
            args_guard += [pid, totals[pid], hold.fence]
    fence_set = f", fence = CASE id {' '.join(fence_case)} ELSE fence END" if fence_case else ""
    sql = (f"UPDATE {qn(Product._meta.db_table)} SET stock = CASE id {' '.join(stock_case)} END{fence_set} "
           f"WHERE id IN ({', '.join(['%s'] * len(ids))}) AND {Product.ON_SALE_SQL} AND ({' OR '.join(guards)})")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*args_stock, *args_fence, *ids, *args_guard])
        if cursor.rowcount != len(ids):
            # A row changed behind our locks (a newer holder, stock taken by SQL): read it again.
            # (The rows were read FOR UPDATE and checked, so this is a last guard; the refusal is
            # counted under the first product's lock.)
            raise StaleFence(product_lock(ids[0]))


def _refuse_unsold(live: list[Request], results: dict[str, Result], rows: dict[int, dict],
                   at: datetime) -> list[Request]:
    """Requests with a line not on sale at `at`: missing or hidden (to non-staff both read as
    unknown: errors.as_seen_by), or outside its drop window (rules.not_on_sale says which)."""
    out = []
    for r in live:
        unsold = [pid for pid, _ in r.lines if pid not in rows or not Product.row_on_sale(rows[pid], at)]
        if not unsold:
            out.append(r)
            continue
        results[r.id] = Refused.of(rules.not_on_sale(unsold, rows, at))
    return out


def _allocate(live: list[Request], results: dict[str, Result], rows: dict[int, dict],
              left: dict[int, int]) -> list[Request]:
    """FIFO: a request is placed if its buyer is under the unpaid limit and the caps and every
    line fits what is left; a later, smaller request may still fit. Counts kept per buyer as the
    batch is allocated, so two requests of one buyer in a batch count together. Counted under
    the row locks: exact (purchase_limits.py)."""
    users = {r.user_id for r in live}
    capped = {pid for r in live for pid, _ in r.lines if rows[pid]["max_per_user"] is not None}
    have = {pid: purchase_limits.bought(product_id=pid, user_ids=users) for pid in sorted(capped)}
    max_unpaid = purchase_limits.max_unpaid()
    unpaid = purchase_limits.unpaid(user_ids=users) if max_unpaid is not None and live else {}
    placed = []
    for r in live:
        if max_unpaid is not None and unpaid.get(r.user_id, 0) >= max_unpaid:
            results[r.id] = Refused.of(purchase_limits.too_many_unpaid(limit=max_unpaid, unpaid=unpaid[r.user_id]))
            continue
        over = next(((pid, qty) for pid, qty in r.lines if pid in capped
                     and have[pid].get(r.user_id, 0) + qty > rows[pid]["max_per_user"]), None)
        if over is not None:
            pid, qty = over
            results[r.id] = Refused.of(purchase_limits.exceeded(product_id=pid, name=rows[pid]["name"],
                                                                limit=rows[pid]["max_per_user"],
                                                                bought=have[pid].get(r.user_id, 0), requested=qty))
            continue
        short = [{"product_id": pid, "requested": qty, "available": left[pid]} for pid, qty in r.lines
                 if qty > left[pid]]
        if short:
            names = {line["product_id"]: rows[line["product_id"]]["name"] for line in short}
            results[r.id] = Refused.of(errors.OutOfStock(rules.out_of_stock_message(short, names),
                                                         details={"lines": short}))
            continue
        placed.append(r)
        for pid, qty in r.lines:
            left[pid] -= qty
            if pid in capped:
                have[pid][r.user_id] = have[pid].get(r.user_id, 0) + qty
        unpaid[r.user_id] = unpaid.get(r.user_id, 0) + 1
    return placed


def _write_orders(placed: list[Request], *, rows: dict[int, dict], claims: dict[str, CouponClaim], holds: Holds,
                  results: dict[str, Result], isolate: bool, at: datetime) -> list[tuple[Request, Placed]]:
    """INSERT the orders, lines, ledger rows and request ids of the allocated requests.

    All at once (multi-row INSERTs) unless `isolate`: after such a write failed on a unique or
    foreign key, each request is written in a savepoint of its own, so a request whose rows
    cannot be written is refused alone and the rest of the batch still commits (I9).
    """
    pay_by = pay_by_from(at)  # the batch commits together: one deadline for all of it
    if not isolate:
        return _insert_orders(placed, rows=rows, claims=claims, holds=holds, pay_by=pay_by, now=at)
    written = []
    for r in placed:
        try:
            with transaction.atomic():  # a savepoint: this request's rows alone
                written += _insert_orders([r], rows=rows, claims=claims, holds=holds, pay_by=pay_by, now=at)
        except IntegrityError:
            _refuse_unwritable(r, results)
    return written


def _insert_orders(placed: list[Request], *, rows: dict[int, dict], claims: dict[str, CouponClaim], holds: Holds,
                   pay_by: datetime, now: datetime) -> list[tuple[Request, Placed]]:
    db_now = connection.ops.adapt_datetimefield_value(now)
    db_pay_by = connection.ops.adapt_datetimefield_value(pay_by)
    status = Order.Status.PENDING_PAYMENT.value
    out = []
    values = []
    for r in placed:
        subtotal = sum((rows[pid]["price"] * qty for pid, qty in r.lines), Decimal("0.00"))
        claim = claims.get(r.id)
        off = rules.discount(subtotal, claim.coupon.discount if claim is not None else None)
        lines = tuple(Line(product_id=pid, sku=rows[pid]["sku"], name=rows[pid]["name"], quantity=qty,
                           unit_price=rows[pid]["price"]) for pid, qty in r.lines)
        out.append(Placed(order_id=0, subtotal=subtotal, discount=off, total=subtotal - off,
                          coupon_id=claim.coupon_id if claim is not None else None,
                          coupon_code=claim.coupon.code if claim is not None else None,
                          status=status, pay_by=pay_by, paid_at=None, created_at=now, lines=lines))
        values.append((r.id, r.user_id, status, subtotal, off, subtotal - off, out[-1].coupon_id, r.key,
                       r.digest, db_now, db_pay_by))
    ids = _insert_orders_rows(values)
    pairs = [(r, replace(p, order_id=ids[r.id])) for r, p in zip(placed, out, strict=True)]
    _insert_rows(OrderLine, ("order", "product", "quantity", "unit_price"),
                 [(o.order_id, pid, qty, rows[pid]["price"]) for r, o in pairs for pid, qty in r.lines])
    _insert_rows(StockLedger, ("product", "quantity", "reason", "order", "fence", "actor", "created_at"),
                 [(pid, -qty, StockLedger.Reason.ORDER.value, o.order_id,
                   holds[pid].fence if holds.get(pid) is not None else None, f"user:{r.user_id}", db_now)
                  for r, o in pairs for pid, qty in r.lines])
    _insert_rows(CheckoutRequest, ("request_id", "order", "created_at"),
                 [(r.id, o.order_id, db_now) for r, o in pairs if r.recorded])
    return pairs


_ORDER_FIELDS = ("request_id", "user", "status", "subtotal", "discount", "total", "coupon", "idempotency_key",
                 "request_digest", "created_at", "pay_by")


def _insert_orders_rows(values: list[tuple]) -> dict[str, int]:
    """INSERT the orders (one statement); their ids by request id. MariaDB returns them from the
    INSERT itself (RETURNING); MySQL has no RETURNING, and the ids of a multi-row INSERT need not
    be consecutive there (innodb_autoinc_lock_mode 2, its default; auto_increment_increment > 1
    under replication), so they are read back by the orders' own unique request ids."""
    qn = connection.ops.quote_name
    table, pk, request_id = qn(Order._meta.db_table), qn(Order._meta.pk.column), qn("request_id")
    returning = connection.features.can_return_rows_from_bulk_insert
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(Order, _ORDER_FIELDS, values)
                       + (f" RETURNING {request_id}, {pk}" if returning else ""))
        if not returning:
            marks = ", ".join(["%s"] * len(values))
            cursor.execute(f"SELECT {request_id}, {pk} FROM {table} WHERE {request_id} IN ({marks})",
                           [row[0] for row in values])
        return dict(cursor.fetchall())


def _insert_sql(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> str:
    """INSERT ... VALUES with the values as SQL literals, each distinct value escaped once by the
    driver: a batch repeats its status, times, prices, reasons and actors in every row, and the
    driver's escaping of every parameter was the largest share of a batch's INSERT cost (issue
    29's profile). Integers (ids, quantities, fences) need no escaping."""
    opts = model._meta
    qn = connection.ops.quote_name
    columns = ", ".join(qn(opts.get_field(f).column) for f in fields)
    escape = connection.connection.literal
    seen: dict[tuple[type, object], str] = {}

    def literal(value: object) -> str:
        if type(value) is int:
            return str(value)
        if value is None:
            return "NULL"
        key = (type(value), value)
        if (text := seen.get(key)) is None:
            text = seen[key] = escape(value).decode(connection.connection.encoding)
        return text

    values = ", ".join("(" + ", ".join(map(literal, row)) + ")" for row in rows)
    return f"INSERT INTO {qn(opts.db_table)} ({columns}) VALUES {values}"


def _insert_rows(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> None:
    """One multi-row INSERT from plain values (already in their database form). bulk_create
    builds and compiles a model instance per row, which was most of a batch's client CPU."""
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(_insert_sql(model, fields, rows))


def _use_claims(written: list[tuple[Request, Placed]], claims: dict[str, CouponClaim]) -> None:
    used = []
    stamp = timezone.now()
    for r, o in written:
        if (claim := claims.get(r.id)) is not None:
            claim.used_at, claim.order_id = stamp, o.order_id
            used.append(claim)
    if used:
        CouponClaim.objects.bulk_update(used, ["used_at", "order"])


def _explain_refusals(pending: list[Request], results: dict[str, Result]) -> None:
    """A refusal (no stock, a cap, a deadline) is not the answer for a request that was already
    served: its id committed by a combiner that stalled before replying (its buyer queued again),
    or its key placed an order meanwhile. The unique keys catch those only when we write, so the
    (rare) refused ones are looked up here, after the fact."""
    refused = {r.id: results[r.id] for r in pending
               if isinstance(results.get(r.id), Refused) and (r.recorded or r.key)}
    if not refused:
        return
    explained: dict[str, Result] = {}
    try:
        left = _drop_replays(_drop_settled([r for r in pending if r.id in refused], explained), explained)
    except (OperationalError, InterfaceError) as exc:
        if not lost_connection(exc):
            raise
        # The batch is committed and its orders stand; these refusals could not be checked:
        # "unknown", which the request id or the key's replay settles on a retry.
        drop_connection()
        unknown = Refused.of(errors.DatabaseUnavailable(details={"outcome": "unknown"}))
        results.update(dict.fromkeys(refused, unknown))
        return
    results.update(explained)
    results.update({r.id: refused[r.id] for r in left})


def _refuse_unwritable(r: Request, results: dict[str, Result]) -> None:
    """Why this request's rows failed: its id was settled meanwhile (the buyer gave up), its key
    placed an order meanwhile (replay or conflict), or its own rows are bad (a deleted account)."""
    for explain in (_drop_settled, _drop_replays):
        explain([r], results)
        if r.id in results:
            return
    log.warning("checkout: request %s of user %s cannot be written; refused alone", r.id, r.user_id)
    results[r.id] = Refused.of(errors.OrderNotWritable())


def _drop_settled(live: list[Request], results: dict[str, Result]) -> list[Request]:
    """Requests whose id is already claimed: by an order (a crashed combiner committed it) or
    by a buyer who gave up. Either way they are not committed again."""
    recorded = [r.id for r in live if r.recorded]
    claimed = dict(CheckoutRequest.objects.filter(request_id__in=recorded).values_list("request_id", "order_id")
                   ) if recorded else {}
    if not claimed:
        return live
    orders = Order.objects.in_bulk([oid for oid in claimed.values() if oid is not None])
    for r in live:
        if r.id in claimed:
            oid = claimed[r.id]
            results[r.id] = (Placed.of(orders[oid], replayed=False) if oid is not None
                             else Refused.of(errors.LockTimeout(details={"gave_up": True})))
    return [r for r in live if r.id not in claimed]


def _drop_replays(live: list[Request], results: dict[str, Result]) -> list[Request]:
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
            results[r.id] = (Placed.of(order, replayed=True) if order.request_digest == r.digest
                             else Refused.of(errors.IdempotencyConflict(details={"order_id": order.pk})))
        elif pair in seen:
            # Its twin in this batch is being placed right now; the client retries and replays it.
            results[r.id] = Refused.of(errors.Conflict(details={"idempotency_key": "in flight"}))
        seen.add(pair)
    return [r for r in live if r.id not in results]


def _coupon_claims(live: list[Request], results: dict[str, Result]) -> dict[str, CouponClaim]:
    """The unused claim each coupon request will use, rows locked (in id order: no deadlocks
    with other products' batches); a request without a usable claim is refused."""
    wanted = [r for r in live if r.code]
    if not wanted:
        return {}
    coupons = {c.code: c for c in Coupon.objects.filter(code__in={r.code for r in wanted})}
    usable = []
    for r in wanted:
        if (error := coupon_error(coupons.get(r.code), r.code)) is not None:
            results[r.id] = Refused.of(error)
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
            results[r.id] = Refused.of(errors.CouponNotClaimed(details={"coupon_code": r.code}))
        else:
            claims[r.id] = claim
    return claims
