"""WSGI entry point (gunicorn config.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

from config.reporting import say_where_debug_came_from  # noqa: E402 (after the app is set up)

say_where_debug_came_from()
