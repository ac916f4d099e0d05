"""Template context for every page: the header's cart count and whether its menu links to the
API tokens page."""

from __future__ import annotations

from functools import cache

from django.http import HttpRequest

from shop.reads import selectors
from shop.web import cart


def cart_count(request: HttpRequest) -> dict:
    """Lazy: pages that never show the header (the database-down page) never read the session."""
    return {"cart_count": lambda: cart.count(request.session)}


def api_tokens_link(request: HttpRequest) -> dict:
    """Lazy and read once a page (the header includes the account links twice)."""
    return {"shows_api_tokens": cache(lambda: selectors.shows_api_tokens(user=request.user))}
