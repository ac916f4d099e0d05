"""Refunds: a paid order is refunded, never cancelled. The simulated provider
refunds, the stock comes back under the product locks with ledger reason `refund`, the coupon
goes back to its owner, exactly once. Real MariaDB and Redis; processes for the race."""

from __future__ import annotations

import io
import os
import time
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import IntegrityError, OperationalError, connections, transaction
from django.utils import timezone

from locks.models import JobRun
from shop import errors
from shop.models import CouponClaim, Order, Product, Refund, StockLedger
from shop.ops.invariants import check_invariants, release_violations
from shop.services import cancel_order, claim_coupon, orders, pay_order, place_order, refund_order
from shop.services.orders import finish_refunds
from tests.helpers import FORK, kill_own_connection, order_of, run_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


def paid_order(user, lines, **kwargs) -> Order:
    return pay_order(order=order_of(place_order(user=user, lines=lines, **kwargs)), actor="test")


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
    pending = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    cancelled = order_of(place_order(user=user, lines=[(p.pk, 1)]))
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
    order = order_of(place_order(user=user, lines=[(make_product(stock=2).pk, 1)]))
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
    # A refund recorded as completed while its order is still paid: the record and the books tore.
    Refund.objects.create(order=order, key="rf_torn", amount=order.total, actor="t", status="completed",
                          sent_at=timezone.now(), completed_at=timezone.now())
    assert any(v.startswith("refunds: 1 refund records disagree") for v in release_violations([p.pk]))


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


# --- the provider is paid back once, whatever the books' transaction goes through ------------------
class Provider:
    """Stands in for the payment provider: counts refund calls (the simulated one only logs)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.fail = 0  # the next `fail` calls raise (a provider that is down)

    def __call__(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("provider down")


@pytest.fixture
def provider(monkeypatch) -> Provider:
    stub = Provider()
    monkeypatch.setattr(orders, "provider_refund", stub)
    return stub


@pytest.fixture
def fail_books_once(monkeypatch):
    """fail_books_once(fault): the refund's books (flip, stock, coupon) meet `fault` once, with
    everything written and not yet committed: the last step before COMMIT under the locks."""

    def arm(fault) -> None:
        real = orders.check_before_commit
        fired = []

        def check(holds) -> None:
            if not fired:
                fired.append(1)
                fault()
            real(holds)

        monkeypatch.setattr(orders, "check_before_commit", check)

    return arm


def _deadlock() -> None:
    raise OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")


def _assert_refunded_once(order: Order, stock: dict[int, int], lines: int) -> None:
    order.refresh_from_db()
    assert order.status == Order.Status.REFUNDED and order.refunded_at is not None
    assert {pk: Product.objects.get(pk=pk).stock for pk in stock} == stock
    assert StockLedger.objects.filter(order=order, reason=StockLedger.Reason.REFUND).count() == lines
    assert check_invariants(product_ids=list(stock), initial_stock=stock, seen_order_ids=[order.pk]) == []


def test_a_deadlock_in_the_books_retries_them_without_paying_twice(user, make_product, provider, fail_books_once):
    p, q = make_product(stock=10), make_product(stock=5)
    order = paid_order(user, [(p.pk, 3), (q.pk, 1)])
    fail_books_once(_deadlock)
    refund_order(order=order, actor="admin:ops")
    assert len(provider.calls) == 1  # old code: 2, the provider sat inside the retried transaction
    _assert_refunded_once(order, {p.pk: 10, q.pk: 5}, lines=2)


def test_a_connection_dropped_mid_books_never_pays_twice(user, make_product, provider, fail_books_once):
    p = make_product(stock=10)
    order = paid_order(user, [(p.pk, 4)])
    fail_books_once(kill_own_connection)  # the COMMIT then fails: outcome unknown
    try:
        refund_order(order=order, actor="admin:ops")
    except errors.DatabaseUnavailable:
        refund_order(order=order, actor="admin:ops")  # the operator presses Refund again
    assert len(provider.calls) == 1  # old code: 2, the first refund's money had gone back already
    _assert_refunded_once(order, {p.pk: 10}, lines=1)


def test_a_refund_is_a_record_whose_key_the_provider_gets(user, make_product, provider):
    order = paid_order(user, [(make_product(stock=10, price="12.50").pk, 2)])
    refund_order(order=order, actor="admin:ops")
    refund = Refund.objects.get(order=order)
    assert provider.calls == [{"key": refund.key, "order_id": order.pk, "amount": Decimal("25.00")}]
    assert refund.status == Refund.Status.COMPLETED and refund.amount == Decimal("25.00")
    assert refund.actor == "admin:ops" and refund.key.startswith("rf_") and refund.attempts == 1
    assert refund.created_at <= refund.sent_at <= refund.completed_at
    assert refund.claimed_until is None and refund.last_error == ""


def test_a_provider_failure_leaves_the_refund_pending_and_the_job_finishes_it(user, make_product, provider):
    p = make_product(stock=10)
    order = paid_order(user, [(p.pk, 2)])
    provider.fail = 1
    with pytest.raises(errors.ProviderUnavailable) as failed:
        refund_order(order=order, actor="admin:ops")
    assert (failed.value.code, failed.value.status) == ("provider_unavailable", 503)
    refund = Refund.objects.get(order=order)
    assert refund.status == Refund.Status.PENDING and "provider down" in refund.last_error
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID and Product.objects.get(pk=p.pk).stock == 8

    assert finish_refunds() == 1  # its claim was let go at once: the job's next tick takes it
    assert finish_refunds() == 0
    assert [c["key"] for c in provider.calls] == [refund.key, refund.key]  # the same key: paid once
    _assert_refunded_once(order, {p.pk: 10}, lines=1)
    with pytest.raises(errors.OrderNotRefundable):
        refund_order(order=order, actor="admin:ops")


# --- a worker that dies between the steps: another process, killed with os._exit ----------------
class LoggedProvider:
    """A provider stub every process can count: one line per call in a file."""

    def __init__(self, path) -> None:
        self.path = path

    def __call__(self, **kwargs) -> None:
        with open(self.path, "a") as f:
            f.write(f"{kwargs['key']}\n")

    @property
    def keys(self) -> list[str]:
        return self.path.read_text().split() if self.path.exists() else []


@pytest.fixture
def logged_provider(monkeypatch, tmp_path) -> LoggedProvider:
    stub = LoggedProvider(tmp_path / "provider.log")
    monkeypatch.setattr(orders, "provider_refund", stub)
    return stub


def _die_while_refunding(order_id: int, where: str) -> None:
    """In a forked process: refund, and die (no clean-up, no rollback of our own) `where`."""
    connections.close_all()
    if where == "in_provider":  # the provider may have paid; nothing says so
        stub = orders.provider_refund

        def provider(**kwargs) -> None:
            stub(**kwargs)
            os._exit(3)

        orders.provider_refund = provider
    else:  # the provider paid and the refund says so; the books are written, not committed
        orders.check_before_commit = lambda holds: os._exit(3)
    refund_order(order=Order.objects.get(pk=order_id), actor="admin:ops")
    os._exit(0)


def _crash(order_id: int, where: str) -> None:
    connections.close_all()
    child = FORK.Process(target=_die_while_refunding, args=(order_id, where))
    child.start()
    child.join(30)
    assert child.exitcode == 3


@pytest.mark.parametrize("finisher", ["job", "admin"])
@pytest.mark.parametrize(("where", "left", "calls"), [("in_provider", "pending", 2), ("in_books", "sent", 1)])
def test_a_refund_left_by_a_dead_worker_is_finished_without_paying_twice(
    user, make_product, make_coupon, logged_provider, settings, where, left, calls, finisher
):
    settings.SHOP = {**settings.SHOP, "REFUND_CLAIM": 0.5}
    p = make_product(stock=10)
    coupon = make_coupon(total=3)
    claim_coupon(user=user, code=coupon.code)
    order = paid_order(user, [(p.pk, 3)], coupon_code=coupon.code)
    _crash(order.pk, where)
    refund = Refund.objects.get(order=order)
    assert refund.status == left and Order.objects.get(pk=order.pk).status == Order.Status.PAID
    assert Product.objects.get(pk=p.pk).stock == 7

    # While the dead worker's claim lasts, nobody touches it: it might still be alive.
    assert finish_refunds() == 0
    with pytest.raises(errors.OrderNotRefundable) as busy:
        refund_order(order=order, actor="admin:other")
    assert busy.value.message == "This order is already being refunded."
    assert busy.value.details == {"order_id": order.pk, "status": "paid", "refund": left}

    time.sleep(0.6)
    if finisher == "job":
        call_command("run_jobs", "--once", "--job", "shop.finish_refunds", stdout=io.StringIO())
        run = JobRun.objects.filter(job="shop.finish_refunds").latest("pk")
        assert run.outcome == JobRun.OK and run.detail == "finished 1 refunds"
    else:
        assert refund_order(order=order, actor="admin:other").status == Order.Status.REFUNDED
    # Paid back once: after a death in the provider call the key is sent again (the provider
    # dedups on it); after a death in the books the provider is not called again.
    assert logged_provider.keys == [refund.key] * calls
    _assert_refunded_once(order, {p.pk: 10}, lines=1)
    assert StockLedger.objects.get(order=order, reason=StockLedger.Reason.REFUND).actor == "admin:ops"
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None
    refund.refresh_from_db()
    assert refund.status == Refund.Status.COMPLETED and refund.attempts == 2


def test_twin_refunds_in_processes_call_the_provider_once(user, make_product, logged_provider):
    p = make_product(stock=20)
    order = paid_order(user, [(p.pk, 4)])
    outcomes = run_processes(_refund, [(order.pk,)] * 6)
    assert sorted(outcomes) == ["refunded"] + ["refused"] * 5
    assert logged_provider.keys == [Refund.objects.get(order=order).key]
