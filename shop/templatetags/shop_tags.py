"""Template filters of the shop."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.conf import settings
from django.utils import timezone
from django.utils.formats import number_format

register = template.Library()


@register.filter
def money(value) -> str:
    """A price with the shop's currency (settings.SHOP_CURRENCY) and the active locale's grouping,
    e.g. "$1,658.00" ("-$5.00" below zero, "-" for none). The one money format of the web pages,
    the e-mails and the admin: Django's number_format, so a locale's separators come for free."""
    try:
        amount = Decimal(value).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    except (InvalidOperation, TypeError, ValueError):
        return "-"
    sign = "-" if amount < 0 else ""
    digits = number_format(abs(amount), decimal_pos=2, use_l10n=True, force_grouping=True)
    return f"{sign}{getattr(settings, 'SHOP_CURRENCY', '$')}{digits}"


# Pages of the account itself: their Log in / Sign up links pass on the page the buyer was heading
# for, never the account page (back to /login/ after logging in would be a loop).
ACCOUNT_PAGES = frozenset({"login", "signup", "password_reset", "password_reset_done", "password_reset_confirm",
                           "password_reset_complete"})


@register.simple_tag(takes_context=True)
def return_to(context) -> str:
    """Where the header's Log in / Sign up should bring the buyer back to ("" for the default)."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    if match is None:  # no request, or a 404
        return ""
    if match.url_name in ACCOUNT_PAGES:
        return context.get("next") or ""
    return request.get_full_path()


@register.filter
def time_until(value) -> str:
    """How long until `value`, short, as a drop's countdown says it without JavaScript: "45 s",
    "12 min", "2 h 5 min", "3 days" ("now" once it passed)."""
    if value is None:
        return ""
    seconds = math.ceil((value - timezone.now()).total_seconds())
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    hours, minutes = divmod(seconds // 60, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days"
