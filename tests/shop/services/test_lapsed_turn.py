"""A combiner whose turn lapses before it takes the queue (a long pause under load).

Its turn came (the lock handed to it, or free), then the process stopped past its lease: another
buyer took the lock and served the queue. Woken, its `take` finds the lock gone. Its own request
was never taken or written by anyone, so it queues again; the buyer never sees the lock
library's LockNotOwned (it was a 500 through the API).
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.test import Client

from locks import Lock
from shop.models import ApiToken, Order
from shop.plumbing import hooks
from shop.plumbing.lock_names import checkout_queue
from tests.helpers import make_users
from tests.locks.conftest import FORK, wait_until_queued
from tests.shop.services.test_combining import assert_books

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True, params=["lanes", "per-product"])
def _combining(request, settings):
    lanes = "auto" if request.param == "lanes" else 0
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True, "COMBINE_LANES": lanes}


def _api_buyer(token: str, product_id: int, wait: float, pause_before_take: bool, acting, queue) -> None:
    """A forked buyer ordering through the API. With `pause_before_take` it stops itself
    (SIGSTOP) the first time its turn comes, before it takes the queue."""
    django_settings.SHOP = {**django_settings.SHOP, "LOCK_WAIT": wait}
    if pause_before_take:
        def hook(at: str, holds: dict) -> None:
            if at != "before_take":
                return
            hooks.checkout_hook = None
            acting.set()
            os.kill(os.getpid(), signal.SIGSTOP)

        hooks.checkout_hook = hook
    try:
        answer = Client(raise_request_exception=False).post(
            "/api/orders/", data=json.dumps({"lines": [{"product_id": product_id, "quantity": 1}]}),
            content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        body = answer.json() if answer["Content-Type"].startswith("application/json") else {}
        queue.put((pause_before_take, answer.status_code, body.get("id") or body.get("error", {}).get("code")))
    finally:
        connections.close_all()


def test_a_combiner_paused_past_its_lease_before_taking_the_queue_queues_again(make_product):
    p = make_product(stock=100)
    tokens = [ApiToken.issue(user_id=u.pk, name="lapse") for u in make_users(4)]
    name = checkout_queue(p.pk)
    gate = Lock(name, ttl=30.0)  # buyers queue behind it in a known order; the first gets the turn
    gate.acquire()
    connections.close_all()
    queue, acting = FORK.Queue(), FORK.Event()
    procs = []
    for i, token in enumerate(tokens):
        first = i == 0
        procs.append(FORK.Process(target=_api_buyer, args=(token, p.pk, 15.0 if first else 8.0, first, acting, queue)))
        procs[-1].start()
        wait_until_queued(name, i + 1)
    gate.release()
    combiner = procs[0]
    try:
        assert acting.wait(15), "the first buyer never got its turn"
        # Stopped with its turn, nothing taken. Its lease lapses; the next in line takes the lock
        # and serves the others while it sleeps.
        others = [queue.get(timeout=15) for _ in procs[1:]]
    finally:
        os.kill(combiner.pid, signal.SIGCONT)
    # Woken, its take finds the lock gone: it queues again and is served.
    mine = queue.get(timeout=15)
    for proc in procs:
        proc.join(10)
    assert [status for _, status, _ in others] == [201] * 3, others
    assert mine[1] == 201, mine
    seen = [order_id for _, _, order_id in [*others, mine]]
    assert Order.objects.filter(lines__product=p).count() == 4
    assert_books([p.pk], {p.pk: 100}, seen)
