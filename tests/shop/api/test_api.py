"""Every JSON API route and status, through Django's test client, against MariaDB and Redis."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from locks import Lock
from shop.models import ApiToken, CouponClaim, Order, StockLedger

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(user) -> str:
    return ApiToken.issue(user_id=user.pk, name="test")


def post(client: Client, url: str, body, token: str | None = None, **headers):
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, data=data, content_type=headers.pop("content_type", "application/json"), **headers)


def error_code(response) -> str:
    return response.json()["error"]["code"]


def test_products_list_and_detail(client, make_product):
    p = make_product(stock=7, price="12.50")
    data = client.get("/api/products/").json()["results"]
    assert {"id": p.pk, "sku": p.sku, "name": p.name, "price": "12.50", "stock": 7, "opens_at": None,
            "closes_at": None, "min_account_age": None} in data
    assert client.get(f"/api/products/{p.pk}/").json()["stock"] == 7
    missing = client.get("/api/products/999999999/")
    assert missing.status_code == 404 and error_code(missing) == "unknown_product"


def test_place_order_201_then_replay_200_then_conflict_422(client, token, make_product):
    p = make_product(stock=5)
    body = {"lines": [{"product_id": p.pk, "quantity": 2}]}
    first = post(client, "/api/orders/", body, token, HTTP_IDEMPOTENCY_KEY="abc-1")
    assert first.status_code == 201
    order = first.json()
    assert order["lines"][0]["quantity"] == 2 and order["status"] == "pending_payment" and order["pay_by"]
    replay = post(client, "/api/orders/", body, token, HTTP_IDEMPOTENCY_KEY="abc-1")
    assert replay.status_code == 200 and replay.json()["id"] == order["id"]
    conflict = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token,
                    HTTP_IDEMPOTENCY_KEY="abc-1")
    assert conflict.status_code == 422 and error_code(conflict) == "idempotency_conflict"
    p.refresh_from_db()
    assert p.stock == 3 and Order.objects.count() == 1


def test_get_order_owner_only(client, token, other_user, make_product):
    p = make_product(stock=5)
    order_id = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token).json()["id"]
    mine = client.get(f"/api/orders/{order_id}/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert mine.status_code == 200 and mine.json()["id"] == order_id
    theirs = ApiToken.issue(user_id=other_user.pk)
    other = client.get(f"/api/orders/{order_id}/", HTTP_AUTHORIZATION=f"Bearer {theirs}")
    assert other.status_code == 404 and error_code(other) == "order_not_found"
    assert client.get("/api/orders/99999999/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404
    listing = client.get("/api/orders/", HTTP_AUTHORIZATION=f"Bearer {token}").json()["results"]
    assert [o["id"] for o in listing] == [order_id]


def test_not_signed_in_is_401_and_a_bad_token_too(client, make_product):
    p = make_product(stock=5)
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    anonymous = post(client, "/api/orders/", body)
    assert anonymous.status_code == 401 and error_code(anonymous) == "not_authenticated"
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert post(client, "/api/orders/", body, "shp_not-a-real-token").status_code == 401
    assert client.get("/api/orders/1/").status_code == 401
    assert post(client, "/api/coupons/X/claim/", {}).status_code == 401


def test_revoked_token_is_401(client, user, token, make_product):
    from shop.api.tokens import revoke

    revoke(token=ApiToken.objects.get(user=user))
    p = make_product(stock=5)
    response = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)
    assert response.status_code == 401


def test_session_auth_needs_csrf_403(user, make_product):
    p = make_product(stock=5)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    refused = post(client, "/api/orders/", body)
    assert refused.status_code == 403 and error_code(refused) == "csrf_failed"
    client.get("/")  # sets the CSRF cookie
    ok = post(client, "/api/orders/", body, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert ok.status_code == 201


def test_out_of_stock_409_names_what_is_left(client, token, make_product):
    p = make_product(stock=1)
    response = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 3}]}, token)
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "out_of_stock", "message": f"{p.name}: only 1 left.",
        "details": {"lines": [{"product_id": p.pk, "requested": 3, "available": 1}]}}


def test_claim_coupon_201_then_409(client, token, make_coupon):
    coupon = make_coupon(total=1)
    first = post(client, f"/api/coupons/{coupon.code}/claim/", {}, token)
    assert first.status_code == 201 and first.json()["coupon_code"] == coupon.code
    again = post(client, f"/api/coupons/{coupon.code}/claim/", {}, token)
    assert again.status_code == 409 and error_code(again) == "coupon_already_claimed"
    unknown = post(client, "/api/coupons/NOPE/claim/", {}, token)
    assert unknown.status_code == 404 and error_code(unknown) == "coupon_unknown"


def test_order_with_coupon(client, token, make_product, make_coupon):
    p = make_product(stock=5, price="30.00")
    coupon = make_coupon(total=5, discount="10.00")
    body = {"lines": [{"product_id": p.pk, "quantity": 1}], "coupon_code": coupon.code}
    not_claimed = post(client, "/api/orders/", body, token)
    assert not_claimed.status_code == 409 and error_code(not_claimed) == "coupon_not_claimed"
    post(client, f"/api/coupons/{coupon.code}/claim/", {}, token)
    placed = post(client, "/api/orders/", body, token)
    assert placed.status_code == 201 and placed.json()["total"] == "20.00"


@pytest.mark.parametrize("combining", [True, False])
def test_the_order_a_post_returns_is_the_order_a_get_reads(client, token, make_product, make_coupon, settings,
                                                            django_assert_max_num_queries, combining):
    # A combined order comes back from the combiner complete (its receipt) and is rendered
    # without reading it back; it must be exactly what the database says, replay included.
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": combining}
    p = make_product(stock=9, price="12.50")
    coupon = make_coupon(total=5, discount="5.00")
    post(client, f"/api/coupons/{coupon.code}/claim/", {}, token)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for body, key in (({"lines": [{"product_id": p.pk, "quantity": 3}], "coupon_code": coupon.code}, "rc-1"),
                      ({"lines": [{"product_id": p.pk, "quantity": 2}]}, None)):
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        posted = post(client, "/api/orders/", body, token, **headers)
        assert posted.status_code == 201
        assert posted.json() == client.get(f"/api/orders/{posted.json()['id']}/", **auth).json()
        if key:
            replayed = post(client, "/api/orders/", body, token, **headers)
            assert replayed.status_code == 200 and replayed.json() == posted.json()
    # Nothing read back on either path (a batch of one too): the token and the writer's queries.
    with django_assert_max_num_queries(9):
        post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)


def test_busy_lock_is_503_with_retry_after(client, token, make_product, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 0.05}
    p = make_product(stock=5)
    with Lock(f"product:{p.pk}", ttl=10.0):
        response = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)
    assert response.status_code == 503 and error_code(response) == "lock_timeout"
    assert response["Retry-After"] == "1"


def test_redis_down_is_503_lock_unavailable(client, token, make_product, settings, redis_server):
    settings.CACHES = {**settings.CACHES, "locks": {**settings.CACHES["locks"], "LOCATION": redis_server.url}}
    redis_server.stop()
    p = make_product(stock=5)
    response = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)
    assert response.status_code == 503 and error_code(response) == "lock_unavailable"
    assert int(response["Retry-After"]) > 0
    assert Order.objects.count() == 0


def test_unknown_routes_and_methods(client, token):
    missing = client.get("/api/nothing/here/")
    assert missing.status_code == 404 and error_code(missing) == "not_found"
    assert client.get("/api").status_code == 404
    wrong = client.delete("/api/products/")
    assert wrong.status_code == 405 and error_code(wrong) == "method_not_allowed"
    assert client.get("/api/coupons/X/claim/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


BAD_BODIES = [
    ("not json", "invalid_input", 400),
    ("[1, 2]", "invalid_input", 400),
    ('"a string"', "invalid_input", 400),
    ("{}", "invalid_input", 400),
    ('{"lines": []}', "invalid_input", 400),
    ('{"lines": "x"}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1, "extra": 1}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}], "surprise": true}', "invalid_input", 400),
    ('{"lines": [{"product_id": "1", "quantity": 1}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 0}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 1, "quantity": -1}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1.5}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 1, "quantity": true}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1e400}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 1, "quantity": NaN}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 99999999999999999999999}]}', "invalid_quantity", 400),
    ('{"lines": [{"product_id": 99999999999999999999999, "quantity": 1}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}, {"product_id": 1, "quantity": 2}]}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}], "coupon_code": 5}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}], "coupon_code": "' + "x" * 41 + '"}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}], "coupon_code": "a\\u0000b"}', "invalid_input", 400),
    ('{"lines": [{"product_id": 1, "quantity": 1}], "coupon_code": "\\ud800"}', "invalid_input", 400),
    ("[" * 100_000, "payload_too_large", 413),
    ('{"lines": [' + ",".join([f'{{"product_id": {i}, "quantity": 1}}' for i in range(1, 30)]) + "]}",
     "invalid_input", 400),
]


@pytest.mark.parametrize(("body", "code", "status"), BAD_BODIES)
def test_bad_bodies_are_4xx_and_write_nothing(client, token, make_product, body, code, status):
    make_product(stock=5)
    before = (Order.objects.count(), StockLedger.objects.count(), CouponClaim.objects.count())
    response = post(client, "/api/orders/", body, token)
    assert (response.status_code, error_code(response)) == (status, code), response.content
    assert (Order.objects.count(), StockLedger.objects.count(), CouponClaim.objects.count()) == before


def test_wrong_content_type_is_415(client, token, make_product):
    p = make_product(stock=5)
    body = json.dumps({"lines": [{"product_id": p.pk, "quantity": 1}]})
    response = post(client, "/api/orders/", body, token, content_type="text/plain")
    assert response.status_code == 415 and error_code(response) == "unsupported_media_type"
    form = client.post("/api/orders/", {"lines": "x"}, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert form.status_code == 415


def test_bad_idempotency_key_header_is_400(client, token, make_product):
    p = make_product(stock=5)
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    for key in ("x" * 129, "bad key with spaces inside\t", "ünïcode"):
        response = post(client, "/api/orders/", body, token, HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["details"]
    assert Order.objects.count() == 0


def test_unknown_and_inactive_products_in_an_order(client, token, make_product, user):
    # A hidden (inactive) product answers exactly like a missing one, so the API
    # cannot be used to find unlisted products; staff still get the real reason.
    gone = make_product(stock=5, active=False)
    unknown = post(client, "/api/orders/", {"lines": [{"product_id": 987654321, "quantity": 1}]}, token)
    assert unknown.status_code == 404 and error_code(unknown) == "unknown_product"
    inactive = post(client, "/api/orders/", {"lines": [{"product_id": gone.pk, "quantity": 1}]}, token)
    assert inactive.status_code == 404 and error_code(inactive) == "unknown_product"
    assert inactive.json()["error"]["message"] == unknown.json()["error"]["message"]
    assert inactive.json()["error"]["details"] == {"product_ids": [gone.pk]}
    assert client.get(f"/api/products/{gone.pk}/").status_code == 404
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    staff_token = ApiToken.issue(user_id=user.pk, name="staff")  # a token's user is cached: a fresh one
    staff = post(client, "/api/orders/", {"lines": [{"product_id": gone.pk, "quantity": 1}]}, staff_token)
    assert staff.status_code == 409 and error_code(staff) == "inactive_product"
    assert Order.objects.count() == 0


def test_head_is_allowed_wherever_get_is(client, token, make_product):
    p = make_product(stock=3)
    order_id = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token).json()["id"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for url in ("/api/products/", f"/api/products/{p.pk}/", "/api/orders/", f"/api/orders/{order_id}/"):
        response = client.head(url, **auth)
        assert response.status_code == 200, url
        assert response["Content-Type"] == "application/json" and response.content == b""
    assert client.head("/api/orders/").status_code == 401  # HEAD is a read: still signed in only
    refused = client.put("/api/orders/", **auth)
    assert refused.status_code == 405 and refused["Allow"] == "GET, POST, HEAD"
    claim = client.head("/api/coupons/X/claim/", **auth)
    assert claim.status_code == 405 and claim["Allow"] == "POST"
    assert Order.objects.count() == 1


def test_coupon_codes_with_odd_characters_can_be_claimed_not_crash(client, token):
    from shop.models import Coupon

    coupon = Coupon.objects.create(code="A/B", discount="1.00", total=5, remaining=5)  # saved before validation
    response = post(client, "/api/coupons/A/B/claim/", {}, token)
    assert response.status_code == 201 and response.json()["coupon_code"] == "A/B"
    assert CouponClaim.objects.filter(coupon=coupon).count() == 1
    assert error_code(post(client, "/api/coupons/NO%2FSUCH/claim/", {}, token)) == "coupon_unknown"
    assert error_code(post(client, f"/api/coupons/{'x' * 41}/claim/", {}, token)) == "not_found"


def test_an_order_past_the_purchase_cap_is_409_purchase_limit(client, token, make_product):
    p = make_product(stock=10)
    p.max_per_user, p.name = 2, "Sneaker X"
    p.save(update_fields=["max_per_user", "name"])
    body = {"lines": [{"product_id": p.pk, "quantity": 2}]}
    assert post(client, "/api/orders/", body, token).status_code == 201
    refused = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)
    assert refused.status_code == 409 and error_code(refused) == "purchase_limit"
    assert refused.json()["error"]["details"] == {"product_id": p.pk, "limit": 2, "bought": 2, "requested": 1}
    assert refused.json()["error"]["message"] == "Sneaker X: Limit 2 per customer; you already have 2 in your orders."
    assert Order.objects.count() == 1


def test_pay_route_200_owner_only_and_409_when_expired(client, token, other_user, make_product):
    from datetime import timedelta

    from django.utils import timezone

    p = make_product(stock=5)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    first = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token).json()
    late = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token).json()
    theirs = ApiToken.issue(user_id=other_user.pk)
    assert post(client, f"/api/orders/{first['id']}/pay/", {}, theirs).status_code == 404  # not theirs
    paid = post(client, f"/api/orders/{first['id']}/pay/", {}, token)
    assert paid.status_code == 200 and paid.json()["status"] == "paid" and paid.json()["paid_at"]
    again = post(client, f"/api/orders/{first['id']}/pay/", {}, token)
    assert again.status_code == 200 and again.json()["paid_at"] == paid.json()["paid_at"]
    Order.objects.filter(pk=late["id"]).update(pay_by=timezone.now() - timedelta(seconds=1))
    refused = post(client, f"/api/orders/{late['id']}/pay/", {}, token)
    assert refused.status_code == 409 and error_code(refused) == "order_not_payable"
    assert client.get(f"/api/orders/{first['id']}/pay/", **auth).status_code == 405
    assert post(client, "/api/orders/99999999/pay/", {}, token).status_code == 404
    assert post(client, f"/api/orders/{first['id']}/pay/", {}).status_code == 401


def test_cancel_route_unpaid_only(client, token, make_product):
    p = make_product(stock=5)
    unpaid = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 2}]}, token).json()
    paid = post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token).json()
    post(client, f"/api/orders/{paid['id']}/pay/", {}, token)
    cancelled = post(client, f"/api/orders/{unpaid['id']}/cancel/", {}, token)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    refused = post(client, f"/api/orders/{paid['id']}/cancel/", {}, token)
    assert refused.status_code == 409 and error_code(refused) == "order_not_cancellable"
    # Told what a buyer can do: a refund is staff's (issue 37: "refund it instead" was for staff).
    message = refused.json()["error"]["message"]
    assert "refund it" not in message and message.startswith("This order is paid")
    assert StockLedger.objects.filter(order_id=unpaid["id"], reason="cancel").count() == 1
