"""Rate limits for the endpoints worth hammering: login, signup, password reset (per client IP and
per address asked for), token creation, coupon claims, checkout, pay and cancel, on the web and in
the API.

Counting is django-ratelimit's (fixed windows, one atomic INCR in the default Redis cache); the
rates are SHOP["RATE_LIMITS"] (defaults in shop/conf.py), looked up by name on every request so
tests and operators can change them without a restart of the code path. RATELIMIT_ENABLE=false
switches every limit off. A refused request raises `errors.RateLimited` (429 with Retry-After):
the API answers with its JSON error envelope, the web with templates/shop/rate_limited.html, or on
the sign-up and token pages with their own form and its error (`rate_limited_form`).

A limiter that cannot reach Redis lets the request through: the request then meets the lock,
which answers a Redis outage with its own fast 503, instead of a 500 from the limiter.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.crypto import salted_hmac
from django_ratelimit.core import get_usage

from shop import errors
from shop.conf import DEFAULTS

logger = logging.getLogger(__name__)


def login_account_key(group: str, request: HttpRequest) -> str:
    """The account a login POST tries, found as the login finds it: the form strips the name and
    NFKC-normalises it, and MariaDB's collation then matches it whatever its case, accents or
    ignorable characters. Keyed by the raw name, "Alice", " alice" and "ALICE " had a budget each.
    A name with no account counts as its stripped, casefolded self."""
    name = unicodedata.normalize("NFKC", request.POST.get("username", "").strip())
    user_model = get_user_model()
    field = user_model.USERNAME_FIELD
    pk = None
    if name and len(name) <= (user_model._meta.get_field(field).max_length or 254):  # else the form refuses it
        pk = user_model._default_manager.filter(**{field: name}).values_list("pk", flat=True).first()
    return f"user:{pk}" if pk is not None else f"name:{name.casefold()}"


def reset_address(group: str, request: HttpRequest) -> str:
    """The key of the per-address password reset limit: the address asked for, normalized
    (strip, casefold: "Ann@Example.com " is "ann@example.com") and hashed with the secret key, so
    the counters in Redis name no address. An unknown address counts exactly like a known one."""
    address = request.POST.get("email", "").strip().casefold()
    return salted_hmac("shop.ratelimits.reset_address", address).hexdigest()


@dataclass(frozen=True)
class Limit:
    name: str
    # django-ratelimit key: "ip", "user_or_ip", "post:username"..., or a callable (group, request) -> str
    key: str | Callable[[str, HttpRequest], str]


LIMITS: dict[str, Limit] = {
    "login": Limit("login", "ip"),
    "login_account": Limit("login_account", login_account_key),
    "signup": Limit("signup", "ip"),
    "password_reset": Limit("password_reset", "ip"),
    "password_reset_address": Limit("password_reset_address", reset_address),
    "token_create": Limit("token_create", "user_or_ip"),
    "token_create_ip": Limit("token_create_ip", "ip"),
    "coupon_claim": Limit("coupon_claim", "user_or_ip"),
    "checkout": Limit("checkout", "user_or_ip"),
    "pay": Limit("pay", "user_or_ip"),
    "cancel": Limit("cancel", "user_or_ip"),
}


def rate_for(name: str) -> str | None:
    """The configured rate of one limit ("10/m"), or None when that limit is lifted."""
    configured = getattr(settings, "SHOP", {}).get("RATE_LIMITS", {})
    return {**DEFAULTS["RATE_LIMITS"], **configured}.get(name)


def check(request: HttpRequest, name: str) -> None:
    """Count this request against limit `name`; raise `errors.RateLimited` once it is over."""
    limit = LIMITS[name]
    rate = rate_for(name)
    if rate is None:
        return
    try:
        usage = get_usage(request, group=f"shop.{name}", key=limit.key, rate=rate, increment=True)
    except Exception:  # Redis down or frozen: never a 500 from the limiter (see the module doc)
        logger.warning("rate limit %s not checked: the cache is unavailable", name, exc_info=True)
        return
    if usage is None or not usage["should_limit"]:
        return
    retry_after = max(1, int(usage["time_left"]))
    raise errors.RateLimited(
        details={"limit": name, "rate": rate, "retry_after": retry_after}, retry_after=retry_after,
    )


def rate_limited_page(request: HttpRequest, exc: errors.RateLimited) -> HttpResponse:
    """The web's friendly 429."""
    response = render(request, "shop/rate_limited.html", {"retry_after": exc.retry_after}, status=429)
    response["Retry-After"] = str(exc.retry_after)
    return response


def rate_limited_form(request: HttpRequest, template: str, context: dict[str, Any],
                      exc: errors.RateLimited) -> HttpResponse:
    """The web's 429 on a form page (sign-up, API tokens): the same page and form, what was typed
    kept, and the form's error saying how long to wait."""
    form = context["form"]
    seconds = exc.retry_after
    form.add_error(None, f"Too many tries from here: please wait about {seconds} second{'s' if seconds != 1 else ''} "
                         f"and try again. Nothing was created.")
    response = render(request, template, context, status=429)
    response["Retry-After"] = str(exc.retry_after)
    return response


def limit_posts(*names: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Web view decorator: every POST counts against each named limit; over one, the 429 page."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method == "POST":
                try:
                    for name in names:
                        check(request, name)
                except errors.RateLimited as exc:
                    return rate_limited_page(request, exc)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate
