"""The fault-injection load test: its verdict rules, short real runs, and (marker `liveness`) all
scenarios at full length: `pytest -m liveness`."""

from __future__ import annotations

import pytest

from loadtest import fault_harness, faults
from loadtest.fault_harness import Attempt, liveness
from loadtest.inprocess_harness import FaultConfig
from loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, PLACED


def _placed_every(step: float, start: float, end: float) -> list[Attempt]:
    out, t = [], start
    while t < end:
        out.append(Attempt(t, t + 0.001, PLACED, 1))
        t += step
    return out


def test_a_steady_journal_is_live():
    figures = liveness(_placed_every(0.01, 0, 10), in_stock=[(0, 10)], healed_at=5)
    assert figures.problems(stall_limit=4.0) == []
    assert figures.longest_stall < 0.02 and figures.after_heal > 0


def test_a_gap_in_orders_while_stock_exists_is_a_stall():
    journal = _placed_every(0.01, 0, 3) + _placed_every(0.01, 7.5, 10)
    figures = liveness(journal, in_stock=[(0, 10)], healed_at=3)
    assert figures.longest_stall == pytest.approx(4.5, abs=0.02)
    assert figures.problems(stall_limit=4.0)[0].startswith("stalled 4.5")


def test_sold_out_answers_while_stock_exists_fail_after_the_grace():
    journal = [*_placed_every(0.01, 0, 10), Attempt(2.5, 2.501, OUT_OF_STOCK), Attempt(4.0, 4.001, OUT_OF_STOCK)]
    figures = liveness(journal, in_stock=[(2.0, 10)], healed_at=2.0, grace=1.0)
    assert figures.refused_in_stock == 1  # 2.5 is inside the restock's first second; 4.0 is not
    assert "1 buyers refused as sold out while stock existed" in figures.problems(stall_limit=4.0)


def test_errors_and_no_orders_after_the_fault_fail_busy_answers_do_not():
    journal = [*_placed_every(0.01, 0, 5), Attempt(5, 5.5, BUSY), Attempt(5.5, 5.6, ERROR)]
    figures = liveness(journal, in_stock=[(0, 5)], healed_at=6)
    assert figures.busy == 1
    assert figures.problems(stall_limit=4.0) == ["1 unexpected errors", "no order placed after the fault healed"]


SHORT = FaultConfig(buyers=4, duration=5.0, fault_at=1.5, fault_length=1.5)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scenario", ["kill-holder", "pause-holder", "restock-in-pause"])
def test_short_fault_runs_pass(scenario):
    outcome = faults.run_scenario(scenario, SHORT)
    assert outcome.faults == 1
    assert outcome.oversold == 0
    assert outcome.passed, outcome.problems
    assert outcome.orders > 0


@pytest.mark.liveness
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scenario", list(faults.SCENARIOS))
def test_every_fault_scenario_at_full_length_passes(scenario):
    outcome = faults.run_scenario(scenario, FaultConfig())
    assert outcome.faults == 1
    assert outcome.passed, fault_harness.table([outcome])


@pytest.mark.django_db(transaction=True)
def test_the_books_settle_a_killed_buyers_key_from_its_own_run_only():
    """A killed buyer's in-flight Idempotency-Key is settled from the database, as a retrying client
    would. Its keys repeat from run to run (`fault-<buyer>-<n>`): an order of an earlier run on the
    same database with that key is not this run's, and no success of this run's clients."""
    from django.contrib.auth import get_user_model

    from loadtest import workload
    from shop.services import place_order

    earlier = workload.create(workload.new_run_id(), products=1, stock=5, users=1)
    now = workload.create(workload.new_run_id(), products=1, stock=5, users=1)
    try:
        buyer = get_user_model().objects.get(pk=earlier.user_ids[0])
        place_order(user=buyer, lines=[(earlier.product_ids[0], 1)], idempotency_key="fault-0-1")
        assert fault_harness.check_books(now, [], ["fault-0-1"]) == (0, [], 0)
    finally:
        workload.cleanup(earlier)
        workload.cleanup(now)
