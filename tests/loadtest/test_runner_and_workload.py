"""The runner's bookkeeping across processes, and a workload that leaves nothing behind."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.db import connection
from django_redis import get_redis_connection

from loadtest import runner, strategies, workload
from loadtest.models import DbLock
from loadtest.runner import Phase, Plan, RunError
from loadtest.strategies import Options
from shop import services
from shop.models import Order, OrderLine, Product, StockLedger
from shop.plumbing import redis_keys, soldout

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def load():
    w = workload.create(workload.new_run_id(), products=2, stock=100, users=6)
    yield w
    workload.cleanup(w)


def plan(w: workload.Workload, strategy: str = "guarded", **overrides) -> Plan:
    return Plan(**{"strategy": strategy, "options": Options(run_id=w.run_id, prices=w.prices), "processes": 3,
                   "product_ids": w.product_ids, "user_ids": w.user_ids, "phases": [Phase("main", requests=24)],
                   **overrides})


class Crashes(strategies.Strategy):
    name = "crashes"
    label = "raises in its constructor"

    def __init__(self, options: Options) -> None:
        raise RuntimeError("boom in the worker")


def test_records_every_request_once_from_every_process(load):
    seen = []
    result = runner.run(plan(load), progress=seen.append, interval=0.01)
    records = result.phases[0].records
    assert len(records) == 3
    assert sum(len(r) for r in records) == 24
    assert all(start <= end for worker in records for start, end, *_ in worker)
    assert len(result.order_ids) == len(set(result.order_ids)) == 24
    assert Order.objects.filter(pk__in=result.order_ids).count() == 24
    assert seen and seen[-1].done == 24  # the last progress report is the phase's final count


def test_users_in_order_gives_every_user_the_same_number_of_requests(load):
    result = runner.run(plan(load, users_in_order=True))
    users = list(Order.objects.filter(pk__in=result.order_ids).values_list("user_id", flat=True))
    assert sorted(users) == sorted(load.user_ids * 4)


def test_until_sold_out_then_a_storm(load):
    Product.objects.filter(pk__in=load.product_ids).update(stock=5)
    result = runner.run(plan(load, phases=[Phase("sell-out", until_sold_out=True), Phase("storm", requests=30)]))
    sell, storm = result.phases
    placed = [r for w in sell.records for r in w if r[2] == strategies.OUTCOMES.index("placed")]
    assert len(placed) <= 10
    storm_outcomes = {strategies.OUTCOMES[r[2]] for w in storm.records for r in w}
    assert sum(len(w) for w in storm.records) == 30
    assert storm_outcomes <= {"out_of_stock", "placed"}
    assert "mysql_questions" in storm.server_before and "lock_acquired" in storm.server_after


def test_a_crashing_worker_fails_the_run_with_its_traceback(load, monkeypatch):
    monkeypatch.setitem(strategies.STRATEGIES, "crashes", Crashes)
    with pytest.raises(RunError, match="boom in the worker"):
        runner.run(plan(load, strategy="crashes"))


def test_a_plan_that_cannot_run_is_refused(load):
    with pytest.raises(ValueError, match="at least one process"):
        runner.run(plan(load, processes=0))
    with pytest.raises(ValueError, match="lines per order"):
        runner.run(plan(load, lines_per_order=3))
    with pytest.raises(ValueError, match="needs requests"):
        Phase("empty")


def test_cleanup_removes_everything_the_run_created():
    w = workload.create(workload.new_run_id(), products=2, stock=50, users=4, coupon_total=3)
    assert w.coupon_code == f"LT-{w.run_id}".upper()
    runner.run(plan(w, strategy="redis_py", processes=2))
    runner.run(plan(w, strategy="lock_table", processes=2))
    # A lock row a crashed holder left behind, and someone else's key that must survive.
    DbLock.objects.create(name=f"lt:{connection.settings_dict['NAME']}:product:{w.product_ids[0]}", owner="x",
                          expires_at="2000-01-01T00:00:00Z")
    caches["default"].set("lt:probe", 1)
    # What an HTTP run leaves in Redis: an order's idempotency record and a sold-out marker.
    buyer = get_user_model().objects.get(pk=w.user_ids[0])
    placed = services.place_order(user=buyer, lines=[(w.product_ids[1], 1)], idempotency_key="lt-key")
    record = redis_keys.idempotency_record(buyer.pk, "lt-key")
    assert get_redis_connection("default").get(record) == str(placed.order_id).encode()
    assert soldout.mark(w.product_ids[0], fence=1)
    workload.cleanup(w)
    assert get_redis_connection("default").exists(record) == 0
    assert soldout.sold_out(w.product_ids) == set()
    tag = w.tag
    assert not Product.objects.filter(sku__startswith=tag).exists()
    assert not get_user_model().objects.filter(username__startswith=tag).exists()
    assert not OrderLine.objects.filter(product_id__in=w.product_ids).exists()
    assert not StockLedger.objects.filter(product_id__in=w.product_ids).exists()
    assert caches["default"].get("lt:probe") == 1
    caches["default"].delete("lt:probe")
    assert not DbLock.objects.filter(name__startswith="lt:").exists()
    for alias, keys in workload.leftover_keys(w).items():
        assert get_redis_connection(alias).exists(*keys) == 0
