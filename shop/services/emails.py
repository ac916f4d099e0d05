"""Mail to buyers, through an outbox: nothing here is sent inside a request.

A mail is an `OutboxMail` row written in the transaction of what it tells: an order's payment (its
refund, cancellation, expiry) and the buyer's mail about it commit together, so a rolled-back
change never mails and a committed one never loses its mail. The `shop.send_mail` job (manage.py
run_jobs, every few seconds) sends what is due: it claims a row (a conditional UPDATE, so two
runners never send one mail), renders it (one renderer per kind, from the database as it is now),
sends it and marks it sent. A failure is recorded on the row and retried with a growing delay, up
to SHOP["MAIL_ATTEMPTS"] times. A mail server that is slow or down slows the job, never a payment or any other request.

Delivery is at least once: a runner that dies between the SMTP send and marking the row sent
sends that mail again once its claim ends (CLAIM).

A new kind of mail: add it to `OutboxMail.Kind`, write a renderer (row -> messages; none: the
row is marked skipped) and register it in RENDERERS; queue it with `queue_order_mail` inside the
transaction of what it tells (or `queue` directly).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import PasswordResetForm
from django.contrib.auth.tokens import default_token_generator
from django.core.mail import EmailMessage, get_connection
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from shop.conf import shop_settings
from shop.models import ENDED, Order, OutboxMail

log = logging.getLogger("shop")

# A claimed mail is not due again for this long: longer than one send may take (EMAIL_TIMEOUT).
CLAIM = timedelta(minutes=5)
# Retry delays: 30 s, 1 min, 2 min, ... at most an hour.
FIRST_RETRY, LAST_RETRY = 30.0, 3600.0
# Rows settled (sent, skipped, failed) longer ago than this are deleted by `prune_mail`.
KEEP = timedelta(days=30)

PASSWORD_RESET_SUBJECT = "registration/password_reset_subject.txt"
PASSWORD_RESET_BODY = "registration/password_reset_email.txt"


# --- queueing: inside the transaction of what the mail tells ------------------------------
def queue(*, kind: str, recipient: str, order_id: int | None = None, context: dict | None = None) -> OutboxMail:
    """Queue one mail; call it inside the transaction whose commit makes it true."""
    return OutboxMail.objects.create(kind=kind, order_id=order_id, recipient=recipient, context=context or {})


def queue_order_mail(*, kind: str, order_id: int, context: dict | None = None) -> bool:
    """Queue a mail about an order to its buyer; False when the buyer gave no address.
    `context`: what the mail says besides the order (a cancel: who cancelled it, and why)."""
    address = Order.objects.filter(pk=order_id).values_list("user__email", flat=True).first()
    if not address:
        return False
    queue(kind=kind, recipient=address, order_id=order_id, context=context)
    return True


def queue_reservation_mails(*, now: datetime | None = None, limit: int = 500) -> int:
    """Queue the "reserved, pay by ..." mail of orders still unpaid inside their window that have
    none yet; returns how many. The mail job does it before sending, not the checkout: no write
    more on the hot path, and a buyer who pays at once gets the payment's mail alone. The order
    is committed before the job can see it, so no rolled-back order is ever mailed; the unique
    (kind, order) row makes it once, whichever runner gets there first."""
    now = now or timezone.now()
    due = (Order.objects.filter(status=Order.Status.PENDING_PAYMENT, pay_by__gt=now)
           .exclude(user__email="").exclude(mails__kind=OutboxMail.Kind.ORDER_RESERVED)
           .order_by("pk").values_list("pk", "user__email")[:limit])
    rows = [OutboxMail(kind=OutboxMail.Kind.ORDER_RESERVED, order_id=pk, recipient=address, next_attempt_at=now)
            for pk, address in due]  # due at `now`: this run sends them
    return len(OutboxMail.objects.bulk_create(rows, ignore_conflicts=True))


def queue_password_reset(*, email: str, domain: str, site_name: str, protocol: str) -> None:
    """Queue a password reset for whatever accounts `email` has, without looking them up: the
    request does the same work (one INSERT) whether or not the address has an account; the job
    finds the accounts and makes their tokens when it sends."""
    queue(kind=OutboxMail.Kind.PASSWORD_RESET, recipient=email,
          context={"domain": domain, "site_name": site_name, "protocol": protocol})


# --- rendering: one renderer per kind, at send time ----------------------------------------
def _order_mail(name: str, *, while_status: str | None = None) -> Callable[[OutboxMail], list[EmailMessage]]:
    """The renderer of a mail about an order: templates shop/email/<name>_subject.txt and
    <name>.txt, given the order, its lines, the row's context (`mail`), the lines whose drop
    has ended (`sale_over`: their units do not go back on sale) and the links to the order and
    to the shop. Links start with SITE_URL: the job that sends has no request to take the host
    from. `while_status`: sent only while the order is in it (none: the row is marked skipped)."""

    def render(row: OutboxMail) -> list[EmailMessage]:
        order = Order.objects.select_related("user", "coupon").get(pk=row.order_id)
        if while_status is not None and order.status != while_status:
            return []
        lines = list(order.lines.select_related("product"))
        context = {"order": order, "lines": lines, "mail": row.context,
                   "sale_over": [line for line in lines if line.product.drop_state == ENDED],
                   "order_url": settings.SITE_URL + reverse("order", args=[order.pk]),
                   "shop_url": settings.SITE_URL + reverse("catalog")}
        subject = render_to_string(f"shop/email/{name}_subject.txt", context).strip()
        return [EmailMessage(subject, render_to_string(f"shop/email/{name}.txt", context), None, [row.recipient])]

    return render


def _password_reset(row: OutboxMail) -> list[EmailMessage]:
    """Django's PasswordResetForm.save(), at send time: one mail per active account with a usable
    password whose address matches. The token is made now, so no reset link ever sits in the
    outbox, and it is valid PASSWORD_RESET_TIMEOUT from when the mail leaves."""
    field = get_user_model().get_email_field_name()
    messages = []
    for user in PasswordResetForm().get_users(row.recipient):
        address = getattr(user, field)
        context = {**row.context, "email": address, "user": user, "uid": urlsafe_base64_encode(force_bytes(user.pk)),
                   "token": default_token_generator.make_token(user)}
        subject = "".join(render_to_string(PASSWORD_RESET_SUBJECT, context).splitlines())
        messages.append(EmailMessage(subject, render_to_string(PASSWORD_RESET_BODY, context), None, [address]))
    return messages


RENDERERS: dict[str, Callable[[OutboxMail], list[EmailMessage]]] = {
    OutboxMail.Kind.ORDER_RESERVED: _order_mail("order_reserved", while_status=Order.Status.PENDING_PAYMENT),
    OutboxMail.Kind.ORDER_PAID: _order_mail("order_paid"),
    OutboxMail.Kind.ORDER_REFUNDED: _order_mail("order_refunded"),
    OutboxMail.Kind.ORDER_CANCELLED: _order_mail("order_cancelled"),
    OutboxMail.Kind.ORDER_EXPIRED: _order_mail("order_expired"),
    OutboxMail.Kind.PASSWORD_RESET: _password_reset,
}


# --- sending: the job --------------------------------------------------------------------
@dataclass(frozen=True)
class SendReport:
    sent: int = 0
    failed: int = 0

    def __str__(self) -> str:
        return f"sent {self.sent}, failed {self.failed}"


def _retry_delay(attempts: int) -> timedelta:
    return timedelta(seconds=min(FIRST_RETRY * 2 ** max(attempts - 1, 0), LAST_RETRY))


def _describe(row: OutboxMail) -> str:
    return f"mail {row.pk} ({row.kind}{f', order {row.order_id}' if row.order_id else ''})"


def _failed(row: OutboxMail, exc: Exception, now: datetime) -> None:
    """Record the failure; retry later, or give up after SHOP["MAIL_ATTEMPTS"] attempts."""
    error = f"{type(exc).__name__}: {exc}"[:2000]
    if row.attempts >= int(shop_settings.MAIL_ATTEMPTS):
        OutboxMail.objects.filter(pk=row.pk, status=OutboxMail.Status.PENDING).update(
            status=OutboxMail.Status.FAILED, last_error=error)
        log.error("%s to %s: gave up after %s attempts: %s", _describe(row), row.recipient, row.attempts, error)
        return
    OutboxMail.objects.filter(pk=row.pk, status=OutboxMail.Status.PENDING).update(
        last_error=error, next_attempt_at=now + _retry_delay(row.attempts))
    log.warning("%s to %s: attempt %s failed, retried later: %s", _describe(row), row.recipient, row.attempts,
                error)


def send_pending_mail(*, now: datetime | None = None, limit: int = 100, check=None) -> SendReport:
    """Send up to `limit` due mails, oldest first, over one mail connection. Each is claimed
    first (not due again for CLAIM), so a second runner never sends it too, and marked sent at
    once after its send. The first failure ends the run: a server that is down costs one
    timeout a run, not one per mail. `check`: called before each mail (a job passes ctx.check).
    First the reservations of orders placed since the last run are queued (`queue_reservation_mails`)."""
    now = now or timezone.now()
    queue_reservation_mails(now=now)
    due = list(OutboxMail.objects.filter(status=OutboxMail.Status.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit])
    sent = failed = 0
    connection = get_connection()  # opened by the first mail that has something to send
    try:
        for pk in due:
            if check is not None:
                check()
            claimed = OutboxMail.objects.filter(
                pk=pk, status=OutboxMail.Status.PENDING, next_attempt_at__lte=now,
            ).update(next_attempt_at=timezone.now() + CLAIM, attempts=F("attempts") + 1)
            if not claimed:
                continue  # another runner has it, or it was sent meanwhile
            row = OutboxMail.objects.get(pk=pk)
            try:
                messages = RENDERERS[row.kind](row)
                if messages:
                    connection.open()  # once: later mails of this run reuse it
                    connection.send_messages(messages)
            except Exception as exc:  # SMTP refused, DNS, a timeout, a template error...
                _failed(row, exc, now)
                failed += 1
                break
            OutboxMail.objects.filter(pk=pk, status=OutboxMail.Status.PENDING).update(
                status=OutboxMail.Status.SENT if messages else OutboxMail.Status.SKIPPED, sent_at=timezone.now(),
                last_error="")
            sent += bool(messages)
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return SendReport(sent=sent, failed=failed)


def prune_mail(*, now: datetime | None = None) -> int:
    """Delete mails settled more than KEEP ago (the outbox keeps addresses: not forever)."""
    now = now or timezone.now()
    deleted, _ = OutboxMail.objects.filter(
        status__in=[OutboxMail.Status.SENT, OutboxMail.Status.SKIPPED, OutboxMail.Status.FAILED],
        created_at__lt=now - KEEP).delete()
    return deleted
