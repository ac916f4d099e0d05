"""cancel_order: stock and coupon go back exactly once, even when called twice at once."""

from __future__ import annotations

from django.utils import timezone

from shop import errors
from shop.models import CouponClaim, Order, OrderLine, StockLedger
from shop.services.inventory import return_stock, unmark_sold_out
from shop.services.locking import check_before_commit, held, product_lock, refuse_outer_transaction, with_retries
from shop.services.transactions import connection_errors, durable_transaction


@connection_errors()
def cancel_order(*, order: Order, actor) -> Order:
    """Cancel a placed order. The status flip placed -> cancelled is the guard: one winner."""
    refuse_outer_transaction("cancel_order")
    lines = list(
        OrderLine.objects.filter(order_id=order.pk).order_by("product_id").values_list("product_id", "quantity")
    )
    if not lines or not Order.objects.filter(pk=order.pk, status=Order.Status.PLACED).exists():
        raise errors.OrderNotCancellable(details={"order_id": order.pk})

    def attempt() -> None:
        names = [product_lock(pid) for pid, _ in lines]
        with held(names) as holds:
            unmark_sold_out([pid for pid, _ in lines], holds)
            with durable_transaction():
                flipped = Order.objects.filter(pk=order.pk, status=Order.Status.PLACED).update(
                    status=Order.Status.CANCELLED, cancelled_at=timezone.now())
                if not flipped:
                    raise errors.OrderNotCancellable(details={"order_id": order.pk})
                for pid, qty in lines:
                    return_stock(product_id=pid, quantity=qty, hold=holds[product_lock(pid)],
                                 reason=StockLedger.Reason.CANCEL, order=order, actor=str(actor))
                # The coupon comes back to its owner, usable again. `remaining` counts claims,
                # not uses, so it does not change.
                CouponClaim.objects.filter(order_id=order.pk).update(used_at=None, order=None)
                check_before_commit(holds)

    with_retries(attempt, what="cancel_order")
    order.refresh_from_db()
    return order
