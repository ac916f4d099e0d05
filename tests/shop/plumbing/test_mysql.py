"""`shop.plumbing.mysql`: Django's MySQL backend with an atomic block opened by START TRANSACTION
and autocommit left on. On the real MariaDB: the block still commits, rolls back and keeps its
savepoints as Django's does, the session is in autocommit after it, a caller's own
`set_autocommit(False)` means what Django says, and the block costs one round trip less."""

from __future__ import annotations

import itertools
from decimal import Decimal

import MySQLdb
import pytest
from django.db import connection, connections, transaction

from shop.models import Product
from shop.plumbing.mysql.base import DatabaseWrapper

pytestmark = pytest.mark.django_db(transaction=True)
_seq = itertools.count()


def _sku() -> str:
    return f"MYSQL-{next(_seq)}"


def _add(sku: str) -> None:
    Product.objects.create(sku=sku, name=sku, price=Decimal("1.00"), stock=1)


def _seen_elsewhere(sku: str) -> bool:
    """What another session sees: committed rows only."""
    s = connection.settings_dict
    other = MySQLdb.connect(host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306), user=s["USER"],
                            password=s["PASSWORD"], database=s["NAME"])
    try:
        cursor = other.cursor()
        cursor.execute("SELECT COUNT(*) FROM shop_product WHERE sku = %s", [sku])
        return cursor.fetchone()[0] == 1
    finally:
        other.close()


def _questions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def test_the_project_runs_on_this_backend():
    assert isinstance(connections["default"], DatabaseWrapper)


def test_an_atomic_block_costs_two_round_trips_around_its_statements():
    connection.ensure_connection()
    before = _questions()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    # START TRANSACTION, the SELECT, COMMIT, then the SHOW that counts (Django's: SET autocommit=0
    # and SET autocommit=1 in place of the START TRANSACTION: one more).
    assert _questions() - before == 4
    assert connection.get_autocommit() and connection.connection.get_autocommit()


def test_a_block_commits_at_its_end_and_the_session_autocommits_after_it():
    inside, after = _sku(), _sku()
    with transaction.atomic():
        _add(inside)
        assert not _seen_elsewhere(inside)  # in one transaction until the block ends
    assert _seen_elsewhere(inside)
    _add(after)  # outside a block: its own transaction, committed at once
    assert _seen_elsewhere(after)


def test_a_block_that_raises_writes_nothing_and_a_nested_one_rolls_back_to_its_savepoint():
    sku, kept, undone = _sku(), _sku(), _sku()
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        _add(sku)
        raise ZeroDivisionError
    assert not Product.objects.filter(sku=sku).exists() and not _seen_elsewhere(sku)
    with transaction.atomic():
        _add(kept)
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            _add(undone)
            raise ZeroDivisionError
    assert _seen_elsewhere(kept) and not _seen_elsewhere(undone)


def test_turning_autocommit_off_by_hand_still_means_one_transaction_after_another():
    """Django's manual mode: after a COMMIT the next statement opens the next transaction, which a
    ROLLBACK undoes (an explicit START TRANSACTION would have let it commit on its own)."""
    first, second = _sku(), _sku()
    transaction.set_autocommit(False)
    try:
        _add(first)
        transaction.commit()
        _add(second)
        assert not _seen_elsewhere(second)
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert _seen_elsewhere(first) and not _seen_elsewhere(second)
    after = _sku()
    _add(after)
    assert _seen_elsewhere(after)  # and autocommit is really back on
