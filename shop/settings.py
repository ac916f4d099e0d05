"""Settings, read from the environment with working local defaults.

Every value can be set as an environment variable (or in a `.env` file beside manage.py; on a
development checkout also in the `.env.dev` that `./dev.sh` writes). A mistake fails at start
with a message that names the variable, not deep inside a request.
"""

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from locks import redis_urls

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Each file is read only when present and only fills names the environment lacks: exported
# variables win, then `.env` (yours), then `.env.dev`. `./dev.sh` writes `.env.dev` (DEBUG on and
# a generated SECRET_KEY, git- and docker-ignored) so that manage.py works from any shell on the
# laptop; a server has no such file, so nothing changes there. DEV_ENV_FILE names another file
# ("" for none: the test suite, which must not depend on a developer's file).
DEFAULT_DEV_ENV_FILE = str(BASE_DIR / ".env.dev")
# Where DEBUG came from, when a file set it: a server started from a developer's checkout says so
# at start (shop/wsgi.py, shop/asgi.py), loudly.
DEBUG_FROM_FILE = ""
for _env_file in (BASE_DIR / ".env", os.environ.get("DEV_ENV_FILE", DEFAULT_DEV_ENV_FILE)):
    if _env_file and os.path.isfile(_env_file):
        _debug_before = "DEBUG" in os.environ
        environ.Env.read_env(_env_file)
        if not _debug_before and "DEBUG" in os.environ:
            DEBUG_FROM_FILE = str(_env_file)


def _env_bool(name: str, default: bool) -> bool:
    raw = env.str(name, default=str(default)).strip().lower()
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off", ""}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use true or false.")


# Off unless asked for: a forgotten variable must never expose tracebacks and settings.
# `./dev.sh` turns it on for the laptop (its environment and `.env.dev`).
DEBUG = _env_bool("DEBUG", False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is false (e.g. python -c "
            "'from django.core.management.utils import get_random_secret_key as k; print(k())')."
        )
    SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_ratelimit",
    "locks",
    "shop",
    "loadtest",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "shop.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
ASGI_APPLICATION = "shop.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "shop.context_processors.cart_count",
            ],
        },
    },
]

# Start-up errors go to stderr and container logs: a URL in one is shown with its password masked
# (the masking error reports use), and the parser's own exception, which may quote it, is dropped.
_masked = redis_urls.mask_url_credentials

# --- MySQL / MariaDB -------------------------------------------------------------------------
DATABASE_URL = env.str("DATABASE_URL", default="mysql://root@127.0.0.1:3306/shop")
try:
    _db_scheme = urlsplit(DATABASE_URL).scheme
    _db = env.db_url_config(DATABASE_URL)
except Exception as exc:  # urllib and django-environ raise several types for a malformed URL
    raise ImproperlyConfigured(
        f"DATABASE_URL={_masked(DATABASE_URL)!r} cannot be parsed: {_masked(str(exc))}") from None
if _db_scheme not in {"mysql", "mysql2"}:
    raise ImproperlyConfigured(
        f"DATABASE_URL={_masked(DATABASE_URL)!r}: this project runs on MySQL/MariaDB only "
        "(e.g. mysql://root@127.0.0.1:3306/shop); its guarantees rely on InnoDB row locks."
    )
if not _db.get("NAME"):
    raise ImproperlyConfigured(f"DATABASE_URL={_masked(DATABASE_URL)!r} names no database (…:3306/shop).")
# Another Django backend for the same server, e.g. loadtest.mysql8 (MariaDB dressed as
# MySQL 8.4: how load tests run the MySQL 8 paths on a machine without MySQL 8).
if _engine := env.str("DATABASE_ENGINE", default=""):
    _db["ENGINE"] = _engine
# The Redis lock must cover COMMIT, so a request must never be one big transaction.
_db["ATOMIC_REQUESTS"] = False
# Persistent connections: a new MySQL connection per request cost a sold-out storm most of its
# time. Health checks drop a connection the server closed (wait_timeout, a restart) before use.
_db["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
_db["CONN_HEALTH_CHECKS"] = True
_db.setdefault("OPTIONS", {}).update(
    {"charset": "utf8mb4", "isolation_level": "read committed", "connect_timeout": 5}
)
_db["TEST"] = {
    "NAME": env.str("TEST_DATABASE_NAME", default=f"test_{_db['NAME']}"),
    "CHARSET": "utf8mb4",
    "COLLATION": "utf8mb4_unicode_ci",
}
DATABASES = {"default": _db}

# --- Redis (through django-redis, so pools, Sentinel and Cluster are configured the Django way) --
# REDIS_URL and LOCKS_REDIS_URL: redis://, rediss://, unix://, redis+sentinel://h:p,h:p/master/0
# or redis+cluster://h:p,h:p/0 (locks/redis_urls.py turns each into a CACHES entry).
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
LOCKS_REDIS_URL = env.str("LOCKS_REDIS_URL", default=REDIS_URL)
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=0.5)
if not 0 < REDIS_SOCKET_TIMEOUT <= 60:
    raise ImproperlyConfigured(f"REDIS_SOCKET_TIMEOUT={REDIS_SOCKET_TIMEOUT!r}: seconds, above 0 and at most 60.")


def _redis_cache(location: str, setting: str = "REDIS_URL") -> dict:
    return redis_urls.cache_config(location, setting=setting, socket_timeout=REDIS_SOCKET_TIMEOUT, pool_kwargs={
        "max_connections": env.int("REDIS_MAX_CONNECTIONS", default=200),
        "health_check_interval": 30,
    })


CACHES = {
    "default": _redis_cache(REDIS_URL, "REDIS_URL"),
    # Locks get their own alias: never IGNORE_EXCEPTIONS, never a replica or a shard.
    "locks": _redis_cache(LOCKS_REDIS_URL, "LOCKS_REDIS_URL"),
}

# --- which coordination service holds the locks (locks/backends/) --------------------------
LOCKS_BACKEND = env.str("LOCKS_BACKEND", default="redis")
if LOCKS_BACKEND not in {"redis", "redlock", "zookeeper", "mysql"}:
    raise ImproperlyConfigured(
        f"LOCKS_BACKEND={LOCKS_BACKEND!r}: use redis, redlock, zookeeper or mysql (e.g. LOCKS_BACKEND=redis)."
    )
LOCKS_REDLOCK_URLS = env.list("LOCKS_REDLOCK_URLS", default=[])
_REDLOCK_EXAMPLE = "LOCKS_REDLOCK_URLS=redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0,redis://10.0.0.3:6379/0"
for _url in LOCKS_REDLOCK_URLS:
    try:
        _parts = urlsplit(_url)
        _fine = _parts.scheme in {"redis", "rediss"} and bool(_parts.hostname)
    except ValueError:
        _fine = False
    if not _fine:
        raise ImproperlyConfigured(
            f"LOCKS_REDLOCK_URLS has {_masked(_url)!r}, not a redis:// URL (e.g. {_REDLOCK_EXAMPLE}).")
if LOCKS_BACKEND == "redlock" and len(LOCKS_REDLOCK_URLS) < 3:
    raise ImproperlyConfigured(
        f"LOCKS_BACKEND=redlock needs at least 3 independent Redis masters in LOCKS_REDLOCK_URLS "
        f"(5 is usual), e.g. {_REDLOCK_EXAMPLE}."
    )
LOCKS_ZOOKEEPER_HOSTS = env.str("LOCKS_ZOOKEEPER_HOSTS", default="127.0.0.1:2181")
for _host in LOCKS_ZOOKEEPER_HOSTS.split("/", 1)[0].split(","):
    _h, _, _p = _host.strip().rpartition(":")
    if not _h or not _p.isdigit():
        _shown = _masked(f"zk://{LOCKS_ZOOKEEPER_HOSTS}").removeprefix("zk://")  # the mask wants a scheme
        raise ImproperlyConfigured(
            f"LOCKS_ZOOKEEPER_HOSTS={_shown!r}: use host:port[,host:port...] "
            "(e.g. LOCKS_ZOOKEEPER_HOSTS=127.0.0.1:2181); credentials go in LOCKS_ZOOKEEPER_AUTH."
        )
# ZooKeeper digest auth, "user:password": the lock nodes are then created readable and writable
# by that user only (locks/backends/zookeeper.py). Never printed.
LOCKS_ZOOKEEPER_AUTH = env.str("LOCKS_ZOOKEEPER_AUTH", default="") or None
if LOCKS_ZOOKEEPER_AUTH is not None and not all(LOCKS_ZOOKEEPER_AUTH.partition(":")):
    raise ImproperlyConfigured("LOCKS_ZOOKEEPER_AUTH must be user:password (digest auth); the value is not shown.")

LOCKS = {
    "BACKEND": LOCKS_BACKEND,
    "REDLOCK_URLS": LOCKS_REDLOCK_URLS,
    "ZOOKEEPER_HOSTS": LOCKS_ZOOKEEPER_HOSTS,
    "ZOOKEEPER_AUTH": LOCKS_ZOOKEEPER_AUTH,
    "ZOOKEEPER_SESSION_TIMEOUT": env.float("LOCKS_ZOOKEEPER_SESSION_TIMEOUT", default=4.0),
    # Redis with replicas (Sentinel, Cluster): grant a lock only once this many replicas have it.
    "WAIT_REPLICAS": env.int("LOCKS_WAIT_REPLICAS", default=0),
    "CACHE_ALIAS": "locks",
    "KEY_PREFIX": env.str("LOCKS_KEY_PREFIX", default=""),
    "DEFAULT_TTL": env.float("LOCKS_DEFAULT_TTL", default=10.0),
    "DEFAULT_WAIT": env.float("LOCKS_DEFAULT_WAIT", default=3.0),
    # The lock dashboard also shows what a crowd is told (busy answers, deadlines): shop/overload.py.
    "DASHBOARD_PANELS": ["shop.overload.panel"],
}

# The shop's own settings (defaults and meaning in shop/conf.py).
def _rate_overrides(raw: str) -> dict[str, str | None]:
    """RATE_LIMITS="login=20/m,checkout=off": per-limit rates; "off" lifts one limit."""
    out: dict[str, str | None] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, rate = item.partition("=")
        name, rate = name.strip(), rate.strip()
        if not sep or not name or not rate:
            raise ImproperlyConfigured(f"RATE_LIMITS: {item!r} is not name=rate (e.g. login=10/m or login=off).")
        out[name] = None if rate.lower() == "off" else rate
    return out


# Shown before every price on the web pages (the `money` template filter).
SHOP_CURRENCY = os.environ.get("SHOP_CURRENCY", "$")  # not env.str: django-environ reads "$X" as a reference

SHOP = {
    "COMBINING": _env_bool("SHOP_COMBINING", True),
}
if _lanes := env.str("SHOP_COMBINE_LANES", default=""):  # shop/conf.py
    if not _lanes.isdigit():
        raise ImproperlyConfigured(f"SHOP_COMBINE_LANES={_lanes!r}: a number (0: one queue per product).")
    SHOP["COMBINE_LANES"] = int(_lanes)
if _stale := env.str("SHOP_STALE_TRANSACTIONS", default=""):  # auto, timeout, kill, off (shop/conf.py)
    SHOP["STALE_TRANSACTIONS"] = _stale
if _unpaid := env.str("SHOP_MAX_UNPAID_ORDERS", default=""):
    if _unpaid.lower() in {"off", "none"}:
        SHOP["MAX_UNPAID_ORDERS"] = None
    elif _unpaid.isdigit() and int(_unpaid) > 0:
        SHOP["MAX_UNPAID_ORDERS"] = int(_unpaid)
    else:
        raise ImproperlyConfigured(f"SHOP_MAX_UNPAID_ORDERS={_unpaid!r}: a positive number or 'off'.")
# A crowd bigger than the servers (shop/conf.py, docs/operations.md): waiting buyers per process,
# and the worker's queue for a thread.
for _name, _cast in (("MAX_WAITING", int), ("QUEUE_MAX", int), ("QUEUE_TARGET", float), ("QUEUE_INTERVAL", float)):
    if _raw := env.str(f"SHOP_{_name}", default=""):
        try:
            SHOP[_name] = _cast(_raw)
        except ValueError:
            SHOP[_name] = 0
        if SHOP[_name] <= 0:
            raise ImproperlyConfigured(f"SHOP_{_name}={_raw!r}: a number above 0"
                                       f"{' (seconds)' if _cast is float else ''}.")
if _rate_limit_env := _rate_overrides(env.str("RATE_LIMITS", default="")):
    SHOP["RATE_LIMITS"] = _rate_limit_env

# Prometheus /metrics (shop/metrics.py, docs/metrics.md): off (404) unless a bearer token and/or
# allowed client networks (CIDRs, matched against REMOTE_ADDR only) are set.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_IPS = env.list("METRICS_ALLOWED_IPS", default=[])
for _net in METRICS_ALLOWED_IPS:
    try:
        ipaddress.ip_network(_net.strip(), strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"METRICS_ALLOWED_IPS: {_net!r} is not an address or CIDR (e.g. 10.0.0.0/8,127.0.0.1)") from None

# --- Mail (order confirmations, password resets) -----------------------------------------------
# EMAIL_URL (django-environ: smtp://user:pass@host:25, smtp+tls://...:587, smtps://...:465,
# consolemail://) wins; otherwise EMAIL_HOST/EMAIL_PORT/EMAIL_HOST_USER/EMAIL_HOST_PASSWORD/
# EMAIL_USE_TLS/EMAIL_USE_SSL configure SMTP; with neither, development (DEBUG) prints mail to the
# console and production sends to SMTP on localhost:25.
EMAIL_URL = env.str("EMAIL_URL", default="")
if EMAIL_URL:
    try:
        globals().update(env.email_url_config(EMAIL_URL))
    except Exception as exc:  # an unknown scheme or a malformed URL
        raise ImproperlyConfigured(
            f"EMAIL_URL: {exc} (e.g. EMAIL_URL=smtp+tls://user:password@smtp.example.com:587)") from exc
else:
    EMAIL_HOST = env.str("EMAIL_HOST", default="")
    EMAIL_BACKEND = ("django.core.mail.backends.console.EmailBackend" if DEBUG and not EMAIL_HOST
                     else "django.core.mail.backends.smtp.EmailBackend")
    EMAIL_HOST = EMAIL_HOST or "localhost"
    EMAIL_PORT = env.int("EMAIL_PORT", default=25)
    EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
    EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
    EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
    EMAIL_USE_SSL = _env_bool("EMAIL_USE_SSL", False)
# A slow mail server holds up the Pay request that sends the confirmation: bound it.
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=10.0)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Flash sale <noreply@localhost>")
SERVER_EMAIL = env.str("SERVER_EMAIL", default=DEFAULT_FROM_EMAIL)
# Links in mail sent outside a request (the order confirmation) start with this.
SITE_URL = env.str("SITE_URL", default="http://127.0.0.1:8000").rstrip("/")

SESSION_ENGINE = "django.contrib.sessions.backends.db"
# Messages live in the session, not in a cookie the client can replay or forge.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# --- HTTPS and cookies (all off by default for the laptop; docs/production.env.example) -----
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = _env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = _env_bool("CSRF_COOKIE_SECURE", False)
# Behind a TLS-terminating proxy: "HTTP_X_FORWARDED_PROTO,https" (only if the proxy sets it).
_proxy_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])
if _proxy_header and len(_proxy_header) != 2:
    raise ImproperlyConfigured(
        f"SECURE_PROXY_SSL_HEADER={','.join(_proxy_header)!r}: a header and a value, "
        "e.g. HTTP_X_FORWARDED_PROTO,https."
    )
SECURE_PROXY_SSL_HEADER = tuple(_proxy_header) if _proxy_header else None

# Tracebacks and error reports mask passwords inside URLs (DATABASE_URL, REDIS_URL...).
DEFAULT_EXCEPTION_REPORTER_FILTER = "shop.reporting.SafeUrlExceptionReporterFilter"

# --- Rate limits (django-ratelimit, counted in the default Redis cache) ----------------------
# Rates per limit are SHOP["RATE_LIMITS"] (shop/conf.py); RATE_LIMITS="checkout=600/m,login=off"
# overrides some of them, RATELIMIT_ENABLE=false switches them all off (benchmark servers).
RATELIMIT_ENABLE = _env_bool("RATELIMIT_ENABLE", True)
RATELIMIT_USE_CACHE = "default"
RATELIMIT_FAIL_OPEN = True  # a count Redis could not give lets the request through
# Behind a proxy, REMOTE_ADDR is the proxy: name the header it sets (e.g. HTTP_X_REAL_IP).
RATELIMIT_IP_META_KEY = env.str("RATELIMIT_IP_META_KEY", default="") or None

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    {"NAME": "shop.passwords.NotBlankPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "catalog"
LOGOUT_REDIRECT_URL = "catalog"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"not_refusals": {"()": "shop.reporting.NotRefusals"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
    # Django logs every 4xx as a warning; in a flash sale most answers are 409 out_of_stock by
    # design, and a storm of them would cost a log line each. Server errors are still logged,
    # but not the 503s the shop answers on purpose (busy, lock_timeout: a crowd's excess).
    "loggers": {"django.request": {"level": env.str("REQUEST_LOG_LEVEL", default="ERROR"),
                                   "filters": ["not_refusals"]}},
}
