"""The shop's lock lease: a dead holder costs at most about a second, a slow one keeps its lock."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from shop.conf import shop_settings
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import check_before_commit, held
from shop.services import place_order
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)

FORK = multiprocessing.get_context("fork")


def _die_holding(name: str, holding) -> None:
    with held([name]):
        holding.set()
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_holder_stalls_the_product_for_less_than_the_wait(make_product, user):
    """A gunicorn worker killed holding a product lock (timeout, OOM): the next buyer still buys."""
    product = make_product(stock=5)
    holding = FORK.Event()
    proc = FORK.Process(target=_die_holding, args=(product_lock(product.pk), holding))
    proc.start()
    assert holding.wait(10)
    proc.join(5)
    started = time.monotonic()
    order = order_of(place_order(user=user, lines=[(product.pk, 1)]))  # old 5 s lease, 3 s wait: lock_timeout
    stalled = time.monotonic() - started
    assert order.pk is not None
    assert stalled < shop_settings.LOCK_WAIT, stalled


def test_a_slow_holder_keeps_its_lock_past_the_lease():
    """The lease is short, so a long hold (a slow COMMIT, a big order) lives on renewals."""
    name = product_lock(10**9)
    with held([name]) as holds:
        time.sleep(shop_settings.LOCK_TTL * 2.5)
        check_before_commit(holds)  # LockLost if the lease had run out
