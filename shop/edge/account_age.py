"""A drop's minimum account age (Product.min_account_age), against bots on fresh accounts.

`check` runs in place_order before anything else is done with the order (no lock, no queue, no
write): an account younger than a product's rule is refused `account_too_new` (403), told when
it may buy. The rules come from MySQL at most every REFRESH seconds per process (one query for
the products that have a rule or a drop window not over), so an order costs no query for them. A
rule written by this process is seen at once (a product's save and the drops service forget the
rules); one written on another server, within REFRESH.

`check` also counts a signal for the operator, `flashsale_drop_young_buyers_total`: an account
younger than SHOP["YOUNG_ACCOUNT_AGE"] whose first order request for a drop's product comes within
SHOP["DROP_OPENING_WINDOW"] seconds of its opening (once per account and drop, across servers: a
Redis SET NX, only for such accounts and only in that window).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models.signals import post_save
from django.utils import timezone
from django_redis import get_redis_connection

from shop import errors
from shop.conf import shop_settings
from shop.models import Product
from shop.ops import metrics
from shop.plumbing import redis_keys
from shop.plumbing.clock import shop_time
from shop.reads import selectors

log = logging.getLogger("shop")

REFRESH = 1.0  # seconds: how stale this process's copy of the rules may be
MAX_AGE = timedelta(days=365)  # the longest rule an operator may set

UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_AGE = re.compile(r"(?:\d{1,9}[wdhms])+")
_PART = re.compile(r"(\d+)([wdhms])")


def parse_age(text: str) -> timedelta | None:
    """An age as an operator writes it: "7d", "24h", "90m", "45s", "2w", "1d12h", or whole seconds
    ("3600"); "", "0" or "none": no rule (None). Refused: anything else, or more than MAX_AGE."""
    value = text.strip().lower()
    if value in ("", "none", "off"):
        return None
    if value.isdigit() and len(value) <= 12:
        seconds = int(value)
    elif _AGE.fullmatch(value):
        seconds = sum(int(n) * UNITS[unit] for n, unit in _PART.findall(value))
    else:
        raise errors.InvalidAccountAge(f"Cannot read the age {text[:40]!r}: write it as 7d, 24h, 90m or 45s.",
                                       details={"min_account_age": text[:40]})
    return checked(timedelta(seconds=seconds))


def checked(age: timedelta | None) -> timedelta | None:
    """A rule in range: None (or 0) for none, else a whole number of seconds up to MAX_AGE."""
    if age is None or age == timedelta(0):
        return None
    if age < timedelta(0) or age > MAX_AGE:
        raise errors.InvalidAccountAge(f"A minimum account age is at most {describe(MAX_AGE)}.",
                                       details={"min_account_age": str(age)})
    return timedelta(seconds=math.ceil(age.total_seconds()))


def _largest_unit(age: timedelta) -> tuple[int, str]:
    seconds = int(age.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return seconds // size, unit
    return seconds, "s"


def describe(age: timedelta) -> str:
    """In words, in its largest whole unit: "7 days", "36 hours", "90 minutes", "45 seconds"."""
    count, unit = _largest_unit(age)
    word = {"d": "day", "h": "hour", "m": "minute", "s": "second"}[unit]
    return f"{count} {word}{'' if count == 1 else 's'}"


def compact(age: timedelta | None) -> str:
    """As an operator writes it ("7d", "36h"): what the admin's form shows."""
    if age is None:
        return ""
    count, unit = _largest_unit(age)
    return f"{count}{unit}"


# --- the rules, per process --------------------------------------------------------------------
@dataclass(frozen=True)
class DropRule:
    product_id: int
    min_age: timedelta | None
    opens_at: datetime | None


_rules: dict[int, DropRule] = {}
_read_at = -math.inf
_guard = threading.Lock()


def rules(product_ids: Iterable[int]) -> dict[int, DropRule]:
    """The rules of these products that have one (a minimum age or a drop window), by id. A
    refresh replaces the whole dict at once: a thread reading meanwhile sees the old rules or the
    new ones, never none."""
    global _read_at, _rules
    if time.monotonic() - _read_at >= REFRESH:
        with _guard:
            if time.monotonic() - _read_at >= REFRESH:
                rows = selectors.drop_rules(now=timezone.now())
                _rules = {pid: DropRule(pid, age, opens) for pid, age, opens in rows}
                _read_at = time.monotonic()
    current = _rules
    return {pid: current[pid] for pid in product_ids if pid in current}


def forget(**_: object) -> None:
    """Read the rules again on the next order (this process changed a product)."""
    global _read_at
    _read_at = -math.inf


post_save.connect(forget, sender=Product, dispatch_uid="shop.account_age.forget")


def check(*, user, product_ids: list[int], signal: bool = True) -> None:
    """Refuse `user` (AccountTooNew) if a product of the order asks for an older account. A user
    model without `date_joined` is not checked. `signal` False: the caller counts the young
    buyer itself (`signal_young_buyers`, many at once)."""
    found = rules(product_ids)
    joined = getattr(user, "date_joined", None)
    if not found or joined is None:
        return
    now = timezone.now()
    age = now - joined
    if signal:
        signal_young_buyers([(user, pid) for pid in product_ids])
    short = [pid for pid in product_ids if pid in found and found[pid].min_age is not None
             and age < found[pid].min_age]
    if not short:
        return
    need = max(found[pid].min_age for pid in short)
    eligible = joined + need
    raise errors.AccountTooNew(
        f"Accounts must be at least {describe(need)} old to buy in this drop: yours may buy from "
        f"{shop_time(eligible)}.",
        details={"product_ids": short, "min_account_age": int(need.total_seconds()),
                 "eligible_at": eligible.isoformat()})


def eligible_at(*, user, product: Product) -> datetime | None:
    """When `user` may buy `product` under its rule, if that is still to come (the product page)."""
    joined = getattr(user, "date_joined", None)
    if product.min_account_age is None or joined is None:
        return None
    when = joined + product.min_account_age
    return when if when > timezone.now() else None


def signal_young_buyers(buyers: Iterable[tuple[object, int]]) -> None:
    """The operator's signal (see the module doc) for these (user, product) pairs: each account
    younger than YOUNG_ACCOUNT_AGE buying in a drop's first DROP_OPENING_WINDOW seconds is counted
    once per drop, in one round trip. Never fails an order."""
    now = timezone.now()
    window = float(shop_settings.DROP_OPENING_WINDOW)
    joined_after = now - timedelta(seconds=float(shop_settings.YOUNG_ACCOUNT_AGE))
    buyers = list(buyers)
    opening = {pid: rule.opens_at for pid, rule in rules({pid for _, pid in buyers}).items()
               if rule.opens_at is not None and 0 <= (now - rule.opens_at).total_seconds() < window}
    keys = []
    for user, product_id in buyers:
        opens_at = opening.get(product_id)
        joined = getattr(user, "date_joined", None)
        if opens_at is None or joined is None or joined <= joined_after:
            continue
        keys.append(redis_keys.young_buyer(product_id, int(opens_at.timestamp()), user.pk))
    if not keys:
        return
    try:
        pipe = get_redis_connection(shop_settings.REDIS_ALIAS).pipeline(transaction=False)
        for key in keys:
            pipe.set(key, 1, nx=True, ex=int(window) + 60)
        firsts = sum(1 for first in pipe.execute() if first)
    except Exception:  # Redis away: the order meets the lock's own answer; no signal
        log.debug("young buyers' signal not counted", exc_info=True)
        return
    for _ in range(firsts):
        metrics.young_buyer()
