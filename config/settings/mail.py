"""Mail (order confirmations, password resets).

EMAIL_URL (django-environ: smtp://user:pass@host:25, smtp+tls://...:587, smtps://...:465,
consolemail://) wins; otherwise EMAIL_HOST/EMAIL_PORT/EMAIL_HOST_USER/EMAIL_HOST_PASSWORD/
EMAIL_USE_TLS/EMAIL_USE_SSL configure SMTP; with neither, development (DEBUG) prints mail to the
console and production sends to SMTP on localhost:25.
"""

from config.settings.core import DEBUG
from config.settings.environment import env, value

EMAIL_URL = value("EMAIL_URL")
if EMAIL_URL:
    globals().update(env.email_url_config(EMAIL_URL))
else:
    EMAIL_HOST = value("EMAIL_HOST")
    EMAIL_BACKEND = ("django.core.mail.backends.console.EmailBackend" if DEBUG and not EMAIL_HOST
                     else "django.core.mail.backends.smtp.EmailBackend")
    EMAIL_HOST = EMAIL_HOST or "localhost"
    EMAIL_PORT = value("EMAIL_PORT")
    EMAIL_HOST_USER = value("EMAIL_HOST_USER")
    EMAIL_HOST_PASSWORD = value("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = value("EMAIL_USE_TLS")
    EMAIL_USE_SSL = value("EMAIL_USE_SSL")
# A slow mail server holds up the Pay request that sends the confirmation: bound it.
EMAIL_TIMEOUT = value("EMAIL_TIMEOUT")
DEFAULT_FROM_EMAIL = value("DEFAULT_FROM_EMAIL")
SERVER_EMAIL = value("SERVER_EMAIL")  # DEFAULT_FROM_EMAIL unless set
# Links in mail start with this: the jobs that send it have no request to take the host from.
# Unset, it is the dev server's address, on the port it serves (PORT, which ./dev.sh run exports
# to the server and the jobs runner alike); a server sets it (check --deploy: shop.W003).
SITE_URL = value("SITE_URL", default=f"http://127.0.0.1:{value('PORT')}")
