"""An open-loop run's answers: the same rule as the closed-loop runs tells a refusal from an error,
and the crowd's report shows rejections apart, by code."""

from __future__ import annotations

import json

import pytest

from loadtest import openloop, report


def _error(code: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": "", "details": {}}}).encode()


@pytest.mark.parametrize(("status", "body", "outcome"), [
    (201, b'{"id": 7}', openloop.PLACED),
    (409, _error("out_of_stock"), openloop.SOLD_OUT),
    (409, _error("unpaid_limit"), openloop.REJECTED),
    (429, _error("rate_limited"), openloop.REJECTED),
    (409, _error("a_rule_added_later"), openloop.REJECTED),
    (400, _error("invalid_input"), openloop.ERROR),
    (422, _error("idempotency_conflict"), openloop.ERROR),
    (500, b"<h1>Server Error</h1>", openloop.ERROR),
    (503, _error("lock_unavailable"), openloop.UNAVAILABLE),
])
def test_classify(status, body, outcome):
    assert openloop.classify(status, body)[0] == outcome


def test_the_crowd_report_counts_rejections_apart_from_errors_by_code():
    phase = openloop.Phase("1x", rate=6, seconds=1.0, product_id=1)
    plan = openloop.Plan(url="http://127.0.0.1:1", phases=[phase], tokens=["t"], run_id="r")
    answers = [(201, b'{"id": 1}'), (409, _error("unpaid_limit")), (409, _error("unpaid_limit")),
               (429, _error("rate_limited")), (500, b"oops"), (409, _error("out_of_stock"))]
    sent = []
    for i, (status, body) in enumerate(answers):
        outcome, code, order_id = openloop.classify(status, body)
        sent.append(openloop.Sent(i, 0, i / 6, i / 6, 0.01, outcome, status, code, order_id))
    result = openloop.Result(plan=plan, sent=sent)
    summary = openloop.summarize(result, 0, deadline=4.0)
    assert summary.rejected == {"unpaid_limit": 2, "rate_limited": 1}
    crowd = openloop.Crowd(profile="rate", capacity=6.0, result=result, summaries=[summary], unseen=[(1, 0)],
                           oversold=0, sold_out_at=[5 / 6], deadline=4.0)
    lines = report.crowd_report(crowd).splitlines()
    header, row = lines[1].split("  "), lines[3]
    names = [h.strip() for h in header if h.strip()]
    cells = row.split()
    assert cells[names.index("rejected")] == "3" and cells[names.index("errors")] == "1"
    assert "rejected (1x): unpaid_limit 2, rate_limited 1" in lines
    assert report.crowd_json(crowd)["phases"][0]["rejected"] == {"unpaid_limit": 2, "rate_limited": 1}


@pytest.mark.django_db(transaction=True)
def test_unseen_orders_are_split_by_what_their_buyer_got_and_how_long_the_server_had_it(user, make_product):
    """A failure told for a committed order is the server's contradiction (I5); an abandoned
    request is the server's lateness only if it had it for longer than its deadline."""
    from shop.services import place_order

    p = make_product(stock=10)
    phase = openloop.Phase("1x", rate=5, seconds=1.0, product_id=p.pk)
    plan = openloop.Plan(url="http://127.0.0.1:1", phases=[phase], tokens=["t"], run_id="acct", patience=10.0)
    sent = [
        openloop.Sent(0, 0, 0.0, 0.0, 0.1, openloop.PLACED, 201, "", None, connected=0.01),
        openloop.Sent(1, 0, 0.0, 0.0, 3.0, openloop.TIMEOUT, 503, "lock_timeout", None, connected=0.01),
        # connected 7 s after its schedule (SYN retries): the server had 3 s of the buyer's 10
        openloop.Sent(2, 0, 0.0, 0.0, 10.0, openloop.ABANDONED, connected=7.0),
        # connected at once: the server had all 10 s and did not answer
        openloop.Sent(3, 0, 0.0, 0.0, 10.0, openloop.ABANDONED, connected=0.01),
        openloop.Sent(4, 0, 0.0, 0.0, 10.0, openloop.ABANDONED, connected=0.01),  # no order: not counted
    ]
    for index in range(4):
        place_order(user=user, lines=[(p.pk, 1)], idempotency_key=plan.key(index))
    result = openloop.Result(plan=plan, sent=sent)
    assert openloop.unseen(result) == (4, 3)
    assert openloop.unseen_by_answer(result, deadline=4.0) == {
        "timeout:lock_timeout": 1, openloop.LEFT_EARLY: 1, openloop.LEFT_LATE: 1}
    summary = openloop.summarize(result, 0, deadline=4.0)
    crowd = openloop.Crowd(profile="rate", capacity=5.0, result=result, summaries=[summary], unseen=[(4, 3)],
                           oversold=0, sold_out_at=[None], deadline=4.0,
                           unseen_by=[openloop.unseen_by_answer(result, 0, deadline=4.0)])
    assert ("unseen (1x), what the buyer got: abandoned (past the server's deadline) 1, "
            "abandoned (reached the server late) 1, timeout:lock_timeout 1") in report.crowd_report(crowd)
    assert report.crowd_json(crowd)["phases"][0]["unseen_by"]["timeout:lock_timeout"] == 1


def test_an_abandoned_request_records_when_its_connection_was_established():
    """A server that takes the connection and never answers: the buyer gives up after its
    patience, and the books still know the server had the request since it connected."""
    import asyncio
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    taken: list[socket.socket] = []
    threading.Thread(target=lambda: taken.append(listener.accept()[0]), daemon=True).start()
    phase = openloop.Phase("1x", rate=1, seconds=1.0, product_id=1)
    plan = openloop.Plan(url=f"http://127.0.0.1:{port}", phases=[phase], tokens=["t"], run_id="conn", patience=0.5)

    async def send() -> list[openloop.Sent]:
        return await openloop._send_all(plan, [(0, 0, 0.0)], asyncio.get_running_loop().time())

    try:
        (one,) = asyncio.run(send())
    finally:
        listener.close()
        for conn in taken:
            conn.close()
    assert one.outcome == openloop.ABANDONED
    assert one.connected is not None and 0.0 <= one.connected < plan.patience
