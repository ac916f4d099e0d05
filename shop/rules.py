"""The shop's small rules that the checkout writer, the services and the reads share: whether a
coupon may be used now, how much it takes off, when an order placed now must be paid, why a product
cannot be sold now (hidden, its drop not open yet or over), which way an operator's stock
adjustment may go, and how an order's payment splits over its lines."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import ENDED, UPCOMING, Coupon, Order, StockLedger, drop_state


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


def shop_time(when: datetime) -> str:
    """A time as the shop states it without JavaScript: "2026-12-01 10:00 UTC", in the shop's
    time zone (settings.TIME_ZONE)."""
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M %Z")


def opens_message(opens_at: datetime) -> str:
    """What a shopper is told of a drop not open yet (the cart's flag and the checkout's refusal)."""
    return f"Not on sale yet: opens {shop_time(opens_at)}."


CALLED_OFF = "This drop was called off before it opened."


def out_of_stock_message(lines: list[dict], names: dict[int, str] | None = None) -> str:
    """The one wording of a stock refusal, the product by its name as the cap's refusal says it:
    "Sneaker: only 2 left; Cap: sold out." (`lines` as OutOfStock's details; a line whose name
    is not known is said without one)."""
    names = names or {}
    parts = []
    for line in lines:
        left = line["available"]
        what = "sold out" if left == 0 else f"only {left} left"
        name = names.get(line["product_id"])
        parts.append(f"{name}: {what}" if name else what)
    text = "; ".join(parts) or "sold out"
    return f"{text[0].upper()}{text[1:]}."


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
        return errors.NotOpenYet(opens_message(opens),
                                 details={"product_ids": upcoming, "opens_at": opens.isoformat()})
    ended = [pid for pid in product_ids if states[pid] == ENDED]
    closed = min(rows[pid]["closes_at"] for pid in ended)
    # An empty window is a drop called off before it opened (`end_drop`): it never was on sale.
    called_off = all(rows[pid]["opens_at"] == rows[pid]["closes_at"] for pid in ended)
    return errors.SaleEnded(CALLED_OFF if called_off else f"This sale ended {shop_time(closed)}.",
                            details={"product_ids": ended, "closes_at": closed.isoformat()})


# --- stock adjustments ---------------------------------------------------------------------------
# The reasons an operator gives for moving stock (Shopify's and Saleor's kinds, a few), and which
# way each may move it: +1 only adds (units received), -1 only removes, 0 either way (a count that
# found more or fewer units than the stock says).
ADJUSTMENT_REASONS: dict[str, int] = {
    StockLedger.Reason.RESTOCK: +1,
    StockLedger.Reason.CORRECTION: 0,
    StockLedger.Reason.DAMAGED: -1,
    StockLedger.Reason.LOST: -1,
    StockLedger.Reason.PROMOTION: -1,
}
MAX_NOTE_LENGTH = StockLedger._meta.get_field("note").max_length


def adjustment_reasons(delta: int | None = None) -> list[str]:
    """The reasons that may move stock by `delta` (by its sign; None: every reason), in the order offered."""
    return [str(reason) for reason, way in ADJUSTMENT_REASONS.items()
            if delta is None or way == 0 or (way > 0) == (delta > 0)]


def check_adjustment(*, delta: object, reason: object, note: object) -> tuple[int, str, str]:
    """An operator's adjustment, checked before any lock or query: a whole number of units, not 0,
    at most SHOP["MAX_RESTOCK"] either way; a reason that goes that way; a note of at most
    MAX_NOTE_LENGTH characters. Returns (delta, reason, note stripped)."""
    maximum = int(shop_settings.MAX_RESTOCK)
    if not isinstance(delta, int) or isinstance(delta, bool) or abs(delta) > maximum:
        raise errors.AdjustmentOutOfRange(
            f"An adjustment is a whole number of units from -{maximum} to {maximum} (not 0).",
            details={"delta": str(delta), "maximum": maximum})
    if delta == 0:
        raise errors.ZeroAdjustment(details={"delta": 0})
    allowed = adjustment_reasons(delta)
    if reason not in allowed:
        known = reason in ADJUSTMENT_REASONS
        why = (f"{StockLedger.Reason(reason).label!r} cannot {'add' if delta > 0 else 'remove'} units"
               if known else f"Unknown reason {str(reason)[:40]!r}")
        raise errors.InvalidAdjustmentReason(f"{why}: give one of {', '.join(allowed)}.",
                                             details={"reason": str(reason)[:40], "allowed": allowed})
    if not isinstance(note, str) or len(note.strip()) > MAX_NOTE_LENGTH:
        raise errors.InvalidInput(f"A note is at most {MAX_NOTE_LENGTH} characters.",
                                  details={"note": f"at most {MAX_NOTE_LENGTH} characters"})
    return delta, str(reason), note.strip()


# --- what buyers paid, line by line --------------------------------------------------------------
def line_shares(*, total_cents: int, amounts_cents: list[int]) -> list[int]:
    """What each line of an order paid, in cents, when the order paid `total_cents` for lines of
    these list amounts (quantity x unit price, in the order's line order: by product id).

    The order's discount is spread over its lines in proportion to their amounts, in whole cents,
    rounding the running total rather than each line ("cumulative rounding"): line i gets
    round(A_i x T / S) - round(A_(i-1) x T / S), where A_i is the sum of the amounts of lines 1..i,
    S the sum of them all (the order's subtotal) and round() rounds half up. So each line is
    within a cent of its exact share, and the lines add up to exactly what the order paid.
    `shop.reads.selectors.product_sales` computes the same in SQL (the Sales view's net revenue).
    """
    subtotal = sum(amounts_cents)
    if subtotal == 0:
        return [0] * len(amounts_cents)

    def rounded(running: int) -> int:  # round half up of running x total / subtotal, in integers
        return (2 * running * total_cents + subtotal) // (2 * subtotal)

    shares, running = [], 0
    for amount in amounts_cents:
        shares.append(rounded(running + amount) - rounded(running))
        running += amount
    return shares
