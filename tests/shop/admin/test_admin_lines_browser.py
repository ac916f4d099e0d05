"""The admin's Lines page in Chromium: a table that fits 1280 px, cards on a 320 and 375 px phone,
figures that refresh by themselves, and Pause that asks first (a red Yes)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from shop import errors, line
from shop.models import Product
from shop.services import place_order
from tests import helpers
from tests.shop.admin.test_admin_browser import _operator_page, _overflow

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def drops(settings, make_product):
    """Three drops: one open with buyers waiting, one in its pre-queue, one not open yet."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    now = timezone.now()
    made = []
    for name, opens, prequeue in (("Limited-edition carbon racing sneaker", now - timedelta(minutes=1), 120),
                                  ("Wireless headphones", now + timedelta(seconds=90), 600),
                                  ("Mechanical keyboard", now + timedelta(hours=3), 0)):
        p = make_product(stock=40)
        Product.objects.filter(pk=p.pk).update(name=name, opens_at=opens, line_prequeue_seconds=prequeue)
        made.append(Product.objects.get(pk=p.pk))
    line.forget()
    first, *others = helpers.make_users(4, prefix="crowd")
    line.join(config=line.config_of(made[0]), user_id=first.pk, start=True, until=time.monotonic() + 120)
    for user in others:
        with pytest.raises(errors.InLine):
            place_order(user=user, lines=[(made[0].pk, 1)])
    return made


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_the_lines_page_fits_the_window_and_refreshes_itself(browser, live_server, drops, width):
    with _operator_page(browser, live_server.url, "/admin/shop/productline/", width=width, height=800) as page:
        row = page.locator(f"#line-{drops[0].pk}")
        assert "open" in row.inner_text() and "Pause…" in row.inner_text()
        overflow = _overflow(page, f"admin-lines-{width}.png")
        assert overflow["page"] <= 0, overflow
        label = page.evaluate("() => getComputedStyle(document.querySelector('#lines td[data-label=Waiting]'),"
                              " '::before').content")
        if width < 768:  # cards: each figure says what it is
            assert label == '"Waiting"', label
        else:
            assert page.locator("#lines thead").is_visible()
        # The figures refresh by themselves (the Sales view's script): a new buyer shows up.
        assert page.inner_text(f"#line-{drops[0].pk} td[data-label=Waiting]").strip() == "3"
        late = helpers.make_users(1, prefix="late")[0]
        with pytest.raises(errors.InLine):
            place_order(user=late, lines=[(drops[0].pk, 1)])
        page.wait_for_function(f"() => document.querySelector('#line-{drops[0].pk} td[data-label=Waiting]')"
                               ".textContent.trim() === '4'", timeout=15000)


def test_pause_asks_first_in_red_and_the_page_then_says_paused(browser, live_server, drops):
    with _operator_page(browser, live_server.url, "/admin/shop/productline/", width=375, height=800) as page:
        page.click(f"#line-{drops[0].pk} a.pause-line")
        page.wait_for_url("**/pause/")
        yes = page.locator("input[type=submit][value='Yes, pause the line']")
        red = page.evaluate("(el) => getComputedStyle(el).backgroundColor", yes.element_handle())
        assert red.startswith("rgb(") and int(red[4:].split(",")[0]) > 150, red  # the admin's delete red
        assert not Product.objects.get(pk=drops[0].pk).line_paused
        yes.click()
        page.wait_for_url("**/admin/shop/productline/")
        assert "line paused" in page.inner_text(".messagelist")
        assert page.locator(f"#line-{drops[0].pk}[data-state=paused]").count() == 1
    assert Product.objects.get(pk=drops[0].pk).line_paused
