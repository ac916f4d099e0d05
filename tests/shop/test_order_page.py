"""Without a browser: the cancel confirmation works with plain links and forms,
and the order page carries the deadline and the server's clock as ISO instants for its script."""

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
