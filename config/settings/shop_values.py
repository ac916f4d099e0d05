"""The shop's own settings: SHOP (defaults and meaning in shop/conf.py; the environment overrides
a few) and the currency shown before prices."""

from config.settings.environment import UNSET as _UNSET
from config.settings.environment import value

# Shown before every price on the web pages (the `money` template filter), in mail and the admin.
SHOP_CURRENCY = value("SHOP_CURRENCY")

SHOP = {
    "COMBINING": value("SHOP_COMBINING"),
    "LINES": value("SHOP_LINES"),
    "LINE_DOOR": value("SHOP_LINE_DOOR"),
}
# Set only when the environment says so: otherwise shop/conf.py's default applies. Checkout lanes,
# how paused holders are ended, the unpaid-orders limit, and a crowd bigger than the servers
# (docs/operations.md): waiting buyers per process, and the worker's queue for a thread.
for _key in ("COMBINE_LANES", "STALE_TRANSACTIONS", "MAX_UNPAID_ORDERS", "MAX_WAITING", "QUEUE_MAX", "QUEUE_TARGET",
             "QUEUE_INTERVAL", "HEAD_TIMEOUT", "HEAD_SLOTS_PER_CLIENT", "LINE_WINDOW", "LINE_TURN"):
    if (_override := value(f"SHOP_{_key}")) is not _UNSET:
        SHOP[_key] = _override
# RATE_LIMITS="checkout=600/m,login=off" overrides some of SHOP["RATE_LIMITS"] (shop/edge/ratelimits.py).
if _rate_limits := value("RATE_LIMITS"):
    SHOP["RATE_LIMITS"] = _rate_limits
