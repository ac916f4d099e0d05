"""A frozen Redis (SIGSTOP, a partition) never hangs a checkout."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from shop import errors
from shop.conf import shop_settings
from shop.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_checkout_on_a_frozen_redis_fails_fast_with_a_retryable_error(private_redis, make_product, user):
    product = make_product(stock=5)
    place_order(user=user, lines=[(product.pk, 1)])  # connections to Redis are open and working
    private_redis.freeze()
    started = time.monotonic()
    with pytest.raises(errors.LockUnavailable) as caught:  # old code: ~10 s (5 s sold-out check + 5 s lock)
        place_order(user=user, lines=[(product.pk, 1)])
    elapsed = time.monotonic() - started
    assert caught.value.code == "lock_unavailable" and caught.value.status == 503
    # A failed sold-out check does not go on to wait on the lock's Redis again.
    assert elapsed < 1.5, elapsed
    assert elapsed < shop_settings.LOCK_WAIT + 1
    private_redis.resume()
    assert place_order(user=user, lines=[(product.pk, 1)]).order_id is not None  # and sales go on


def test_a_checkout_whose_redis_freezes_while_it_waits_fails_within_wait_plus_a_second(
    private_redis, make_product, user
):
    from locks import Lock
    from shop.plumbing.lock_names import product_lock

    product = make_product(stock=5)
    outcome: list = []

    def buy() -> None:
        try:
            place_order(user=user, lines=[(product.pk, 1)])
            outcome.append("placed")
        except errors.ShopError as exc:
            outcome.append(exc.code)
        finally:
            connections.close_all()

    with Lock(product_lock(product.pk), ttl=30.0):  # a holder that stays
        buyer = threading.Thread(target=buy)
        started = time.monotonic()
        buyer.start()
        time.sleep(0.5)  # the buyer is queued on the lock
        private_redis.freeze()
        buyer.join(30)
        elapsed = time.monotonic() - started
        private_redis.resume()
    assert outcome == ["lock_unavailable"]
    assert elapsed < shop_settings.LOCK_WAIT + 1, elapsed
