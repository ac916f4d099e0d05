"""Steering a drop's line (shop/line/): pause or resume it, its pre-queue window and order.

The fields are the product's; every process reads them again within SHOP["LINE_REFRESH"]
seconds (this one at once). Places are kept whatever changes: a paused line lets nobody new
through, and resumes where it stood.
"""

from __future__ import annotations

from shop import errors, line
from shop.line import invariants
from shop.models import Product

ORDERS = ("shuffle", "fifo")
MAX_PREQUEUE = 7 * 24 * 3600


def steer_line(*, product: Product, paused: bool | None = None, prequeue_seconds: int | None = None,
               order: str | None = None) -> Product:
    """Change what is given (None: left as it is). Refused, nothing written, for a pre-queue
    window outside 0..a week or an order other than shuffle or fifo."""
    changes: dict[str, object] = {}
    if paused is not None:
        changes["line_paused"] = bool(paused)
    if prequeue_seconds is not None:
        if not isinstance(prequeue_seconds, int) or not 0 <= prequeue_seconds <= MAX_PREQUEUE:
            raise errors.InvalidInput(f"The pre-queue window is 0 to {MAX_PREQUEUE} seconds.",
                                      details={"prequeue_seconds": prequeue_seconds})
        changes["line_prequeue_seconds"] = prequeue_seconds
    if order is not None:
        if order not in ORDERS:
            raise errors.InvalidInput("The pre-queue order is shuffle or fifo.", details={"order": order})
        changes["line_order"] = order
    if changes:
        Product.objects.filter(pk=product.pk).update(**changes)
        line.forget()
        product.refresh_from_db()
    return product


def line_violations(*, product: Product) -> list[str]:
    """What breaks the invariants of `product`'s drop line (L1-L3, docs/design.md "The line"),
    from Redis and the orders: for the load tests' books, as shop.ops.invariants is for the rest."""
    return invariants.line_violations(product)


def line_places(*, product: Product) -> list[int]:
    """The accounts of `product`'s drop line in the order of their places ([] without a line):
    for the load tests' figures (which arrivals the servers dated first)."""
    config = line.config_of(product)
    if config is None:
        return []
    return [int(uid) for uid in line.client().zrange(line.keys(config.product_id, config.drop)[1], 0, -1)]
