"""The web checkout: thin views over the services, errors in plain words."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from redis.exceptions import RedisError

from shop import errors, validation
from shop.api import views as api
from shop.api.tokens import revoke
from shop.conf import shop_settings
from shop.edge import account_age, deadlines, ratelimits
from shop.line import arrivals, board, lined, tickets
from shop.models import UPCOMING, ApiToken, Product
from shop.money import unused_discount
from shop.plumbing import clock
from shop.reads import selectors
from shop.services import cancel_order, claim_coupon, claim_for_checkout, pay_order, place_order
from shop.templatetags.shop_tags import money
from shop.web import cart
from shop.web.forms import (
    AddToCartForm,
    CheckoutForm,
    CouponCodeForm,
    QuantityForm,
    QueuedPasswordResetForm,
    SignUpForm,
    TokenForm,
)


def plain_words(exc: errors.ShopError, names: dict[int, str] | None = None, *, staff: bool = False) -> str:
    """What a shopper reads for an error: its one wording (`ShopError.words`), the products named
    where the page knows them; a hidden product reads as a missing one, except to staff
    (`errors.as_seen_by`)."""
    return errors.as_seen_by(exc, staff=staff).words(names)


# A page without JavaScript reloads itself at the next drop edge it shows if that is this close
# (a meta refresh); with JavaScript, shop/drop-live.js counts down and reloads at the edge.
REFRESH_WITHIN = 3600


def _refresh_in(products: Iterable[Product]) -> int | None:
    """Seconds until the next opening or closing among `products`, if within REFRESH_WITHIN."""
    now = timezone.now()
    edges = [when for p in products for when in (p.opens_at, p.closes_at) if when is not None and when > now]
    if not edges:
        return None
    seconds = math.ceil((min(edges) - now).total_seconds())
    return seconds if seconds <= REFRESH_WITHIN else None


def window_key(state: str, opens_at: datetime | None, closes_at: datetime | None) -> str:
    """What the product page was drawn for: a poll that reads another key reloads the page."""
    return " ".join([state, opens_at.isoformat() if opens_at else "-", closes_at.isoformat() if closes_at else "-"])


def catalog(request: HttpRequest) -> HttpResponse:
    """Upcoming drops in a block of their own at the top (soonest first), then the rest."""
    products = list(selectors.product_list())
    upcoming = sorted((p for p in products if p.drop_state == UPCOMING), key=lambda p: p.opens_at)
    return render(request, "shop/catalog.html", {
        "upcoming": upcoming, "products": [p for p in products if p not in upcoming],
        "refresh_in": _refresh_in(products),
    })


@require_http_methods(["GET", "HEAD"])
def product_state(request: HttpRequest, product_id: int) -> JsonResponse:
    """The drop state the product page polls for (an early "End sale now", a moved window): no
    lock and, most polls, no query (`selectors.drop_window`)."""
    window = selectors.drop_window(product_id=product_id)
    if window is None:
        return api.shop_error_response(errors.UnknownProduct(details={"product_ids": [product_id]}))
    state = Product(opens_at=window["opens_at"], closes_at=window["closes_at"]).drop_state  # the page's own rule
    return JsonResponse({"state": state, "key": window_key(state, window["opens_at"], window["closes_at"])},
                        headers={"Cache-Control": "no-store"})


@require_http_methods(["GET", "HEAD", "POST"])
def product_detail(request: HttpRequest, product_id: int) -> HttpResponse:
    try:
        product = selectors.product_detail(id=product_id)
    except errors.UnknownProduct:
        raise Http404("No such product") from None
    held = _held(request, [product])
    form = AddToCartForm(request.POST or None)
    status = 200
    if request.method == "POST" and form.is_valid():
        problem = cart.add_problem(request.session, product, form.cleaned_data["quantity"],
                                   held=held.get(product.pk, 0))
        if not product.on_sale:  # a drop not open yet or over (the page offers no form then): refused
            status = 409
        if not problem:
            try:
                qty = cart.add(request.session, product.pk, form.cleaned_data["quantity"],
                               maximum=int(shop_settings.MAX_QUANTITY_PER_LINE))
            except errors.CartFull as exc:
                problem = plain_words(exc)
            else:
                messages.success(request, f"{product.name}: {qty} in your cart.")
                return redirect("cart")
        form.add_error("quantity", problem)  # re-rendered with the message
    cap_left = cart.cap_left(product, held.get(product.pk, 0))
    return render(request, "shop/product.html", {
        "product": product, "form": form, "held": held.get(product.pk, 0), "cap_left": cap_left,
        "max_quantity": product.stock if cap_left is None else min(product.stock, cap_left),
        "refresh_in": _refresh_in([product]),
        "window_key": window_key(product.drop_state, product.opens_at, product.closes_at),
        "min_account_age": account_age.describe(product.min_account_age) if product.min_account_age else "",
        "eligible_at": account_age.eligible_at(user=request.user, product=product),
    }, status=status)


def _held(request: HttpRequest, products: Iterable[Product]) -> dict[int, int]:
    """Units the buyer holds in orders of those `products` that have a per-buyer cap (no query
    when none has one, or for a guest)."""
    return selectors.units_held(user=request.user, product_ids=[p.pk for p in products if p.max_per_user is not None])


def _cart_rows(request: HttpRequest) -> list[cart.Line]:
    """The cart's lines, flagged (never silently dropped) when they can no longer be bought."""
    ids = [pid for pid, _ in cart.lines(request.session)]
    products = selectors.products_by_id(ids, include_inactive=request.user.is_staff)
    return cart.review(request.session, products, held=_held(request, products.values()))


def _posted_id(request: HttpRequest, field: str) -> int:
    """A positive id from the POST that MySQL's BIGINT holds, or 0."""
    raw = request.POST.get(field, "")
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 19 else 0
    return value if value <= validation.MAX_ID else 0


@require_http_methods(["GET", "HEAD", "POST"])
def cart_view(request: HttpRequest) -> HttpResponse:
    """The cart; a POST sets one line's quantity (0 or a Remove button: removes it). Only a
    product the shopper can see goes in: a hidden id is answered as a missing one."""
    if request.method == "POST":
        pid = _posted_id(request, "product_id")
        form = QuantityForm(request.POST)
        if form.is_valid():
            quantity = form.cleaned_data["quantity"]
            try:
                # The product page's own checks (no id: unknown; a drop not open or over).
                if quantity > 0 and (problem := cart.unsold_problem(selectors.product_detail(id=pid))):
                    raise errors.InvalidInput(problem)
                if pid:
                    cart.set_quantity(request.session, pid, quantity)
            except errors.ShopError as exc:
                messages.error(request, plain_words(exc))
        else:
            messages.error(request, f"Pick a quantity from 0 to {shop_settings.MAX_QUANTITY_PER_LINE}.")
        return redirect("checkout" if request.POST.get("next") == "checkout" else "cart")
    rows = _cart_rows(request)
    return render(request, "shop/cart.html", {
        "rows": rows, "total": cart.subtotal(rows), "problems": any(r.problem for r in rows),
        "reducible": cart.reducible(rows),
    })


def _coupon_choices(user, subtotal: Decimal) -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """The choices (each label says what the coupon does to this cart) and the same as data. A
    coupon worth more than the cart says so: the rest of it is lost (`shop.money.unused_discount`)."""
    choices, effects = [], {}
    for claim in selectors.usable_claims_for_user(user=user):
        code, worth = claim.coupon.code, claim.coupon.discount
        off, total = cart.with_coupon(subtotal, worth)
        unused = unused_discount(subtotal, worth)
        note = (f"This coupon is worth {money(worth)}; only {money(off)} of it applies to this order and the "
                f"other {money(unused)} is lost (a coupon is used once)." if unused else "")
        effects[code] = {"discount": money(off), "total": money(total), "unused": note}
        label = f"{money(off)} off (of its {money(worth)})" if unused else f"{money(off)} off"
        choices.append((code, f"{code}: {label}, total {money(total)}"))
    return choices, effects


def _checkout_page(request: HttpRequest, rows: list[cart.Line], form: CheckoutForm,
                   effects: dict[str, dict[str, str]], status: int = 200, retry: dict | None = None,
                   code_form: CouponCodeForm | None = None) -> HttpResponse:
    """`retry`: the order could not be placed now (busy, a timeout): the page says so and sends
    the same form again by itself in retry["in"] seconds (the same key: never two orders).
    `code_form`: the "Have a code?" box, bound when its code was refused."""
    subtotal = cart.subtotal(rows)
    code = form["coupon_code"].value() or ""
    chosen = effects.get(code, {"discount": money(0), "total": money(subtotal), "unused": ""})
    return render(request, "shop/checkout.html", {
        "rows": rows, "total": subtotal, "form": form, "problems": any(r.problem for r in rows),
        "reducible": cart.reducible(rows),
        "coupon_effects": effects, "chosen": chosen, "coupon_chosen": code in effects, "retry": retry,
        "code_form": code_form or CouponCodeForm(),
    }, status=status)


# The code of the coupon the buyer claimed last (session): checkout picks it until an order is placed.
JUST_CLAIMED = "shop.just_claimed"


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
@ratelimits.limit_posts("checkout")
def checkout(request: HttpRequest) -> HttpResponse:
    """Review the cart (flagged lines must be fixed first), pick a coupon, place the order."""
    rows = _cart_rows(request)
    codes, effects = _coupon_choices(request.user, cart.subtotal(rows))
    if request.method != "POST":
        # The coupon asked for, else the one just claimed in the coupon center (one click on
        # Place order must not pay full price for a buyer who just claimed a coupon).
        wanted = request.GET.get("coupon_code", request.session.get(JUST_CLAIMED, ""))
        return _checkout_page(request, rows, CheckoutForm(codes=codes, initial={"coupon_code": wanted}), effects)
    form = CheckoutForm(request.POST, codes=codes)
    # The same form posted again (double click, resubmit): show the order it already made.
    key = request.POST.get("idempotency_key", "")[:128]
    existing = request.user.orders.filter(idempotency_key=key).first() if key else None
    if existing is not None:
        return redirect("order", order_id=existing.pk)
    status = 200
    if not form.is_valid():
        messages.error(request, "Please check the form and try again.")
    elif not rows:
        messages.error(request, "Your cart is empty.")
    elif any(r.problem for r in rows):  # the page says so above the lines (#fix-first): once
        status = 409
    else:
        arrived_ms, arrived_us = arrivals.arrived(request)
        try:
            placed = place_order(
                user=request.user,
                lines=[(r.product_id, r.quantity) for r in rows],
                coupon_code=form.cleaned_data["coupon_code"] or None,
                idempotency_key=form.cleaned_data["idempotency_key"],
                deadline=deadlines.of_request(request),
                line_ticket=_line_ticket(request),
                arrived_ms=arrived_ms,
                arrived_us=arrived_us,
            )
        except errors.ShopError as exc:
            if exc.status in (202, 503):  # in line, or retryable: the same key, so a resubmit never orders twice
                coupon = form.cleaned_data["coupon_code"]
                form = CheckoutForm(codes=codes, initial={"idempotency_key": key, "coupon_code": coupon})
                retry = {"in": exc.retry_after or 1, "why": plain_words(
                    exc, {r.product_id: r.name for r in rows}, staff=request.user.is_staff)}
                if isinstance(exc, errors.InLine):
                    retry["line"] = _waiting(exc.details, key=key, coupon=coupon or "")
                response = _checkout_page(request, rows, form, effects, status=exc.status, retry=retry)
                response["Retry-After"] = str(exc.retry_after or 1)
                if isinstance(exc, errors.InLine):
                    _keep_ticket(request, response, exc.details.get("ticket", ""))
                if exc.status == 503 and lined([r.product_id for r in rows]):  # keeps its first arrival
                    at_ms = arrivals.brought(request) or int(clock.now().timestamp() * 1000)
                    stamp = arrivals.stamp(at_ms=at_ms, credential=arrivals.of_request(request))
                    response.set_cookie(arrivals.COOKIE, stamp, max_age=arrivals.MAX_AGE, httponly=True, samesite="Lax")
                return response
            messages.error(request, plain_words(exc, {r.product_id: r.name for r in rows},
                                                staff=request.user.is_staff))
            rows = _cart_rows(request)
            status = exc.status  # as the API answers it: 409 out of stock, over a cap, a drop's edge...
        else:
            cart.clear(request.session)
            request.session.pop(JUST_CLAIMED, None)
            if not placed.replayed:
                messages.success(request, "Thank you! Your order is placed.")
            return redirect("order", order_id=placed.order_id)
    # A fresh key for a fresh attempt; the coupon stays picked.
    chosen = form.cleaned_data.get("coupon_code", "") if form.is_valid() else ""
    return _checkout_page(request, rows, CheckoutForm(codes=codes, initial={"coupon_code": chosen}), effects,
                          status=status)


# --- a drop's line (shop/line/): the waiting page ------------------------------------------------
# The buyer's place in a drop's line is kept in this cookie (its signed ticket) between the
# checkout's answers: sent back with the order, it takes back the place if Redis lost the line.
LINE_COOKIE = "shop_line_ticket"


def _line_ticket(request: HttpRequest) -> str | None:
    """The ticket kept in the cookie if it is this account's (another account's, say on a shared
    computer, is left out: the order goes without it and the account's own place stands)."""
    text = request.COOKIES.get(LINE_COOKIE, "")
    return text if text and tickets.read(text, user_id=request.user.pk) is not None else None


def _keep_ticket(request: HttpRequest, response: HttpResponse, ticket: str) -> None:
    if ticket:
        response.set_cookie(LINE_COOKIE, ticket, max_age=24 * 3600, httponly=True, samesite="Lax",
                            secure=request.is_secure())


def _waiting(details: dict, *, key: str, coupon: str) -> dict:
    """What the waiting page shows and where it looks again (the line's JSON, and the page
    without JavaScript, which carries the order's key and coupon for its Try now button)."""
    pid = int(details["product_id"])
    wait = float(details.get("estimated_wait") or 0)
    return {"product_id": pid, "state": details.get("state"), "place": details.get("place"),
            "ahead": details.get("ahead"), "wait": max(1, math.ceil(wait)),
            "poll_in": board.poll_in(wait),
            "state_url": reverse("line_state", args=[pid]),
            "page_url": f"{reverse('line_page', args=[pid])}?{urlencode({'key': key, 'coupon': coupon})}"}


# What the waiting page's look answers, in the page's words (`state`: waiting, pre_queue,
# your_turn, in_checkout, sold_out, not_open, none).
_LOOKS = {"admitted": "your_turn", "started": "your_turn", "cut": "sold_out"}


def _look(request: HttpRequest, product_id: int) -> dict:
    """The buyer's place now (raises RedisError): no lock, no thread held, no turn begun."""
    position = board.look(product_id=product_id, user_id=request.user.pk,
                          ticket_text=request.COOKIES.get(LINE_COOKIE, ""))
    if position is None:
        return {"product_id": product_id, "state": "none", "poll_in": 1,
                "words": "You hold no place in this line: place your order to take one."}
    state = _LOOKS.get(position.state, position.state)
    found = {"product_id": product_id, "state": state, "place": position.place,
             "ahead": position.ahead if state == "waiting" else None,
             "estimated_wait": round(position.estimated_wait, 2), "retry_after": position.retry_after,
             "poll_in": board.poll_in(position.estimated_wait) if state in ("waiting", "pre_queue", "not_open") else 1}
    if state in ("waiting", "pre_queue"):
        found["words"] = plain_words(errors.InLine(details=position.details()))
    else:
        found["words"] = {
            "your_turn": "It is your turn: placing your order now.",
            "in_checkout": "Your order is being placed.",
            "sold_out": "Sold out: every unit of this drop is taken. Nothing was ordered or charged.",
            "not_open": "This drop is not open yet.",
        }.get(state, "")
    return found


@require_http_methods(["GET", "HEAD"])
def line_state(request: HttpRequest, product_id: int) -> JsonResponse:
    """The waiting page's look at the buyer's place (JSON, polled every `poll_in` s): the place,
    the number ahead, the estimate, "your_turn" (the page then sends its order) or "sold_out"."""
    if not request.user.is_authenticated:
        return api.error_response(401, "not_authenticated", "Log in to see your place in line.")
    try:
        found = _look(request, product_id)
    except RedisError:
        return api.shop_error_response(errors.LockUnavailable(details={"redis": "unreachable"}))
    response = JsonResponse(found, headers={"Cache-Control": "no-store"})
    response["Retry-After"] = str(found["poll_in"])
    return response


@login_required
@require_http_methods(["GET", "HEAD"])
def line_page(request: HttpRequest, product_id: int) -> HttpResponse:
    """The waiting page without JavaScript: a GET cannot send the order again, so it shows the
    place and the estimate, reloads itself after `poll_in` s (a meta refresh from the same
    Retry-After) and offers "Try now", a form that sends the order with its key (never twice)."""
    try:
        found = _look(request, product_id)
    except RedisError:
        found = {"product_id": product_id, "state": "unavailable", "poll_in": 5,
                 "words": plain_words(errors.LockUnavailable())}
    key = request.GET.get("key", "")[:128]
    response = render(request, "shop/line.html", {
        "line": found, "key": key, "coupon": request.GET.get("coupon", "")[:64],
        "refresh": found["poll_in"] if found["state"] not in ("sold_out", "your_turn", "none") else None,
    })
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
@ratelimits.limit_posts("coupon_claim")
def checkout_code(request: HttpRequest) -> HttpResponse:
    """The checkout's "Have a code?" box: claim the coupon and pick it in one step. A refused
    code is said beside the box (what was typed stays) and nothing is written."""
    form = CouponCodeForm(request.POST)
    if form.is_valid():
        try:
            claim = claim_for_checkout(user=request.user, code=form.cleaned_data["code"])
        except errors.InvalidInput:  # a code no coupon can have (too long, control characters)
            form.add_error("code", plain_words(errors.CouponUnknown()))
        except errors.ShopError as exc:
            form.add_error("code", plain_words(exc))
        else:
            messages.success(request, f"Coupon {claim.coupon.code} applied.")
            return redirect(f"{reverse('checkout')}?{urlencode({'coupon_code': claim.coupon.code})}")
    rows = _cart_rows(request)
    if not rows or any(r.problem for r in rows):  # the page shows no box to say it beside
        messages.error(request, " ".join(form.errors["code"]))
        return redirect("checkout")
    codes, effects = _coupon_choices(request.user, cart.subtotal(rows))
    return _checkout_page(request, rows, CheckoutForm(codes=codes), effects, code_form=form)


@login_required
def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    try:
        order = selectors.order_for_user(user=request.user, order_id=order_id)
    except errors.OrderNotFound:
        raise Http404("No such order") from None
    unused = unused_discount(order.subtotal, order.coupon.discount) if order.coupon else Decimal("0.00")
    return render(request, "shop/order.html", {"order": order, "coupon_unused": unused})


def _own_order(request: HttpRequest, order_id: int):
    try:
        return selectors.order_for_user(user=request.user, order_id=order_id)
    except errors.OrderNotFound:
        raise Http404("No such order") from None


@login_required
@require_POST
@ratelimits.limit_posts("pay")
def order_pay(request: HttpRequest, order_id: int) -> HttpResponse:
    """The "Pay" button (simulated provider): pay, then back to the order."""
    order = _own_order(request, order_id)
    try:
        pay_order(order=order, actor=f"user:{request.user.pk}")
        messages.success(request, f"Order #{order.pk} is paid. Thank you!")
    except errors.ShopError as exc:
        messages.error(request, plain_words(exc))
    return redirect("order", order_id=order.pk)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
@ratelimits.limit_posts("cancel")
def order_cancel(request: HttpRequest, order_id: int) -> HttpResponse:
    """Cancel an unpaid order: its stock and coupon go back. The order's Cancel is a link to this
    page (GET), which asks first and works without JavaScript; only its POST cancels."""
    order = _own_order(request, order_id)
    if request.method != "POST":
        if order.status != order.Status.PENDING_PAYMENT:
            return redirect("order", order_id=order.pk)
        return render(request, "shop/order_cancel.html", {"order": order})
    try:
        cancel_order(order=order, actor=f"user:{request.user.pk}", unpaid_only=True)
        messages.success(request, f"Order #{order.pk} cancelled.")
    except errors.ShopError as exc:
        messages.error(request, plain_words(exc))
    return redirect("order", order_id=order.pk)


@login_required
def my_orders(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/orders.html", {"orders": selectors.orders_for_user(user=request.user)[:100]})


def coupons(request: HttpRequest) -> HttpResponse:
    mine = set()
    if request.user.is_authenticated:
        mine = {c.coupon_id for c in selectors.claims_for_user(user=request.user)}
    return render(request, "shop/coupons.html", {"coupons": selectors.coupon_list(), "mine": mine})


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
@ratelimits.limit_posts("coupon_claim")
def coupon_claim(request: HttpRequest, code: str) -> HttpResponse:
    """Claim a coupon (POST). A GET (the login redirect after an anonymous claim) goes to the coupons."""
    if request.method != "POST":
        return redirect("coupons")
    try:
        claim_coupon(user=request.user, code=code)
    except errors.ShopError as exc:
        messages.error(request, plain_words(exc))
    else:
        request.session[JUST_CLAIMED] = code
        messages.success(request, f"Coupon {code} is yours: checkout picks it for your next order.")
    return redirect("coupons")


def safe_next(request: HttpRequest) -> str:
    """The `next` page asked for (POST or GET) if it is a path of this site; "" otherwise (the
    caller's default page). Only "/...": Django's own check (url_has_allowed_host_and_scheme, kept
    for other hosts and schemes) lets "foo" through, which the browser reads relative to the page
    and `redirect()` resolves as a URL name (a 500 when there is none). Control
    characters never go into a Location header either."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if not target.startswith("/") or not target.isprintable():
        return ""
    allowed = url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                              require_https=request.is_secure())
    return target if allowed else ""


class SafeNextMixin:
    """Django's auth views follow `next` by their own, looser check: ours is `safe_next`."""

    request: HttpRequest

    def get_redirect_url(self) -> str:
        return safe_next(self.request)


@require_http_methods(["GET", "HEAD", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """Create an account and log in; then back where the buyer was (`next`: the cart, a product...).
    Every POST counts against the per-IP sign-up limit, before the form is read."""
    form = SignUpForm(request.POST or None)
    if request.method == "POST":
        try:
            ratelimits.check(request, "signup")
        except errors.RateLimited as exc:
            return ratelimits.rate_limited_form(request, "registration/signup.html",
                                                {"form": form, "next": safe_next(request)}, exc)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user)
        messages.success(request, f"Welcome, {user.username}!")
        return HttpResponseRedirect(safe_next(request) or reverse("catalog"))  # a path, never a URL name
    return render(request, "registration/signup.html", {"form": form, "next": safe_next(request)})


class LoginView(SafeNextMixin, auth_views.LoginView):
    pass


class LogoutView(SafeNextMixin, auth_views.LogoutView):
    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        """Log out, and say so on the page it lands on (the session is gone: the message rides
        in the new, empty one)."""
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You are logged out.")
        return response


# Login is Django's view; every POST counts per client IP and per account tried.
login_view = ratelimits.limit_posts("login", "login_account")(LoginView.as_view())
logout_view = LogoutView.as_view()

# Password reset: Django's views and tokens, the site's templates. A request for a reset counts
# per client IP and per address asked for (each one may send a mail), and only queues the mail
# (QueuedPasswordResetForm): the same work and the same answer whether or not the address has an
# account; the `shop.send_mail` job sends it. The page the buyer was heading for waits in the
# session (the mail's link may not carry it) for the "log in" link at the end.
NEXT_AFTER_RESET = "shop.next_after_reset"
_password_reset = ratelimits.limit_posts("password_reset", "password_reset_address")(
    auth_views.PasswordResetView.as_view(form_class=QueuedPasswordResetForm))


def password_reset(request: HttpRequest) -> HttpResponse:
    if target := safe_next(request):
        request.session[NEXT_AFTER_RESET] = target
    return _password_reset(request)


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "next": self.request.session.pop(NEXT_AFTER_RESET, "")}


@never_cache  # the page shows a new token once: no browser or proxy may keep a copy
@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    new_token = None
    if request.method == "POST":
        if "revoke" in request.POST:
            token = ApiToken.objects.filter(user=request.user, pk=_posted_id(request, "revoke")).first()
            if token is not None:
                revoke(token=token)
                messages.success(request, f"Token {token.prefix}... revoked.")
            return redirect("api_tokens")
        try:  # per account, and per address (a farm of fresh accounts behind one address)
            ratelimits.check(request, "token_create")
            ratelimits.check(request, "token_create_ip")
        except errors.RateLimited as exc:
            return ratelimits.rate_limited_form(request, "shop/tokens.html", {
                "form": form, "new_token": None, "tokens": ApiToken.objects.filter(user=request.user)}, exc)
        if form.is_valid():
            new_token = ApiToken.issue(user_id=request.user.pk, name=form.cleaned_data["name"])
            form = TokenForm()
    return render(request, "shop/tokens.html", {
        "form": form, "new_token": new_token, "tokens": ApiToken.objects.filter(user=request.user),
    })
