"""MariaDB refuses a new connection (a crowd used them up): a typed, retryable 503, never a 500.

A load test of a drop ran into "Too many connections" (1040); an account's own limit answers
1203 (the server's max_user_connections) or 1226 (the account's MAX_USER_CONNECTIONS). Like a
lost connection, each is `database_unavailable` with outcome "not_written": nothing could be
written without a connection. Reproduced with a real server limit: an account of its own allowed
one connection, which another connection already holds (the server's global limits, shared by
everyone on the machine, are left alone).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import MySQLdb
import pytest
from django.db import connection
from django.db.utils import OperationalError

from shop import errors
from shop.models import ApiToken, Order, Product
from shop.plumbing.transactions import lost_connection
from shop.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)


def _root():
    s = connection.settings_dict
    return MySQLdb.connect(host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306), user=s["USER"],
                           passwd=s["PASSWORD"])


@pytest.fixture
def connections_used_up(transactional_db) -> Iterator[Callable[[], AbstractContextManager[None]]]:
    """`with connections_used_up():` this thread's Django connection connects as an account allowed
    one connection, which another connection holds: the server refuses every connect (1226)."""
    account, password = f"no_conn_{os.getpid()}", secrets.token_hex(8)
    admin = _root()
    cursor = admin.cursor()
    cursor.execute(f"DROP USER IF EXISTS '{account}'@'%'")
    cursor.execute(f"CREATE USER '{account}'@'%' IDENTIFIED BY '{password}' WITH MAX_USER_CONNECTIONS 1")
    cursor.execute(f"GRANT ALL ON `{connection.settings_dict['NAME']}`.* TO '{account}'@'%'")

    @contextmanager
    def used_up() -> Iterator[None]:
        s = connection.settings_dict
        holder = MySQLdb.connect(host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306), user=account,
                                 passwd=password, db=s["NAME"])
        saved = dict(s)
        connection.close()
        s.update(USER=account, PASSWORD=password)
        try:
            yield
        finally:
            connection.close()
            s.clear()
            s.update(saved)
            holder.close()

    try:
        yield used_up
    finally:
        cursor.execute(f"DROP USER IF EXISTS '{account}'@'%'")
        admin.close()


def test_the_real_limit_is_what_the_fixture_says(connections_used_up):
    """The fault is the server's: the connect is refused with 1226, and the shop calls it unavailable."""
    with connections_used_up(), pytest.raises(OperationalError) as refused:
        Product.objects.count()
    assert refused.value.args[0] == 1226
    assert lost_connection(refused.value)


@pytest.mark.parametrize("code", [1040, 1203, 1226])
def test_a_refused_connection_counts_as_an_unavailable_database(code):
    assert lost_connection(OperationalError(code, "refused"))


@pytest.mark.parametrize("combining", [True, False])
def test_an_order_that_cannot_connect_is_database_unavailable_and_its_retry_places_it_once(
        connections_used_up, make_product, user, settings, combining):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": combining}
    product = make_product(stock=5)
    with connections_used_up(), pytest.raises(errors.DatabaseUnavailable) as caught:
        place_order(user=user, lines=[(product.pk, 1)], idempotency_key="refused-1")
    assert caught.value.details == {"outcome": "not_written"}
    assert caught.value.status == 503 and caught.value.retry_after
    assert not Order.objects.filter(user=user).exists()
    assert Product.objects.get(pk=product.pk).stock == 5
    placed = place_order(user=user, lines=[(product.pk, 1)], idempotency_key="refused-1")
    assert [o.pk for o in Order.objects.filter(user=user)] == [placed.order_id]
    assert Product.objects.get(pk=product.pk).stock == 4


def test_the_api_answers_503_json_with_retry_after(client, connections_used_up, make_product, user):
    product = make_product(stock=5)
    token = ApiToken.issue(user_id=user.pk, name="test")
    body = json.dumps({"lines": [{"product_id": product.pk, "quantity": 1}]})
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_IDEMPOTENCY_KEY": "refused-api"}
    with connections_used_up():
        refused = client.post("/api/orders/", data=body, content_type="application/json", **headers)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "database_unavailable"
    # Refused at the token lookup, outside the services: the middleware cannot tell what ran
    # before, so it says "unknown"; the retry with the same key settles it either way.
    assert refused.json()["error"]["details"]["outcome"] == "unknown"
    assert refused["Retry-After"] == str(errors.DatabaseUnavailable.retry_after)
    assert not Order.objects.filter(user=user).exists()
    again = client.post("/api/orders/", data=body, content_type="application/json", **headers)
    assert again.status_code == 201
    assert Order.objects.filter(user=user).count() == 1


@pytest.mark.parametrize("page", ["/", "/checkout/"])
def test_a_signed_in_page_that_cannot_connect_is_the_friendly_503_page(
        client, connections_used_up, make_product, user, page):
    client.force_login(user)
    client.post(f"/products/{make_product(stock=5).pk}/", {"quantity": 1})
    with connections_used_up():
        refused = client.post(page, {}) if page == "/checkout/" else client.get(page)
    assert refused.status_code == 503
    assert "Back in a moment" in refused.content.decode()
    assert refused["Retry-After"] == str(errors.DatabaseUnavailable.retry_after)
    assert not Order.objects.filter(user=user).exists()
