"""The environment variables of the project: one table, and the one place the settings read them.

Every value can be set as an environment variable (or in a `.env` file beside manage.py; on a
development checkout also in the `.env.dev` that `./dev.sh` writes). Each variable is one entry of
VARIABLES below: its name, what it means, its default (`shown` as docs/configuration.md's
table shows it), how it is read and what is refused. The settings modules beside this one read a
variable only through `value(NAME)`, so a mistake fails at start with a message that names the
variable, not deep inside a request. A few variables are read outside the settings (gunicorn,
dev.sh, the image): their entries say where (`read_by`). tests/config/test_environment.py holds the
docs/configuration.md's table to this one, name for name and default for default.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from locks import redis_urls
from locks.backends import BACKENDS
from shop.conf import DEFAULTS as SHOP_DEFAULTS

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()

# Start-up errors go to stderr and container logs: a URL in one is shown with its password masked
# (the masking error reports use), and the parser's own exception, which may quote it, is dropped.
_masked = redis_urls.mask_url_credentials


class Invalid(ValueError):
    """A refused value: the start fails with "NAME=<the value read>: <this message>"."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


# An optional variable (a SHOP_* override) that is unset or empty: the default of shop/conf.py applies.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class Same:
    """A default that is another variable's value (LOCKS_REDIS_URL: REDIS_URL's)."""

    name: str


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    `kind`: how it is read: str (django-environ: "$OTHER" reads OTHER), raw (as given: "$" is a
    currency), bool (true/false, 1/0, yes/no, on/off), int, float or list (comma-separated).
    `default`: the value when unset (a `Same` for another variable's). `parse`: checks the value
    read and returns the setting's value; raises `Invalid` (or ImproperlyConfigured with a message
    of its own: one that must mask a password). `optional`: unset or empty gives UNSET (the SHOP
    overrides). `shown`: the default as docs/configuration.md shows it, when the value is not self-explaining
    (otherwise derived from `default` or `shop_default`, the key of shop/conf.py's DEFAULTS).
    `read_by`: the files that read it, for the few the settings do not read (`value` refuses them).
    """

    name: str
    meaning: str
    kind: str = "str"
    default: Any = ""
    parse: Callable[[Any], Any] | None = None
    optional: bool = False
    shop_default: str | None = None
    shown: str | None = None
    read_by: tuple[str, ...] = ()

    @property
    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        default = SHOP_DEFAULTS[self.shop_default] if self.shop_default else self.default
        return show(default)


def show(default: Any) -> str:
    """A default as docs/configuration.md shows it: `10`, `false`, `redis://...`, empty."""
    if isinstance(default, Same):
        return f"`{default.name}`"
    if default is None or default == "" or default == []:
        return "empty"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float):
        return f"`{default:g}`"
    if isinstance(default, list):
        return f"`{','.join(default)}`"
    return f"`{default}`"


# --- the checks --------------------------------------------------------------------------------
DEV_ONLY_SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"
REDLOCK_EXAMPLE = "LOCKS_REDLOCK_URLS=redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0,redis://10.0.0.3:6379/0"


def _secret_key(key: str) -> str:
    if key:
        return key
    if not value("DEBUG"):
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is false (e.g. python -c "
            "'from django.core.management.utils import get_random_secret_key as k; print(k())')."
        )
    return DEV_ONLY_SECRET_KEY


def _database_url(url: str) -> str:
    try:
        scheme = urlsplit(url).scheme
        config = env.db_url_config(url)
    except Exception as exc:  # urllib and django-environ raise several types for a malformed URL
        raise ImproperlyConfigured(
            f"DATABASE_URL={_masked(url)!r} cannot be parsed: {_masked(str(exc))}") from None
    if scheme not in {"mysql", "mysql2"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL={_masked(url)!r}: this project runs on MySQL/MariaDB only "
            "(e.g. mysql://root@127.0.0.1:3306/shop); its guarantees rely on InnoDB row locks."
        )
    if not config.get("NAME"):
        raise ImproperlyConfigured(f"DATABASE_URL={_masked(url)!r} names no database (…:3306/shop).")
    return url


def _redis_url(name: str) -> Callable[[str], str]:
    """Every form locks/redis_urls.py knows (redis://, rediss://, unix://, redis+sentinel://,
    redis+cluster://); its refusal names the variable, masks the password and gives examples."""

    def parse(url: str) -> str:
        redis_urls.cache_config(url, setting=name, socket_timeout=1.0)
        return url

    return parse


def _socket_timeout(seconds: float) -> float:
    if not 0 < seconds <= 60:
        raise Invalid("seconds, above 0 and at most 60.")
    return seconds


def _lock_backend(name: str) -> str:
    """One of the names locks.backends.get_backend resolves (its BACKENDS registry)."""
    if name not in BACKENDS:
        *first, last = BACKENDS
        raise Invalid(f"use {', '.join(first)} or {last} (e.g. LOCKS_BACKEND={TABLE['LOCKS_BACKEND'].default}).")
    return name


def _redlock_urls(urls: list[str]) -> list[str]:
    for url in urls:
        try:
            parts = urlsplit(url)
            fine = parts.scheme in {"redis", "rediss"} and bool(parts.hostname)
        except ValueError:
            fine = False
        if not fine:
            raise ImproperlyConfigured(
                f"LOCKS_REDLOCK_URLS has {_masked(url)!r}, not a redis:// URL (e.g. {REDLOCK_EXAMPLE}).")
    if value("LOCKS_BACKEND") == "redlock" and len(urls) < 3:
        raise ImproperlyConfigured(
            f"LOCKS_BACKEND=redlock needs at least 3 independent Redis masters in LOCKS_REDLOCK_URLS "
            f"(5 is usual), e.g. {REDLOCK_EXAMPLE}."
        )
    return urls


def _zookeeper_hosts(hosts: str) -> str:
    for host in hosts.split("/", 1)[0].split(","):
        h, _, p = host.strip().rpartition(":")
        if not h or not p.isdigit():
            shown = _masked(f"zk://{hosts}").removeprefix("zk://")  # the mask wants a scheme
            raise ImproperlyConfigured(
                f"LOCKS_ZOOKEEPER_HOSTS={shown!r}: use host:port[,host:port...] "
                "(e.g. LOCKS_ZOOKEEPER_HOSTS=127.0.0.1:2181); credentials go in LOCKS_ZOOKEEPER_AUTH."
            )
    return hosts


def _zookeeper_auth(auth: str) -> str | None:
    if auth and not all(auth.partition(":")):
        raise ImproperlyConfigured("LOCKS_ZOOKEEPER_AUTH must be user:password (digest auth); the value is not shown.")
    return auth or None


def _combine_lanes(raw: str) -> int | str:
    if raw.lower() == "auto":
        return "auto"
    if not raw.isdigit():
        raise Invalid("'auto' or a number (0: one queue per product).")
    return int(raw)


def _max_unpaid(raw: str) -> int | None:
    if raw.lower() in {"off", "none"}:
        return None
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    raise Invalid("a positive number or 'off'.")


def _above_zero(cast: type) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        try:
            number = cast(raw)
        except ValueError:
            number = 0
        if number <= 0:
            raise Invalid(f"a number above 0{' (seconds)' if cast is float else ''}.")
        return number

    return parse


def _head_slots(raw: str) -> int:
    """SHOP_HEAD_SLOTS_PER_CLIENT: a whole number, 0 for no bound (behind a proxy that is one client)."""
    if not raw.strip().isdigit():
        raise Invalid("a whole number (0: no bound).")
    return int(raw)


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


def _networks(nets: list[str]) -> list[str]:
    for net in nets:
        try:
            ipaddress.ip_network(net.strip(), strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"METRICS_ALLOWED_IPS: {net!r} is not an address or CIDR (e.g. 10.0.0.0/8,127.0.0.1)") from None
    return nets


def _email_url(url: str) -> str:
    if url:
        try:
            env.email_url_config(url)
        except Exception as exc:  # an unknown scheme or a malformed URL
            raise ImproperlyConfigured(
                f"EMAIL_URL: {exc} (e.g. EMAIL_URL=smtp+tls://user:password@smtp.example.com:587)") from exc
    return url


def _proxy_header(header: list[str]) -> tuple[str, str] | None:
    if header and len(header) != 2:
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER={','.join(header)!r}: a header and a value, e.g. HTTP_X_FORWARDED_PROTO,https."
        )
    return (header[0], header[1]) if header else None


def _port(port: str) -> int:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise Invalid("a port number (1-65535), e.g. PORT=8001.")
    return int(port)


def _none_if_empty(text: str) -> str | None:
    return text or None


DEFAULT_DEV_ENV_FILE = str(BASE_DIR / ".env.dev")

# --- the table ---------------------------------------------------------------------------------
# Grouped by the settings module that reads them (core, database, redis_locks, shop_values,
# ratelimits, metrics, mail, security, logs), then those read elsewhere.
VARIABLES: list[Variable] = [
    # core: Django itself
    Variable("DEBUG", "tracebacks and settings on error pages; off unless asked for, `./dev.sh` turns it on",
             kind="bool", default=False),
    Variable("SECRET_KEY", "Django's signing key; required when DEBUG is off", kind="raw", parse=_secret_key,
             shown="dev key when `DEBUG`"),
    Variable("DEV_ENV_FILE", "the development env file read when present, after `.env`; empty: none (the tests)",
             kind="raw", default=DEFAULT_DEV_ENV_FILE, shown="`.env.dev`"),
    Variable("ALLOWED_HOSTS", "host names the site answers to", kind="list",
             default=["127.0.0.1", "localhost", "testserver"]),
    Variable("CSRF_TRUSTED_ORIGINS", "origins trusted for unsafe requests (https://shop.example.com)", kind="list",
             default=[]),
    # database
    Variable("DATABASE_URL", "MySQL/MariaDB only (utf8mb4, READ COMMITTED)", default="mysql://root@127.0.0.1:3306/shop",
             parse=_database_url),
    Variable("DATABASE_ENGINE", "the Django database backend (another for the same server: loadtest.mysql8)",
             shown="`shop.plumbing.mysql`"),
    Variable("CONN_MAX_AGE", "seconds a database connection is kept (health-checked before reuse)", kind="int",
             default=60),
    Variable("TEST_DATABASE_NAME", "the test database (parallel test runs)", default=None, shown="`test_<db>`"),
    # redis_locks: Redis and the lock service
    Variable("REDIS_URL", "the default cache's Redis (rate limits, sold-out markers, stats)",
             default="redis://127.0.0.1:6379/0", parse=_redis_url("REDIS_URL")),
    Variable("LOCKS_REDIS_URL", "the Redis of the `locks` cache alias", default=Same("REDIS_URL"),
             parse=_redis_url("LOCKS_REDIS_URL")),
    Variable("REDIS_SOCKET_TIMEOUT", "seconds any Redis call may take (connect and read)", kind="float", default=0.5,
             parse=_socket_timeout),
    Variable("REDIS_MAX_CONNECTIONS", "django-redis pool size per process", kind="int", default=200),
    Variable("LOCKS_BACKEND", f"which service holds the locks: {', '.join(BACKENDS)} (locks/backends/)",
             default="redis", parse=_lock_backend),
    Variable("LOCKS_REDLOCK_URLS", "redlock: the independent Redis masters (3, 5 or 7 redis:// URLs)", kind="list",
             default=[], parse=_redlock_urls),
    Variable("LOCKS_ZOOKEEPER_HOSTS", "zookeeper: the ensemble, host:port[,host:port...][/chroot]",
             default="127.0.0.1:2181", parse=_zookeeper_hosts),
    Variable("LOCKS_ZOOKEEPER_SESSION_TIMEOUT", "zookeeper: seconds until a dead holder's lock passes on",
             kind="float", default=4.0),
    Variable("LOCKS_ZOOKEEPER_AUTH", "zookeeper: user:password (digest auth; never printed)", parse=_zookeeper_auth),
    Variable("LOCKS_WAIT_REPLICAS", "Redis with replicas: grant a lock once this many replicas have it", kind="int",
             default=0),
    Variable("LOCKS_KEY_PREFIX", "prepended to every lock key"),
    Variable("LOCKS_DEFAULT_TTL", "seconds: a lock's lease when not given", kind="float", default=10.0),
    Variable("LOCKS_DEFAULT_WAIT", "seconds: how long an acquire waits when not given", kind="float", default=3.0),
    # shop_values: the shop's own (SHOP, shop/conf.py)
    Variable("SHOP_CURRENCY", "shown before every price (pages, mail, admin)", kind="raw", default="$"),
    Variable("SHOP_COMBINING", "combining checkout for single-product orders", kind="bool", default=True),
    Variable("SHOP_COMBINE_LANES",
             "checkout lanes: products share this many queues (auto: 1 per two CPUs, 1 to 32; 0: one per product)",
             optional=True, parse=_combine_lanes, shop_default="COMBINE_LANES"),
    Variable("SHOP_STALE_TRANSACTIONS", "auto, timeout, kill or off (checked by `manage.py check`, shop.E001)",
             optional=True, shop_default="STALE_TRANSACTIONS"),
    Variable("SHOP_MAX_UNPAID_ORDERS", "orders awaiting payment one buyer may have (off: no limit)", optional=True,
             parse=_max_unpaid, shop_default="MAX_UNPAID_ORDERS"),
    Variable("SHOP_MAX_WAITING", "buyers of one process waiting in the products' lines at once", optional=True,
             parse=_above_zero(int), shown="threads minus a quarter"),
    Variable("SHOP_QUEUE_MAX", "requests waiting for a worker's thread before `busy`", optional=True,
             parse=_above_zero(int), shown="threads"),
    Variable("SHOP_QUEUE_TARGET", "CoDel: seconds a standing queue may hold a request", optional=True,
             parse=_above_zero(float), shop_default="QUEUE_TARGET"),
    Variable("SHOP_QUEUE_INTERVAL", "CoDel: seconds a request may wait while the queue drains", optional=True,
             parse=_above_zero(float), shop_default="QUEUE_INTERVAL"),
    Variable("SHOP_HEAD_TIMEOUT", "seconds a connection has to send a whole request before it is closed",
             optional=True, parse=_above_zero(float), shop_default="HEAD_TIMEOUT"),
    Variable("SHOP_HEAD_SLOTS_PER_CLIENT", "connections one client address may have still sending a request "
             "(0: no bound)", optional=True, parse=_head_slots, shop_default="HEAD_SLOTS_PER_CLIENT"),
    Variable("SHOP_LINES", "a line for each drop (false: drops sell without one, as before)", kind="bool",
             default=True),
    Variable("SHOP_LINE_DOOR", "the worker takes an API buyer's place in a drop's line before the app (false: "
             "the app does)", kind="bool", default=True),
    Variable("SHOP_LINE_WINDOW", "buyers of one drop's line let through to the checkout at once", optional=True,
             parse=_above_zero(int), shop_default="LINE_WINDOW"),
    Variable("SHOP_LINE_TURN", "seconds a buyer let through from a drop's line has to come", optional=True,
             parse=_above_zero(float), shop_default="LINE_TURN"),
    # ratelimits
    Variable("RATELIMIT_ENABLE", "false switches every rate limit off (benchmark servers)", kind="bool",
             default=True),
    Variable("RATE_LIMITS", "per-limit overrides of SHOP['RATE_LIMITS'], e.g. login=10/m,checkout=off",
             parse=_rate_overrides),
    Variable("RATELIMIT_IP_META_KEY", "behind a proxy: the header with the client address (HTTP_X_REAL_IP)",
             parse=_none_if_empty, shown="`REMOTE_ADDR`"),
    # metrics
    Variable("METRICS_TOKEN", "/metrics: the bearer token Prometheus sends"),
    Variable("METRICS_ALLOWED_IPS", "/metrics: the client networks allowed (CIDRs, REMOTE_ADDR only)", kind="list",
             default=[], parse=_networks),
    # mail
    Variable("EMAIL_URL", "where mail goes, as a django-environ URL (smtp+tls://user:password@host:587)",
             parse=_email_url),
    Variable("EMAIL_HOST", "SMTP host, without EMAIL_URL (neither, with DEBUG: the console)", shown="`localhost`"),
    Variable("EMAIL_PORT", "SMTP port, without EMAIL_URL", kind="int", default=25),
    Variable("EMAIL_HOST_USER", "SMTP user, without EMAIL_URL"),
    Variable("EMAIL_HOST_PASSWORD", "SMTP password, without EMAIL_URL"),
    Variable("EMAIL_USE_TLS", "SMTP STARTTLS, without EMAIL_URL", kind="bool", default=False),
    Variable("EMAIL_USE_SSL", "SMTP over TLS, without EMAIL_URL", kind="bool", default=False),
    Variable("EMAIL_TIMEOUT", "seconds an SMTP call may take", kind="float", default=10.0),
    Variable("DEFAULT_FROM_EMAIL", "the sender of the shop's mail", default="Flash sale <noreply@localhost>"),
    Variable("SERVER_EMAIL", "the sender of Django's error mail to ADMINS", default=Same("DEFAULT_FROM_EMAIL")),
    Variable("PORT", "the dev server's port on 127.0.0.1 (`./dev.sh run`); SITE_URL's default follows it",
             default="8000", parse=_port),
    Variable("SITE_URL", "the site's address in mail sent outside a request; unset: http://127.0.0.1:$PORT "
             "(the dev server's), on a server set it (`check --deploy` warns, shop.W003)",
             default="http://127.0.0.1:8000", parse=lambda url: url.rstrip("/")),
    # security: HTTPS and cookies
    Variable("SECURE_SSL_REDIRECT", "redirect http to https", kind="bool", default=False),
    Variable("SECURE_HSTS_SECONDS", "HSTS max-age", kind="int", default=0),
    Variable("SECURE_HSTS_INCLUDE_SUBDOMAINS", "HSTS for subdomains too", kind="bool", default=False),
    Variable("SECURE_HSTS_PRELOAD", "HSTS preload", kind="bool", default=False),
    Variable("SESSION_COOKIE_SECURE", "the session cookie over https only", kind="bool", default=False),
    Variable("CSRF_COOKIE_SECURE", "the CSRF cookie over https only", kind="bool", default=False),
    Variable("SECURE_PROXY_SSL_HEADER", "behind a TLS proxy: header,value (HTTP_X_FORWARDED_PROTO,https)",
             kind="list", default=[], parse=_proxy_header),
    # logs
    Variable("LOG_LEVEL", "the root logger's level", default="WARNING"),
    Variable("REQUEST_LOG_LEVEL", "Django's request logger's level (4xx refusals are not logged)", default="ERROR"),
    # read outside the settings
    Variable("WEB_WORKERS", "gunicorn workers (the image, compose)", default="4",
             read_by=("Dockerfile", "docker-compose.yml")),
    Variable("WEB_THREADS", "gunicorn threads per worker", default="16",
             read_by=("config/gunicorn.conf.py", "Dockerfile")),
    Variable("WEB_WORKER_CONNECTIONS", "connections one gunicorn worker holds", default="1000",
             read_by=("config/gunicorn.conf.py",)),
    Variable("PROMETHEUS_MULTIPROC_DIR", "gunicorn: where the workers write their metric files (emptied at start)",
             shown="a private one per server", read_by=("config/gunicorn.conf.py", "shop/ops/metrics.py")),
    Variable("GUNICORN_CONTROL_SOCKET", "gunicorn's control socket (gunicornc)",
             shown="`gunicorn.ctl` in that directory", read_by=("config/gunicorn.conf.py",)),
    Variable("SEED_DEMO", "1: `manage.py seed_demo` may create the demo data (superuser admin/admin)",
             shown="unset", read_by=("shop/management/commands/seed_demo.py", "Dockerfile")),
]
TABLE: dict[str, Variable] = {v.name: v for v in VARIABLES}
assert len(TABLE) == len(VARIABLES), "a variable is in the table twice"

# The names the settings have read in this process (tests: every entry is read somewhere).
READ: set[str] = set()
_NO_DEFAULT: Any = object()


def _bool(name: str, default: bool) -> bool:
    raw = env.str(name, default=str(default)).strip().lower()
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off", ""}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use true or false.")


def _read(var: Variable, default: Any) -> Any:
    if var.kind == "bool":
        return _bool(var.name, default)
    if var.kind == "raw":  # not env.str: django-environ reads "$X" as a reference to X
        return os.environ.get(var.name, default)
    if var.kind in {"int", "float"}:
        try:
            return getattr(env, var.kind)(var.name, default=default)
        except ValueError:
            whole = "a whole number" if var.kind == "int" else "a number"
            raise ImproperlyConfigured(f"{var.name}={os.environ.get(var.name)!r}: {whole}.") from None
    if var.kind == "list":
        return env.list(var.name, default=default)
    return env.str(var.name, default=default)


def value(name: str, *, default: Any = _NO_DEFAULT) -> Any:
    """The setting's value of environment variable `name`, read and checked as its entry says.
    `default`: one the reader computes (TEST_DATABASE_NAME: from the database's name)."""
    var = TABLE[name]  # KeyError: a variable the settings read is first added to VARIABLES
    if var.read_by:
        raise LookupError(f"{name} is read by {', '.join(var.read_by)}, not by the settings")
    READ.add(name)
    if var.optional:
        got = env.str(name, default="")
        if not got:
            return UNSET
    else:
        fallback = var.default if default is _NO_DEFAULT else default
        if isinstance(fallback, Same):
            fallback = value(fallback.name)
        got = _read(var, fallback)
    if var.parse is None:
        return got
    try:
        return var.parse(got)
    except Invalid as exc:
        raise ImproperlyConfigured(f"{name}={got!r}: {exc}") from None


# --- the env files -----------------------------------------------------------------------------
# Each file is read only when present and only fills names the environment lacks: exported
# variables win, then `.env` (yours), then `.env.dev`. `./dev.sh` writes `.env.dev` (DEBUG on and
# a generated SECRET_KEY, git- and docker-ignored) so that manage.py works from any shell on the
# laptop; a server has no such file, so nothing changes there. DEV_ENV_FILE names another file
# ("" for none: the test suite, which must not depend on a developer's file).
# Where DEBUG came from, when a file set it: a server started from a developer's checkout says so
# at start (config/wsgi.py, config/asgi.py), loudly.
DEBUG_FROM_FILE = ""
for _env_file in (BASE_DIR / ".env", value("DEV_ENV_FILE")):
    if _env_file and os.path.isfile(_env_file):
        _debug_before = "DEBUG" in os.environ
        environ.Env.read_env(_env_file)
        if not _debug_before and "DEBUG" in os.environ:
            DEBUG_FROM_FILE = str(_env_file)
