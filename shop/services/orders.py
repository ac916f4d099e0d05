"""An order's life after checkout: pay it, cancel it, let it expire unpaid, or refund it once paid.

Cancelling, expiring and refunding give the stock and the coupon back exactly once, even when
called twice at once or racing a payment: the status flip (a conditional UPDATE) inside the
transaction that returns the stock is the guard, so exactly one of pay / cancel / expire wins an
unpaid order, and one refund a paid one. The winner's transaction also queues the buyer's mail
about it (`shop.services.emails`), so each step is told once, and only once it is committed.

A refund also pays money back, which no transaction can take back: the provider is called
outside any transaction, once per `Refund` record, and the books follow in their
own retried transaction that never calls it again. See `refund_order`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, InterfaceError, OperationalError
from django.db.models import F, Q
from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import CouponClaim, Order, OrderLine, OutboxMail, Refund, StockLedger
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import check_before_commit, held, refuse_outer_transaction
from shop.plumbing.transactions import (
    connection_errors,
    drop_connection,
    durable_transaction,
    lost_connection,
    with_retries,
)
from shop.services.emails import queue_order_mail
from shop.services.inventory import return_stock, unmark_sold_out

log = logging.getLogger("shop")


def _refusal(order_pk: int, refusal: type[errors.ShopError], *, buyer: bool = False) -> errors.ShopError:
    """The typed refusal, saying the state the order is in (an operator reads it in the admin;
    `buyer`: the buyer's own cancel, who cannot refund)."""
    status = Order.objects.filter(pk=order_pk).values_list("status", flat=True).first()
    message = None
    if refusal is errors.OrderNotCancellable and status == Order.Status.PAID:
        message = ("This order is paid, so it can no longer be cancelled; to get your money back, contact the shop."
                   if buyer else "This order is paid: refund it instead (its money goes back too).")
    return refusal(message, details={"order_id": order_pk, "status": status})


def _release(*, order: Order, actor, allowed: tuple[str, ...], to: str, reason: str, mail: str,
             due_before: datetime | None = None, stamp: str = "cancelled_at",
             refusal: type[errors.ShopError] = errors.OrderNotCancellable,
             after_flip: Callable[[], None] | None = None, mail_context: dict | None = None,
             buyer: bool = False) -> None:
    """Flip the order from one of `allowed` to `to` and return its stock and coupon, once.

    Same locks as checkout (the products', sorted), one durable transaction; the flip is the
    guard: a loser (a twin call, a payment that came first) raises `refusal` with nothing
    written. `due_before`: only if pay_by is before it (expiry). `stamp`: the time field the
    flip sets (cancelled_at for cancel and expiry, refunded_at for a refund). `after_flip`: runs
    in the transaction once the flip won (a refund marks its record completed). `mail`: the kind
    of the buyer's mail queued with the flip (an outbox row: it commits with the flip or not at
    all, and only the call whose flip won queues it, so the buyer hears of it exactly once),
    with `mail_context`. `buyer`: the buyer's own call (a refusal says what a buyer can do).
    Everything here may run more than once (retries): nothing in it may reach outside the database.
    """
    lines = list(
        OrderLine.objects.filter(order_id=order.pk).order_by("product_id").values_list("product_id", "quantity")
    )
    guard = Order.objects.filter(pk=order.pk, status__in=allowed)
    if due_before is not None:
        guard = guard.filter(pay_by__lte=due_before)
    if not lines or not guard.exists():
        raise _refusal(order.pk, refusal, buyer=buyer)

    def attempt() -> None:
        names = [product_lock(pid) for pid, _ in lines]
        with held(names) as holds:
            unmark_sold_out([pid for pid, _ in lines], holds)
            with durable_transaction():
                if not guard.update(status=to, **{stamp: timezone.now()}):
                    raise _refusal(order.pk, refusal, buyer=buyer)
                if after_flip is not None:
                    after_flip()
                queue_order_mail(kind=mail, order_id=order.pk, context=mail_context)
                for pid, qty in lines:
                    return_stock(product_id=pid, quantity=qty, hold=holds[product_lock(pid)],
                                 reason=reason, order=order, actor=str(actor))
                # The coupon comes back to its owner, usable again. `remaining` counts claims,
                # not uses, so it does not change.
                CouponClaim.objects.filter(order_id=order.pk).update(used_at=None, order=None)
                check_before_commit(holds)

    with_retries(attempt, what=f"{to} order")


# What staff write to the buyer when they cancel an order (the mail quotes it).
MAX_CANCEL_REASON = 500


@connection_errors()
def cancel_order(*, order: Order, actor, unpaid_only: bool = False, reason: str = "") -> Order:
    """Cancel an order that holds stock and was not paid (staff: also a legacy "placed" one;
    `unpaid_only`: the buyer's own, unpaid). A paid order is refunded (`refund_order`), never
    cancelled: cancelling would return the stock and keep the money. `reason`: staff's words to
    the buyer, quoted in the mail (the buyer's own cancel mails as theirs, with none)."""
    refuse_outer_transaction("cancel_order")
    if not isinstance(reason, str) or len(reason.strip()) > MAX_CANCEL_REASON:
        raise errors.InvalidInput(f"A reason is at most {MAX_CANCEL_REASON} characters.",
                                  details={"reason": f"at most {MAX_CANCEL_REASON} characters"})
    allowed = ((Order.Status.PENDING_PAYMENT,) if unpaid_only
               else (Order.Status.PENDING_PAYMENT, Order.Status.PLACED))
    _release(order=order, actor=actor, allowed=allowed, to=Order.Status.CANCELLED,
             reason=StockLedger.Reason.CANCEL, mail=OutboxMail.Kind.ORDER_CANCELLED, buyer=unpaid_only,
             mail_context={"by": "buyer" if unpaid_only else "shop", "reason": reason.strip()})
    order.refresh_from_db()
    return order


def provider_refund(*, key: str, order_id: int, amount: Decimal) -> None:
    """The simulated payment provider's refund (it always succeeds, as its payment does). A real
    provider takes `key` as its idempotency key: a second call with the same key (we crashed
    after it paid, before we wrote that down) pays nothing more."""
    log.info("provider: refund %s of order %s (%s) paid back", key, order_id, amount)


def _refund_refusal(order_pk: int) -> errors.ShopError:
    """Why this order cannot be refunded by this call: not paid, already refunded, or a refund
    of it under way in another call (claimed: it is working on it now)."""
    refund = Refund.objects.filter(order_id=order_pk).values_list("status", flat=True).first()
    if refund not in Refund.UNFINISHED:
        return _refusal(order_pk, errors.OrderNotRefundable)
    status = Order.objects.filter(pk=order_pk).values_list("status", flat=True).first()
    return errors.OrderNotRefundable("This order is already being refunded.",
                                     details={"order_id": order_pk, "status": status, "refund": refund})


def _claim_window(now: datetime) -> datetime:
    return now + timedelta(seconds=float(shop_settings.REFUND_CLAIM))


def _claim(refund_pk: int, *, now: datetime | None = None) -> str | None:
    """Claim an unfinished refund to work on it (conditional UPDATE): the claim token, or None
    when it is finished or another worker's claim has not lapsed."""
    now = now or timezone.now()
    token = secrets.token_hex(8)
    claimed = (Refund.objects.filter(pk=refund_pk, status__in=Refund.UNFINISHED)
               .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
               .update(claimed_by=token, claimed_until=_claim_window(now), attempts=F("attempts") + 1))
    return token if claimed else None


def _let_go(refund_pk: int, token: str, error: BaseException) -> None:
    """A claimed refund failed: note why and free it at once for the next call or the job (best
    effort: with the database gone, the claim lapses on its own)."""
    cause = error.__cause__ or error  # the provider's or the database's own error, not our wrapper
    with contextlib.suppress(Exception):
        Refund.objects.filter(pk=refund_pk, claimed_by=token, status__in=Refund.UNFINISHED).update(
            claimed_until=timezone.now(), last_error=f"{type(cause).__name__}: {cause}"[:2000])


def _open_refund(*, order: Order, actor: str) -> tuple[Refund, str] | None:
    """Step 1: the pending refund of a paid order, claimed by this call; None when a twin call
    created it first (the unique order)."""
    token = secrets.token_hex(8)
    try:
        with durable_transaction():
            total = (Order.objects.select_for_update().filter(pk=order.pk, status=Order.Status.PAID)
                     .values_list("total", flat=True).first())
            if total is None:
                raise _refund_refusal(order.pk)
            refund = Refund.objects.create(order_id=order.pk, key=f"rf_{secrets.token_hex(16)}", amount=total,
                                           actor=actor[:150], claimed_by=token, attempts=1,
                                           claimed_until=_claim_window(timezone.now()))
    except IntegrityError:
        if Refund.objects.filter(order_id=order.pk).exists():
            return None
        raise
    return refund, token


def _pay_back(refund: Refund) -> None:
    """Step 2: the provider pays the money back (outside any transaction), then the refund is
    marked sent (autocommit). Lost between the two, the refund stays pending and its next worker
    calls the provider again with the same key: the provider pays once."""
    try:
        provider_refund(key=refund.key, order_id=refund.order_id, amount=refund.amount)
    except Exception as exc:  # a real provider's timeout or refusal: the record stays, retried
        log.warning("refund %s of order %s: the provider failed", refund.key, refund.order_id, exc_info=True)
        raise errors.ProviderUnavailable(details={"order_id": refund.order_id, "refund": refund.status}) from exc
    refund.sent_at = timezone.now()
    try:
        Refund.objects.filter(pk=refund.pk, status=Refund.Status.PENDING).update(
            status=Refund.Status.SENT, sent_at=refund.sent_at)
    except (OperationalError, InterfaceError) as exc:
        if not lost_connection(exc):
            raise
        drop_connection()
        raise errors.DatabaseUnavailable(
            "The refund is under way (the provider was called); Refund again, or the shop.finish_refunds job, "
            "finishes it without paying twice.",
            details={"order_id": refund.order_id, "outcome": "unknown", "refund": refund.status}) from exc
    refund.status = Refund.Status.SENT


def _book_refund(refund: Refund) -> None:
    """Step 3: the books, under the product locks in one durable transaction with retries: the
    order paid -> refunded, stock and coupon back, the refund completed. The provider is not in
    it, so no retry pays again. A connection lost here is tried once more on a new connection:
    the flip is the guard, and an earlier COMMIT that did land shows as a completed refund."""

    def completed() -> None:
        Refund.objects.filter(pk=refund.pk, status=Refund.Status.SENT).update(
            status=Refund.Status.COMPLETED, completed_at=timezone.now(), claimed_until=None)

    for again in (True, False):
        try:
            _release(order=Order(pk=refund.order_id), actor=refund.actor, allowed=(Order.Status.PAID,),
                     to=Order.Status.REFUNDED, reason=StockLedger.Reason.REFUND, stamp="refunded_at",
                     mail=OutboxMail.Kind.ORDER_REFUNDED,
                     refusal=errors.OrderNotRefundable, after_flip=completed)
            return
        except errors.OrderNotRefundable:
            if Refund.objects.filter(pk=refund.pk, status=Refund.Status.COMPLETED).exists():
                return  # our earlier COMMIT landed; its reply was lost
            raise
        except errors.DatabaseUnavailable as exc:
            if not again:
                raise errors.DatabaseUnavailable(
                    "The refund is under way (the money went back); Refund again, or the shop.finish_refunds "
                    "job, finishes its books.",
                    details={**exc.details, "order_id": refund.order_id, "refund": refund.status}) from exc
            log.warning("refund %s of order %s: connection lost in the books (%s); once more",
                        refund.key, refund.order_id, exc.details.get("outcome"))


def _finish_refund(refund: Refund, token: str) -> None:
    """Steps 2 (unless the provider already paid) and 3 of a refund this call has claimed; on
    failure the claim is let go, so the next call or the job carries on."""
    try:
        if refund.status == Refund.Status.PENDING:
            _pay_back(refund)
        _book_refund(refund)
    except BaseException as exc:
        _let_go(refund.pk, token, exc)
        raise


@connection_errors()
def refund_order(*, order: Order, actor) -> Order:
    """Refund a paid order (staff): the provider pays the money back once, then paid -> refunded,
    the stock returns under the product locks (ledger reason `refund`) and the coupon goes back to
    its owner, exactly as a cancellation gives them back. Idempotent end to end (a `Refund`
    record, see its docstring): a call that finds an unfinished refund of the order (left by a
    crash or a lost connection) finishes it without paying twice; one that finds it refunded,
    not paid, or being refunded by another call right now raises OrderNotRefundable (409)."""
    refuse_outer_transaction("refund_order")
    refund = Refund.objects.filter(order_id=order.pk).first()
    if refund is None:
        opened = _open_refund(order=order, actor=str(actor))
        if opened is None:
            raise _refund_refusal(order.pk)
        refund, token = opened
    else:
        token = _claim(refund.pk)
        if token is None:
            raise _refund_refusal(order.pk)
        refund.refresh_from_db()  # its status as of our claim
        if refund.actor != str(actor):
            log.info("refund %s of order %s: finished by %s", refund.key, order.pk, actor)
    _finish_refund(refund, token)
    order.refresh_from_db()
    log.info("order %s refunded by %s", order.pk, refund.actor)
    return order


@connection_errors()
def finish_refunds(*, now: datetime | None = None, limit: int = 100, check=None) -> int:
    """Finish refunds left pending or sent whose claim lapsed (the call working on one crashed,
    lost its connection, or the provider failed); returns how many were completed. Each goes on
    from where it stopped: the provider only if it was not known to have paid (same key).
    `check`: called before each (a job passes ctx.check)."""
    refuse_outer_transaction("finish_refunds")
    now = now or timezone.now()
    due = list(Refund.objects.filter(status__in=Refund.UNFINISHED)
               .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
               .order_by("pk").values_list("pk", flat=True)[:limit])
    finished = 0
    for pk in due:
        if check is not None:
            check()
        token = _claim(pk, now=now)
        if token is None:
            continue  # finished, or claimed, since we listed it
        refund = Refund.objects.get(pk=pk)
        try:
            _finish_refund(refund, token)
        except errors.ShopError as exc:
            log.warning("refund %s of order %s not finished: %s %s", refund.key, refund.order_id, exc.code,
                        exc.details)
            continue
        log.info("refund %s of order %s finished by the job (asked by %s)", refund.key, refund.order_id,
                 refund.actor)
        finished += 1
    return finished


@connection_errors()
def pay_order(*, order: Order, actor) -> Order:
    """Record a payment (the simulated provider always accepts). pending_payment -> paid with a
    guarded UPDATE (still pending AND pay_by > now), so a payment never lands on an order that
    expired or was cancelled, even one racing the expirer. Paying a paid order again is a no-op
    that returns it (a client retrying after a timeout must not be told it failed).

    The flip and the buyer's confirmation mail (an outbox row, sent later by the `shop.send_mail`
    job: no SMTP in the request) commit in one durable transaction, so the mail follows the
    committed state. A connection lost during that COMMIT, or while reading the order back after
    it, is DatabaseUnavailable with outcome "unknown": the payment may well have landed, and a
    retry of pay returns the paid order."""
    refuse_outer_transaction("pay_order")
    now = timezone.now()
    with durable_transaction():
        paid = Order.objects.filter(pk=order.pk, status=Order.Status.PENDING_PAYMENT, pay_by__gt=now).update(
            status=Order.Status.PAID, paid_at=now)
        if paid:  # this call paid it (a retry of a paid order queues nothing)
            queue_order_mail(kind=OutboxMail.Kind.ORDER_PAID, order_id=order.pk)
    try:
        order.refresh_from_db()
    except (OperationalError, InterfaceError) as exc:
        if not (paid and lost_connection(exc)):
            raise
        drop_connection()
        raise errors.DatabaseUnavailable(details={"outcome": "unknown"}) from exc
    if not paid and order.status != Order.Status.PAID:
        raise errors.OrderNotPayable(details={"order_id": order.pk, "status": order.status})
    log.info("order %s paid by %s", order.pk, actor)
    return order


@connection_errors()
def expire_unpaid(*, now: datetime | None = None, limit: int = 500, check=None) -> int:
    """Expire up to `limit` unpaid orders past their pay_by; returns how many expired.

    Each one goes back exactly like a cancellation (ledger reason `expire`). An order paid or
    cancelled meanwhile loses nothing: its flip fails and it is skipped. `check`: called before
    each order (a job passes ctx.check, so a runner that lost its lease stops).
    """
    refuse_outer_transaction("expire_unpaid")
    now = now or timezone.now()
    due = list(Order.objects.filter(status=Order.Status.PENDING_PAYMENT, pay_by__lte=now)
               .order_by("pay_by", "pk").values_list("pk", flat=True)[:limit])
    expired = 0
    for pk in due:
        if check is not None:
            check()
        try:
            _release(order=Order(pk=pk), actor="job:shop.expire_unpaid", allowed=(Order.Status.PENDING_PAYMENT,),
                     to=Order.Status.EXPIRED, reason=StockLedger.Reason.EXPIRE, due_before=now,
                     mail=OutboxMail.Kind.ORDER_EXPIRED)
        except errors.OrderNotCancellable:
            continue  # paid or cancelled since we listed it
        expired += 1
    return expired
