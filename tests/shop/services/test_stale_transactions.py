"""The ways a paused holder's MySQL transaction is ended, their checks and their failure modes."""

from __future__ import annotations

import MySQLdb
import pytest
from django.core import checks
from django.db import connection

from shop.services import stale_transactions

pytestmark = pytest.mark.django_db(transaction=True)


def _check_ids(settings, value) -> list[str]:
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": value}
    return [m.id for m in checks.run_checks(tags=["database"], databases=["default"]) if m.id.startswith("shop.")]


def test_auto_on_mariadb_uses_the_server_timeout_and_check_is_quiet(settings):
    assert connection.mysql_is_mariadb
    assert _check_ids(settings, "auto") == []
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "auto"}
    assert stale_transactions.prepare_connection() == "timeout"
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.idle_transaction_timeout")
        assert cursor.fetchone()[0] == stale_transactions.timeout_seconds()


def test_check_names_a_bad_value_the_off_switch_and_kill_mode(settings):
    assert _check_ids(settings, "sometimes") == ["shop.E001"]
    assert _check_ids(settings, "off") == ["shop.W001"]
    assert _check_ids(settings, "kill") == ["shop.W002"]


@pytest.fixture
def limited_user():
    """A second MySQL user without CONNECTION_ADMIN: it may kill only its own connections."""
    with connection.cursor() as cursor:
        cursor.execute("DROP USER IF EXISTS 'shop_limited'@'127.0.0.1'")
        cursor.execute("CREATE USER 'shop_limited'@'127.0.0.1' IDENTIFIED BY 'pw'")
    yield "shop_limited"
    with connection.cursor() as cursor:
        cursor.execute("DROP USER IF EXISTS 'shop_limited'@'127.0.0.1'")


def test_a_refused_kill_is_logged_and_leaves_the_old_behaviour(settings, limited_user, caplog):
    """KILL of another user's connection without the privilege: error 1095, logged, not raised."""
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "kill"}
    stale_transactions.prepare_connection()
    victim = connection.connection.thread_id()  # root's connection, recorded as an older holder

    class Hold:
        name, fence = "product:stale-test", 10

    db = connection.settings_dict
    limited = MySQLdb.connect(host="127.0.0.1", port=int(db["PORT"] or 3306), user=limited_user, passwd="pw")
    try:
        stale_transactions._client().lpush(stale_transactions._key(Hold.name), f"5 {victim}")
        stale_transactions._recorded.holds = {Hold.name: Hold}
        connection.connection, own = limited, connection.connection
        try:
            assert stale_transactions.end_older_holders() == 0
        finally:
            connection.connection = own
        assert "refused (error 1095)" in caplog.text
        with connection.cursor() as cursor:  # the root connection is alive
            cursor.execute("SELECT 1")
    finally:
        limited.close()
        stale_transactions._client().delete(stale_transactions._key(Hold.name))
