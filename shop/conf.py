"""The `SHOP` setting, with defaults (read on every access, like `locks.conf`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Take the Redis locks. Off, the guarded UPDATE alone still prevents oversell (slower under
    # contention: every buyer queues on the hot row inside MySQL instead of in Redis).
    "USE_LOCKS": True,
    "LOCK_TTL": 5.0,  # seconds: the lease of a product/coupon lock
    "LOCK_WAIT": 3.0,  # seconds a buyer waits for a busy product before lock_timeout
    # Input caps, shared by the services, the web forms and the API.
    "MAX_QUANTITY_PER_LINE": 100,
    "MAX_LINES_PER_ORDER": 20,
    "MAX_RESTOCK": 1_000_000,
    # Deadlock (1213), lock wait timeout (1205), stale fence or lost lock: retried this often.
    "RETRIES": 5,
    # Sold-out markers live in this cache's Redis, with this TTL (seconds). Services keep them
    # exact; the TTL bounds the damage of stock changed behind their back (raw SQL, a DB reset).
    "SOLDOUT_CACHE_ALIAS": "default",
    "SOLDOUT_TTL": 300,
}


class ShopSettings:
    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown SHOP setting {name!r}")
        return getattr(settings, "SHOP", {}).get(name, DEFAULTS[name])


shop_settings = ShopSettings()
