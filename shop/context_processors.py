"""Template context for every page: the header's cart count."""

from __future__ import annotations

from django.http import HttpRequest

from shop import cart


def cart_count(request: HttpRequest) -> dict:
    """Lazy: pages that never show the header (the database-down page) never read the session."""
    return {"cart_count": lambda: cart.count(request.session)}
