"""What one buyer may take: per-product purchase caps (`Product.max_per_user`) and the number of
unpaid orders (SHOP["MAX_UNPAID_ORDERS"]), so that one buyer, or a bot with many requests, cannot
drain or hoard a limited drop. (Request rates are shop/edge/ratelimits.py.)

Counted under the product's lock *and* its row lock: the checkout writer (writer.py) counts after
it holds the product's row in InnoDB (its SELECT ... FOR UPDATE), and every
order of a product writes that row, so no other order of the product is in flight uncommitted
and the count is exact, even if the Redis lock was lost meanwhile.
"""

from __future__ import annotations

from django.db.models import Count

from shop.conf import shop_settings
from shop.models import Order, OrderLine


def bought(*, product_id: int, user_ids: set[int] | list[int]) -> dict[int, int]:
    """Units of the product each of these buyers holds in orders that reserve stock (unpaid too)."""
    return (OrderLine.objects.reserving().filter(product_id=product_id, order__user_id__in=user_ids)
            .units_by("order__user_id"))


# --- unpaid orders: one account must not hoard a drop by reserving it for the payment window --
def max_unpaid() -> int | None:
    limit = shop_settings.MAX_UNPAID_ORDERS
    return None if limit is None else int(limit)


def unpaid(*, user_ids: set[int] | list[int]) -> dict[int, int]:
    """How many orders awaiting payment each of these buyers has."""
    rows = (Order.objects.filter(user_id__in=user_ids, status=Order.Status.PENDING_PAYMENT)
            .values_list("user_id").annotate(n=Count("id")).values_list("user_id", "n"))
    return dict(rows)
