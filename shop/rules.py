"""The shop's small rules that the checkout writer and the services share: whether a coupon may be
used now, how much it takes off, when an order placed now must be paid."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import Coupon, Order


def coupon_error(coupon: Coupon | None, code: str) -> errors.ShopError | None:
    """Why `coupon` (looked up by `code`) cannot be used now, or None if it can."""
    if coupon is None:
        return errors.CouponUnknown(details={"coupon_code": code})
    now = timezone.now()
    if not coupon.active or (coupon.valid_from and now < coupon.valid_from) or (
        coupon.valid_until and now >= coupon.valid_until
    ):
        return errors.CouponExpired(details={"coupon_code": code})
    return None


def discount(subtotal: Decimal, coupon_discount: Decimal | None) -> Decimal:
    """What a coupon takes off an order: its discount, never more than the order's subtotal."""
    return Decimal("0.00") if coupon_discount is None else min(coupon_discount, subtotal)


def unused_discount(subtotal: Decimal, coupon_discount: Decimal | None) -> Decimal:
    """What a coupon worth more than the order leaves unused: lost, since a claim is used once
    (the buyer is told before placing the order, and on the order)."""
    return Decimal("0.00") if coupon_discount is None else coupon_discount - discount(subtotal, coupon_discount)


def pay_by_from(now: datetime | None = None) -> datetime:
    """The payment deadline of an order placed now (SHOP["PAYMENT_WINDOW"] seconds)."""
    return (now or timezone.now()) + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))


def operator_action(status: str) -> str | None:
    """What an operator may do to an order in this status: "cancel" an unpaid one (its stock and
    coupon go back), "refund" a paid one (the payment goes back too), or nothing. The admin's buttons
    and `manage.py shop` ask the same question."""
    return {Order.Status.PENDING_PAYMENT: "cancel", Order.Status.PLACED: "cancel",
            Order.Status.PAID: "refund"}.get(status)
