"""Checkout lanes (SHOP["COMBINE_LANES"]): products share a few queues, and a lane's holder
commits orders for several products in one transaction under their own product locks."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import Count

from locks import Lock, inspect, stats
from shop import errors
from shop.models import Order, OrderLine
from shop.plumbing.lock_names import lane_lock, product_lock
from shop.services import place_order
from tests.helpers import make_users, run_processes
from tests.locks.conftest import FORK, wait_until_queued
from tests.shop.services.test_combining import assert_books

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("flavour")]


@pytest.fixture(autouse=True)
def _lanes(settings):
    settings.SHOP = {**settings.SHOP, "COMBINING": True, "COMBINE_LANES": 2}


def test_a_product_falls_in_one_lane_and_no_lanes_means_its_own_lock():
    assert lane_lock(7, lanes=0) == product_lock(7) == "product:7"
    assert lane_lock(7, lanes=2) == lane_lock(9, lanes=2) == "checkout-lane:1"
    assert lane_lock(8, lanes=2) == "checkout-lane:0"


def test_lanes_are_on_by_default_one_per_two_cpus_of_this_machine(settings):
    import os

    from shop.plumbing import lock_names

    settings.SHOP = {k: v for k, v in settings.SHOP.items() if k != "COMBINE_LANES"}
    cpus = len(os.sched_getaffinity(0))
    assert lock_names.lanes() == max(1, min(32, cpus // 2))
    assert lock_names.checkout_queue(7) == f"checkout-lane:{7 % lock_names.lanes()}"
    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 0}
    assert lock_names.checkout_queue(7) == "product:7"
    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 3, "COMBINING": False}
    assert lock_names.checkout_queue(7) == "product:7"  # without combining, a buyer takes its product's lock


def _buy_random(user_id: int, product_ids: list[int], orders: int, seed: int) -> dict:
    import random

    rng = random.Random(seed)
    user = get_user_model().objects.get(pk=user_id)
    told: dict[str, list] = {"placed": [], "refused": []}
    for _ in range(orders):
        try:
            told["placed"].append(place_order(user=user, lines=[(rng.choice(product_ids), 1)]).order_id)
        except errors.ShopError as exc:
            told["refused"].append(exc.code)
    return told


def test_lanes_sell_several_products_exactly_in_shared_transactions(make_product):
    products = [make_product(stock=40) for _ in range(4)]
    ids = [p.pk for p in products]
    users = make_users(12)
    lanes = sorted({lane_lock(pid, lanes=2) for pid in ids})
    stats.flush()
    before = sum(inspect.acquisitions(lanes).values())  # the lanes are every test's (lanes are on by default)
    results = run_processes(_buy_random, [(u.pk, ids, 20, i) for i, u in enumerate(users)])
    seen = [oid for r in results for oid in r["placed"]]
    refused = [code for r in results for code in r["refused"]]
    assert len(seen) == 160 and set(refused) <= {"out_of_stock"}
    assert_books(ids, {pid: 40 for pid in ids}, seen)
    # One transaction, one timestamp: some committed orders for two products or more at once.
    shared = (OrderLine.objects.filter(product_id__in=ids).values("order__created_at")
              .annotate(products=Count("product_id", distinct=True)).filter(products__gt=1))
    assert shared.exists()
    stats.flush()
    assert sum(inspect.acquisitions(lanes).values()) - before < len(seen)  # batches, not one hold per order


def _buyer(user_id: int, product_id: int, queue) -> None:
    user = get_user_model().objects.get(pk=user_id)
    try:
        queue.put((product_id, "placed", place_order(user=user, lines=[(product_id, 1)]).order_id))
    except errors.ShopError as exc:
        queue.put((product_id, exc.code, None))
    finally:
        connections.close_all()


def test_a_busy_product_goes_back_to_its_buyer_and_never_holds_up_its_lane(settings, make_product):
    """A cart holds product A's lock: A's buyer is handed back its request and waits in A's own
    line, while a buyer of B, in the same lane, is served at once."""
    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 1, "LOCK_WAIT": 10.0}
    a, b = make_product(stock=5), make_product(stock=5)
    buyer_a, buyer_b = make_users(2)
    cart = Lock(product_lock(a.pk), ttl=30.0)
    cart.acquire()
    connections.close_all()
    queue = FORK.Queue()
    first = FORK.Process(target=_buyer, args=(buyer_a.pk, a.pk, queue))
    first.start()
    wait_until_queued(product_lock(a.pk), 1)  # handed back by the lane: queued on A itself
    second = FORK.Process(target=_buyer, args=(buyer_b.pk, b.pk, queue))
    second.start()
    assert queue.get(timeout=10)[:2] == (b.pk, "placed")
    assert first.is_alive()
    cart.release()
    pid, kind, order_id = queue.get(timeout=10)
    assert (pid, kind) == (a.pk, "placed")
    for proc in (first, second):
        proc.join(5)
    assert Order.objects.count() == 2
    assert_books([a.pk, b.pk], {a.pk: 5, b.pk: 5}, [order_id, *Order.objects.exclude(pk=order_id).values_list(
        "pk", flat=True)])


def test_a_lane_holder_killed_mid_batch_commits_nothing_and_the_next_serves_its_buyers(settings, make_product):
    """SIGKILL of the lane's holder with orders for two products written, not committed: the
    lane's and the products' leases end, its buyers queue again, and the next holder serves them."""
    import signal

    from tests.shop.services.test_combining import _queued_buyer

    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 1}
    a, b = make_product(stock=50), make_product(stock=50)
    users = make_users(5)
    lane = lane_lock(a.pk, lanes=1)
    gate = Lock(lane, ttl=30.0)
    gate.acquire()
    connections.close_all()
    queue, acting = FORK.Queue(), FORK.Event()
    procs = []
    for i, (user, product) in enumerate(zip(users, [a, b, a, b, a], strict=True)):
        first = i == 0
        proc = FORK.Process(target=_queued_buyer, args=(
            user.pk, product.pk, 1, 10.0 if first else 5.0, "before_commit" if first else None,
            "kill" if first else None, acting, queue))
        proc.start()
        wait_until_queued(lane, i + 1)
        procs.append(proc)
    gate.release()
    assert acting.wait(15), "the lane's holder never reached its commit"
    told = [queue.get(timeout=15) for _ in procs[1:]]
    procs[0].join(5)
    assert procs[0].exitcode == -signal.SIGKILL
    assert [kind for kind, _ in told] == ["placed"] * 4
    seen = [oid for _, oid in told]
    assert Order.objects.count() == 4
    assert_books([a.pk, b.pk], {a.pk: 50, b.pk: 50}, seen)
    for proc in procs[1:]:
        proc.join(5)


def _gated_buyer(user_id: int, product_id: int, wait: float, gates: dict, queue, ttl: dict | None = None) -> None:
    """A forked buyer that, at each checkout stage in `gates` (stage -> (reached, go) events),
    says it got there and waits for the test to let it go on (alive: its leases are renewed).
    Told (user id, code, order id or the error's outcome)."""
    from django.conf import settings as django_settings

    from shop.plumbing import hooks

    django_settings.SHOP = {**django_settings.SHOP, "LOCK_WAIT": wait, **(ttl or {})}

    def hook(stage: str, holds: dict) -> None:
        if stage in gates:
            reached, go = gates.pop(stage)
            reached.set()
            assert go.wait(60), f"never let go on at {stage}"

    hooks.checkout_hook = hook
    user = get_user_model().objects.get(pk=user_id)
    try:
        queue.put((user_id, "placed", place_order(user=user, lines=[(product_id, 1)]).order_id))
    except errors.ShopError as exc:
        queue.put((user_id, exc.code, exc.details.get("outcome")))
    except Exception as exc:  # what a view would answer with a 500
        queue.put((user_id, "unexpected", repr(exc)))
    finally:
        hooks.checkout_hook = None
        connections.close_all()


def test_a_buyer_handed_back_while_a_stale_lane_holder_commits_it_is_never_told_lock_timeout(settings, make_product):
    """The lane's holder A took B's request and holds the product's lock, then loses the lane
    (here an operator's force release; under load, a lapsed lease). B's request is woken as an
    orphan, queues again, is handed back (ALONE: A holds the product) and waits for the product
    itself. A, still the product's holder, commits B's order and is slow to release. B's wait
    ends: it must answer what happened to its request id (the order), never `lock_timeout` for
    an order that exists (I5)."""
    from locks import inspect as lock_inspect

    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 1}
    p = make_product(stock=10)
    user_a, user_b = make_users(2)
    lane = lane_lock(p.pk, lanes=1)
    gate = Lock(lane, ttl=30.0)
    gate.acquire()
    connections.close_all()
    queue = FORK.Queue()
    at_update, go_update, at_commit, go_commit = (FORK.Event() for _ in range(4))
    holder = FORK.Process(target=_gated_buyer, args=(
        user_a.pk, p.pk, 20.0, {"before_update": (at_update, go_update), "after_commit": (at_commit, go_commit)},
        queue))
    holder.start()
    wait_until_queued(lane, 1)
    buyer = FORK.Process(target=_gated_buyer, args=(user_b.pk, p.pk, 5.0, {}, queue))
    buyer.start()
    wait_until_queued(lane, 2)
    try:
        gate.release()  # A gets the lane, takes B's request, takes the product's lock
        assert at_update.wait(15), "the lane's holder never reached its write"
        assert lock_inspect.force_release(lane, actor="test") is not None  # A loses the lane
        wait_until_queued(product_lock(p.pk), 1)  # B: woken, handed back, waiting for the product
        go_update.set()
        assert at_commit.wait(15), "the lane's holder never committed"  # B's order among them
        told_b = queue.get(timeout=30)  # B's wait ends while A still holds the product
    finally:
        go_update.set()
        go_commit.set()
    told_a = queue.get(timeout=30)
    for proc in (holder, buyer):
        proc.join(10)
    told = {told_a[0]: told_a[1:], told_b[0]: told_b[1:]}
    committed_b = list(Order.objects.filter(user=user_b).values_list("pk", flat=True))
    assert len(committed_b) == 1, "A was to commit B's order while B waited for the product"
    assert told[user_b.pk] == ("placed", committed_b[0]), f"B was told {told[user_b.pk]} for a committed order"
    assert told[user_a.pk][0] == "placed"
    assert_books([p.pk], {p.pk: 10}, [oid for _, oid in told.values()])


def _kill_blocked_insert(table: str, timeout: float = 15.0) -> None:
    """KILL the connection of this test's database whose INSERT into `table` is waiting (on a
    row another transaction wrote and has not committed). Only this database's: other test runs
    share the server."""
    import time

    import MySQLdb

    database = connections["default"].settings_dict["NAME"]
    admin = MySQLdb.connect(host="127.0.0.1", port=3306, user="root", passwd="")
    try:
        cursor = admin.cursor()
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            cursor.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND INFO LIKE %s",
                           [database, f"INSERT INTO `{table}`%"])
            if rows := cursor.fetchall():
                cursor.execute(f"KILL {int(rows[0][0])}")
                return
            time.sleep(0.01)
        raise AssertionError(f"no INSERT into {table} waited")
    finally:
        admin.close()


def _b_queued_behind_a_stopping_at_commit(p, user_a, user_b):
    """Two buyers in one lane, released together by `gate`: A combines (its lease, and MariaDB's
    idle timeout of its transaction, ceil(LOCK_TTL) + 1, outlast the test's steps) and stops at
    its COMMIT (`at_commit`) until `go_commit`; B, queued behind it, waits 3 s. Both answer on `queue`."""
    lane = lane_lock(p.pk, lanes=1)
    gate = Lock(lane, ttl=30.0)
    gate.acquire()
    connections.close_all()
    queue = FORK.Queue()
    at_commit, go_commit = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_gated_buyer, args=(user_a.pk, p.pk, 20.0, {"at_commit": (at_commit, go_commit)},
                                                     queue, {"LOCK_TTL": 15.0}))
    holder.start()
    wait_until_queued(lane, 1)
    buyer = FORK.Process(target=_gated_buyer, args=(user_b.pk, p.pk, 3.0, {}, queue))
    buyer.start()
    wait_until_queued(lane, 2)
    return gate, queue, at_commit, go_commit, holder, buyer


def test_a_settle_that_loses_its_connection_never_says_not_written(settings, make_product):
    """B's wait ends while its combiner A is about to COMMIT B's order (every check passed): B
    settles its request id, and that INSERT waits for A's. Its connection is lost there: B cannot
    know whether A commits, so its answer is `database_unavailable` with outcome `unknown` (a retry
    with its key settles it), never `not_written` for an order A then commits (I5)."""
    from shop.models import CheckoutRequest

    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 1}
    p = make_product(stock=10)
    user_a, user_b = make_users(2)
    gate, queue, at_commit, go_commit, holder, buyer = _b_queued_behind_a_stopping_at_commit(p, user_a, user_b)
    try:
        gate.release()
        assert at_commit.wait(15), "the combiner never reached its COMMIT"
        _kill_blocked_insert(CheckoutRequest._meta.db_table)  # B's settle, waiting on A's row
        told_b = queue.get(timeout=30)
    finally:
        go_commit.set()
    told_a = queue.get(timeout=30)
    for proc in (holder, buyer):
        proc.join(10)
    told = {told_a[0]: told_a[1:], told_b[0]: told_b[1:]}
    assert told[user_a.pk][0] == "placed"
    assert Order.objects.filter(user=user_b).exists(), "A was to commit B's order"
    assert told[user_b.pk] == ("database_unavailable", "unknown"), told[user_b.pk]


def test_a_settle_still_waiting_for_its_combiners_row_after_its_retries_is_unknown_not_a_500(settings, make_product):
    """Kill mode (MySQL 8's): a row wait ends after ceil(LOCK_TTL) s. B's settle waits for its
    combiner A's transaction, which holds B's id and stays open (A is about to COMMIT): after its
    retries, B's answer is `database_unavailable` with outcome `unknown` (old code: the raw
    lock-wait timeout, a 500), and A's order for B stands."""
    from shop.models import CheckoutRequest

    settings.SHOP = {**settings.SHOP, "COMBINE_LANES": 1, "STALE_TRANSACTIONS": "kill", "RETRIES": 1}
    p = make_product(stock=10)
    user_a, user_b = make_users(2)
    gate, queue, at_commit, go_commit, holder, buyer = _b_queued_behind_a_stopping_at_commit(p, user_a, user_b)
    try:
        gate.release()
        assert at_commit.wait(15), "the combiner never reached its COMMIT"
        told_b = queue.get(timeout=30)  # B's settle waited twice, a second each, for A's row
    finally:
        go_commit.set()
    told_a = queue.get(timeout=30)
    for proc in (holder, buyer):
        proc.join(10)
    assert told_b == (user_b.pk, "database_unavailable", "unknown")
    assert told_a[1] == "placed"
    committed_b = list(Order.objects.filter(user=user_b).values_list("pk", flat=True))
    assert len(committed_b) == 1 and CheckoutRequest.objects.get(order_id=committed_b[0])
    assert_books([p.pk], {p.pk: 10}, [told_a[2], committed_b[0]])  # B's retry with its key would get its order
