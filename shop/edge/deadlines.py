"""Every order request has a deadline: the time its answer is due.

The server's budget is LOCK_WAIT + ANSWER_MARGIN: the wait in the product's line, then a second
to settle and answer. It counts from the request's arrival, when the worker queued it for a
thread (`environ["shop.arrived"]`, stamped by config/gunicorn_worker.py), so the time it waited for
a thread is part of it. A client may ask for less with RFC 7240's `Prefer: wait=N` (seconds),
never for more. Work for a request past its deadline is not started, and no order is committed
for it (the combiner and the batch writer check: shop/checkout/writer.py).

Deadlines are `time.monotonic()` values of this process.
"""

from __future__ import annotations

import re
import time

from django.http import HttpRequest

from shop.conf import shop_settings

# Seconds kept after the line's wait for settling the outcome and answering.
ANSWER_MARGIN = 1.0
# Less than this left when the work would start: the request is past its deadline.
TOO_LATE = 0.05

_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?(\d{1,6}(?:\.\d{1,3})?)\"?\s*(?:[,;]|$)", re.IGNORECASE)


def budget() -> float:
    return float(shop_settings.LOCK_WAIT) + ANSWER_MARGIN


def prefer_wait(header: str) -> float | None:
    """The `wait` preference of a Prefer header (RFC 7240), in seconds; None if absent or malformed."""
    match = _WAIT.search(header or "")
    return float(match.group(1)) if match else None


def arrival(request: HttpRequest) -> float:
    """When the request arrived: stamped by the shop's gunicorn worker, else now."""
    arrived = request.META.get("shop.arrived")
    return arrived if isinstance(arrived, float) else time.monotonic()


def of_request(request: HttpRequest) -> float:
    """The request's deadline: arrival + the server's budget, or the client's shorter one."""
    wanted = prefer_wait(request.headers.get("Prefer", ""))
    return arrival(request) + (budget() if wanted is None else min(budget(), wanted))


def line_wait_until(deadline: float) -> float:
    """When the wait in a product's line must end, to leave time to settle and answer."""
    left = deadline - time.monotonic()
    return deadline - min(ANSWER_MARGIN, max(left, 0.0) / 2)


def passed(deadline: float) -> bool:
    return deadline - time.monotonic() < TOO_LATE
