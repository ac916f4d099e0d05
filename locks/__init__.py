"""Distributed locks for Django: fair hand-off, fencing tokens, leases, metrics, several backends.

    from locks import Lock, LockTimeout, LockNotOwned, LockUnavailable
    with Lock("product:42", ttl=10.0, wait=3.0) as held:
        held.fence, held.remaining()

The house, floor by floor; a module imports only from the floors below it:

    1  conf, exceptions, keys, histogram, scripts/, redis_urls, django_redis_cluster, checks, models, formats
    2  hold (Hold, CancelToken, Served, Guarded, LockLike), connection (Redis clients, clock, text)
    3  backends/base (the interface, optional combining), backends/ (registry), metrics, renewal, events
    4  backends/{redis,redlock,zookeeper,mysql}, stats  the coordination services; counting
    5  lock (the front door: Lock), inspect (reads dispatched to the backend, scrape gauges)
    6  combining, jobs, services, views, admin, templatetags, management commands, apps
"""

from locks.backends import capabilities
from locks.exceptions import HolderChanged, LockError, LockLost, LockNotOwned, LockTimeout, LockUnavailable
from locks.hold import Hold
from locks.lock import Lock, release_all, try_acquire_all

__all__ = ["Hold", "HolderChanged", "Lock", "LockError", "LockLost", "LockNotOwned", "LockTimeout", "LockUnavailable",
           "capabilities", "release_all", "try_acquire_all"]
