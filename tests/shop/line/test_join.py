"""The line of a drop, one process at a time: places, turns, the cut, the pre-queue, tickets,
against the real Redis and MariaDB (the multi-process tests are in test_line_processes.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from shop import errors, line
from shop.line import tickets
from shop.models import Product
from shop.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def drop(make_product):
    """A product whose drop opened a minute ago (a line), with `stock` units."""

    def make(stock: int = 10, **fields) -> Product:
        p = make_product(stock=stock)
        fields.setdefault("opens_at", timezone.now() - timedelta(minutes=1))
        Product.objects.filter(pk=p.pk).update(**fields)
        line.forget()
        p.refresh_from_db()
        return p

    return make


def _take_turn(product: Product, user_id: int) -> line.Position:
    """A buyer in the checkout (its turn begun, not finished): what a slow request looks like."""
    return line.join(config=line.config_of(product), user_id=user_id, start=True, until=time.monotonic() + 60)


def test_a_short_line_lets_a_buyer_through_at_once(user, drop):
    p = drop(stock=3)
    receipt = place_order(user=user, lines=[(p.pk, 1)])
    assert receipt.order_id
    state = line.status(line.config_of(p))
    assert (state.places, state.waiting, state.in_turn, state.finished) == (1, 0, 0, 1)


def test_a_full_window_answers_in_line_with_place_ahead_estimate_and_ticket(settings, user, other_user, drop,
                                                                              django_user_model):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    first = _take_turn(p, user.pk)
    assert first.state == line.STARTED and first.place == 1
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=other_user, lines=[(p.pk, 1)])
    details = waiting.value.details
    assert details["state"] == "waiting" and details["place"] == 2 and details["ahead"] == 1
    assert details["now_serving"] == 1 and details["product_id"] == p.pk
    assert details["estimated_wait"] > 0 and waiting.value.retry_after == details["retry_after"] >= 1
    ticket = tickets.read(details["ticket"], user_id=other_user.pk)
    assert ticket is not None and ticket.product_id == p.pk and ticket.kind == tickets.PLACE
    assert tickets.read(details["ticket"], user_id=user.pk) is None  # another account's: refused
    assert tickets.not_yet(ticket, first.serving)
    # The first buyer is answered: the second one's turn has come.
    line.finish([first], outcome=line.DONE, user_id=user.pk, lines={p.pk: line.config_of(p)})
    assert place_order(user=other_user, lines=[(p.pk, 1)]).order_id
