"""Answer a lost database connection anywhere in a request with a 503, never a 500.

The services raise `DatabaseUnavailable` themselves (with the outcome of the order); this catches
the rest: a session or token lookup, a page's reads. The API answers with its JSON error
envelope, the web with a friendly page.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from shop import errors
from shop.edge import order_requests
from shop.plumbing.transactions import drop_connection, lost_connection


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, errors.DatabaseUnavailable):
            error = exc
        elif lost_connection(exc):
            drop_connection()
            error = errors.DatabaseUnavailable(details={"outcome": "unknown"})
        else:
            return None
        if order_requests.is_api_path(request.path_info):  # the worker's busy answers decide alike
            from shop.api.views import shop_error_response

            return shop_error_response(error)
        response = render(request, "shop/unavailable.html", {"error": error}, status=503)
        response["Retry-After"] = str(error.retry_after)
        return response
