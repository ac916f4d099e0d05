"""Per-buyer purchase caps (Product.max_per_user), with combining on and off (batch size 1), real MariaDB and Redis."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from shop import errors
from shop.models import Order, Product
from shop.ops.invariants import check_invariants
from shop.services import cancel_order, place_order
from tests.helpers import make_users, order_of, run_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


@pytest.fixture(params=[True, False], ids=["combining", "per-order"])
def combining(request, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": request.param}
    return request.param


def capped(make_product, *, stock: int, cap: int, name: str = "") -> Product:
    p = make_product(stock=stock)
    Product.objects.filter(pk=p.pk).update(max_per_user=cap, **({"name": name} if name else {}))
    return p


def test_a_buyer_cannot_buy_past_the_cap_and_a_cancel_gives_it_back(combining, user, other_user, make_product):
    p = capped(make_product, stock=20, cap=3)
    first = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    with pytest.raises(errors.PurchaseLimitExceeded) as refused:
        place_order(user=user, lines=[(p.pk, 2)])
    assert refused.value.code == "purchase_limit" and refused.value.status == 409
    assert refused.value.details == {"product_id": p.pk, "limit": 3, "bought": 2, "requested": 2}
    assert "1 more" in refused.value.message
    place_order(user=user, lines=[(p.pk, 1)])
    place_order(user=other_user, lines=[(p.pk, 3)])  # every buyer has a cap of their own
    cancel_order(order=Order.objects.get(pk=first.pk), actor=user)  # cancelled units do not count
    place_order(user=user, lines=[(p.pk, 2)])
    p.refresh_from_db()
    assert p.stock == 20 - 1 - 3 - 2


def test_the_refusal_names_the_product_and_what_the_buyer_may_still_buy(combining, user, make_product):
    """The shopper's words, on the web and in the API's message: the product by its name (never
    its database id), the cap, and what is left; the details stay machine-readable."""
    p = capped(make_product, stock=20, cap=2, name="Sneaker X")
    for lines, words in (([(p.pk, 3)], "Sneaker X: Limit 2 per customer; you asked for 3."),
                         ([(p.pk, 1)], None),
                         ([(p.pk, 2)], "Sneaker X: Limit 2 per customer; you already have 1 in your orders, "
                                        "so you can add 1 more."),
                         ([(p.pk, 1)], None),
                         ([(p.pk, 1)], "Sneaker X: Limit 2 per customer; you already have 2 in your orders.")):
        if words is None:
            place_order(user=user, lines=lines)
            continue
        with pytest.raises(errors.PurchaseLimitExceeded) as refused:
            place_order(user=user, lines=lines)
        assert refused.value.message == words and refused.value.details["product_id"] == p.pk


def test_a_refused_multi_line_order_writes_nothing(user, make_product):
    free = make_product(stock=5)
    p = capped(make_product, stock=5, cap=1)
    with pytest.raises(errors.PurchaseLimitExceeded):
        place_order(user=user, lines=[(free.pk, 1), (p.pk, 2)])
    assert not Order.objects.exists()
    assert [x.stock for x in Product.objects.filter(pk__in=[free.pk, p.pk]).order_by("pk")] == [5, 5]


def _hammer(user_id: int, product_id: int, attempts: int) -> dict:
    user = get_user_model().objects.get(pk=user_id)
    told = {"user": user_id, "placed": [], "limit": 0}
    try:
        for _ in range(attempts):
            try:
                told["placed"].append(place_order(user=user, lines=[(product_id, 1)]).order_id)
            except errors.PurchaseLimitExceeded:
                told["limit"] += 1
    finally:
        connections.close_all()
    return told


def test_many_processes_of_one_buyer_never_pass_the_cap(combining, make_product):
    # A bot: 8 processes of one account, 5 attempts each, cap 4; a second account beside it.
    p = capped(make_product, stock=1000, cap=4)
    bot, honest = make_users(2, prefix=f"cap-{combining}")
    results = run_processes(_hammer, [(bot.pk, p.pk, 5)] * 8 + [(honest.pk, p.pk, 2)])
    bots = [r for r in results if r["user"] == bot.pk]  # results come in the order processes finish
    [other] = [r for r in results if r["user"] == honest.pk]
    bot_orders = [oid for r in bots for oid in r["placed"]]
    assert len(bot_orders) == 4 and sum(r["limit"] for r in bots) == 8 * 5 - 4
    assert len(other["placed"]) == 2
    seen = bot_orders + other["placed"]
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 1000}, seen_order_ids=seen) == []
