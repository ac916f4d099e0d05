"""WSGI entry point (gunicorn shop.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
application = get_wsgi_application()

from shop.reporting import say_where_debug_came_from  # noqa: E402 (after the app is set up)

say_where_debug_came_from()
