"""A drop's crowd (loadtest/drop.py): the figures on small made-up results, then one tiny drop
against a real server (gunicorn with the shop's worker, the real MariaDB and Redis)."""

from __future__ import annotations

import json

import pytest
from django.db import connections

from loadtest import appservers, drop, openloop, report
from loadtest.drop import GAVE_UP, LOST, PERSON, SCRIPT, WON, Attempt, Record
from shop.models import ApiToken, Order, Product


def rec(index: int, kind: str, arrival: float, result: str, final_at: float | None = None,
        first_status: int = 409) -> Record:
    return Record(index, kind, arrival, arrival, result, final_at, first_status)


# --- the crowd -------------------------------------------------------------------------------------
def test_the_crowd_arrives_evenly_over_the_window_in_a_shuffled_order_of_kinds():
    buyers = drop.crowd(people=30, scripts=10, arrival_seconds=2.0, seed=1)
    assert [b.index for b in buyers] == list(range(40))
    assert [b.arrival for b in buyers] == [2.0 * i / 40 for i in range(40)]
    kinds = [b.kind for b in buyers]
    assert kinds.count(PERSON) == 30 and kinds.count(SCRIPT) == 10
    assert kinds != sorted(kinds, key=lambda k: k != PERSON)  # not all the people first
    assert drop.crowd(people=30, scripts=10, arrival_seconds=2.0, seed=1) == buyers  # the seed decides


def test_a_pre_queue_spreads_the_arrivals_before_the_opening():
    buyers = drop.crowd(people=8, scripts=2, arrival_seconds=1.0, prequeue_seconds=10.0)
    assert buyers[0].arrival == -10.0 and max(b.arrival for b in buyers) == -1.0


def test_a_load_is_a_multiple_of_the_capacity_split_in_the_ratio_of_people_to_scripts():
    assert drop.split_load(4, 250.0, 1.0, people=3000, scripts=500) == (857, 143)
    assert drop.split_load(10, 300.0, 2.0, people=1, scripts=0) == (6000, 0)


# --- the answers -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "code", "final"), [
    (201, "", True), (200, "", True), (409, "out_of_stock", True), (409, "purchase_limit", True),
    (404, "unknown_product", True), (409, "not_open_yet", False), (503, "busy:server:queue", False),
    (202, "", False), (429, "rate_limited", False), (500, "500", False),
])
def test_which_answers_end_a_persons_trying(status, code, final):
    assert drop.is_final(status, code) is final


def test_retry_after_in_seconds_and_one_second_when_unreadable():
    assert drop.retry_after({"retry-after": "3"}) == 3.0
    assert drop.retry_after({"retry-after": "0.5"}) == 0.5
    assert drop.retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) == drop.NO_RETRY_AFTER


def test_a_person_keeps_every_cookie_it_is_given_and_drops_an_emptied_one():
    jar = {"old": "1", "gone": "x"}
    head = ("HTTP/1.1 202 Accepted\r\nSet-Cookie: line=abc; Path=/; HttpOnly\r\nRetry-After: 2\r\n"
            "set-cookie: place=42; Max-Age=60\r\nSet-Cookie: gone=; Max-Age=0")
    drop.set_cookies(head, jar)
    assert jar == {"old": "1", "line": "abc", "place": "42"}


def test_a_persons_request_sends_back_its_cookies_and_line_ticket():
    raw = drop._request(host="h:1", product_id=7, token="t", key="k", cookies={"a": "1", "b": "2"},
                        ticket="T.42").decode()
    assert "Cookie: a=1; b=2\r\n" in raw and "Line-Ticket: T.42\r\n" in raw and "Idempotency-Key: k\r\n" in raw
    bare = drop._request(host="h:1", product_id=7, token="t", key="k").decode()
    assert "Cookie" not in bare and "Line-Ticket" not in bare
    assert json.loads(bare.split("\r\n\r\n", 1)[1]) == {"lines": [{"product_id": 7, "quantity": 1}]}


# --- the buyers, against a small server of the test's own -------------------------------------------
def _buy_from(answer: bytes | list[bytes], delay: float, plan_kw: dict, buyers: list[drop.Buyer],
              heard: list[bytes] | None = None):
    """Run the buyers (in this process) against a loopback server that answers each request with
    `answer` (or the next of a list, the last one again when it runs out) after `delay` s; their
    records and attempts. The requests' heads go to `heard`."""
    import asyncio
    import time

    answers = answer if isinstance(answer, list) else [answer]
    heard = [] if heard is None else heard

    async def main():
        async def serve(reader, writer):
            heard.append(await reader.readuntil(b"\r\n\r\n"))
            await asyncio.sleep(delay)
            writer.write(answers[min(len(heard), len(answers)) - 1])
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        plan = drop.DropPlan(url=f"http://127.0.0.1:{port}", product_id=1, units=1, buyers=buyers,
                             tokens=["t"] * len(buyers), run_id="r", **plan_kw)
        async with server:
            return await drop._buy(plan, buyers, time.monotonic() + 0.05)

    return asyncio.run(main())


PLACED_ANSWER = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 9\r\n"
                 b"Connection: close\r\n\r\n{\"id\": 5}")


def test_a_buyer_out_of_patience_still_hears_the_answer_it_is_waiting_for():
    """Patience ends the trying, not an attempt under way: cut before the server's deadline, its
    order would be counted as one the buyer never saw."""
    buyers = [drop.Buyer(0, PERSON, 0.0), drop.Buyer(1, SCRIPT, 0.0)]
    records, attempts = _buy_from(PLACED_ANSWER, 0.6, {"patience": 0.2, "answer_wait": 3.0}, buyers)
    assert sorted((r.kind, r.result) for r in records) == [(PERSON, WON), (SCRIPT, WON)]
    assert all(a.status == 201 and a.order_id == 5 and a.answered - a.sent >= 0.5 for a in attempts)
    assert len([a for a in attempts if a.buyer == 1]) == drop.SCRIPT_INFLIGHT


def test_a_person_waits_as_told_and_brings_back_its_cookies_and_line_ticket():
    in_line = (b"HTTP/1.1 202 Accepted\r\nRetry-After: 0.3\r\nSet-Cookie: line=p7; Path=/\r\n"
               b"Line-Ticket: T.7\r\nContent-Type: application/json\r\nContent-Length: 34\r\n"
               b"Connection: close\r\n\r\n{\"line\": {\"place\": 7, \"ahead\": 6}}")
    heard: list[bytes] = []
    records, attempts = _buy_from([in_line, PLACED_ANSWER], 0.0, {"patience": 5.0},
                                  [drop.Buyer(0, PERSON, 0.0)], heard)
    assert [(r.result, r.first_status) for r in records] == [(WON, 202)]
    assert [a.status for a in attempts] == [202, 201] and attempts[0].retry_after == "0.3"
    assert 0.3 <= attempts[1].sent - attempts[0].answered <= 0.3 + drop.JITTER + 0.2
    first, second = (h.decode() for h in heard)
    assert "Cookie" not in first and "Line-Ticket" not in first
    assert "Cookie: line=p7\r\n" in second and "Line-Ticket: T.7\r\n" in second
    assert first.split("Idempotency-Key: ")[1].split("\r\n")[0] == "dp-r-0" == \
        second.split("Idempotency-Key: ")[1].split("\r\n")[0]  # one key for all of a person's tries


def test_a_script_ignores_retry_after_and_uses_a_new_key_for_every_attempt():
    busy = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: application/json\r\n"
            b"Content-Length: 27\r\nConnection: close\r\n\r\n{\"error\": {\"code\": \"busy\"}}")
    heard: list[bytes] = []
    records, _ = _buy_from([busy] * 9 + [PLACED_ANSWER], 0.0, {"patience": 4.0},
                                  [drop.Buyer(0, SCRIPT, 0.0)], heard)
    assert [r.result for r in records] == [WON]
    assert records[0].final_at < 2.0  # not after 5 s: Retry-After is not obeyed
    keys = [h.decode().split("Idempotency-Key: ")[1].split("\r\n")[0] for h in heard]
    assert len(keys) == len(set(keys)) >= 10


def test_an_attempt_waits_at_most_answer_wait_then_the_person_gives_up():
    records, attempts = _buy_from(PLACED_ANSWER, 2.0, {"patience": 0.2, "answer_wait": 0.3},
                                  [drop.Buyer(0, PERSON, 0.0)])
    assert [r.result for r in records] == [GAVE_UP]
    assert [(a.status, a.code) for a in attempts] == [(0, "TimeoutError")]


# --- the figures -----------------------------------------------------------------------------------
def test_fifo_share_counts_the_winners_among_the_first_arrivals():
    records = [rec(0, PERSON, 0.0, WON, 0.1), rec(1, PERSON, 0.1, LOST, 0.3), rec(2, SCRIPT, 0.2, WON, 0.3),
               rec(3, PERSON, 0.3, WON, 0.4), rec(4, PERSON, 0.4, LOST, 0.5)]
    assert drop.fifo_share(records, 2) == pytest.approx(1 / 3)  # first two: 0 and 1; winners 0, 2, 3
    assert drop.fifo_share(records, 4) == 1.0
    assert drop.fifo_share([rec(0, PERSON, 0.0, LOST, 1.0)], 1) is None


def test_fifo_share_goes_by_when_buyers_really_arrived_not_their_index():
    records = [rec(0, PERSON, 0.5, WON, 0.6), rec(1, PERSON, 0.1, LOST, 0.9)]
    assert drop.fifo_share(records, 1) == 0.0


def test_places_in_arrival_order_and_winners_in_place_order_split_the_fifo_share():
    records = [rec(0, PERSON, 0.0, LOST, 0.4), rec(1, PERSON, 0.1, WON, 0.3), rec(2, SCRIPT, 0.2, WON, 0.3),
               rec(3, PERSON, 0.3, LOST, 0.4)]
    placed = [1, 2, 0, 3]  # buyer 0 was stamped after 1 and 2
    assert drop.placed_in_arrival_order(records, placed, 2) == 0.5  # of arrivals 0, 1: only 1 has a first place
    assert drop.won_in_place_order(records, placed, 2) == 1.0  # the line served its first two places
    assert drop.fifo_share(records, 2) == 0.5
    assert drop.won_in_place_order(records, [0, 1, 2, 3], 2) == 0.5  # buyer 2 was served before place 1
    assert drop.placed_in_arrival_order(records, [], 2) is None
    assert drop.won_in_place_order(records, [], 2) is None


def test_script_advantage_is_the_scripts_win_rate_over_the_peoples():
    records = ([rec(i, PERSON, 0.0, WON if i < 2 else LOST, 1.0) for i in range(10)]
               + [rec(10 + i, SCRIPT, 0.0, WON if i < 2 else LOST, 1.0) for i in range(5)])
    assert drop.win_rate(records, PERSON) == 0.2 and drop.win_rate(records, SCRIPT) == 0.4
    assert drop.advantage(records) == pytest.approx(2.0)
    assert drop.advantage([r for r in records if r.kind == SCRIPT]) is None
    assert drop.advantage([rec(0, PERSON, 0, LOST, 1), rec(1, SCRIPT, 0, WON, 1)]) is None  # people never won


def test_time_to_the_final_answer_apart_by_kind_and_result():
    records = [rec(0, PERSON, 1.0, WON, 1.5), rec(1, PERSON, 0.0, LOST, 4.0), rec(2, PERSON, 0.0, LOST, 2.0),
               rec(3, PERSON, 0.0, GAVE_UP), rec(4, SCRIPT, 0.0, LOST, 3.0)]
    assert drop.time_to_final(records, kind=PERSON, result=WON) == [0.5]
    assert sorted(drop.time_to_final(records, kind=PERSON, result=LOST)) == [2.0, 4.0]
    assert drop.p50_p99([2.0, 4.0]) == (2.0, 4.0)
    assert drop.p50_p99(list(range(1, 101))) == (50, 99)
    assert drop.p50_p99([]) == (None, None)


def attempt(buyer: int, sent: float, answered: float | None, status: int, code: str = "",
            order_id: int | None = None) -> Attempt:
    outcome = openloop.classify(status, json.dumps({"id": order_id} if order_id else
                                                   {"error": {"code": code}}).encode())[0] if status else "conn_error"
    return Attempt(buyer, f"k{buyer}", sent, answered, status, outcome, code, order_id)


def test_sales_requests_per_unit_answers_and_goodput():
    attempts = [attempt(0, 0.0, 0.2, 201, order_id=1), attempt(1, 0.1, 0.3, 503, "busy:server:queue"),
                attempt(1, 1.2, 1.4, 201, order_id=2), attempt(0, 1.3, 1.5, 200, order_id=1),
                attempt(2, 0.5, None, 0), attempt(3, 1.0, 2.2, 201, order_id=3),
                attempt(4, 2.0, 2.1, 409, "out_of_stock")]
    sold_at = drop.sales(attempts)
    assert sold_at == [0.2, 1.4, 2.2]  # one time per order: the replay is not a sale
    assert drop.requests_per_unit(attempts, len(sold_at)) == pytest.approx(7 / 3)
    assert drop.requests_per_unit(attempts, 0) is None
    assert drop.answers(attempts) == {"200": 1, "201": 3, "409 out_of_stock": 1, "503 busy:server:queue": 1,
                                      "no answer": 1}
    told = [Attempt(0, "k", 0.0, 0.1, 503, openloop.BUSY, "busy", retry_after=after) for after in ("1", "12", "1")]
    assert drop.retry_afters([*told, *attempts]) == {"1": 2, "12": 1}
    assert drop.goodput(sold_at) == pytest.approx(2 / 2.0)
    assert drop.goodput([0.2]) is None
    first = drop.first_second(attempts, sold_at)
    assert first == {"units": 1, "sent": 3, "p50": pytest.approx(0.2), "p99": pytest.approx(0.2)}


def test_losers_told_within_a_second_of_the_last_sale_and_people_who_waited_then_won():
    records = [rec(0, PERSON, 0.0, LOST, 2.5), rec(1, PERSON, 0.0, LOST, 3.5), rec(2, SCRIPT, 0.0, LOST, 2.9),
               rec(3, PERSON, 0.0, WON, 2.0, first_status=503), rec(4, PERSON, 0.0, WON, 2.0, first_status=201),
               rec(5, SCRIPT, 0.0, WON, 1.0, first_status=503), rec(6, PERSON, 0.0, GAVE_UP, None, 503)]
    assert drop.losers_told_within(records, 2.0, 1.0) == pytest.approx(2 / 3)
    assert drop.losers_told_within(records, None, 1.0) is None
    assert drop.waited_then_won(records) == 1  # people only


def test_send_lag_is_how_late_the_first_request_went():
    records = [Record(0, PERSON, 0.0, 0.01, LOST, 1.0, 409), Record(1, PERSON, 0.5, 0.7, LOST, 1.0, 409),
               Record(2, SCRIPT, 0.9, None, GAVE_UP, None, 0)]
    assert drop.send_lag(records) == (pytest.approx(0.01), pytest.approx(0.2), pytest.approx(0.2))


def test_the_books_name_every_problem():
    ok = drop.DropBooks(units=10, sold=10, orders=10, seen=10, accounts_over_cap=0, not_orders=0, unseen=0, late=0)
    assert ok.problems == []
    bad = drop.DropBooks(units=10, sold=11, orders=11, seen=9, accounts_over_cap=1, not_orders=2, unseen=2, late=1)
    assert len(bad.problems) == 5
    late = drop.DropBooks(units=10, sold=10, orders=10, seen=10, accounts_over_cap=0, not_orders=0, unseen=0, late=1)
    assert late.problems == []  # the client's clock cannot tell a broken deadline from a slow accept
    broken = drop.DropBooks(units=10, sold=10, orders=10, seen=10, accounts_over_cap=0, not_orders=0, unseen=0,
                            late=0, line=("L2: accounts let through past the sold-out cut: [7]",))
    assert broken.problems == ["L2: accounts let through past the sold-out cut: [7]"]


@pytest.mark.django_db(transaction=True)
def test_the_books_hold_the_orders_against_what_the_buyers_heard(make_product):
    import time

    from shop.services import place_order
    from tests.helpers import make_users

    product = make_product(stock=5)
    people = make_users(3, prefix="books")
    wall_open = time.time() - 1.0  # the orders below are placed about 1 s after this "opening"
    orders = [place_order(user=u, lines=[(product.pk, 1)], idempotency_key=f"k{i}").order_id
              for i, u in enumerate(people[:2])]
    buyers = [drop.Buyer(0, PERSON, 0.0), drop.Buyer(1, SCRIPT, 0.0), drop.Buyer(2, PERSON, 0.0)]
    plan = drop.DropPlan(url="http://127.0.0.1:1", product_id=product.pk, units=5, buyers=buyers,
                         tokens=["t"] * 3, run_id="r")
    attempts = [Attempt(0, "k0", 0.5, 0.9, 201, openloop.PLACED, "", orders[0]),  # heard
                Attempt(1, "k1", 0.5, None, 0, openloop.CONN_ERROR, "TimeoutError"),  # never heard
                Attempt(2, "k2", 0.5, 0.6, 201, openloop.PLACED, "", 999)]  # names no order
    b = drop.books(drop.DropResult(plan=plan, attempts=attempts), wall_open=wall_open, budget=4.0)
    assert (b.sold, b.orders, b.seen, b.unseen, b.not_orders, b.accounts_over_cap) == (2, 2, 1, 1, 1, 0)
    assert b.unseen_heard == {"script TimeoutError": 1}
    assert len(b.committed) == 2 and all(0.5 < t < 30 for t in b.committed)
    assert b.late == 0
    assert len(b.problems) == 3  # orders 2 != seen 1, a placed answer naming no order, an unseen order
    late = drop.books(drop.DropResult(plan=plan, attempts=[replace_sent(a, -10.0) for a in attempts]),
                      wall_open=wall_open, budget=4.0)
    assert late.late == 2  # committed 11 s after their requests were sent


def replace_sent(a: Attempt, sent: float) -> Attempt:
    from dataclasses import replace

    return replace(a, sent=sent)


# --- a real server ---------------------------------------------------------------------------------
def drop_on_a_real_server(**kwargs) -> drop.DropRun:
    """`drop.drop` against a small gunicorn with the shop's worker, started for this run only."""
    connections.close_all()
    server = appservers.AppServer(workers=2, threads=4)
    server.start()
    try:
        return drop.drop(server.url, capacity=100.0, clients=2, lead=1.5, **kwargs)
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_tiny_drop_against_a_real_server_sells_out_and_the_books_balance():
    run = drop_on_a_real_server(units=20, people=60, scripts=10, arrival_seconds=1.0, patience=10.0)
    b = run.books
    assert b.problems == [] and b.sold == b.orders == b.seen == 20
    f = run.figures()
    records = run.result.records
    assert len(records) == 70 and all(r.arrival is not None for r in records)
    assert sum(1 for r in records if r.result == WON) == 20
    assert len(run.books.committed) == 20 and f["first_sale_at"] >= 0  # nothing sold before the opening
    assert f["last_placed_answer_at"] >= f["last_sale_at"] - 0.5
    assert f["requests"] >= 70 and f["requests_per_unit"] >= f["buyers_per_unit"] == 70 / 20
    assert 0 <= f["fifo_share"] <= 1 and f["script_advantage"] is not None
    assert 20 <= len(b.placed) <= 70 and len(set(b.placed)) == len(b.placed)  # a place per account
    assert 0 <= f["placed_in_arrival_order"] <= 1 and f["won_in_place_order"] == 1.0  # L1: turns follow places
    assert f["answers"].get("409 out_of_stock", 0) > 0
    scripts = [r for r in records if r.kind == SCRIPT]
    assert all(len({a.key for a in run.result.attempts if a.buyer == r.index}) >= 3 for r in scripts)
    people = [r for r in records if r.kind == PERSON]
    assert all(len({a.key for a in run.result.attempts if a.buyer == r.index}) == 1 for r in people)
    text = report.drop_report(run)
    assert "FIFO share" in text and "books:" in text and ": OK" in text
    json.dumps(run.as_dict(), default=str)
    # Cleaned up: the run's products, accounts and tokens are gone.
    assert not Product.objects.filter(sku__startswith=f"lt-{run.result.plan.run_id}-").exists()
    assert not Order.objects.filter(user__username__startswith=f"lt-{run.result.plan.run_id}-").exists()
    assert not ApiToken.objects.filter(name="drop").exists()


@pytest.mark.django_db(transaction=True)
def test_a_pre_queue_run_opens_the_products_pre_queue_and_its_early_crowd_is_told_so():
    """A pre-queue run measures the line's pre-queue: the drop's product gets a pre-queue window
    covering every early arrival (an earlier version left it at 0 s, so the early crowd was told
    `not_open_yet` and the run measured a race at the opening instead)."""
    run = drop_on_a_real_server(units=10, people=24, scripts=4, prequeue_seconds=2.0, patience=8.0)
    assert run.books.problems == [] and run.books.sold == 10
    # Answered before the opening (one sent before it but read after it, on a loaded machine, is
    # answered as the open line answers).
    early = [a for a in run.result.attempts if a.status and a.answered is not None and a.answered < 0]
    assert len(early) >= 10
    assert not [a for a in early if a.code == "not_open_yet"]
    # Told their place in the pre-queue (202), or `busy` by a server short of room: never refused.
    assert {a.status for a in early} <= {202, 503} and any(a.status == 202 for a in early)
    assert "shuffled" in report.drop_report(run)
