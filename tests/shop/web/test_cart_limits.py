"""The cart (kept in the session) is bounded: SHOP["MAX_CART_LINES"] lines, of
products that exist and are on sale; anything else is refused with a message, never stored."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from shop import errors
from shop.conf import DEFAULTS
from shop.web import cart

pytestmark = pytest.mark.django_db(transaction=True)


def _said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_cart_holds_at_most_max_cart_lines_products(client, make_product, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_CART_LINES": 3}
    products = [make_product(stock=9) for _ in range(5)]
    for p in products[:3]:
        assert client.post(f"/products/{p.pk}/", {"quantity": 1}).status_code == 302
    # A fourth line, from the product page or the cart: refused, with the limit in plain words.
    page = client.post(f"/products/{products[3].pk}/", {"quantity": 1})
    assert page.status_code == 200 and "Your cart is full: at most 3 products" in page.content.decode()
    said = _said(client.post("/cart/", {"product_id": products[4].pk, "quantity": 2}, follow=True))
    assert said == ["Your cart is full: at most 3 products. Remove one to add another."], said
    assert set(client.session["cart"]) == {str(p.pk) for p in products[:3]}
    # Lines already in the cart still change; a removed one makes room.
    client.post("/cart/", {"product_id": products[0].pk, "quantity": 4})
    client.post("/cart/", {"product_id": products[1].pk, "quantity": 0})
    assert client.post(f"/products/{products[3].pk}/", {"quantity": 1}).status_code == 302
    assert client.session["cart"] == {str(products[0].pk): 4, str(products[2].pk): 1, str(products[3].pk): 1}


def test_the_cart_refuses_ids_of_no_product_and_never_stores_them(client):
    for pid in (1, 2**40, 2**63 - 1, 2**64, 10**30, "", "x", "-3", "\u00b2"):
        response = client.post("/cart/", {"product_id": pid, "quantity": 1}, follow=True)
        assert response.status_code == 200
        assert _said(response) == ["This product no longer exists."], pid
    assert not client.session.get("cart")


def test_the_cart_module_raises_a_typed_error_past_the_cap(client, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_CART_LINES": 1}
    session = client.session
    cart.set_quantity(session, 1, 2)
    cart.set_quantity(session, 1, 5)  # the same line: fine
    with pytest.raises(errors.CartFull) as err:
        cart.set_quantity(session, 2, 1)
    assert err.value.code == "cart_full" and err.value.details == {"max_lines": 1}
    assert DEFAULTS["MAX_CART_LINES"] == 20
