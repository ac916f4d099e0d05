"""The MySQL 8 emulation (loadtest/mysql8): MariaDB-only SQL fails as MySQL 8 would; data does not."""

from __future__ import annotations

import pytest
from django.db import OperationalError, ProgrammingError, connection

from loadtest import mysql8

pytestmark = pytest.mark.django_db


@pytest.fixture
def dressed():
    with mysql8.emulate(connection):
        yield


@pytest.mark.parametrize(("sql", "error", "code"), [
    ("SELECT 1 FROM dual WHERE 1 = 0 RETURNING 1", ProgrammingError, 1064),
    ("SELECT 'it''s', 'x\\\\' FROM dual RETURNING 1", ProgrammingError, 1064),
    ("SET SESSION idle_transaction_timeout = 5", OperationalError, 1193),
    ("SELECT * FROM information_schema.innodb_lock_waits", ProgrammingError, 1109),
])
def test_what_mysql8_lacks_is_refused(dressed, sql, error, code):
    with pytest.raises(error) as refused, connection.cursor() as cursor:
        cursor.execute(sql)
    assert refused.value.args[0] == code


@pytest.mark.parametrize(("literal", "value"), [
    ("'x RETURNING id'", "x RETURNING id"),
    ("'it\\'s RETURNING'", "it's RETURNING"),
    ("'a''RETURNING'", "a'RETURNING"),
    ('"idle_transaction_timeout"', "idle_transaction_timeout"),
    ("'information_schema.innodb_locks'", "information_schema.innodb_locks"),
])
def test_the_same_words_inside_a_literal_are_data(dressed, literal, value):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {literal}")
        assert cursor.fetchone()[0] == value
