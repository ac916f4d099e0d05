"""The shop's one clock (shop/plumbing/clock.py): the database's, read without a round trip from an offset
to this process's monotonic clock. It agrees with the database whatever the app server's wall
clock says, a reading slowed down does not spoil a better one, and a database that cannot be
reached keeps the last reading. Real MariaDB; the app's clock is faked, the database's is not."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.db import OperationalError, connection

from loadtest.servers.base import free_port
from shop.plumbing import clock
from tests.shop.services.test_drops import db_now, skew_app_clock

pytestmark = pytest.mark.django_db(transaction=True)  # the database-gone tests close the connection


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch):
    """This test's own readings (the module's are put back after it)."""
    monkeypatch.setattr(clock, "_reading", None)
    monkeypatch.setattr(clock, "_tried", -clock.REFRESH)


def _read_again(monkeypatch) -> None:
    monkeypatch.setattr(clock, "_tried", time.monotonic() - clock.REFRESH)


def _within(when: datetime, before: datetime, after: datetime, slack: float) -> bool:
    return before - timedelta(seconds=slack) <= when <= after + timedelta(seconds=slack)


@pytest.mark.parametrize("skew", [+3600.0, -90.0])
def test_now_is_the_databases_time_whatever_the_app_servers_clock_says(monkeypatch, skew):
    skew_app_clock(skew, monkeypatch.setattr)
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + skew)
    before = db_now()
    now = clock.now()
    after = db_now()
    assert _within(now, before, after, clock.uncertainty())
    assert 0 <= clock.uncertainty() < 0.5


def _slow(execute, sql, params, many, context):
    time.sleep(0.3)  # the query and its answer take 0.3 s, as on a loaded server
    return execute(sql, params, many, context)


def test_a_slow_reading_does_not_replace_a_better_one(monkeypatch):
    clock.now()
    good = clock.uncertainty()
    _read_again(monkeypatch)
    before = db_now()
    with connection.execute_wrapper(_slow):
        now = clock.now()  # read again, slowly
    after = db_now()
    assert clock.uncertainty() < good + 0.01  # the better reading stays (plus its drift)
    assert _within(now, before, after, clock.uncertainty())


def test_a_slow_first_reading_is_used_and_says_how_far_off_it_may_be():
    with connection.execute_wrapper(_slow):
        before = db_now()
        now = clock.now()
        after = db_now()
    assert 0.15 <= clock.uncertainty() < 1.0
    assert _within(now, before, after, clock.uncertainty())


@pytest.fixture
def database_gone():
    """This thread's connection points at a port nothing listens on (restored after)."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    yield
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)


def test_a_database_that_cannot_be_reached_keeps_the_last_reading(monkeypatch, request, caplog):
    clock.now()
    reading = clock._reading
    _read_again(monkeypatch)
    request.getfixturevalue("database_gone")
    clock.now()  # tries, fails, goes on with the last reading
    assert clock._reading == reading
    assert "Can't connect" in caplog.text and "the reading of 0 s ago stays" in caplog.text
    tried = clock._tried
    clock.now()  # and does not try again at once (each try costs a connect attempt)
    assert clock._tried == tried


def test_with_no_reading_yet_a_database_that_cannot_be_reached_is_an_error(database_gone):
    with pytest.raises(OperationalError):
        clock.now()
