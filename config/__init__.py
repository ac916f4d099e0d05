"""The project around the shop app: settings, urls, the WSGI/ASGI entry points, the gunicorn
worker and its config, error reports and date formats (docs/design.md, "The house")."""
