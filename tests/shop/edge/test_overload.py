"""A crowd bigger than the server: a small real server (gunicorn with the shop's worker,
1 worker x 4 threads: 2 buyers may wait in the lines), orders sent open loop over HTTP.

The product's lock is held by the test for a few seconds, so buyers pile up exactly as behind a
busy product; what must hold while it is held: the excess is answered `busy` at once (not after
the hold), a request past its deadline is never committed, and "sold out" of another product is
answered at once, not after the buyers in line.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from loadtest import openloop
from locks import Lock
from shop.models import ApiToken, Order
from shop.plumbing import soldout
from shop.plumbing.lock_names import product_lock
from shop.services import place_order
from tests.helpers import make_users

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOLD = 3.0  # seconds the test keeps the product's lock: buyers wait in line meanwhile


@pytest.fixture
def tokens():
    return [ApiToken.issue(user_id=u.pk) for u in make_users(20, prefix="crowd")]


def _order(url: str, token: str, product_id: int, *, key: str, prefer: str | None = None) -> tuple[int, dict, dict]:
    body = json.dumps({"lines": [{"product_id": product_id, "quantity": 1}]}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Idempotency-Key": key}
    if prefer:
        headers["Prefer"] = prefer
    request = urllib.request.Request(f"{url}/api/orders/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_the_excess_of_a_crowd_is_answered_busy_at_once_and_never_placed_later(server, tokens, make_product):
    p = make_product(stock=100)
    plan = openloop.Plan(url=server.url, phases=[openloop.Phase("crowd", rate=40, seconds=1.0, product_id=p.pk)],
                         tokens=tokens, run_id="t27crowd", clients=1, patience=10.0)
    with Lock(product_lock(p.pk), ttl=30):
        held_at = time.monotonic()
        result = openloop.run(plan, start_in=0.2)  # returns once every request is answered (or abandoned)
        answered_within = time.monotonic() - held_at
        busy = [s for s in result.sent if s.outcome == openloop.BUSY]
        # Everything but the few buyers the server lets wait (2) was answered while the lock was
        # still held: at once, with a Retry-After, instead of after the hold.
        assert len(busy) >= len(result.sent) - 4, [s.outcome for s in result.sent]
        assert all(s.retry_after == "1" and s.latency < HOLD / 2 for s in busy), [s.latency for s in busy]
        assert answered_within < HOLD + 1
        time.sleep(max(0.0, HOLD - (time.monotonic() - held_at)))
    # The ones that waited are served once the lock is free; nobody else is ever placed.
    assert not [s for s in result.sent if s.outcome in openloop.UNANSWERED]
    time.sleep(1.0)
    committed, unseen = openloop.unseen(result)
    assert unseen == 0 and committed == sum(1 for s in result.sent if s.outcome == openloop.PLACED)


def test_a_request_past_its_deadline_is_never_committed(server, tokens, make_product):
    """`Prefer: wait=1`: the buyer's line ends after half a second; the lock comes free later."""
    p = make_product(stock=5)
    with Lock(product_lock(p.pk), ttl=30):
        started = time.monotonic()
        status, headers, body = _order(server.url, tokens[0], p.pk, key="past-deadline", prefer="wait=1")
        took = time.monotonic() - started
        assert status == 503 and body["error"]["code"] in {"lock_timeout", "busy"}, body
        assert took < 1.5 and headers.get("Retry-After")
        time.sleep(0.5)
    time.sleep(1.0)  # the lock is free: nothing may commit it now
    assert not Order.objects.filter(idempotency_key="past-deadline").exists()
    p.refresh_from_db()
    assert p.stock == 5


def test_sold_out_is_answered_at_once_while_buyers_of_another_product_wait(server, tokens, make_product, user):
    busy_product, gone = make_product(stock=100), make_product(stock=1)
    place_order(user=user, lines=[(gone.pk, 1)])  # sold out: marked, and in the index every server reads
    assert soldout.sold_out([gone.pk]) == {gone.pk}
    time.sleep(2 * soldout.KNOWN_REFRESH)
    plan = openloop.Plan(url=server.url, phases=[openloop.Phase("line", rate=20, seconds=0.5,
                                                                product_id=busy_product.pk)],
                         tokens=tokens, run_id="t27line", clients=1, patience=10.0)
    with Lock(product_lock(busy_product.pk), ttl=30):
        import threading

        crowd = threading.Thread(target=openloop.run, args=(plan,), kwargs={"start_in": 0.1}, daemon=True)
        crowd.start()
        time.sleep(1.0)  # the buyers of busy_product fill the server's lines and wait
        started = time.monotonic()
        status, _, body = _order(server.url, tokens[-1], gone.pk, key="sold-out-now")
        took = time.monotonic() - started
        assert status == 409 and body["error"]["code"] == "out_of_stock", body
        assert took < 1.0, f"the sold-out answer took {took:.2f} s behind the buyers in line"
        time.sleep(1.0)
    crowd.join(15)


def test_the_lock_dashboard_shows_what_the_crowd_was_told(server, tokens, make_product, client):
    """Every server's busy answers and deadlines, summed in Redis, on the admin's lock dashboard."""
    from django.contrib.auth import get_user_model

    p = make_product(stock=100)
    plan = openloop.Plan(url=server.url, phases=[openloop.Phase("crowd", rate=40, seconds=0.5, product_id=p.pk)],
                         tokens=tokens, run_id="t27panel", clients=1, patience=10.0)
    with Lock(product_lock(p.pk), ttl=30):
        result = openloop.run(plan, start_in=0.1)
    busy = sum(1 for s in result.sent if s.outcome == openloop.BUSY)
    assert busy
    time.sleep(1.5)  # the server adds its counts to Redis once a second
    client.force_login(get_user_model().objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/locks/lockdashboard/").content.decode()
    assert 'id="panel-overload"' in page and "this server&#x27;s lines were full" in page
    panel = next(x for x in client.get("/admin/locks/lockdashboard/data/").json()["panels"] if x["id"] == "overload")
    shown = {row[0]: row[2] for row in panel["rows"]}  # label -> last minute
    told_busy = sum(n for label, n in shown.items() if label.startswith("Busy") and isinstance(n, int))
    assert told_busy >= busy
    assert shown["Requests that got a thread"] >= 1
