"""In a real browser at 320, 375 and 1280 px: the product page's error,
the order page's cancel and pay-by countdown, and coming back where you were after log-in,
sign-up and a password reset."""

from __future__ import annotations

import os
import re
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core import mail

from shop.models import Order
from shop.services import place_order
from shop.services.emails import send_pending_mail
from tests.browser import ARTIFACTS, log_in, own_contexts
from tests.helpers import order_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WIDTHS = pytest.mark.parametrize("width", [320, 375, 1280])
PASSWORD = "a-long-pass-123"


def _open_menu(page) -> None:
    """On a phone the header's links sit behind its Menu button."""
    summary = page.locator("header details.menu > summary")
    if summary.is_visible():
        summary.click()


@WIDTHS
def test_more_than_the_stock_shows_one_error_and_keeps_the_quantity(browser, live_server, make_product, width):
    p = make_product(stock=3)
    with own_contexts(browser):
        page = browser.new_page(viewport={"width": width, "height": 740})
        page.goto(f"{live_server.url}/products/{p.pk}/")
        page.fill("#id_quantity", "2")
        page.click("#add-to-cart")
        page.wait_for_url("**/cart/")
        page.goto(f"{live_server.url}/products/{p.pk}/")
        page.fill("#id_quantity", "2")
        page.click("#add-to-cart")
        page.wait_for_load_state()
        page.screenshot(path=str(ARTIFACTS / f"product-error-{width}.png"), full_page=True)
        assert page.input_value("#id_quantity") == "2"  # what the buyer typed, not 1
        error = page.locator("#quantity-errors")
        assert error.inner_text().strip() == "Only 3 left (you already have 2 in your cart)."
        assert page.get_by_text("Only 3 left (you already have").count() == 1
        style = page.evaluate("""() => {
            const e = document.getElementById('quantity-errors');
            const flash = document.createElement('ul'); flash.className = 'messages';
            flash.innerHTML = '<li class="error">x</li>'; document.querySelector('main').append(flash);
            const f = getComputedStyle(flash.firstChild), s = getComputedStyle(e);
            const marked = (li) => getComputedStyle(li).display === 'list-item'
                                   && getComputedStyle(li).listStyleType !== 'none';
            return {same: [s.color, s.backgroundColor].join() === [f.color, f.backgroundColor].join(),
                    bullets: [...e.querySelectorAll('li'), e].filter(marked).length,
                    inInfoBox: e.closest('.messages') !== null};
        }""")
        assert style["same"], "the field error must look like the site's other error messages"
        assert style["bullets"] == 0 and not style["inInfoBox"], style


@WIDTHS
def test_order_cancel_is_secondary_and_confirmed_and_pay_by_counts_down_in_local_time(browser,
        live_server, user, make_product, width):
    p = make_product(stock=5, price="1658.00")
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    zone = "America/New_York"
    local = order.pay_by.astimezone(ZoneInfo(zone))
    with own_contexts(browser):
        context = browser.new_context(viewport={"width": width, "height": 740}, timezone_id=zone, locale="en-US")
        log_in(context, live_server.url, user)
        page = context.new_page()
        page.goto(f"{live_server.url}/orders/{order.pk}/")
        page.screenshot(path=str(ARTIFACTS / f"order-{width}.png"), full_page=True)
        pay, cancel = page.locator(".order-actions .pay"), page.locator(".order-actions .cancel")
        assert pay.inner_text() == "Pay $1,658.00"
        looks = page.evaluate("""() => ['.pay', '.cancel'].map((s) => {
            const c = getComputedStyle(document.querySelector('.order-actions ' + s));
            return [c.backgroundColor, c.color].join(); })""")
        assert looks[0] != looks[1], "Cancel must not look like Pay"
        assert "secondary" in (cancel.get_attribute("class") or "")

        shown = page.inner_text("#pay-by")
        assert f"{local.hour % 12 or 12}:{local:%M}" in shown and "UTC" not in shown, shown
        assert page.get_attribute("#pay-by", "datetime") == order.pay_by.isoformat()
        first = page.inner_text("#pay-countdown")
        page.wait_for_timeout(1200)
        second = page.inner_text("#pay-countdown")
        assert re.fullmatch(r"(\d+:)?\d{1,2}:\d\d left", first) and first != second, (first, second)

        cancel.click()
        page.wait_for_url(f"**/orders/{order.pk}/cancel/")
        page.screenshot(path=str(ARTIFACTS / f"order-cancel-{width}.png"), full_page=True)
        assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT  # not yet
        page.click("#keep-order")
        page.wait_for_url(f"**/orders/{order.pk}/")
        assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
        page.locator(".order-actions .cancel").click()
        page.click("#confirm-cancel")
        page.wait_for_url(f"**/orders/{order.pk}/")
        assert "cancelled" in page.inner_text(".messages")
        assert Order.objects.get(pk=order.pk).status == Order.Status.CANCELLED


@WIDTHS
def test_login_signup_and_password_reset_bring_the_buyer_back(browser, live_server, make_product, width):
    p = make_product(stock=5)
    url = live_server.url
    with own_contexts(browser):
        # A new buyer: cart first, then the checkout asks for an account: after sign-up, the checkout.
        page = browser.new_page(viewport={"width": width, "height": 740})
        page.goto(f"{url}/products/{p.pk}/")
        page.click("#add-to-cart")
        page.wait_for_url("**/cart/")
        page.click("main a.btn[href='/checkout/']")
        page.wait_for_url("**/login/?next=/checkout/")
        page.click("main a[href^='/signup/']")
        page.wait_for_url("**/signup/?next=%2Fcheckout%2F")
        page.fill("#id_username", f"newbie{width}")
        page.fill("#id_email", f"newbie{width}@example.com")
        page.fill("#id_password1", PASSWORD)
        page.fill("#id_password2", PASSWORD)
        page.click("#signup-form button[type=submit]")
        page.wait_for_url(f"{url}/checkout/")
        assert page.locator(f"tr[data-product='{p.pk}']").count() == 1

        # A returning buyer on a product page: the header's Log in comes back to the product.
        guest = browser.new_page(viewport={"width": width, "height": 740})
        guest.goto(f"{url}/products/{p.pk}/")
        _open_menu(guest)
        guest.click("header a.login:visible")
        guest.wait_for_url(f"**/login/?next=%2Fproducts%2F{p.pk}%2F")
        # ...who forgot the password: reset it by mail, then log in, still headed for the product.
        guest.click("main a.forgot")
        guest.wait_for_url("**/password-reset/**")
        guest.fill("#id_email", f"newbie{width}@example.com")
        guest.click("main form button[type=submit]")
        guest.wait_for_url("**/password-reset/sent/**")
        assert mail.outbox == [] and send_pending_mail().sent == 1  # the mail job sends it
        assert len(mail.outbox) == 1 and mail.outbox[0].to == [f"newbie{width}@example.com"]
        link = re.search(r"https?://\S+/password-reset/\S+/\S+/", mail.outbox[0].body).group(0)
        guest.goto(link)
        guest.fill("#id_new_password1", "another-long-pass-456")
        guest.fill("#id_new_password2", "another-long-pass-456")
        guest.click("main form button[type=submit]")
        guest.wait_for_url("**/password-reset/done/**")
        guest.screenshot(path=str(ARTIFACTS / f"password-reset-done-{width}.png"), full_page=True)
        guest.click("main a.login")
        guest.fill("#id_username", f"newbie{width}")
        guest.fill("#id_password", "another-long-pass-456")
        guest.click("main form button[type=submit]")
        guest.wait_for_url(f"{url}/products/{p.pk}/")
    assert get_user_model().objects.get(username=f"newbie{width}").check_password("another-long-pass-456")
