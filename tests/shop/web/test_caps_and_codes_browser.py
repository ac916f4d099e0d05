"""In a real browser at 320, 375 and 1280 px (issue 30): a cart line past its per-buyer cap is
flagged with its fix (Reduce to / Remove) and Place order waits for it; the checkout's "Have a
code?" box claims and applies a code, says a refused one beside it, and a coupon worth more than
the order says so. Each page is checked with the phone layout's rules (test_phone_layout.py)."""

from __future__ import annotations

import os

import pytest

from shop.models import CouponClaim, Order, Product
from shop.services import place_order
from tests.browser import ARTIFACTS, logged_in_page
from tests.shop.web.test_phone_layout import CHECK_LAYOUT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WIDTHS = pytest.mark.parametrize("width", [320, 375, 1280])


def _fits(page, name: str, width: int) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)
    problems = page.evaluate(CHECK_LAYOUT, width < 600)
    assert not problems, f"{name} at {width} px:\n" + "\n".join(problems)


def _on_screen(locator, width: int) -> None:
    box = locator.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box


@WIDTHS
def test_a_cart_line_past_its_cap_is_flagged_with_its_fix(browser, live_server, user, make_product, width):
    runner, tee = make_product(stock=30, price="120.00"), make_product(stock=30, price="25.00")
    Product.objects.filter(pk=runner.pk).update(max_per_user=2, name="Trail runner, limited edition")
    Product.objects.filter(pk=tee.pk).update(max_per_user=1, name="Drop tee")
    url = live_server.url
    with logged_in_page(browser, url, user, width=width) as page:
        page.goto(f"{url}/products/{runner.pk}/")
        assert "Limit 2 per customer" in page.inner_text("main")
        _fits(page, "cap-product", width)
        for product in (runner, tee):
            page.goto(f"{url}/products/{product.pk}/")
            page.fill("#id_quantity", "2" if product == runner else "1")
            page.click("#add-to-cart")
            page.wait_for_url(f"{url}/cart/")
        # Meanwhile another tab ordered one of each: the runner can go down to 1, the tee must go.
        place_order(user=user, lines=[(runner.pk, 1), (tee.pk, 1)])
        page.goto(f"{url}/checkout/")
        assert page.locator("#place-order").count() == 0
        assert "Limit 2 per customer; you already have 1 in your orders" in page.inner_text(
            f"tr.flagged[data-product='{runner.pk}']")
        _fits(page, "cap-checkout-flagged", width)
        page.goto(f"{url}/cart/")
        line, gone = page.locator(f"tr[data-product='{runner.pk}']"), page.locator(f"tr[data-product='{tee.pk}']")
        assert "Limit 1 per customer; you already have 1 in your orders" in gone.inner_text()
        assert gone.locator(".fix-line").count() == 0  # nothing left to buy: Remove, not Reduce
        fix = line.locator(".fix-line")
        assert fix.inner_text() == "Reduce to 1"
        _on_screen(fix, width)
        _on_screen(gone.locator(".remove-line"), width)
        _fits(page, "cap-cart-flagged", width)
        fix.click()
        page.wait_for_load_state()
        page.locator(f"tr[data-product='{tee.pk}'] .remove-line").click()
        page.wait_for_load_state()
        assert page.locator("tr.flagged").count() == 0
        assert page.inner_text("#cart-total") == "$120.00"
        assert "Limit 2 per customer" in page.inner_text(f"tr[data-product='{runner.pk}']")
        _fits(page, "cap-cart-fixed", width)
        page.goto(f"{url}/checkout/")
        page.click("#place-order")
        page.wait_for_url(f"{url}/orders/*/")
    assert Order.objects.filter(user=user).count() == 2


@WIDTHS
def test_the_code_box_claims_and_applies_a_code_and_says_what_is_wrong(browser, live_server, user, make_product,
                                                                       make_coupon, width):
    mug = make_product(stock=9, price="5.00")
    coupon = make_coupon(discount="20.00", total=5)
    url = live_server.url
    with logged_in_page(browser, url, user, width=width) as page:
        page.goto(f"{url}/products/{mug.pk}/")
        page.click("#add-to-cart")
        page.wait_for_url(f"{url}/cart/")
        page.goto(f"{url}/checkout/")
        box, apply = page.locator("#id_code"), page.locator("#apply-code")
        _on_screen(box, width)
        _on_screen(apply, width)
        _fits(page, "code-box", width)

        # Enter in the box applies the code (never places the order); a refused code is said beside it.
        box.fill("NO-SUCH-CODE")
        box.press("Enter")
        page.wait_for_load_state()
        assert page.inner_text("#code-errors") == "We don't know that coupon."
        assert page.input_value("#id_code") == "NO-SUCH-CODE" and not Order.objects.exists()
        assert page.locator("#place-order").is_visible()
        _fits(page, "code-box-refused", width)

        # A good code: claimed and picked in one step; worth more than the cart, it says so.
        page.fill("#id_code", coupon.code.lower())
        page.click("#apply-code")
        page.wait_for_url(f"{url}/checkout/?coupon_code={coupon.code}")
        assert CouponClaim.objects.filter(user=user, coupon=coupon, used_at=None).count() == 1
        assert page.is_checked(f"input[name=coupon_code][value={coupon.code}]")
        assert page.inner_text("#checkout-total") == "$0.00"
        unused = page.locator("#coupon-unused")
        assert unused.is_visible() and "the other $15.00 is lost" in unused.inner_text()
        _fits(page, "code-box-applied", width)
        page.check("input[name=coupon_code][value='']")  # No coupon: the note goes with it
        assert not unused.is_visible() and page.inner_text("#checkout-total") == "$5.00"
        page.check(f"input[name=coupon_code][value={coupon.code}]")
        assert unused.is_visible()
        page.click("#place-order")
        page.wait_for_url(f"{url}/orders/*/")
        assert page.inner_text("#order-total") == "$0.00"
        assert "the other $15.00 was lost" in page.inner_text("#coupon-unused")
        _fits(page, "code-order", width)
    order = Order.objects.get(user=user)
    assert order.coupon_id == coupon.pk and order.total == 0
