"""To non-staff a hidden (inactive) product is a product that does not exist,
everywhere: the cart, checkout, error messages and details, and the sold-out answers."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.test import Client

from shop import errors
from shop.models import ApiToken, Order, Product
from shop.plumbing import soldout
from shop.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)

MISSING = 987_654_321


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


def _api_order(client: Client, token: str, *pids: int):
    body = {"lines": [{"product_id": pid, "quantity": 1} for pid in pids]}
    return client.post("/api/orders/", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def _hide_in_admin(admin_client: Client, p: Product) -> None:
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/", {
        "sku": p.sku, "name": p.name, "description": "", "price": str(p.price), "max_per_user": "",
        "line_prequeue_seconds": "0", "line_order": "shuffle",
    })  # no "active": the checkbox is cleared
    assert response.status_code == 302, response.content.decode()[:2000]
    assert not Product.objects.get(pk=p.pk).active


def _cart_post(client: Client, pid: int) -> tuple[list[str], str]:
    """POST a line to the cart; the messages it left and the cart page that follows."""
    response = client.post("/cart/", {"product_id": pid, "quantity": 1}, follow=True)
    return [str(m) for m in get_messages(response.wsgi_request)], response.content.decode()


def test_posting_a_hidden_product_to_the_cart_answers_as_for_an_unknown_id(client, make_product):
    hidden = make_product(stock=5, price="123.45", active=False)
    said_hidden, page = _cart_post(client, hidden.pk)
    said_missing, _ = _cart_post(client, MISSING)
    assert hidden.name not in page and "123.45" not in page
    assert said_hidden == said_missing and said_hidden  # the same words, and some
    assert not client.session.get("cart")  # neither went in


def test_a_product_hidden_after_it_went_in_the_cart_shows_as_gone_to_shoppers(client, make_product):
    p = make_product(stock=5, price="77.70")
    client.post(f"/products/{p.pk}/", {"quantity": 1}, follow=True)  # "... in your cart" shown here
    Product.objects.filter(pk=p.pk).update(active=False)
    page = client.get("/cart/").content.decode()
    assert p.name not in page and "77.70" not in page
    assert "This product no longer exists." in page  # still flagged, so it can be removed
    assert client.post("/cart/", {"product_id": p.pk, "quantity": 0})["Location"] == "/cart/"
    assert not client.session.get("cart")


def test_the_web_checkout_names_a_product_hidden_meanwhile_as_gone(client, user, make_product, monkeypatch):
    """Hidden between the cart review and the order: the refusal reads as for a missing product."""
    from shop.plumbing import hooks

    p = make_product(stock=5)
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]

    def hide(stage: str, holds: dict) -> None:
        if stage == "before_update":
            Product.objects.filter(pk=p.pk).update(active=False)  # in the writer's transaction

    monkeypatch.setattr(hooks, "checkout_hook", hide)
    response = client.post("/checkout/", {"idempotency_key": key}, follow=True)
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said == ["This product no longer exists."], said
    assert not Order.objects.exists()


def test_an_order_of_missing_and_hidden_ids_is_answered_as_if_all_were_missing(client, user, make_product):
    token = ApiToken.issue(user_id=user.pk, name="t")
    hidden, fine = make_product(stock=5, active=False), make_product(stock=5)
    both_missing = _api_order(client, token, MISSING, MISSING + 1, fine.pk)
    one_hidden = _api_order(client, token, MISSING, hidden.pk, fine.pk)
    assert both_missing.status_code == one_hidden.status_code == 404
    assert both_missing.json()["error"]["code"] == one_hidden.json()["error"]["code"] == "unknown_product"
    assert both_missing.json()["error"]["message"] == one_hidden.json()["error"]["message"]
    assert both_missing.json()["error"]["details"] == {"product_ids": [MISSING, MISSING + 1]}
    assert one_hidden.json()["error"]["details"] == {"product_ids": sorted([MISSING, hidden.pk])}
    assert not Order.objects.exists()


def test_a_sold_out_product_hidden_in_the_admin_answers_as_unknown_not_sold_out(
        client, user, make_product, admin_client):
    p = make_product(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(p.pk, 1)])  # reads 0 under the lock: marks it sold out
    assert soldout.sold_out([p.pk]) == {p.pk}
    _hide_in_admin(admin_client, p)

    token = ApiToken.issue(user_id=user.pk, name="t")
    hidden, missing = _api_order(client, token, p.pk), _api_order(client, token, MISSING)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["code"] == "unknown_product"
    assert hidden.json()["error"]["message"] == missing.json()["error"]["message"]
    assert hidden.json()["error"]["details"] == {"product_ids": [p.pk]}
    assert soldout.sold_out([p.pk]) == set()  # the storm's fast path no longer knows it


def test_a_buyer_that_read_stock_0_before_the_hide_cannot_mark_it_afterwards(user, make_product, admin_client):
    """The hide raises the marker's floor under the product's lock: an older hold's mark is refused."""
    from locks import Lock

    p = make_product(stock=0)
    with Lock(f"product:{p.pk}", ttl=10.0) as early:  # a buyer that read 0 while it was on sale
        older_fence = early.fence
    _hide_in_admin(admin_client, p)
    assert soldout.mark(p.pk, fence=older_fence) is False
    assert soldout.sold_out([p.pk]) == set()


def test_a_hide_that_could_not_take_the_lock_clears_the_marker_once_it_can(user, make_product, admin_client,
                                                                           settings):
    """The product's lock is busy for longer than LOCK_WAIT (a sale's queue) when the admin
    hides it: the marker stays for now, and the jobs runner clears it as soon as the lock is free."""
    from locks import Lock
    from shop.ops.jobs import clear_hidden_markers

    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 0.3}
    p = make_product(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(p.pk, 1)])
    assert soldout.sold_out([p.pk]) == {p.pk}
    with Lock(f"product:{p.pk}", ttl=10.0):  # the queue of a busy sale
        _hide_in_admin(admin_client, p)
        assert soldout.sold_out([p.pk]) == {p.pk}
    assert "1 marker" in clear_hidden_markers(_JobContext())
    assert soldout.sold_out([p.pk]) == set()
    assert "0 marker" in clear_hidden_markers(_JobContext())


class _JobContext:
    """What a job function uses of locks.jobs.JobContext."""

    def check(self) -> None:
        pass
