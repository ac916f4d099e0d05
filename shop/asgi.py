"""ASGI entry point."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
application = get_asgi_application()


def _say_where_debug_came_from() -> None:
    """A server started from a checkout where ./dev.sh wrote .env.dev runs with DEBUG on: say it."""
    import sys

    from django.conf import settings

    if settings.DEBUG and settings.DEBUG_FROM_FILE:
        print(f"\n!!! DEBUG is on, read from {settings.DEBUG_FROM_FILE} (./dev.sh writes it for a laptop): "
              "tracebacks and settings are shown to anyone who gets an error page. Never serve the "
              "public like this: remove that file or start with DEV_ENV_FILE= (and DEBUG unset). !!!\n",
              file=sys.stderr, flush=True)


_say_where_debug_came_from()
