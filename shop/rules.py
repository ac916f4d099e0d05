"""The shop's small rules that the checkout writer and the services share: whether a coupon may be
used now, how much it takes off, when an order placed now must be paid, why a product cannot be
sold now (hidden, its drop not open yet or over)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import ENDED, UPCOMING, Coupon, Order, drop_state


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


def pay_by_from(now: datetime | None = None) -> datetime:
    """The payment deadline of an order placed now (SHOP["PAYMENT_WINDOW"] seconds)."""
    return (now or timezone.now()) + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))


def operator_action(status: str) -> str | None:
    """What an operator may do to an order in this status: "cancel" an unpaid one (its stock and
    coupon go back), "refund" a paid one (the payment goes back too), or nothing. The admin's buttons
    and `manage.py shop` ask the same question."""
    return {Order.Status.PENDING_PAYMENT: "cancel", Order.Status.PLACED: "cancel",
            Order.Status.PAID: "refund"}.get(status)


def shop_time(when: datetime) -> str:
    """A time as the shop states it without JavaScript: "2026-12-01 10:00 UTC", in the shop's
    time zone (settings.TIME_ZONE)."""
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M %Z")


def not_on_sale(product_ids: list[int], rows: dict[int, dict], now: datetime) -> errors.ShopError:
    """Why the lines of `product_ids` (none on sale now) cannot be sold, from their product rows
    (`rows` by id; a missing one is no product). The first reason that applies to any line:
    missing or hidden (`unknown_product` / `inactive_product`, naming those lines), its drop not
    open yet (`not_open_yet`, with when the last of them opens), its sale over (`sale_ended`)."""
    gone = [pid for pid in product_ids if pid not in rows or not rows[pid]["active"]]
    if gone:
        hidden = any(pid in rows for pid in gone)
        return (errors.InactiveProduct if hidden else errors.UnknownProduct)(details={"product_ids": gone})
    states = {pid: drop_state(rows[pid]["opens_at"], rows[pid]["closes_at"], now) for pid in product_ids}
    if upcoming := [pid for pid in product_ids if states[pid] == UPCOMING]:
        opens = max(rows[pid]["opens_at"] for pid in upcoming)
        return errors.NotOpenYet(f"Not on sale yet: opens {shop_time(opens)}.",
                                 details={"product_ids": upcoming, "opens_at": opens.isoformat()})
    ended = [pid for pid in product_ids if states[pid] == ENDED]
    closed = min(rows[pid]["closes_at"] for pid in ended)
    return errors.SaleEnded(f"This sale ended {shop_time(closed)}.",
                            details={"product_ids": ended, "closes_at": closed.isoformat()})
