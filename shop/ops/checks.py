"""System checks of the shop (`manage.py check --database default`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connection

from shop.conf import DEFAULTS, RENAMED, shop_settings
from shop.plumbing import stale_transactions


@register()
def check_shop_keys(app_configs=None, **kwargs) -> list:
    """A misspelt or renamed key of SHOP would silently fall back to its default."""
    unknown = sorted(set(getattr(settings, "SHOP", {})) - set(DEFAULTS))
    return [Error(f'SHOP["{key}"] is not a setting of the shop.',
                  hint=(f'It was renamed: SHOP["{RENAMED[key]}"].' if key in RENAMED else
                        "The settings are listed in shop/conf.py (DEFAULTS)."), id="shop.E003")
            for key in unknown]


@register(Tags.database)
def check_stale_transactions(app_configs=None, databases=None, **kwargs) -> list:
    """How a holder paused past its lease is kept from stalling its product (I7)."""
    if not databases or "default" not in databases or connection.vendor != "mysql":
        return []
    chosen = str(shop_settings.STALE_TRANSACTIONS)
    if chosen not in stale_transactions.MODES:
        return [Error(f'SHOP["STALE_TRANSACTIONS"] is {chosen!r}.',
                      hint=f"One of {', '.join(stale_transactions.MODES)}.", id="shop.E001")]
    if chosen == "timeout" and not stale_transactions.supports_idle_timeout():
        return [Error('SHOP["STALE_TRANSACTIONS"] is "timeout", but this server has no idle_transaction_timeout '
                      "(MariaDB 10.3+ only).",
                      hint='Use "auto" or "kill" on MySQL.', id="shop.E002")]
    if chosen == "off":
        return [Warning('SHOP["STALE_TRANSACTIONS"] is "off": a lock holder paused past its lease stalls its '
                        "product for the whole pause (its MySQL transaction keeps the rows).",
                        hint='Use "auto".', id="shop.W001")]
    if stale_transactions.mode() == "kill":
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_USER()")
            (user,) = cursor.fetchone()
        return [Warning(f"Paused holders are ended by KILL of their MySQL connection (this server has no "
                        f"idle_transaction_timeout): only the connection that blocks a checkout's row and is "
                        f"recorded as an older holder of its lock is killed. The MySQL user ({user}) needs "
                        f"{stale_transactions.KILL_PRIVILEGES} (or every app server connects as the same user); "
                        f"without them a KILL is refused or never found, logged, and the product waits for the "
                        f"paused holder as before.",
                        hint="Silence with SILENCED_SYSTEM_CHECKS once this holds.", id="shop.W002")]
    return []


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


@register(Tags.security, deploy=True)
def check_site_url(app_configs=None, **kwargs) -> list:
    """The shop's mail (order paid, refunded, cancelled, expired) is sent by a job with no request
    to take the host from: its links start with SITE_URL, which defaults to the dev server's."""
    if settings.DEBUG or urlsplit(settings.SITE_URL).hostname not in LOOPBACK_HOSTS:
        return []
    return [Warning(f"SITE_URL is {settings.SITE_URL}: the links in the buyers' mail point at the buyer's own "
                    f"machine, not at the shop.",
                    hint="Set SITE_URL to the shop's public address, e.g. SITE_URL=https://shop.example.com.",
                    id="shop.W003")]
