"""The shop's writes. Views, the API, the admin and the commands all call these.

Each one validates its input, takes its Redis locks in the global lock order, runs one durable
MySQL transaction under them, and raises a `shop.errors.ShopError` (nothing written) on refusal.
"""

from shop.services.checkout import place_order
from shop.services.coupons import claim_coupon, claim_for_checkout
from shop.services.drops import clear_drop, end_drop, schedule_drop
from shop.services.inventory import adjust_stock, restock
from shop.services.lines import steer_line
from shop.services.orders import cancel_order, expire_unpaid, pay_order, refund_order

__all__ = ["adjust_stock", "cancel_order", "claim_coupon", "claim_for_checkout", "clear_drop", "end_drop",
           "expire_unpaid", "pay_order", "place_order", "refund_order", "restock", "schedule_drop",
           "steer_line"]
