"""Stock moved by hand: an operator's adjustment up or down with a reason (`adjust_stock`;
`restock` is one, up); a new product's opening stock; the stock half of cancel_order; hiding a
product.

Every movement takes the product lock and writes one fenced, guarded UPDATE plus a ledger row in
one transaction. A refill (stock up) removes the sold-out marker and raises the product's refill
floor to its fence *before* its COMMIT (so no order can re-mark the product: see
shop/plumbing/soldout.py); an adjustment that leaves 0 marks the product sold out after its
COMMIT, still under the lock, as an order that sells the last unit does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import Product, StockLedger
from shop.plumbing import soldout
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import StaleFence, check_before_commit, held, refuse_outer_transaction
from shop.plumbing.transactions import connection_errors, durable_transaction, with_retries
from shop.reads.selectors import reserved_units
from shop.validation import validate_quantity

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


def open_stock(*, product: Product, actor: str) -> None:
    """Write a new product's opening stock to the ledger (none for 0), so that its rows sum to its
    stock from the start. In the transaction that creates the product (the admin's save, seed_demo):
    no order can reach a product before it exists, so no lock is needed."""
    if product.stock:
        StockLedger.objects.create(product=product, quantity=product.stock, reason=StockLedger.Reason.OPENING,
                                   actor=str(actor))


def return_stock(*, product_id: int, quantity: int, hold, reason: str, order=None, actor: str = "") -> None:
    """Inside a transaction, under the product's lock: put `quantity` back, fenced, with a ledger row."""
    move_stock(product_id=product_id, delta=quantity, hold=hold, reason=reason, order=order, actor=actor)


def move_stock(*, product_id: int, delta: int, hold, reason: str, order=None, note: str = "",
               actor: str = "", confirmation: str | None = None) -> None:
    """Inside a transaction, under the product's lock: stock + `delta` and a ledger row.

    One UPDATE, guarded and fenced in SQL: `stock = stock + delta, fence = :fence WHERE id = :id
    AND fence < :fence`, plus `AND stock >= -delta` when it removes units, so the stock never goes
    below 0 whatever was read before (Python never writes back a stock it read).
    """
    fence = hold.fence if hold is not None else None
    rows = Product.objects.filter(pk=product_id)
    guarded = rows.filter(stock__gte=-delta) if delta < 0 else rows
    if fence is not None:
        updated = guarded.filter(fence__lt=fence).update(stock=F("stock") + delta, fence=fence)
    else:
        updated = guarded.update(stock=F("stock") + delta)
    if not updated:
        row = rows.only("stock", "fence").first()
        if row is None:
            raise errors.UnknownProduct(details={"product_ids": [product_id]})
        if fence is not None and row.fence >= fence:
            raise StaleFence(product_lock(product_id))
        reserved = reserved_units(product_id=product_id)
        raise errors.AdjustmentExceedsStock(
            f"Only {row.stock} left to sell: remove at most {row.stock}."
            + (f" {reserved} more are reserved by unpaid orders: they come back to the stock if not paid, "
               "and can be removed then." if reserved else ""),
            details={"product_id": product_id, "stock": row.stock, "delta": delta, "reserved": reserved})
    StockLedger.objects.create(product_id=product_id, quantity=delta, reason=reason, order=order,
                               fence=fence, actor=actor, note=note, confirmation=confirmation)


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


@dataclass(frozen=True)
class Adjustment:
    """What an adjustment did: the stock just before and just after it, read under the lock."""

    product: Product
    delta: int
    reason: str
    note: str
    before: int
    after: int


@connection_errors()
def _refuse_applied(*, product_id: int, confirmation: str | None) -> None:
    """The confirmation was applied already (a double-submitted page): say by which ledger row."""
    if confirmation is None:
        return
    entry = StockLedger.objects.filter(confirmation=confirmation).values("pk", "product_id", "quantity").first()
    if entry is not None:
        raise errors.AdjustmentAlreadyApplied(
            f"This adjustment was applied already ({entry['quantity']:+d}, ledger row {entry['pk']}); "
            "nothing was changed again.",
            details={"product_id": entry["product_id"], "ledger_id": entry["pk"], "delta": entry["quantity"]})


def adjust_stock(*, product: Product, delta: int, reason: str, note: str = "", actor: str,
                 confirmation: str | None = None) -> Adjustment:
    """Add (`delta` > 0) or remove (< 0) units of `product`'s stock, for `reason` (one of
    `ADJUSTMENT_REASONS` that goes that way: "damaged" only removes, "restock" only
    adds, "correction" either), with an optional note; the ledger row names `actor`.

    Never below what unpaid orders reserved. `stock` is what is left to sell: an order takes its
    units out of it at checkout, and they stay out while it awaits payment (`units_reserved` of
    `shop.reads.selectors.product_sales`) and after it is paid; they come back only if it is cancelled,
    expires or is refunded. The units on hand are therefore stock + reserved (+ sold, not yet
    shipped), and "not below the reserved units" is "stock never below 0": removing units takes
    at most `stock` of them, never one a buyer reserved. The UPDATE guards it in SQL
    (`stock >= n`, see `move_stock`), under the same product lock as checkouts and restocks, so
    an adjustment racing orders can neither oversell nor go negative: whichever commits first
    wins, and the other is refused on what is really left (AdjustmentExceedsStock, saying how
    many units unpaid orders hold, which come back if they are not paid).

    Sold-out markers stay right: adding units clears the marker before the COMMIT (`restock`'s
    refill rule); leaving 0 marks the product sold out after it (hidden products excepted: they
    answer as missing). Refusals (typed, nothing written): ZeroAdjustment, AdjustmentOutOfRange,
    InvalidAdjustmentReason, InvalidInput (note too long), UnknownProduct, AdjustmentExceedsStock,
    LockTimeout / LockUnavailable / Conflict / DatabaseUnavailable.

    `confirmation`: the one-time token of the page that asked (the admin's); a second call with
    it is refused (AdjustmentAlreadyApplied) and writes nothing. It is looked up under the lock,
    inside the transaction, and the ledger's UNIQUE key is the last word if two race.
    """
    refuse_outer_transaction("adjust_stock")
    delta, reason, note = check_adjustment(delta=delta, reason=reason, note=note)
    if not Product.objects.filter(pk=product.pk).exists():
        raise errors.UnknownProduct(details={"product_ids": [product.pk]})
    name = product_lock(product.pk)

    def attempt() -> int:
        with held([name]) as holds:
            if delta > 0:
                unmark_sold_out([product.pk], holds)
            with durable_transaction():
                _refuse_applied(product_id=product.pk, confirmation=confirmation)
                try:
                    with transaction.atomic():
                        move_stock(product_id=product.pk, delta=delta, hold=holds[name], reason=reason,
                                   note=note, actor=str(actor), confirmation=confirmation)
                except IntegrityError:
                    if confirmation is None:
                        raise
                    _refuse_applied(product_id=product.pk, confirmation=confirmation)
                    raise
                row = Product.objects.only("stock", "active").get(pk=product.pk)  # ours, row-locked: exact
                check_before_commit(holds)
            if row.stock == 0 and row.on_sale:
                soldout.mark_under(product.pk, holds[name])
            return row.stock

    after = with_retries(attempt, what="adjust_stock")
    product.refresh_from_db()
    return Adjustment(product=product, delta=delta, reason=reason, note=note, before=after - delta, after=after)


@connection_errors()
def restock(*, product: Product, quantity: int, actor) -> Product:
    """Add `quantity` units received (1 to SHOP["MAX_RESTOCK"]): an adjustment up, reason restock."""
    refuse_outer_transaction("restock")
    quantity = validate_quantity(quantity, maximum=int(shop_settings.MAX_RESTOCK))
    return adjust_stock(product=product, delta=quantity, reason=StockLedger.Reason.RESTOCK, actor=str(actor)).product
