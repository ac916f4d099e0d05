"""A short multi-process run of every strategy, then the books and the invariant check.

Stock is smaller than the demand, so every strategy must stop at exactly the stock; the naive
one (with a little jitter to widen its race) must oversell and the check must say FAIL (I2).
"""

from __future__ import annotations

import pytest

from shop.loadtest import scenarios, strategies
from shop.loadtest.scenarios import LoadConfig

pytestmark = pytest.mark.django_db(transaction=True)

SAFE = [name for name, cls in strategies.STRATEGIES.items() if not cls.oversells]


def short_run(strategy: str, **overrides) -> scenarios.Outcome:
    defaults = {"products": 2, "stock": 15, "users": 10, "processes": 3, "requests": 45, "lock_wait": 10.0}
    config = LoadConfig(strategy=strategy, **{**defaults, **overrides})
    return scenarios.run_once(config)


@pytest.mark.parametrize("strategy", SAFE)
def test_each_safe_strategy_sells_exactly_the_stock_and_passes(strategy):
    outcome = short_run(strategy)
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
    assert strategies.outcome_of_code("invalid_quantity") == strategies.ERROR


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        strategies.get("nope")
