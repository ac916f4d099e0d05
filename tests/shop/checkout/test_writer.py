"""The checkout writer (shop/checkout/writer.py) with real processes, MariaDB and Redis: what one
request of a batch may cost the others (I9, I10)."""

from __future__ import annotations

import time

import MySQLdb
import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections

from locks import Lock
from shop import errors
from shop.models import Order
from shop.plumbing.lock_names import checkout_queue
from shop.services import place_order
from tests.helpers import make_users
from tests.locks.conftest import FORK, wait_until_queued
from tests.shop.services.test_combining import assert_books

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("flavour")]


def _buyer(user_id: int, product_id: int, deadline: float | None, queue) -> None:
    user = get_user_model().objects.get(pk=user_id)
    try:
        queue.put((user_id, "placed", place_order(user=user, lines=[(product_id, 1)], deadline=deadline).order_id))
    except errors.ShopError as exc:
        queue.put((user_id, exc.code, exc.details))
    finally:
        connections.close_all()


def _waits_for_the_row(database: str, operator_id: int) -> bool:
    """Whether another connection runs the writer's locking read of the product rows (the operator
    holds the row: it waits)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE db = %s AND id <> %s "
                       "AND info LIKE %s", [database, operator_id, "SELECT%FROM `shop_product`%FOR UPDATE"])
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize("late", ["combiner", "queued"])
def test_a_request_whose_deadline_passes_during_the_write_costs_only_itself(settings, make_product, late):
    """Five buyers in one batch; one asked for a short wait (its client's `Prefer: wait`), which
    runs out while the batch waits for the product's row (an operator's transaction holds it for
    a moment). That buyer gets its deadline answer and no order (I10); the four others get their
    orders, even with no retries to spare (RETRIES 0): the late one costs only itself."""
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True, "LOCK_WAIT": 10.0, "RETRIES": 0}
    p = make_product(stock=100)
    users = make_users(5)
    late_user = users[0 if late == "combiner" else 2]  # the batch's writer, or a buyer queued behind it
    db = connection.settings_dict
    operator = MySQLdb.connect(host="127.0.0.1", port=int(db["PORT"] or 3306), user=db["USER"],
                               passwd=db["PASSWORD"], database=db["NAME"])
    operator.autocommit(False)
    operator.cursor().execute("SELECT id FROM shop_product WHERE id = %s FOR UPDATE", [p.pk])
    name = checkout_queue(p.pk)
    gate = Lock(name, ttl=30.0)
    gate.acquire()
    connections.close_all()
    line_ends = time.monotonic() + 3.5  # the late buyer's wait in line ends here (its answer is due 1 s later)
    queue, procs = FORK.Queue(), []
    try:
        for i, u in enumerate(users):
            deadline = line_ends + 1.0 if u == late_user else None
            procs.append(FORK.Process(target=_buyer, args=(u.pk, p.pk, deadline, queue)))
            procs[-1].start()
            wait_until_queued(name, i + 1)
        assert time.monotonic() < line_ends - 0.5, "the buyers took too long to queue"
        time.sleep(max(0.0, line_ends - 0.4 - time.monotonic()))
        gate.release()  # the first takes the four others into its batch and waits for the row
        while not _waits_for_the_row(db["NAME"], operator.thread_id()):
            assert time.monotonic() < line_ends - 0.05, "the batch did not reach the row before the deadline"
            time.sleep(0.005)
        # The late deadline passes while the batch waits (under a second: kill mode's row wait).
        time.sleep(max(0.0, line_ends + 0.15 - time.monotonic()))
        operator.rollback()
        told = {user_id: (code, value) for user_id, code, value in (queue.get(timeout=20) for _ in procs)}
    finally:
        operator.close()
        for proc in procs:
            proc.join(10)
    late_code, _ = told.pop(late_user.pk)
    assert late_code == "lock_timeout"
    assert [code for code, _ in told.values()] == ["placed"] * 4, told
    seen = [order_id for _, order_id in told.values()]
    assert sorted(Order.objects.filter(lines__product=p).values_list("pk", flat=True)) == sorted(seen)
    assert not Order.objects.filter(user=late_user).exists()
    assert_books([p.pk], {p.pk: 100}, seen)
