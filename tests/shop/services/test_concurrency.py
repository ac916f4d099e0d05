"""Many OS processes against one MariaDB and one Redis; the books are checked after every run."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Sum

from locks import inspect
from shop import errors
from shop.models import Coupon, CouponClaim, Order, OrderLine, Product, StockLedger
from shop.ops.invariants import check_invariants
from shop.plumbing import hooks
from shop.services import cancel_order, claim_coupon, place_order
from tests.helpers import make_users, order_of, run_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("flavour")]


def buy_until_sold_out(user_id: int, lines: list[tuple[int, int]], max_tries: int = 1000) -> dict:
    """Keep ordering until the product is sold out; report what the client saw."""
    user = get_user_model().objects.get(pk=user_id)
    placed, refused = [], 0
    for _ in range(max_tries):
        try:
            placed.append(place_order(user=user, lines=lines).order_id)
        except errors.OutOfStock:
            refused += 1
            if refused >= 3:
                break
        except (errors.LockTimeout, errors.Conflict):
            continue
    return {"placed": placed, "refused": refused}


def assert_books(product_ids, initial, seen, coupon_ids=()):
    violations = check_invariants(product_ids=product_ids, initial_stock=initial, coupon_ids=coupon_ids,
                                  seen_order_ids=seen)
    assert violations == []


def test_stampede_32_processes_sell_exactly_the_stock(make_product):
    p = make_product(stock=100)
    users = make_users(32)
    results = run_processes(buy_until_sold_out, [(u.pk, [(p.pk, 1)]) for u in users])
    seen = [o for r in results for o in r["placed"]]
    assert len(seen) == 100
    p.refresh_from_db()
    assert p.stock == 0
    assert OrderLine.objects.filter(product=p).aggregate(n=Sum("quantity"))["n"] == 100
    assert StockLedger.objects.filter(product=p).aggregate(n=Sum("quantity"))["n"] == -100
    assert_books([p.pk], {p.pk: 100}, seen)


def buy_mixed(user_id: int, product_id: int, seed: int) -> dict:
    user = get_user_model().objects.get(pk=user_id)
    rng = random.Random(seed)
    placed, refused = [], []
    for _ in range(1000):
        qty = rng.randint(1, 5)
        try:
            placed.append((qty, place_order(user=user, lines=[(product_id, qty)]).order_id))
        except errors.OutOfStock as exc:
            left = exc.details["lines"][0]["available"]
            refused.append((qty, left))
            if left == 0:
                break
        except (errors.LockTimeout, errors.Conflict):
            continue
    return {"placed": placed, "refused": refused}


def test_mixed_quantities_never_oversell(make_product):
    p = make_product(stock=300)
    users = make_users(16)
    results = run_processes(buy_mixed, [(u.pk, p.pk, i) for i, u in enumerate(users)])
    placed = [o for r in results for o in r["placed"]]
    p.refresh_from_db()
    assert p.stock == 0  # everyone kept buying until nothing was left
    assert sum(q for q, _ in placed) == 300
    assert all(requested > left for r in results for requested, left in r["refused"])
    assert_books([p.pk], {p.pk: 300}, [pk for _, pk in placed])


def buy_one_size(user_id: int, product_id: int, qty: int) -> str:
    try:
        place_order(user=get_user_model().objects.get(pk=user_id), lines=[(product_id, qty)])
        return f"placed {qty}"
    except errors.OutOfStock as exc:
        return f"refused {qty} ({exc.details['lines'][0]['available']} left)"


def test_small_orders_still_succeed_while_large_ones_fail(make_product):
    p = make_product(stock=3)
    users = make_users(16)
    outcomes = run_processes(buy_one_size, [(u.pk, p.pk, 5 if i % 2 else 1) for i, u in enumerate(users)])
    assert outcomes.count("placed 1") == 3
    assert not any(o.startswith("placed 5") for o in outcomes)
    assert sum(o.startswith("refused 5") for o in outcomes) == 8
    p.refresh_from_db()
    assert p.stock == 0


def buy_baskets(user_id: int, product_ids: list[int], seed: int) -> dict:
    user = get_user_model().objects.get(pk=user_id)
    rng = random.Random(seed)
    placed = []
    for _ in range(25):
        chosen = rng.sample(product_ids, rng.randint(2, 4))
        lines = [(pid, rng.randint(1, 3)) for pid in chosen]
        rng.shuffle(lines)  # the service must sort: callers list products in any order
        try:
            placed.append(place_order(user=user, lines=lines).order_id)
        except (errors.OutOfStock, errors.LockTimeout, errors.Conflict):
            continue
    return {"placed": placed}


def test_overlapping_multi_line_orders_no_deadlock_no_partial_order(make_product):
    products = [make_product(stock=60) for _ in range(5)]
    ids = [p.pk for p in products]
    users = make_users(12)
    results = run_processes(buy_baskets, [(u.pk, ids, i) for i, u in enumerate(users)])
    seen = [o for r in results for o in r["placed"]]
    assert seen, "no order went through"
    assert_books(ids, {p.pk: 60 for p in products}, seen)
    for order in Order.objects.filter(pk__in=seen).prefetch_related("lines"):
        assert 2 <= order.lines.count() <= 4  # whole orders only
        assert StockLedger.objects.filter(order=order).count() == order.lines.count()


def claim_twice(user_ids: list[int], code: str) -> dict:
    User = get_user_model()
    outcomes: dict[str, int] = {}
    claims = []
    for uid in user_ids:
        user = User.objects.get(pk=uid)
        for _ in range(2):
            try:
                claims.append(claim_coupon(user=user, code=code).pk)
                outcomes["claimed"] = outcomes.get("claimed", 0) + 1
            except errors.ShopError as exc:
                outcomes[exc.code] = outcomes.get(exc.code, 0) + 1
    return {"claims": claims, "outcomes": outcomes}


def test_coupon_race_200_users_claiming_twice(make_coupon):
    """Four users for each of the 50 claims, each user in two processes at once (500 users took
    twice as long and proved no more: all but the first few dozen are told `sold out`)."""
    coupon = make_coupon(total=50)
    users = make_users(200)
    # Each user appears in two processes at once, so both of their claims race.
    chunks = [[u.pk for u in users[i::10]] for i in range(10)]
    results = run_processes(claim_twice, [(chunk, coupon.code) for chunk in chunks + chunks])
    claims = [c for r in results for c in r["claims"]]
    assert len(claims) == 50
    coupon.refresh_from_db()
    assert coupon.remaining == 0
    assert CouponClaim.objects.filter(coupon=coupon).count() == 50
    assert CouponClaim.objects.filter(coupon=coupon).values("user").distinct().count() == 50
    assert check_invariants(product_ids=[], initial_stock={}, coupon_ids=[coupon.pk]) == []


def test_without_the_redis_lock_the_guarded_update_alone_prevents_oversell(make_product, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "USE_LOCKS": False}
    p = make_product(stock=50)
    users = make_users(16)
    results = run_processes(buy_until_sold_out, [(u.pk, [(p.pk, 1)]) for u in users])
    seen = [o for r in results for o in r["placed"]]
    assert len(seen) == 50
    assert inspect.acquisitions([f"product:{p.pk}"]) == {f"product:{p.pk}": 0}  # really no lock
    assert_books([p.pk], {p.pk: 50}, seen)


def pause_this_process(seconds: float) -> None:
    """A real pause of every thread (GC, SIGSTOP, a stalled VM), the lock's watchdog included."""
    me = os.getpid()
    waker = os.fork()
    if waker == 0:
        time.sleep(seconds)
        os.kill(me, signal.SIGCONT)
        os._exit(0)
    os.kill(me, signal.SIGSTOP)
    os.waitpid(waker, 0)


def buy_once_pausing_first(user_id: int, product_id: int, pause: float, queue_marker: str) -> dict:
    """The first attempt of this process stops, locks held, past the lease; then it carries on."""
    user = get_user_model().objects.get(pk=user_id)
    first_fences: list[int] = []

    def hook(stage: str, holds: dict) -> None:
        if stage == "before_update" and not first_fences:
            first_fences.append(next(iter(holds.values())).fence)
            pause_this_process(pause)  # the lease runs out (no renewals either), someone else takes the lock

    # With combining, another process may serve our order before we ever hold the lock: buy
    # until we have held it (and paused) once.
    orders = []
    hooks.checkout_hook = hook
    try:
        while not first_fences and len(orders) < 30:
            orders.append(place_order(user=user, lines=[(product_id, 1)]).order_id)
    finally:
        hooks.checkout_hook = None
    fence = StockLedger.objects.get(order_id=orders[-1]).fence
    return {"orders": orders, "stale_fence": first_fences[0], "final_fence": fence}


def buy_some(user_id: int, product_id: int, n: int) -> dict:
    user = get_user_model().objects.get(pk=user_id)
    placed = []
    for _ in range(n):
        with contextlib.suppress(errors.OutOfStock, errors.LockTimeout):
            placed.append(place_order(user=user, lines=[(product_id, 1)]).order_id)
        time.sleep(0.05)
    return {"placed": placed}


def _paused_or_busy(user_id, product_id, kind):
    if kind == "pause":
        return buy_once_pausing_first(user_id, product_id, 0.8, "")
    return buy_some(user_id, product_id, 10)


def test_a_holder_paused_past_its_ttl_is_fenced_off_and_retries(make_product, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_TTL": 0.3, "LOCK_WAIT": 5.0}
    p = make_product(stock=40)
    users = make_users(4)
    lost_before = inspect.stats_for(f"product:{p.pk}").counters["lost"]
    results = run_processes(_paused_or_busy, [(users[0].pk, p.pk, "pause")]
                            + [(u.pk, p.pk, "busy") for u in users[1:]])
    paused = results[[("stale_fence" in r) for r in results].index(True)]
    # Its first, stale attempt wrote nothing; it retried under a new lock with a newer fence.
    assert paused["final_fence"] > paused["stale_fence"]
    assert not StockLedger.objects.filter(product=p, fence=paused["stale_fence"]).exists()
    # Others wrote in between with fences newer than the stale one: the fence is what refused it.
    assert StockLedger.objects.filter(product=p, fence__gt=paused["stale_fence"],
                                      fence__lt=paused["final_fence"]).exists()
    # The lost lock is counted (in the family's row; the children flushed their stats at exit).
    assert inspect.stats_for(f"product:{p.pk}").counters["lost"] > lost_before
    seen = paused["orders"] + [o for r in results if "placed" in r for o in r["placed"]]
    assert_books([p.pk], {p.pk: 40}, seen)


def test_redis_down_means_lock_unavailable_and_nothing_written_then_recovery(user, make_product, settings,
                                                                             redis_server):
    caches = {**settings.CACHES, "locks": {**settings.CACHES["locks"], "LOCATION": redis_server.url}}
    settings.CACHES = caches
    p = make_product(stock=5)
    assert place_order(user=user, lines=[(p.pk, 1)]).order_id
    redis_server.stop()
    before = (Order.objects.count(), StockLedger.objects.count())
    for _ in range(3):
        with pytest.raises(errors.LockUnavailable) as err:
            place_order(user=user, lines=[(p.pk, 1)])
        assert err.value.status == 503 and err.value.retry_after
    assert (Order.objects.count(), StockLedger.objects.count()) == before
    p.refresh_from_db()
    assert p.stock == 4
    redis_server.start()  # same port, no app restart
    assert place_order(user=user, lines=[(p.pk, 1)]).order_id
    p.refresh_from_db()
    assert p.stock == 3


def cancel_it(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    try:
        cancel_order(order=order, actor="race")
        return "cancelled"
    except errors.OrderNotCancellable:
        return "refused"


def test_cancel_twice_concurrently_returns_stock_and_coupon_once(user, make_product, make_coupon):
    p = make_product(stock=10)
    coupon = make_coupon(total=5)
    claim_coupon(user=user, code=coupon.code)
    order = order_of(place_order(user=user, lines=[(p.pk, 3)], coupon_code=coupon.code))
    outcomes = run_processes(cancel_it, [(order.pk,)] * 6)
    assert sorted(outcomes) == ["cancelled"] + ["refused"] * 5
    p.refresh_from_db()
    assert p.stock == 10
    assert StockLedger.objects.filter(order=order, reason="cancel").count() == 1
    claim = CouponClaim.objects.get(coupon=coupon, user=user)
    assert claim.used_at is None and claim.order_id is None
    assert Coupon.objects.get(pk=coupon.pk).remaining == 4
    assert Product.objects.get(pk=p.pk).stock == 10
