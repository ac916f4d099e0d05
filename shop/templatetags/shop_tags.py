"""Template filters of the shop."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django import template
from django.conf import settings

register = template.Library()


@register.filter
def money(value) -> str:
    """A price with the shop's currency (settings.SHOP_CURRENCY), e.g. "$12.50"; "-" for none."""
    try:
        amount = Decimal(value).quantize(Decimal("0.01"))
    except (InvalidOperation, TypeError, ValueError):
        return "-"
    return f"{getattr(settings, 'SHOP_CURRENCY', '$')}{amount}"
