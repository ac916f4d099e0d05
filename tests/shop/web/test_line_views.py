"""The web buyer's side of a drop's line (shop/web/views.py): the 202 waiting page, its ticket cookie,
the cheap look at the place it polls (/line/<product>/state/) and the page without JavaScript
(/line/<product>/). Real Redis and MariaDB."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from shop import errors, line
from shop.line import tickets
from shop.models import Order, Product
from shop.services import place_order
from shop.web.views import LINE_COOKIE
from tests import helpers

pytestmark = pytest.mark.django_db(transaction=True)




def _in_line(client: Client, user, p: Product):
    """The buyer's checkout of one unit of `p`, answered 202: (its key, the answer)."""
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    response = client.post("/checkout/", {"idempotency_key": key})
    assert response.status_code == 202, response.content.decode()[:2000]
    return key, response


def test_the_202_page_shows_the_place_keeps_the_ticket_and_says_where_to_look(settings, client, user, other_user,
                                                                              drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    helpers.take_turn(p, other_user.pk)
    key, response = _in_line(client, user, p)
    page = response.content.decode()
    assert "You are number 2 in line, with 1 ahead of you" in page
    assert f'data-url="/line/{p.pk}/state/"' in page
    cookie = response.cookies[LINE_COOKIE]
    assert cookie.value.startswith(f"{p.pk}.") and cookie["httponly"] and cookie["samesite"] == "Lax"
    # Without JavaScript: a meta refresh (from the same estimate) to the GET page, with the order's key.
    refresh = re.search(r'<noscript><meta http-equiv="refresh" content="(\d+);url=([^"]+)"', page)
    assert refresh and 1 <= int(refresh[1]) <= 5 and refresh[2].startswith(f"/line/{p.pk}/?key={key}")


def test_the_look_answers_the_place_then_your_turn_then_sold_out(settings, client, user, other_user, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=2)
    held = helpers.take_turn(p, other_user.pk)
    key, _ = _in_line(client, user, p)
    found = client.get(f"/line/{p.pk}/state/")
    assert found.status_code == 200 and found["Cache-Control"] == "no-store"
    body = found.json()
    assert (body["state"], body["place"], body["ahead"]) == ("waiting", 2, 1)
    assert body["estimated_wait"] > 0 and body["poll_in"] == 1 == int(found["Retry-After"])  # near the front
    assert "You are number 2 in line" in body["words"]
    finished_before = line.status(line.config_of(p)).finished

    line.finish([held], outcome=line.DONE, user_id=other_user.pk, lines={p.pk: line.config_of(p)})
    assert client.get(f"/line/{p.pk}/state/").json()["state"] == "your_turn"
    state = line.status(line.config_of(p))
    assert state.in_turn == 1 and state.finished == finished_before + 1  # let through; a look began no turn
    # The page sends the order again (the same key): placed, with the ticket from the cookie.
    placed = client.post("/checkout/", {"idempotency_key": key})
    assert placed.status_code == 302 and Order.objects.filter(user=user).count() == 1

    # The first buyer comes back and buys the last unit: sold out, said on the next look.
    assert place_order(user=other_user, lines=[(p.pk, 1)]).order_id
    late_client = Client()
    late_client.force_login(other_user)
    late_client.cookies[LINE_COOKIE] = client.cookies[LINE_COOKIE].value  # another account's ticket: no place
    assert late_client.get(f"/line/{p.pk}/state/").json()["state"] == "none"
    assert client.get(f"/line/{p.pk}/state/").json()["state"] == "sold_out"


def test_a_look_without_a_ticket_takes_no_place_and_a_guest_gets_json_401(client, user, drop):
    p = drop(stock=5)
    client.force_login(user)
    found = client.get(f"/line/{p.pk}/state/")
    assert found.status_code == 200 and found.json()["state"] == "none"
    client.cookies[LINE_COOKIE] = f"{p.pk}.123.p.456.AAAAAAAAAAAAAAAAAAAAAAAA"  # forged
    assert client.get(f"/line/{p.pk}/state/").json()["state"] == "none"
    assert line.status(line.config_of(p)).places == 0
    guest = Client().get(f"/line/{p.pk}/state/")
    assert guest.status_code == 401 and guest.json()["error"]["code"] == "not_authenticated"


def test_far_back_the_page_looks_less_often(settings, client, user, other_user, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1, "LINE_DEFAULT_RATE": 0.1, "LINE_RETRY_MAX": 30}
    p = drop(stock=5)
    helpers.take_turn(p, other_user.pk)
    _in_line(client, user, p)
    body = client.get(f"/line/{p.pk}/state/").json()
    assert body["estimated_wait"] >= 9 and body["poll_in"] >= 3  # a quarter of the estimate, not every second


def test_the_page_without_javascript_refreshes_and_offers_try_now_with_the_same_key(settings, client, user,
                                                                                    other_user, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=2)
    held = helpers.take_turn(p, other_user.pk)
    key, _ = _in_line(client, user, p)
    response = client.get(f"/line/{p.pk}/?key={key}&coupon=")
    page = response.content.decode()
    assert response.status_code == 200 and "You are number 2 in line" in page
    assert '<meta http-equiv="refresh" content="1">' in page  # near the front: every second
    assert f'name="idempotency_key" value="{key}"' in page and "Try now" in page
    assert re.search(r'<form method="post" action="/checkout/" id="line-try">', page)

    # The buyer before it comes back and buys the last units: the page says sold out, and stops.
    line.finish([held], outcome=line.DONE, user_id=other_user.pk, lines={p.pk: line.config_of(p)})
    assert place_order(user=other_user, lines=[(p.pk, 2)]).order_id
    page = client.get(f"/line/{p.pk}/?key={key}&coupon=").content.decode()
    assert "Sold out" in page and 'http-equiv="refresh"' not in page and "Try now" not in page


def test_the_cookie_takes_the_place_back_after_redis_lost_the_line(settings, client, user, other_user, drop,
                                                                   private_redis):
    """The line's Redis restarts empty: a newcomer arrives first, then the web buyer's page sends
    its order again; the ticket in its cookie gives it back its earlier place, ahead of the
    newcomer (without it, it would come after)."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    helpers.take_turn(p, other_user.pk)
    key, first = _in_line(client, user, p)
    assert "You are number 2 in line" in first.content.decode()
    private_redis.stop()
    private_redis.start()
    newcomer = get_user_model().objects.create_user("newcomer", password="pw")
    with pytest.raises(errors.InLine) as late:
        place_order(user=newcomer, lines=[(p.pk, 1)])  # the line is held while places come back
    again = client.post("/checkout/", {"idempotency_key": key})
    assert again.status_code == 202, again.content.decode()[:2000]
    place = int(re.search(r"You are number (\d+) in line", again.content.decode())[1])
    newcomer_after = tickets.read(late.value.details["ticket"], user_id=newcomer.pk)
    mine = tickets.read(again.cookies[LINE_COOKIE].value, user_id=user.pk)
    assert mine.score < newcomer_after.score  # the old place, before the newcomer's
    assert place == 1  # nobody else came back: first in the line rebuilt
