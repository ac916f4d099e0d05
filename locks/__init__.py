"""Distributed locks on Redis, for Django: fair hand-off, fencing tokens, leases, metrics.

    from locks import Lock, LockTimeout, LockNotOwned, LockUnavailable
    with Lock("product:42", ttl=10.0, wait=3.0) as held:
        held.fence, held.remaining()
"""

from locks.exceptions import HolderChanged, LockError, LockLost, LockNotOwned, LockTimeout, LockUnavailable
from locks.hold import Hold
from locks.lock import Lock

__all__ = ["Hold", "HolderChanged", "Lock", "LockError", "LockLost", "LockNotOwned", "LockTimeout", "LockUnavailable"]
