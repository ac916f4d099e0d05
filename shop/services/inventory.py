"""Stock refills: restock (operators) and the stock half of cancel_order; hiding a product.

A refill takes the product lock, removes the sold-out marker and raises the product's refill
floor to its fence *before* its COMMIT (so no order can re-mark the product: see
shop/plumbing/soldout.py), and writes a fenced UPDATE plus a ledger row.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.lock_names import product_lock
from shop.models import Product, StockLedger
from shop.plumbing import soldout
from shop.plumbing.locking import StaleFence, check_before_commit, held, refuse_outer_transaction
from shop.plumbing.transactions import connection_errors, durable_transaction, with_retries
from shop.validation import validate_quantity


def return_stock(*, product_id: int, quantity: int, hold, reason: str, order=None, actor: str = "") -> None:
    """Inside a transaction, under the product's lock: put `quantity` back, fenced, with a ledger row."""
    fence = hold.fence if hold is not None else None
    rows = Product.objects.filter(pk=product_id)
    if fence is not None:
        updated = rows.filter(fence__lt=fence).update(stock=F("stock") + quantity, fence=fence)
    else:
        updated = rows.update(stock=F("stock") + quantity)
    if not updated:
        if not Product.objects.filter(pk=product_id).exists():
            raise errors.UnknownProduct(details={"product_ids": [product_id]})
        raise StaleFence(product_lock(product_id))
    StockLedger.objects.create(product_id=product_id, quantity=quantity, reason=reason, order=order,
                               fence=fence, actor=actor)


def unmark_sold_out(product_ids: list[int], holds: dict) -> None:
    """Before a refill commits, under the products' locks: drop their sold-out markers and raise
    their refill floors to this hold's fence, so a buyer that read 0 before us can no longer
    mark them. If Redis is down we cannot hold the lock either: refuse."""
    if not shop_settings.USE_LOCKS:
        return
    try:
        for pid in product_ids:
            hold = holds.get(product_lock(pid))
            soldout.refilled([pid], fence=hold.fence if hold is not None else None)
    except Exception as exc:
        raise errors.LockUnavailable() from exc


def hidden(*, product_id: int, wait: float | None = None) -> None:
    """Call once hiding a product has committed (the admin does, on commit).

    A hidden product must answer as a missing one, never `out_of_stock` from a sold-out marker
    the fast path would read without MySQL. So, like a refill: under the product's lock, drop
    the marker and raise the refill floor to this hold's fence. Every buyer that read the
    product on sale held the lock before us (an older fence: its mark is refused now); every
    later one reads it hidden and marks nothing. Raises LockTimeout/LockUnavailable if the lock
    cannot be had within `wait` (default LOCK_WAIT): then `clear_hidden_markers` (a job) tries
    again until it can.
    """
    refuse_outer_transaction("hidden")
    with held([product_lock(product_id)], wait=wait) as holds:
        unmark_sold_out([product_id], holds)


def clear_hidden_markers(*, check=None) -> tuple[int, int]:
    """Clear the sold-out markers that hidden products still have (a hide that could not take
    the product's lock behind a long queue). Only products hidden within SOLDOUT_TTL can have
    one: a marker is written under the lock for a product on sale and lapses after that TTL.
    Returns (cleared, left for the next run)."""
    recent = timezone.now() - timedelta(seconds=float(shop_settings.SOLDOUT_TTL))
    ids = list(Product.objects.filter(active=False, updated_at__gte=recent).values_list("pk", flat=True))
    cleared = left = 0
    for pid in sorted(soldout.sold_out(ids)):
        if check is not None:
            check()
        try:
            hidden(product_id=pid, wait=float(shop_settings.LOCK_WAIT) * 5)
            cleared += 1
        except (errors.LockTimeout, errors.LockUnavailable):
            left += 1
    return cleared, left


@connection_errors()
def restock(*, product: Product, quantity: int, actor) -> Product:
    refuse_outer_transaction("restock")
    quantity = validate_quantity(quantity, maximum=int(shop_settings.MAX_RESTOCK))
    if not Product.objects.filter(pk=product.pk).exists():
        raise errors.UnknownProduct(details={"product_ids": [product.pk]})

    def attempt() -> None:
        name = product_lock(product.pk)
        with held([name]) as holds:
            unmark_sold_out([product.pk], holds)
            with durable_transaction():
                return_stock(product_id=product.pk, quantity=quantity, hold=holds[name],
                             reason=StockLedger.Reason.RESTOCK, actor=str(actor))
                check_before_commit(holds)

    with_retries(attempt, what="restock")
    product.refresh_from_db()
    return product
