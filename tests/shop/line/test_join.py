"""The line of a drop, one process at a time: places, turns, the cut, the pre-queue, tickets,
against the real Redis and MariaDB (the multi-process tests are in test_line_processes.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from shop import errors, line
from shop.line import redis_clock, tickets
from shop.models import Product
from shop.services import place_order
from shop.services.lines import line_places
from tests import helpers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_users(db):
    return helpers.make_users




def test_a_short_line_lets_a_buyer_through_at_once(user, drop):
    p = drop(stock=3)
    receipt = place_order(user=user, lines=[(p.pk, 1)])
    assert receipt.order_id
    state = line.status(line.config_of(p))
    assert (state.places, state.waiting, state.in_turn, state.finished) == (1, 0, 0, 1)


def test_a_full_window_answers_in_line_with_place_ahead_estimate_and_ticket(settings, user, other_user, drop,
                                                                              django_user_model):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    first = helpers.take_turn(p, user.pk)
    assert first.state == line.STARTED and first.place == 1
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=other_user, lines=[(p.pk, 1)])
    details = waiting.value.details
    assert details["state"] == "waiting" and details["place"] == 2 and details["ahead"] == 1
    assert details["now_serving"] == 1 and details["product_id"] == p.pk
    assert details["estimated_wait"] > 0 and waiting.value.retry_after == details["retry_after"] >= 1
    ticket = tickets.read(details["ticket"], user_id=other_user.pk)
    assert ticket is not None and ticket.product_id == p.pk and ticket.kind == tickets.PLACE
    assert tickets.read(details["ticket"], user_id=user.pk) is None  # another account's: refused
    assert tickets.not_yet(ticket, first.serving) and tickets.not_yet(ticket, line.now_serving(line.config_of(p)))
    # The first buyer is answered: the second one's turn has come.
    line.finish([first], outcome=line.DONE, user_id=user.pk, lines={p.pk: line.config_of(p)})
    assert not tickets.not_yet(ticket, line.now_serving(line.config_of(p)))  # a front door would let it in
    assert place_order(user=other_user, lines=[(p.pk, 1)]).order_id


def test_one_place_per_account_whatever_the_key_or_how_often(settings, user, other_user, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    helpers.take_turn(p, user.pk)
    places = set()
    for key in ["k-1", "k-2", None, "k-3"]:
        with pytest.raises(errors.InLine) as waiting:
            place_order(user=other_user, lines=[(p.pk, 1)], idempotency_key=key)
        places.add(waiting.value.details["place"])
    assert places == {2}
    assert line.status(line.config_of(p)).places == 2


def test_a_place_the_units_left_cannot_reach_is_told_sold_out_at_once(settings, make_users, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=2)
    first, second, third, fourth = make_users(4, prefix="cut")
    started = helpers.take_turn(p, first.pk)  # reads the units: 2
    assert started.state == line.STARTED
    with pytest.raises(errors.InLine):
        place_order(user=second, lines=[(p.pk, 1)])  # one ahead, two units: it may still buy
    with pytest.raises(errors.OutOfStock) as cut:
        place_order(user=third, lines=[(p.pk, 1)])  # two ahead, two units
    assert cut.value.details["line"] == {"product_id": p.pk, "place": 3, "state": "cut"}
    assert cut.value.details["lines"] == [{"product_id": p.pk, "requested": 1, "available": 0}]
    with pytest.raises(errors.OutOfStock):
        place_order(user=fourth, lines=[(p.pk, 1)])  # behind the cut
    # The first buyer leaves without buying, the second buys: everyone before the cut was
    # answered and a unit is left, so the cut is lifted and the earliest place goes first.
    line.finish([started], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})
    assert place_order(user=second, lines=[(p.pk, 1)]).order_id
    with pytest.raises(errors.InLine):
        place_order(user=fourth, lines=[(p.pk, 1)])  # third is let through first
    assert place_order(user=third, lines=[(p.pk, 1)]).order_id
    with pytest.raises(errors.OutOfStock) as sold_out:
        place_order(user=fourth, lines=[(p.pk, 1)])
    assert "line" not in sold_out.value.details  # the marker: sold out for every place


def test_once_sold_out_every_waiting_place_is_told_so_on_its_next_request(settings, make_users, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 2}
    p = drop(stock=2)
    buyers = make_users(8, prefix="soldout")
    waiting = []
    for buyer in buyers:
        try:
            place_order(user=buyer, lines=[(p.pk, 1)])
        except (errors.InLine, errors.OutOfStock) as answer:
            waiting.append((buyer, answer))
    assert Product.objects.get(pk=p.pk).stock == 0
    for buyer, _ in waiting:
        with pytest.raises(errors.OutOfStock):
            place_order(user=buyer, lines=[(p.pk, 1)])


def test_a_replay_of_the_winning_key_returns_its_order_after_the_sell_out(user, make_users, drop):
    p = drop(stock=1)
    won = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="winner")
    loser = make_users(1, prefix="replay")[0]
    with pytest.raises(errors.OutOfStock):
        place_order(user=loser, lines=[(p.pk, 1)], idempotency_key="loser")
    again = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="winner")
    assert again.replayed and again.order_id == won.order_id


def test_a_forged_altered_or_other_accounts_ticket_is_refused_and_counted(settings, user, other_user, drop):
    from shop.ops import metrics

    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    helpers.take_turn(p, user.pk)
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=other_user, lines=[(p.pk, 1)])
    good = waiting.value.details["ticket"]
    product, drop_, kind, score, account, signature = good.split(".")
    altered = f"{product}.{drop_}.{kind}.{int(score) - 10_000_000}.{account}.{signature}"  # an earlier place
    before = metrics.LINE_TICKETS_REFUSED._value.get()
    for bad in [altered, good[:-2] + "xx", "garbage", f"{p.pk}.1.p.1.AAAA"]:
        with pytest.raises(errors.InvalidLineTicket):
            place_order(user=other_user, lines=[(p.pk, 1)], line_ticket=bad)
    with pytest.raises(errors.InvalidLineTicket):  # the ticket is this account's, not the first's
        place_order(user=user, lines=[(p.pk, 1)], line_ticket=good)
    assert metrics.LINE_TICKETS_REFUSED._value.get() - before == 5
    with pytest.raises(errors.InLine) as again:  # its own ticket: the same place
        place_order(user=other_user, lines=[(p.pk, 1)], line_ticket=good)
    assert again.value.details["place"] == 2


def test_before_the_pre_queue_an_order_is_refused_not_open_yet_without_the_line(user, drop):
    p = drop(opens_at=timezone.now() + timedelta(hours=1), line_prequeue_seconds=60)
    with pytest.raises(errors.NotOpenYet) as refused:
        place_order(user=user, lines=[(p.pk, 1)])
    assert refused.value.details == {"product_ids": [p.pk], "opens_at": p.opens_at.isoformat()}
    assert line.status(line.config_of(p)).prequeue == 0


@pytest.mark.parametrize("order", ["fifo", "shuffle"])
def test_the_pre_queue_takes_the_first_places_at_the_opening_in_order_or_shuffled(order, make_users, drop):
    opens = timezone.now() + timedelta(seconds=3)
    p = drop(stock=100, opens_at=opens, line_prequeue_seconds=60, line_order=order)
    early = make_users(50, prefix=f"early-{order}")
    for buyer in early:
        with pytest.raises(errors.InLine) as queued:
            place_order(user=buyer, lines=[(p.pk, 1)])
        assert queued.value.details["state"] == "pre_queue" and queued.value.details["opens_at"] == opens.isoformat()
        assert queued.value.details["place"] is None and queued.value.retry_after <= 5
    assert line.status(line.config_of(p)).prequeue == 50
    time.sleep(max(0.0, (opens - timezone.now()).total_seconds()) + 0.05)
    late = make_users(1, prefix=f"late-{order}")[0]
    config = line.config_of(p)
    first_after = line.join(config=config, user_id=late.pk, start=False, until=time.monotonic() + 5)
    places = [line.join(config=config, user_id=b.pk, start=False, until=time.monotonic() + 5).place for b in early]
    assert first_after.place == 51  # after every member of the pre-queue, though it opened the line
    assert sorted(places) == list(range(1, 51))
    if order == "fifo":
        assert places == list(range(1, 51))
    else:
        assert places != list(range(1, 51))  # 1 chance in 50! of a false alarm


def test_the_web_checkout_shows_the_place_and_sends_the_order_again_by_itself(settings, client, user, other_user,
                                                                               drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    helpers.take_turn(p, other_user.pk)
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    response = client.post("/checkout/", {"idempotency_key": key})
    page = response.content.decode()
    assert response.status_code == 202 and 1 <= int(response["Retry-After"]) <= 5
    assert "You are number 2 in line, with 1 ahead of you" in page and 'id="line-status"' in page
    assert response.context["form"].initial["idempotency_key"] == key  # the same order, sent again


def test_a_cart_goes_on_when_it_is_its_turn_in_every_line_and_keeps_the_turns_it_got(settings, user, other_user,
                                                                                      drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    a, b = drop(stock=5), drop(stock=5)
    held = helpers.take_turn(b, other_user.pk)
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)])
    assert waiting.value.details["product_id"] == b.pk
    assert line.status(line.config_of(a)).in_turn == 1  # its turn in a's line is kept, not counted
    assert line.status(line.config_of(a)).finished == 0
    line.finish([held], outcome=line.DONE, user_id=other_user.pk, lines={b.pk: line.config_of(b)})
    assert place_order(user=user, lines=[(a.pk, 1), (b.pk, 1)]).order_id
    assert (line.status(line.config_of(a)).finished, line.status(line.config_of(b)).finished) == (1, 2)


def test_a_late_registered_earlier_arrival_the_units_cannot_reach_is_told_alone(settings, drop):
    """The door registers a place as of its arrival, which may be before buyers already let
    through: if the units cannot reach it, it is told sold out, and the line's cut does not fall
    behind anyone let through (L2 holds)."""
    from shop.line.invariants import line_violations

    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 8}
    p = drop(stock=2)
    config = line.config_of(p)
    early_ms = int(time.time() * 1000) - 50  # arrived before both, registered after them
    first, second, late = helpers.make_users(3, prefix="lateplace")
    let = [line.join(config=config, user_id=u.pk, start=False, until=time.monotonic() + 30) for u in (first, second)]
    assert [x.state for x in let] == [line.ADMITTED, line.ADMITTED]
    found = line.join(config=config, user_id=late.pk, start=False, until=time.monotonic() + 30, arrived_ms=early_ms)
    assert found.state == line.CUT and found.score < let[0].score
    assert line.status(config).cut is None
    assert line_violations(Product.objects.get(pk=p.pk)) == []


def test_an_arrival_given_on_redis_clock_is_dated_by_it_whenever_its_call_reaches_redis(settings, drop):
    """The door dates each arrival on Redis's clock (`redis_clock.offset`): places follow those
    arrivals, not the order or the moment their calls ran (a batch that waited, a pipeline behind
    others), and a date after Redis's now counts as now."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=10)
    config = line.config_of(p)
    first, a, b, c = helpers.make_users(4, prefix="redisclock")
    line.join(config=config, user_id=first.pk, start=True, until=time.monotonic() + 30)
    time.sleep(0.1)  # the others arrive after it
    now_us = int((time.monotonic() + redis_clock.offset()) * 1_000_000)
    now_ms = int(time.time() * 1000)
    joined = {}
    for user, age_us in ((a, 30_000), (b, 40_000), (c, -5_000_000)):  # b came before a; c "in the future"
        joined[user.pk] = line.join(config=config, user_id=user.pk, start=False, until=time.monotonic() + 30,
                                    arrived_ms=now_ms, arrived_us=now_us - age_us)
    assert joined[b.pk].score == now_us - 40_000 and joined[a.pk].score == now_us - 30_000
    assert joined[b.pk].place == 2 and line.status(config).waiting == 3
    assert now_us < joined[c.pk].score <= int((time.monotonic() + redis_clock.offset()) * 1_000_000) + 1000
    assert line_places(product=p) == [first.pk, b.pk, a.pk, c.pk]


def test_redis_clock_reads_redis_time_with_the_smallest_round_trip():
    offset = redis_clock.offset()
    seconds, micros = line.client().time()
    assert abs(seconds + micros / 1e6 - (time.monotonic() + offset)) < 0.05


def _door_join(config, user, *, age_us: int, lag_ms: int | None = None, door: str = "") -> line.Position:
    """A door's join: an arrival `age_us` ago, told by `door` with its lag."""
    now_ms = int(time.time() * 1000)
    now_us = int((time.monotonic() + redis_clock.offset()) * 1_000_000)
    return line.join_many([line.Joining(config=config, user_id=user.pk, start=False, until=time.monotonic() + 30,
                                        arrived_ms=now_ms, arrived_us=now_us - age_us, lag_ms=lag_ms,
                                        door=door)])[0]


def test_while_a_door_lags_turns_wait_for_the_earlier_arrivals_still_at_it(settings, drop):
    """Door 1, 400 ms behind its backlog, registers A (who came 400 ms ago) and lets it through.
    B comes now, to a quick door 2: only places older than door 1's watermark are let through, so
    B waits instead of taking the last unit at once. Then door 1 registers C, who came before B,
    and says it caught up: C is let through first and B, behind the 2 units, is told so: first
    come, first served."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 8, "LINE_SETTLE_FROM": 0.05}
    p = drop(stock=2)
    config = line.config_of(p)
    a, b, c = helpers.make_users(3, prefix="settle")
    assert _door_join(config, a, age_us=400_000, lag_ms=400, door="d1").state == line.ADMITTED
    assert _door_join(config, b, age_us=0, lag_ms=0, door="d2").state == line.WAITING  # younger than d1's mark
    early = _door_join(config, c, age_us=300_000, lag_ms=350, door="d1")  # d1 still holds one from 350 ms ago
    assert early.state == line.WAITING and early.place == 2  # before B, and still behind d1's mark
    line.report_doors([config], lag_ms=0, door="d1")  # d1's queue is empty
    assert _door_join(config, b, age_us=0).state == line.CUT  # C was let through first: no unit can reach B
    assert _door_join(config, c, age_us=0).state == line.ADMITTED


def test_a_lagging_doors_watermark_stands_until_it_says_more_not_as_the_clock_moves(settings, drop):
    """A door that said it was 300 ms behind and then went quiet (stopped, starved of CPU) may
    still hold arrivals from before its watermark: later places wait for it, however long, until
    it says more or its watermark lapses (DOOR_LIVE, 2 s: a door that died)."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 8, "LINE_SETTLE_FROM": 0.05}
    p = drop(stock=5)
    config = line.config_of(p)
    a, b = helpers.make_users(2, prefix="quietdoor")
    assert _door_join(config, a, age_us=400_000, lag_ms=300, door="stopped").state == line.ADMITTED
    time.sleep(0.5)  # B came 350 ms ago: after the mark, though 300 ms is long past
    assert _door_join(config, b, age_us=350_000, lag_ms=0, door="quick").state == line.WAITING
    time.sleep(1.8)  # the quiet door's mark lapses
    assert _door_join(config, b, age_us=0, lag_ms=0, door="quick").state == line.ADMITTED


def test_a_door_that_caught_up_holds_nothing_back(settings, drop):
    """The worker's door says it caught up when its queue empties (`door.Watermarks.caught_up`):
    its lag then holds nothing back."""
    from shop.line import door

    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 8, "LINE_SETTLE_FROM": 0.05}
    p = drop(stock=5)
    config = line.config_of(p)
    a, b = helpers.make_users(2, prefix="caughtup")
    marks = door.Watermarks(name="w1")
    assert _door_join(config, a, age_us=400_000, lag_ms=300, door="w1").state == line.ADMITTED
    marks.told[p.pk] = (time.monotonic(), 300, config)
    assert _door_join(config, b, age_us=0, lag_ms=0, door="w2").state == line.WAITING
    marks.caught_up()
    assert _door_join(config, b, age_us=0, lag_ms=0, door="w2").state == line.ADMITTED
    assert marks.told[p.pk][1] == 0


def test_without_a_lagging_door_turns_go_at_once(settings, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 8, "LINE_SETTLE_FROM": 0.05}
    p = drop(stock=2)
    config = line.config_of(p)
    a, b = helpers.make_users(2, prefix="nosettle")
    for user in (a, b):  # doors 10 ms behind (below LINE_SETTLE_FROM): a quiet drop is not held back
        found = line.join_many([line.Joining(config=config, user_id=user.pk, start=False,
                                             until=time.monotonic() + 30, lag_ms=10)])[0]
        assert found.state == line.ADMITTED


def test_the_drain_rate_counts_the_time_since_the_opening_not_whole_seconds(settings, drop):
    """The estimate a waiting buyer is told comes from the line's drain rate. A line opened late
    in a second that then finished 20 turns in a fifth of a second drains at about 100 a second,
    not 20 (its finished turns over a whole second): an estimate five times too long told the
    last places of a drop to come back in 5 s, and the units waited for them (sale tails)."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=100)
    config = line.config_of(p)
    users = helpers.make_users(23, prefix="rate")
    redis = line.client()
    while not 0.80 <= (frac := redis.time()[1] / 1e6) <= 0.84:  # open the line late in a second
        time.sleep(max(0.001, (0.80 - frac) % 1.0))
    opened = time.monotonic()
    for user in users[:20]:
        taken = helpers.take_turn(p, user.pk)
        line.finish([taken], outcome=line.DONE, user_id=user.pk, lines={p.pk: config})
    seconds = redis.time()[0]
    while redis.time()[0] == seconds:  # into the next second: the last one holds all 20
        time.sleep(0.005)
    helpers.take_turn(p, users[20].pk)
    waiting = line.join(config=config, user_id=users[21].pk, start=False, until=time.monotonic() + 30)
    elapsed = time.monotonic() - opened
    assert waiting.state == line.WAITING
    assert elapsed < 0.5 and waiting.rate >= 20 / 0.5, (elapsed, waiting.rate)
    front = line.fronts([config])[p.pk]  # the worker's "not yet" answer estimates alike
    assert front.rate >= 20 / 0.5, front.rate


def test_a_lines_first_turn_does_not_make_the_estimate_of_the_ones_behind_long(settings, drop):
    """One turn finished a few ms after the opening says little about how fast the line drains:
    the estimate leans on LINE_DEFAULT_RATE until the line has shown its own."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1, "LINE_DEFAULT_RATE": 50.0}
    p = drop(stock=100)
    config = line.config_of(p)
    first, second, third = helpers.make_users(3, prefix="prior")
    taken = helpers.take_turn(p, first.pk)
    line.finish([taken], outcome=line.DONE, user_id=first.pk, lines={p.pk: config})
    helpers.take_turn(p, second.pk)
    waiting = line.join(config=config, user_id=third.pk, start=False, until=time.monotonic() + 30)
    assert waiting.state == line.WAITING and waiting.rate >= 25, waiting.rate
    assert line.fronts([config])[p.pk].rate >= 25
