"""Prometheus metrics of the shop, and the protected `/metrics` endpoint (docs/metrics.md).

Each outcome is counted once, where it is decided:
- `checkout_outcome` wraps `place_order`, the one entry of the checkout (a batched buyer's
  place_order returns once, with its own result): every call ends
  as placed, replayed (an idempotent retry got its order back) or refused with a shop error
  code (shop/errors.py; `internal_error` for an unexpected exception);
- `soldout_rejected` where the sold-out marker refuses an order without the lock (checkout.py);
- `fence_refused` where a stale fence is caught (`retries.noticed`).

Multi-process mode (gunicorn, see config/gunicorn.conf.py): with PROMETHEUS_MULTIPROC_DIR set before
the app is imported, prometheus_client keeps each worker's values in files of that directory and
the view sums them with `MultiProcessCollector`; without it (runserver, tests, loadtest) the
default in-process registry is served.

Access: off (404) unless METRICS_TOKEN and/or METRICS_ALLOWED_IPS is set; see `metrics_view`.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from locks import inspect as lock_inspect
from shop import errors
from shop.edge import overload

log = logging.getLogger("shop")

F = TypeVar("F", bound=Callable[..., Any])

INTERNAL_ERROR = "internal_error"
# Every label value `reason` can take: the shop's error codes, plus unexpected exceptions.
REASONS = (*errors.ERRORS_BY_CODE, INTERNAL_ERROR)

ORDERS_PLACED = Counter("flashsale_orders_placed", "New orders placed (committed).")
ORDERS_REPLAYED = Counter("flashsale_orders_replayed", "Checkouts answered with the order their Idempotency-Key "
                          "already placed (not a new order).")
ORDERS_REFUSED = Counter("flashsale_orders_refused", "Checkouts refused, by shop error code (shop/errors.py): "
                         "out_of_stock, purchase_limit, lock_timeout, lock_unavailable, conflict, ...",
                         ["reason"])
SOLDOUT_REJECTIONS = Counter("flashsale_soldout_rejections", "Checkouts refused by the sold-out marker, "
                             "without the lock or MySQL (also counted in orders_refused{reason=out_of_stock}).")
SHED = Counter("flashsale_shed", "Requests answered 503 busy without their work: queue_full and queue_delay "
               "(the worker's queue for a thread was full, or the request waited in it too long), admission "
               "(the process lets no more buyers wait in the lines), door_full (more orders of a drop waited "
               "at the line's door than it holds).", ["reason"])
DEADLINE_EXPIRED = Counter("flashsale_deadline_expired", "Order requests whose deadline passed before their work "
                           "was done, by stage: arrival (before it started), take (when a combiner took it), "
                           "commit (before its batch's COMMIT).", ["stage"])
QUEUE_WAIT = Histogram("flashsale_queue_wait_seconds", "How long a request waited for a thread of its worker "
                       "(admitted requests).", buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0))
FENCE_REFUSALS = Counter("flashsale_fence_refusals", "Writes refused because a newer lock holder had already "
                         "written the row (a stale fence: the holder lost its lock); retried.", ["operation"])

LINE_ANSWERS = Counter("flashsale_line_answers", "Order requests of a drop's line, by what the line answered: "
                       "started (its turn: on to the checkout), waiting, pre_queue, cut (told sold out by the line), "
                       "sold_out, in_checkout (the account's other request is in the checkout), admitted, "
                       "worker_waiting (a waiting ticket answered by the gunicorn worker, without the app).", ["state"])
LINE_ANSWER_SECONDS = Histogram("flashsale_line_answer_seconds", "From a buyer's place in a drop's line (its first "
                                "request) to its final answer, by outcome: placed, refused (by the checkout), "
                                "sold_out (told by the line).", ["outcome"],
                                buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0))
LINE_LET_THROUGH = Counter("flashsale_line_let_through", "Turns begun in a drop's line, by product id: a buyer let "
                           "through to the checkout (its rate is the line's admission rate; a buyer whose turn "
                           "lapsed and who comes back counts again).", ["product"])
LINE_TICKETS_REFUSED = Counter("flashsale_line_tickets_refused", "Line-Ticket headers refused: not signed by this "
                               "shop for the account that sent it (forged, altered, another account's).")
# Bots (docs/operations.md, "Bots"): who signs up, who makes API tokens, how young they are.
ACCOUNTS_CREATED = Counter("flashsale_accounts_created", "Accounts created (sign-up, the admin, createsuperuser).")
TOKENS_CREATED = Counter("flashsale_api_tokens_created", "API tokens created (the tokens page, manage.py apitoken).")
TOKEN_ACCOUNT_AGE = Histogram(
    "flashsale_api_token_account_age_seconds", "The age of its account when an API token was created: tokens "
    "made seconds after sign-up fill the low buckets.",
    buckets=(10, 60, 300, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400))
YOUNG_BUYERS = Counter("flashsale_drop_young_buyers", "Accounts younger than SHOP['YOUNG_ACCOUNT_AGE'] whose first "
                       "order request for a drop came within SHOP['DROP_OPENING_WINDOW'] seconds of its opening "
                       "(once per account and drop).")


def checkout_outcome(place_order: F) -> F:
    """Count how each `place_order` call ended: placed, replayed or refused (by error code)."""

    @functools.wraps(place_order)
    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            placed = place_order(*args, **kwargs)
        except errors.ShopError as exc:
            _refused(exc.code if exc.code in errors.ERRORS_BY_CODE else INTERNAL_ERROR)
            raise
        except Exception:
            _refused(INTERNAL_ERROR)
            raise
        try:
            (ORDERS_REPLAYED if placed.replayed else ORDERS_PLACED).inc()
        except Exception as exc:
            _failed(exc)
        return placed

    return counted  # type: ignore[return-value]


def _refused(reason: str) -> None:
    _safely(lambda: ORDERS_REFUSED.labels(reason).inc())


def soldout_rejected() -> None:
    _safely(SOLDOUT_REJECTIONS.inc)


def line_answered(state: str) -> None:
    _safely(lambda: LINE_ANSWERS.labels(state).inc())


def line_answered_at_worker() -> None:
    """A waiting ticket answered 202 by the gunicorn worker itself (no app, no thread)."""
    overload.count("line:worker_waiting")
    _safely(lambda: LINE_ANSWERS.labels("worker_waiting").inc())


def line_answered_finally(outcome: str, seconds: float) -> None:
    _safely(lambda: LINE_ANSWER_SECONDS.labels(outcome).observe(max(0.0, seconds)))


def line_let_through(product_id: int) -> None:
    _safely(lambda: LINE_LET_THROUGH.labels(str(product_id)).inc())


def line_ticket_refused() -> None:
    _safely(LINE_TICKETS_REFUSED.inc)


def fence_refused(operation: str) -> None:
    """`operation`: a fixed name per call site (place_order, claim_coupon, restock, combining, ...)."""
    _safely(lambda: FENCE_REFUSALS.labels(operation).inc())


def shed(reason: str) -> None:
    """A request answered `busy` without its work (see SHED's reasons); also for the dashboard."""
    overload.count(f"shed:{reason}")
    _safely(lambda: SHED.labels(reason).inc())


def deadline_expired(stage: str) -> None:
    overload.count(f"deadline:{stage}")
    _safely(lambda: DEADLINE_EXPIRED.labels(stage).inc())


def queue_waited(seconds: float) -> None:
    overload.waited(seconds)
    _safely(lambda: QUEUE_WAIT.observe(seconds))


def account_created(sender: object, instance: Any, created: bool = False, raw: bool = False, **kwargs: Any) -> None:
    """post_save of the user model (shop/apps.py)."""
    if created and not raw:
        _safely(ACCOUNTS_CREATED.inc)


def token_created(sender: object, instance: Any, created: bool = False, raw: bool = False, **kwargs: Any) -> None:
    """post_save of ApiToken (shop/apps.py): counted, with its account's age then."""
    if not created or raw:
        return
    _safely(TOKENS_CREATED.inc)
    _safely(lambda: TOKEN_ACCOUNT_AGE.observe(max(0.0, (instance.created_at - instance.user.date_joined)
                                                  .total_seconds())))


def young_buyer() -> None:
    _safely(YOUNG_BUYERS.inc)


def _safely(record: Callable[[], object]) -> None:
    try:
        record()
    except Exception as exc:
        _failed(exc)


_warned = False


def _failed(exc: Exception) -> None:
    """Metrics never fail an order (say the multi-process directory is gone): logged once."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("shop metrics: could not record (%s); further failures are not logged", exc)


# --- the endpoint -----------------------------------------------------------------------------
def parse_networks(values: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """METRICS_ALLOWED_IPS: CIDRs or single addresses. Raises ValueError on a bad one."""
    return [ipaddress.ip_network(v.strip(), strict=False) for v in values if v.strip()]


def _allowed_ip(request: HttpRequest, networks: list) -> bool:
    """REMOTE_ADDR only: X-Forwarded-For is whatever the client wrote unless a proxy we trust
    rewrites it, so trusting it would let anyone claim an allowed address."""
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(addr in net for net in networks)


def _token_ok(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


# Collectors that compute their values at scrape time from above this floor (the lines' gauges):
# registered once, by the app's ready().
_scrape_collectors: list = []


def add_scrape_collector(collector: object) -> None:
    if collector not in _scrape_collectors:
        _scrape_collectors.append(collector)


class _Default:
    """The in-process registry (no PROMETHEUS_MULTIPROC_DIR), as a collector of the view's registry."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def exposition() -> bytes:
    """The text format of every metric: this process's (or all workers' in multi-process mode),
    plus the ones computed at scrape time (lock backend, queue depth, the lines' gauges)."""
    registry = CollectorRegistry()
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        MultiProcessCollector(registry, path=path)
    else:
        registry.register(_Default())
    registry.register(lock_inspect.ScrapeCollector())
    for collector in _scrape_collectors:
        registry.register(collector)
    return generate_latest(registry)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint.

    Off (404, as if it did not exist) unless settings.METRICS_TOKEN or METRICS_ALLOWED_IPS is
    set: metrics tell an outsider how the sale goes. Each one set must pass: an address not in
    METRICS_ALLOWED_IPS gets 403; a missing or wrong `Authorization: Bearer <token>`, 401. Never
    a metric in a refusal.
    """
    token: str = getattr(settings, "METRICS_TOKEN", "") or ""
    allowed: list[str] = list(getattr(settings, "METRICS_ALLOWED_IPS", []) or [])
    if not token and not allowed:
        raise Http404("metrics are off")
    if allowed and not _allowed_ip(request, parse_networks(allowed)):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    if token and not _token_ok(request, token):
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        body = exposition()
    except Exception:
        log.exception("metrics: exposition failed")
        return HttpResponse("metrics unavailable\n", status=503, content_type="text/plain")
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
