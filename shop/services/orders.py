"""An order's life after checkout: pay it, cancel it, or let it expire unpaid.

Cancelling and expiring give the stock and the coupon back exactly once, even when called twice
at once or racing a payment: the status flip (a conditional UPDATE) inside the transaction that
returns the stock is the guard, so exactly one of pay / cancel / expire wins an unpaid order.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import RESERVING_STATUSES, CouponClaim, Order, OrderLine, StockLedger
from shop.services.emails import confirm_payment_on_commit
from shop.services.inventory import return_stock, unmark_sold_out
from shop.services.locking import check_before_commit, held, product_lock, refuse_outer_transaction, with_retries
from shop.services.transactions import connection_errors, durable_transaction

log = logging.getLogger("shop")


def pay_by_from(now: datetime | None = None) -> datetime:
    """The payment deadline of an order placed now (SHOP["PAYMENT_WINDOW"] seconds)."""
    return (now or timezone.now()) + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))


def _release(*, order: Order, actor, allowed: tuple[str, ...], to: str, reason: str,
             due_before: datetime | None = None) -> None:
    """Flip the order from one of `allowed` to `to` and return its stock and coupon, once.

    Same locks as checkout (the products', sorted), one durable transaction; the flip is the
    guard: a loser (a twin call, a payment that came first) raises OrderNotCancellable with
    nothing written. `due_before`: only if pay_by is before it (expiry).
    """
    lines = list(
        OrderLine.objects.filter(order_id=order.pk).order_by("product_id").values_list("product_id", "quantity")
    )
    guard = Order.objects.filter(pk=order.pk, status__in=allowed)
    if due_before is not None:
        guard = guard.filter(pay_by__lte=due_before)
    if not lines or not guard.exists():
        raise errors.OrderNotCancellable(details={"order_id": order.pk})

    def attempt() -> None:
        names = [product_lock(pid) for pid, _ in lines]
        with held(names) as holds:
            unmark_sold_out([pid for pid, _ in lines], holds)
            with durable_transaction():
                if not guard.update(status=to, cancelled_at=timezone.now()):
                    raise errors.OrderNotCancellable(details={"order_id": order.pk})
                for pid, qty in lines:
                    return_stock(product_id=pid, quantity=qty, hold=holds[product_lock(pid)],
                                 reason=reason, order=order, actor=str(actor))
                # The coupon comes back to its owner, usable again. `remaining` counts claims,
                # not uses, so it does not change.
                CouponClaim.objects.filter(order_id=order.pk).update(used_at=None, order=None)
                check_before_commit(holds)

    with_retries(attempt, what=f"{to} order")


@connection_errors()
def cancel_order(*, order: Order, actor, unpaid_only: bool = False) -> Order:
    """Cancel an order that holds stock (staff: any; `unpaid_only`: the buyer's own, unpaid)."""
    refuse_outer_transaction("cancel_order")
    allowed = (Order.Status.PENDING_PAYMENT,) if unpaid_only else RESERVING_STATUSES
    _release(order=order, actor=actor, allowed=allowed, to=Order.Status.CANCELLED,
             reason=StockLedger.Reason.CANCEL)
    order.refresh_from_db()
    return order


@connection_errors()
def pay_order(*, order: Order, actor) -> Order:
    """Record a payment (the simulated provider always accepts). pending_payment -> paid with a
    guarded UPDATE (still pending AND pay_by > now), so a payment never lands on an order that
    expired or was cancelled, even one racing the expirer. Paying a paid order again is a no-op
    that returns it (a client retrying after a timeout must not be told it failed). The buyer's
    confirmation mail leaves after the commit; a mail failure never fails the payment."""
    refuse_outer_transaction("pay_order")
    now = timezone.now()
    paid = Order.objects.filter(pk=order.pk, status=Order.Status.PENDING_PAYMENT, pay_by__gt=now).update(
        status=Order.Status.PAID, paid_at=now)
    order.refresh_from_db()
    if not paid and order.status != Order.Status.PAID:
        raise errors.OrderNotPayable(details={"order_id": order.pk, "status": order.status})
    if paid:  # this call paid it (a retry of a paid order mails nothing)
        confirm_payment_on_commit(order_id=order.pk)
    log.info("order %s paid by %s", order.pk, actor)
    return order


@connection_errors()
def expire_unpaid(*, now: datetime | None = None, limit: int = 500, check=None) -> int:
    """Expire up to `limit` unpaid orders past their pay_by; returns how many expired.

    Each one goes back exactly like a cancellation (ledger reason `expire`). An order paid or
    cancelled meanwhile loses nothing: its flip fails and it is skipped. `check`: called before
    each order (a job passes ctx.check, so a runner that lost its lease stops).
    """
    refuse_outer_transaction("expire_unpaid")
    now = now or timezone.now()
    due = list(Order.objects.filter(status=Order.Status.PENDING_PAYMENT, pay_by__lte=now)
               .order_by("pay_by", "pk").values_list("pk", flat=True)[:limit])
    expired = 0
    for pk in due:
        if check is not None:
            check()
        try:
            _release(order=Order(pk=pk), actor="job:shop.expire_unpaid", allowed=(Order.Status.PENDING_PAYMENT,),
                     to=Order.Status.EXPIRED, reason=StockLedger.Reason.EXPIRE, due_before=now)
        except errors.OrderNotCancellable:
            continue  # paid or cancelled since we listed it
        expired += 1
    return expired
