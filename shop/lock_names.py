"""The names of the shop's locks, in one place (the lock library keys its Redis state by them).

A product's stock is written under its own lock; a coupon's claims under the coupon's. With
combining, a buyer of one product queues on the lock its batch is served under: the product's
own, or with lanes (SHOP["COMBINE_LANES"]) the lane the product falls in.
"""

from __future__ import annotations

from shop.conf import shop_settings


def product_lock(product_id: int) -> str:
    return f"product:{product_id}"


def coupon_lock(coupon_id: int) -> str:
    return f"coupon:{coupon_id}"


def lane_lock(product_id: int, *, lanes: int) -> str:
    """The queue a single-product order waits in: its product's own lock, or its lane's."""
    return product_lock(product_id) if lanes <= 0 else f"checkout-lane:{product_id % lanes}"


def checkout_queue(product_id: int) -> str:
    """The lock a buyer of this one product waits on under the current settings."""
    if not shop_settings.COMBINING:
        return product_lock(product_id)
    return lane_lock(product_id, lanes=int(shop_settings.COMBINE_LANES))
