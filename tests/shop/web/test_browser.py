"""A shopper in a real browser (Debian's Chromium, headless): sign up, claim, buy, double-submit."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from shop.models import Order
from tests.browser import ARTIFACTS, own_contexts

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Playwright's sync API runs an event loop; Django's ORM calls from this test are still sync.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def test_shopper_journey(browser, live_server, make_product, make_coupon, settings):
    # The double submit's twin waits for the first request on the key's lock: give it time on a
    # busy machine (once, with a load test beside the suite, the page never reached the order
    # within 30 s; the cause was not captured, so a failure now leaves the page behind).
    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 20.0}

    sneaker = make_product(stock=5, price="100.00")
    mug = make_product(stock=9, price="10.00")
    coupon = make_coupon(total=3, discount="15.00")
    url = live_server.url
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        page.goto(f"{url}/signup/")
        page.fill("#id_username", "alice")
        page.fill("#id_password1", "a-long-pass-123")
        page.fill("#id_password2", "a-long-pass-123")
        page.click("main button[type=submit]")
        page.wait_for_url(f"{url}/")
        page.screenshot(path=str(ARTIFACTS / "catalog.png"), full_page=True)

        page.goto(f"{url}/coupons/")
        page.click(f"[data-coupon='{coupon.code}'] button")
        assert "is yours" in page.inner_text(".messages")

        for product, qty in ((sneaker, "1"), (mug, "2")):
            page.goto(f"{url}/products/{product.pk}/")
            page.fill("#id_quantity", qty)
            page.click("#add-to-cart")
        page.goto(f"{url}/checkout/")
        page.check(f"input[name=coupon_code][value={coupon.code}]")
        # A double submit: the same form (same idempotency key) posted twice, as a double click
        # that beats the button's disabling, or a resubmitted request, would.
        form = page.locator("#checkout-form")
        key = form.locator("input[name=idempotency_key]").input_value()
        page.evaluate("""() => { const f = document.getElementById('checkout-form');
                                  fetch(f.action || location.href, {method: 'POST', body: new FormData(f)}); }""")
        page.click("#place-order")
        try:
            page.wait_for_url(f"{url}/orders/*/")
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "checkout-failed.png"), full_page=True)
            raise AssertionError(f"no order page; at {page.url}: {page.inner_text('main')[:500]!r}") from None
        assert page.inner_text("#order-total") == "$105.00"
        page.screenshot(path=str(ARTIFACTS / "confirmation.png"), full_page=True)
        page.go_back()
        page.wait_for_load_state()

    alice = get_user_model().objects.get(username="alice")
    orders = Order.objects.filter(user=alice)
    assert orders.count() == 1 and orders.get().idempotency_key == key
    sneaker.refresh_from_db()
    mug.refresh_from_db()
    assert (sneaker.stock, mug.stock) == (4, 7)
    assert (ARTIFACTS / "catalog.png").stat().st_size > 5000


LONG_NAME = "Limited-edition-ultra-lightweight-carbon-plated-marathon-racing-sneaker-" + "X" * 60


def _fits(page, name: str, viewport: str) -> None:
    """No horizontal overflow on this page at this viewport; a screenshot either way."""
    page.screenshot(path=str(ARTIFACTS / f"journey-{viewport}-{name}.png"), full_page=True)
    scroll, inner = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= inner, f"{name} at {viewport}: {scroll}px wide in a {inner}px window"


@pytest.mark.parametrize("width,height", [(1100, 800), (375, 740)], ids=["desktop", "phone"])
def test_cart_fix_coupon_pay_and_expiry_on_desktop_and_phone(browser, live_server, make_product, make_coupon, width,
                                                             height):
    """A short cart line is flagged and fixed, the coupon's total shows before placing,
    the order is paid; a second order left unpaid expires and its stock comes back. Every page
    fits the window (no horizontal scrolling), a 375 px phone included."""
    from datetime import timedelta

    from django.utils import timezone

    from shop.models import Product
    from shop.services.orders import expire_unpaid

    sneaker = make_product(stock=5, price="100.00")
    Product.objects.filter(pk=sneaker.pk).update(name=LONG_NAME)
    mug = make_product(stock=9, price="10.00")
    coupon = make_coupon(total=3, discount="15.00")
    url, vp = live_server.url, f"{width}x{height}"
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"{url}/signup/")
        _fits(page, "signup", vp)
        page.fill("#id_username", f"bob{width}")
        page.fill("#id_password1", "a-long-pass-123")
        page.fill("#id_password2", "a-long-pass-123")
        page.click("#signup-form button[type=submit]")
        page.wait_for_url(f"{url}/")
        _fits(page, "catalog", vp)

        page.goto(f"{url}/coupons/")
        page.click(f"[data-coupon='{coupon.code}'] button")
        assert "is yours" in page.inner_text(".messages")
        _fits(page, "coupons", vp)

        for product, qty in ((sneaker, "3"), (mug, "2")):
            page.goto(f"{url}/products/{product.pk}/")
            _fits(page, f"product-{product.pk}", vp)
            page.fill("#id_quantity", qty)
            page.click("#add-to-cart")
            page.wait_for_url(f"{url}/cart/")
        assert page.inner_text("#cart-count") == "5"

        # Someone else bought most of the sneakers meanwhile: the line is flagged, and fixed.
        Product.objects.filter(pk=sneaker.pk).update(stock=1)
        page.goto(f"{url}/checkout/")
        assert "only 1 left." in page.inner_text(f"tr.flagged[data-product='{sneaker.pk}']")
        assert page.locator("#place-order").count() == 0
        _fits(page, "checkout-flagged", vp)
        page.goto(f"{url}/cart/")
        assert "only 1 left." in page.inner_text(f"tr.flagged[data-product='{sneaker.pk}']")
        _fits(page, "cart-flagged", vp)
        page.click(f"tr[data-product='{sneaker.pk}'] .fix-line")
        page.wait_for_load_state()
        assert page.locator("tr.flagged").count() == 0
        assert page.inner_text("#cart-total") == "$120.00"

        page.goto(f"{url}/checkout/")
        # The coupon just claimed is picked already (issue 37: one click must not pay full price).
        assert page.is_checked(f"input[name=coupon_code][value={coupon.code}]")
        assert page.inner_text("#checkout-discount") == "\u2212$15.00"
        assert page.inner_text("#checkout-total") == "$105.00"
        _fits(page, "checkout", vp)
        page.click("#place-order")
        page.wait_for_url(f"{url}/orders/*/")
        assert page.inner_text("#order-total") == "$105.00"
        _fits(page, "order", vp)
        page.click("button.pay")
        page.wait_for_load_state()
        assert "is paid" in page.inner_text(".messages")
        _fits(page, "order-paid", vp)

        # A second order, left unpaid past its deadline, expires: the mug's stock comes back.
        page.goto(f"{url}/products/{mug.pk}/")
        assert "7 in stock" in page.inner_text("main")
        page.fill("#id_quantity", "1")
        page.click("#add-to-cart")
        page.wait_for_url(f"{url}/cart/")
        page.goto(f"{url}/checkout/")
        page.click("#place-order")
        page.wait_for_url(f"{url}/orders/*/")
        assert page.locator("button.pay").count() == 1
        page.goto(f"{url}/products/{mug.pk}/")
        assert "6 in stock" in page.inner_text("main")
        assert expire_unpaid(now=timezone.now() + timedelta(days=1)) == 1
        page.reload()
        assert "7 in stock" in page.inner_text("main")
        page.goto(f"{url}/orders/")
        assert "Expired" in page.inner_text("main") and "Paid" in page.inner_text("main")
        _fits(page, "orders", vp)

        page.goto(f"{url}/account/tokens/")
        page.fill("#id_name", "a-very-long-token-name-" + "y" * 80)
        page.click("main form.panel button[type=submit]")
        page.wait_for_selector("#new-token")
        _fits(page, "tokens", vp)
        page.goto(f"{url}/no-such-page/")
        _fits(page, "not-found", vp)
