"""Sold-out markers never outlive the stock they describe."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
from django.db import connections

from shop import errors
from shop.conf import shop_settings
from shop.plumbing import soldout
from shop.services import place_order, restock
from tests.helpers import order_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("flavour")]

FORK = multiprocessing.get_context("fork")


def _buy_and_pause_before_marking(product_id: int, user_id: int, queue) -> None:
    """Buy a sold-out product; just before writing the sold-out marker, stop this process (a GC
    pause, SIGSTOP) until the parent continues it."""
    from django.contrib.auth import get_user_model
    from django.db import connections

    real_mark = soldout.mark

    def paused_mark(*args, **kwargs):
        queue.put("marking")
        os.kill(os.getpid(), signal.SIGSTOP)
        return real_mark(*args, **kwargs)

    soldout.mark = paused_mark
    try:
        place_order(user=get_user_model().objects.get(pk=user_id), lines=[(product_id, 1)])
        queue.put("placed")
    except errors.ShopError as exc:
        queue.put(exc.code)
    except BaseException as exc:
        queue.put(repr(exc))
        raise
    finally:
        connections.close_all()


def _get(queue, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while queue.empty():
        assert time.monotonic() < deadline, "the buyer process never answered"
        time.sleep(0.01)
    return queue.get()


def test_a_holder_paused_past_its_lease_cannot_mark_a_restocked_product_sold_out(
    make_product, user, other_user
):
    product = make_product(stock=0)
    queue = FORK.SimpleQueue()  # written synchronously: the writer stops right after
    connections.close_all()  # the child must not share the parent's MySQL connection
    proc = FORK.Process(target=_buy_and_pause_before_marking, args=(product.pk, user.pk, queue))
    proc.start()
    try:
        assert _get(queue) == "marking"  # it read stock 0 under the lock, then paused
        restock(product=product, quantity=5, actor="operator")  # waits out the paused lease
        os.kill(proc.pid, signal.SIGCONT)
        assert _get(queue) == "out_of_stock"  # its own answer was right when it read
        proc.join(10)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    started = time.monotonic()
    order = order_of(place_order(user=other_user, lines=[(product.pk, 1)]))  # old code: out_of_stock for 300 s
    assert order.pk is not None
    assert time.monotonic() - started < shop_settings.LOCK_WAIT
    assert not soldout.sold_out([product.pk])


def test_a_product_sold_out_under_the_lock_is_marked_and_a_restock_clears_it(make_product, user):
    product = make_product(stock=1)
    place_order(user=user, lines=[(product.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(product.pk, 1)])  # reads 0 under the lock: marks
    assert soldout.sold_out([product.pk]) == {product.pk}
    restock(product=product, quantity=2, actor="operator")
    assert soldout.sold_out([product.pk]) == set()
    assert place_order(user=user, lines=[(product.pk, 1)]).order_id is not None
