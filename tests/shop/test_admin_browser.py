"""The operator's pages in a real browser (Debian's Chromium, headless): widths an operator uses.

What went wrong once: the orders list needed sideways scrolling at 1280 px; the lock dashboard's
tables were 828 px wide on a 375 px phone. Each page is checked for overflow of the page itself
and of the changelist's results box.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth import get_user_model

from locks import Lock, stats
from shop.models import Order
from shop.services import claim_coupon, pay_order, place_order
from tests.browser import ARTIFACTS, launch
from tests.helpers import order_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "ops-password-1"

# Widths of the page and of every box that scrolls sideways by design (tables on a phone).
OVERFLOW = """() => {
  const doc = document.documentElement;
  const results = document.querySelector('#changelist .results');
  return {page: doc.scrollWidth - doc.clientWidth,
          results: results ? results.scrollWidth - results.clientWidth : 0};
}"""


@contextmanager
def _operator_page(url: str, next_url: str, *, width: int, height: int) -> Iterator:
    """A superuser ("ops") signed in, at `next_url`, in a browser window of this size."""
    from playwright.sync_api import sync_playwright

    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"{url}/admin/login/?next={next_url}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"**{next_url}")
        yield page
        browser.close()


def _overflow(page, shot: str) -> dict[str, int]:
    """How far the page and the results box scroll sideways; a screenshot for the record."""
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    return page.evaluate(OVERFLOW)


def _orders(make_product, make_coupon) -> list[Order]:
    """A realistic list: long buyer names, a coupon, every status with its column filled."""
    buyers = [get_user_model().objects.create_user(f"buyer-with-a-long-name-{i}@example.com", password="x")
              for i in range(4)]
    product = make_product(stock=100, price="1658.00")
    coupon = make_coupon(total=10, discount="15.00")
    orders = []
    for i, buyer in enumerate(buyers):
        claim_coupon(user=buyer, code=coupon.code)
        order = order_of(place_order(user=buyer, lines=[(product.pk, 1 + i)], coupon_code=coupon.code))
        if i % 2:
            order = pay_order(order=order, actor="test")
        orders.append(order)
    return orders


def test_the_orders_and_sales_lists_fit_1280_px_without_sideways_scrolling(live_server, make_product, make_coupon):
    _orders(make_product, make_coupon)
    with _operator_page(live_server.url, "/admin/shop/order/", width=1280, height=800) as page:
        overflow = _overflow(page, "admin-orders-1280.png")
        text = page.inner_text("#changelist")
        filters = page.inner_text("#changelist-filter")
        page.goto(f"{live_server.url}/admin/shop/productsales/")
        sales = _overflow(page, "admin-sales-1280.png")
    assert overflow == {"page": 0, "results": 0}, overflow
    assert sales == {"page": 0, "results": 0}, sales
    assert "Refund…" in text and "Cancel…" in text  # the actions are there, in one column
    assert "Placed" not in filters and "Awaiting payment" in filters  # the legacy status is not offered


def test_the_lock_dashboard_fits_a_375_px_phone(live_server, settings, make_product):
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": settings.LOCKS["KEY_PREFIX"] + "phone:"}
    product = make_product(stock=5)
    with Lock(f"product:{product.pk}", ttl=30.0), Lock("report:a-rather-long-lock-name-for-a-phone", ttl=30.0):
        stats.flush()
        with _operator_page(live_server.url, "/admin/locks/lockdashboard/", width=375, height=740) as page:
            overflow = _overflow(page, "lock-dashboard-375.png")
            # Every table is inside a box no wider than the screen, which scrolls if it must.
            boxes = page.evaluate("""() => [...document.querySelectorAll('#locks-dashboard table')].map(t => {
                const box = t.parentElement, style = getComputedStyle(box);
                return {id: t.id, box: box.getBoundingClientRect().right, scrolls: style.overflowX};
            })""")
            held = page.inner_text("#held-locks")
    assert overflow["page"] == 0, overflow
    assert boxes and all(b["box"] <= 375 and b["scrolls"] in ("auto", "scroll") for b in boxes), boxes
    assert f"product:{product.pk}" in held
