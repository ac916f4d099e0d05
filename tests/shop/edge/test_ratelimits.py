"""Rate limits on the endpoints worth hammering, counted in the real Redis."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from shop import errors
from shop.models import ApiToken, CouponClaim, Order
from tests.helpers import make_users, order_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def limits(settings):
    """Set some limits low for one test (the others keep their defaults). Per hour, not per
    minute: django-ratelimit counts in fixed windows (offset per key), and a test whose requests
    straddle a window's end sees a fresh budget; with a minute window that happened in CI."""

    def set_limits(**rates: str | None) -> None:
        settings.SHOP = {**getattr(settings, "SHOP", {}), "RATE_LIMITS": rates}

    return set_limits


def api_post(client: Client, url: str, body: dict, token: str):
    return client.post(url, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def assert_api_rate_limited(response, limit: str) -> None:
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "rate_limited" == errors.RateLimited.code
    assert error["message"]
    assert error["details"]["limit"] == limit and error["details"]["rate"]
    assert 1 <= int(response["Retry-After"]) <= 3600
    assert error["details"]["retry_after"] == int(response["Retry-After"])


def assert_web_rate_limited(response) -> None:
    assert response.status_code == 429
    assert "Too many tries, please slow down" in response.content.decode()
    assert int(response["Retry-After"]) >= 1


def test_api_checkout_is_limited_per_user_and_writes_nothing_once_limited(limits, client, user, other_user,
                                                                          make_product):
    limits(checkout="3/h")
    p = make_product(stock=100)
    token, other = ApiToken.issue(user_id=user.pk, name="t"), ApiToken.issue(user_id=other_user.pk, name="t")
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    assert [api_post(client, "/api/orders/", body, token).status_code for _ in range(3)] == [201, 201, 201]
    assert_api_rate_limited(api_post(client, "/api/orders/", body, token), "checkout")
    assert Order.objects.filter(user=user).count() == 3
    # Another buyer has a budget of their own; reads are never counted.
    assert api_post(client, "/api/orders/", body, other).status_code == 201
    assert client.get("/api/orders/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_api_coupon_claims_are_limited(limits, client, user, make_coupon):
    limits(coupon_claim="2/h")
    token = ApiToken.issue(user_id=user.pk, name="t")
    a, b, c = make_coupon(), make_coupon(), make_coupon()
    assert api_post(client, f"/api/coupons/{a.code}/claim/", {}, token).status_code == 201
    assert api_post(client, "/api/coupons/NOPE/claim/", {}, token).status_code == 404  # counts too
    assert_api_rate_limited(api_post(client, f"/api/coupons/{b.code}/claim/", {}, token), "coupon_claim")
    assert not CouponClaim.objects.filter(coupon__in=[b, c]).exists()


def test_web_checkout_and_coupon_claims_are_limited(limits, client, user, make_product, make_coupon):
    limits(checkout="1/h", coupon_claim="1/h")
    client.force_login(user)
    p = make_product(stock=10)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    assert client.post("/checkout/", {"idempotency_key": key}).status_code == 302
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    assert_web_rate_limited(client.post("/checkout/", {"idempotency_key": "another-key"}))
    assert Order.objects.count() == 1
    assert client.get("/checkout/").status_code == 200  # looking is never limited
    a, b = make_coupon(), make_coupon()
    assert client.post(f"/coupons/{a.code}/claim/").status_code == 302
    assert_web_rate_limited(client.post(f"/coupons/{b.code}/claim/"))
    assert CouponClaim.objects.filter(user=user).count() == 1


def test_login_is_limited_per_ip_and_per_username(limits, client):
    limits(login="3/h", login_account="2/h")
    get_user_model().objects.create_user("victim", password="a-long-pass-123")
    for _ in range(2):
        assert client.post("/login/", {"username": "victim", "password": "guess"}).status_code == 200
    # The account's budget is spent: even the right password waits (no guessing in between).
    assert_web_rate_limited(client.post("/login/", {"username": "victim", "password": "a-long-pass-123"}))
    # Other names from the same address: the per-IP limit.
    assert client.post("/login/", {"username": "someone", "password": "guess"}).status_code == 429
    assert client.get("/login/").status_code == 200


def test_the_account_limit_counts_every_spelling_the_login_accepts(limits, client):
    """Log-in finds the account whatever the case, the surrounding spaces (the form strips them)
    or the accents (MariaDB's collation): one account, one budget."""
    get_user_model().objects.create_user("alice", password="a-long-pass-123")
    limits(login=None, login_account="50/h")
    for name in (" ALICE ", "Alicé", "al\u200bice"):  # the premise: each of them logs in as alice
        assert client.post("/login/", {"username": name, "password": "a-long-pass-123"}).status_code == 302
        client.logout()
    limits(login=None, login_account="3/h")  # a fresh budget: the counters are per rate
    for name in ("Alice", " alice", "ALICE "):
        assert client.post("/login/", {"username": name, "password": "guess"}).status_code == 200
    for name in ("alice", "Alicé", "al\u200bice"):  # spent: even the right password waits
        assert_web_rate_limited(client.post("/login/", {"username": name, "password": "a-long-pass-123"}))
    # A name with no account has a budget of its own, shared by its spellings too.
    for name in ("Nobody", "nobody ", " NOBODY"):
        assert client.post("/login/", {"username": name, "password": "guess"}).status_code == 200
    assert_web_rate_limited(client.post("/login/", {"username": "nobody", "password": "guess"}))


def assert_form_rate_limited(response, form_id: str) -> None:
    """The web's 429 on a form page: the same form, its error saying how long to wait."""
    assert response.status_code == 429
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 3600
    page = response.content.decode()
    assert f'id="{form_id}"' in page
    errors_shown = response.context["form"].non_field_errors()
    assert len(errors_shown) == 1 and "Too many" in errors_shown[0] and "second" in errors_shown[0]
    assert errors_shown[0].split("Too many")[0] == "" and errors_shown[0] in page.replace("&#x27;", "'")


def signup_post(client: Client, name: str, ip: str = "127.0.0.1"):
    return client.post("/signup/", {"username": name, "password1": "a-long-pass-123",
                                    "password2": "a-long-pass-123"}, REMOTE_ADDR=ip)


def test_signup_is_limited_per_ip_with_the_form_and_its_error(limits, client):
    limits(signup="2/h")
    for i in range(2):
        assert signup_post(client, f"new{i}").status_code == 302
        client.logout()
    refused = signup_post(client, "new9")
    assert_form_rate_limited(refused, "signup-form")
    assert refused.context["form"]["username"].value() == "new9"  # what they typed stays
    assert not get_user_model().objects.filter(username="new9").exists()
    # Another address has a budget of its own; looking at the form is never counted.
    assert client.get("/signup/").status_code == 200
    assert signup_post(client, "new10", ip="10.9.8.7").status_code == 302
    assert get_user_model().objects.filter(username__startswith="new").count() == 3


def test_token_creation_is_limited_per_account_with_the_form_and_its_error(limits, client, user):
    limits(token_create="1/h", token_create_ip=None)
    client.force_login(user)
    assert "shp_" in client.post("/account/tokens/", {"name": "one"}).content.decode()
    refused = client.post("/account/tokens/", {"name": "two"})
    assert_form_rate_limited(refused, "token-form")
    assert 'id="new-token"' not in refused.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 1
    token = ApiToken.objects.get(user=user)
    assert client.post("/account/tokens/", {"revoke": str(token.pk)}).status_code == 302  # revoking is not limited
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_token_creation_is_limited_per_ip_across_accounts(limits, client):
    """A farm of fresh accounts behind one address: each account has its own budget, the address
    one for all of them."""
    limits(token_create="5/h", token_create_ip="3/h")
    accounts = make_users(4, prefix="farm")
    for account in accounts[:3]:
        client.force_login(account)
        assert client.post("/account/tokens/", {"name": "bot"}, REMOTE_ADDR="10.1.1.1").context["new_token"]
    client.force_login(accounts[3])
    assert_form_rate_limited(client.post("/account/tokens/", {"name": "bot"}, REMOTE_ADDR="10.1.1.1"), "token-form")
    assert not ApiToken.objects.filter(user=accounts[3]).exists()
    # The same account from another address: its own budget is not spent.
    assert client.post("/account/tokens/", {"name": "bot"}, REMOTE_ADDR="10.2.2.2").context["new_token"]
    assert ApiToken.objects.count() == 4


def test_limits_can_be_lifted_one_by_one_or_all_at_once(limits, settings, client, user, make_product):
    p = make_product(stock=100)
    token = ApiToken.issue(user_id=user.pk, name="t")
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    limits(checkout=None)
    assert all(api_post(client, "/api/orders/", body, token).status_code == 201 for _ in range(4))
    limits(checkout="1/h")
    settings.RATELIMIT_ENABLE = False
    assert all(api_post(client, "/api/orders/", body, token).status_code == 201 for _ in range(3))
    settings.RATELIMIT_ENABLE = True
    assert api_post(client, "/api/orders/", body, token).status_code == 201
    assert api_post(client, "/api/orders/", body, token).status_code == 429


def test_default_checkout_limit_leaves_room_for_the_load_test():
    """`loadtest --url` defaults: 2,000 requests over 100 users, i.e. 20 orders a user."""
    from shop.edge.ratelimits import rate_for

    count, _, period = rate_for("checkout").partition("/")
    assert int(count) >= 100 and period == "m"


def test_a_redis_outage_never_turns_the_limiter_into_a_500(limits, client, user, private_redis, make_product):
    limits(checkout="1/h")
    token = ApiToken.issue(user_id=user.pk, name="t")
    p = make_product(stock=5)
    private_redis.stop()
    response = api_post(client, "/api/orders/", {"lines": [{"product_id": p.pk, "quantity": 1}]}, token)
    assert response.status_code == 503  # the lock's own answer, not a limiter crash
    assert response.json()["error"]["code"] == "lock_unavailable"


def test_api_pay_and_cancel_are_limited_per_user(limits, client, user, other_user, make_product):
    from shop.services import place_order

    limits(pay="2/h", cancel="1/h")
    p = make_product(stock=20)
    token, other = ApiToken.issue(user_id=user.pk, name="t"), ApiToken.issue(user_id=other_user.pk, name="t")
    a, b, c, d = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(4))
    assert api_post(client, f"/api/orders/{a.pk}/pay/", {}, token).status_code == 200
    assert api_post(client, f"/api/orders/{a.pk}/pay/", {}, token).status_code == 200  # paying again counts too
    assert_api_rate_limited(api_post(client, f"/api/orders/{b.pk}/pay/", {}, token), "pay")
    assert api_post(client, f"/api/orders/{c.pk}/cancel/", {}, token).status_code == 200
    assert_api_rate_limited(api_post(client, f"/api/orders/{d.pk}/cancel/", {}, token), "cancel")
    statuses = dict(Order.objects.filter(user=user).values_list("pk", "status"))
    assert statuses == {a.pk: "paid", b.pk: "pending_payment", c.pk: "cancelled", d.pk: "pending_payment"}
    # Another buyer's budget is their own.
    theirs = order_of(place_order(user=other_user, lines=[(p.pk, 1)]))
    assert api_post(client, f"/api/orders/{theirs.pk}/pay/", {}, other).status_code == 200


def test_web_pay_and_cancel_are_limited(limits, client, user, make_product):
    from django.urls import reverse

    from shop.services import place_order

    limits(pay="1/h", cancel="1/h")
    client.force_login(user)
    p = make_product(stock=20)
    a, b, c, d = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(4))
    assert client.post(reverse("order_pay", args=[a.pk])).status_code == 302
    assert_web_rate_limited(client.post(reverse("order_pay", args=[b.pk])))
    assert client.post(reverse("order_cancel", args=[c.pk])).status_code == 302
    assert_web_rate_limited(client.post(reverse("order_cancel", args=[d.pk])))
    statuses = dict(Order.objects.filter(user=user).values_list("pk", "status"))
    assert statuses == {a.pk: "paid", b.pk: "pending_payment", c.pk: "cancelled", d.pk: "pending_payment"}
    assert client.get(reverse("order", args=[b.pk])).status_code == 200  # looking is never limited


def test_default_pay_and_cancel_limits_leave_room_for_the_load_test():
    """`loadtest --url --pay 1` pays every order it places: pay may not be tighter than checkout."""
    from shop.edge.ratelimits import rate_for

    def per_minute(name: str) -> int:
        count, _, period = rate_for(name).partition("/")
        assert period == "m"
        return int(count)

    assert per_minute("pay") >= per_minute("checkout")
    assert 10 <= per_minute("cancel") <= per_minute("checkout")


def test_password_reset_is_limited_per_address_from_any_ip(limits, client):
    """One address cannot be flooded with reset mails from many client IPs. The
    address is normalized (strip, casefold), and an unknown one is limited alike."""
    limits(password_reset="100/h", password_reset_address="2/h")
    get_user_model().objects.create_user("ann", email="ann@example.com", password="a-long-pass-123")

    def reset(address: str, ip: str):
        return client.post("/password-reset/", {"email": address}, REMOTE_ADDR=ip)

    assert reset("ann@example.com", "10.0.0.1").status_code == 302
    assert reset("  ANN@example.com ", "10.0.0.2").status_code == 302
    assert_web_rate_limited(reset("Ann@Example.COM", "10.0.0.3"))
    assert reset("other@example.com", "10.0.0.3").status_code == 302  # another address: its own budget
    for ip in ("10.0.1.1", "10.0.1.2"):
        assert reset("nobody@example.com", ip).status_code == 302
    assert_web_rate_limited(reset("nobody@example.com", "10.0.1.3"))


def test_the_per_address_key_holds_no_address():
    from django.test import RequestFactory

    from shop.edge.ratelimits import LIMITS

    key = LIMITS["password_reset_address"].key
    factory = RequestFactory()
    a = key("shop.password_reset_address", factory.post("/password-reset/", {"email": " Ann@Example.com "}))
    b = key("shop.password_reset_address", factory.post("/password-reset/", {"email": "ann@example.com"}))
    assert a == b and "ann" not in a.lower() and "example" not in a.lower()
