"""The JSON API: parse and check the request, call the service, map errors to HTTP.

Errors always have the shape {"error": {"code", "message", "details"}}; codes are the services'
(`shop.errors`; to non-staff a hidden product is an unknown one, `errors.as_seen_by`) plus a few
transport ones (not_authenticated, csrf_failed, method_not_allowed, unsupported_media_type,
payload_too_large, not_found). Limits: bodies up to MAX_BODY_BYTES,
orders up to SHOP["MAX_LINES_PER_ORDER"] lines of 1..SHOP["MAX_QUANTITY_PER_LINE"] units.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from shop import errors, validation
from shop.api.tokens import BadToken, bearer_token, user_for_token
from shop.edge import deadlines, ratelimits
from shop.line import arrivals, lined, tickets
from shop.models import CouponClaim, Order, Product
from shop.plumbing import clock
from shop.reads import selectors
from shop.reads.receipts import Receipt
from shop.services import cancel_order, claim_coupon, pay_order, place_order
from shop.validation import validate_idempotency_key

MAX_BODY_BYTES = 16 * 1024


def error_response(status: int, code: str, message: str, details: dict | None = None,
                   retry_after: int | None = None) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message, "details": details or {}}}, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def shop_error_response(exc: errors.ShopError) -> JsonResponse:
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.retry_after)


def _csrf_failure(request: HttpRequest) -> JsonResponse | None:
    """Session-authenticated writes need the CSRF token; bearer requests do not (no ambient auth)."""
    check = CsrfViewMiddleware(lambda r: None)
    check.process_request(request)
    rejected = check.process_view(request, None, (), {})
    if rejected is not None:
        return error_response(403, "csrf_failed", "CSRF check failed: send the X-CSRFToken header.")
    return None


def api_view(methods: tuple[str, ...], *, login: bool = True) -> Callable:
    """JSON view: method check (HEAD wherever GET is allowed), token or session auth, CSRF for
    session writes, and every `ShopError` answered with its envelope."""
    if "GET" in methods and "HEAD" not in methods:
        methods = (*methods, "HEAD")

    def decorate(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            if request.method not in methods:
                response = error_response(405, "method_not_allowed", f"Use {' or '.join(methods)}.")
                response["Allow"] = ", ".join(methods)
                return response
            try:
                raw = bearer_token(request)
                if raw is not None:
                    request.user = user_for_token(raw)
                elif (request.method not in ("GET", "HEAD") and request.user.is_authenticated
                      and (failure := _csrf_failure(request)) is not None):
                    return failure
            except BadToken as exc:
                return error_response(401, "not_authenticated", f"Invalid token: {exc}.")
            if login and not request.user.is_authenticated:
                response = error_response(401, "not_authenticated", "Sign in, or send 'Authorization: Bearer <token>'.")
                response["WWW-Authenticate"] = 'Bearer realm="shop"'
                return response
            try:
                return view(request, *args, **kwargs)
            except errors.ShopError as exc:
                return shop_error_response(errors.as_seen_by(exc, staff=request.user.is_staff))

        return wrapper

    return decorate


def read_json_object(request: HttpRequest) -> dict[str, Any]:
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise _Transport(415, "unsupported_media_type", "Send the body as Content-Type: application/json.")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY_BYTES:
        raise _Transport(413, "payload_too_large", f"The body may be at most {MAX_BODY_BYTES} bytes.")
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise _Transport(413, "payload_too_large", f"The body may be at most {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise errors.InvalidInput("The body is not valid JSON.", details={"body": "invalid JSON"}) from None
    if not isinstance(data, dict):
        raise errors.InvalidInput("The body must be a JSON object.", details={"body": "expected an object"})
    return data


def _refuse_constant(name: str) -> None:
    raise ValueError(name)  # NaN, Infinity


class _Transport(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.response = error_response(status, code, message)


def product_json(p: Product) -> dict[str, Any]:
    """A product; `opens_at` / `closes_at`: its drop window (ISO 8601, null: no bound), outside
    which orders are refused `not_open_yet` / `sale_ended`; `min_account_age`: seconds an account
    must have existed to buy it (null: any account), else `account_too_new`."""
    age = p.min_account_age
    return {"id": p.pk, "sku": p.sku, "name": p.name, "price": str(p.price), "stock": p.stock,
            "opens_at": p.opens_at.isoformat() if p.opens_at else None,
            "closes_at": p.closes_at.isoformat() if p.closes_at else None,
            "min_account_age": int(age.total_seconds()) if age else None}


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    """An order as the API shows it (shop.reads.receipts: the one shape, placed or read back)."""
    return {
        "id": receipt.order_id,
        "status": receipt.status,
        "subtotal": str(receipt.subtotal),
        "discount": str(receipt.discount),
        "total": str(receipt.total),
        "coupon_code": receipt.coupon_code,
        "idempotency_key": receipt.idempotency_key,
        "created_at": receipt.created_at.isoformat(),
        "pay_by": receipt.pay_by.isoformat() if receipt.pay_by else None,
        "paid_at": receipt.paid_at.isoformat() if receipt.paid_at else None,
        "lines": [
            {"product_id": line.product_id, "sku": line.sku, "name": line.name,
             "quantity": line.quantity, "unit_price": str(line.unit_price)}
            for line in receipt.lines
        ],
    }


def order_json(order: Order) -> dict[str, Any]:
    """A saved order (its coupon, lines and products loaded), in the receipt's shape."""
    return receipt_json(Receipt.of_order(order))


def claim_json(claim: CouponClaim) -> dict[str, Any]:
    return {"id": claim.pk, "coupon_code": claim.coupon.code, "discount": str(claim.coupon.discount),
            "claimed_at": claim.claimed_at.isoformat(), "used": claim.used_at is not None}


@api_view(("GET",), login=False)
def products(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"results": [product_json(p) for p in selectors.product_list()]})


@api_view(("GET",), login=False)
def product(request: HttpRequest, product_id: int) -> JsonResponse:
    return JsonResponse(product_json(selectors.product_detail(id=product_id)))


@api_view(("GET",))
def ping(request: HttpRequest) -> JsonResponse:
    """`{"ok": true}` to a signed-in caller, and nothing else: the request path's floor (the
    middleware, the token or session check, a JSON answer) without any work of its own, no SQL or
    Redis beyond what authentication does. `loadtest --compare-http` measures the checkout over
    HTTP against it; unauthenticated it is answered as every signed-in route is (401)."""
    return JsonResponse({"ok": True})


@api_view(("GET", "POST"))
def orders(request: HttpRequest) -> JsonResponse:
    if request.method in ("GET", "HEAD"):
        return JsonResponse({"results": [order_json(o) for o in selectors.orders_for_user(user=request.user)[:50]]})
    ratelimits.check(request, "checkout")
    try:
        data = read_json_object(request)
    except _Transport as exc:
        return exc.response
    lines, code = validation.order_body(data)
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        try:
            key = validate_idempotency_key(key)
        except errors.InvalidInput as exc:
            exc.details = {"Idempotency-Key": exc.details.get("idempotency_key", "invalid")}
            raise
    # When it came matters only to a drop's line (this process's view of which products have one).
    arrived, arrived_us = arrivals.arrived(request) if lined([pid for pid, _ in lines]) else (None, None)
    try:
        placed = place_order(user=request.user, lines=lines, coupon_code=code, idempotency_key=key,
                             deadline=deadlines.of_request(request), line_ticket=request.headers.get("Line-Ticket"),
                             arrived_ms=arrived, arrived_us=arrived_us)
    except errors.InLine as waiting:
        return line_response(waiting, credential=arrivals.of_request(request))
    except errors.Busy as busy:
        return _busy_with_arrival(request, busy, lines=lines, arrived=arrived)
    return JsonResponse(receipt_json(placed), status=200 if placed.replayed else 201)


def _busy_with_arrival(request: HttpRequest, busy: errors.Busy, *, lines: list, arrived: int | None) -> JsonResponse:
    """`busy`; for an order of a product in a drop's line, with an arrival stamp (the one the
    buyer brought, else now): coming back later keeps the place of this first arrival."""
    response = shop_error_response(busy)
    if lined([pid for pid, _ in lines]):
        at_ms = arrived if arrived is not None else int(clock.now().timestamp() * 1000)
        response[arrivals.HEADER] = arrivals.stamp(at_ms=at_ms, credential=arrivals.of_request(request))
    return response


def line_response(waiting: errors.InLine, *, credential: bytes) -> JsonResponse:
    """Not this buyer's turn yet (202, not an error): its place in the drop's line, when to come
    back (Retry-After), and its ticket to send back as a Line-Ticket header, bound to the
    request's credential (shop/line/tickets.py: the worker answers it only from that one)."""
    details = waiting.details
    if details.get("ticket"):
        details = {**details, "ticket": tickets.bound(details["ticket"], credential=credential)}
    response = JsonResponse({"line": details}, status=202)
    response["Retry-After"] = str(waiting.retry_after)
    response["Line-Ticket"] = details.get("ticket", "")
    return response


@api_view(("GET",))
def order(request: HttpRequest, order_id: int) -> JsonResponse:
    return JsonResponse(order_json(selectors.order_for_user(user=request.user, order_id=order_id)))


@api_view(("POST",))
def pay(request: HttpRequest, order_id: int) -> JsonResponse:
    """Pay an unpaid order of one's own (the simulated provider): 200 with the order; paying a
    paid order again answers the same; too late or cancelled: 409 order_not_payable."""
    ratelimits.check(request, "pay")
    mine = selectors.order_for_user(user=request.user, order_id=order_id)
    pay_order(order=mine, actor=f"user:{request.user.pk}")
    return JsonResponse(order_json(selectors.order_for_user(user=request.user, order_id=order_id)))


@api_view(("POST",))
def cancel(request: HttpRequest, order_id: int) -> JsonResponse:
    """The buyer cancels an unpaid order of their own; stock and coupon go back (409 otherwise)."""
    ratelimits.check(request, "cancel")
    mine = selectors.order_for_user(user=request.user, order_id=order_id)
    cancel_order(order=mine, actor=f"user:{request.user.pk}", unpaid_only=True)
    return JsonResponse(order_json(selectors.order_for_user(user=request.user, order_id=order_id)))


@api_view(("POST",))
def claim(request: HttpRequest, code: str) -> JsonResponse:
    ratelimits.check(request, "coupon_claim")
    made = claim_coupon(user=request.user, code=code)
    return JsonResponse(claim_json(made), status=201)


@api_view(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"), login=False)
def not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    return error_response(404, "not_found", "No such API route.", {"path": request.path[:200]})
