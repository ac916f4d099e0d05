"""SHOP["MAX_UNPAID_ORDERS"]: one account cannot hoard a drop through unpaid reservations."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from shop import errors
from shop.models import Order
from shop.services import cancel_order, pay_order, place_order
from tests.helpers import order_of, run_processes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_UNPAID_ORDERS": 2}


@pytest.mark.parametrize("combining", [True, False])
def test_a_buyer_with_the_limit_of_unpaid_orders_is_refused_until_one_is_paid_or_cancelled(
        settings, user, make_product, combining):
    settings.SHOP = {**settings.SHOP, "COMBINING": combining}
    p = make_product(stock=100)
    first = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.UnpaidOrdersLimit) as exc:
        place_order(user=user, lines=[(p.pk, 1)])
    assert exc.value.status == 409 and exc.value.details == {"limit": 2, "unpaid": 2}
    pay_order(order=first, actor=user)
    third = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    cancel_order(order=third, actor=user, unpaid_only=True)
    place_order(user=user, lines=[(p.pk, 1)])
    assert Order.objects.filter(user=user, status=Order.Status.PENDING_PAYMENT).count() == 2
    p.refresh_from_db()
    assert p.stock == 97


def test_the_limit_is_api_visible(client, user, make_product):
    p = make_product(stock=10)
    client.force_login(user)
    codes = [client.post("/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]},
                         content_type="application/json").status_code for _ in range(3)]
    assert codes == [201, 201, 409]
    body = client.post("/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]},
                       content_type="application/json").json()
    assert body["error"]["code"] == "unpaid_limit"


def _hoard(user_id: int, product_id: int) -> list[str]:
    user = get_user_model().objects.get(pk=user_id)
    told = []
    for _ in range(5):
        try:
            place_order(user=user, lines=[(product_id, 1)])
            told.append("placed")
        except errors.ShopError as exc:
            told.append(exc.code)
    return told


def test_one_account_in_many_processes_on_one_product_never_passes_the_limit(user, make_product):
    p = make_product(stock=100)
    told = [code for codes in run_processes(_hoard, [(user.pk, p.pk)] * 6) for code in codes]
    assert told.count("placed") == 2
    assert Order.objects.filter(user=user).count() == 2
