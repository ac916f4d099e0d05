"""Refunds (issue 23 item 10): a paid order is refunded, never cancelled. The simulated provider
refunds, the stock comes back under the product locks with ledger reason `refund`, the coupon
goes back to its owner, exactly once. Real MariaDB and Redis; processes for the race."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from shop import errors
from shop.invariants import check_invariants, release_violations
from shop.models import CouponClaim, Order, Product, StockLedger
from shop.services import cancel_order, claim_coupon, pay_order, place_order, refund_order
from tests.helpers import run_processes

pytestmark = pytest.mark.django_db(transaction=True)


def paid_order(user, lines, **kwargs) -> Order:
    return pay_order(order=place_order(user=user, lines=lines, **kwargs).order, actor="test")


def test_a_refund_returns_the_stock_and_the_coupon_once(user, make_product, make_coupon):
    p, q = make_product(stock=10), make_product(stock=5)
    coupon = make_coupon(total=3)
    claim_coupon(user=user, code=coupon.code)
    order = paid_order(user, [(p.pk, 3), (q.pk, 1)], coupon_code=coupon.code)
    paid_at = order.paid_at

    refunded = refund_order(order=order, actor="admin:ops")
    assert refunded.status == Order.Status.REFUNDED
    assert refunded.refunded_at is not None and refunded.paid_at == paid_at  # the payment stays on record
    assert (Product.objects.get(pk=p.pk).stock, Product.objects.get(pk=q.pk).stock) == (10, 5)
    rows = StockLedger.objects.filter(order=order, reason=StockLedger.Reason.REFUND)
    assert sorted(rows.values_list("product_id", "quantity", "actor")) == [(p.pk, 3, "admin:ops"),
                                                                           (q.pk, 1, "admin:ops")]
    assert all(row.fence for row in rows)  # written under the product locks, fenced
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None  # as a cancellation gives it back

    with pytest.raises(errors.OrderNotRefundable) as twice:
        refund_order(order=order, actor="admin:ops")
    assert (twice.value.code, twice.value.status) == ("order_not_refundable", 409)
    assert twice.value.details == {"order_id": order.pk, "status": "refunded"}
    assert StockLedger.objects.filter(order=order, reason=StockLedger.Reason.REFUND).count() == 2
    assert check_invariants(product_ids=[p.pk, q.pk], initial_stock={p.pk: 10, q.pk: 5}, coupon_ids=[coupon.pk],
                            seen_order_ids=[order.pk]) == []


def test_only_a_paid_order_is_refunded(user, make_product):
    p = make_product(stock=10)
    pending = place_order(user=user, lines=[(p.pk, 2)]).order
    cancelled = place_order(user=user, lines=[(p.pk, 1)]).order
    cancel_order(order=cancelled, actor="buyer", unpaid_only=True)
    for order in (pending, cancelled):
        with pytest.raises(errors.OrderNotRefundable):
            refund_order(order=order, actor="admin:ops")
    assert Order.objects.get(pk=pending.pk).status == Order.Status.PENDING_PAYMENT
    assert Product.objects.get(pk=p.pk).stock == 8
    assert not StockLedger.objects.filter(reason=StockLedger.Reason.REFUND).exists()


def test_a_paid_order_is_never_cancelled_not_even_by_staff(user, make_product):
    p = make_product(stock=10)
    order = paid_order(user, [(p.pk, 2)])
    for kwargs in ({"unpaid_only": True}, {}):
        with pytest.raises(errors.OrderNotCancellable) as refused:
            cancel_order(order=order, actor="admin:staff", **kwargs)
        assert refused.value.details == {"order_id": order.pk, "status": "paid"}
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    assert Product.objects.get(pk=p.pk).stock == 8
    assert refund_order(order=order, actor="admin:staff").status == Order.Status.REFUNDED
    assert Product.objects.get(pk=p.pk).stock == 10


def test_the_database_refuses_refunds_that_were_never_paid(user, make_product):
    order = place_order(user=user, lines=[(make_product(stock=2).pk, 1)]).order
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(status=Order.Status.REFUNDED, refunded_at=now)  # no paid_at
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(status=Order.Status.PAID, paid_at=now, refunded_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(status=Order.Status.REFUNDED, paid_at=now)  # no refunded_at


def test_the_invariants_see_a_refund_the_order_does_not_explain(user, make_product):
    p = make_product(stock=10)
    order = paid_order(user, [(p.pk, 2)])
    assert release_violations([p.pk]) == []
    # A refund row for an order that is still paid: stock given back twice over, once sold again.
    StockLedger.objects.create(product=p, quantity=2, reason=StockLedger.Reason.REFUND, order=order)
    found = release_violations([p.pk])
    assert any("gave back stock of an order that still holds it" in v for v in found), found
    assert any("gave back other than they reserved" in v for v in found), found


def _refund(order_id: int) -> str:
    try:
        refund_order(order=Order.objects.get(pk=order_id), actor="admin:race")
    except errors.OrderNotRefundable:
        return "refused"
    return "refunded"


def _cancel_or_refund(order_id: int, i: int) -> str:
    try:
        if i % 2:
            refund_order(order=Order.objects.get(pk=order_id), actor="admin:race")
            return "refunded"
        cancel_order(order=Order.objects.get(pk=order_id), actor="admin:race")
        return "cancelled"
    except (errors.OrderNotRefundable, errors.OrderNotCancellable):
        return "refused"


def test_refunds_racing_in_processes_return_the_stock_once(user, make_product):
    p = make_product(stock=20)
    order = paid_order(user, [(p.pk, 4)])
    outcomes = run_processes(_refund, [(order.pk,)] * 6)
    assert sorted(outcomes) == ["refunded"] + ["refused"] * 5
    assert Product.objects.get(pk=p.pk).stock == 20
    assert StockLedger.objects.filter(order=order, reason=StockLedger.Reason.REFUND).count() == 1
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 20}, seen_order_ids=[order.pk]) == []


def test_a_refund_racing_cancels_of_a_paid_order_wins_alone(user, make_product):
    p = make_product(stock=20)
    order = paid_order(user, [(p.pk, 3)])
    outcomes = run_processes(_cancel_or_refund, [(order.pk, i) for i in range(6)])
    assert outcomes.count("refunded") == 1 and "cancelled" not in outcomes
    assert Order.objects.get(pk=order.pk).status == Order.Status.REFUNDED
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 20}, seen_order_ids=[order.pk]) == []
