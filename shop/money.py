"""Money: what a coupon takes off an order, what it leaves unused, and how an order's payment
splits over its lines. (Shown as money by `shop_tags.money`.)"""

from __future__ import annotations

from decimal import Decimal


def discount(subtotal: Decimal, coupon_discount: Decimal | None) -> Decimal:
    """What a coupon takes off an order: its discount, never more than the order's subtotal."""
    return Decimal("0.00") if coupon_discount is None else min(coupon_discount, subtotal)


def unused_discount(subtotal: Decimal, coupon_discount: Decimal | None) -> Decimal:
    """What a coupon worth more than the order leaves unused: lost, since a claim is used once
    (the buyer is told before placing the order, and on the order)."""
    return Decimal("0.00") if coupon_discount is None else coupon_discount - discount(subtotal, coupon_discount)


def line_shares(*, total_cents: int, amounts_cents: list[int]) -> list[int]:
    """What each line of an order paid, in cents, when the order paid `total_cents` for lines of
    these list amounts (quantity x unit price, in the order's line order: by product id).

    The order's discount is spread over its lines in proportion to their amounts, in whole cents,
    rounding the running total rather than each line ("cumulative rounding"): line i gets
    round(A_i x T / S) - round(A_(i-1) x T / S), where A_i is the sum of the amounts of lines 1..i,
    S the sum of them all (the order's subtotal) and round() rounds half up. So each line is
    within a cent of its exact share, and the lines add up to exactly what the order paid.
    `shop.selectors.product_sales` computes the same in SQL (the Sales view's net revenue).
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
