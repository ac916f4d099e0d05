"""What the Sentinel and Cluster backend tests share: switch both Redis aliases to a URL."""

from __future__ import annotations

from locks import redis_urls
from locks.backends import get_backend


def use_redis_url(settings, url: str, **locks):
    """CACHES "locks" and "default" (sold-out markers, rate limits) on `url`, configured exactly as
    shop/settings.py configures LOCKS_REDIS_URL/REDIS_URL; LOCKS BACKEND stays "redis"."""
    cache = redis_urls.cache_config(url, setting="LOCKS_REDIS_URL", socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
                                    pool_kwargs={"max_connections": 200, "health_check_interval": 30})
    settings.CACHES = {**settings.CACHES, "locks": cache, "default": cache}
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "redis", **locks}
    backend = get_backend()
    assert backend.native and backend.supports_combining
    return backend
