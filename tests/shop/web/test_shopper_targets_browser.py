"""In a real browser at 320, 375 and 1280 px: the header's Cart link (and the phone's Menu
button) and every card of the orders list are tap targets of 44x44 px at least, the whole card
opening its order while its own buttons stay theirs; buttons use the page's font; and "Awaiting
payment" has its own colour, not the green of "Paid", every status badge readable (4.5:1)."""

from __future__ import annotations

import os

import pytest

from shop.models import Order
from shop.services import cancel_order, pay_order, place_order
from tests.browser import ARTIFACTS, logged_in_page
from tests.helpers import order_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WIDTHS = pytest.mark.parametrize("width", [320, 375, 1280])
TARGET = 44  # px: a finger's tap target (WCAG 2.5.5; Apple's and Google's guidelines)

# Run in the page: for each order card, the points of a grid over it that a tap would not bring
# to the order (neither the card's link nor one of its own buttons), and whether any point did.
CARD_POINTS = r"""() => [...document.querySelectorAll('tr.order-row')].map((row) => {
  row.scrollIntoView({block: 'center'});
  const r = row.getBoundingClientRect(), missed = [];
  let opens = 0;
  for (let i = 1; i < 8; i++) for (let j = 1; j < 4; j++) {
    const x = r.left + r.width * i / 8, y = r.top + r.height * j / 4;
    const hit = document.elementFromPoint(x, y);
    if (hit && hit.closest('a.order-link')) opens++;
    else if (!(hit && hit.closest('.order-actions a, .order-actions button'))) missed.push(
        `${Math.round(x)},${Math.round(y)}: ${hit && hit.tagName}`);
  }
  return {href: row.querySelector('a.order-link').getAttribute('href'), width: r.width, height: r.height,
          opens, missed};
})"""

# Run in the page: each status badge's colours and the contrast of its text.
BADGES = r"""() => {
  const rgb = (c) => c.match(/[\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => { const [r, g, b] = rgb(c).map((v) => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  return [...document.querySelectorAll('main .badge')].map((b) => {
    const s = getComputedStyle(b), [hi, lo] = [lum(s.color), lum(s.backgroundColor)].sort((x, y) => y - x);
    return {text: b.textContent.trim(), color: s.color, background: s.backgroundColor,
            contrast: (hi + 0.05) / (lo + 0.05)};
  });
}"""


def _orders(user, make_product) -> dict[str, Order]:
    p = make_product(stock=20, price="1658.00")
    paid, unpaid, cancelled = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(3))
    pay_order(order=paid, actor="test")
    cancel_order(order=cancelled, actor="test", unpaid_only=True)
    return {"paid": paid, "unpaid": unpaid, "cancelled": cancelled}


@WIDTHS
def test_the_cart_link_and_each_order_card_are_tap_targets_of_44_px(browser, live_server, user, make_product, width):
    orders = _orders(user, make_product)
    with logged_in_page(browser, live_server.url, user, width=width) as page:
        page.goto(f"{live_server.url}/orders/")
        page.screenshot(path=str(ARTIFACTS / f"orders-targets-{width}.png"), full_page=True)

        cart = page.locator("#cart-link").bounding_box()
        assert cart["width"] >= TARGET and cart["height"] >= TARGET, f"the Cart link is {cart}"
        menu = page.locator("header details.menu > summary")
        if width < 600:
            box = menu.bounding_box()
            assert box["width"] >= TARGET and box["height"] >= TARGET, f"the Menu button is {box}"

        cards = page.evaluate(CARD_POINTS)
        assert len(cards) == 3
        for card in cards:
            assert card["width"] >= TARGET and card["height"] >= TARGET, card
            assert card["opens"] and not card["missed"], f"{card['href']}: taps that open nothing: {card['missed']}"

        # A tap on the card away from its "#n" link opens the order; its own buttons stay theirs.
        unpaid = orders["unpaid"]
        row = page.locator("tr.order-row", has=page.locator(f"a[href='/orders/{unpaid.pk}/']"))
        total = row.locator("td.num").bounding_box()  # a tap there, whatever element takes it
        page.mouse.click(total["x"] + total["width"] / 2, total["y"] + total["height"] / 2)
        page.wait_for_url(f"**/orders/{unpaid.pk}/")
        page.go_back()
        row.locator("a.cancel").click(timeout=5000)  # not under the card's link
        page.wait_for_url(f"**/orders/{unpaid.pk}/cancel/")
        page.go_back()
        row.locator("button.pay").click(timeout=5000)
        page.wait_for_url(f"**/orders/{unpaid.pk}/")
        assert Order.objects.get(pk=unpaid.pk).status == Order.Status.PAID  # the Pay button paid, not just opened


@WIDTHS
def test_buttons_use_the_page_font_and_awaiting_payment_is_not_green_like_paid(browser, live_server, user, make_product,
                                                                               width):
    orders = _orders(user, make_product)
    with logged_in_page(browser, live_server.url, user, width=width) as page:
        page.goto(f"{live_server.url}/orders/{orders['unpaid'].pk}/")
        fonts = page.evaluate("""() => ({page: getComputedStyle(document.body).fontFamily,
            buttons: [...document.querySelectorAll('button')].map((b) => [b.textContent.trim(),
                                                                          getComputedStyle(b).fontFamily])})""")
        assert {label for label, _ in fonts["buttons"]} >= {"Log out"} and len(fonts["buttons"]) >= 3, fonts
        for label, family in fonts["buttons"]:
            assert family == fonts["page"], f"the {label!r} button is set in {family}, the page in {fonts['page']}"

        badges = {}
        for name in ("unpaid", "paid", "cancelled"):
            page.goto(f"{live_server.url}/orders/{orders[name].pk}/")
            [badges[name]] = page.evaluate(BADGES)
        page.goto(f"{live_server.url}/orders/")
        page.screenshot(path=str(ARTIFACTS / f"orders-badges-{width}.png"), full_page=True)
        listed = page.evaluate(BADGES)
        assert sorted(b["text"] for b in listed) == ["Awaiting payment", "Cancelled", "Paid"], listed

        awaiting, paid = badges["unpaid"], badges["paid"]
        assert awaiting["text"] == "Awaiting payment" and paid["text"] == "Paid"
        assert (awaiting["color"], awaiting["background"]) != (paid["color"], paid["background"]), badges
        for badge in [*badges.values(), *listed]:
            assert badge["contrast"] >= 4.5, f"{badge['text']}: {badge['color']} on {badge['background']}"
        for badge in listed:  # the list shows each status as its page does
            [same] = [b for b in badges.values() if b["text"] == badge["text"]]
            assert (badge["color"], badge["background"]) == (same["color"], same["background"])


def test_every_stock_and_drop_badge_of_the_catalog_is_readable(browser, live_server, user, make_product):
    """"Only 3 left", "Sold out", "N in stock", "Coming soon", "Sale ended": 4.5:1 at least (WCAG AA)."""
    from datetime import timedelta

    from django.utils import timezone

    from shop.models import Product

    now = timezone.now()
    make_product(stock=3), make_product(stock=0), make_product(stock=50)
    Product.objects.filter(pk=make_product(stock=5).pk).update(opens_at=now + timedelta(hours=2))
    Product.objects.filter(pk=make_product(stock=5).pk).update(opens_at=now - timedelta(hours=2),
                                                               closes_at=now - timedelta(minutes=1))
    with logged_in_page(browser, live_server.url, user, width=1280) as page:
        page.goto(f"{live_server.url}/")
        badges = page.evaluate(BADGES)
    texts = " | ".join(b["text"] for b in badges)
    for shown in ("Only 3 left", "Sold out", "50 in stock", "Sale ended"):
        assert shown in texts, texts
    for badge in badges:
        assert badge["contrast"] >= 4.5, f"{badge['text']}: {badge['color']} on {badge['background']}"
