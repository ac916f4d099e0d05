"""The payment step: place -> pending_payment -> paid, or cancelled / expired with the
stock and coupon back exactly once. Real MariaDB and Redis; processes where it is a race."""

from __future__ import annotations

import io
import random
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from locks.models import JobRun
from shop import errors
from shop.models import CouponClaim, Order, Product, StockLedger
from shop.ops.invariants import check_invariants
from shop.services import cancel_order, claim_coupon, expire_unpaid, pay_order, place_order
from tests.helpers import make_users, order_of, run_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


def make_late(order: Order) -> None:
    """Move the order's deadline into the past, as if its window had run out."""
    Order.objects.filter(pk=order.pk).update(pay_by=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize("combining", [True, False])
def test_checkout_creates_a_pending_order_with_a_deadline(user, make_product, settings, combining):
    settings.SHOP = {**settings.SHOP, "COMBINING": combining, "PAYMENT_WINDOW": 600}
    p = make_product(stock=5)
    before = timezone.now()
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    assert order.status == Order.Status.PENDING_PAYMENT and order.paid_at is None
    stored = Order.objects.get(pk=order.pk)
    assert stored.status == Order.Status.PENDING_PAYMENT
    assert before + timedelta(seconds=599) <= stored.pay_by <= timezone.now() + timedelta(seconds=601)
    assert Product.objects.get(pk=p.pk).stock == 3  # reserved while it awaits payment


def test_pay_then_pay_again_is_a_no_op(user, make_product):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    paid = pay_order(order=order, actor="test")
    assert paid.status == Order.Status.PAID and paid.paid_at is not None
    again = pay_order(order=order, actor="test")
    assert again.status == Order.Status.PAID and again.paid_at == paid.paid_at
    assert Product.objects.get(pk=p.pk).stock == 4


def test_paying_after_the_deadline_or_a_cancellation_is_refused(user, make_product):
    p = make_product(stock=5)
    late, cancelled = (order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(2))
    make_late(late)
    with pytest.raises(errors.OrderNotPayable) as exc:
        pay_order(order=late, actor="test")
    assert exc.value.code == "order_not_payable" and exc.value.status == 409
    cancel_order(order=cancelled, actor="buyer", unpaid_only=True)
    with pytest.raises(errors.OrderNotPayable):
        pay_order(order=cancelled, actor="test")
    assert Order.objects.filter(paid_at__isnull=False).count() == 0


def test_buyer_cancels_unpaid_order_stock_and_coupon_back_once(user, make_product, make_coupon):
    p = make_product(stock=10)
    coupon = make_coupon(total=3)
    claim_coupon(user=user, code=coupon.code)
    order = order_of(place_order(user=user, lines=[(p.pk, 4)], coupon_code=coupon.code))
    cancel_order(order=order, actor="buyer", unpaid_only=True)
    with pytest.raises(errors.OrderNotCancellable):
        cancel_order(order=order, actor="buyer", unpaid_only=True)
    assert Product.objects.get(pk=p.pk).stock == 10
    assert StockLedger.objects.filter(order=order, reason=StockLedger.Reason.CANCEL).count() == 1
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None


def test_buyer_cannot_cancel_a_paid_order(user, make_product):
    """Nor can staff: a paid order is refunded (tests/shop/services/test_refunds.py)."""
    p = make_product(stock=10)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    pay_order(order=order, actor="test")
    with pytest.raises(errors.OrderNotCancellable):
        cancel_order(order=order, actor="buyer", unpaid_only=True)
    assert Product.objects.get(pk=p.pk).stock == 8


def test_expire_unpaid_returns_exactly_the_reserved_stock_and_coupon(user, other_user, make_product, make_coupon):
    p, q = make_product(stock=10), make_product(stock=10)
    coupon = make_coupon(total=3)
    claim_coupon(user=user, code=coupon.code)
    late = order_of(place_order(user=user, lines=[(p.pk, 3), (q.pk, 1)], coupon_code=coupon.code))
    paid = order_of(place_order(user=other_user, lines=[(p.pk, 2)]))
    pending = order_of(place_order(user=other_user, lines=[(q.pk, 4)]))
    pay_order(order=paid, actor="test")
    make_late(late)
    Order.objects.filter(pk=paid.pk).update(pay_by=timezone.now() - timedelta(seconds=1))  # paid: never expires

    assert expire_unpaid() == 1
    assert expire_unpaid() == 0  # exactly once
    assert Order.objects.get(pk=late.pk).status == Order.Status.EXPIRED
    assert Order.objects.get(pk=paid.pk).status == Order.Status.PAID
    assert Order.objects.get(pk=pending.pk).status == Order.Status.PENDING_PAYMENT
    assert (Product.objects.get(pk=p.pk).stock, Product.objects.get(pk=q.pk).stock) == (8, 6)
    returned = StockLedger.objects.filter(order=late, reason=StockLedger.Reason.EXPIRE)
    assert sorted(returned.values_list("product_id", "quantity")) == [(p.pk, 3), (q.pk, 1)]
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None
    with pytest.raises(errors.OrderNotPayable):
        pay_order(order=late, actor="test")
    assert check_invariants(product_ids=[p.pk, q.pk], initial_stock={p.pk: 10, q.pk: 10}, coupon_ids=[coupon.pk],
                            seen_order_ids=[late.pk, paid.pk, pending.pk]) == []


def test_expiry_clears_the_sold_out_marker(user, other_user, make_product):
    p = make_product(stock=1)
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    with pytest.raises(errors.OutOfStock):
        place_order(user=other_user, lines=[(p.pk, 1)])  # marks it sold out
    make_late(order)
    assert expire_unpaid() == 1
    assert place_order(user=other_user, lines=[(p.pk, 1)]).status == Order.Status.PENDING_PAYMENT


def test_the_database_refuses_a_paid_at_on_an_expired_order(user, make_product):
    order = order_of(place_order(user=user, lines=[(make_product(stock=2).pk, 1)]))
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(status=Order.Status.EXPIRED, paid_at=timezone.now())


def test_the_job_runs_through_run_jobs(user, make_product):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    make_late(order)
    out = io.StringIO()
    call_command("run_jobs", "--once", "--job", "shop.expire_unpaid", stdout=out)
    assert Order.objects.get(pk=order.pk).status == Order.Status.EXPIRED
    assert Product.objects.get(pk=p.pk).stock == 5
    run = JobRun.objects.filter(job="shop.expire_unpaid").latest("pk")
    assert run.outcome == JobRun.OK and run.detail == "expired 1 orders"


# --- races: buyers paying while the expirer runs, in separate processes --------------------------
def buy_and_pay(user_id: int, product_id: int, seed: int, seconds: float) -> dict:
    """Buy one unit at a time; pay about half of the orders, some of them late (refused)."""
    user = get_user_model().objects.get(pk=user_id)
    rng = random.Random(seed)
    placed, paid, refused = [], [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            order = order_of(place_order(user=user, lines=[(product_id, rng.randint(1, 2))]))
        except (errors.OutOfStock, errors.LockTimeout, errors.Conflict, errors.UnpaidOrdersLimit):
            time.sleep(0.01)  # unpaid_limit: five unpaid orders wait for the expirer
            continue
        placed.append(order.pk)
        if rng.random() < 0.5:
            time.sleep(rng.choice([0, 0, 0.3]))  # the window is 0.2 s: some payments come too late
            try:
                paid.append(pay_order(order=order, actor="buyer").pk)
            except errors.OrderNotPayable:
                refused += 1
    return {"placed": placed, "paid": paid, "refused": refused}


def expire_loop(seconds: float) -> int:
    expired = 0
    end = time.monotonic() + seconds + 1.0  # outlive the buyers: then nothing is left unpaid-and-due
    while time.monotonic() < end:
        expired += expire_unpaid()
        time.sleep(0.02)
    time.sleep(0.3)
    return expired + expire_unpaid()


@pytest.mark.slow
@pytest.mark.parametrize("combining", [True, False])
def test_expiry_races_checkouts_and_payments_without_double_returns(make_product, settings, combining):
    settings.SHOP = {**settings.SHOP, "COMBINING": combining, "PAYMENT_WINDOW": 0.2}
    p = make_product(stock=60)
    users = make_users(4, prefix=f"payer-{combining}")
    results = run_processes(
        lambda i, *a: buy_and_pay(*a) if i < 4 else {"expired": expire_loop(a[-1])},
        [(i, users[i % 4].pk, p.pk, i, 3.0) for i in range(5)],
    )
    buyers = [r for r in results if "placed" in r]
    [expirer] = [r["expired"] for r in results if "expired" in r]
    placed = [o for r in buyers for o in r["placed"]]
    paid = {o for r in buyers for o in r["paid"]}
    assert placed and paid and expirer > 0

    statuses = dict(Order.objects.filter(pk__in=placed).values_list("pk", "status"))
    assert {pk for pk, s in statuses.items() if s == Order.Status.PAID} == paid
    assert all(statuses[pk] == Order.Status.EXPIRED for pk in set(placed) - paid), "an unpaid order survived"
    assert expirer == len(set(placed) - paid)
    assert not Order.objects.filter(pk__in=placed, status=Order.Status.EXPIRED, paid_at__isnull=False).exists()
    assert not StockLedger.objects.filter(order_id__in=paid, reason=StockLedger.Reason.EXPIRE).exists()
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 60}, seen_order_ids=placed) == []


def test_the_invariants_catch_a_double_return(user, make_product):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    make_late(order)
    expire_unpaid()
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 5}) == []
    # A bug that gave the stock back twice (here: by hand) is named, with the order.
    Product.objects.filter(pk=p.pk).update(stock=7)
    StockLedger.objects.create(product=p, quantity=2, reason=StockLedger.Reason.CANCEL, order=order)
    found = check_invariants(product_ids=[p.pk], initial_stock={p.pk: 5}, check_locks=False)
    assert any(v.startswith("returns:") and f"order {order.pk}" in v and "returned 4" in v for v in found), found
    assert any("wrong reason" in v for v in found), found


def test_expiry_stops_when_the_job_loses_its_lease(user, make_product):
    from locks import LockLost

    p = make_product(stock=5)
    orders = [order_of(place_order(user=user, lines=[(p.pk, 1)])) for _ in range(3)]
    for order in orders:
        make_late(order)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise LockLost("lease gone", name="job:shop.expire_unpaid")

    with pytest.raises(LockLost):
        expire_unpaid(check=check)
    assert Order.objects.filter(status=Order.Status.EXPIRED).count() == 2
    assert Product.objects.get(pk=p.pk).stock == 4
    assert expire_unpaid(limit=10) == 1 and Product.objects.get(pk=p.pk).stock == 5
