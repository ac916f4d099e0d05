"""Requests already served, found after the fact: replays and settled request ids.

They are not looked up before a batch is written: the unique keys on (user, idempotency key) and
on the request id refuse a duplicate, and the writer then writes each request in a savepoint of
its own, where one that collides is explained here (its order replayed, or its buyer gave up)
and refused alone (I9). A refusal of a request that was in fact served (a combiner stalled
before replying, a key placed an order meanwhile) is explained here too.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.db.models import Q

from shop import errors
from shop.checkout.protocol import Placed, Refused, Request, Result
from shop.models import CheckoutRequest, Order
from shop.plumbing.transactions import drop_connection, lost_connection

log = logging.getLogger("shop")


def explain_refusals(pending: list[Request], results: dict[str, Result]) -> None:
    """A refusal (no stock, a cap, a deadline) is not the answer for a request that was already
    served: its id committed by a combiner that stalled before replying (its buyer queued again),
    or its key placed an order meanwhile. The unique keys catch those only when we write, so the
    (rare) refused ones are looked up here, after the fact."""
    refused = {r.id: results[r.id] for r in pending
               if isinstance(results.get(r.id), Refused) and (r.recorded or r.key)}
    if not refused:
        return
    explained: dict[str, Result] = {}
    try:
        left = drop_replays(drop_settled([r for r in pending if r.id in refused], explained), explained)
    except (OperationalError, InterfaceError) as exc:
        if not lost_connection(exc):
            raise
        # The batch is committed and its orders stand; these refusals could not be checked:
        # "unknown", which the request id or the key's replay settles on a retry.
        drop_connection()
        unknown = Refused.of(errors.DatabaseUnavailable(details={"outcome": "unknown"}))
        results.update(dict.fromkeys(refused, unknown))
        return
    results.update(explained)
    results.update({r.id: refused[r.id] for r in left})


def refuse_unwritable(r: Request, results: dict[str, Result]) -> None:
    """Why this request's rows failed: its id was settled meanwhile (the buyer gave up), its key
    placed an order meanwhile (replay or conflict), or its own rows are bad (a deleted account)."""
    for explain in (drop_settled, drop_replays):
        explain([r], results)
        if r.id in results:
            return
    log.warning("checkout: request %s of user %s cannot be written; refused alone", r.id, r.user_id)
    results[r.id] = Refused.of(errors.OrderNotWritable())


def drop_settled(live: list[Request], results: dict[str, Result]) -> list[Request]:
    """Requests whose id is already claimed: by an order (a crashed combiner committed it) or
    by a buyer who gave up. Either way they are not committed again."""
    recorded = [r.id for r in live if r.recorded]
    claimed = dict(CheckoutRequest.objects.filter(request_id__in=recorded).values_list("request_id", "order_id")
                   ) if recorded else {}
    if not claimed:
        return live
    orders = Order.objects.in_bulk([oid for oid in claimed.values() if oid is not None])
    for r in live:
        if r.id in claimed:
            oid = claimed[r.id]
            results[r.id] = (Placed.of(orders[oid], replayed=False) if oid is not None
                             else Refused.of(errors.LockTimeout(details={"gave_up": True})))
    return [r for r in live if r.id not in claimed]


def drop_replays(live: list[Request], results: dict[str, Result]) -> list[Request]:
    """Idempotency keys: a key that already placed an order gets it back (or a conflict if the
    body differs); a second request with the same key in this batch is refused as a conflict."""
    keyed = [r for r in live if r.key]
    if not keyed:
        return live
    query = Q()
    for r in keyed:
        query |= Q(user_id=r.user_id, idempotency_key=r.key)
    known = {(o.user_id, o.idempotency_key): o for o in Order.objects.filter(query)}
    seen: set[tuple[int, str]] = set()
    for r in keyed:
        pair = (r.user_id, r.key)
        if (order := known.get(pair)) is not None:
            results[r.id] = (Placed.of(order, replayed=True) if order.request_digest == r.digest
                             else Refused.of(errors.IdempotencyConflict(details={"order_id": order.pk})))
        elif pair in seen:
            # Its twin in this batch is being placed right now; the client retries and replays it.
            results[r.id] = Refused.of(errors.Conflict(details={"idempotency_key": "in flight"}))
        seen.add(pair)
    return [r for r in live if r.id not in results]
