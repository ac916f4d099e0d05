"""The web checkout through Django's test client: pages, cart, checkout, errors in plain words."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from locks import Lock
from shop.models import ApiToken, CouponClaim, Order, Product
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shopper(client, user):
    client.force_login(user)
    return client


def test_catalog_shows_stock_and_sold_out(client, make_product):
    make_product(stock=0)
    make_product(stock=3)
    make_product(stock=40)
    page = client.get("/").content.decode()
    assert "Sold out" in page and "Only 3 left" in page and "40 in stock" in page


def test_product_page_and_add_to_cart(client, make_product):
    p = make_product(stock=5)
    assert p.name in client.get(f"/products/{p.pk}/").content.decode()
    response = client.post(f"/products/{p.pk}/", {"quantity": 2})
    assert response.status_code == 302
    cart = client.get("/cart/").content.decode()
    assert p.name in cart and 'value="2"' in cart
    assert client.get("/products/999999/").status_code == 404
    assert client.post(f"/products/{p.pk}/", {"quantity": "lots"}).status_code == 200  # form error, no 500


def test_checkout_requires_login(client):
    response = client.get("/checkout/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def _checkout(shopper, **extra):
    page = shopper.get("/checkout/")
    key = page.context["form"].initial["idempotency_key"]
    return key, shopper.post("/checkout/", {"idempotency_key": key, **extra})


def test_checkout_places_the_order_and_a_double_submit_does_not_order_twice(shopper, user, make_product):
    a, b = make_product(stock=5, price="10.00"), make_product(stock=5, price="1.00")
    shopper.post(f"/products/{a.pk}/", {"quantity": 2})
    shopper.post(f"/products/{b.pk}/", {"quantity": 1})
    key, first = _checkout(shopper)
    assert first.status_code == 302
    order = Order.objects.get(user=user)
    assert first["Location"] == f"/orders/{order.pk}/"
    again = shopper.post("/checkout/", {"idempotency_key": key})  # the double click
    assert again.status_code == 302 and again["Location"] == f"/orders/{order.pk}/"
    assert Order.objects.filter(user=user).count() == 1
    page = shopper.get(f"/orders/{order.pk}/").content.decode()
    assert "21.00" in page
    assert f"#{order.pk}" in shopper.get("/orders/").content.decode()


def test_resubmitting_the_same_key_with_the_cart_refilled_still_orders_once(shopper, user, make_product):
    p = make_product(stock=5)
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    key, _ = _checkout(shopper)
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})  # same cart again, same form resent
    again = shopper.post("/checkout/", {"idempotency_key": key})
    assert Order.objects.filter(user=user).count() == 1
    assert again.status_code == 302


def test_out_of_stock_in_plain_words(shopper, make_product, monkeypatch):
    """Stock that shrinks between the page and the locks: the service's refusal, in plain words,
    with its status (409, as the API answers it and as a drop's edge is refused)."""
    from shop.web import cart

    p = make_product(stock=5)
    shopper.post(f"/products/{p.pk}/", {"quantity": 5})
    key = shopper.get("/checkout/").context["form"].initial["idempotency_key"]
    Product.objects.filter(pk=p.pk).update(stock=3)
    real_review = cart.review
    monkeypatch.setattr(cart, "review", lambda s, products, held=None: [  # the page saw 5 in stock
        cart.Line(product_id=r.product_id, quantity=r.quantity, product=r.product)
        for r in real_review(s, products, held=held)])
    response = shopper.post("/checkout/", {"idempotency_key": key})
    assert response.status_code == 409
    assert f"{p.name}: only 3 left." in response.content.decode()
    assert Order.objects.count() == 0


def test_busy_in_plain_words(shopper, make_product, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 0.05}
    p = make_product(stock=3)
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    with Lock(f"product:{p.pk}", ttl=10.0):
        _, response = _checkout(shopper)
    page = response.content.decode()
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "your turn did not come in time" in page and 'id="busy-retry"' in page  # it retries by itself
    assert "requestSubmit" in page


def test_coupon_center_claim_and_checkout_with_it(shopper, user, make_product, make_coupon):
    coupon = make_coupon(total=2, discount="3.00")
    page = shopper.get("/coupons/").content.decode()
    assert coupon.code in page and "2 of 2 left" in page
    shopper.post(f"/coupons/{coupon.code}/claim/")
    assert CouponClaim.objects.filter(user=user, coupon=coupon).exists()
    again = shopper.post(f"/coupons/{coupon.code}/claim/", follow=True)
    assert "You already have this coupon" in again.content.decode()
    p = make_product(stock=5, price="10.00")
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    _, response = _checkout(shopper, coupon_code=coupon.code)
    order = Order.objects.get(user=user)
    assert order.total == 7 and response["Location"] == f"/orders/{order.pk}/"


def test_coupon_claim_needs_login_and_post(client, make_coupon):
    coupon = make_coupon()
    assert client.post(f"/coupons/{coupon.code}/claim/").status_code == 302
    assert client.get(f"/coupons/{coupon.code}/claim/").status_code in (302, 405)


def test_orders_are_private(shopper, other_user, make_product):
    from shop.services import place_order

    p = make_product(stock=5)
    theirs = order_of(place_order(user=other_user, lines=[(p.pk, 1)]))
    assert shopper.get(f"/orders/{theirs.pk}/").status_code == 404


def test_signup_login_logout(client):
    response = client.post("/signup/", {"username": "newbie", "password1": "a-long-pass-123",
                                        "password2": "a-long-pass-123"})
    assert response.status_code == 302
    assert "newbie" in client.get("/").content.decode()
    client.post("/logout/")
    assert "Log in" in client.get("/").content.decode()
    assert client.post("/login/", {"username": "newbie", "password": "a-long-pass-123"}).status_code == 302


def test_logging_out_says_so_on_the_page_it_lands_on(client, user):
    client.force_login(user)
    landed = client.post("/logout/", follow=True)
    assert landed.redirect_chain == [(reverse("catalog"), 302)]
    page = landed.content.decode()
    assert '<li class="info">You are logged out.</li>' in page and "Log in" in page
    assert "You are logged out." not in client.get("/").content.decode()  # said once


def _menu_links(client) -> list[str]:
    """The header's account links (the wide header's; the phone menu repeats them)."""
    page = client.get("/").content.decode()
    header = page.split('<div class="user wide">', 1)[1].split("</div>", 1)[0]
    return [text.strip() for text in re.findall(r"<a [^>]*>([^<]+)</a>", header)]


def test_the_menu_shows_api_tokens_to_staff_and_to_users_who_have_one_only(client, user):
    """A developer's page, not a shopper's: everyone else finds it at the foot of their orders."""
    client.force_login(user)
    assert "API tokens" not in _menu_links(client)
    note = re.search(r'<p class="muted" id="api-tokens-note">(.*?)</p>', client.get("/orders/").content.decode())
    assert note and f'<a href="{reverse("api_tokens")}">API tokens</a>' in note.group(1)
    ApiToken.issue(user_id=user.pk, name="script")
    assert "API tokens" in _menu_links(client)
    assert 'id="api-tokens-note"' not in client.get("/orders/").content.decode()
    staff = get_user_model().objects.create_user("ops", password="a-long-pass-123", is_staff=True)
    client.force_login(staff)
    assert "API tokens" in _menu_links(client)
    client.logout()
    assert "API tokens" not in client.get("/").content.decode()


# --- `next` is followed only to a path of this site ---------------------------------------------
BAD_NEXT = [
    "foo",  # was a 500 after sign-up: redirect() took it for a URL name
    "order",  # a URL name that needs arguments
    "catalog",  # a URL name: never resolved as one
    "//evil.example",
    "https://evil.example/",
    "/\\evil.example",  # a backslash: browsers read //evil.example
    "javascript:alert(1)",
    "",
    "/" + "a" * 5000,
    "x" * 5000,
    " /cart/",
    "/cart/\r\nSet-Cookie: x=1",  # a header in the Location: refused, not a 500
]


@pytest.mark.parametrize("target", BAD_NEXT)
def test_a_bad_next_is_never_followed_nor_a_500(client, target):
    """Sign-up (the `?next=` of the finding, and the form's hidden field), log-in and log-out: a
    `next` that is not a path of this site falls back to the catalog."""
    catalog = reverse("catalog")
    signup = client.post(f"/signup/?next={quote(target, safe='')}", {
        "username": "newbie", "password1": "a-long-pass-123", "password2": "a-long-pass-123"})
    assert signup.status_code == 302 and signup["Location"] == catalog
    assert get_user_model().objects.filter(username="newbie").exists()
    client.post("/logout/")
    again = client.post("/signup/", {"username": "newbie2", "password1": "a-long-pass-123",
                                     "password2": "a-long-pass-123", "next": target})
    assert again.status_code == 302 and again["Location"] == catalog
    logout = client.post("/logout/", {"next": target})
    assert logout.status_code == 302 and logout["Location"] == catalog
    login = client.post("/login/", {"username": "newbie", "password": "a-long-pass-123", "next": target})
    assert login.status_code == 302 and login["Location"] == catalog
    client.post("/logout/")
    by_query = client.post(f"/login/?next={quote(target, safe='')}",
                           {"username": "newbie", "password": "a-long-pass-123"})
    assert by_query.status_code == 302 and by_query["Location"] == catalog
    client.post("/logout/")
    # The pages never carry it on (the hidden field, the links to each other and the reset).
    for page in ("/login/", "/signup/"):
        response = client.get(f"{page}?next={quote(target, safe='')}")
        assert response.status_code == 200 and response.context["next"] == ""
    assert client.get(f"/password-reset/?next={quote(target, safe='')}").status_code == 200
    assert "shop.next_after_reset" not in client.session


@pytest.mark.parametrize("target", ["/cart/", "/products/1/?ref=mail", "/coupons/"])
def test_a_path_of_this_site_is_followed(client, target):
    signup = client.post(f"/signup/?next={quote(target, safe='')}", {
        "username": "newbie", "password1": "a-long-pass-123", "password2": "a-long-pass-123"})
    assert signup.status_code == 302 and signup["Location"] == target
    client.post("/logout/")
    login = client.post("/login/", {"username": "newbie", "password": "a-long-pass-123", "next": target})
    assert login.status_code == 302 and login["Location"] == target
    assert client.get(f"/login/?next={quote(target, safe='')}").context["next"] == target
    logout = client.post("/logout/", {"next": target})
    assert logout.status_code == 302 and logout["Location"] == target


def test_api_token_page_creates_and_revokes(shopper, user):
    page = shopper.post("/account/tokens/", {"name": "locust"})
    token = page.context["new_token"]
    assert token.startswith("shp_") and token in page.content.decode()
    stored = ApiToken.objects.get(user=user)
    assert stored.key_hash == ApiToken.hash(token) and token not in stored.key_hash
    shopper.post("/account/tokens/", {"revoke": str(stored.pk)})
    stored.refresh_from_db()
    assert stored.revoked_at is not None
    assert shopper.post("/account/tokens/", {"revoke": "not-a-number"}).status_code == 302


# --- hardening ---------------------------------------------------------------------------------
def test_a_forged_messages_cookie_is_ignored(client):
    """Messages live in the session: a messages cookie (even one signed with our key, marked as
    safe HTML) is never read, so nothing of it is rendered, raw or escaped."""
    from django.contrib.messages import constants
    from django.contrib.messages.storage.base import Message
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.http import HttpRequest
    from django.utils.safestring import mark_safe

    forged = CookieStorage(HttpRequest())._encode(
        [Message(constants.ERROR, mark_safe('<script id="forged">alert("pwned")</script>'))])
    client.cookies["messages"] = forged
    page = client.get("/").content.decode()
    assert "pwned" not in page and "forged" not in page


def test_messages_are_escaped_and_kept_in_the_session(client, user, make_coupon):
    from shop.models import Coupon

    legacy = Coupon.objects.create(code="<b>X</b>", discount="1.00", total=5, remaining=5)  # before validation
    client.force_login(user)
    response = client.post(reverse("coupon_claim", args=[legacy.code]))
    assert response.status_code == 302 and "messages" not in response.cookies
    page = client.get(response["Location"]).content.decode()
    assert "Coupon &lt;b&gt;X&lt;/b&gt; is yours" in page and "<b>X</b>" not in page


@pytest.mark.parametrize("password", ["        ", "48291735", "12345678", "password", "short1"])
def test_signup_refuses_weak_passwords(client, password):
    response = client.post("/signup/", {"username": "weakling", "password1": password, "password2": password})
    assert response.status_code == 200
    assert response.context["form"].errors["password2"]
    assert not get_user_model().objects.filter(username="weakling").exists()


def test_the_api_token_page_is_never_cached(client, user):
    client.force_login(user)
    for response in (client.get("/account/tokens/"), client.post("/account/tokens/", {"name": "x"})):
        assert response.status_code == 200
        cache_control = response["Cache-Control"]
        assert "no-store" in cache_control and "no-cache" in cache_control and "private" in cache_control


@pytest.mark.parametrize("code", ["A/B", "50%", "x#y?z", "dot.ted", "with space"])
def test_coupon_page_and_claim_survive_any_stored_code(client, user, code):
    """Codes saved before validation (or by SQL) never make a page 500; they can still be claimed."""
    from shop.models import Coupon

    coupon = Coupon.objects.create(code=code, discount="1.00", total=5, remaining=5)
    page = client.get("/coupons/")
    assert page.status_code == 200
    client.force_login(user)
    assert client.get("/coupons/").status_code == 200
    url = reverse("coupon_claim", args=[code])
    assert client.post(url).status_code == 302
    assert CouponClaim.objects.filter(user=user, coupon=coupon).exists()


def test_coupon_claim_urls_that_are_no_code_are_404(client, user):
    client.force_login(user)
    assert client.post(f"/coupons/{'x' * 41}/claim/").status_code == 404


def test_head_is_answered_wherever_get_is(client, user, make_product):
    p = make_product(stock=3)
    for url in ("/", f"/products/{p.pk}/", "/cart/", "/coupons/", "/signup/", "/login/"):
        assert client.head(url).status_code == 200, url
    client.force_login(user)
    for url in ("/checkout/", "/orders/", "/account/tokens/"):
        assert client.head(url).status_code == 200, url


def test_pay_and_cancel_buttons_on_the_order_pages(shopper, user, other_user, make_product):
    from shop.services import place_order

    p = make_product(stock=5)
    to_pay, to_cancel = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(2))
    page = shopper.get(reverse("order", args=[to_pay.pk])).content.decode()
    assert reverse("order_pay", args=[to_pay.pk]) in page and "csrfmiddlewaretoken" in page
    assert reverse("order_cancel", args=[to_cancel.pk]) in shopper.get(reverse("orders")).content.decode()
    assert shopper.get(reverse("order_pay", args=[to_pay.pk])).status_code == 405  # POST only

    response = shopper.post(reverse("order_pay", args=[to_pay.pk]), follow=True)
    assert "is paid" in response.content.decode()
    assert Order.objects.get(pk=to_pay.pk).status == Order.Status.PAID
    page = shopper.get(reverse("order", args=[to_pay.pk])).content.decode()
    assert reverse("order_pay", args=[to_pay.pk]) not in page and reverse("order_cancel", args=[to_pay.pk]) not in page

    shopper.post(reverse("order_cancel", args=[to_cancel.pk]))
    assert Order.objects.get(pk=to_cancel.pk).status == Order.Status.CANCELLED
    response = shopper.post(reverse("order_pay", args=[to_cancel.pk]), follow=True)
    assert "can no longer be paid" in response.content.decode()

    theirs = order_of(place_order(user=other_user, lines=[(p.pk, 1)]))
    assert shopper.post(reverse("order_pay", args=[theirs.pk])).status_code == 404
    assert shopper.post(reverse("order_cancel", args=[theirs.pk])).status_code == 404
    assert Order.objects.get(pk=theirs.pk).status == Order.Status.PENDING_PAYMENT


# --- the shop's rough edges (web) ----------------------------------------------------------------
def test_adding_more_than_the_stock_is_refused_with_a_message(client, make_product):
    p = make_product(stock=3)
    response = client.post(f"/products/{p.pk}/", {"quantity": 5})
    assert response.status_code == 200 and "Only 3 left." in response.content.decode()
    client.post(f"/products/{p.pk}/", {"quantity": 2})
    response = client.post(f"/products/{p.pk}/", {"quantity": 2})
    assert "Only 3 left (you already have 2 in your cart)." in response.content.decode()
    sold_out = make_product(stock=0)
    assert "Sold out." in client.post(f"/products/{sold_out.pk}/", {"quantity": 1}).content.decode()
    assert client.session["cart"] == {str(p.pk): 2}


def test_quantity_zero_on_the_product_page_rerenders_with_a_message(client, make_product):
    p = make_product(stock=3)
    response = client.post(f"/products/{p.pk}/", {"quantity": 0})
    assert response.status_code == 200 and "Pick at least 1." in response.content.decode()
    assert not client.session.get("cart")


def test_cart_lines_that_cannot_be_bought_are_flagged_and_fixable(shopper, user, make_product):
    short, gone, off, fine = (make_product(stock=5, price="2.00") for _ in range(4))
    for p in (short, gone, off, fine):
        shopper.post(f"/products/{p.pk}/", {"quantity": 3}, follow=True)  # "... in your cart" shown
    Product.objects.filter(pk=short.pk).update(stock=1)
    Product.objects.filter(pk=gone.pk).update(stock=0)
    Product.objects.filter(pk=off.pk).update(active=False)
    page = shopper.get("/cart/").content.decode()
    assert f"{short.name}: only 1 left." in page and "Reduce to 1" in page
    assert f"{gone.name}: sold out." in page
    # Flagged, not silently dropped; a hidden product reads as a missing one.
    assert off.name not in page and "This product no longer exists." in page
    assert page.count('class="cart-line flagged"') == 3
    checkout = shopper.get("/checkout/")
    assert checkout.context["problems"] and 'id="place-order"' not in checkout.content.decode()
    key = checkout.context["form"].initial["idempotency_key"]
    refused = shopper.post("/checkout/", {"idempotency_key": key})
    assert refused.status_code == 409  # the cart conflicts with the stock as it is now
    assert "reduce or remove them to place your order" in refused.content.decode() and not Order.objects.exists()

    # The fixes: reduce to what is left (back to checkout when asked), remove.
    response = shopper.post("/cart/", {"product_id": short.pk, "quantity": 1, "next": "checkout"})
    assert response["Location"] == "/checkout/"
    for p in (gone, off):
        assert shopper.post("/cart/", {"product_id": p.pk, "quantity": 0})["Location"] == "/cart/"
    assert shopper.session["cart"] == {str(short.pk): 1, str(fine.pk): 3}
    _, placed = _checkout(shopper)
    assert placed.status_code == 302 and Order.objects.get(user=user).total == 8


def test_cart_has_remove_buttons_prices_with_currency_and_a_count_in_the_header(client, make_product, settings):
    settings.SHOP_CURRENCY = "€"
    p = make_product(stock=9, price="2.50")
    assert 'id="cart-count"' not in client.get("/").content.decode()
    client.post(f"/products/{p.pk}/", {"quantity": 3})
    page = client.get("/cart/").content.decode()
    assert 'class="secondary remove-line"' in page and 'name="quantity" value="0"' in page
    assert "€2.50" in page and "€7.50" in page
    assert '<span class="count" id="cart-count">3</span>' in client.get("/").content.decode()
    assert "€2.50" in client.get(f"/products/{p.pk}/").content.decode()


def test_an_empty_cart_offers_no_place_order(shopper):
    page = shopper.get("/checkout/").content.decode()
    assert "Your cart is empty" in page and 'id="place-order"' not in page


def test_a_claimed_coupon_shows_its_effect_before_placing(shopper, user, make_product, make_coupon):
    small, big = make_coupon(discount="3.00"), make_coupon(discount="50.00")
    for c in (small, big):
        shopper.post(f"/coupons/{c.code}/claim/")
    p = make_product(stock=5, price="10.00")
    shopper.post(f"/products/{p.pk}/", {"quantity": 2})
    page = shopper.get("/checkout/")
    lost = "This coupon is worth $50.00; only $20.00 of it applies to this order and the other $30.00 is lost"
    assert page.context["coupon_effects"] == {  # min(disc, subtotal), and the rest said
        small.code: {"discount": "$3.00", "total": "$17.00", "unused": ""},
        big.code: {"discount": "$20.00", "total": "$0.00", "unused": f"{lost} (a coupon is used once)."}}
    html = page.content.decode()
    assert f"{small.code}: $3.00 off, total $17.00" in html
    assert 'id="checkout-total">$0.00<' in html and lost in html  # the one claimed last is picked, its loss said
    assert f"{big.code}: $20.00 off (of its $50.00), total $0.00" in html
    chosen = shopper.get(f"/checkout/?coupon_code={small.code}").content.decode()
    assert 'id="checkout-discount">\u2212$3.00<' in chosen and 'id="checkout-total">$17.00<' in chosen
    _checkout(shopper, coupon_code=small.code)
    assert Order.objects.get(user=user).total == 17


def test_claiming_after_the_login_redirect_lands_on_the_coupon_page(client, user, make_coupon):
    coupon = make_coupon()
    url = reverse("coupon_claim", args=[coupon.code])
    to_login = client.post(url)
    assert to_login.status_code == 302 and "/login/" in to_login["Location"]
    client.force_login(user)
    response = client.get(url)  # where the login sends the shopper back: a GET
    assert response.status_code == 302 and response["Location"] == reverse("coupons")
    assert not CouponClaim.objects.filter(user=user).exists()


def test_friendly_404_and_500_pages(client, settings):
    from django.test import RequestFactory
    from django.views.defaults import server_error

    settings.DEBUG = False
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404
    page = missing.content.decode()
    assert "We can't find that page" in page and "Back to the sale" in page and "favicon.svg" in page
    broken = server_error(RequestFactory().get("/"))
    assert broken.status_code == 500
    assert "something went wrong on our side" in broken.content.decode()


def test_signup_form_has_labels_help_and_errors(client):
    page = client.get("/signup/").content.decode()
    for field in ("username", "password1", "password2"):
        assert f'<label for="id_{field}">' in page
    assert 'class="helptext"' in page and "Log in" in page
    response = client.post("/signup/", {"username": "x", "password1": "a-long-pass-123", "password2": "nope"})
    assert response.status_code == 200 and 'class="errorlist"' in response.content.decode()


def test_favicon_is_linked_and_served(client):
    from django.contrib.staticfiles import finders

    assert 'rel="icon"' in client.get("/").content.decode()
    assert finders.find("shop/favicon.svg")


def test_the_stylesheet_loads_with_debug_off(settings, tmp_path, db):
    """WhiteNoise serves the collected files (dev.sh and the image run collectstatic), so a
    server with DEBUG off is styled, not a bare page."""
    from django.core.management import call_command
    from django.test import Client

    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", "--no-input", verbosity=0)
    client = Client()  # a fresh handler: WhiteNoise indexes STATIC_ROOT when it starts
    page = client.get("/")
    assert page.status_code == 200 and "/static/shop/site.css" in page.content.decode()
    css = client.get("/static/shop/site.css")
    assert css.status_code == 200 and b"{" in b"".join(css.streaming_content)


# --- issue 37: the cart and checkout after a sale ended -------------------------------------------
def test_a_line_whose_sale_ended_offers_only_remove_and_says_it_once(shopper, make_product):
    from datetime import timedelta

    from django.utils import timezone

    ended, fine = make_product(stock=25), make_product(stock=25)
    for p in (ended, fine):
        shopper.post(f"/products/{p.pk}/", {"quantity": 2})
    Product.objects.filter(pk=ended.pk).update(opens_at=timezone.now() - timedelta(hours=1),
                                               closes_at=timezone.now() - timedelta(seconds=1))
    page = shopper.get("/cart/").content.decode()
    line = re.search(rf'<tr class="cart-line flagged" data-product="{ended.pk}">.*?</tr>', page, re.S).group(0)
    assert "This sale has ended." in line
    assert "in stock" not in line and "left" not in line  # no green "25 in stock" beside it
    assert 'name="quantity" min="0"' not in line and ">Update<" not in line and "remove-line" in line
    assert "reduce" not in page.lower()  # the one fix that helps: remove it
    assert 'href="/checkout/"' not in page.split("</table>")[1]  # no Check out while a line must go
    checkout = shopper.get("/checkout/").content.decode()
    assert "in stock" not in checkout and "reduce" not in checkout.lower()
    posted = shopper.post("/checkout/", {"idempotency_key": "k-ended-1"}).content.decode()
    assert posted.count("can&#x27;t be bought as they are") + posted.count("can't be bought as they are") == 1
    other = re.search(rf'<tr class="cart-line" data-product="{fine.pk}">.*?</tr>', page, re.S).group(0)
    assert "25 in stock" in other and ">Update<" in other  # a line that can be bought keeps its controls


def test_a_coupon_just_claimed_is_picked_at_checkout(shopper, make_product, make_coupon):
    p, coupon = make_product(stock=5, price="20.00"), make_coupon(discount="5.00")
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    shopper.post(f"/coupons/{coupon.code}/claim/")
    page = shopper.get("/checkout/")
    assert page.context["form"]["coupon_code"].value() == coupon.code and page.context["coupon_chosen"]
    assert re.search(rf'value="{coupon.code}"[^>]*checked', page.content.decode())
    key = page.context["form"].initial["idempotency_key"]
    placed = shopper.post("/checkout/", {"idempotency_key": key, "coupon_code": coupon.code}, follow=True)
    assert Order.objects.get().discount == 5
    assert placed.status_code == 200 and shopper.session.get("shop.just_claimed") is None
    # Asked for no coupon on the page (?coupon_code=): none is picked.
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    assert shopper.get("/checkout/?coupon_code=").context["form"]["coupon_code"].value() == ""
