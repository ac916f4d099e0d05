"""A short multi-process run of every strategy, then the books and the invariant check.

Stock is smaller than the demand, so every strategy must stop at exactly the stock; the naive
one (with a little jitter to widen its race) must oversell and the check must say FAIL (I2).
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from loadtest import scenarios, strategies
from loadtest.scenarios import LoadConfig

pytestmark = pytest.mark.django_db(transaction=True)

SAFE = [name for name, cls in strategies.STRATEGIES.items() if not cls.oversells]


def short_run(strategy: str, **overrides) -> scenarios.Outcome:
    defaults = {"products": 2, "stock": 15, "users": 10, "processes": 3, "requests": 45, "lock_wait": 10.0}
    config = LoadConfig(strategy=strategy, **{**defaults, **overrides})
    return scenarios.run_once(config)


@pytest.mark.parametrize("strategy", SAFE)
def test_each_safe_strategy_sells_exactly_the_stock_and_passes(strategy):
    # The lock table: a lease well below the wait, so a row a busy machine failed to delete (its
    # DELETE lost a deadlock) stalls the product for that lease, never past a waiter's wait.
    outcome = short_run(strategy, **({"lock_ttl": 3.0} if strategy == "lock_table" else {}))
    s = outcome.summaries[0]
    assert s.attempted == 45
    assert s.counts["error"] == 0, outcome.result.errors
    assert s.counts["busy"] == 0
    assert s.counts["placed"] == 30  # 2 products x 15, one unit each
    assert s.counts["out_of_stock"] == 15
    assert [(b.current, b.sold, b.ledger, b.oversold) for b in outcome.books] == [(0, 15, 15, 0)] * 2
    assert outcome.passed, outcome.violations
    assert len(outcome.result.order_ids) == 30


def test_lock_based_strategies_count_their_lock_acquisitions():
    outcome = short_run("get_lock")
    assert outcome.summaries[0].lock_acquisitions == 45  # one per request, before looking at the stock
    assert short_run("guarded").summaries[0].lock_acquisitions == 0


def test_naive_oversells_and_the_invariant_check_fails_on_i2():
    outcome = short_run("naive", jitter=0.005, quantity=(1, 1))
    assert outcome.oversold > 0, "no lost update happened; the naive strategy should oversell"
    sold = sum(b.sold for b in outcome.books)
    assert sold > sum(b.initial - b.current for b in outcome.books)
    assert all(b.current >= 0 for b in outcome.books)  # never negative: the loss is silent
    assert not outcome.passed
    assert any("I2" in v for v in outcome.violations), outcome.violations


def test_multi_line_orders_with_quantity_ranges_balance():
    outcome = short_run("for_update", quantity=(1, 3), lines_per_order=2, stock=40)
    s = outcome.summaries[0]
    assert s.counts["placed"] > 0 and s.counts["error"] == 0
    assert all(b.oversold == 0 and b.sold == b.ledger == b.initial - b.current for b in outcome.books)
    assert outcome.passed, outcome.violations


def test_outcome_of_service_error_codes():
    assert strategies.outcome_of_code("out_of_stock") == strategies.OUT_OF_STOCK
    assert strategies.outcome_of_code("lock_timeout") == strategies.BUSY
    assert strategies.outcome_of_code("conflict") == strategies.BUSY
    assert strategies.outcome_of_code("coupon_sold_out") == strategies.REJECTED
    assert strategies.outcome_of_code("unpaid_limit") == strategies.REJECTED  # a server with its limits on
    assert strategies.outcome_of_code("purchase_limit") == strategies.REJECTED
    assert strategies.outcome_of_code("invalid_quantity") == strategies.ERROR


@pytest.mark.parametrize(("code", "status", "outcome"), [
    ("inactive_product", None, strategies.REJECTED),  # a 409 of shop.errors: the shop's rules said no
    ("cart_full", None, strategies.REJECTED),
    ("rate_limited", None, strategies.REJECTED),  # 429: a limit, named by its code
    ("coupon_unknown", None, strategies.REJECTED),
    ("a_rule_added_later", 409, strategies.REJECTED),  # a server newer than this client: its status says
    ("a_rule_added_later", 400, strategies.ERROR),
    ("", 409, strategies.ERROR),  # a 409 without the API's error body is not the shop's refusal
    ("", 503, strategies.BUSY),
    ("", 500, strategies.ERROR),
    ("unknown_product", 404, strategies.ERROR),
    ("idempotency_conflict", None, strategies.ERROR),
])
def test_a_refusal_is_rejected_by_its_status_the_same_in_process_and_over_http(code, status, outcome):
    assert strategies.outcome_of_code(code, status) == outcome


def test_a_strategy_counts_its_rejections_by_code():
    strategy = strategies.get("guarded")(strategies.Options(run_id="x", prices={}))
    outcomes = [strategy.refusal(code) for code in ("unpaid_limit", "out_of_stock", "unpaid_limit", "busy")]
    assert outcomes == [strategies.REJECTED, strategies.OUT_OF_STOCK, strategies.REJECTED, strategies.BUSY]
    assert strategy.rejected == {"unpaid_limit": 2}


@pytest.mark.django_db(transaction=True)
def test_ours_raises_an_unexpected_refusal_so_the_run_keeps_its_message(make_product, user):
    """Bad input is the load test's own mistake: an error with its message, never a silent count."""
    ours = strategies.get("ours")(strategies.Options(run_id="x", prices={}, user_ids=[user.pk]))
    with pytest.raises(Exception, match="Quantities must be"):
        ours.place(user.pk, [(make_product(stock=5).pk, 0)])
    assert not ours.rejected


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        strategies.get("nope")


def test_lock_table_waiters_outlive_the_deadlock_innodb_hands_them():
    # InnoDB's documented duplicate-key deadlock: two INSERTs of a key another transaction has
    # inserted but not committed both wait with a shared lock; when that one rolls back, both
    # want the exclusive lock and one is rolled back with 1213. The same happens in races with a
    # release's DELETE. A waiter must count it as one more failed attempt, never give up (busy).
    import threading

    import MySQLdb
    from django.db import connection, connections

    from shop.models import Product

    product = Product.objects.create(name="Deadlock", price=Decimal("1.00"), stock=1)
    options = strategies.Options(run_id="t", prices={}, lock_wait=5.0, lock_ttl=30.0)
    name = strategies.LockTable(options).lock_name(product.pk)
    settings = connection.settings_dict
    other = MySQLdb.connect(host=settings["HOST"] or "127.0.0.1", port=int(settings["PORT"] or 3306),
                            user=settings["USER"], passwd=settings["PASSWORD"], db=settings["NAME"])
    results: list[object] = []

    def waiter() -> None:
        try:
            strategy = strategies.LockTable(options)
            handle = strategy.acquire(product.pk)
            if handle is not None:
                strategy.release(handle)
            results.append(handle)
        except Exception as exc:
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    try:
        other.autocommit(False)
        other.cursor().execute(
            "INSERT INTO loadtest_dblock (name, owner, expires_at) VALUES (%s, 'other', NOW() + INTERVAL 1 MINUTE)",
            [name],
        )
        for t in threads:
            t.start()
        probe = connection.cursor()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # both waiters' INSERTs are in flight...
            probe.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE %s",
                          ["INSERT INTO `loadtest_dblock`%"])
            if probe.fetchone()[0] >= 2:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the two waiters never queued behind the other transaction's INSERT")
        time.sleep(0.3)  # ...and waiting on its row lock
        other.rollback()
    finally:
        other.close()
    for t in threads:
        t.join(timeout=15)
    assert results == [name, name]


def test_batch_sizes_come_from_the_ledger_one_per_hold_without_combining():
    per_order = short_run("ours_per_order")
    assert per_order.batches and set(per_order.batches) == {1}  # every order its own hold and fence
    combined = short_run("ours", processes=6)
    assert sum(combined.batches) == 30  # every placed order is in exactly one hold's batch
    assert combined.as_dict()["batches"]["holds"] == len(combined.batches)
