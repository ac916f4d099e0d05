"""What a shopper sees before checkout (issue 30): a per-buyer cap on the product page and the
cart with its fix, a "Have a code?" box at checkout, and a coupon worth more than the order said
before and after placing it. Django's test client, real MariaDB and Redis."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from shop import money
from shop.models import CouponClaim, Order, Product
from shop.reads import selectors
from shop.services import cancel_order, claim_coupon, place_order
from shop.web import cart
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shopper(client, user):
    client.force_login(user)
    return client


def capped(make_product, *, cap: int, stock: int = 20, name: str = "Sneaker X") -> Product:
    p = make_product(stock=stock)
    Product.objects.filter(pk=p.pk).update(max_per_user=cap, name=name)
    p.refresh_from_db()
    return p


def _checkout_key(shopper) -> str:
    return shopper.get("/checkout/").context["form"].initial["idempotency_key"]


# --- the per-buyer cap ---------------------------------------------------------------------------
def test_units_held_counts_reserving_orders_in_one_query(user, other_user, make_product, django_assert_num_queries):
    a, b, free = capped(make_product, cap=5), capped(make_product, cap=5, name="Mug"), make_product()
    place_order(user=user, lines=[(a.pk, 2)])
    place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)])
    cancel_order(order=order_of(place_order(user=user, lines=[(b.pk, 3)])), actor="test")  # gives its units back
    place_order(user=other_user, lines=[(a.pk, 4)])  # someone else's
    with django_assert_num_queries(1):
        assert selectors.units_held(user=user, product_ids=[a.pk, b.pk, free.pk]) == {a.pk: 3, b.pk: 1}
    with django_assert_num_queries(0):
        assert selectors.units_held(user=user, product_ids=[]) == {}


def test_the_product_page_says_the_limit_and_refuses_past_it(shopper, user, make_product):
    p = capped(make_product, cap=2)
    page = shopper.get(f"/products/{p.pk}/").content.decode()
    assert "Limit 2 per customer" in page and 'id="add-to-cart"' in page
    refused = shopper.post(f"/products/{p.pk}/", {"quantity": 3}).content.decode()
    assert "Limit 2 per customer." in refused and not shopper.session.get("cart")
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    again = shopper.post(f"/products/{p.pk}/", {"quantity": 2}).content.decode()
    assert "Limit 2 per customer; you already have 1 in your cart, so you can add 1 more." in again
    assert shopper.session["cart"] == {str(p.pk): 1}
    # Bought up to the cap: the page says so and offers no Add to cart.
    place_order(user=user, lines=[(p.pk, 2)])
    full = shopper.get(f"/products/{p.pk}/").content.decode()
    assert "Limit 2 per customer; you already have 2 in your orders" in full and 'id="add-to-cart"' not in full
    # No cap, no line.
    assert "per customer" not in shopper.get(f"/products/{make_product().pk}/").content.decode()


def test_a_cart_line_shows_the_limit_and_offers_the_fix_past_it(shopper, user, make_product):
    p, free = capped(make_product, cap=2), make_product(stock=9)
    shopper.post(f"/products/{p.pk}/", {"quantity": 2})
    shopper.post(f"/products/{free.pk}/", {"quantity": 1})
    page = shopper.get("/cart/")
    assert "Limit 2 per customer" in page.content.decode() and not page.context["problems"]
    # Another order of the buyer's (another tab, the API) took one: the line is flagged, with its fix.
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    page = shopper.get("/cart/")
    [line] = [r for r in page.context["rows"] if r.problem]
    assert line.problem == ("Sneaker X: Limit 2 per customer; you already have 1 in your orders, "
                            "so you can add 1 more.")
    assert line.fix_quantity == 1 and "Reduce to 1" in page.content.decode()
    checkout = shopper.get("/checkout/")
    assert checkout.context["problems"] and 'id="place-order"' not in checkout.content.decode()
    assert "Reduce to 1" in checkout.content.decode()
    refused = shopper.post("/checkout/", {"idempotency_key": _checkout_key(shopper)})
    assert "reduce or remove them to place your order" in refused.content.decode() and Order.objects.count() == 1
    # Reduce to 1 (back to checkout), then the order goes through.
    response = shopper.post("/cart/", {"product_id": p.pk, "quantity": 1, "next": "checkout"})
    assert response["Location"] == "/checkout/"
    assert 'id="place-order"' in shopper.get("/checkout/").content.decode()
    assert shopper.post("/checkout/", {"idempotency_key": _checkout_key(shopper)}).status_code == 302
    assert Order.objects.count() == 2 and order.pk != Order.objects.latest("id").pk


def test_a_cart_line_at_a_reached_cap_offers_remove_not_reduce(shopper, user, make_product):
    p = capped(make_product, cap=1)
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    place_order(user=user, lines=[(p.pk, 1)])
    page = shopper.get("/checkout/")
    html = page.content.decode()
    assert "Sneaker X: Limit 1 per customer; you already have 1 in your orders." in html
    assert "Reduce to" not in html and 'class="secondary remove-line"' in html and 'id="place-order"' not in html
    shopper.post("/cart/", {"product_id": p.pk, "quantity": 0, "next": "checkout"})
    assert not shopper.session.get("cart")


def test_the_cart_review_takes_the_tighter_of_stock_and_cap(make_product, client):
    p = capped(make_product, cap=5, stock=2)
    session = client.session
    cart.set_quantity(session, p.pk, 4)
    [short] = cart.review(session, {p.pk: p}, held={p.pk: 1})  # 4 left under the cap, 2 in stock
    assert (short.problem, short.fix_quantity) == ("Sneaker X: only 2 left.", 2)
    [capped_line] = cart.review(session, {p.pk: p}, held={p.pk: 4})
    assert (capped_line.problem, capped_line.fix_quantity) == (
        "Sneaker X: Limit 5 per customer; you already have 4 in your orders, so you can add 1 more.", 1)
    cart.set_quantity(session, p.pk, 2)
    assert cart.review(session, {p.pk: p}, held={p.pk: 3})[0].problem == ""


def test_a_refusal_at_checkout_names_the_product_and_hides_place_order(shopper, user, make_product, monkeypatch):
    """The cap is passed between the page and the locks (another tab ordered): the writer's
    refusal, by the product's name; the page then flags the line and offers its fix."""
    p = capped(make_product, cap=1)
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    key = _checkout_key(shopper)
    place_order(user=user, lines=[(p.pk, 1)])
    real, calls = selectors.units_held, []

    def first_blind(**kwargs):  # the page the buyer submitted had not seen that order yet
        calls.append(kwargs)
        return {} if len(calls) == 1 else real(**kwargs)

    monkeypatch.setattr(selectors, "units_held", first_blind)
    response = shopper.post("/checkout/", {"idempotency_key": key})
    html = response.content.decode()
    assert response.status_code == 409 and Order.objects.count() == 1
    assert "Sneaker X: Limit 1 per customer; you already have 1 in your orders." in html
    assert f"Product {p.pk}" not in html
    assert 'id="place-order"' not in html and 'class="secondary remove-line"' in html


# --- "Have a code?" at checkout ---------------------------------------------------------------
@pytest.fixture
def in_cart(shopper, make_product):
    p = make_product(stock=9, price="10.00")
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    return p


def test_the_checkout_page_has_a_code_box(shopper, in_cart):
    html = shopper.get("/checkout/").content.decode()
    assert 'id="code-form"' in html and 'form="code-form"' in html and "Have a code?" in html


def test_a_code_is_claimed_and_applied_in_one_step(shopper, user, in_cart, make_coupon):
    coupon = make_coupon(discount="4.00", total=3)
    response = shopper.post("/checkout/code/", {"code": f"  {coupon.code.lower()} "})
    assert response.status_code == 302 and response["Location"] == f"/checkout/?coupon_code={coupon.code}"
    claim = CouponClaim.objects.get(user=user)
    assert claim.coupon_id == coupon.pk and claim.used_at is None
    coupon.refresh_from_db()
    assert coupon.remaining == 2
    page = shopper.get(response["Location"])
    html = page.content.decode()
    assert f"Coupon {coupon.code} applied." in html
    assert page.context["form"]["coupon_code"].value() == coupon.code  # picked
    assert 'id="checkout-total">$6.00<' in html
    # Applying it again (a second tab, the back button): the same claim, nothing more taken.
    assert shopper.post("/checkout/code/", {"code": coupon.code}).status_code == 302
    coupon.refresh_from_db()
    assert CouponClaim.objects.filter(user=user).count() == 1 and coupon.remaining == 2
    assert shopper.post("/checkout/", {"idempotency_key": _checkout_key(shopper),
                                       "coupon_code": coupon.code}).status_code == 302
    assert Order.objects.get(user=user).total == Decimal("6.00")


@pytest.mark.parametrize("case, words", [
    ("unknown", "We don't know that coupon."),
    ("too_long", "We don't know that coupon."),
    ("empty", "Type your coupon's code."),
    ("expired", "This coupon is not valid right now."),
    ("not_yet", "This coupon is not valid right now."),
    ("none_left", "This coupon has run out."),
    ("used", "You already used this coupon on an earlier order (a coupon is used once)."),
])
def test_a_refused_code_is_said_beside_the_box_and_writes_nothing(
        shopper, user, other_user, in_cart, make_coupon, make_product, case, words):
    now = timezone.now()
    coupon = make_coupon(discount="2.00", total=1)
    code = coupon.code
    if case == "unknown":
        code = "NO-SUCH-CODE"
    elif case == "too_long":
        code = "X" * 41
    elif case == "empty":
        code = ""
    elif case == "expired":
        coupon.valid_until = now - timedelta(minutes=1)
        coupon.save()
    elif case == "not_yet":
        coupon.valid_from = now + timedelta(hours=1)
        coupon.save()
    elif case == "none_left":
        claim_coupon(user=other_user, code=code)
    elif case == "used":
        claim_coupon(user=user, code=code)
        place_order(user=user, lines=[(make_product(stock=1).pk, 1)], coupon_code=code)
    claims = list(CouponClaim.objects.values_list("pk", "used_at"))
    coupon.refresh_from_db()
    remaining = coupon.remaining
    response = shopper.post("/checkout/code/", {"code": code})
    html = response.content.decode()
    assert response.status_code == 200
    assert f'<p class="error" id="code-errors" role="alert">{words}</p>'.replace("'", "&#x27;") in html, html
    assert f'value="{code}"' in html and 'aria-invalid="true"' in html  # what was typed stays
    assert 'id="place-order"' in html  # the rest of the checkout is still there
    assert list(CouponClaim.objects.values_list("pk", "used_at")) == claims
    coupon.refresh_from_db()
    assert coupon.remaining == remaining


def test_a_refused_code_without_a_box_on_the_page_is_a_message(shopper, user):
    """A stale page (the cart emptied in another tab): the checkout shows no box, so the
    refusal comes as a message there."""
    response = shopper.post("/checkout/code/", {"code": "NO-SUCH-CODE"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["We don't know that coupon."]
    assert response.redirect_chain == [("/checkout/", 302)] and not CouponClaim.objects.exists()


def test_the_code_box_needs_a_login_and_a_post(client, shopper):
    from django.test import Client

    guest = Client().post("/checkout/code/", {"code": "X"})
    assert guest.status_code == 302 and "/login/" in guest["Location"]
    assert shopper.get("/checkout/code/").status_code == 405


# --- a coupon worth more than the order ----------------------------------------------------------
def test_unused_discount_is_what_the_rule_leaves():
    assert money.unused_discount(Decimal("5.00"), Decimal("20.00")) == Decimal("15.00")
    assert money.unused_discount(Decimal("50.00"), Decimal("20.00")) == Decimal("0.00")
    assert money.unused_discount(Decimal("5.00"), None) == Decimal("0.00")


def test_a_coupon_larger_than_the_order_says_so_at_checkout_and_on_the_order(shopper, user, make_product,
                                                                              make_coupon):
    p = make_product(stock=9, price="5.00")
    big, small = make_coupon(discount="20.00"), make_coupon(discount="1.00")
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    shopper.post("/checkout/code/", {"code": small.code})
    shopper.post("/checkout/code/", {"code": big.code})
    note = ("This coupon is worth $20.00; only $5.00 of it applies to this order and the other $15.00 is lost "
            "(a coupon is used once).")
    chosen = shopper.get(f"/checkout/?coupon_code={big.code}").content.decode()
    assert f'<p class="notice" id="coupon-unused">{note}</p>' in chosen and 'id="checkout-total">$0.00<' in chosen
    assert f"{big.code}: $5.00 off (of its $20.00), total $0.00" in chosen
    plain = shopper.get(f"/checkout/?coupon_code={small.code}").content.decode()
    assert '<p class="notice" id="coupon-unused" hidden></p>' in plain
    shopper.post("/checkout/", {"idempotency_key": _checkout_key(shopper), "coupon_code": big.code})
    order = Order.objects.get(user=user)
    assert (order.total, order.discount) == (Decimal("0.00"), Decimal("5.00"))
    page = shopper.get(f"/orders/{order.pk}/").content.decode()
    assert (f"Coupon {big.code} is worth $20.00: $5.00 of it went to this order and the other $15.00 was lost "
            "(a coupon is used once).") in page
    # A coupon that fits says nothing more.
    shopper.post(f"/products/{p.pk}/", {"quantity": 1})
    shopper.post("/checkout/", {"idempotency_key": _checkout_key(shopper), "coupon_code": small.code})
    fits = Order.objects.filter(user=user).latest("id")
    assert fits.coupon_id == small.pk
    assert 'id="coupon-unused"' not in shopper.get(f"/orders/{fits.pk}/").content.decode()
