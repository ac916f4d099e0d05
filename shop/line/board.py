"""The lines as people watch them: the admin's Lines page, the line gauges of /metrics, and the
buyer's waiting page (`look`).

The operators' reads are one status script call per drop (shop/line/line.lua, no writes) and one
query for the units that unpaid orders hold.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client.core import GaugeMetricFamily, Metric

from shop.conf import shop_settings
from shop.line import Position, Status, config_of, join, lined, status
from shop.line.tickets import read
from shop.models import Product
from shop.plumbing import clock
from shop.reads import selectors

log = logging.getLogger("shop")


@dataclass(frozen=True)
class LineRow:
    """One drop's line on the Lines page (`status` None: Redis did not answer)."""

    product: Product
    state: str  # upcoming, pre-queue, open, paused, cut, sold out, ended, unknown
    status: Status | None
    reserved: int


# The Lines page shows this many drops, the latest openings first (older ones are over).
SHOWN = 100


def board(*, now: datetime) -> list[LineRow]:
    """Every drop's line (products with an opening, the latest SHOWN first), with the units unpaid
    orders hold. A line Redis cannot tell is listed all the same, as `unknown`."""
    products = list(Product.objects.filter(opens_at__isnull=False).order_by("-opens_at", "pk")[:SHOWN])
    held = selectors.reservations(product_ids=[p.pk for p in products])
    rows = []
    for product in products:
        found = _status(product)
        rows.append(LineRow(product=product, state=state_of(product, found, now), status=found,
                            reserved=held.get(product.pk, {}).get("units") or 0))
    return rows


def _status(product: Product) -> Status | None:
    try:
        return status(config_of(product))
    except Exception:  # a sick Redis: the page still lists the drops
        log.warning("line of product %s: no status", product.pk, exc_info=True)
        return None


def state_of(product: Product, found: Status | None, now: datetime) -> str:
    """Where the line stands, in the words of the Lines page."""
    if product.closes_at is not None and product.closes_at <= now:
        return "ended"
    if found is None:
        return "unknown"
    if found.sold_out:
        return "sold out"
    if product.line_paused:
        return "paused"
    if product.opens_at > now:
        prequeue_from = product.opens_at - timedelta(seconds=product.line_prequeue_seconds)
        return "pre-queue" if prequeue_from <= now else "upcoming"
    return "cut" if found.cut is not None else "open"


class LineCollector:
    """The gauges of the drops' lines at scrape time, by product id: places taken (the line's
    length), waiting, and in the checkout. Lines Redis cannot tell are left out of that scrape."""

    def collect(self) -> Iterator[Metric]:
        length = GaugeMetricFamily("flashsale_line_length", "Places taken in a drop's line (its current drop).",
                                   labels=["product"])
        waiting = GaugeMetricFamily("flashsale_line_waiting", "Buyers of a drop's line not let through yet "
                                    "(the pre-queue included before the opening).", labels=["product"])
        in_checkout = GaugeMetricFamily("flashsale_line_in_checkout", "Buyers of a drop's line let through and not "
                                        "answered yet (at most LINE_WINDOW).", labels=["product"])
        try:
            products = list(selectors.lined_products(now=clock.now()))
        except Exception:
            log.warning("line gauges: no products", exc_info=True)
            products = []
        for product in products:
            found = _status(product)
            if found is None:
                continue
            label = [str(product.pk)]
            length.add_metric(label, found.places + found.prequeue)
            waiting.add_metric(label, found.waiting + found.prequeue)
            in_checkout.add_metric(label, found.in_turn)
        yield from (length, waiting, in_checkout)


# --- the buyer's waiting page ---------------------------------------------------------------------
def look(*, product_id: int, user_id: int, ticket_text: str) -> Position | None:
    """Where this buyer stands in the product's line, for the waiting page's poll: one script
    call that begins no turn (a turn let through waits for the order, LINE_TURN s), no lock. None:
    the product has no line now, or the buyer holds no ticket of its line (a look takes no place).
    Raises RedisError if the line cannot be reached."""
    config = lined([product_id]).get(product_id)
    ticket = read(ticket_text, user_id=user_id) if ticket_text else None
    if config is None or ticket is None or (ticket.product_id, ticket.drop) != (config.product_id, config.drop):
        return None
    return join(config=config, user_id=user_id, start=False, until=time.monotonic(), ticket=ticket, counted=False)


def poll_in(estimated_wait: float) -> int:
    """Seconds until the waiting page looks again: every second near the front, a quarter of the
    estimate further back (at most LINE_RETRY_MAX), so a sold-out line is seen within ~1 s of
    the next look once near the front."""
    return max(1, min(int(shop_settings.LINE_RETRY_MAX), math.ceil(estimated_wait / 4)))
