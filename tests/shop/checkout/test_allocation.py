"""Allocation (shop/checkout/allocation.py) without a database: plain rows and requests in, the
placed requests and the refusals out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from shop import errors
from shop.checkout import allocation
from shop.checkout.protocol import Refused, Request
from shop.plumbing import clock

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    """NotOpenYet's Retry-After reads the shop's clock (the database's): here, NOW."""
    monkeypatch.setattr(clock, "now", lambda: NOW)


def row(pid: int, *, stock: int = 10, cap: int | None = None, active: bool = True, opens_at: datetime | None = None,
        closes_at: datetime | None = None, price: str = "10.00") -> dict:
    return {"id": pid, "price": Decimal(price), "active": active, "opens_at": opens_at, "closes_at": closes_at,
            "stock": stock, "fence": 0, "sku": f"SKU-{pid}", "name": f"Product {pid}", "max_per_user": cap}


def request(n: int, user_id: int, *lines: tuple[int, int]) -> Request:
    return Request(id=f"r{n}", user_id=user_id, lines=tuple(lines), code=None, key=None, digest="d",
                   deadline=float("inf"))


def refusal(refused: dict[str, Refused], request_id: str) -> errors.ShopError:
    return refused[request_id].error()


def allocate(live: list[Request], rows: dict[int, dict], *, have=None, unpaid=None, max_unpaid=None):
    left = {pid: r["stock"] for pid, r in rows.items()}
    return allocation.allocate(live, rows, left, have=have or {}, unpaid=unpaid or {}, max_unpaid=max_unpaid)


def test_first_in_first_served_and_a_later_smaller_request_still_fits():
    rows = {1: row(1, stock=3)}
    live = [request(1, 11, (1, 2)), request(2, 12, (1, 2)), request(3, 13, (1, 1))]
    placed, refused = allocate(live, rows)
    assert [r.id for r in placed] == ["r1", "r3"]
    error = refusal(refused, "r2")
    assert isinstance(error, errors.OutOfStock)
    assert error.message == "Product 1: only 1 left."
    assert error.details == {"lines": [{"product_id": 1, "requested": 2, "available": 1}]}


def test_a_cart_is_placed_only_if_every_line_fits_and_every_short_line_is_named():
    rows = {1: row(1, stock=1), 2: row(2, stock=0), 3: row(3, stock=5)}
    placed, refused = allocate([request(1, 11, (1, 2), (2, 1), (3, 1))], rows)
    assert placed == []
    assert refusal(refused, "r1").message == "Product 1: only 1 left; Product 2: sold out."


def test_the_cap_counts_what_the_buyer_holds_and_what_the_batch_gave_it():
    rows = {1: row(1, stock=10, cap=2)}
    live = [request(1, 11, (1, 1)), request(2, 11, (1, 1)), request(3, 11, (1, 1)), request(4, 12, (1, 2))]
    placed, refused = allocate(live, rows, have={1: {12: 1}})
    assert [r.id for r in placed] == ["r1", "r2"]
    third, other = refusal(refused, "r3"), refusal(refused, "r4")
    assert isinstance(third, errors.PurchaseLimitExceeded)
    assert third.details == {"product_id": 1, "limit": 2, "bought": 2, "requested": 1}
    assert third.message == "Product 1: Limit 2 per customer; you already have 2 in your orders."
    assert other.details["bought"] == 1
    assert other.message == ("Product 1: Limit 2 per customer; you already have 1 in your orders, "
                             "so you can add 1 more.")


def test_the_unpaid_limit_counts_the_orders_placed_in_the_batch():
    rows = {1: row(1)}
    live = [request(1, 11, (1, 1)), request(2, 11, (1, 1)), request(3, 12, (1, 1))]
    placed, refused = allocate(live, rows, unpaid={11: 1, 12: 2}, max_unpaid=2)
    assert [r.id for r in placed] == ["r1"]
    assert {rid: refusal(refused, rid).details for rid in refused} == {
        "r2": {"limit": 2, "unpaid": 2}, "r3": {"limit": 2, "unpaid": 2}}


def test_a_refused_request_takes_nothing_and_the_inputs_are_not_changed():
    rows = {1: row(1, stock=2, cap=1)}
    left, have, unpaid = {1: 2}, {1: {11: 0}}, {11: 0}
    placed, refused = allocation.allocate([request(1, 11, (1, 2)), request(2, 12, (1, 1))], rows, left,
                                          have=have, unpaid=unpaid, max_unpaid=None)
    assert [r.id for r in placed] == ["r2"] and set(refused) == {"r1"}
    assert (left, have, unpaid) == ({1: 2}, {1: {11: 0}}, {11: 0})


def test_capped_and_taken():
    rows = {1: row(1, cap=3), 2: row(2)}
    live = [request(1, 11, (1, 1), (2, 2)), request(2, 12, (2, 3))]
    assert allocation.capped(live, rows) == {1}
    assert allocation.taken(live) == {1: 1, 2: 5}
    assert allocation.subtotal(live[0], rows) == Decimal("30.00")


@pytest.mark.parametrize("rows,expected", [
    ({}, errors.UnknownProduct),
    ({1: row(1, active=False)}, errors.InactiveProduct),
    ({1: row(1, opens_at=NOW + timedelta(hours=1))}, errors.NotOpenYet),
    ({1: row(1, opens_at=NOW - timedelta(hours=2), closes_at=NOW - timedelta(hours=1))}, errors.SaleEnded),
])
def test_why_a_line_is_not_on_sale(rows, expected):
    kept, refused = allocation.refuse_unsold([request(1, 11, (1, 1))], rows, NOW)
    assert kept == [] and type(refusal(refused, "r1")) is expected


def test_the_reasons_come_in_order_and_say_when():
    later, soon = NOW + timedelta(hours=2), NOW + timedelta(hours=1)
    rows = {1: row(1, opens_at=soon), 2: row(2, opens_at=later), 3: row(3, active=False)}
    assert isinstance(allocation.not_on_sale([1, 2, 3], rows, NOW), errors.InactiveProduct)
    upcoming = allocation.not_on_sale([1, 2], rows, NOW)
    assert upcoming.details == {"product_ids": [1, 2], "opens_at": later.isoformat()}
    assert upcoming.message.startswith("Not on sale yet: opens ")


def test_a_drop_called_off_before_it_opened_says_so():
    rows = {1: row(1, opens_at=NOW - timedelta(hours=1), closes_at=NOW - timedelta(hours=1))}
    ended = allocation.not_on_sale([1], rows, NOW)
    assert isinstance(ended, errors.SaleEnded) and ended.message == errors.SaleEnded.CALLED_OFF


def test_a_request_on_sale_is_kept():
    rows = {1: row(1, opens_at=NOW, closes_at=NOW + timedelta(hours=1))}
    live = [request(1, 11, (1, 1))]
    assert allocation.refuse_unsold(live, rows, NOW) == (live, {})
