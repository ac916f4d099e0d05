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
from tests.browser import ARTIFACTS, own_contexts
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
def _operator_page(browser, url: str, next_url: str, *, width: int, height: int) -> Iterator:
    """A superuser ("ops") signed in, at `next_url`, in a browser window of this size."""
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"{url}/admin/login/?next={next_url}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"**{next_url}")
        yield page


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


def test_the_orders_and_sales_lists_fit_1280_px_without_sideways_scrolling(browser, live_server, make_product,
                                                                           make_coupon):
    _orders(make_product, make_coupon)
    with _operator_page(browser, live_server.url, "/admin/shop/order/", width=1280, height=800) as page:
        overflow = _overflow(page, "admin-orders-1280.png")
        text = page.inner_text("#changelist")
        filters = page.inner_text("#changelist-filter")
        page.goto(f"{live_server.url}/admin/shop/productsales/")
        sales = _overflow(page, "admin-sales-1280.png")
    assert overflow == {"page": 0, "results": 0}, overflow
    assert sales == {"page": 0, "results": 0}, sales
    assert "Refund…" in text and "Cancel…" in text  # the actions are there, in one column
    assert "Placed" not in filters and "Awaiting payment" in filters  # the legacy status is not offered


def test_the_lock_dashboard_fits_a_375_px_phone(browser, live_server, settings, make_product):
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": settings.LOCKS["KEY_PREFIX"] + "phone:"}
    product = make_product(stock=5)
    with Lock(f"product:{product.pk}", ttl=30.0), Lock("report:a-rather-long-lock-name-for-a-phone", ttl=30.0):
        stats.flush()
        with _operator_page(browser, live_server.url, "/admin/locks/lockdashboard/", width=375, height=740) as page:
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


def _sold_cell(page, product) -> str:
    """The Sold cell of `product`'s row in the Sales view."""
    return page.evaluate("""(sku) => {
        const row = [...document.querySelectorAll('#result_list tbody tr')].find(r => r.innerText.includes(sku));
        return row ? row.querySelector('td.field-units_sold').innerText : null;
    }""", product.sku)


def test_the_sales_view_refreshes_itself_and_can_be_paused(browser, live_server, make_product, user, monkeypatch):
    """While a sale runs the figures come in without a reload, with the time they were read; Pause
    stops that, "Refresh now" reads them at once."""
    monkeypatch.setattr("shop.admin.sales.SALES_REFRESH", 1)
    product = make_product(stock=50)
    with _operator_page(browser, live_server.url, "/admin/shop/productsales/", width=1280, height=800) as page:
        assert _sold_cell(page, product) == "0" and page.inner_text(".sales-state") == "refreshed every 1 s"
        first = page.inner_text("#sales-updated time")
        pay_order(order=order_of(place_order(user=user, lines=[(product.pk, 3)])), actor="test")
        page.wait_for_function("(sku) => [...document.querySelectorAll('#result_list tbody tr')]"
                               ".some(r => r.innerText.includes(sku) && r.querySelector('.field-units_sold')"
                               ".innerText === '3')", arg=product.sku, timeout=10_000)
        assert page.inner_text("#sales-totals").split("\t")[4] == "3"  # the totals row came with it
        page.wait_for_function("(t) => document.querySelector('#sales-updated time').innerText !== t", arg=first,
                               timeout=5_000)

        page.click("[data-action=pause]")
        assert page.inner_text(".sales-state") == "paused" and page.inner_text("[data-action=pause]") == "Resume"
        pay_order(order=order_of(place_order(user=user, lines=[(product.pk, 2)])), actor="test")
        page.wait_for_timeout(2500)  # two refresh periods: nothing comes in while paused
        assert _sold_cell(page, product) == "3"
        page.click("[data-action=refresh]")
        page.wait_for_function("(sku) => [...document.querySelectorAll('#result_list tbody tr')]"
                               ".some(r => r.innerText.includes(sku) && r.querySelector('.field-units_sold')"
                               ".innerText === '5')", arg=product.sku, timeout=5_000)
        assert page.url.endswith("/admin/shop/productsales/")  # fetched in place, no navigation
        page.click("[data-action=pause]")  # resumed
        assert page.inner_text(".sales-state") == "refreshed every 1 s"


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_the_sales_views_refresh_bar_and_totals_fit_every_width(browser, live_server, make_product, make_coupon, width):
    _orders(make_product, make_coupon)
    with _operator_page(browser, live_server.url, "/admin/shop/productsales/", width=width, height=800) as page:
        overflow = _overflow(page, f"admin-sales-{width}.png")
        controls = page.evaluate("""() => [...document.querySelectorAll(
            '#sales-updated, #sales-refresh [data-action]')].map(e => {
            const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, visible: r.width > 0};
        })""")
        totals = page.inner_text("#sales-totals")
    assert overflow["page"] == 0, overflow
    assert width < 1280 or overflow["results"] == 0, overflow  # on a phone the table scrolls in its own box
    assert len(controls) == 3 and all(c["visible"] and c["left"] >= 0 and c["right"] <= width for c in controls), \
        controls
    assert "Total (1 product)" in totals


# The confirmation's two buttons: their background colours, the admin's "danger" colour, and
# whether both are on the screen.
CONFIRM_BUTTONS = """(noLabel) => {
  const probe = document.createElement('div');
  probe.style.background = 'var(--delete-button-bg)';
  document.body.appendChild(probe);
  const danger = getComputedStyle(probe).backgroundColor;
  probe.remove();
  const yes = document.querySelector('#content-main form input[type=submit]');
  const no = [...document.querySelectorAll('#content-main form a')].find(a => a.textContent.trim() === noLabel);
  const onScreen = el => { const r = el.getBoundingClientRect(); return r.left >= 0 && r.right <= innerWidth; };
  const bg = el => getComputedStyle(el).backgroundColor;
  return {danger, yes: yes.value, yesBg: bg(yes), noBg: bg(no), onScreen: onScreen(yes) && onScreen(no)};
}"""


def test_refund_and_cancel_mark_yes_as_the_dangerous_action(browser, live_server, make_product, user):
    """"Yes, refund it" is red like the force release's "Yes, release it" (the admin's delete
    colour), and "No, keep it" is not: the two no longer look alike. Cancel's confirmation too."""
    product = make_product(stock=10, price="129.00")
    paid = pay_order(order=order_of(place_order(user=user, lines=[(product.pk, 1)])), actor="test")
    pending = order_of(place_order(user=user, lines=[(product.pk, 1)]))
    seen = []
    refund = f"/admin/shop/order/{paid.pk}/refund/"
    with _operator_page(browser, live_server.url, refund, width=1280, height=800) as page:
        for url in (f"/admin/shop/order/{paid.pk}/refund/", f"/admin/shop/order/{pending.pk}/cancel/"):
            page.goto(f"{live_server.url}{url}")
            for width in (320, 375, 1280):
                page.set_viewport_size({"width": width, "height": 800})
                seen.append((width, page.evaluate(CONFIRM_BUTTONS, "No, keep it")))
            page.screenshot(path=str(ARTIFACTS / f"admin-confirm-{url.strip('/').rsplit('/', 1)[-1]}.png"))
    assert [b["yes"] for _, b in seen] == ["Yes, refund it"] * 3 + ["Yes, cancel it"] * 3
    for width, buttons in seen:
        assert buttons["yesBg"] == buttons["danger"] != buttons["noBg"], (width, buttons)
        assert buttons["onScreen"], (width, buttons)


def test_removing_stock_marks_yes_as_the_dangerous_action(browser, live_server, make_product):
    """An adjustment that takes units away is confirmed in the same red; "No, change it" is not."""
    product = make_product(stock=10)
    url = f"/admin/shop/product/{product.pk}/adjust/"
    seen = []
    with _operator_page(browser, live_server.url, url, width=1280, height=800) as page:
        page.fill("#id_delta", "-2")
        page.select_option("#id_reason", "damaged")
        page.click("input[value='Review the adjustment']")
        page.wait_for_selector("#adjust-preview")
        for width in (320, 375, 1280):
            page.set_viewport_size({"width": width, "height": 800})
            seen.append((width, page.evaluate(CONFIRM_BUTTONS, "No, change it")))
        page.screenshot(path=str(ARTIFACTS / "admin-confirm-adjust-down.png"))
    for width, buttons in seen:
        assert buttons["yes"] == "Yes, adjust the stock"
        assert buttons["yesBg"] == buttons["danger"] != buttons["noBg"], (width, buttons)
        assert buttons["onScreen"], (width, buttons)


# How many lines the text of each Sales cell of a column takes (its line boxes).
CELL_LINES = """(field) => [...document.querySelectorAll(`#result_list tbody td.field-${field}`)].map(td => {
  const range = document.createRange();
  range.selectNodeContents(td);
  const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
  return {text: td.innerText, lines: tops.size};
})"""


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_the_sales_views_skus_stay_on_one_line(browser, live_server, make_product, width):
    """Issue 37: at 1280 px the SKU column wrapped letter by letter; a SKU is one word on one line
    (on a phone the table scrolls in its own box), with the drop and money columns beside it."""
    from shop.models import Product
    from shop.services import end_drop

    products = [Product.objects.create(sku=f"DROP-2026-SNEAKER-RED-{size}", name=f"Sneaker red, size {size}",
                                       price="189.00", stock=30) for size in (41, 42)]
    end_drop(products=products[:1], actor="test")
    with _operator_page(browser, live_server.url, "/admin/shop/productsales/", width=width, height=800) as page:
        overflow = _overflow(page, f"admin-sales-skus-{width}.png")
        skus = page.evaluate(CELL_LINES, "sku")
        drops = page.evaluate(CELL_LINES, "drop")
    assert overflow["page"] == 0, overflow
    assert width < 1280 or overflow["results"] == 0, overflow
    assert sorted(s["text"] for s in skus) == sorted(p.sku for p in products)
    assert all(s["lines"] == 1 for s in skus), skus
    assert any(d["text"].startswith("ended") for d in drops), drops


def test_end_sale_now_asks_in_red_before_it_ends_anything(browser, live_server, make_product, user):
    """Issue 37: "End sale now" ended the sale on one click. Now a page says what ends and what
    happens to orders awaiting payment, "Yes, end the sale" in the admin's danger red and "No, keep
    it on sale" not, both on the screen at every width; only Yes ends it."""
    from shop.models import Product

    product = make_product(stock=10)
    order_of(place_order(user=user, lines=[(product.pk, 2)]))
    seen = []
    with _operator_page(browser, live_server.url, "/admin/shop/product/", width=1280, height=800) as page:
        page.check(f"#result_list input.action-select[value='{product.pk}']")
        page.select_option("select[name=action]", "end_sale_now")
        page.click("#changelist-form button[name=index]")
        page.wait_for_selector("#end-sale-reserved")
        assert Product.objects.get(pk=product.pk).closes_at is None  # asked, nothing ended
        reserved = page.inner_text("#end-sale-reserved")
        for width in (320, 375, 1280):
            page.set_viewport_size({"width": width, "height": 800})
            seen.append((width, page.evaluate(CONFIRM_BUTTONS, "No, keep it on sale"), page.evaluate(OVERFLOW)))
            page.screenshot(path=str(ARTIFACTS / f"admin-confirm-end-sale-{width}.png"), full_page=True)
        page.click("input[value='Yes, end the sale']")
        page.wait_for_selector(".messagelist .success")
        message = page.inner_text(".messagelist")
    assert "1 order awaiting payment (2 units) was placed" in reserved and "its pay-by" in reserved
    for width, buttons, overflow in seen:
        assert buttons["yes"] == "Yes, end the sale"
        assert buttons["yesBg"] == buttons["danger"] != buttons["noBg"], (width, buttons)
        assert buttons["onScreen"] and overflow["page"] == 0, (width, buttons, overflow)
    assert "Sale ended for 1 product:" in message
    assert Product.objects.get(pk=product.pk).drop_state == "ended"


def test_the_user_list_with_sign_ups_and_tokens_fits_1280_px(browser, live_server):
    """Auth > Users with the bots columns (first API token, how soon after sign-up) and the last
    hour's sign-ups and tokens per minute over the list."""
    from shop.models import ApiToken

    for i in range(3):
        bot = get_user_model().objects.create_user(f"fresh-account-with-a-long-name-{i}@example.com", password="x")
        ApiToken.issue(user_id=bot.pk, name="script")
    with _operator_page(browser, live_server.url, "/admin/auth/user/", width=1280, height=800) as page:
        overflow = _overflow(page, "admin-users-1280.png")
        signups = page.inner_text("#signups")
        text = page.inner_text("#changelist")
    assert overflow == {"page": 0, "results": 0}, overflow
    assert "Sign-ups and API tokens, last hour" in signups and "Total" in signups
    assert "FIRST API TOKEN" in text.upper() and "TOKEN AFTER SIGN-UP" in text.upper()
