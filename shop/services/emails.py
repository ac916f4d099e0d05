"""Mail to buyers. A mail goes out only after the transaction that caused it commits (a rolled-back
payment never mails), and a mail server that is down or slow is logged, never raised: the
payment already happened and must be reported as such."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse

from shop.models import Order

log = logging.getLogger("shop")


def send_order_confirmation(*, order_id: int) -> bool:
    """Mail the buyer what they paid for; False when they gave no address. Raises on a mail error."""
    order = Order.objects.select_related("user", "coupon").get(pk=order_id)
    if not order.user.email:
        return False
    context = {"order": order, "lines": order.lines.select_related("product"),
               "order_url": settings.SITE_URL + reverse("order", args=[order.pk])}
    subject = render_to_string("shop/email/order_paid_subject.txt", context).strip()
    send_mail(subject, render_to_string("shop/email/order_paid.txt", context), None, [order.user.email])
    return True


def _send_quietly(order_id: int) -> None:
    try:
        send_order_confirmation(order_id=order_id)
    except Exception:  # SMTP refused, DNS, a timeout...: the payment stands
        log.exception("order %s: the payment confirmation mail was not sent", order_id)


def confirm_payment_on_commit(*, order_id: int) -> None:
    """Send the order confirmation once the current transaction commits (at once in autocommit)."""
    transaction.on_commit(lambda: _send_quietly(order_id))
