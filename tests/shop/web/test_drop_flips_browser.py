"""A drop's edges in Chromium, as shoppers saw them in issue 37: the catalog's badges count down
and flip at the opening and at the closing (with JavaScript from the server's clock, the
browser's own set an hour wrong; without JavaScript by a meta refresh); upcoming drops have a
block of their own at the top; the product page flips at its closing and when the operator ends
the sale early ("End sale now"), at 320 and 375 px and at 1280 px."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from shop.models import Product
from shop.reads import selectors
from shop.services import end_drop
from tests.browser import ARTIFACTS, own_contexts
from tests.shop.web.test_phone_layout import CHECK_LAYOUT, UNBREAKABLE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WIDTHS = [320, 375, 1280]


def _product(sku: str, name: str, **window) -> Product:
    return Product.objects.create(sku=sku, name=name, price=Decimal("129.00"), stock=9, **window)


def _wrong_clock_page(browser, width: int):
    """A page whose browser clock is an hour behind the server's: only the server's may count."""
    page = browser.new_page(viewport={"width": width, "height": 740})
    page.clock.install(time=timezone.now() - timedelta(hours=1))
    return page


def _laid_out_at_every_width(page, name: str) -> None:
    """The page as it stands, at 320, 375 and 1280 px: a screenshot each, and the layout check."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 740})
        page.screenshot(path=str(ARTIFACTS / f"drop-flips-{width}-{name}.png"), full_page=True)
        problems = page.evaluate(CHECK_LAYOUT, width < 600)
        assert not problems, (width, "\n".join(problems))
    page.set_viewport_size({"width": 375, "height": 740})


def test_the_catalog_badges_flip_at_the_opening_and_at_the_closing(browser, live_server):
    """One run across both edges (the waits are real seconds), its layout checked at every width
    before and after them."""
    width = 375

    now = timezone.now()
    _product("LIVE-0", "Mechanical keyboard", opens_at=now - timedelta(days=1), closes_at=now - timedelta(hours=1))
    _product("LIVE-X", "Signed poster", opens_at=now - timedelta(hours=1), closes_at=now - timedelta(hours=1))
    later = _product("LIVE-L", UNBREAKABLE, opens_at=now + timedelta(hours=3))
    with own_contexts(browser):
        page = _wrong_clock_page(browser, width)
        page.goto(f"{live_server.url}/")  # the server and the browser warm
        opens, closes = timezone.now() + timedelta(seconds=5), timezone.now() + timedelta(seconds=8)
        soon = _product("LIVE-1", "Limited sneaker", opens_at=opens, closes_at=opens + timedelta(hours=1))
        ending = _product("LIVE-2", "Wireless headphones", opens_at=now - timedelta(hours=1), closes_at=closes)
        page.goto(f"{live_server.url}/")
        block = page.locator("#upcoming-drops")
        assert block.locator("h2").first.inner_text() == "Upcoming drops"
        assert [c.get_attribute("data-product") for c in block.locator(".card").all()] == [str(soon.pk), str(later.pk)]
        assert block.bounding_box()["y"] < page.locator("#catalog").bounding_box()["y"]  # at the top
        card = page.locator(f'.card[data-product="{soon.pk}"]')
        assert re.fullmatch(r"Opens in 0:0[1-5]", card.locator(".drop-state").inner_text())  # not "in 1:00:0x"
        assert re.fullmatch(r"Ends in 0:0[1-8]", page.locator(f'.card[data-product="{ending.pk}"] .drop-state')
                            .inner_text())
        called_off = page.locator(".card", has_text="Signed poster").inner_text()
        assert "Called off" in called_off and "Sale ended" not in called_off
        _laid_out_at_every_width(page, "catalog")

        # The opening: the card leaves the upcoming block, open, in stock, with Add to cart.
        page.locator(f'#catalog .card[data-product="{soon.pk}"] button').wait_for(timeout=9000)
        assert timezone.now() >= opens
        card = page.locator(f'.card[data-product="{soon.pk}"]')
        assert "Opens in" not in card.inner_text() and "9 in stock" in card.inner_text()
        # The closing: "Sale ended", no stock figure, no Add to cart.
        ended = page.locator(f'.card[data-product="{ending.pk}"]')
        ended.get_by_text("Sale ended").wait_for(timeout=9000)
        assert timezone.now() >= closes
        assert "in stock" not in ended.inner_text() and ended.locator("button").count() == 0
        _laid_out_at_every_width(page, "catalog-flipped")


def test_the_catalog_flips_without_javascript(browser, live_server):
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": 375, "height": 740}, java_script_enabled=False)
        page.goto(f"{live_server.url}/")
        opens = timezone.now() + timedelta(seconds=3)
        soon = _product("NOJS-1", "Limited sneaker", opens_at=opens)
        page.goto(f"{live_server.url}/")
        card = page.locator(f'.card[data-product="{soon.pk}"]')
        assert card.locator(".drop-state").inner_text() in {"Opens in 3 s", "Opens in 2 s"}  # as drawn
        assert "loads again by itself" in page.inner_text("#upcoming-drops")
        page.locator(f'#catalog .card[data-product="{soon.pk}"] button').wait_for(timeout=9000)  # the refresh
        assert timezone.now() >= opens and page.locator("#upcoming-drops").count() == 0


def test_the_product_page_flips_at_its_closing_and_when_the_sale_is_ended_early(browser, live_server):
    """One run across the closing and an early end (real seconds), its layout checked at every
    width before and after."""
    width = 375

    with own_contexts(browser):
        page = _wrong_clock_page(browser, width)
        page.goto(f"{live_server.url}/")
        closes = timezone.now() + timedelta(seconds=6)
        p = _product("CLOSE-1", UNBREAKABLE, opens_at=timezone.now() - timedelta(hours=1), closes_at=closes)
        page.goto(f"{live_server.url}/products/{p.pk}/")
        assert re.fullmatch(r"0:0[1-6] left", page.inner_text("#drop-closes-in"))  # the server's clock
        assert page.locator("#add-to-cart").count() == 1
        _laid_out_at_every_width(page, "closing")
        page.locator("#drop-ended").wait_for(timeout=9000)  # the page loads again at the closing
        assert timezone.now() >= closes
        assert page.locator("#add-to-cart").count() == 0 and "left)" not in page.inner_text("main")
        _laid_out_at_every_width(page, "closed")

        # "End sale now" on a sale with an hour to go: no countdown can know; the poll does.
        selectors._windows.clear()  # ids are reused from test to test: no window of an earlier one
        q = _product("CLOSE-2", "Wireless headphones", opens_at=timezone.now() - timedelta(hours=1),
                     closes_at=timezone.now() + timedelta(hours=1))
        page.goto(f"{live_server.url}/products/{q.pk}/")
        assert page.locator("#add-to-cart").count() == 1
        end_drop(products=[q], actor="admin:test")
        ended_at = timezone.now()
        page.locator("#drop-ended").wait_for(timeout=15000)
        assert "Sale ended" in page.inner_text("#drop-ended") and page.locator("#add-to-cart").count() == 0
        assert timezone.now() - ended_at < timedelta(seconds=15)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_cart_and_checkout_after_a_sale_ended_offer_only_what_helps(browser, live_server, user, width):
    from tests.browser import logged_in_page

    now = timezone.now()
    ending = _product("END-1", UNBREAKABLE, opens_at=now - timedelta(hours=1), closes_at=now + timedelta(hours=1))
    fine = _product("END-2", "Wireless headphones")
    with logged_in_page(browser, live_server.url, user, width=width) as page:
        for p in (ending, fine):
            page.goto(f"{live_server.url}/products/{p.pk}/")
            page.click("#add-to-cart")
            page.wait_for_url("**/cart/")
        end_drop(products=[ending], actor="admin:test")
        for name in ("cart", "checkout"):
            page.goto(f"{live_server.url}/{name}/")
            line = page.locator(f'tr.cart-line[data-product="{ending.pk}"]')
            text = line.inner_text()
            assert "This sale has ended." in text and "in stock" not in text and "left" not in text, text
            assert line.locator("input[type=number]").count() == 0 and line.get_by_text("Update").count() == 0
            assert line.get_by_role("button", name="Remove").count() == 1
            assert "remove them" in page.inner_text("#fix-first") and "reduce" not in page.inner_text("main").lower()
            assert page.locator(".messages li").count() == 0  # said once, by the page's notice
            assert page.get_by_role("link", name="Check out").count() == 0
            assert page.locator("#place-order").count() == 0
            page.screenshot(path=str(ARTIFACTS / f"drop-flips-{width}-{name}-ended.png"), full_page=True)
            problems = page.evaluate(CHECK_LAYOUT, width < 600)
            assert not problems, "\n".join(problems)
        page.locator(f'tr.cart-line[data-product="{ending.pk}"]').get_by_role("button", name="Remove").click()
        page.wait_for_url("**/checkout/")
        assert page.locator("#place-order").count() == 1  # the one line left can be bought
