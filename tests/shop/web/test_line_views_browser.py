"""The waiting page of a drop's line in Chromium, at 320, 375 and 1280 px: with JavaScript it shows
the place, looks again by itself and places the order when it is the buyer's turn, or says sold
out; without it, the page takes the buyer to the GET page that reloads itself and offers the
order again. Real MariaDB and Redis, the live server."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from shop import line
from shop.models import Order, Product
from shop.services import inventory
from tests.browser import ARTIFACTS, logged_in_page
from tests.shop.web.test_phone_layout import CHECK_LAYOUT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def lined(settings, make_product, other_user):
    """A drop open a minute ago whose line lets one buyer through at once, and that one is
    `other_user`, in the checkout (its turn held): whoever comes next waits."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = make_product(stock=2)
    Product.objects.filter(pk=p.pk).update(opens_at=timezone.now() - timedelta(minutes=1),
                                           name="Limited-edition carbon racing sneaker")
    line.forget()
    p.refresh_from_db()
    held = line.join(config=line.config_of(p), user_id=other_user.pk, start=True, until=time.monotonic() + 120)
    return p, held


def _wait_in_line(page, url: str, p: Product) -> None:
    page.goto(f"{url}/products/{p.pk}/")
    page.click("#add-to-cart")
    page.goto(f"{url}/checkout/")
    page.click("#place-order")
    page.wait_for_load_state()


def _let_through(p: Product, held: line.Position, other_user) -> None:
    line.finish([held], outcome=line.DONE, user_id=other_user.pk, lines={p.pk: line.config_of(p)})


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_with_javascript_the_page_shows_the_place_and_places_the_order_on_its_turn(browser, live_server, user,
                                                                                   other_user, lined, width):
    p, held = lined
    with logged_in_page(browser, live_server.url, user, width=width) as page:
        _wait_in_line(page, live_server.url, p)
        status = page.locator("#line-status")
        assert "You are number 2 in line, with 1 ahead of you" in status.inner_text()
        page.screenshot(path=str(ARTIFACTS / f"line-waiting-js-{width}.png"), full_page=True)
        problems = page.evaluate(CHECK_LAYOUT, width < 600)
        page.wait_for_timeout(2500)  # it looks again (every second near the front) and stays in line
        assert "/checkout/" in page.url and not Order.objects.filter(user=user).exists()
        _let_through(p, held, other_user)
        page.wait_for_url(re.compile(r"/orders/\d+/$"), timeout=15000)  # placed by itself
        assert "Your order is placed" in page.inner_text("main")
    assert Order.objects.filter(user=user).count() == 1
    assert not problems, "\n".join(problems)


def test_with_javascript_a_sold_out_line_is_said_within_about_a_second(browser, live_server, user, other_user, lined):
    p, _ = lined
    with logged_in_page(browser, live_server.url, user, width=375) as page:
        _wait_in_line(page, live_server.url, p)
        assert page.locator("#line-status[data-state=waiting]").count() == 1
        inventory.adjust_stock(product=p, delta=-2, reason="damaged", note="water damage", actor="test")
        sold_out_at = time.monotonic()
        page.locator("#line-status[data-state=sold_out]").wait_for(timeout=10000)
        seen_after = time.monotonic() - sold_out_at
        assert "Sold out" in page.inner_text("#line-status") and page.locator("#place-order").is_disabled()
        page.screenshot(path=str(ARTIFACTS / "line-sold-out-js-375.png"), full_page=True)
    print(f"sold out seen by the waiting page {seen_after:.2f} s after the last unit went")
    assert seen_after < 5  # a look every second near the front; generous for a loaded machine
    assert not Order.objects.filter(user=user).exists()


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_without_javascript_the_page_refreshes_to_the_place_and_try_now_places_the_order(browser, live_server, user,
                                                                                         other_user, lined, width):
    from tests.browser import log_in, own_contexts

    p, held = lined
    with own_contexts(browser):
        context = browser.new_context(viewport={"width": width, "height": 740}, java_script_enabled=False)
        log_in(context, live_server.url, user)
        page = context.new_page()
        _wait_in_line(page, live_server.url, p)
        assert "You are number 2 in line" in page.inner_text("main")
        page.wait_for_url(re.compile(rf"/line/{p.pk}/\?key="), timeout=10000)  # the meta refresh
        assert "You are number 2 in line" in page.inner_text("#line-status")
        page.screenshot(path=str(ARTIFACTS / f"line-waiting-nojs-{width}.png"), full_page=True)
        problems = page.evaluate(CHECK_LAYOUT, width < 600)
        _let_through(p, held, other_user)
        page.locator("#line-status[data-state=your_turn]").wait_for(timeout=10000)  # it reloads itself
        page.click("#line-try-now")
        page.wait_for_url(re.compile(r"/orders/\d+/$"), timeout=10000)
    assert Order.objects.filter(user=user).count() == 1
    assert not problems, "\n".join(problems)
