"""What a buyer is shown of an order: its receipt, as the API and the pages render it.

`place_order` returns one: built from the writer's result when it placed the order (no query),
read from the database when the order was placed before (a replay of its Idempotency-Key).
Rendering never reaches into a model the writer did not load.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from shop.models import Order


@dataclass(frozen=True)
class ReceiptLine:
    product_id: int
    sku: str
    name: str
    quantity: int
    unit_price: Decimal


@dataclass(frozen=True)
class Receipt:
    order_id: int
    status: str
    subtotal: Decimal
    discount: Decimal
    total: Decimal
    coupon_code: str | None
    idempotency_key: str | None
    created_at: datetime
    pay_by: datetime | None
    paid_at: datetime | None
    lines: tuple[ReceiptLine, ...]
    replayed: bool = False  # the order an earlier request with the same key placed (HTTP 200, not 201)

    @classmethod
    def of_order(cls, order: Order, *, replayed: bool = False) -> Receipt:
        """From a saved order (its coupon, lines and their products loaded: selectors.order_complete)."""
        return cls(order_id=order.pk, status=order.status, subtotal=order.subtotal, discount=order.discount,
                   total=order.total, coupon_code=order.coupon.code if order.coupon_id else None,
                   idempotency_key=order.idempotency_key, created_at=order.created_at, pay_by=order.pay_by,
                   paid_at=order.paid_at, replayed=replayed,
                   lines=tuple(ReceiptLine(product_id=line.product_id, sku=line.product.sku, name=line.product.name,
                                           quantity=line.quantity, unit_price=line.unit_price)
                               for line in order.lines.all()))
