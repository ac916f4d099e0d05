"""The one checkout writer: commits a batch of order requests under their products' held locks,
in one durable transaction (docs/design.md, "The path of one checkout", says the order of its
steps). Its parts: who gets an order (allocation.py, pure), the hand-written SQL (sql.py),
requests already served (replays.py); the retry policy is shop/plumbing/retries.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime

from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

import locks
from shop import errors, money
from shop import line as lines_of_drops
from shop.checkout import allocation, purchase_limits, replays, sql
from shop.checkout.protocol import AGAIN, Placed, Refused, Request, Result
from shop.models import CheckoutRequest, Coupon, CouponClaim, Order, OrderLine, Product, StockLedger
from shop.ops import metrics
from shop.plumbing import clock, hooks, idempotency, soldout
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import StaleFence, check_before_commit
from shop.plumbing.retries import DEADLOCKS, noticed, reason
from shop.plumbing.transactions import durable_transaction
from shop.reads.receipts import ReceiptLine as Line

log = logging.getLogger("shop")

# A request whose buyer gives up sooner than this is not taken into a batch (it could not be told),
# and none with less than COMMIT_MARGIN left is committed (the COMMIT and the reply take that).
DEADLINE_MARGIN = 0.05
COMMIT_MARGIN = 0.02


Holds = dict[int, "locks.Hold | None"]  # product id -> its hold (None: locks are off)


def write(requests: list[Request], *, holds: Holds) -> dict[str, Result]:
    """Commit `requests` (FIFO) for the products of `holds`, whose locks the caller holds.

    One result per request id. Deadlocks and lock-wait timeouts are retried here (under the same
    locks, `retries.DEADLOCKS`); a stale fence or a lost lock answers every request not yet
    answered `AGAIN`.

    A batch written again because of one request's own trouble (its deadline passed, its rows hit
    a unique key) uses none of the retries: one request costs only itself (I9). Each such pass
    drops a request or switches to `isolate`, so there are at most as many as requests, plus one.
    """
    results: dict[str, Result] = {}
    pending = list(requests)
    isolate = False
    tries = DEADLOCKS.budget()
    while tries.left:
        try:
            done, left = _commit(pending, holds=holds, isolate=isolate)
        except IntegrityError:
            # A request's rows hit a unique or foreign key (its key placed an order meanwhile, its
            # buyer gave up, its account is gone): write again, each request on its own (I9).
            if isolate:  # isolated, no request's rows fail the batch: this one is the batch's own
                tries.spend(pause=False)
            isolate = True
            continue
        except OperationalError as exc:
            if not DEADLOCKS.retryable(exc):
                raise
            noticed(exc, what="place_order")  # a holder paused past its lease may keep the row
            log.info("checkout: retry %d after %s", tries.used + 1, reason(exc))
            tries.spend()
            continue
        except (StaleFence, locks.LockLost) as exc:
            noticed(exc, what="place_order")
            return {**results, **{r.id: AGAIN for r in pending}}
        except _Closed:
            tries.spend(pause=False)
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
        replays.explain_refusals(pending, done)
        for pid, stock in left.items():
            if stock == 0:
                soldout.mark_under(pid, holds.get(pid))
        lines_of_drops.stock_left(left)  # a drop's line lets through no more buyers than units are left
        return {**results, **done}
    conflict = Refused.of(errors.Conflict(details={"retries": tries.retries}))
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
        # the drop windows are compared with it and the orders stamped with it (shop/clock.py).
        rows, at = sql.lock_rows(sorted(holds))
        if isolate:  # the rare second pass: answer settled ids and known keys before allocating
            live = replays.drop_settled(live, results)
            live = replays.drop_replays(live, results)
        for pid, hold in holds.items():
            if hold is not None and pid in rows and rows[pid]["fence"] >= hold.fence:
                raise StaleFence(hold.name)  # a newer holder wrote the row: our lock is gone
        live, refused = allocation.refuse_unsold(live, rows, at)
        results.update(refused)
        claims = _coupon_claims(live, results)
        live = [r for r in live if r.id not in results]
        stock = {pid: row["stock"] for pid, row in rows.items() if Product.row_on_sale(row, at)}  # the sellable ones
        placed, refused = _allocate(live, rows, stock)
        results.update(refused)
        if not placed:
            return results, stock
        written = _write_orders(placed, rows=rows, claims=claims, holds=holds, results=results, isolate=isolate,
                                at=at)
        if not written:  # every request was refused alone (isolate): nothing to take
            return results, stock
        totals = allocation.taken(r for r, _ in written)
        sql.take_stock(totals, {pid: hold.fence if hold is not None else None for pid, hold in holds.items()})
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


def _allocate(live: list[Request], rows: allocation.Rows,
              stock: dict[int, int]) -> tuple[list[Request], dict[str, Refused]]:
    """Count what these buyers hold (caps) and their unpaid orders, under the row locks: exact
    (purchase_limits.py); then allocate (allocation.allocate)."""
    users = {r.user_id for r in live}
    have = {pid: purchase_limits.bought(product_id=pid, user_ids=users)
            for pid in sorted(allocation.capped(live, rows))}
    max_unpaid = purchase_limits.max_unpaid()
    unpaid = purchase_limits.unpaid(user_ids=users) if max_unpaid is not None and live else {}
    return allocation.allocate(live, rows, stock, have=have, unpaid=unpaid, max_unpaid=max_unpaid)


def _closed_since(rows: dict[int, dict], totals: dict[int, int]) -> bool:
    """Whether a product written in this attempt closed its sale since the window check (a slow
    batch, a paused writer): then nothing of the attempt may commit. The database's clock without
    a round trip (`clock.now`): this runs just before COMMIT, for every batch."""
    closes = [rows[pid]["closes_at"] for pid in totals if rows[pid]["closes_at"] is not None]
    return bool(closes) and clock.now() >= min(closes)


def _write_orders(placed: list[Request], *, rows: dict[int, dict], claims: dict[str, CouponClaim], holds: Holds,
                  results: dict[str, Result], isolate: bool, at: datetime) -> list[tuple[Request, Placed]]:
    """INSERT the orders, lines, ledger rows and request ids of the allocated requests.

    All at once (multi-row INSERTs) unless `isolate`: after such a write failed on a unique or
    foreign key, each request is written in a savepoint of its own, so a request whose rows
    cannot be written is refused alone and the rest of the batch still commits (I9).
    """
    pay_by = Order.pay_by_from(at)  # the batch commits together: one deadline for all of it
    if not isolate:
        return _insert_orders(placed, rows=rows, claims=claims, holds=holds, pay_by=pay_by, now=at)
    written = []
    for r in placed:
        try:
            with transaction.atomic():  # a savepoint: this request's rows alone
                written += _insert_orders([r], rows=rows, claims=claims, holds=holds, pay_by=pay_by, now=at)
        except IntegrityError:
            replays.refuse_unwritable(r, results)
    return written


def _insert_orders(placed: list[Request], *, rows: dict[int, dict], claims: dict[str, CouponClaim], holds: Holds,
                   pay_by: datetime, now: datetime) -> list[tuple[Request, Placed]]:
    db_now = connection.ops.adapt_datetimefield_value(now)
    db_pay_by = connection.ops.adapt_datetimefield_value(pay_by)
    status = Order.Status.PENDING_PAYMENT.value
    out = []
    values = []
    for r in placed:
        subtotal = allocation.subtotal(r, rows)
        claim = claims.get(r.id)
        off = money.discount(subtotal, claim.coupon.discount if claim is not None else None)
        lines = tuple(Line(product_id=pid, sku=rows[pid]["sku"], name=rows[pid]["name"], quantity=qty,
                           unit_price=rows[pid]["price"]) for pid, qty in r.lines)
        out.append(Placed(order_id=0, subtotal=subtotal, discount=off, total=subtotal - off,
                          coupon_id=claim.coupon_id if claim is not None else None,
                          coupon_code=claim.coupon.code if claim is not None else None,
                          status=status, pay_by=pay_by, paid_at=None, created_at=now, lines=lines))
        values.append((r.id, r.user_id, status, subtotal, off, subtotal - off, out[-1].coupon_id, r.key,
                       r.digest, db_now, db_pay_by))
    ids = sql.insert_orders(values)
    pairs = [(r, replace(p, order_id=ids[r.id])) for r, p in zip(placed, out, strict=True)]
    sql.insert_rows(OrderLine, ("order", "product", "quantity", "unit_price"),
                    [(o.order_id, pid, qty, rows[pid]["price"]) for r, o in pairs for pid, qty in r.lines])
    sql.insert_rows(StockLedger, ("product", "quantity", "reason", "order", "fence", "actor", "created_at"),
                    [(pid, -qty, StockLedger.Reason.ORDER.value, o.order_id,
                      holds[pid].fence if holds.get(pid) is not None else None, f"user:{r.user_id}", db_now)
                     for r, o in pairs for pid, qty in r.lines])
    sql.insert_rows(CheckoutRequest, ("request_id", "order", "created_at"),
                    [(r.id, o.order_id, db_now) for r, o in pairs if r.recorded])
    return pairs


def _use_claims(written: list[tuple[Request, Placed]], claims: dict[str, CouponClaim]) -> None:
    used = []
    stamp = timezone.now()
    for r, o in written:
        if (claim := claims.get(r.id)) is not None:
            claim.used_at, claim.order_id = stamp, o.order_id
            used.append(claim)
    if used:
        CouponClaim.objects.bulk_update(used, ["used_at", "order"])


def _coupon_claims(live: list[Request], results: dict[str, Result]) -> dict[str, CouponClaim]:
    """The unused claim each coupon request will use, rows locked (in id order: no deadlocks
    with other products' batches); a request without a usable claim is refused."""
    wanted = [r for r in live if r.code]
    if not wanted:
        return {}
    coupons = {c.code: c for c in Coupon.objects.filter(code__in={r.code for r in wanted})}
    usable = []
    for r in wanted:
        if (error := Coupon.refusal(coupons.get(r.code), r.code)) is not None:
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
