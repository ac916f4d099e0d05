"""Error reports (the DEBUG page, mails to ADMINS) that never show a password inside a URL.

Django hides settings whose *name* looks secret (PASSWORD, SECRET, KEY...), but DATABASE_URL,
REDIS_URL and LOCKS_REDIS_URL carry their password inside the value, and so do the cache
LOCATIONs built from them and the environment a server passes in request.META.
"""

from __future__ import annotations

import logging
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

from locks.redis_urls import mask_url_credentials

__all__ = ["NotRefusals", "SafeUrlExceptionReporterFilter", "mask_url_credentials"]


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        return mask_url_credentials(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_mask(v) for v in value)
    return value


class SafeUrlExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus URL passwords masked in settings, request.META and frame variables."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        return _mask(super().cleanse_setting(key, value))

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        return [(name, _mask(value)) for name, value in super().get_traceback_frame_variables(request, tb_frame)]


class NotRefusals(logging.Filter):
    """Django's request log, without the 503s the shop answers on purpose: busy and lock_timeout
    (a crowd's excess, thousands a second in a drop), lock_unavailable, database_unavailable and
    conflict (retryable; each is logged where it happens and counted in /metrics)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "status_code", None) != 503


def say_where_debug_came_from() -> None:
    """A server started from a checkout where ./dev.sh wrote .env.dev runs with DEBUG on: say it,
    loudly, at start (config/wsgi.py and config/asgi.py call this)."""
    import sys

    from django.conf import settings

    if settings.DEBUG and settings.DEBUG_FROM_FILE:
        print(f"\n!!! DEBUG is on, read from {settings.DEBUG_FROM_FILE} (./dev.sh writes it for a laptop): "
              "tracebacks and settings are shown to anyone who gets an error page. Never serve the "
              "public like this: remove that file or start with DEV_ENV_FILE= (and DEBUG unset). !!!\n",
              file=sys.stderr, flush=True)
