"""Template filters of the shop."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.conf import settings
from django.utils import dateformat, timezone
from django.utils.formats import number_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from shop.plumbing import clock

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


# The badge of an order's status: green once settled, amber while the buyer still has to pay
# (not green like "Paid": nothing is settled yet), red once the order gave its stock back.
STATUS_BADGES = {"paid": "ok", "placed": "ok", "pending_payment": "wait"}


@register.filter
def status_badge(status: str) -> str:
    """The badge class of an order status (`.badge.ok`, `.badge.wait`, `.badge.out`)."""
    return STATUS_BADGES.get(status, "out")


@register.simple_tag
def order_note(order, date_only: bool = False) -> SafeString:
    """What became of an order that gave its stock back, with the amount and when: "Refunded
    $247.00 on 26 Nov 2026, 14:05 UTC", "Cancelled on ...", "Not paid in time: released on ..."
    ("" for an order that still holds it). The time is a <time class="local"> (the page's script
    shows it in the buyer's zone; `date_only`: the day alone, for the orders list)."""
    status = order.Status
    if order.status == status.REFUNDED:
        text, when = f"Refunded {money(order.total)} on ", order.refunded_at
    elif order.status == status.CANCELLED:
        text, when = "Cancelled on ", order.cancelled_at
    elif order.status == status.EXPIRED:
        text, when = "Not paid in time: released on ", order.cancelled_at
    else:
        return SafeString("")
    if when is None:
        return SafeString("")
    shown = dateformat.format(timezone.localtime(when), "j M Y" if date_only else "j M Y, H:i T")
    return format_html('{}<time class="{}" datetime="{}">{}</time>', text, "local date" if date_only else "local",
                       when.isoformat(), shown)


@register.filter
def time_until(value) -> str:
    """How long until `value` by the clock that decides drop windows (shop/plumbing/clock.py), short, as a
    drop's countdown says it without JavaScript: "45 s", "12 min", "2 h 5 min", "3 days" ("now"
    once it passed)."""
    if value is None:
        return ""
    seconds = math.ceil((value - clock.now()).total_seconds())
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


@register.simple_tag
def server_now() -> str:
    """Now by the clock that decides drop windows, in ISO 8601 with microseconds: what a page's
    script counts a drop's countdown from (`data-server-now`), so neither the buyer's clock nor
    this app server's moves the opening."""
    return clock.now().isoformat()
