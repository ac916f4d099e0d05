"""Columns and values the shop's admin pages show: counts in words, money, times, a lock's state."""

from __future__ import annotations

from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime

from locks import inspect
from locks.admin_base import formatted_column
from locks.exceptions import LockUnavailable
from shop.templatetags.shop_tags import money


def count_of(count: int, noun: str) -> str:
    """"1 product", "2 products": messages say the number in words that agree with it."""
    return f"{count} {noun}{'s' if count != 1 else ''}"


def money_column(field: str, description: str):
    """A changelist column `<field>_money` showing `field` as the shop's pages do ("$1,658.00"), still sortable."""
    return formatted_column(field, description, money, "money")


def lock_state(name: str) -> str:
    try:
        info = inspect.lock_info(name)
    except LockUnavailable:
        return "unknown (Redis down)"
    if info is None:
        return "free"
    return f"held · {info.ttl_left:.1f}s left" + (f" · {info.waiters} waiting" if info.waiters else "")


def short_time(value) -> str:
    """"25 Nov 14:03" in the site's time zone, which may wrap before the time: dates that fit a
    1280 px list."""
    if value is None:
        return "-"
    value = localtime(value)
    return format_html('<span class="nowrap">{}</span> {}', date_format(value, "j M"), date_format(value, "H:i"))
