"""Taking the shop's locks: in one global order, mapped to shop errors, released safely.

Lock order is the deadlock rule: every service takes its locks through `held()` in one order
(products by id; a coupon's own lock for claim_coupon), so two requests can never wait on each
other in a cycle. A coupon claim used by an order, or an idempotency key, needs no lock: its row
(FOR UPDATE) and its unique key settle a race in MySQL (shop/checkout/writer.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.db import transaction

import locks
from shop import errors
from shop.conf import shop_settings
from shop.plumbing import stale_transactions

log = logging.getLogger("shop")


class StaleFence(Exception):
    """A guarded UPDATE was refused because a newer lock holder already wrote the row.

    `lock`: the name of the lock whose fence was refused (counted by `shop.plumbing.fence_refusals`)."""

    def __init__(self, lock: str) -> None:
        super().__init__(lock)
        self.lock = lock


def shop_lock(name: str, *, wait: float | None = None) -> locks.Lock:
    """The lock `name` with the shop's lease, wait (unless given) and watchdog settings."""
    return locks.Lock(name, ttl=shop_settings.LOCK_TTL, wait=shop_settings.LOCK_WAIT if wait is None else wait,
                      renew=True, max_hold=shop_settings.LOCK_MAX_HOLD)


def lock_error(exc: locks.LockTimeout | locks.LockUnavailable, *, lock: str) -> errors.ShopError:
    """The shop's error for the lock library's: the one translation (a waiter's time ran out, or
    the lock service could not be reached), naming the lock."""
    if isinstance(exc, locks.LockTimeout):
        return errors.LockTimeout(details={"lock": lock})
    return errors.LockUnavailable(details={"lock": lock, "redis": "unreachable"})


def refuse_outer_transaction(service: str) -> None:
    """The lock must cover COMMIT: inside an outer atomic block our COMMIT would be a savepoint."""
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError(
            f"{service}() must not run inside transaction.atomic (or ATOMIC_REQUESTS): the lock would be "
            "released before the outer transaction commits"
        )


@contextmanager
def held(names: list[str], *, use_locks: bool | None = None, wait: float | None = None,
         until: float | None = None) -> Iterator[dict[str, locks.Hold | None]]:
    """Hold every lock in `names` (already in lock order), each waited for up to `wait` (default
    LOCK_WAIT), and all of them taken by `until` (time.monotonic(), a request's deadline) if
    given. Yields name -> Hold (None if locks are off).

    A release that finds the lock gone (lease ran out after our COMMIT) is logged and counted by
    the lock's metrics; it never turns a committed order into a failure.
    """
    if use_locks is None:
        use_locks = shop_settings.USE_LOCKS
    holds: dict[str, locks.Hold | None] = dict.fromkeys(names)
    if not use_locks:
        yield holds
        return
    with ExitStack() as stack:
        # Runs last, after the locks: kill mode's records and hold lock are not the critical
        # section's work (until then they name an idle connection, which blocks no one).
        stack.callback(stale_transactions.forget, holds)
        for name in names:
            if until is not None:
                wait = max(0.0, until - time.monotonic())
            lock = shop_lock(name, wait=wait)
            try:
                hold = lock.__enter__()
            except (locks.LockTimeout, locks.LockUnavailable) as exc:
                raise lock_error(exc, lock=name) from exc
            holds[name] = hold
            stack.callback(release_safely, hold)
        stale_transactions.record(holds)
        yield holds


def release_safely(hold: locks.Hold) -> None:
    """Release after COMMIT: a lock already gone is logged (the fence kept the write safe)."""
    release_all_safely([hold])


def release_all_safely(holds: list[locks.Hold]) -> None:
    """`release_safely` for several holds, in one round trip."""
    try:
        lost = locks.release_all(holds)
    except locks.LockUnavailable:
        log.warning("lock %s: Redis unreachable at release; it expires with its lease",
                    ", ".join(h.name for h in holds))
        return
    for hold in lost:
        log.warning("lock %s expired before release (fence %s); the fence kept the write safe", hold.name,
                    hold.fence)


def check_before_commit(holds: dict[str, locks.Hold | None]) -> None:
    """Never commit on a lock we know we lost (the fence covers the cases we cannot know).

    Local knowledge only (renewal failures, our own clock): asking Redis would add a round trip
    to every order inside the hot product's critical section, and would not make the commit
    safer, because the fenced UPDATE already refuses a holder that was overtaken.
    """
    for hold in holds.values():
        if hold is not None:
            hold.check(verify=False)
