"""The one retry policy (shop/plumbing/retries.py) without a database: what it retries, how many
times, and the pauses between."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, OperationalError

import locks
from shop import errors
from shop.plumbing import retries
from shop.plumbing.retries import RetryPolicy


def failing(*failures: BaseException, then: object = "done"):
    """An attempt that raises `failures` in turn, then returns `then`; its calls counted."""
    calls = []

    def attempt():
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return then

    return attempt, calls


@pytest.mark.parametrize("exc,transient", [
    (OperationalError(1213, "Deadlock found"), True),
    (OperationalError(1205, "Lock wait timeout exceeded"), True),
    (OperationalError(2013, "Lost connection"), False),
    (OperationalError(), False),
    (locks.LockLost("lost", name="x"), True),
    (IntegrityError(1062, "Duplicate entry"), False),
])
def test_what_is_transient(exc, transient):
    assert retries.transient(exc) is transient


def test_a_budget_allows_max_retries_after_the_first_attempt_and_pauses_between_only(monkeypatch):
    slept = []
    monkeypatch.setattr(retries.time, "sleep", slept.append)
    tries = RetryPolicy(max_retries=2, retry_jitter=False).budget()
    assert tries.left and tries.spend() and tries.left
    assert tries.spend(pause=False) and tries.left
    assert not tries.spend() and not tries.left  # spent: no pause before giving up
    assert slept == [0.005]


def test_the_pause_grows_and_jitter_keeps_it_under_the_cap(monkeypatch):
    slept = []
    monkeypatch.setattr(retries.time, "sleep", slept.append)
    RetryPolicy(retry_backoff=0.005, retry_jitter=False).pause(3)
    RetryPolicy(retry_backoff=0.005).pause(3)
    assert slept[0] == pytest.approx(0.04) and 0 <= slept[1] <= 0.04


def test_a_call_retries_transient_failures_and_returns_the_attempts_value():
    attempt, calls = failing(OperationalError(1213, "Deadlock"), locks.LockLost("lost", name="x"))
    policy = RetryPolicy(autoretry_for=(OperationalError, locks.LockLost), max_retries=2, retry_backoff=0)
    assert policy(attempt, what="test") == "done" and len(calls) == 3


def test_a_call_gives_up_with_a_conflict_once_the_retries_are_spent():
    attempt, calls = failing(*[OperationalError(1213, "Deadlock")] * 5)
    with pytest.raises(errors.Conflict) as given_up:
        RetryPolicy(autoretry_for=(OperationalError,), max_retries=2, retry_backoff=0)(attempt, what="test")
    assert len(calls) == 3 and given_up.value.details == {"retries": 2}


@pytest.mark.parametrize("exc", [OperationalError(2013, "Lost connection"), IntegrityError(1062, "Duplicate"),
                                 locks.LockLost("lost", name="x")])
def test_a_call_raises_what_it_does_not_retry_at_once(exc):
    attempt, calls = failing(exc)
    with pytest.raises(type(exc)):
        RetryPolicy(autoretry_for=(OperationalError,), max_retries=3, retry_backoff=0)(attempt, what="test")
    assert len(calls) == 1


def test_the_shops_policies_read_shop_retries(settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "RETRIES": 4}
    assert retries.DEADLOCKS.budget().retries == retries.TRANSIENT.retries() == retries.LOST_LOCK.retries() == 4
