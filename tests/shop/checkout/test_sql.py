"""The checkout's hand-written SQL (shop/checkout/sql.py) against MariaDB and the MySQL 8 dressing:
literals escaped by the driver, order ids right without RETURNING."""

from __future__ import annotations

import pytest

from shop.checkout import protocol, writer
from shop.models import Order, StockLedger
from shop.plumbing.lock_names import product_lock
from shop.services import place_order
from tests.helpers import order_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]


@pytest.mark.parametrize("key", ["it's", 'a"b', "back\\slash", "100%s", "--;DROP", "\\'"])
def test_a_key_with_quotes_backslashes_and_percents_is_written_exactly_and_replays(user, make_product, key):
    """The writer builds its INSERTs from the driver's escaped literals (sql.insert_sql)."""
    p = make_product(stock=5)
    first = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key=key))
    assert Order.objects.get(pk=first.pk).idempotency_key == key
    again = place_order(user=user, lines=[(p.pk, 1)], idempotency_key=key)
    assert again.order_id == first.pk and again.replayed


@pytest.mark.parametrize("key", ["x RETURNING id", "returning", "' RETURNING 1 --", "idle_transaction_timeout"])
def test_in_mysql8_mode_a_key_that_spells_sql_is_data(user, make_product, key):
    """The MySQL 8 emulation refuses MariaDB-only SQL, not a buyer's words inside a literal of the
    writer's INSERT (loadtest/mysql8)."""
    p = make_product(stock=5)
    first = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key=key))
    assert Order.objects.get(pk=first.pk).idempotency_key == key
    assert place_order(user=user, lines=[(p.pk, 1)], idempotency_key=key).order_id == first.pk


def test_a_batchs_order_ids_are_right_whatever_the_auto_increment_step(make_product, flavour):
    """Without RETURNING (MySQL 8) the writer reads its orders' ids back by their request ids: right
    under any auto_increment_increment/offset (replication sets them) and lock mode, where the
    ids of one multi-row INSERT need not be consecutive."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from locks import Lock

    users = [get_user_model().objects.create_user(f"step-{i}", password="pw-not-used") for i in range(3)]
    p = make_product(stock=10)
    requests = [protocol.Request(id=protocol.new_request_id(), user_id=u.pk, lines=((p.pk, i + 1),), code=None,
                                 key=None, digest="d", deadline=float("inf")) for i, u in enumerate(users)]
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION auto_increment_increment = 7, auto_increment_offset = 3")
    try:
        with Lock(product_lock(p.pk), ttl=10) as hold:
            results = writer.write(requests, holds={p.pk: hold})
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION auto_increment_increment = DEFAULT, auto_increment_offset = DEFAULT")
    for i, (r, u) in enumerate(zip(requests, users, strict=True)):
        order = Order.objects.get(pk=results[r.id].order_id)
        assert (order.user_id, order.request_id) == (u.pk, r.id)
        assert list(order.lines.values_list("product_id", "quantity")) == [(p.pk, i + 1)]
        assert list(StockLedger.objects.filter(order=order).values_list("quantity", flat=True)) == [-(i + 1)]
    ids = sorted(results[r.id].order_id for r in requests)
    assert ids[1] - ids[0] == 7  # not consecutive: counting from the first id would be wrong

