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
