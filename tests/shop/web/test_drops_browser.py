"""Scheduled drops in Chromium: the product page counts down from the server's clock and, at the
opening, loads again with Add to cart; the catalog's drop badges and the countdown page fit a
320 and 375 px phone and a 1280 px screen (the layout check of tests/shop/web/test_phone_layout.py)."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from shop.models import Product
from tests.browser import ARTIFACTS, own_contexts
from tests.shop.web.test_phone_layout import CHECK_LAYOUT, UNBREAKABLE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def test_the_countdown_runs_and_the_page_opens_the_drop_by_itself(browser, live_server):
    p = Product.objects.create(sku="DROP-1", name="Limited sneaker", price=Decimal("129.00"), stock=9)
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": 375, "height": 740})
        page.goto(f"{live_server.url}/")  # the server and the browser warm
        opens = timezone.now() + timedelta(seconds=6)
        Product.objects.filter(pk=p.pk).update(opens_at=opens)
        page.goto(f"{live_server.url}/products/{p.pk}/")
        assert page.locator("#add-to-cart").count() == 0
        first = page.inner_text("#drop-countdown")
        assert re.fullmatch(r"\(in 0:0[1-6]\)", first), first  # the script's m:ss, from the server's clock
        shown = page.inner_text("#drop-opens time")  # rewritten in the buyer's own zone and words
        assert not re.search(r"\d{4}-\d\d-\d\d", shown) and str(opens.year) in shown, shown
        page.wait_for_timeout(1100)
        assert page.inner_text("#drop-countdown") != first  # it counts
        page.locator("#add-to-cart").wait_for(timeout=8000)  # at zero the page loads again, open
        assert timezone.now() >= opens and page.locator("#drop-countdown").count() == 0
        page.click("#add-to-cart")
        page.wait_for_load_state()
        assert "1 in your cart" in page.inner_text("main")


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_drop_badges_and_the_countdown_page_fit_the_window(browser, live_server, width):
    now = timezone.now()
    soon = Product.objects.create(sku="DROP-2", name=UNBREAKABLE, price=Decimal("129.00"), stock=9,
                                  opens_at=now + timedelta(hours=2, minutes=5))
    Product.objects.create(sku="DROP-3", name="Wireless noise-cancelling headphones", price=Decimal("249.99"),
                           stock=3, opens_at=now - timedelta(hours=1), closes_at=now + timedelta(minutes=50))
    Product.objects.create(sku="DROP-4", name="Mechanical keyboard", price=Decimal("1658.00"), stock=4,
                           opens_at=now - timedelta(days=1), closes_at=now - timedelta(hours=1))
    problems: list[str] = []
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": width, "height": 740})
        for name, path in (("catalog", "/"), ("product-upcoming", f"/products/{soon.pk}/")):
            response = page.goto(live_server.url + path)
            assert response is not None and response.status == 200
            page.screenshot(path=str(ARTIFACTS / f"drops-{width}-{name}.png"), full_page=True)
            problems.extend(f"{name}: {p}" for p in page.evaluate(CHECK_LAYOUT, width < 600))
        page.goto(live_server.url + "/")
        main = page.inner_text("main")
        # The badges count down from the server's clock (shop/drop-live.js): h:mm:ss, m:ss.
        assert re.search(r"Opens in 2:0[45]:\d\d", main) and "Sale ended" in main, main
        assert re.search(r"Ends in (49|50):\d\d", main), main
    assert not problems, "\n".join(problems)
