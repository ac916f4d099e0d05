"""Drops: when a product is on sale. Schedule (or move) its window, end its sale now, clear it.

The admin (the product form and its actions) and `manage.py shop drop` call these, and each
change is written to the drop log with its actor, as restock writes the stock ledger's
("admin:<user>", "cli:<user>@<host>").

No Redis lock is taken: the checkout writer reads the window from the product row it locks FOR
UPDATE until its COMMIT, so an UPDATE here waits for a batch being written, and a batch waits for
it: every order is decided against the old window or the new one, never a mix. Ending a sale
takes its "now" from the database's clock once the rows are locked (`clock.db_now`, the clock the
writer decides with), so no order committed before it has a later time, whatever this server's
own clock says. "now" typed by an operator, and the check that a close is not past, read the same
clock (`clock.now`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from shop import errors, line
from shop.edge import account_age
from shop.models import ENDED, DropLog, Product, drop_state
from shop.plumbing import clock
from shop.plumbing.clock import shop_time
from shop.plumbing.transactions import connection_errors, durable_transaction

Window = tuple[datetime | None, datetime | None]
log = logging.getLogger("shop")


def parse_time(text: str) -> datetime:
    """A time an operator typed: "2026-12-01 10:00" (the shop's time zone, settings.TIME_ZONE),
    ISO 8601 with an offset ("2026-12-01T10:00+02:00", "...Z"), or "now"."""
    text = text.strip()
    if text.lower() == "now":
        return clock.now()
    try:
        value = parse_datetime(text)
    except ValueError:  # well formed, impossible (a 13th month)
        value = None
    if value is None:
        zone = timezone.get_current_timezone_name()
        raise errors.InvalidDropWindow(f"Cannot read the time {text[:40]!r}: write it as 2026-12-01 10:00 (in {zone}), "
                                       f"2026-12-01T10:00+02:00, or now.", details={"time": text[:40]})
    return timezone.make_aware(value) if timezone.is_naive(value) else value


def window_problem(*, opens_at: datetime | None, closes_at: datetime | None, now: datetime) -> str:
    """Why this window cannot be scheduled ("" when it can): it must close after it opens, and
    not in the past (to stop a sale now, end it). Opening in the past is fine: it opens at once.
    The admin's form asks the same before it saves."""
    if opens_at is not None and closes_at is not None and closes_at <= opens_at:
        return f"The drop must close after it opens (opens {shop_time(opens_at)}, closes {shop_time(closes_at)})."
    if closes_at is not None and closes_at <= now:
        return f"The close time {shop_time(closes_at)} has passed: to stop the sale now, end it."
    return ""


def schedule_drop(*, products: Sequence[Product], opens_at: datetime | None, closes_at: datetime | None,
                  actor: str) -> list[Product]:
    """Give `products` the window [opens_at, closes_at) (None: no bound on that side), the same
    for all of them: schedule a drop, or move one. Refused (nothing written) if the window
    closes before it opens or has already closed, or a product does not exist."""
    for name, value in (("opens_at", opens_at), ("closes_at", closes_at)):
        if value is not None and timezone.is_naive(value):
            raise errors.InvalidDropWindow(f"{name} needs a time zone.", details={name: value.isoformat()})
    window = {"opens_at": opens_at.isoformat() if opens_at else None,
              "closes_at": closes_at.isoformat() if closes_at else None}
    if problem := window_problem(opens_at=opens_at, closes_at=closes_at, now=clock.now()):
        raise errors.InvalidDropWindow(problem, details=window)
    return _change(products, action=DropLog.Action.SCHEDULE, actor=actor, window=lambda p, now: (opens_at, closes_at))


def end_drop(*, products: Sequence[Product], actor: str) -> list[Product]:
    """End the sale of `products` now: orders are refused from this moment on. A drop that had
    not opened yet is called off (its window becomes empty); one already ended is left as it is."""

    def ended(product: Product, now: datetime) -> Window | None:
        if drop_state(product.opens_at, product.closes_at, now) == ENDED:
            return None
        opens = product.opens_at if product.opens_at is None or product.opens_at <= now else now
        return opens, now

    return _change(products, action=DropLog.Action.END, actor=actor, window=ended)


def clear_drop(*, products: Sequence[Product], actor: str) -> list[Product]:
    """Remove the window of `products`: on sale whenever active, as before drops existed."""
    return _change(products, action=DropLog.Action.CLEAR, actor=actor,
                   window=lambda p, now: None if p.opens_at is None and p.closes_at is None else (None, None))


@connection_errors()
def require_account_age(*, products: Sequence[Product], min_account_age: timedelta | None,
                        actor: str) -> list[Product]:
    """Let only accounts at least `min_account_age` old buy `products` (None or 0: any account),
    against bots on fresh accounts; the checkout refuses younger ones before any lock
    (shop/account_age.py). Refused (nothing written) if the age is out of range or a product
    does not exist."""
    age = account_age.checked(min_account_age)
    ids = sorted({p.pk for p in products})
    if not ids:
        raise errors.InvalidInput("Name at least one product.", details={"products": "none given"})
    if missing := sorted(set(ids) - set(Product.objects.filter(pk__in=ids).values_list("pk", flat=True))):
        raise errors.UnknownProduct(details={"product_ids": missing})
    Product.objects.filter(pk__in=ids).update(min_account_age=age, updated_at=timezone.now())
    account_age.forget()
    log.info("min account age of products %s set to %s by %s", ids, account_age.describe(age) if age else "none",
             actor)
    return list(Product.objects.filter(pk__in=ids).order_by("pk"))


@connection_errors()
def _change(products: Sequence[Product], *, action: str, actor: str,
            window: Callable[[Product, datetime], Window | None]) -> list[Product]:
    """Under the products' row locks (id order, as the checkout takes them): each product's new
    window from `window(product, now)` (None: unchanged), written with its drop log row."""
    ids = sorted({p.pk for p in products})
    if not ids:
        raise errors.InvalidInput("Name at least one product.", details={"products": "none given"})
    with _transaction():
        rows = {p.pk: p for p in Product.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
        if missing := [pid for pid in ids if pid not in rows]:
            raise errors.UnknownProduct(details={"product_ids": missing})
        now = clock.db_now()  # after the row locks: later than any order already written
        log = []
        for product in rows.values():
            new = window(product, now)
            if new is None:
                continue
            Product.objects.filter(pk=product.pk).update(opens_at=new[0], closes_at=new[1], updated_at=now)
            log.append(DropLog(product=product, action=action, opens_at=new[0], closes_at=new[1], actor=str(actor)))
        DropLog.objects.bulk_create(log)
    line.forget()  # this process sees the new window's line at once (the others within LINE_REFRESH)
    return list(Product.objects.filter(pk__in=ids).order_by("pk"))


def _transaction() -> AbstractContextManager:
    """A durable service transaction of its own; inside the admin's form (already one
    transaction) a part of that one, so the form's save and its window commit together."""
    return transaction.atomic() if connection.in_atomic_block else durable_transaction()
