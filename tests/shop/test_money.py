"""One money helper (shop_tags.money), grouped by the locale, on every page and in the admin."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import translation

from shop.services import place_order
from shop.templatetags.shop_tags import money
from tests.helpers import order_of


@pytest.mark.parametrize("value,shown", [
    (1658, "$1,658.00"),
    (Decimal("1234567.5"), "$1,234,567.50"),
    ("999.99", "$999.99"),
    (Decimal("0.005"), "$0.01"),
    (0, "$0.00"),
    (Decimal("-1500"), "-$1,500.00"),
    (None, "-"),
    ("not money", "-"),
])
def test_money_groups_thousands(value, shown, settings):
    settings.SHOP_CURRENCY = "$"
    assert money(value) == shown


def test_money_follows_the_active_locale(settings):
    settings.SHOP_CURRENCY = "€"
    with translation.override("de"):
        assert money(Decimal("1658")) == "€1.658,00"


@pytest.mark.django_db(transaction=True)
def test_every_page_and_the_admin_show_grouped_prices(client, user, make_product, make_coupon):
    p = make_product(stock=50, price="1658.00")
    make_coupon(discount="1500.00")
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    for url in ("/", f"/products/{p.pk}/", "/cart/", "/checkout/", f"/orders/{order.pk}/", "/orders/"):
        page = client.get(url).content.decode()
        assert "$1,658.00" in page or "$3,316.00" in page, url
        assert "1658.00" not in page and "3316.00" not in page, url

    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    admin = Client()
    admin.force_login(root)
    assert "$1,658.00" in admin.get("/admin/shop/product/").content.decode()
    assert "$3,316.00" in admin.get("/admin/shop/order/").content.decode()
    assert "$1,500.00" in admin.get("/admin/shop/coupon/").content.decode()
    change = admin.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    assert "$1,658.00" in change and "$3,316.00" in change  # the line's unit price and the order's total
    assert "1658.00" not in change and "3316.00" not in change  # and not also raw
