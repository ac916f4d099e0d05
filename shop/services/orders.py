"""An order's life after checkout: pay it, cancel it, let it expire unpaid, or refund it once paid.

Cancelling, expiring and refunding give the stock and the coupon back exactly once, even when
called twice at once or racing a payment: the status flip (a conditional UPDATE) inside the
transaction that returns the stock is the guard, so exactly one of pay / cancel / expire wins an
unpaid order, and one refund a paid one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import CouponClaim, Order, OrderLine, StockLedger
from shop.services.emails import confirm_payment_on_commit
from shop.services.inventory import return_stock, unmark_sold_out
from shop.services.locking import check_before_commit, held, product_lock, refuse_outer_transaction
from shop.services.transactions import connection_errors, durable_transaction, with_retries

log = logging.getLogger("shop")


def pay_by_from(now: datetime | None = None) -> datetime:
    """The payment deadline of an order placed now (SHOP["PAYMENT_WINDOW"] seconds)."""
    return (now or timezone.now()) + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))


def _refusal(order_pk: int, refusal: type[errors.ShopError]) -> errors.ShopError:
    """The typed refusal, saying the state the order is in (an operator reads it in the admin)."""
    status = Order.objects.filter(pk=order_pk).values_list("status", flat=True).first()
    message = None
    if refusal is errors.OrderNotCancellable and status == Order.Status.PAID:
        message = "This order is paid: refund it instead (its money goes back too)."
    return refusal(message, details={"order_id": order_pk, "status": status})


def _release(*, order: Order, actor, allowed: tuple[str, ...], to: str, reason: str,
             due_before: datetime | None = None, stamp: str = "cancelled_at",
             refusal: type[errors.ShopError] = errors.OrderNotCancellable,
             after_flip: Callable[[], None] | None = None) -> None:
    """Flip the order from one of `allowed` to `to` and return its stock and coupon, once.

    Same locks as checkout (the products', sorted), one durable transaction; the flip is the
    guard: a loser (a twin call, a payment that came first) raises `refusal` with nothing
    written. `due_before`: only if pay_by is before it (expiry). `stamp`: the time field the
    flip sets (cancelled_at for cancel and expiry, refunded_at for a refund). `after_flip`: runs
    in the transaction once the flip won (the provider's refund).
    """
    lines = list(
        OrderLine.objects.filter(order_id=order.pk).order_by("product_id").values_list("product_id", "quantity")
    )
    guard = Order.objects.filter(pk=order.pk, status__in=allowed)
    if due_before is not None:
        guard = guard.filter(pay_by__lte=due_before)
    if not lines or not guard.exists():
        raise _refusal(order.pk, refusal)

    def attempt() -> None:
        names = [product_lock(pid) for pid, _ in lines]
        with held(names) as holds:
            unmark_sold_out([pid for pid, _ in lines], holds)
            with durable_transaction():
                if not guard.update(status=to, **{stamp: timezone.now()}):
                    raise _refusal(order.pk, refusal)
                if after_flip is not None:
                    after_flip()
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
    """Cancel an order that holds stock and was not paid (staff: also a legacy "placed" one;
    `unpaid_only`: the buyer's own, unpaid). A paid order is refunded (`refund_order`), never
    cancelled: cancelling would return the stock and keep the money."""
    refuse_outer_transaction("cancel_order")
    allowed = ((Order.Status.PENDING_PAYMENT,) if unpaid_only
               else (Order.Status.PENDING_PAYMENT, Order.Status.PLACED))
    _release(order=order, actor=actor, allowed=allowed, to=Order.Status.CANCELLED,
             reason=StockLedger.Reason.CANCEL)
    order.refresh_from_db()
    return order


def provider_refund(*, order_id: int) -> None:
    """The simulated payment provider's refund (it always succeeds, as its payment does). It
    runs inside the refund's transaction after the guarded flip, so a twin call never reaches
    it and a failure here (a real provider's) rolls the whole refund back."""
    log.info("provider: order %s refunded", order_id)


@connection_errors()
def refund_order(*, order: Order, actor) -> Order:
    """Refund a paid order (staff): paid -> refunded, the provider pays the money back, the stock
    returns under the product locks (ledger reason `refund`) and the coupon goes back to its
    owner, exactly as a cancellation gives them back. Only once: a second call, or one on an
    order that is not paid, raises OrderNotRefundable (409) with nothing written."""
    refuse_outer_transaction("refund_order")
    _release(order=order, actor=actor, allowed=(Order.Status.PAID,), to=Order.Status.REFUNDED,
             reason=StockLedger.Reason.REFUND, stamp="refunded_at", refusal=errors.OrderNotRefundable,
             after_flip=lambda: provider_refund(order_id=order.pk))
    order.refresh_from_db()
    log.info("order %s refunded by %s", order.pk, actor)
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
