"""The invariants of docs/design.md, checked against the database (and Redis for I6).

Used by the tests after every concurrency run and by `manage.py loadtest` after every load test.
Each violation is one sentence a person can act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db.models import Count, Q, Sum

from locks import inspect as lock_inspect
from shop.models import RESERVING_STATUSES, Coupon, CouponClaim, Order, OrderLine, Product, Refund, StockLedger


def check_invariants(
    *,
    product_ids: Iterable[int],
    initial_stock: Mapping[int, int],
    coupon_ids: Iterable[int] = (),
    seen_order_ids: Iterable[int] | None = None,
    check_locks: bool = True,
) -> list[str]:
    """I1-I6 for these products/coupons. `initial_stock`: stock before the run; what operators
    moved since (restocks and adjustments, signed) is read from the ledger. A product with an
    opening row (shop.services.inventory.open_stock) must also have rows that sum to its stock. `seen_order_ids`: the
    orders the clients were told succeeded (I5).
    """
    product_ids = list(product_ids)
    violations: list[str] = []
    stock = dict(Product.objects.filter(pk__in=product_ids).values_list("pk", "stock"))
    sold = dict(
        OrderLine.objects.filter(product_id__in=product_ids, order__status__in=RESERVING_STATUSES)
        .values("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n")
    )
    # Movements only: the opening row is the stock a product started with, not a movement.
    ledger = dict(
        StockLedger.objects.filter(product_id__in=product_ids).exclude(reason=StockLedger.Reason.OPENING)
        .values("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n")
    )
    opening = dict(
        StockLedger.objects.filter(product_id__in=product_ids, reason=StockLedger.Reason.OPENING)
        .values("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n")
    )
    refills = dict(
        StockLedger.objects.filter(product_id__in=product_ids, reason__in=StockLedger.OPERATOR_REASONS)
        .values("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n")
    )
    for pid in product_ids:
        current, start = stock.get(pid), initial_stock[pid]
        if current is None:
            violations.append(f"I2: product {pid} is missing")
            continue
        if current < 0:
            violations.append(f"I1: product {pid} has negative stock {current}")
        taken = start + (refills.get(pid) or 0) - current
        units = sold.get(pid) or 0
        moved = -(ledger.get(pid) or 0) + (refills.get(pid) or 0)
        if taken != units:
            violations.append(
                f"I2: product {pid}: stock fell by {taken} but reserving orders hold {units} units"
                + (f" (OVERSOLD by {units - taken})" if units > taken else "")
            )
        if moved != units:
            violations.append(f"I2: product {pid}: the ledger records {moved} units out, orders hold {units}")
        if pid in opening and opening[pid] + (ledger.get(pid) or 0) != current:
            violations.append(f"I2: product {pid}: its ledger rows sum to {opening[pid] + (ledger.get(pid) or 0)}, "
                              f"its stock is {current}")
        if units > start + (refills.get(pid) or 0):
            violations.append(f"I1: product {pid}: sold {units} units of {start + (refills.get(pid) or 0)}")

    for coupon in Coupon.objects.filter(pk__in=list(coupon_ids)):
        claims = CouponClaim.objects.filter(coupon=coupon).count()
        if coupon.remaining < 0:
            violations.append(f"I1: coupon {coupon.code} has negative remaining {coupon.remaining}")
        if claims > coupon.total:
            violations.append(f"I3: coupon {coupon.code} has {claims} claims for a total of {coupon.total}")
        if coupon.total - coupon.remaining != claims:
            violations.append(f"I3: coupon {coupon.code}: remaining {coupon.remaining} of {coupon.total} "
                              f"but {claims} claims")
        doubles = (CouponClaim.objects.filter(coupon=coupon).values("user_id").annotate(n=Count("id"))
                   .filter(n__gt=1).count())
        if doubles:
            violations.append(f"I3: coupon {coupon.code}: {doubles} users hold more than one claim")
        reused = Order.objects.filter(coupon=coupon, status__in=RESERVING_STATUSES).values("user_id").annotate(
            n=Count("id")).filter(n__gt=1).count()
        if reused:
            violations.append(f"I3: coupon {coupon.code}: {reused} users used one claim on several orders")

    orders = Order.objects.filter(lines__product_id__in=product_ids).distinct()
    dup_keys = (orders.exclude(idempotency_key=None).values("user_id", "idempotency_key").annotate(n=Count("id"))
                .filter(n__gt=1).count())
    if dup_keys:
        violations.append(f"I4: {dup_keys} idempotency keys produced more than one order")

    if seen_order_ids is not None:
        seen = set(seen_order_ids)
        # Committed whatever became of it since (paid, cancelled, expired).
        committed = set(orders.values_list("pk", flat=True))
        if seen - committed:
            violations.append(f"I5: {len(seen - committed)} successes the clients saw have no committed order")
        if committed - seen:
            violations.append(f"I5: {len(committed - seen)} committed orders were never reported as successes")

    violations.extend(release_violations(product_ids))

    if check_locks:
        violations.extend(lock_violations([f"product:{pid}" for pid in product_ids]
                                          + [f"coupon:{cid}" for cid in coupon_ids]))
    return violations


# Orders that gave their stock back, and the ledger reason each wrote when it did.
REASON_OF = {Order.Status.CANCELLED: StockLedger.Reason.CANCEL, Order.Status.EXPIRED: StockLedger.Reason.EXPIRE,
             Order.Status.REFUNDED: StockLedger.Reason.REFUND}
RELEASED = tuple(REASON_OF)
RETURN_REASONS = tuple(REASON_OF.values())


def release_violations(product_ids: Iterable[int]) -> list[str]:
    """Payment lifecycle: every cancelled, expired or refunded order gave back
    exactly what it reserved, once, for its own reason, and nothing else did; no order is both
    paid and expired (the database checks that a refunded order was paid)."""
    product_ids = list(product_ids)
    out = []
    reserved = {(oid, pid): n for oid, pid, n in OrderLine.objects.filter(
        product_id__in=product_ids, order__status__in=RELEASED).values_list("order_id", "product_id", "quantity")}
    returned = {(oid, pid): n for oid, pid, n in StockLedger.objects.filter(
        product_id__in=product_ids, reason__in=RETURN_REASONS).values("order_id", "product_id")
        .annotate(n=Sum("quantity")).values_list("order_id", "product_id", "n")}
    wrong = sorted(k for k in reserved.keys() | returned.keys() if reserved.get(k) != returned.get(k))
    if wrong:
        shown = ", ".join(f"order {o} product {p}: reserved {reserved.get((o, p), 0)}, "
                          f"returned {returned.get((o, p), 0)}" for o, p in wrong[:3])
        out.append(f"returns: {len(wrong)} cancelled/expired/refunded order lines gave back other than they "
                   f"reserved ({shown})")
    orders = Order.objects.filter(lines__product_id__in=product_ids).distinct()
    mismatched = sum(
        StockLedger.objects.filter(product_id__in=product_ids, order__status=status)
        .exclude(reason__in=[StockLedger.Reason.ORDER, reason]).count()
        for status, reason in REASON_OF.items()
    )
    if mismatched:
        out.append(f"returns: {mismatched} ledger rows give stock back for the wrong reason")
    paid_and_expired = orders.filter(paid_at__isnull=False).exclude(
        status__in=[Order.Status.PAID, Order.Status.REFUNDED, Order.Status.CANCELLED]).count()
    if paid_and_expired:
        out.append(f"payments: {paid_and_expired} orders carry a payment but are neither paid, refunded nor "
                   "cancelled (expired?)")
    unpaid_returns = StockLedger.objects.filter(product_id__in=product_ids, reason__in=RETURN_REASONS,
                                                order__status__in=RESERVING_STATUSES).count()
    if unpaid_returns:
        out.append(f"returns: {unpaid_returns} ledger rows gave back stock of an order that still holds it")
    # A refund's record and its order's books commit together: completed <-> refunded.
    torn = Refund.objects.filter(order_id__in=orders.values("pk")).exclude(
        Q(status=Refund.Status.COMPLETED, order__status=Order.Status.REFUNDED)
        | Q(status__in=Refund.UNFINISHED, order__status=Order.Status.PAID)).count()
    if torn:
        out.append(f"refunds: {torn} refund records disagree with their order (completed but not refunded, "
                   "or refunded with the refund unfinished)")
    return out


def lock_violations(names: Iterable[str]) -> list[str]:
    """I6: no lock key without a TTL, and none still held, for these lock names (the lock
    library knows its keys: `locks.inspect.leftovers`)."""
    return [f"I6: {problem}" for problem in lock_inspect.leftovers(list(names))]
