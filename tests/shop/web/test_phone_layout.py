"""Every shopper page on a 320 and 375 px phone (and at 1280 px): nothing wider
than the window, no box that scrolls sideways, no word broken in the middle, a compact header, and
no form control that cuts its text off. Screenshots of every page land in test-artifacts/."""

from __future__ import annotations

import os
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from shop.models import ApiToken, Coupon, Product
from tests.browser import ARTIFACTS, own_contexts
from tests.helpers import order_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "a-long-pass-123"
# A name no phone can show on one line: it may wrap anywhere, but must not widen the page.
UNBREAKABLE = "Limited-edition-ultra-lightweight-carbon-plated-marathon-racing-sneaker-" + "X" * 60

# Run in the page: every problem found, as readable strings.
CHECK_LAYOUT = r"""(phone) => {
  const problems = [];
  const where = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth) problems.push(`page is ${doc.scrollWidth}px wide in ${window.innerWidth}px`);

  // A word may only break across lines when it is wider than the room its layout gives it: the
  // nearest box whose width does not follow its content (a block in normal flow or a grid item;
  // not a flex item, table cell or inline box, which a breakable word lets shrink below it).
  const flowing = new Set(['block', 'flow-root', 'list-item', 'grid', 'flex']);
  const room = (el) => {
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      const cs = getComputedStyle(a), ps = getComputedStyle(a.parentElement);
      const parentFlows = ['block', 'flow-root', 'list-item', 'grid'].includes(ps.display);
      if (flowing.has(cs.display) && parentFlows && cs.float === 'none' && cs.position !== 'absolute')
        return a.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    }
    return window.innerWidth;
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || el.closest('script, style, template, option') || !el.getClientRects().length) continue;
    // Words, each with its trailing hyphens or dashes: a line may end after a hyphen.
    const words = /[^\s\-\u2010-\u2014]+[\-\u2010-\u2014]*/g;
    for (let m = words.exec(node.data); m; m = words.exec(node.data)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const rects = [...range.getClientRects()].filter((r) => r.width > 0.5 && r.height > 0.5);
      if (rects.length < 2) continue;
      const first = rects[0];
      const split = rects.some((r) => r.top >= first.bottom - 2);
      const width = rects.reduce((sum, r) => sum + r.width, 0);
      // A run of over 30 letters is no word of any language (a token, a made-up name): it may break.
      if (split && width <= room(el) && m[0].length <= 30) problems.push(`"${m[0]}" broken over lines in ${where(el)}`);
    }
  }

  // No box scrolls sideways (a table must become cards, not a strip to swipe).
  for (const el of document.body.querySelectorAll('*')) {
    if (el.matches('input, textarea, select, script, style')) continue;
    const ox = getComputedStyle(el).overflowX;
    if (ox !== 'visible' && el.scrollWidth > el.clientWidth + 1 && el.getClientRects().length)
      problems.push(`${where(el)} scrolls sideways (${el.scrollWidth}px in ${el.clientWidth}px)`);
  }

  // Form controls show their whole text: a select its longest choice, a button its label.
  const ctx = document.createElement('canvas').getContext('2d');
  for (const s of document.querySelectorAll('select')) {
    if (!s.getClientRects().length) continue;
    const cs = getComputedStyle(s);
    ctx.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 20;
    for (const o of s.options) {
      const w = ctx.measureText(o.text).width;
      if (w > room) problems.push(`${where(s)} cuts off "${o.text}" (${Math.round(w)}px in ${Math.round(room)}px)`);
    }
  }
  for (const b of document.querySelectorAll('button, .btn')) {
    if (b.getClientRects().length && b.scrollWidth > b.clientWidth + 1) problems.push(`${where(b)} cuts off its label`);
  }

  // A compact header on a phone: one row (about 60 px), not three.
  const header = document.querySelector('body > header');
  if (phone && header && header.offsetHeight > 72) problems.push(`header is ${header.offsetHeight}px tall`);
  return problems;
}"""


def _shop(live_server) -> dict:
    """A shopper with everything a page can show: orders paid, cancelled and unpaid, a coupon, a token."""
    from shop.services import cancel_order, claim_coupon, pay_order, place_order

    alice = get_user_model().objects.create_user("alice.wanderer", email="alice@example.com", password=PASSWORD)
    keyboard = Product.objects.create(sku="KB-1", name="Mechanical keyboard", price=Decimal("1658.00"), stock=40,
                                      description="Hot-swappable switches, aluminium case.")
    headphones = Product.objects.create(sku="HP-2", name="Wireless noise-cancelling headphones",
                                        price=Decimal("249.99"), stock=25)
    sneaker = Product.objects.create(sku="SN-3", name=UNBREAKABLE, price=Decimal("129.00"), stock=9)
    from django.utils import timezone

    now = timezone.now()
    coupon = Coupon.objects.create(code="SPRINGSALE2026", discount=Decimal("150.00"), total=50, remaining=50,
                                   description="Spring sale: money off any order above the discount.",
                                   valid_from=now - timezone.timedelta(days=1),
                                   valid_until=now + timezone.timedelta(days=1))
    claim_coupon(user=alice, code=coupon.code)
    paid = order_of(place_order(user=alice, lines=[(keyboard.pk, 1), (headphones.pk, 2)]))
    pay_order(order=paid, actor="test")
    cancelled = order_of(place_order(user=alice, lines=[(sneaker.pk, 1)]))
    cancel_order(order=cancelled, actor="test", unpaid_only=True)
    unpaid = order_of(place_order(user=alice, lines=[(keyboard.pk, 2), (sneaker.pk, 1)]))
    ApiToken.issue(user_id=alice.pk, name="Load test from the office laptop")
    uid = urlsafe_base64_encode(force_bytes(alice.pk))
    return {"user": alice, "products": (keyboard, headphones, sneaker), "unpaid": unpaid,
            "reset_confirm": f"/password-reset/{uid}/{default_token_generator.make_token(alice)}/"}


@pytest.mark.parametrize("width", [320, 375, 1280])
def test_every_shopper_page_fits_the_window_without_broken_words(browser, live_server, width):
    from playwright.sync_api import Error as PlaywrightError

    data = _shop(live_server)
    keyboard, headphones, sneaker = data["products"]
    url, phone = live_server.url, width < 600
    problems: list[str] = []

    def check(page, name: str, path: str | None = None) -> None:
        if path is not None:
            try:
                response = page.goto(url + path)
            except PlaywrightError as exc:  # an error answer with no body
                problems.append(f"{name}: {path}: {exc.message.splitlines()[0]}")
                page.wait_for_timeout(500)  # the browser's own error page navigates too
                return
            if response is None or response.status >= 400:
                problems.append(f"{name}: {path} answered {response and response.status}")
        page.screenshot(path=str(ARTIFACTS / f"layout-{width}-{name}.png"), full_page=True)
        problems.extend(f"{name}: {p}" for p in page.evaluate(CHECK_LAYOUT, phone))

    with own_contexts(browser):
        guest = browser.new_page(viewport={"width": width, "height": 740})
        for name, path in (("login", "/login/"), ("signup", "/signup/"), ("password-reset", "/password-reset/"),
                           ("password-reset-sent", "/password-reset/sent/"),
                           ("password-reset-confirm", data["reset_confirm"]), ("guest-catalog", "/")):
            check(guest, name, path)

        page = browser.new_page(viewport={"width": width, "height": 740})
        page.goto(f"{url}/login/")
        page.fill("#id_username", data["user"].username)
        page.fill("#id_password", PASSWORD)
        page.click("main form button[type=submit]")
        page.wait_for_load_state()
        for product, qty in ((keyboard, "1"), (headphones, "2"), (sneaker, "1")):
            page.goto(f"{url}/products/{product.pk}/")
            page.fill("#id_quantity", qty)
            page.click("#add-to-cart")
            page.wait_for_load_state()
        check(page, "catalog", "/")
        assert "$1,658.00" in page.inner_text("main")  # grouped money, in the browser too
        check(page, "product", f"/products/{headphones.pk}/")
        check(page, "product-long-name", f"/products/{sneaker.pk}/")
        check(page, "cart", "/cart/")
        check(page, "checkout", "/checkout/")
        check(page, "order", f"/orders/{data['unpaid'].pk}/")
        assert page.inner_text("#order-total") == "$3,445.00"
        check(page, "order-cancel", f"/orders/{data['unpaid'].pk}/cancel/")
        check(page, "orders", "/orders/")
        check(page, "coupons", "/coupons/")
        check(page, "tokens", "/account/tokens/")
        if phone:  # the header's links, behind its Menu button
            page.click("header details.menu > summary")
            assert page.locator("header .menu-panel a[href='/orders/']").is_visible()
            check(page, "menu-open")
            guest.click("header details.menu > summary")
            assert guest.locator("header .menu-panel a.login").is_visible()
            check(guest, "guest-menu-open")
    assert not problems, "\n".join(problems)
