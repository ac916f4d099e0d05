"""The line of a drop with real processes and real faults: many processes ordering at once, a
worker SIGKILLed in the middle of its turn, the line's Redis restarted empty, two app servers
sharing one line over HTTP, a private Redis Cluster, and a drop's crowd next to another product."""

from __future__ import annotations

import json
import math
import os
import signal
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone
from django_redis import get_redis_connection

from loadtest import appservers
from shop import errors, line
from shop.line.invariants import line_violations
from shop.models import ApiToken, Order, Product
from shop.ops.invariants import check_invariants
from shop.plumbing import redis_keys
from shop.services import place_order
from tests import helpers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _drop(stock: int, **fields) -> Product:
    n = Product.objects.count() + 1
    p = Product.objects.create(sku=f"LINE-{n}-{time.time_ns()}", name=f"Drop {n}", price="10.00", stock=stock,
                               opens_at=fields.pop("opens_at", timezone.now() - timedelta(minutes=1)), **fields)
    line.forget()
    return p


def _places(product: Product) -> list[int]:
    """The line's accounts, first place first (read from Redis, as an operator's tool would)."""
    key = f"{redis_keys.line(product.pk, int(product.opens_at.timestamp()))}:places"
    return [int(u) for u in get_redis_connection("default").zrange(key, 0, -1)]


def _buy_until_answered(product_id: int, user_ids: list[int], tickets: dict[int, str] | None = None,
                        patience: float = 90.0) -> dict[int, object]:
    """Each buyer of `user_ids` orders until it gets a final answer (its order id, or the error
    code), coming back in turn as a person would (a short pause, not the whole Retry-After)."""
    from django.contrib.auth import get_user_model

    users = {u.pk: u for u in get_user_model().objects.filter(pk__in=user_ids)}
    tickets = dict(tickets or {})
    answers: dict[int, object] = {}
    give_up = time.monotonic() + patience
    while len(answers) < len(user_ids) and time.monotonic() < give_up:
        for uid in user_ids:
            if uid in answers:
                continue
            try:
                answers[uid] = place_order(user=users[uid], lines=[(product_id, 1)],
                                           line_ticket=tickets.get(uid)).order_id
            except errors.InLine as waiting:
                tickets[uid] = waiting.details["ticket"]
            except (errors.Busy, errors.LockTimeout, errors.LockUnavailable, errors.Conflict):
                pass
            except errors.ShopError as exc:
                answers[uid] = exc.code
        time.sleep(0.02)
    return answers


def test_many_processes_at_once_the_winners_are_the_earliest_places_and_turns_follow_places(settings):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 4}
    p = _drop(stock=20)
    users = helpers.make_users(60, prefix="fair")
    groups = [[u.pk for u in users[i::6]] for i in range(6)]
    answers: dict[int, object] = {}
    for result in helpers.run_processes(_buy_until_answered, [(p.pk, g) for g in groups]):
        answers.update(result)
    assert len(answers) == 60, "every buyer got a final answer"
    winners = {uid for uid, answer in answers.items() if isinstance(answer, int)}
    assert {answer for uid, answer in answers.items() if uid not in winners} == {"out_of_stock"}
    places = _places(p)
    assert sorted(places) == sorted(u.pk for u in users)  # one place per account
    assert winners == set(places[:20]), "the first 20 places bought the 20 units"
    assert Product.objects.get(pk=p.pk).stock == 0
    assert line_violations(p) == []
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 20},
                            seen_order_ids=[a for a in answers.values() if isinstance(a, int)]) == []


def _turn_then_hang(product_id: int, user_id: int, ready) -> None:
    """A worker that took its buyer's turn and hangs before its COMMIT (then it is SIGKILLed)."""
    from django.contrib.auth import get_user_model

    from shop.plumbing import hooks
    from tests.helpers import FORK  # noqa: F401 - forked

    def hang(stage: str, holds: dict) -> None:
        if stage == "before_commit":
            ready.set()
            time.sleep(600)

    hooks.checkout_hook = hang
    place_order(user=get_user_model().objects.get(pk=user_id), lines=[(product_id, 1)])


def test_a_killed_workers_buyer_keeps_its_place_and_its_turn_lapses_so_the_line_moves_on(settings):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = _drop(stock=5)
    first, second = helpers.make_users(2, prefix="killed")
    from django.db import connections

    connections.close_all()
    ready = helpers.FORK.Event()
    worker = helpers.FORK.Process(target=_turn_then_hang, args=(p.pk, first.pk, ready))
    worker.start()
    try:
        assert ready.wait(30), "the worker did not reach its COMMIT"
        with pytest.raises(errors.InLine) as waiting:  # the first buyer's turn is open
            place_order(user=second, lines=[(p.pk, 1)])
        assert waiting.value.details["place"] == 2
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.join(10)
        if worker.is_alive():
            worker.kill()
    # The killed checkout committed nothing; its turn lapses at its deadline (+ a second) and the
    # second buyer is let through.
    answers = helpers.run_processes(_buy_until_answered, [(p.pk, [second.pk], None, 30.0)])[0]
    assert isinstance(answers[second.pk], int)
    assert Order.objects.filter(user=first).count() == 0
    # The first buyer comes back: the same place, and its turn again.
    assert _places(p) == [first.pk, second.pk]
    assert place_order(user=first, lines=[(p.pk, 1)]).order_id
    assert line.status(line.config_of(p)).lapsed == 1
    assert line_violations(p) == []
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 5}) == []


def test_a_redis_restart_mid_line_gives_nobody_a_better_place_and_oversells_nothing(settings, private_redis):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 2}
    p = _drop(stock=3)
    old = helpers.make_users(6, prefix="before")
    new = helpers.make_users(2, prefix="after")
    tickets: dict[int, str] = {}
    for user in old:
        position = line.join(config=line.config_of(p), user_id=user.pk, start=True, until=time.monotonic() + 3)
        tickets[user.pk] = position.ticket  # the first two are in the checkout, the others wait
    assert [line.Position.__name__] and _places(p) == [u.pk for u in old]
    private_redis.stop()  # the line, the locks and the markers are gone
    private_redis.start()
    # Newcomers come first; then the old buyers come back with their tickets, in any order.
    held = helpers.run_processes(_buy_until_answered, [(p.pk, [u.pk for u in new], None, 4.0)])[0]
    assert not [a for a in held.values() if isinstance(a, int)], "nobody new is let through while places come back"
    for user in reversed(old):
        with pytest.raises(errors.InLine):
            place_order(user=user, lines=[(p.pk, 1)], line_ticket=tickets[user.pk])
    assert _places(p) == [u.pk for u in old + new], "every old place before every new one, in the old order"
    groups = [[u.pk for u in old[i::3]] for i in range(3)] + [[u.pk for u in new]]
    answers = {}
    for result in helpers.run_processes(_buy_until_answered, [(p.pk, g, tickets) for g in groups]):
        answers.update(result)
    assert {uid for uid, a in answers.items() if isinstance(a, int)} == {u.pk for u in old[:3]}
    assert Product.objects.get(pk=p.pk).stock == 0 and Order.objects.filter(lines__product=p).count() == 3
    assert line_violations(p) == []
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 3}, check_locks=False) == []


def _http(url: str, token: str, body: dict, **headers: str) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"{url}/api/orders/", data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as answer:
        return answer.code, dict(answer.headers), json.loads(answer.read())


def test_two_app_servers_share_one_line_and_answer_202_with_the_place(settings):
    p = _drop(stock=5)
    first, second, third = helpers.make_users(3, prefix="http")
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="line") for u in (first, second, third)}
    body = {"lines": [{"product_id": p.pk, "quantity": 1}]}
    with appservers.running(2, workers=1, threads=4, env=appservers.server_env({"SHOP_LINE_WINDOW": "1"})) as servers:
        settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
        held = line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 120)
        status, headers, answer = _http(servers[0].url, tokens[second.pk], body, **{"Idempotency-Key": "a"})
        assert status == 202, answer
        shown = answer["line"]
        assert set(shown) >= {"product_id", "place", "ahead", "now_serving", "estimated_wait", "retry_after",
                              "ticket", "state"}
        assert (shown["state"], shown["place"], shown["ahead"], shown["now_serving"]) == ("waiting", 2, 1, 1)
        assert headers["Line-Ticket"] == shown["ticket"]
        assert int(headers["Retry-After"]) == shown["retry_after"] == max(1, min(5, math.ceil(shown["estimated_wait"])))
        # The other server, a new key: the same place. A third buyer: the next one.
        status, _, again = _http(servers[1].url, tokens[second.pk], body, **{"Idempotency-Key": "b"})
        assert (status, again["line"]["place"]) == (202, 2)
        status, _, behind = _http(servers[1].url, tokens[third.pk], body)
        assert (status, behind["line"]["place"], behind["line"]["ahead"]) == (202, 3, 2)
        # Another account's ticket is refused; its own is taken.
        status, _, refused = _http(servers[0].url, tokens[third.pk], body, **{"Line-Ticket": shown["ticket"]})
        assert (status, refused.get("error", {}).get("code")) == (400, "invalid_line_ticket"), refused
        line.finish([held], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})
        give_up, status = time.monotonic() + 10, 202
        while status == 202 and time.monotonic() < give_up:  # until the worker reads the new front
            time.sleep(0.2)
            status, _, placed = _http(servers[1].url, tokens[second.pk], body,
                                      **{"Idempotency-Key": "a", "Line-Ticket": shown["ticket"]})
        assert status == 201, placed
        status, _, replayed = _http(servers[0].url, tokens[second.pk], body, **{"Idempotency-Key": "a"})
        assert (status, replayed["id"]) == (200, placed["id"])
    assert check_invariants(product_ids=[p.pk], initial_stock={p.pk: 5}, seen_order_ids=[placed["id"]]) == []


def test_a_drops_crowd_never_makes_another_products_buyer_busy(settings):
    """One worker that lets one buyer wait at a time (SHOP_MAX_WAITING=1): the drop's crowd waits
    in its line, outside that gate, and the other product's buyer is served every time."""
    drop = _drop(stock=1000)
    other = Product.objects.create(sku=f"OTHER-{time.time_ns()}", name="Other", price="5.00", stock=1000)
    crowd = helpers.make_users(6, prefix="crowd")
    buyer = helpers.make_users(1, prefix="other")[0]
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="crowd") for u in [*crowd, buyer]}
    env = appservers.server_env({"SHOP_MAX_WAITING": "1", "SHOP_LINE_WINDOW": "2", "SHOP_QUEUE_INTERVAL": "5",
                                 "SHOP_QUEUE_TARGET": "5"})
    with appservers.running(1, workers=1, threads=8, env=env) as servers:
        url = servers[0].url
        args = [(url, tokens[u.pk], drop.pk, 6.0) for u in crowd] + [(url, tokens[buyer.pk], other.pk, 6.0)]
        results = helpers.run_processes(_order_for, args)
    crowd_statuses = [s for pid, r in results if pid == drop.pk for s in r]
    mine = next(r for pid, r in results if pid == other.pk)
    assert mine and set(mine) == {201}, f"the other product's buyer was answered {sorted(set(mine))}"
    assert 202 in crowd_statuses and 201 in crowd_statuses  # a crowd that waited in its line
    assert check_invariants(product_ids=[drop.pk, other.pk], initial_stock={drop.pk: 1000, other.pk: 1000}) == []


def _order_for(url: str, token: str, product_id: int, seconds: float) -> tuple[int, list[int]]:
    """Order one unit again and again for `seconds` (new keys), at once after each answer."""
    statuses = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        status, _, _ = _http(url, token, {"lines": [{"product_id": product_id, "quantity": 1}]})
        statuses.append(status)
    return product_id, statuses


def _one_line_through(settings) -> Product:
    """Two buyers and one turn at a time: the second waits, then buys; a third is told sold out."""
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = _drop(stock=2)
    first, second, third = helpers.make_users(3, prefix=f"ha-{p.pk}")
    held = line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 30)
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=second, lines=[(p.pk, 1)])
    assert waiting.value.details["place"] == 2
    with pytest.raises(errors.OutOfStock):
        place_order(user=third, lines=[(p.pk, 1)])  # two ahead of two units
    line.finish([held], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})
    assert place_order(user=second, lines=[(p.pk, 1)], line_ticket=waiting.value.details["ticket"]).order_id
    return p


def test_the_line_works_through_redis_sentinel(settings):
    from loadtest.servers.sentinel import SentinelSet
    from tests.locks.backends.ha import use_redis_url

    with SentinelSet() as sentinels:
        use_redis_url(settings, sentinels.url)
        _one_line_through(settings)


def test_the_line_works_on_a_redis_cluster(settings):
    from loadtest.servers.cluster import RedisClusterSet
    from tests.locks.backends.ha import use_redis_url

    with RedisClusterSet() as cluster:
        use_redis_url(settings, cluster.url)
        p = _one_line_through(settings)
        keys = [k for node in cluster.nodes if node.running for k in node.client().keys(f"*line:{{{p.pk}}}*")]
        assert keys and len({cluster.slot_of(k.decode()) for k in keys}) == 1  # one slot
