"""A MySQL connection lost mid-order: a typed, retryable error, and an
outcome a retry with the same Idempotency-Key settles: the order if it committed, else placed once."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from shop import errors
from shop.conf import shop_settings
from shop.models import ApiToken, Order, Product
from shop.plumbing import hooks
from shop.services import pay_order, place_order
from tests.helpers import kill_own_connection, order_of
from tests.mysql_proxy import MySQLProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


@pytest.fixture
def kill_at(monkeypatch):
    """kill_at("before_update"): the next order loses its connection at that stage, once."""

    def arm(stage: str) -> None:
        def hook(at: str, holds) -> None:
            if at == stage:
                monkeypatch.setattr(hooks, "checkout_hook", None)
                kill_own_connection()

        monkeypatch.setattr(hooks, "checkout_hook", hook)

    return arm


@pytest.fixture
def through_proxy():
    """This thread's Django connection goes through a MySQLProxy (reconnected now, restored after)."""
    proxy = MySQLProxy()
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
    yield proxy
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)
    proxy.close()


def _orders(user) -> list[Order]:
    return list(Order.objects.filter(user=user))


@pytest.mark.parametrize(("stage", "outcome"), [("before_update", "not_written"), ("before_commit", "unknown")])
def test_a_killed_connection_is_a_retryable_error_and_the_retry_places_the_order_once(
    kill_at, make_product, user, stage, outcome
):
    product = make_product(stock=5)
    kill_at(stage)
    with pytest.raises(errors.DatabaseUnavailable) as caught:  # old code: a raw OperationalError (HTML 500)
        place_order(user=user, lines=[(product.pk, 1)], idempotency_key="k-1")
    assert caught.value.code == "database_unavailable" and caught.value.status == 503
    # Combining settles an unknown outcome itself (the request id's unique key): not written.
    assert caught.value.details == {"outcome": "not_written" if shop_settings.COMBINING else outcome}
    assert _orders(user) == []  # KILL rolled the transaction back
    assert Product.objects.get(pk=product.pk).stock == 5

    retry = place_order(user=user, lines=[(product.pk, 1)], idempotency_key="k-1")
    assert not retry.replayed
    assert [o.pk for o in _orders(user)] == [retry.order_id]
    assert Product.objects.get(pk=product.pk).stock == 4


def test_a_commit_whose_reply_is_lost_is_found_by_the_retry_not_placed_twice(through_proxy, make_product, user):
    product = make_product(stock=5)
    through_proxy.drop_next_commit_reply.set()
    if shop_settings.COMBINING:
        # The combiner cannot know either, so it settles the request id: the INSERT collides
        # with the committed one, and the buyer gets its order.
        first = order_of(place_order(user=user, lines=[(product.pk, 1)], idempotency_key="k-2"))
        assert [o.pk for o in _orders(user)] == [first.pk]
    else:
        with pytest.raises(errors.DatabaseUnavailable) as caught:
            place_order(user=user, lines=[(product.pk, 1)], idempotency_key="k-2")
        assert caught.value.details == {"outcome": "unknown"}  # it did commit; the client cannot know
    assert through_proxy.commits_dropped == 1

    retry = place_order(user=user, lines=[(product.pk, 1)], idempotency_key="k-2")
    assert retry.replayed
    assert [o.pk for o in _orders(user)] == [retry.order_id]
    assert Product.objects.get(pk=product.pk).stock == 4


def test_the_api_answers_503_json_and_the_retry_gets_the_order(client, kill_at, make_product, user):
    product = make_product(stock=5)
    token = ApiToken.issue(user_id=user.pk, name="test")
    body = json.dumps({"lines": [{"product_id": product.pk, "quantity": 1}]})
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_IDEMPOTENCY_KEY": "api-1"}
    kill_at("before_commit")
    lost = client.post("/api/orders/", data=body, content_type="application/json", **headers)
    assert lost.status_code == 503
    assert lost.json()["error"]["code"] == "database_unavailable"
    assert lost["Retry-After"]
    again = client.post("/api/orders/", data=body, content_type="application/json", **headers)
    assert again.status_code == 201
    assert len(_orders(user)) == 1


def test_the_web_checkout_keeps_its_key_so_pressing_again_orders_once(client, kill_at, make_product, user):
    product = make_product(stock=5)
    client.force_login(user)
    client.post(f"/products/{product.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    kill_at("before_commit")
    lost = client.post("/checkout/", {"idempotency_key": key})
    assert lost.status_code == 503
    assert "Place order again" in lost.content.decode()
    assert lost.context["form"].initial["idempotency_key"] == key
    placed = client.post("/checkout/", {"idempotency_key": key})
    assert placed.status_code == 302
    assert len(_orders(user)) == 1


def test_a_connection_lost_outside_the_services_is_a_friendly_503_page(client, monkeypatch):
    """A page's own read (not a service) losing the connection: the middleware's 503 page."""
    from django.db.utils import OperationalError

    from shop.web import views

    def lost(*args, **kwargs):
        raise OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(views.selectors, "product_list", lost)
    page = client.get("/")
    assert page.status_code == 503
    assert "Back in a moment" in page.content.decode()


def test_a_connection_lost_after_the_commit_keeps_the_batchs_orders_and_calls_the_rest_unknown(
        kill_at, make_product, user, other_user):
    """After COMMIT the writer looks up why a request was refused; losing the connection
    there must not turn the batch's committed order into "not written"."""
    from locks import Lock
    from shop.checkout import protocol, writer
    from shop.plumbing.lock_names import product_lock

    p = make_product(stock=1)
    placed = protocol.Request(id=protocol.new_request_id(), user_id=user.pk, lines=((p.pk, 1),), code=None, key=None,
                           digest="d", deadline=float("inf"))
    refused = protocol.Request(id=protocol.new_request_id(), user_id=other_user.pk, lines=((p.pk, 5),), code=None,
                            key="k-after-commit", digest="d", deadline=float("inf"), token="t", recorded=True)
    kill_at("after_commit")
    with Lock(product_lock(p.pk), ttl=10) as hold:
        results = writer.write([placed, refused], holds={p.pk: hold})
    assert isinstance(results[placed.id], protocol.Placed)
    assert Order.objects.get(pk=results[placed.id].order_id).user == user
    assert results[refused.id] == protocol.Refused.of(errors.DatabaseUnavailable(details={"outcome": "unknown"}))
    p.refresh_from_db()
    assert p.stock == 0


# --- a payment's outcome is never reported "not_written" when it was written ----------------------
def _outbox(order: Order) -> list:
    from shop.models import OutboxMail

    return list(OutboxMail.objects.filter(order=order))


@pytest.fixture
def buyer_with_mail(user):
    user.email = "buyer@example.com"
    user.save(update_fields=["email"])
    return user


def test_a_payment_whose_commit_reply_is_lost_is_unknown_and_its_retry_returns_it(
    through_proxy, make_product, buyer_with_mail
):
    order = order_of(place_order(user=buyer_with_mail, lines=[(make_product(stock=5).pk, 1)]))
    through_proxy.drop_next_commit_reply.set()
    with pytest.raises(errors.DatabaseUnavailable) as caught:  # old code: no COMMIT of its own, no error
        pay_order(order=order, actor="test")
    assert caught.value.details == {"outcome": "unknown"} and through_proxy.commits_dropped == 1
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID  # it did commit
    assert len(_outbox(order)) == 1  # and its mail with it

    retry = pay_order(order=order, actor="test")  # the truth
    assert retry.status == Order.Status.PAID and len(_outbox(order)) == 1


def test_a_lost_payment_reply_never_says_not_written_for_a_written_payment(
    through_proxy, make_product, buyer_with_mail
):
    """The reply to the flip's UPDATE is lost. In autocommit that UPDATE was its own COMMIT (old
    code: paid, yet "not_written"); inside the payment's transaction it was not committed."""
    order = order_of(place_order(user=buyer_with_mail, lines=[(make_product(stock=5).pk, 1)]))
    through_proxy.drop_next_reply_to(b"UPDATE `shop_order` SET `status`")
    with pytest.raises(errors.DatabaseUnavailable) as caught:
        pay_order(order=order, actor="test")
    assert through_proxy.replies_dropped == 1
    status = Order.objects.get(pk=order.pk).status
    assert caught.value.details["outcome"] == "unknown" or status == Order.Status.PENDING_PAYMENT, status
    assert len(_outbox(order)) == (status == Order.Status.PAID)
    assert pay_order(order=order, actor="test").status == Order.Status.PAID
    assert len(_outbox(order)) == 1


def test_a_connection_lost_reading_back_a_committed_payment_is_unknown(monkeypatch, make_product, buyer_with_mail):
    order = order_of(place_order(user=buyer_with_mail, lines=[(make_product(stock=5).pk, 1)]))
    read_back = Order.refresh_from_db

    def lost_then_read(self, *args, **kwargs):
        monkeypatch.setattr(Order, "refresh_from_db", read_back)
        kill_own_connection()
        return read_back(self, *args, **kwargs)

    monkeypatch.setattr(Order, "refresh_from_db", lost_then_read)
    with pytest.raises(errors.DatabaseUnavailable) as caught:
        pay_order(order=order, actor="test")
    assert caught.value.details == {"outcome": "unknown"}  # old code: "not_written"
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    assert pay_order(order=order, actor="test").status == Order.Status.PAID and len(_outbox(order)) == 1
