"""Arrival stamps: signed for one credential, honoured for a bounded age, and a place taken as of
the first arrival (docs/design.md, "The line"), against the real Redis and MariaDB."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from shop import line
from shop.line import arrivals
from shop.models import Product
from shop.plumbing import clock


def test_a_stamp_reads_back_for_its_credential_only():
    text = arrivals.stamp(at_ms=1_795_000_000_123, credential=b"Bearer shp_a")
    assert arrivals.read(text, credential=b"Bearer shp_a") == 1_795_000_000_123
    assert arrivals.read(text.encode(), credential=b"Bearer shp_a") == 1_795_000_000_123
    assert arrivals.read(text, credential=b"Bearer shp_b") is None  # another token: no use
    at, signature = text.split(".")
    assert arrivals.read(f"{int(at) - 5000}.{signature}", credential=b"Bearer shp_a") is None  # an earlier time


@given(st.one_of(st.text(max_size=60), st.binary(max_size=60), st.none(), st.integers()), st.binary(max_size=40))
def test_garbage_is_no_stamp_and_never_raises(text, credential):
    assert arrivals.read(text, credential=credential) is None


def test_a_stamp_is_honoured_within_its_age_and_not_before_the_window():
    now, window = 1_795_000_100_000, 1_795_000_000_000
    assert arrivals.honoured(now - 1200, now_ms=now, window_ms=window) == now - 1200
    assert arrivals.honoured(now + 3000, now_ms=now, window_ms=window) == now  # never later than now
    assert arrivals.honoured(now - arrivals.MAX_AGE * 1000 - 1, now_ms=now, window_ms=window) is None  # too old
    assert arrivals.honoured(window - 1, now_ms=now, window_ms=window) is None  # before the pre-queue's window
    assert arrivals.honoured(None, now_ms=now, window_ms=window) is None


pytestmark_db = pytest.mark.django_db(transaction=True)


def _drop(make_product, **fields) -> Product:
    p = make_product(stock=10)
    fields.setdefault("opens_at", timezone.now() - timedelta(minutes=1))
    Product.objects.filter(pk=p.pk).update(**fields)
    line.forget()
    p.refresh_from_db()
    return p


def _join(p: Product, user_id: int, arrived_ms: int | None = None) -> line.Position:
    return line.join(config=line.config_of(p), user_id=user_id, start=False, until=time.monotonic() + 10,
                     arrived_ms=arrived_ms)


def _now_ms() -> int:
    return int(clock.now().timestamp() * 1000)


@pytestmark_db
def test_a_buyer_told_busy_first_keeps_the_place_of_its_first_arrival(settings, make_product, django_user_model):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = _drop(make_product)
    first, told_busy, later = (django_user_model.objects.create_user(f"arr-{i}-{p.pk}") for i in range(3))
    _join(p, first.pk)
    t0 = _now_ms()  # told busy now
    time.sleep(0.05)
    behind = _join(p, later.pk)  # arrives at t1 > t0, no stamp
    kept = _join(p, told_busy.pk, arrived_ms=t0)  # comes back later, with its stamp
    assert kept.score < behind.score and kept.place == behind.place == 2
    assert _join(p, later.pk).place == 3  # the one that came later is behind it now
    # One place per account: a stamp brought again (or an earlier one) moves nothing.
    assert _join(p, told_busy.pk, arrived_ms=t0 - 500).place == kept.place


@pytestmark_db
def test_a_stamp_too_old_or_from_before_the_window_is_not_honoured(make_product, django_user_model):
    p = _drop(make_product, opens_at=timezone.now() - timedelta(seconds=90), line_prequeue_seconds=10)
    users = [django_user_model.objects.create_user(f"old-{i}-{p.pk}") for i in range(4)]
    _join(p, users[0].pk)
    stale = _join(p, users[1].pk, arrived_ms=_now_ms() - arrivals.MAX_AGE * 1000 - 2000)
    assert stale.place == 2  # as if it came now
    opens_ms = int(p.opens_at.timestamp() * 1000)
    early = _join(p, users[2].pk, arrived_ms=opens_ms - 11_000)  # before the pre-queue's window (and too old)
    assert early.place == 3


@pytestmark_db
def test_a_stamp_from_the_pre_queues_window_places_the_buyer_after_the_pre_queue_before_later_arrivals(
        make_product, django_user_model):
    p = _drop(make_product, opens_at=timezone.now() - timedelta(seconds=2), line_prequeue_seconds=30)
    users = [django_user_model.objects.create_user(f"pq-{i}-{p.pk}") for i in range(3)]
    _join(p, users[0].pk)  # arrived after the opening
    _join(p, users[1].pk)
    opens_ms = int(p.opens_at.timestamp() * 1000)
    pre = _join(p, users[2].pk, arrived_ms=opens_ms - 5000)  # told busy in the pre-queue's window
    assert pre.place == 1


@pytestmark_db
def test_the_apps_busy_answer_for_a_lined_product_carries_a_stamp_and_the_web_checkout_a_cookie(
        settings, client, user, make_product):
    """The app's own `busy` (here: this process lets nobody wait, MAX_WAITING 0, and a cart of a
    drop's product and another one needs the gate) gives the buyer its first arrival."""
    from shop.models import ApiToken

    settings.SHOP = {**settings.SHOP, "MAX_WAITING": 0}
    p, other = _drop(make_product), make_product(stock=10)
    token = ApiToken.issue(user_id=user.pk, name="stamp")
    body = {"lines": [{"product_id": p.pk, "quantity": 1}, {"product_id": other.pk, "quantity": 1}]}
    before = _now_ms()
    response = client.post("/api/orders/", body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 503 and response.json()["error"]["code"] == "busy"
    stamp = response[arrivals.HEADER]
    at_ms = arrivals.read(stamp, credential=f"Bearer {token}".encode())
    assert at_ms is not None and before - 1000 <= at_ms <= _now_ms() + 1000
    # Sent back, the same stamp is given back (the first arrival), not a new one.
    time.sleep(0.05)
    again = client.post("/api/orders/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
                        HTTP_LINE_ARRIVAL=stamp)
    assert again[arrivals.HEADER] == stamp
    # An order of another product only: no stamp.
    plain = client.post("/api/orders/", {"lines": [{"product_id": other.pk, "quantity": 1}]},
                        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert plain.status_code == 503 and arrivals.HEADER not in plain
    # The web checkout: the same, as a cookie.
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    client.post(f"/products/{other.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    page = client.post("/checkout/", {"idempotency_key": key})
    assert page.status_code == 503
    cookie = page.cookies[arrivals.COOKIE]
    assert arrivals.read(cookie.value, credential=client.cookies["sessionid"].value.encode()) is not None
    assert int(cookie["max-age"]) == arrivals.MAX_AGE and cookie["httponly"]
