"""A holder paused far past its lease never stalls its product (I7).

The lease ends after LOCK_TTL and the next holder takes the lock at once; what used to stall
the product for the whole pause was the paused process's open MySQL transaction, whose InnoDB
row locks outlive the lease. Both ways of ending it are tested on the real MariaDB: the
server's `idle_transaction_timeout` (MariaDB) and the next holder's KILL of the connection
recorded with the older fence (MySQL 8 has no such timeout).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model

from shop import errors
from shop.models import Order, StockLedger
from shop.services import place_order
from tests.helpers import make_users, run_processes
from tests.shop.services.test_combining import _run_behind_combiner, assert_books

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _timed_buy(user_id: int, product_id: int) -> tuple[str, int | None, float]:
    user = get_user_model().objects.get(pk=user_id)
    started = time.monotonic()
    try:
        order_id, code = place_order(user=user, lines=[(product_id, 1)]).order_id, "placed"
    except errors.ShopError as exc:
        order_id, code = None, exc.code
    return code, order_id, time.monotonic() - started


@pytest.mark.parametrize(("mode", "pause"), [("timeout", 6.0), ("kill", 6.0), ("mysql8", 6.0)])
def test_a_holder_paused_mid_transaction_stalls_its_product_at_most_wait_plus_a_second(make_product, settings,
                                                                                      mode, pause, request):
    """MariaDB's timeout, kill mode on MariaDB, and MySQL 8 (dressed: "auto" is kill there)."""
    if mode == "mysql8":
        request.getfixturevalue("mysql8")
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True,
                     "STALE_TRANSACTIONS": "auto" if mode == "mysql8" else mode}
    wait = float(django_settings.SHOP.get("LOCK_WAIT", 3.0))
    p = make_product(stock=100)
    # The combiner stops with its batch written and the product's row locked, not committed.
    combiner, others, queue = _run_behind_combiner(p, stage="before_commit", action="pause", buyers=2)
    try:
        _check_bound(p, combiner, others, queue, wait=wait, pause=pause)
    finally:  # never leave a stopped process holding rows behind (the database flush would hang)
        if combiner.is_alive():
            os.kill(combiner.pid, signal.SIGCONT)
            combiner.join(10)
            if combiner.is_alive():
                combiner.kill()


def _check_bound(p, combiner, others, queue, *, wait: float, pause: float) -> None:
    paused_at = time.monotonic()
    assert not StockLedger.objects.filter(product=p).exists()  # written, not committed
    late = run_processes(_timed_buy, [(u.pk, p.pk) for u in make_users(4, prefix="late")], timeout=60)
    assert [code for code, _, _ in late] == ["placed"] * 4, late
    slowest = max(seconds for _, _, seconds in late)
    assert slowest <= wait + 1.0, f"a buyer waited {slowest:.2f} s behind a paused holder (limit {wait + 1:.1f} s)"
    told_others = [queue.get(timeout=15) for _ in others]
    assert [kind for kind, _ in told_others] == ["placed"] * len(others)
    assert time.monotonic() - paused_at < pause, "the buyers were served only after the pause"

    time.sleep(max(0.0, pause - (time.monotonic() - paused_at)))
    os.kill(combiner.pid, signal.SIGCONT)
    kind, combiner_order = queue.get(timeout=20)
    combiner.join(10)
    for proc in others:
        proc.join(5)
    # The paused batch's write was refused: its transaction is gone with its connection. Its own
    # buyer learns it (database_unavailable, or lock_timeout once its own wait ran out during
    # the pause: nothing written) or, having queued again, is placed by a later batch; never
    # twice, never by the paused transaction.
    assert kind in {"placed", "database_unavailable", "lock_timeout"}, kind
    seen = [oid for _, oid, _ in late] + [oid for _, oid in told_others]
    if kind == "placed":
        seen.append(combiner_order)
    assert Order.objects.filter(lines__product=p).count() == len(seen)
    assert_books([p.pk], {p.pk: 100}, seen)
