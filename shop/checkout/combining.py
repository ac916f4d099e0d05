"""Combining: the buyers of one product queue on its lock; whoever holds it commits the queue in
one batch, and a buyer whose wait runs out settles its request id, so every outcome is
determinable. How, step by step, and why: docs/design.md, "The path of one checkout"
(combining, lanes, replies and release)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import IntegrityError, InterfaceError, OperationalError
from redis.exceptions import RedisError

import locks
from locks import combining
from shop import errors
from shop.checkout import protocol, writer
from shop.checkout.protocol import Placed, Refused, Request, Result
from shop.conf import shop_settings
from shop.models import CheckoutRequest
from shop.plumbing import hooks, lock_names, stale_transactions
from shop.plumbing.lock_names import lane_lock, product_lock
from shop.plumbing.locking import lock_error, shop_lock
from shop.plumbing.retries import DEADLOCKS
from shop.plumbing.transactions import drop_connection, durable_transaction, lost_connection

log = logging.getLogger("shop")


def queue(mine: Request, *, wait: float, guards: Sequence[str] = ()) -> Result | combining.Guarded:
    """One pass: queue `mine` on its product's lock; serve a batch if the lock comes to us.
    `protocol.AGAIN` when the lock was lost before our request was committed: queue again.
    `guards`: keys that stop the request before it queues (`Guarded`: the sold-out check)."""
    lanes = lock_names.lanes()
    lock = shop_lock(lane_lock(mine.lines[0][0], lanes=lanes))
    if wait <= 0:
        return _settled(mine) or Refused.of(errors.LockTimeout(details={"lock": lock.name}))
    try:
        # A lane's holder takes its batch's product locks with the batch (one round trip).
        needs = [product_lock(mine.lines[0][0])] if lanes > 0 else []
        got = combining.submit(lock, mine.payload(), wait=wait, guards=guards, needs=needs)
    except (locks.LockTimeout, locks.LockUnavailable) as exc:
        # Committed by a combiner whose reply we did not wait for, or never; or Redis failed us,
        # but a combiner may have taken our request: the request id in MySQL says.
        return _settled(mine) or Refused.of(lock_error(exc, lock=lock.name))
    if isinstance(got, combining.Guarded):
        return got
    result = (protocol.from_json(got.reply) if isinstance(got, combining.Served)
              else _take_turn(got, mine=mine, lanes=lanes))
    if (isinstance(result, Refused) and result.code == errors.DatabaseUnavailable.code
            and result.details.get("outcome") == "unknown"):
        return _settled(mine) or Refused.of(errors.DatabaseUnavailable(details={"outcome": "not_written"}))
    return settle_failure(mine, result)


# Failures that say "we stopped waiting", not "nothing can be committed": a holder that took the
# request earlier and lost its lock (lapsed, forced out) may still commit it.
UNSETTLED = (errors.LockTimeout.code, errors.LockUnavailable.code)


def settle_failure(mine: Request, result: Result) -> Result:
    """`result`, unless it is a wait's failure (`UNSETTLED`): then the request id is settled
    first, so the buyer is told either the order an earlier holder committed or a failure that
    stays true (I5). A combiner's deadline refusal, a lane's hand-back that timed out on the
    product's lock: the request may still sit in the batch of a holder that lost its lock."""
    if isinstance(result, Refused) and result.code in UNSETTLED:
        return _settled(mine) or result
    return result


def _settled(mine: Request) -> Placed | None:
    """Claim our request id as given up. None: nothing was committed for it, and nothing will be.
    Placed: a combiner committed it (its INSERT of the same id came first). The INSERT may wait
    for a combiner's transaction that has our id; a deadlock or lock-wait timeout with it is tried
    again. A lost connection, or a combiner's transaction that still holds our id after the
    retries, leaves the outcome unknown: `database_unavailable` says so (a retry with the
    request's Idempotency-Key settles it), never "not written" for an order it may commit."""
    tries = DEADLOCKS.budget()
    while True:
        try:
            try:
                with durable_transaction():
                    CheckoutRequest.objects.create(request_id=mine.id)
                return None
            except IntegrityError:
                claim = CheckoutRequest.objects.select_related("order").get(request_id=mine.id)
                return None if claim.order is None else Placed.of(claim.order, replayed=False)
        except errors.DatabaseUnavailable as exc:  # our claim was not written: the order's fate is not known
            raise errors.DatabaseUnavailable(details={"outcome": "unknown"}) from exc
        except (OperationalError, InterfaceError) as exc:
            lost = lost_connection(exc)
            if lost:
                drop_connection()
            elif not DEADLOCKS.retryable(exc):
                raise
            if lost or not tries.spend():
                raise errors.DatabaseUnavailable(details={"outcome": "unknown"}) from exc


def _take_turn(turn: combining.Turn, *, mine: Request, lanes: int) -> Result:
    """Serve our request and the batch queued behind us; reply to each; release. A lane's
    holder takes its batch's product locks with the batch (`turn.also`) and lets them go with
    the replies."""
    replies: dict[str, str] = {}
    try:
        taken: list[Request] = []
        hooks.call("before_take", {turn.hold.name: turn.hold})
        try:
            try:
                taken = [Request.from_payload(r.payload, deadline=r.deadline, token=r.token)
                         for r in turn.take(int(shop_settings.COMBINE_BATCH) - 1,
                                            lock_of=shop_lock if lanes > 0 else None)]
            except locks.LockUnavailable as exc:
                # Redis went away under us: nothing committed. Requests the take may have moved
                # are woken when our hold ends without replying, and queue again.
                raise lock_error(exc, lock=turn.hold.name) from exc
            except locks.LockNotOwned:
                # Our lease lapsed before we took anyone (a long pause under load): the next in
                # line has the lock and the queue. Nobody took our request and nothing was
                # written: it queues again.
                log.warning("combining: lock %s lapsed before its holder took the queue; queueing again",
                            turn.hold.name)
                return protocol.AGAIN
            if lanes > 0:
                results = _write_lane([mine, *taken], also=turn.also)
            else:
                stale_transactions.record({turn.hold.name: turn.hold})
                results = writer.write([mine, *taken], holds={mine.lines[0][0]: turn.hold})
        except errors.ShopError as exc:  # the database went away: every request shares the outcome
            results = {r.id: Refused.of(exc) for r in [mine, *taken]}
        except Exception:
            # Unexpected: the transaction rolled back, nothing was written. Tell the others to
            # come again (their own turn will show the error if it persists), then raise.
            replies = {r.token: protocol.to_json(protocol.AGAIN) for r in taken if r.token}
            raise
        replies = {r.token: protocol.to_json(results[r.id]) for r in taken if r.token}
    finally:
        _end_turn(turn, replies)
    return results[mine.id]


def _write_lane(requests: list[Request], *, also: dict[str, locks.Hold]) -> dict[str, Result]:
    """A lane's batch: the orders of every product whose lock came with the batch (`also`:
    taken without waiting, released after the transaction) in one transaction; a product whose
    lock was busy goes back to its buyers (ALONE: they take it themselves, in its own FIFO line)."""
    product_ids = sorted({r.lines[0][0] for r in requests})
    holds: writer.Holds = {pid: also[product_lock(pid)] for pid in product_ids if product_lock(pid) in also}
    results: dict[str, Result] = {r.id: protocol.ALONE for r in requests if r.lines[0][0] not in holds}
    writable = [r for r in requests if r.lines[0][0] in holds]
    if writable:
        stale_transactions.record(also)
        results.update(writer.write(writable, holds=holds))
    return results


def _end_turn(turn: combining.Turn, replies: dict[str, str]) -> None:
    """Release the product locks a lane's holder took (after COMMIT) and reply, in one round
    trip, then release the turn (its hand-off). Not one round trip for all: the buyers answered
    while the turn is still held queue again before it moves on, so batches stay larger and the
    hot product sells more (docs/benchmarks.md, "Checkout lanes": "Tried and dropped"). Kill
    mode's holder records go last, outside the critical section (until then they name an idle
    connection)."""
    also = list(turn.also.values())
    try:
        try:
            for hold in turn.reply(replies):
                log.warning("lock %s expired before release (fence %s); the fence kept the write safe",
                            hold.name, hold.fence)
        except (RedisError, locks.LockUnavailable):
            # They wait on; when our hold ends without their reply they queue again, and the next
            # combiner finds their request ids committed (or not) and answers them. The product
            # locks end with their leases.
            log.warning("combining: replies to %d buyers failed (Redis); they will be answered again", len(replies))
        try:
            if not turn.finish():  # released once, the batch counted (lock stats, metrics)
                log.warning("lock %s expired before release (fence %s); the fence kept the write safe",
                            turn.hold.name, turn.hold.fence)
        except locks.LockUnavailable:
            log.warning("lock %s: Redis unreachable at release; it expires with its lease", turn.hold.name)
    finally:
        stale_transactions.forget([turn.hold, *also])
