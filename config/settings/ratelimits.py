"""Rate limits (django-ratelimit, counted in the default Redis cache).

Rates per limit are SHOP["RATE_LIMITS"] (shop/conf.py; the RATE_LIMITS variable overrides some of
them, in shop_values.py); RATELIMIT_ENABLE=false switches them all off (benchmark servers).
"""

from config.settings.environment import value

RATELIMIT_ENABLE = value("RATELIMIT_ENABLE")
RATELIMIT_USE_CACHE = "default"
RATELIMIT_FAIL_OPEN = True  # a count Redis could not give lets the request through
# Behind a proxy, REMOTE_ADDR is the proxy: name the header it sets (e.g. HTTP_X_REAL_IP).
RATELIMIT_IP_META_KEY = value("RATELIMIT_IP_META_KEY")
