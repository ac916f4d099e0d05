"""The one retry policy: which failures are tried again, how many times, and the pause between,
in the shape of Celery's `autoretry_for` / `max_retries` / `retry_backoff` / `retry_jitter`.

Every retry loop of the shop counts with a `Budget` of a policy: the writer's transaction and a
service's (`with_retries`) on deadlocks and lock-wait timeouts, the settling of a request id,
and the checkout's queueing again after a lost lock. SHOP["RETRIES"] retries after the first
attempt; the n-th pause (from 0) is full jitter up to `retry_backoff` x 2^n seconds, and there
is no pause before giving up.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.db import OperationalError

import locks
from shop import errors
from shop.conf import shop_settings
from shop.plumbing import fence_refusals, stale_transactions
from shop.plumbing.locking import StaleFence

log = logging.getLogger("shop")

T = TypeVar("T")

# MySQL: 1213 deadlock, 1205 lock wait timeout. Both roll the transaction back: retry it.
ER_LOCK_WAIT_TIMEOUT = 1205
RETRYABLE_MYSQL = {1213, ER_LOCK_WAIT_TIMEOUT}


def transient(exc: BaseException) -> bool:
    """A failure that a new attempt may not meet: a deadlock or a lock-wait timeout (the
    transaction rolled back), a stale fence or a lost lock (nothing was written)."""
    if isinstance(exc, OperationalError):
        return bool(exc.args) and exc.args[0] in RETRYABLE_MYSQL
    return isinstance(exc, StaleFence | locks.LockLost)


def noticed(exc: BaseException, *, what: str) -> None:
    """What a transient failure tells the shop: a lock-wait timeout may be a paused holder's row
    (watched), a stale fence is counted as refused for `what`."""
    if isinstance(exc, OperationalError) and exc.args and exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
        stale_transactions.lock_wait_timed_out()
    elif isinstance(exc, StaleFence):
        fence_refusals.refused(exc.lock, operation=what)


def reason(exc: BaseException) -> str:
    return f"mysql {exc.args[0]}" if isinstance(exc, OperationalError) and exc.args else type(exc).__name__


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a failure of `autoretry_for` that is `transient`, at most `max_retries` times (None:
    SHOP["RETRIES"], read when a loop starts), pausing up to `retry_backoff` x 2^n seconds
    (all of it, or a random part with `retry_jitter`)."""

    autoretry_for: tuple[type[BaseException], ...] = ()
    max_retries: int | None = None
    retry_backoff: float = 0.005
    retry_jitter: bool = True

    def retries(self) -> int:
        return int(shop_settings.RETRIES) if self.max_retries is None else self.max_retries

    def retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.autoretry_for) and transient(exc)

    def pause(self, n: int) -> None:
        """The pause before the retry after the n-th failure (from 0)."""
        cap = self.retry_backoff * 2**n
        time.sleep(random.uniform(0, cap) if self.retry_jitter else cap)

    def budget(self) -> Budget:
        return Budget(self)

    def __call__(self, attempt: Callable[[], T], *, what: str) -> T:
        """`attempt()`, tried again on a retryable failure; `Conflict` once the retries are spent."""
        tries = self.budget()
        while True:
            try:
                return attempt()
            except self.autoretry_for as exc:
                if not self.retryable(exc):
                    raise
                noticed(exc, what=what)
                log.info("%s: retry %d after %s", what, tries.used + 1, reason(exc))
                if not tries.spend():
                    raise errors.Conflict(details={"retries": tries.retries}) from exc


class Budget:
    """One loop's count of failed attempts under a policy."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.retries = policy.retries()
        self.used = 0

    @property
    def left(self) -> bool:
        """Whether another attempt may be made."""
        return self.used <= self.retries

    def spend(self, *, pause: bool = True) -> bool:
        """Count a failed attempt. True if another may be made (after the policy's pause, unless
        `pause` is False: a failure that is no contention, or a wait that paced itself)."""
        n, self.used = self.used, self.used + 1
        if not self.left:
            return False
        if pause:
            self.policy.pause(n)
        return True


# A transaction that met a deadlock or a lock-wait timeout (the writer's, the settling of a request id).
DEADLOCKS = RetryPolicy(autoretry_for=(OperationalError,))
# A service's transaction under locks: deadlocks and lock-wait timeouts, a stale fence, a lost lock.
TRANSIENT = RetryPolicy(autoretry_for=(OperationalError, StaleFence, locks.LockLost))
# A checkout whose lock was lost before its request was written (the writer answered AGAIN).
LOST_LOCK = RetryPolicy()
