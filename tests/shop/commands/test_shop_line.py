"""`manage.py shop line`: the drop's line as an operator sees it, and pausing it."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from shop import errors, line
from shop.models import Product
from shop.services import place_order
from tests.helpers import make_users

pytestmark = pytest.mark.django_db(transaction=True)


def _shown(*args: str) -> dict:
    out = StringIO()
    call_command("shop", "line", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_line_shows_the_line_and_pauses_and_resumes_it(settings, make_product):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = make_product(stock=3)
    Product.objects.filter(pk=p.pk).update(opens_at=timezone.now() - timedelta(minutes=1))
    line.forget()
    first, second, third = make_users(3, prefix="cli-line")
    place_order(user=first, lines=[(p.pk, 1)])
    shown = _shown(p.sku, "--pause", "--prequeue", "30", "--order", "fifo")
    assert shown["paused"] is True and (shown["prequeue_seconds"], shown["order"]) == (30, "fifo")
    assert (shown["places"], shown["finished"], shown["window"], shown["opened"]) == (1, 1, 1, True)
    with pytest.raises(errors.InLine):  # paused: nobody new is let through
        place_order(user=second, lines=[(p.pk, 1)])
    with pytest.raises(errors.InLine) as behind:
        place_order(user=third, lines=[(p.pk, 1)])
    assert behind.value.details["place"] == 3
    shown = _shown(str(p.pk))
    assert (shown["places"], shown["waiting"], shown["let_through"]) == (3, 2, 0) and shown["wait_at_back"] > 0
    assert _shown(str(p.pk), "--resume")["paused"] is False
    assert place_order(user=second, lines=[(p.pk, 1)]).order_id  # its turn at once, before the third
    out = StringIO()
    call_command("shop", "line", str(p.pk), stdout=out)
    assert "now serving place 3" in out.getvalue() and "let through 1 of 1" in out.getvalue()


def test_line_of_a_product_without_a_drop_or_with_both_flags_is_refused(make_product):
    p = make_product(stock=3)
    with pytest.raises(CommandError, match="no drop"):
        call_command("shop", "line", str(p.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="not both"):
        call_command("shop", "line", str(p.pk), "--pause", "--resume", stdout=StringIO())
