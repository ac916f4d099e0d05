"""System checks: each failure names the setting to fix (`manage.py check`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from locks.conf import DEFAULTS, locks_settings


@register(Tags.caches, Tags.database)
def check_locks_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    unknown = set(getattr(settings, "LOCKS", {})) - set(DEFAULTS)
    if unknown:
        errors.append(Error(
            f"Unknown LOCKS setting(s): {', '.join(sorted(unknown))}.",
            hint=f"Known: {', '.join(sorted(DEFAULTS))}.", id="locks.E001",
        ))
    alias = locks_settings.CACHE_ALIAS
    cache = settings.CACHES.get(alias)
    if cache is None:
        errors.append(Error(
            f"LOCKS['CACHE_ALIAS'] is {alias!r}, but CACHES has no such alias.",
            hint="Add it to CACHES or point LOCKS['CACHE_ALIAS'] at a django-redis cache.", id="locks.E002",
        ))
    else:
        if cache.get("BACKEND") != "django_redis.cache.RedisCache":
            errors.append(Error(
                f"CACHES[{alias!r}]['BACKEND'] must be 'django_redis.cache.RedisCache' for locks "
                f"(it is {cache.get('BACKEND')!r}).",
                hint="Locks need a raw Redis connection from django-redis (get_redis_connection).",
                id="locks.E003",
            ))
        options = cache.get("OPTIONS", {})
        client_class = options.get("CLIENT_CLASS", "django_redis.client.DefaultClient")
        # One primary per lock: not a shard ring, and not SentinelClient, which reads from a
        # replica (a lagging replica shows a held lock free). Sentinel and Cluster are fine the way
        # locks/redis_urls.py configures them: DefaultClient on the master (is_master=1), and
        # locks.django_redis_cluster.ClusterClient (each lock's keys in one slot, on that slot's master).
        if client_class.endswith(("ShardClient", "HerdClient", "SentinelClient")):
            errors.append(Error(
                f"CACHES[{alias!r}]['OPTIONS']['CLIENT_CLASS'] is {client_class}; locks need one primary.",
                hint="Set LOCKS_REDIS_URL to redis://..., redis+sentinel://h:p,h:p/<master>/0 (the master "
                     "only, DefaultClient) or redis+cluster://h:p,h:p/0 (locks.django_redis_cluster.ClusterClient).",
                id="locks.E004",
            ))
        if options.get("IGNORE_EXCEPTIONS"):
            errors.append(Error(
                f"CACHES[{alias!r}]['OPTIONS']['IGNORE_EXCEPTIONS'] is on: a Redis outage would look "
                "like a free lock.",
                hint="Give locks their own cache alias without IGNORE_EXCEPTIONS.", id="locks.E005",
            ))
    for alias_db, db in settings.DATABASES.items():
        if db.get("ATOMIC_REQUESTS"):
            errors.append(Error(
                f"DATABASES[{alias_db!r}]['ATOMIC_REQUESTS'] is True: the lock would be released before "
                "the request's COMMIT.",
                hint="Set ATOMIC_REQUESTS = False; services open their own durable transactions.",
                id="locks.E006",
            ))
        level = db.get("OPTIONS", {}).get("isolation_level", "read committed")
        if db.get("ENGINE", "").endswith("mysql") and level != "read committed":
            errors.append(Warning(
                f"DATABASES[{alias_db!r}]['OPTIONS']['isolation_level'] is {level!r}.",
                hint="Use 'read committed' (Django's default for MySQL): fewer gap locks and deadlocks.",
                id="locks.W001",
            ))
    ttl, wait, max_hold = (locks_settings.DEFAULT_TTL, locks_settings.DEFAULT_WAIT, locks_settings.MAX_HOLD)
    if not isinstance(ttl, (int, float)) or not 0.05 <= ttl <= 3600:
        errors.append(Error(f"LOCKS['DEFAULT_TTL'] = {ttl!r}: use seconds between 0.05 and 3600.",
                            id="locks.E007"))
    if not isinstance(wait, (int, float)) or not 0 <= wait <= 300:
        errors.append(Error(f"LOCKS['DEFAULT_WAIT'] = {wait!r}: use seconds between 0 and 300.",
                            id="locks.E008"))
    elif isinstance(ttl, (int, float)) and wait > 10 * ttl:
        errors.append(Warning(
            f"LOCKS['DEFAULT_WAIT'] ({wait}s) is more than 10x LOCKS['DEFAULT_TTL'] ({ttl}s).",
            hint="Callers would queue through many leases; shorten the wait or lengthen the TTL.",
            id="locks.W002",
        ))
    if not isinstance(max_hold, (int, float)) or (isinstance(ttl, (int, float)) and max_hold < ttl):
        errors.append(Error(f"LOCKS['MAX_HOLD'] = {max_hold!r} must be a number of seconds >= DEFAULT_TTL.",
                            id="locks.E009"))
    fraction = locks_settings.RENEW_FRACTION
    if not isinstance(fraction, (int, float)) or not 0.05 <= fraction <= 0.8:
        errors.append(Error(f"LOCKS['RENEW_FRACTION'] = {fraction!r}: renew between 5% and 80% of the TTL.",
                            id="locks.E010"))
    return errors
