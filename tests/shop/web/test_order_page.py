"""Without a browser: the cancel confirmation works with plain links and forms, the order page
carries the deadline and the server's clock as ISO instants for its script, and the page and the
list say what became of an order (refunded, cancelled, not paid in time) with its own badge."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from django.urls import reverse

from shop.models import Order
from shop.services import pay_order, place_order
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_asks_first_and_only_a_post_cancels(client, user, other_user, make_product):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    client.force_login(user)
    url = reverse("order_cancel", args=[order.pk])
    page = client.get(reverse("order", args=[order.pk])).content.decode()
    assert re.search(rf'<a class="btn secondary cancel" href="{url}">', page)  # a link, not a one-click form
    confirm = client.get(url)
    html = confirm.content.decode()
    assert confirm.status_code == 200 and f"Cancel order #{order.pk}?" in html
    assert 'method="post"' in html and 'id="confirm-cancel"' in html and "2 \u00d7 Product" in html
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
    response = client.post(url)
    assert response.status_code == 302 and Order.objects.get(pk=order.pk).status == Order.Status.CANCELLED
    assert client.get(url)["Location"] == reverse("order", args=[order.pk])  # nothing left to confirm

    paid = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    pay_order(order=paid, actor="test")
    assert client.get(reverse("order_cancel", args=[paid.pk])).status_code == 302
    theirs = order_of(place_order(user=other_user, lines=[(p.pk, 1)]))
    assert client.get(reverse("order_cancel", args=[theirs.pk])).status_code == 404


def test_the_order_page_gives_its_script_the_deadline_and_the_server_time(client, user, make_product):
    order = order_of(place_order(user=user, lines=[(make_product(stock=5).pk, 1)]))
    client.force_login(user)
    page = client.get(reverse("order", args=[order.pk])).content.decode()
    deadline = re.search(r'id="pay-countdown" data-deadline="([^"]+)" data-server-now="([^"]+)"', page)
    assert deadline, page
    assert datetime.fromisoformat(deadline.group(1)) == order.pay_by
    assert datetime.fromisoformat(deadline.group(2)).utcoffset() is not None  # ISO with an offset
    assert f'datetime="{order.pay_by.isoformat()}">{order.pay_by:%Y-%m-%d %H:%M} UTC</time>' in page  # no-JS text


def test_the_page_and_the_list_say_what_became_of_an_order_with_the_amount_and_the_date(client, user, make_product):
    from datetime import timedelta

    from django.utils import timezone

    from shop.services import cancel_order, expire_unpaid, refund_order

    p = make_product(stock=20, price="123.50")
    refunded, cancelled, expired, paid, unpaid = (order_of(place_order(user=user, lines=[(p.pk, 2)]))
                                                  for _ in range(5))
    for order in (refunded, paid):
        pay_order(order=order, actor="test")
    refund_order(order=refunded, actor="staff:test")
    cancel_order(order=cancelled, actor="test", unpaid_only=True)
    Order.objects.filter(pk=expired.pk).update(pay_by=timezone.now() - timedelta(seconds=1))
    assert expire_unpaid() == 1
    for order in (refunded, cancelled, expired):
        order.refresh_from_db()
    client.force_login(user)

    def page(order: Order) -> str:
        return client.get(reverse("order", args=[order.pk])).content.decode()

    when = {o.pk: (o.refunded_at or o.cancelled_at) for o in (refunded, cancelled, expired)}
    full = {pk: f'<time class="local" datetime="{at.isoformat()}">{at:%-d %b %Y, %H:%M} UTC</time>'
            for pk, at in when.items()}
    assert f'<p class="order-note" id="order-note">Refunded $247.00 on {full[refunded.pk]}.</p>' in page(refunded)
    assert f'<p class="order-note" id="order-note">Cancelled on {full[cancelled.pk]}.</p>' in page(cancelled)
    assert (f'<p class="order-note" id="order-note">Not paid in time: released on {full[expired.pk]}.</p>'
            in page(expired))
    for order in (paid, unpaid):
        assert 'id="order-note"' not in page(order)

    listed = client.get(reverse("orders")).content.decode()
    day = {pk: f'<time class="local date" datetime="{at.isoformat()}">{at:%-d %b %Y}</time>' for pk, at in when.items()}
    assert f'<span class="order-note-line">Refunded $247.00 on {day[refunded.pk]}</span>' in listed
    assert f'<span class="order-note-line">Cancelled on {day[cancelled.pk]}</span>' in listed
    assert f'<span class="order-note-line">Not paid in time: released on {day[expired.pk]}</span>' in listed
    assert listed.count('class="order-note-line"') == 3


def test_awaiting_payment_has_its_own_badge_not_the_green_of_paid(client, user, make_product):
    p = make_product(stock=5)
    unpaid, paid = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(2))
    pay_order(order=paid, actor="test")
    client.force_login(user)
    assert '<span class="badge wait" id="order-status">Awaiting payment</span>' in client.get(
        reverse("order", args=[unpaid.pk])).content.decode()
    assert '<span class="badge ok" id="order-status">Paid</span>' in client.get(
        reverse("order", args=[paid.pk])).content.decode()
    listed = client.get(reverse("orders")).content.decode()
    assert '<span class="badge wait">Awaiting payment</span>' in listed
    assert '<span class="badge ok">Paid</span>' in listed
