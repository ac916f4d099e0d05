"""CSV exports for operators (the admin's "Export CSV" and "Export lines CSV" on the orders list).

Rows are produced one at a time from `shop.reads.selectors.orders_in_chunks` and written through
`csv.writer` into a streaming response, so an export of any size holds one chunk in memory.
Every cell that a spreadsheet would run as a formula (a buyer may sign up as "=HYPERLINK(...)")
is prefixed with a quote, as OWASP's CSV-injection advice says.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from shop.models import Order
from shop.money import line_shares

ORDER_COLUMNS = ("order", "created_at", "status", "buyer", "subtotal", "discount", "total", "coupon",
                 "pay_by", "paid_at", "refunded_at", "cancelled_at", "items")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    """A file-like object whose write() returns the line: csv.writer then hands each row back."""

    def write(self, value: str) -> str:
        return value


def cell(value: Any) -> str:
    """A CSV cell: datetimes in ISO 8601 (UTC as stored), None empty, formulas defused."""
    if value is None:
        return ""
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def order_row(order: Order) -> list[str]:
    items = "; ".join(f"{line.quantity} x {line.product.sku} @ {line.unit_price}" for line in order.lines.all())
    values = (order.pk, order.created_at, order.status, order.user.get_username(), order.subtotal, order.discount,
              order.total, order.coupon.code if order.coupon else None, order.pay_by, order.paid_at,
              order.refunded_at, order.cancelled_at, items)
    return [cell(v) for v in values]


LINE_COLUMNS = ("order", "created_at", "status", "buyer", "coupon", "paid_at", "refunded_at", "product_id", "sku",
                "product", "quantity", "unit_price", "amount", "paid")


def line_rows(order: Order, *, product_id: int | None = None) -> Iterator[list[str]]:
    """One row per line of `order` (only `product_id`'s, if given): the product, quantity and list
    `amount`, and `paid`, the line's share of what the order paid (its coupon spread over its
    lines by `shop.money.line_shares`, as the Sales view's net revenue), empty when the order
    was not paid. The books of one product, or one drop, add up from these."""
    lines = sorted(order.lines.all(), key=lambda line: line.product_id)
    amounts = [round(line.quantity * line.unit_price * 100) for line in lines]
    shares = line_shares(total_cents=round(order.total * 100), amounts_cents=amounts) if order.paid_at else None
    for i, line in enumerate(lines):
        if product_id is not None and line.product_id != product_id:
            continue
        paid = Decimal(shares[i]) / 100 if shares is not None else None
        values = (order.pk, order.created_at, order.status, order.user.get_username(),
                  order.coupon.code if order.coupon else None, order.paid_at, order.refunded_at, line.product_id,
                  line.product.sku, line.product.name, line.quantity, line.unit_price,
                  Decimal(amounts[i]) / 100, paid)
        yield [cell(v) for v in values]


def line_csv(orders: Iterable[Order], *, product_id: int | None = None) -> Iterator[str]:
    """The header, then one CSV line per order line (of `product_id` only, if given)."""
    writer = csv.writer(_Echo())
    yield writer.writerow(LINE_COLUMNS)
    for order in orders:
        for row in line_rows(order, product_id=product_id):
            yield writer.writerow(row)


def order_csv(orders: Iterable[Order]) -> Iterator[str]:
    """The header, then one CSV line per order (lines joined in `items`: "2 x SKU @ 10.00; ...")."""
    writer = csv.writer(_Echo())
    yield writer.writerow(ORDER_COLUMNS)
    for order in orders:
        yield writer.writerow(order_row(order))
