"""The worker and the drops' lines on a real server (gunicorn with the shop's worker, real Redis
and MariaDB): a waiting ticket answered 202 by the worker without the app, a forged one left to
the app, arrival stamps that keep the place of buyers first told `busy`, and one product's crowd
that fills the process for its own buyers only (issue 36)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone
from django_redis import get_redis_connection

from loadtest import appservers
from locks import Lock
from shop import line
from shop.edge import overload
from shop.models import ApiToken, Product
from shop.plumbing import redis_keys, soldout
from shop.plumbing.lock_names import product_lock
from tests import helpers
from tests.config.test_gunicorn_worker_triage import _order_body, _post, exchange

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.alone]  # the queue delay is timed


def _drop(stock: int) -> Product:
    p = Product.objects.create(sku=f"WLINE-{time.time_ns()}", name="Drop", price="10.00", stock=stock,
                               opens_at=timezone.now() - timedelta(minutes=1))
    line.forget()
    return p


def _order(port: int, token: str, product_id: int, **headers: str) -> tuple[int | None, dict[str, str], dict]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    status, answer = exchange(port, _post(b"/api/orders/", _order_body(product_id), token=token, extra=extra))
    head, _, body = answer.partition(b"\r\n\r\n")
    fields = {}
    for row in head.split(b"\r\n")[1:]:
        name, _, value = row.decode("latin-1").partition(":")
        fields.setdefault(name.strip().lower(), value.strip())
    return status, fields, json.loads(body) if body else {}


def _worker_answered() -> int:
    """Waiting tickets answered by the worker itself (its counts reach Redis once a second)."""
    return overload.totals(60).get("line:worker_waiting", 0)


def _places(product: Product) -> list[int]:
    key = f"{redis_keys.line(product.pk, int(product.opens_at.timestamp()))}:places"
    return [int(u) for u in get_redis_connection("default").zrange(key, 0, -1)]


@pytest.fixture
def window_of_one(settings):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    connections.close_all()
    return appservers.server_env({"SHOP_LINE_WINDOW": "1"})


def test_the_worker_answers_a_waiting_ticket_itself_and_leaves_a_forged_one_to_the_app(window_of_one):
    p = _drop(stock=5)
    first, second = helpers.make_users(2, prefix="wticket")
    token = ApiToken.issue(user_id=second.pk, name="line")
    with appservers.running(1, workers=1, threads=4, env=window_of_one) as servers:
        port = servers[0].port
        held = line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 120)
        status, headers, answer = _order(port, token, p.pk)  # the app takes its place
        assert status == 202, answer
        shown, ticket = answer["line"], answer["line"]["ticket"]
        time.sleep(1.0)  # the worker reads the line's front 4x a second
        before = _worker_answered()
        for _ in range(5):
            status, headers, again = _order(port, token, p.pk, **{"Line-Ticket": ticket})
            assert status == 202, again
            assert again["line"] == shown  # the app's answer, from the worker's cached front
            assert headers["line-ticket"] == ticket and int(headers["retry-after"]) == shown["retry_after"]
        give_up = time.monotonic() + 10
        while _worker_answered() - before < 5 and time.monotonic() < give_up:
            time.sleep(0.2)
        assert _worker_answered() - before == 5  # the worker answered them, not the app
        # A forged ticket, or one with another account's name on it, goes on to the app: 400.
        product, drop, kind, score, account, signature, binding = ticket.split(".")
        for bad in [f"{product}.{drop}.{kind}.{score}.{account}.{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}",
                    f"{product}.{drop}.{kind}.{score}.{first.pk}.{signature}",
                    f"{product}.{drop}.{kind}.{int(score) - 1}.{account}.{signature}.{binding}"]:
            status, _, refused = _order(port, token, p.pk, **{"Line-Ticket": bad})
            assert (status, refused["error"]["code"]) == (400, "invalid_line_ticket"), refused
        time.sleep(1.5)
        assert _worker_answered() - before == 5
        # Its turn: the ticket is never trusted for admission; the app decides, and places it.
        line.finish([held], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})
        give_up = time.monotonic() + 10
        status = 202  # until the worker reads the new front (4x a second): "not yet", nothing written
        while status == 202 and time.monotonic() < give_up:
            time.sleep(0.2)
            status, _, placed = _order(port, token, p.pk, **{"Line-Ticket": ticket, "Idempotency-Key": "its-turn"})
        assert status == 201, placed


def _stall(port: int, token: str) -> socket.socket:
    """A chunked order whose body never comes: a thread reads it (and waits) until it is closed."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /api/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token.encode()
                 + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    return sock


def test_a_buyer_told_busy_first_keeps_its_place_before_one_who_came_later(window_of_one):
    """Without the line's door (as a web checkout is), a full queue answers `busy`: the stamp
    keeps the buyer's first arrival."""
    p = _drop(stock=5)
    first, early, late = helpers.make_users(3, prefix="wstamp")
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="line") for u in (early, late)}
    with appservers.running(1, workers=1, threads=1, env={**window_of_one, "SHOP_LINE_DOOR": "false"}) as servers:
        port = servers[0].port
        held = line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 120)
        time.sleep(1.0)  # the worker knows the drop's line
        stalls = [_stall(port, tokens[late.pk])]
        time.sleep(0.3)  # the one thread reads it
        stalls.append(_stall(port, tokens[late.pk]))  # queued behind it: the queue is full
        time.sleep(0.3)
        status, headers, busy = _order(port, tokens[early.pk], p.pk)  # t0: told busy by the worker
        assert (status, busy["error"]["details"]["reason"]) == (503, "queue_full"), busy
        stamp = headers["line-arrival"]
        assert headers["set-cookie"].startswith(f"line_arrival={stamp};")
        for sock in stalls:
            sock.close()
        time.sleep(1.0)
        status, _, behind = _order(port, tokens[late.pk], p.pk)  # t1 > t0, never told busy
        assert status == 202, behind
        status, _, kept = _order(port, tokens[early.pk], p.pk, **{"Line-Arrival": stamp})  # back at t2 > t1
        assert status == 202, kept
        assert _places(p) == [first.pk, early.pk, late.pk]
        assert kept["line"]["place"] == 2
        # The stamp is bound to its token: another account's request gains nothing from it.
        status, _, again = _order(port, tokens[late.pk], p.pk, **{"Line-Arrival": stamp})
        assert (status, again["line"]["place"]) == (202, 3)
        line.finish([held], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})


def _read_answer(sock: socket.socket) -> tuple[int, dict]:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_the_door_takes_a_place_while_every_thread_is_held(window_of_one):
    """Server A's only thread is held and its queue is full: an API order of the drop sent to it
    is not told `busy`, it gets its place and the API's 202 from the line's door at once; a buyer
    who comes later to the idle server B is behind it. A place the units left cannot reach is
    told sold out by the door too. Bad input and a bad token take no place: the door hands them
    back (A answers `busy`, its queue is full; B's app refuses them)."""
    p = _drop(stock=3)
    first, early, late, bad, last = helpers.make_users(5, prefix="wdoor")
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="line") for u in (early, late, bad, last)}
    with appservers.running(2, workers=1, threads=1, env=window_of_one) as servers:
        a, b = servers[0].port, servers[1].port
        held = line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 120)
        time.sleep(1.0)  # the workers know the drop's line
        stalls = [_stall(a, tokens[late.pk])]
        time.sleep(0.3)  # A's one thread reads it
        stalls.append(_stall(a, tokens[late.pk]))  # queued behind it: A's queue is full
        time.sleep(0.3)
        waiting = {}
        for name, body, token in (("bad input", b'{"lines":[{"product_id":%d,"quantity":0}]}' % p.pk, tokens[bad.pk]),
                                  ("bad token", _order_body(p.pk), "shp_not-a-token")):
            waiting[name] = socket.create_connection(("127.0.0.1", a), timeout=20)
            waiting[name].sendall(_post(b"/api/orders/", body, token=token))
        status, headers, placed = _order(a, tokens[early.pk], p.pk)
        assert status == 202 and placed["line"]["place"] == 2, placed
        assert headers["line-ticket"] == placed["line"]["ticket"] and headers["x-frame-options"] == "DENY"
        status, _, behind = _order(b, tokens[late.pk], p.pk)  # later, on the idle server
        assert (status, behind["line"]["place"]) == (202, 3), behind
        status, _, again = _order(a, tokens[early.pk], p.pk)  # a retry keeps its place
        assert (status, again["line"]["place"]) == (202, 2), again
        status, _, cut = _order(a, tokens[last.pk], p.pk)  # 3 units, 3 buyers ahead: sold out
        assert (status, cut["error"]["code"], cut["error"]["details"]["line"]["state"]) == (409, "out_of_stock", "cut")
        assert _places(p) == [first.pk, early.pk, late.pk, last.pk]
        # Handed back by the door, they find A's queue full: `busy`, as any request would.
        answers = {name: _read_answer(sock) for name, sock in waiting.items()}
        assert {name: (s, a["error"]["code"]) for name, (s, a) in answers.items()} == {
            "bad input": (503, "busy"), "bad token": (503, "busy")}
        for sock in stalls:
            sock.close()
        status, _, refused = _order(b, "shp_not-a-token", p.pk)
        assert status == 401, refused
        status, refused = exchange(b, _post(b"/api/orders/", b'{"lines":[{"product_id":%d,"quantity":0}]}' % p.pk,
                                            token=tokens[bad.pk]))
        assert status == 400, refused
        assert _places(p) == [first.pk, early.pk, late.pk, last.pk]
        line.finish([held], outcome=line.DONE, user_id=first.pk, lines={p.pk: line.config_of(p)})


def test_the_door_answers_sold_out_but_a_replay_of_the_winning_key_gets_its_order():
    p = _drop(stock=1)
    winner, loser = helpers.make_users(2, prefix="wsold")
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="line") for u in (winner, loser)}
    with appservers.running(1, workers=1, threads=2) as servers:
        port = servers[0].port
        time.sleep(1.0)  # the worker knows the drop's line: its orders go through the door
        status, _, placed = _order(port, tokens[winner.pk], p.pk, **{"Idempotency-Key": "won"})
        assert status == 201, placed
        time.sleep(0.6)  # the worker reads the sold-out markers 4x a second
        for _ in range(2):
            status, _, refused = _order(port, tokens[loser.pk], p.pk, **{"Idempotency-Key": "late"})
            assert (status, refused["error"]["code"]) == (409, "out_of_stock"), refused
            status, _, again = _order(port, tokens[winner.pk], p.pk, **{"Idempotency-Key": "won"})
            assert (status, again["id"]) == (200, placed["id"]), again
            status, _, other = _order(port, tokens[winner.pk], p.pk, **{"Idempotency-Key": "another"})
            assert (status, other["error"]["code"]) == (409, "out_of_stock"), other
    assert Product.objects.get(pk=p.pk).stock == 0


def test_a_products_crowd_fills_the_process_for_its_own_buyers_only(make_product):
    """1 worker x 4 threads: 2 buyers may wait. The hot product's lock is held, so its buyers wait
    in the process's gate; a buyer of another product is served as if nothing were going on."""
    connections.close_all()
    tokens = [ApiToken.issue(user_id=u.pk) for u in helpers.make_users(3, prefix="wgate")]
    hot, other = make_product(stock=10), make_product(stock=10)
    answers: dict[int, tuple] = {}
    with appservers.running(1, workers=1, threads=4) as servers, Lock(product_lock(hot.pk), ttl=60):
        port = servers[0].port
        buyers = [threading.Thread(target=lambda i=i: answers.update({i: _order(port, tokens[i], hot.pk)}))
                  for i in range(2)]
        for buyer in buyers:
            buyer.start()
        for _ in range(40):  # until both wait: the process's gate is full for the hot product
            time.sleep(0.05)
            status, _, answer = _order(port, tokens[2], hot.pk)
            if status == 503 and answer["error"]["details"].get("where") == "server":
                break
        assert (status, answer["error"]["details"]) == (503, {"retry_after": 1, "where": "server", "reason": "full"})
        others = [_order(port, tokens[2], other.pk)[0] for _ in range(3)]
        assert others == [201, 201, 201]
    for buyer in buyers:
        buyer.join(30)


def test_a_tokens_retries_sooner_than_told_are_held_until_then_and_freed_when_it_sells_out(window_of_one):
    """A script's retries (parallel connections, new keys, its own token) that come before the
    Retry-After the door gave it are held without a thread and answered at that time with the
    line's answer of then (one door call for all of them); a product that sells out meanwhile
    frees its held retries at once, told sold out."""
    p = _drop(stock=500)
    first, script = helpers.make_users(2, prefix="whold")
    token = ApiToken.issue(user_id=script.pk, name="line")
    config = line.config_of(p)
    until = time.monotonic() + 120
    line.join(config=config, user_id=first.pk, start=True, until=until)  # the one turn of a window of 1
    for n in range(200):  # 200 buyers ahead at the default rate (50 a second): told to come back in 4 s
        line.join(config=config, user_id=10**9 + n, start=False, until=until)
    with appservers.running(1, workers=1, threads=4, env=window_of_one) as servers:
        port = servers[0].port
        time.sleep(1.0)  # the worker knows the drop's line
        before = overload.totals(60)  # (the worker's counts reach Redis once a second: read before it counts)
        sent = time.monotonic()
        status, headers, first_answer = _order(port, token, p.pk, **{"Idempotency-Key": "s-0"})
        told = int(headers["retry-after"])
        assert status == 202 and told >= 3, first_answer
        place = first_answer["line"]["place"]
        answers: dict[int, tuple] = {}

        def retry(n: int) -> None:
            status, _, body = _order(port, token, p.pk, **{"Idempotency-Key": f"s-{n}"})
            answers[n] = (status, body, time.monotonic())

        retries = [threading.Thread(target=retry, args=(n,)) for n in (1, 2, 3)]
        for t in retries:
            t.start()
        for t in retries:
            t.join(20)
        assert {n: (s, b["line"]["place"]) for n, (s, b, _) in answers.items()} == {n: (202, place) for n in (1, 2, 3)}
        assert min(at for *_, at in answers.values()) >= sent + told - 0.05  # not before the time it was told
        assert max(at for *_, at in answers.values()) <= sent + told + 2.0  # nor long after
        time.sleep(1.5)  # the worker's counts reach Redis once a second
        after = overload.totals(60)
        assert after["door:held"] - before["door:held"] == 3
        assert after["door:answered"] - before["door:answered"] == 2  # the first, then one for the three
        assert after["door:kept"] - before["door:kept"] == 2  # the two that came with it

        # Held again (it was just told to come back later), and freed when the product sells out.
        late: dict[str, tuple] = {}
        held = threading.Thread(
            target=lambda: late.update(answer=_order(port, token, p.pk, **{"Idempotency-Key": "s-9"})))
        asked = time.monotonic()
        held.start()
        time.sleep(0.5)
        Product.objects.filter(pk=p.pk).update(stock=0)
        assert soldout.mark(p.pk, fence=10**15)
        marked = time.monotonic()
        held.join(20)
        status, _, refused = late["answer"]
        assert (status, refused["error"]["code"]) == (409, "out_of_stock"), refused
        assert time.monotonic() - marked <= 1.5 < told - (marked - asked)  # freed (the spec: 1 s), not at its time


def test_an_order_whose_turn_waits_only_for_a_lagging_door_is_held_and_placed_once_it_caught_up():
    """Another process's door says it is 400 ms behind its backlog: an order that comes now must
    not take its turn before an earlier arrival that door may still bring. Its worker holds it
    (no thread, no answer) and brings it to the door again every few tenths of a second, so once
    that door has caught up the buyer is placed in the same request, not told to come back in 1 s."""
    p = _drop(stock=5)
    (buyer,) = helpers.make_users(1, prefix="wsoon")
    token = ApiToken.issue(user_id=buyer.pk, name="line")
    config = line.config_of(p)
    with appservers.running(1, workers=1, threads=4) as servers:
        time.sleep(1.0)  # the worker knows the drop's line
        before = overload.totals(60)
        line.report_doors([config], lag_ms=400, door="slow")  # its watermark stands until it says more
        answered: dict[str, tuple] = {}
        sent = time.monotonic()
        ordering = threading.Thread(target=lambda: answered.update(
            answer=(*_order(servers[0].port, token, p.pk, **{"Idempotency-Key": "soon-1"}), time.monotonic())))
        ordering.start()
        time.sleep(0.5)
        assert "answer" not in answered  # held, not told to come back
        line.report_doors([config], lag_ms=0, door="slow")  # caught up
        ordering.join(20)
        status, _, body, at = answered["answer"]
        assert status == 201, body
        assert sent + 0.5 <= at <= sent + 1.5
        time.sleep(1.5)  # the worker's counts reach Redis once a second
        assert overload.totals(60)["door:soon"] - before.get("door:soon", 0) >= 2


def _worker(server: appservers.AppServer) -> int:
    (pid,) = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    return int(pid)


@pytest.mark.parametrize("door", ["door", "app"])
def test_a_place_is_dated_when_the_request_reached_the_machine_not_when_a_worker_read_it(window_of_one, door):
    """Server A's worker is stopped (short of CPU, behind its backlog) when buyer X's order reaches
    it; buyer Y orders 0.5 s later from idle server B and is placed at once. Once A goes on, X's
    place is before Y's: dated by the kernel's receive time, not by when A got to read it, whether
    the line's door or the app (a web checkout's path; here the door turned off) takes it."""
    p = _drop(stock=5)
    first, x, y = helpers.make_users(3, prefix="wkernel")
    tokens = {u.pk: ApiToken.issue(user_id=u.pk, name="line") for u in (x, y)}
    env = {**window_of_one, "SHOP_LINE_DOOR": "true" if door == "door" else "false"}
    with appservers.running(2, workers=1, threads=2, env=env) as servers:
        a, b = servers[0], servers[1]
        line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 120)
        time.sleep(1.0)  # the workers know the drop's line
        worker = _worker(a)
        os.kill(worker, signal.SIGSTOP)
        try:
            sock = socket.create_connection(("127.0.0.1", a.port), timeout=20)
            sock.sendall(_post(b"/api/orders/", _order_body(p.pk), token=tokens[x.pk]))
            time.sleep(0.5)
            status, _, later = _order(b.port, tokens[y.pk], p.pk)
            assert (status, later["line"]["place"]) == (202, 2), later
        finally:
            os.kill(worker, signal.SIGCONT)
        status, earlier = _read_answer(sock)
        assert status == 202 and earlier["line"]["place"] == 2, earlier
        assert _places(p) == [first.pk, x.pk, y.pk]
