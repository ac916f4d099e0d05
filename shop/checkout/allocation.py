"""Who of a batch gets an order, decided from the product rows the writer holds locked: plain
values in, plain values out (no query, no clock: the writer passes its one time of the attempt).
The writer counts what the buyers already hold before calling `allocate`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from shop import errors
from shop.checkout.protocol import Refused, Request
from shop.models import ENDED, UPCOMING, Product, drop_state

Rows = dict[int, dict]  # product id -> its locked row (the writer's `sql.ROW_FIELDS`)


def not_on_sale(product_ids: list[int], rows: Rows, now: datetime) -> errors.ShopError:
    """Why the lines of `product_ids` (none on sale at `now`) cannot be sold (a missing row is no
    product). The first reason that applies to any line: missing or hidden, its drop not open yet
    (with when the last of them opens), its sale over."""
    gone = [pid for pid in product_ids if pid not in rows or not rows[pid]["active"]]
    if gone:
        hidden = any(pid in rows for pid in gone)
        return (errors.InactiveProduct if hidden else errors.UnknownProduct)(details={"product_ids": gone})
    states = {pid: drop_state(rows[pid]["opens_at"], rows[pid]["closes_at"], now) for pid in product_ids}
    if upcoming := [pid for pid in product_ids if states[pid] == UPCOMING]:
        return errors.NotOpenYet.of(upcoming, opens_at=max(rows[pid]["opens_at"] for pid in upcoming))
    ended = [pid for pid in product_ids if states[pid] == ENDED]
    # An empty window is a drop called off before it opened (`end_drop`): it never was on sale.
    return errors.SaleEnded.of(ended, closes_at=min(rows[pid]["closes_at"] for pid in ended),
                               called_off=all(rows[pid]["opens_at"] == rows[pid]["closes_at"] for pid in ended))


def refuse_unsold(live: list[Request], rows: Rows, now: datetime) -> tuple[list[Request], dict[str, Refused]]:
    """The requests whose every line is on sale at `now`, and the refusals of the others."""
    kept, refused = [], {}
    for r in live:
        unsold = [pid for pid, _ in r.lines if pid not in rows or not Product.row_on_sale(rows[pid], now)]
        if unsold:
            refused[r.id] = Refused.of(not_on_sale(unsold, rows, now))
        else:
            kept.append(r)
    return kept, refused


def capped(live: Iterable[Request], rows: Rows) -> set[int]:
    """The products of these requests that have a per-buyer cap (their holdings must be counted)."""
    return {pid for r in live for pid, _ in r.lines if rows[pid]["max_per_user"] is not None}


def allocate(live: list[Request], rows: Rows, left: dict[int, int], *, have: dict[int, dict[int, int]],
             unpaid: dict[int, int], max_unpaid: int | None) -> tuple[list[Request], dict[str, Refused]]:
    """FIFO: a request is placed if its buyer is under the unpaid limit and the caps and every
    line fits what is `left`; a later, smaller request may still fit. `have`: units each buyer
    holds, per capped product (product id -> user id -> units); `unpaid`: unpaid orders per
    buyer. Counted on as the batch is allocated, so two requests of one buyer count together.
    Returns the placed requests (in order) and the refusals by request id; the inputs are not
    changed."""
    left, unpaid = dict(left), dict(unpaid)
    have = {pid: dict(users) for pid, users in have.items()}
    placed: list[Request] = []
    refused: dict[str, Refused] = {}
    for r in live:
        if max_unpaid is not None and unpaid.get(r.user_id, 0) >= max_unpaid:
            refused[r.id] = Refused.of(errors.UnpaidOrdersLimit.of(limit=max_unpaid, unpaid=unpaid[r.user_id]))
            continue
        over = next(((pid, qty) for pid, qty in r.lines if pid in have
                     and have[pid].get(r.user_id, 0) + qty > rows[pid]["max_per_user"]), None)
        if over is not None:
            pid, qty = over
            refused[r.id] = Refused.of(errors.PurchaseLimitExceeded.of(
                product_id=pid, name=rows[pid]["name"], limit=rows[pid]["max_per_user"],
                bought=have[pid].get(r.user_id, 0), requested=qty))
            continue
        short = [{"product_id": pid, "requested": qty, "available": left[pid]} for pid, qty in r.lines
                 if qty > left[pid]]
        if short:
            names = {line["product_id"]: rows[line["product_id"]]["name"] for line in short}
            refused[r.id] = Refused.of(errors.OutOfStock.of(short, names))
            continue
        placed.append(r)
        for pid, qty in r.lines:
            left[pid] -= qty
            if pid in have:
                have[pid][r.user_id] = have[pid].get(r.user_id, 0) + qty
        unpaid[r.user_id] = unpaid.get(r.user_id, 0) + 1
    return placed, refused


def taken(placed: Iterable[Request]) -> dict[int, int]:
    """Units of each product the placed requests take (the batch's one UPDATE per product)."""
    totals: dict[int, int] = {}
    for r in placed:
        for pid, qty in r.lines:
            totals[pid] = totals.get(pid, 0) + qty
    return totals


def subtotal(r: Request, rows: Rows) -> Decimal:
    """What the request's lines cost at the locked rows' prices."""
    return sum((rows[pid]["price"] * qty for pid, qty in r.lines), Decimal("0.00"))
