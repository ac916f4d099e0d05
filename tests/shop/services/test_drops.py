"""Scheduled drops: the window service (schedule, move, end, clear; its refusals write nothing),
and the checkout deciding "on sale" under the row lock, exactly at the window's edges, with the
sold-out marker, per-buyer caps and combining working as ever inside it. Real MariaDB and Redis;
the edges are crossed by several processes at once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from django.template import defaulttags
from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.models import DropLog, Order, OrderLine, Product, StockLedger
from shop.ops.invariants import check_invariants
from shop.plumbing import hooks, soldout
from shop.services import clear_drop, end_drop, place_order, schedule_drop
from shop.services.drops import parse_time
from tests.helpers import make_users, run_processes

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = "admin:ops"


def window(p: Product, *, opens_in: float | None = None, closes_in: float | None = None) -> Product:
    """Give `p` a window relative to now, straight in the row (the service refuses past closes)."""
    now = timezone.now()
    Product.objects.filter(pk=p.pk).update(
        opens_at=None if opens_in is None else now + timedelta(seconds=opens_in),
        closes_at=None if closes_in is None else now + timedelta(seconds=closes_in))
    p.refresh_from_db()
    return p


def nothing_written(*products: Product) -> bool:
    ids = [p.pk for p in products]
    return not (Order.objects.exists() or OrderLine.objects.exists()
                or StockLedger.objects.filter(product_id__in=ids).exists())


# --- the service: schedule, move, end, clear ---------------------------------------------------
def test_schedule_gives_every_product_the_window_and_logs_who_did_it(make_product):
    a, b, other = make_product(), make_product(), make_product()
    opens = timezone.now() + timedelta(hours=2)
    closes = opens + timedelta(hours=1)
    changed = schedule_drop(products=[b, a], opens_at=opens, closes_at=closes, actor=ACTOR)
    assert [p.pk for p in changed] == sorted([a.pk, b.pk])
    assert all((p.opens_at, p.closes_at, p.drop_state, p.on_sale) == (opens, closes, "upcoming", False)
               for p in changed)
    other.refresh_from_db()
    assert (other.opens_at, other.closes_at, other.on_sale) == (None, None, True)  # untouched
    log = list(DropLog.objects.order_by("product_id"))
    assert [(e.product_id, e.action, e.opens_at, e.closes_at, e.actor) for e in log] == [
        (a.pk, "schedule", opens, closes, ACTOR), (b.pk, "schedule", opens, closes, ACTOR)]

    later = opens + timedelta(days=1)  # moving the drop moves every product named
    moved = schedule_drop(products=[a, b], opens_at=later, closes_at=None, actor="cli:me@host")
    assert {(p.opens_at, p.closes_at) for p in moved} == {(later, None)}
    assert DropLog.objects.filter(actor="cli:me@host", action="schedule").count() == 2


@pytest.mark.parametrize("case", ["closes before opens", "closes at opens", "closes in the past", "naive time"])
def test_a_window_that_cannot_be_is_refused_and_nothing_is_written(make_product, case):
    p = make_product()
    now = timezone.now()
    opens, closes = {
        "closes before opens": (now + timedelta(hours=2), now + timedelta(hours=1)),
        "closes at opens": (now + timedelta(hours=2), now + timedelta(hours=2)),
        "closes in the past": (None, now - timedelta(seconds=1)),
        "naive time": (datetime(2030, 1, 1, 10, 0), None),
    }[case]
    with pytest.raises(errors.InvalidDropWindow) as refused:
        schedule_drop(products=[p], opens_at=opens, closes_at=closes, actor=ACTOR)
    assert refused.value.code == "invalid_drop_window" and refused.value.status == 400
    p.refresh_from_db()
    assert (p.opens_at, p.closes_at) == (None, None) and not DropLog.objects.exists()


def test_an_unknown_product_refuses_the_whole_call(make_product):
    known, gone = make_product(), make_product()
    Product.objects.filter(pk=gone.pk).delete()
    with pytest.raises(errors.UnknownProduct) as refused:
        schedule_drop(products=[known, gone], opens_at=timezone.now() + timedelta(hours=1), closes_at=None,
                      actor=ACTOR)
    assert refused.value.details == {"product_ids": [gone.pk]}
    known.refresh_from_db()
    assert known.opens_at is None and not DropLog.objects.exists()
    with pytest.raises(errors.InvalidInput):
        end_drop(products=[], actor=ACTOR)


def test_the_database_refuses_a_window_that_closes_before_it_opens(make_product):
    """The CHECK constraint behind the service (equal is allowed: a drop called off before it opened)."""
    from django.db import IntegrityError

    p = make_product()
    now = timezone.now()
    Product.objects.filter(pk=p.pk).update(opens_at=now, closes_at=now)
    with pytest.raises(IntegrityError):
        Product.objects.filter(pk=p.pk).update(opens_at=now, closes_at=now - timedelta(seconds=1))


def test_end_now_ends_an_open_sale_calls_off_an_upcoming_one_and_leaves_an_ended_one(make_product):
    running, windowless, upcoming, ended = make_product(), make_product(), make_product(), make_product()
    window(running, opens_in=-60, closes_in=3600)
    window(upcoming, opens_in=3600, closes_in=7200)
    window(ended, opens_in=-7200, closes_in=-3600)
    before = timezone.now()
    changed = {p.pk: p for p in end_drop(products=[running, windowless, upcoming, ended], actor=ACTOR)}
    after = timezone.now()
    assert all(changed[p.pk].drop_state == "ended" and not changed[p.pk].on_sale
               for p in (running, windowless, upcoming, ended))
    assert before <= changed[running.pk].closes_at <= after and changed[running.pk].opens_at == running.opens_at
    assert before <= changed[windowless.pk].closes_at <= after and changed[windowless.pk].opens_at is None
    assert changed[upcoming.pk].opens_at == changed[upcoming.pk].closes_at  # an empty window: never on sale
    assert changed[ended.pk].closes_at == ended.closes_at  # not moved later
    assert set(DropLog.objects.values_list("product_id", "action", "actor")) == {
        (running.pk, "end", ACTOR), (windowless.pk, "end", ACTOR), (upcoming.pk, "end", ACTOR)}


def test_clear_puts_a_product_back_on_sale_whenever_active(make_product):
    p = window(make_product(), opens_in=3600)
    [cleared] = clear_drop(products=[p], actor=ACTOR)
    assert (cleared.opens_at, cleared.closes_at, cleared.on_sale) == (None, None, True)
    assert DropLog.objects.get().action == "clear"


@pytest.mark.parametrize(("text", "expected"), [
    ("2030-12-01 10:00", datetime(2030, 12, 1, 10, 0, tzinfo=UTC)),  # the shop's zone (tests: UTC)
    ("2030-12-01T10:00:30+02:00", datetime(2030, 12, 1, 8, 0, 30, tzinfo=UTC)),
    ("2030-12-01T10:00Z", datetime(2030, 12, 1, 10, 0, tzinfo=UTC)),
])
def test_times_are_read_in_the_shops_zone_unless_they_carry_an_offset(text, expected):
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["tomorrow", "2030-13-01 10:00", "", "10:00"])
def test_a_time_that_cannot_be_read_is_a_typed_error(text):
    with pytest.raises(errors.InvalidDropWindow) as refused:
        parse_time(text)
    assert "2026-12-01 10:00" in refused.value.message  # says how to write it


def test_now_is_now():
    assert abs((parse_time("now") - timezone.now()).total_seconds()) < 1


# --- the checkout: refused outside the window, nothing written ------------------------------------
@pytest.mark.usefixtures("flavour")
def test_before_it_opens_an_order_is_refused_not_open_yet_and_nothing_is_written(user, make_product):
    p = window(make_product(stock=5), opens_in=3600, closes_in=7200)
    with pytest.raises(errors.NotOpenYet) as refused:
        place_order(user=user, lines=[(p.pk, 1)])
    error = refused.value
    assert (error.code, error.status) == ("not_open_yet", 409)
    assert error.details == {"product_ids": [p.pk], "opens_at": p.opens_at.isoformat()}
    assert 3590 <= error.retry_after <= 3600
    assert "opens " + p.opens_at.strftime("%Y-%m-%d %H:%M") in error.message
    p.refresh_from_db()
    assert p.stock == 5 and nothing_written(p)


@pytest.mark.usefixtures("flavour")
def test_after_it_closes_an_order_is_refused_sale_ended_and_nothing_is_written(user, make_product):
    p = window(make_product(stock=5), opens_in=-7200, closes_in=-60)
    with pytest.raises(errors.SaleEnded) as refused:
        place_order(user=user, lines=[(p.pk, 1)])
    assert (refused.value.code, refused.value.status) == ("sale_ended", 409)
    assert refused.value.details == {"product_ids": [p.pk], "closes_at": p.closes_at.isoformat()}
    p.refresh_from_db()
    assert p.stock == 5 and nothing_written(p)


def test_a_cart_names_the_lines_not_open_and_a_hidden_product_comes_first(user, make_product):
    open_, soon, later = make_product(), make_product(), make_product()
    window(soon, opens_in=600)
    window(later, opens_in=1200)
    with pytest.raises(errors.NotOpenYet) as refused:
        place_order(user=user, lines=[(open_.pk, 1), (soon.pk, 1), (later.pk, 1)])
    later.refresh_from_db()
    assert refused.value.details == {"product_ids": [soon.pk, later.pk], "opens_at": later.opens_at.isoformat()}
    hidden = make_product(active=False)
    with pytest.raises(errors.InactiveProduct):  # to shoppers: unknown (errors.as_seen_by)
        place_order(user=user, lines=[(soon.pk, 1), (hidden.pk, 1)])
    assert nothing_written(open_, soon, later, hidden)


def test_inside_the_window_it_sells_and_the_order_is_stamped_inside_it(user, make_product):
    p = window(make_product(stock=5), opens_in=-1, closes_in=60)
    receipt = place_order(user=user, lines=[(p.pk, 2)])
    order = Order.objects.get(pk=receipt.order_id)
    assert p.opens_at <= order.created_at < p.closes_at
    assert order.pay_by == order.created_at + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))


def test_a_sale_that_closes_while_its_order_is_written_commits_nothing(user, make_product):
    """The window is checked again just before COMMIT: a writer that decided inside the window
    but reaches its COMMIT after the close (a slow batch, a pause) rolls back and is refused."""
    p = window(make_product(stock=5), opens_in=-60, closes_in=0.4)
    paused = []

    def pause(stage: str, holds: dict) -> None:
        if stage == "before_commit" and not paused:
            paused.append(timezone.now())
            time.sleep(max(0.0, (p.closes_at - timezone.now()).total_seconds()) + 0.05)

    hooks.checkout_hook = pause
    try:
        with pytest.raises(errors.SaleEnded):
            place_order(user=user, lines=[(p.pk, 1)])
    finally:
        hooks.checkout_hook = None
    assert paused and paused[0] < p.closes_at  # it was decided inside the window
    p.refresh_from_db()
    assert p.stock == 5 and nothing_written(p)


# --- the sold-out marker, caps and combining inside the window -----------------------------------
@pytest.mark.usefixtures("flavour")
def test_a_product_is_never_marked_sold_out_before_it_opens_and_is_once_it_sells_out_inside(user, other_user,
                                                                                          make_product):
    empty = window(make_product(stock=0), opens_in=3600)
    with pytest.raises(errors.NotOpenYet):
        place_order(user=user, lines=[(empty.pk, 1)])
    assert soldout.sold_out([empty.pk]) == set()  # "sold out" would be the wrong answer until it opens

    p = window(make_product(stock=2), opens_in=-1, closes_in=60)
    place_order(user=user, lines=[(p.pk, 2)])
    assert soldout.sold_out([p.pk]) == {p.pk}  # inside the window: marked as ever
    with pytest.raises(errors.OutOfStock):
        place_order(user=other_user, lines=[(p.pk, 1)])


@pytest.mark.usefixtures("flavour")
def test_the_per_buyer_cap_holds_inside_the_window_and_the_window_is_answered_first_outside(user, make_product):
    p = window(make_product(stock=10), opens_in=-1, closes_in=60)
    Product.objects.filter(pk=p.pk).update(max_per_user=2)
    place_order(user=user, lines=[(p.pk, 2)])
    with pytest.raises(errors.PurchaseLimitExceeded):
        place_order(user=user, lines=[(p.pk, 1)])
    Product.objects.filter(pk=p.pk).update(closes_at=timezone.now())
    with pytest.raises(errors.SaleEnded):  # past the close: the window, not the cap
        place_order(user=user, lines=[(p.pk, 1)])


def _buy_across_the_window(user_ids: list[int], product_ids: list[int], until: float) -> list[tuple]:
    """Order one unit at a time, in turn, until `until` (unix time); each attempt as
    (outcome, product, asked at, answered at), in unix time, the clock the checkout stamps with."""
    users = list(get_user_model().objects.filter(pk__in=user_ids))
    seen, n = [], 0
    while time.time() < until:
        user, pid = users[n % len(users)], product_ids[n % len(product_ids)]
        n += 1
        asked = time.time()
        try:
            outcome = place_order(user=user, lines=[(pid, 1)]).order_id
        except (errors.NotOpenYet, errors.SaleEnded, errors.OutOfStock, errors.LockTimeout, errors.Busy,
                errors.Conflict) as exc:
            outcome = exc.code
        seen.append((outcome, pid, asked, time.time()))
    return seen


@pytest.mark.slow
@pytest.mark.usefixtures("flavour")
def test_eight_processes_across_the_opening_and_closing_edges_write_no_order_outside_the_window(make_product):
    """Buyers in 8 processes (combined, in lanes) order before, during and after a 1.5 s window.
    No order is stamped outside it (compared in the database, with the time the checkout read
    under the row lock and stamped on the order); a refusal `not_open_yet` went only to a request
    asked before the opening, `sale_ended` only to one answered after the close, and every order
    to a request asked before the close and answered after the opening. The small product sells
    out inside the window exactly; the books balance."""
    big, small = make_product(stock=100_000), make_product(stock=30)
    opens = timezone.now() + timedelta(seconds=1.5)
    closes = opens + timedelta(seconds=1.5)
    schedule_drop(products=[big, small], opens_at=opens, closes_at=closes, actor=ACTOR)
    users = make_users(16)
    until = closes.timestamp() + 0.5
    results = run_processes(_buy_across_the_window, [([u.pk for u in users[i::8]], [big.pk, small.pk], until)
                                                    for i in range(8)])
    attempts = [a for r in results for a in r]
    placed = [a for a in attempts if isinstance(a[0], int)]
    o, c = opens.timestamp(), closes.timestamp()

    outside = Order.objects.filter(Q(created_at__lt=opens) | Q(created_at__gte=closes))
    assert not outside.exists(), list(outside.values_list("id", "created_at"))
    assert Order.objects.count() == len(placed) > 30
    assert all(asked < c and answered >= o for _, _, asked, answered in placed)
    assert all(asked < o for outcome, _, asked, _ in attempts if outcome == "not_open_yet")
    assert all(answered >= c for outcome, _, _, answered in attempts if outcome == "sale_ended")
    codes = {a[0] for a in attempts if not isinstance(a[0], int)}
    assert {"not_open_yet", "sale_ended"} <= codes  # both edges were crossed
    assert OrderLine.objects.filter(product=small).count() == 30  # sold out inside the window, not beyond
    small.refresh_from_db()
    assert small.stock == 0
    violations = check_invariants(product_ids=[big.pk, small.pk], initial_stock={big.pk: 100_000, small.pk: 30},
                                  seen_order_ids=[a[0] for a in placed])
    assert violations == []


# --- one clock: the database's ----------------------------------------------------------------
def db_now() -> datetime:
    """The database's clock, the one that decides drop windows (a query of its own)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        return cursor.fetchone()[0].replace(tzinfo=UTC)


def skew_app_clock(seconds: float, patch: Callable = setattr) -> None:
    """Make this process an app server whose clock runs `seconds` ahead of the database's (behind
    if negative): the wall clock Django reads (timezone.now, the templates' {% now %}) and the
    shop's errors read. `patch`: monkeypatch.setattr in a test's own process."""
    real_now, delta = timezone.now, timedelta(seconds=seconds)

    class Skewed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + delta

    patch(timezone, "now", lambda: real_now() + delta)
    patch(defaulttags, "datetime", Skewed)
    patch(errors, "datetime", Skewed)


def _buy_as_a_skewed_server(skew: float, user_ids: list[int], product_id: int, until: datetime) -> list[tuple]:
    """An app server whose clock is `skew` seconds off orders one unit at a time until `until`
    (database time); each attempt as (outcome, Retry-After or None, database time before, after)."""
    skew_app_clock(skew)
    users = list(get_user_model().objects.filter(pk__in=user_ids))
    seen, n = [], 0
    while (before := db_now()) < until:
        user, n = users[n % len(users)], n + 1
        try:
            outcome, retry = place_order(user=user, lines=[(product_id, 1)]).order_id, None
        except (errors.NotOpenYet, errors.SaleEnded, errors.LockTimeout, errors.Busy, errors.Conflict) as exc:
            outcome, retry = exc.code, exc.retry_after
        seen.append((outcome, retry, before, db_now()))
    return seen


@pytest.mark.slow
@pytest.mark.usefixtures("flavour")
def test_two_servers_whose_clocks_disagree_sell_only_inside_the_window_by_the_database_clock(make_product):
    """Two app servers, one 2 s fast and one 2 s slow, order across a 1.5 s window set by the
    database's clock. No order is committed before the opening or after the close by that clock
    (each attempt is bracketed by database times), none is stamped outside it, `not_open_yet` and
    `sale_ended` go only to attempts on their side of the edges, and Retry-After counts to the
    opening by the database's clock, not by the server's."""
    p = make_product(stock=100_000)
    opens = db_now() + timedelta(seconds=2.5)
    closes = opens + timedelta(seconds=1.5)
    Product.objects.filter(pk=p.pk).update(opens_at=opens, closes_at=closes)
    users = make_users(8)
    until = closes + timedelta(seconds=2.5)
    servers = run_processes(_buy_as_a_skewed_server, [(+2.0, [u.pk for u in users[:4]], p.pk, until),
                                                      (-2.0, [u.pk for u in users[4:]], p.pk, until)])
    for seen in servers:  # the fast one and the slow one alike
        placed = [(before, after) for outcome, _, before, after in seen if isinstance(outcome, int)]
        assert placed, "each server sold inside the window"
        assert all(after >= opens for _, after in placed), "an order committed before the opening"
        assert all(before < closes for before, _ in placed), "an order committed after the close"
        refused = {outcome: [(r, b, a) for outcome_, r, b, a in seen if outcome_ == outcome]
                   for outcome in ("not_open_yet", "sale_ended")}
        assert refused["not_open_yet"] and refused["sale_ended"]  # each server crossed both edges
        assert all(before < opens for _, before, _ in refused["not_open_yet"])
        assert all(after >= closes for _, _, after in refused["sale_ended"])
        slack = 0.25  # the clock's reading between two queries' times, not exactly on them (the skews are 2 s)
        assert all(math.floor((opens - after).total_seconds() - slack) <= retry
                   <= math.ceil((opens - before).total_seconds() + slack)
                   for retry, before, after in refused["not_open_yet"])
    outside = Order.objects.filter(Q(created_at__lt=opens) | Q(created_at__gte=closes))
    assert not outside.exists(), list(outside.values_list("id", "created_at"))


def _end_as_a_skewed_server(skew: float, product_id: int) -> tuple[datetime, datetime, datetime]:
    """"End sale now" from an app server whose clock is `skew` seconds off: (database time before,
    the close it stamped, database time after)."""
    skew_app_clock(skew)
    before = db_now()
    [ended] = end_drop(products=[Product.objects.get(pk=product_id)], actor=ACTOR)
    return before, ended.closes_at, db_now()


@pytest.mark.parametrize("skew", [+30.0, -30.0])
def test_end_now_from_a_server_whose_clock_is_off_closes_at_the_database_clocks_time(make_product, skew):
    p = make_product(stock=5)
    [(before, closes, after)] = run_processes(_end_as_a_skewed_server, [(skew, p.pk)])
    assert before <= closes <= after
    assert DropLog.objects.get(product=p).closes_at == closes


def _hold_the_row_or_buy(role: str, product_id: int, user_id: int) -> object:
    """"hold": lock the product's row for a second in a transaction of its own, then the database
    time just before it lets go; "buy": order it meanwhile, the order's id."""
    if role == "buy":
        time.sleep(0.3)  # the row is held by then
        return place_order(user=get_user_model().objects.get(pk=user_id), lines=[(product_id, 1)]).order_id
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT id FROM shop_product WHERE id = %s FOR UPDATE", [product_id])
        time.sleep(1.0)
        released = db_now()
        cursor.execute("COMMIT")
    return released


@pytest.mark.usefixtures("flavour")
def test_an_order_is_stamped_with_the_database_time_its_row_was_locked_not_when_it_asked(user, make_product):
    """The writer's SELECT ... FOR UPDATE may wait for a row (End sale now, a restock) that is
    changed meanwhile: the time it decides with is read once the lock is granted, so it is never
    older than a change committed before it (the statement's own start would be)."""
    p = make_product(stock=5)
    results = run_processes(_hold_the_row_or_buy, [("hold", p.pk, user.pk), ("buy", p.pk, user.pk)])
    [released] = [r for r in results if isinstance(r, datetime)]
    [order_id] = [r for r in results if isinstance(r, int)]
    assert Order.objects.get(pk=order_id).created_at >= released
