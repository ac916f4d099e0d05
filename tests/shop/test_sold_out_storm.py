"""The sold-out storm over HTTP: a refused request costs no SQL at all, and
a retry whose Idempotency-Key bought the last unit still gets its order back."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from shop.api.tokens import revoke
from shop.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def _order(client, token: str, product_id: int, key: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    body = json.dumps({"lines": [{"product_id": product_id, "quantity": 1}]})
    return client.post("/api/orders/", data=body, content_type="application/json", **headers)


@pytest.fixture
def sold_out(client, make_product, other_user):
    """A product whose last unit went to other_user; the next buyer saw 0 and marked it."""
    product = make_product(stock=1)
    token = ApiToken.issue(user_id=other_user.pk, name="first")
    assert _order(client, token, product.pk, key="last-unit").status_code == 201
    assert _order(client, token, product.pk).json()["error"]["code"] == "out_of_stock"
    return product, token


@pytest.mark.parametrize("with_key", [False, True])
def test_a_refused_order_in_a_sold_out_storm_sends_no_sql(client, sold_out, user, django_assert_num_queries,
                                                          with_key):
    product, _ = sold_out
    token = ApiToken.issue(user_id=user.pk, name="storm")
    _order(client, token, product.pk)  # the first request looks the token up
    for n in range(3):
        with django_assert_num_queries(0):  # old code: the token lookup, and a replay SELECT per key
            response = _order(client, token, product.pk, key=f"storm-{n}" if with_key else None)
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "out_of_stock"


def test_a_retry_of_the_key_that_bought_the_last_unit_gets_its_order(client, sold_out):
    product, token = sold_out
    replay = _order(client, token, product.pk, key="last-unit")
    assert replay.status_code == 200  # the replay, not out_of_stock
    assert replay.json()["lines"][0]["product_id"] == product.pk


def test_a_revoked_token_is_refused_at_once_despite_the_cache(client, make_product, user):
    product = make_product(stock=5)
    raw = ApiToken.issue(user_id=user.pk, name="soon revoked")
    assert _order(client, raw, product.pk).status_code == 201  # cached now
    revoke(token=ApiToken.objects.get(key_hash=ApiToken.hash(raw)))
    assert _order(client, raw, product.pk).status_code == 401


def test_database_connections_are_kept_between_requests_by_default():
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] >= 60
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True
