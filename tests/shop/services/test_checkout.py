"""place_order, claim_coupon, cancel_order and restock, one caller at a time.

Every test runs with combining on (a single-product order queues on its lock and is written in
a batch by its holder) and off (batch size 1: every order a batch of one under its own hold):
one writer either way, the same answers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import transaction

from locks import inspect, stats
from shop import errors
from shop.api.views import order_json, receipt_json
from shop.checkout import writer
from shop.models import CouponClaim, Order, OrderLine, StockLedger
from shop.plumbing import hooks, redis_keys, soldout
from shop.plumbing.lock_names import product_lock
from shop.services import cancel_order, claim_coupon, place_order, restock
from tests.helpers import order_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


@pytest.fixture(autouse=True, params=[True, False], ids=["combining", "batch-of-1"])
def combining(request, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": request.param}
    return request.param


def counts():
    return Order.objects.count(), OrderLine.objects.count(), StockLedger.objects.count(), CouponClaim.objects.count()


def test_an_order_decrements_stock_and_writes_order_lines_and_ledger(user, make_product):
    a, b = make_product(stock=5, price="10.00"), make_product(stock=3, price="2.50")
    placed = place_order(user=user, lines=[(b.pk, 2), (a.pk, 1)])
    order = order_of(placed)
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.stock, b.stock) == (4, 1)
    assert order.total == Decimal("15.00") and order.status == Order.Status.PENDING_PAYMENT
    assert order.pay_by > order.created_at
    assert sorted(order.lines.values_list("product_id", "quantity")) == [(a.pk, 1), (b.pk, 2)]
    ledger = StockLedger.objects.filter(order=order)
    assert sorted(ledger.values_list("product_id", "quantity")) == [(a.pk, -1), (b.pk, -2)]
    # The row carries the fence of the lock that wrote it.
    assert a.fence == ledger.get(product=a).fence > 0
    assert not placed.replayed


def test_out_of_stock_names_every_short_line_and_writes_nothing(user, make_product):
    a, b, c = make_product(stock=1), make_product(stock=0), make_product(stock=10)
    before = counts()
    with pytest.raises(errors.OutOfStock) as err:
        place_order(user=user, lines=[(a.pk, 3), (b.pk, 1), (c.pk, 1)])
    assert err.value.details["lines"] == [
        {"product_id": a.pk, "requested": 3, "available": 1},
        {"product_id": b.pk, "requested": 1, "available": 0},
    ]
    # Named as the cap's refusal names them, never "product 7".
    assert err.value.message == f"{a.name}: only 1 left; {b.name}: sold out."
    assert counts() == before
    c.refresh_from_db()
    assert c.stock == 10  # the line that fit was rolled back with the rest


@pytest.mark.parametrize(("lines", "error"), [
    ([], errors.InvalidInput),
    ([(1, 0)], errors.InvalidQuantity),
    ([(1, -2)], errors.InvalidQuantity),
    ([(1, 1.5)], errors.InvalidQuantity),
    ([(1, True)], errors.InvalidQuantity),
    ([(1, 10_000)], errors.InvalidQuantity),
    ([(0, 1)], errors.InvalidInput),
    ([("1", 1)], errors.InvalidInput),
    ([(2**63, 1)], errors.InvalidInput),  # no product has that id (a BIGINT): the API's own check
    ([(1, 1), (1, 2)], errors.InvalidInput),
    ([(i, 1) for i in range(1, 30)], errors.InvalidInput),
    ("not lines", errors.InvalidInput),
])
def test_invalid_lines_are_refused_before_anything(user, lines, error):
    before = counts()
    with pytest.raises(error) as err:
        place_order(user=user, lines=lines)
    assert err.value.code in {"invalid_input", "invalid_quantity"}
    assert counts() == before


def test_unknown_and_inactive_products(user, make_product):
    gone = make_product(stock=5, active=False)
    with pytest.raises(errors.UnknownProduct) as err:
        place_order(user=user, lines=[(999_999_999, 1)])
    assert err.value.code == "unknown_product"
    with pytest.raises(errors.InactiveProduct):
        place_order(user=user, lines=[(gone.pk, 1)])


def test_idempotency_key_replays_the_first_order_and_refuses_a_different_body(user, make_product):
    p = make_product(stock=5)
    first = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key="checkout-1"))
    before = counts()
    again = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="checkout-1")
    assert again.order_id == first.pk and again.replayed
    assert counts() == before
    with pytest.raises(errors.IdempotencyConflict) as err:
        place_order(user=user, lines=[(p.pk, 2)], idempotency_key="checkout-1")
    assert err.value.code == "idempotency_conflict" and err.value.status == 422
    p.refresh_from_db()
    assert p.stock == 4


def test_the_same_key_from_another_user_is_another_order(user, other_user, make_product):
    p = make_product(stock=5)
    a = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key="k"))
    b = order_of(place_order(user=other_user, lines=[(p.pk, 1)], idempotency_key="k"))
    assert a.pk != b.pk


def test_place_order_inside_an_atomic_block_raises(user, make_product):
    p = make_product(stock=5)
    with pytest.raises(RuntimeError, match="atomic"), transaction.atomic():
        place_order(user=user, lines=[(p.pk, 1)])
    p.refresh_from_db()
    assert p.stock == 5


def test_coupon_must_be_claimed_then_applies_once(user, make_product, make_coupon):
    p = make_product(stock=5, price="20.00")
    coupon = make_coupon(total=3, discount="5.00")
    with pytest.raises(errors.CouponNotClaimed):
        place_order(user=user, lines=[(p.pk, 1)], coupon_code=coupon.code)
    claim = claim_coupon(user=user, code=coupon.code)
    coupon.refresh_from_db()
    assert coupon.remaining == 2
    order = order_of(place_order(user=user, lines=[(p.pk, 1)], coupon_code=coupon.code))
    assert (order.discount, order.total) == (Decimal("5.00"), Decimal("15.00"))
    claim.refresh_from_db()
    assert claim.order_id == order.pk and claim.used_at is not None
    with pytest.raises(errors.CouponNotClaimed):  # used up
        place_order(user=user, lines=[(p.pk, 1)], coupon_code=coupon.code)


def test_coupon_errors(user, other_user, make_coupon):
    from datetime import timedelta

    from django.utils import timezone

    with pytest.raises(errors.CouponUnknown):
        claim_coupon(user=user, code="NOPE")
    expired = make_coupon(valid_until=timezone.now() - timedelta(seconds=1))
    with pytest.raises(errors.CouponExpired):
        claim_coupon(user=user, code=expired.code)
    one = make_coupon(total=1)
    claim_coupon(user=user, code=one.code)
    with pytest.raises(errors.CouponAlreadyClaimed):
        claim_coupon(user=user, code=one.code)
    with pytest.raises(errors.CouponSoldOut):
        claim_coupon(user=other_user, code=one.code)
    with pytest.raises(errors.InvalidInput):
        claim_coupon(user=user, code=" \x00bad")


def test_cancel_returns_stock_and_coupon_exactly_once(user, make_product, make_coupon):
    p = make_product(stock=5)
    coupon = make_coupon(total=5)
    claim_coupon(user=user, code=coupon.code)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)], coupon_code=coupon.code))
    cancelled = cancel_order(order=order, actor="test")
    assert cancelled.status == Order.Status.CANCELLED and cancelled.cancelled_at
    p.refresh_from_db()
    assert p.stock == 5
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None
    with pytest.raises(errors.OrderNotCancellable):
        cancel_order(order=order, actor="test")
    p.refresh_from_db()
    assert p.stock == 5
    assert sorted(StockLedger.objects.filter(order=order).values_list("quantity", "reason")) == [
        (-2, "order"), (2, "cancel")]


def test_restock(user, make_product):
    p = make_product(stock=0)
    assert restock(product=p, quantity=7, actor="ops").stock == 7
    assert StockLedger.objects.filter(product=p, reason="restock").get().quantity == 7
    for bad in (0, -1, 1.5, "3", 10**9):
        with pytest.raises(errors.InvalidQuantity):
            restock(product=p, quantity=bad, actor="ops")


def test_sold_out_fast_path_skips_the_lock_and_mysql(user, make_product, django_assert_num_queries, settings):
    # Every name counted: the session's other tests fill the family's busiest-names list, which
    # keeps only the top LOCKS["STATS_TOP_N"] (a name with 1 acquisition may be trimmed from it).
    settings.LOCKS = {**settings.LOCKS, "STATS_TOP_N": 1_000_000}
    p = make_product(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])  # its write (a batch of one, too) left 0: marked
    with pytest.raises(errors.OutOfStock):  # refused from Redis: no lock
        place_order(user=user, lines=[(p.pk, 1)])
    name = f"product:{p.pk}"
    stats.flush()
    acquired = inspect.acquisitions([name])[name]
    assert acquired == 1
    with django_assert_num_queries(0), pytest.raises(errors.OutOfStock) as err:
        place_order(user=user, lines=[(p.pk, 1)])
    assert err.value.details["lines"] == [{"product_id": p.pk, "requested": 1, "available": 0}]
    stats.flush()
    assert inspect.acquisitions([name])[name] == acquired
    # A refill clears the marker before it commits: the next order goes through at once.
    restock(product=p, quantity=2, actor="ops")
    assert place_order(user=user, lines=[(p.pk, 1)]).order_id


def test_cancel_clears_the_sold_out_marker(user, other_user, make_product):
    p = make_product(stock=1)
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    with pytest.raises(errors.OutOfStock):
        place_order(user=other_user, lines=[(p.pk, 1)])
    cancel_order(order=order, actor="test")
    assert place_order(user=other_user, lines=[(p.pk, 1)]).order_id


def test_losing_the_marker_only_loses_the_speed_up(user, make_product, redis_client):
    from django_redis import get_redis_connection

    p = make_product(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(p.pk, 1)])
    get_redis_connection("default").delete(redis_keys.sold_out_marker(p.pk))  # as if Redis lost its data
    with pytest.raises(errors.OutOfStock):  # the locked path still refuses
        place_order(user=user, lines=[(p.pk, 1)])


# --- one writer: single-product orders and carts alike -------------------------------------------
def test_a_cart_and_a_single_product_order_go_through_the_same_writer(user, make_product, monkeypatch):
    """The writer's hook sees both, with the holds of every product of the order."""
    a, b = make_product(stock=5), make_product(stock=5)
    writes: list[tuple[list, list[str]]] = []
    real_write = writer.write

    def spy(requests, *, holds):
        writes.append(([r.lines for r in requests], sorted(holds)))
        return real_write(requests, holds=holds)

    stages: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(writer, "write", spy)
    monkeypatch.setattr(hooks, "checkout_hook", lambda stage, holds: stages.append((stage, sorted(holds))))
    place_order(user=user, lines=[(b.pk, 1), (a.pk, 2)])
    place_order(user=user, lines=[(a.pk, 1)])
    assert writes == [([((a.pk, 2), (b.pk, 1))], [a.pk, b.pk]), ([((a.pk, 1),)], [a.pk])]
    both = sorted([product_lock(a.pk), product_lock(b.pk)])
    stages = [s for s in stages if s[0] != "before_take"]  # the combiner's stage (combining on), not the writer's
    assert stages == [("before_update", both), ("before_commit", both), ("at_commit", both), ("after_commit", both),
                      ("before_update", [product_lock(a.pk)]), ("before_commit", [product_lock(a.pk)]),
                      ("at_commit", [product_lock(a.pk)]), ("after_commit", [product_lock(a.pk)])]


def test_a_cart_gets_the_same_refusals_and_ledger_shape_as_one_product(user, make_product):
    a, b = make_product(stock=2, price="3.00"), make_product(stock=1, price="4.00")
    cart = order_of(place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)]))
    one = order_of(place_order(user=user, lines=[(a.pk, 1)]))
    for order in (cart, one):
        ledger = set(StockLedger.objects.filter(order=order).values_list("reason", "actor"))
        assert ledger == {(StockLedger.Reason.ORDER, f"user:{user.pk}")}
    with pytest.raises(errors.OutOfStock) as in_cart:
        place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)])
    with pytest.raises(errors.OutOfStock) as alone:
        place_order(user=user, lines=[(b.pk, 1)])
    assert in_cart.value.details["lines"] == [{"product_id": a.pk, "requested": 1, "available": 0},
                                              {"product_id": b.pk, "requested": 1, "available": 0}]
    assert alone.value.details["lines"] == [{"product_id": b.pk, "requested": 1, "available": 0}]


def test_a_product_is_marked_sold_out_only_when_a_write_leaves_it_at_0(user, make_product):
    a, b = make_product(stock=2), make_product(stock=3)
    place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)])
    assert soldout.sold_out([a.pk, b.pk]) == set()  # 1 and 2 left
    place_order(user=user, lines=[(a.pk, 1)])
    assert soldout.sold_out([a.pk, b.pk]) == {a.pk}
    place_order(user=user, lines=[(b.pk, 2)])
    assert soldout.sold_out([a.pk, b.pk]) == {a.pk, b.pk}


def test_the_placement_is_complete_and_renders_without_a_query(user, make_product, make_coupon,
                                                               django_assert_num_queries):
    a, b = make_product(stock=5, price="10.00"), make_product(stock=5, price="2.50")
    coupon = make_coupon(total=5, discount="1.00")
    claim_coupon(user=user, code=coupon.code)
    placed = place_order(user=user, lines=[(b.pk, 2), (a.pk, 1)], coupon_code=coupon.code, idempotency_key="pc-1")
    assert not placed.replayed
    with django_assert_num_queries(0):
        shown = receipt_json(placed)
    fresh = Order.objects.get(pk=placed.order_id)
    assert shown == order_json(fresh)
    assert shown["total"] == "14.00" and shown["coupon_code"] == coupon.code and len(shown["lines"]) == 2
    again = place_order(user=user, lines=[(b.pk, 2), (a.pk, 1)], coupon_code=coupon.code, idempotency_key="pc-1")
    assert again.replayed and receipt_json(again) == shown


# --- the sold-out check in the queueing script (guards) ------------------------------------------
@pytest.fixture
def mget_calls(monkeypatch) -> list[list[int]]:
    """The product ids of every separate sold-out MGET (`markers_and_record`)."""
    calls, real = [], soldout.markers_and_record

    def counted(product_ids, **kwargs):
        ids = list(product_ids)
        calls.append(ids)
        return real(ids, **kwargs)

    monkeypatch.setattr(soldout, "markers_and_record", counted)
    return calls


def test_a_queued_order_reads_the_markers_and_its_record_in_the_queueing_script(user, make_product, combining,
                                                                                mget_calls):
    p = make_product(stock=1)
    last = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="gk-1")  # leaves 0: marked
    name = product_lock(p.pk)
    stats.flush()
    acquired = inspect.acquisitions([name])[name]
    with pytest.raises(errors.OutOfStock) as err:
        place_order(user=user, lines=[(p.pk, 1)], idempotency_key="gk-2")
    assert err.value.details["lines"] == [{"product_id": p.pk, "requested": 1, "available": 0}]
    # The retry of the key that bought the last unit gets its order, though the product is marked.
    again = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="gk-1")
    assert again.replayed and again.order_id == last.order_id
    assert mget_calls == ([] if combining else [[p.pk]] * 3)  # combining: no round trip of its own
    stats.flush()
    assert inspect.acquisitions([name])[name] == acquired  # neither took the lock
    assert Order.objects.filter(user=user).count() == 1


def test_a_record_whose_order_is_gone_queues_after_all(user, make_product, mget_calls):
    from django_redis import get_redis_connection


    p = make_product(stock=3)
    get_redis_connection("default").set(redis_keys.idempotency_record(user.pk, "gk-gone"), 999999, ex=60)
    placed = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="gk-gone")
    assert not placed.replayed and placed.idempotency_key == "gk-gone"
    assert Order.objects.get(pk=placed.order_id).idempotency_key == "gk-gone"


def test_markers_in_another_redis_are_read_by_one_mget_first(user, make_product, combining, mget_calls,
                                                            redis_server, settings):
    from config.settings import redis_cache

    settings.CACHES = {**settings.CACHES, "default": redis_cache(redis_server.url)}  # markers elsewhere
    assert not soldout.shares_lock_redis()
    p = make_product(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(p.pk, 1)])
    assert mget_calls == [[p.pk], [p.pk]]


def test_a_batch_whose_every_request_cannot_be_written_is_refused_not_a_500(make_product):
    """The buyer's account was deleted while a cached token still named it: its rows fail on
    the foreign key, so the request is refused alone, and no empty stock write follows."""
    from django.contrib.auth import get_user_model

    p = make_product(stock=5)
    gone = get_user_model().objects.create_user("deleted-meanwhile", password="pw-not-used")
    get_user_model().objects.filter(pk=gone.pk).delete()
    before = counts()
    with pytest.raises(errors.OrderNotWritable):
        place_order(user=gone, lines=[(p.pk, 1)])
    p.refresh_from_db()
    assert p.stock == 5 and counts() == before


