"""HTTPS, cookies and sessions (all off by default for the laptop; docs/production.env.example)."""

from config.settings.environment import value

SECURE_SSL_REDIRECT = value("SECURE_SSL_REDIRECT")
SECURE_HSTS_SECONDS = value("SECURE_HSTS_SECONDS")
SECURE_HSTS_INCLUDE_SUBDOMAINS = value("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = value("SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = value("SESSION_COOKIE_SECURE")
CSRF_COOKIE_SECURE = value("CSRF_COOKIE_SECURE")
# Behind a TLS-terminating proxy: "HTTP_X_FORWARDED_PROTO,https" (only if the proxy sets it).
SECURE_PROXY_SSL_HEADER = value("SECURE_PROXY_SSL_HEADER")

SESSION_ENGINE = "django.contrib.sessions.backends.db"
# Messages live in the session, not in a cookie the client can replay or forge.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
