"""GET /api/ping/: the request path's floor (the middleware, the token check, a JSON answer) that
`loadtest --compare-http` measures the checkout against; through Django's test client."""

from __future__ import annotations

import pytest

from shop.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(user) -> str:
    return ApiToken.issue(user_id=user.pk, name="test")


def test_ping_answers_ok_to_a_token(client, token):
    response = client.get("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"ok": True}
    assert client.head("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_ping_does_no_sql_of_its_own(client, token, django_assert_num_queries):
    """Once the token's user is cached (the first request reads it), a ping sends no SQL at all."""
    client.get("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {token}")
    with django_assert_num_queries(0):
        assert client.get("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_ping_unauthenticated_is_answered_as_the_other_signed_in_routes(client):
    ping, orders = client.get("/api/ping/"), client.get("/api/orders/")
    assert ping.status_code == orders.status_code == 401
    assert ping.json() == orders.json()
    assert ping.json()["error"]["code"] == "not_authenticated"
    assert ping["WWW-Authenticate"] == orders["WWW-Authenticate"]
    bad = {"HTTP_AUTHORIZATION": "Bearer shp_not-a-real-token"}
    assert client.get("/api/ping/", **bad).json() == client.get("/api/orders/", **bad).json()
    assert client.get("/api/ping/", **bad).status_code == 401


def test_ping_is_get_only(client, token):
    response = client.post("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"
