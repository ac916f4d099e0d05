"""A drop's minimum account age (shop/edge/account_age.py): refused in the service before any lock or
write, answered 403 `account_too_new` by the API and in words by the web checkout, shown on the
product page, set in the admin's product form. Real MariaDB and Redis."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.utils import timezone

from shop import errors
from shop.edge import account_age
from shop.models import ApiToken, Order, Product, StockLedger
from shop.services import checkout as checkout_service
from shop.services import drops, place_order

pytestmark = pytest.mark.django_db(transaction=True)

WEEK = timedelta(days=7)


def require(p: Product, age: timedelta | None) -> Product:
    drops.require_account_age(products=[p], min_account_age=age, actor="test")
    p.refresh_from_db()
    return p


def joined(user, ago: timedelta):
    get_user_model().objects.filter(pk=user.pk).update(date_joined=timezone.now() - ago)
    user.refresh_from_db()
    return user


def nothing_written(p: Product, stock: int) -> bool:
    p.refresh_from_db()
    return p.stock == stock and not Order.objects.exists() and not StockLedger.objects.exists()


# --- the rule, in the service --------------------------------------------------------------------
def test_a_young_account_is_refused_before_any_lock_or_write(user, make_product, monkeypatch):
    p = require(make_product(stock=5), WEEK)
    joined(user, timedelta(days=2))

    def no_line(*args, **kwargs):
        raise AssertionError("an account too new reached the product's lock")

    monkeypatch.setattr(checkout_service, "_in_line", no_line)
    with pytest.raises(errors.AccountTooNew) as refused:
        place_order(user=user, lines=[(p.pk, 1)])
    exc = refused.value
    assert (exc.code, exc.status) == ("account_too_new", 403)
    assert exc.details["product_ids"] == [p.pk] and exc.details["min_account_age"] == 7 * 24 * 3600
    eligible = user.date_joined + WEEK
    assert exc.details["eligible_at"] == eligible.isoformat()
    assert "at least 7 days old" in exc.message and eligible.strftime("%Y-%m-%d %H:%M") in exc.message
    assert nothing_written(p, 5)


def test_an_account_old_enough_buys_and_the_edge_is_inclusive(user, other_user, make_product):
    p = require(make_product(stock=5), timedelta(hours=1))
    joined(user, timedelta(hours=1, seconds=1))
    assert not place_order(user=user, lines=[(p.pk, 1)]).replayed
    joined(other_user, timedelta(minutes=59))
    with pytest.raises(errors.AccountTooNew):
        place_order(user=other_user, lines=[(p.pk, 1)])
    require(p, None)  # the rule lifted: any account buys again
    assert not place_order(user=other_user, lines=[(p.pk, 1)]).replayed
    p.refresh_from_db()
    assert p.stock == 3


def test_a_cart_names_only_the_lines_with_the_rule(user, make_product):
    plain, ruled = make_product(stock=5), require(make_product(stock=5), WEEK)
    with pytest.raises(errors.AccountTooNew) as refused:
        place_order(user=user, lines=[(plain.pk, 1), (ruled.pk, 1)])
    assert refused.value.details["product_ids"] == [ruled.pk]
    assert nothing_written(plain, 5) and nothing_written(ruled, 5)


def test_another_process_sees_a_new_rule_within_the_refresh(user, make_product):
    """A rule written behind this process's back (another server's admin: no signal here) is
    read again within account_age.REFRESH seconds."""
    p = make_product(stock=5)
    place_order(user=user, lines=[(p.pk, 1)])  # read the rules: none
    Product.objects.filter(pk=p.pk).update(min_account_age=WEEK)
    time.sleep(account_age.REFRESH + 0.2)
    with pytest.raises(errors.AccountTooNew):
        place_order(user=user, lines=[(p.pk, 1)])


@pytest.mark.parametrize("text, seconds", [("7d", 7 * 86400), ("24h", 86400), ("90m", 5400), ("45s", 45),
                                           ("1d12h", 129600), ("3600", 3600), (" 2w ", 14 * 86400),
                                           ("none", None), ("0", None), ("", None)])
def test_ages_are_read_as_operators_write_them(text, seconds):
    age = account_age.parse_age(text)
    assert (age.total_seconds() if age is not None else None) == seconds


@pytest.mark.parametrize("text", ["soon", "-1d", "7x", "d", "1.5h", "400d", "9" * 30])
def test_an_age_that_cannot_be_read_is_refused(text):
    with pytest.raises(errors.InvalidAccountAge):
        account_age.parse_age(text)


def test_an_age_is_described_in_words():
    assert [account_age.describe(timedelta(seconds=s)) for s in (45, 5400, 86400, 129600, 7 * 86400)] == [
        "45 seconds", "90 minutes", "1 day", "36 hours", "7 days"]


# --- the API and the web checkout ----------------------------------------------------------------
def test_the_api_answers_403_account_too_new_with_details_and_writes_nothing(client, user, make_product):
    p = require(make_product(stock=5), WEEK)
    token = ApiToken.issue(user_id=user.pk, name="t")
    response = client.post("/api/orders/", data=json.dumps({"lines": [{"product_id": p.pk, "quantity": 1}]}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "account_too_new" and "at least 7 days old" in error["message"]
    assert error["details"] == {"product_ids": [p.pk], "min_account_age": 604800,
                                "eligible_at": (user.date_joined + WEEK).isoformat()}
    assert nothing_written(p, 5)


def test_the_api_shows_the_rule_on_the_product(client, make_product):
    p = require(make_product(stock=5), timedelta(hours=36))
    assert client.get(f"/api/products/{p.pk}/").json()["min_account_age"] == 36 * 3600


def test_the_web_checkout_says_when_the_account_may_buy_with_403(client, user, make_product):
    p = require(make_product(stock=5), WEEK)
    client.force_login(user)
    client.post(f"/products/{p.pk}/", {"quantity": 1})
    key = client.get("/checkout/").context["form"].initial["idempotency_key"]
    response = client.post("/checkout/", {"idempotency_key": key})
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert response.status_code == 403
    assert said and said[0].startswith(f"{p.name}: Accounts must be at least 7 days old to buy in this drop")
    assert nothing_written(p, 5)


# --- the product page and the admin --------------------------------------------------------------
def test_the_product_page_states_the_rule_and_when_a_young_account_may_buy(client, user, make_product):
    p = require(make_product(stock=5), WEEK)
    page = client.get(f"/products/{p.pk}/").content.decode()
    assert "Accounts must be at least 7 days old to buy in this drop." in page
    assert "Your account may buy" not in page
    client.force_login(joined(user, timedelta(days=2)))
    page = client.get(f"/products/{p.pk}/").content.decode()
    assert "Your account may buy from" in page and (user.date_joined + WEEK).isoformat() in page
    plain = client.get(f"/products/{make_product().pk}/").content.decode()
    assert "Accounts must be at least" not in plain
    drops.end_drop(products=[p], actor="test")  # nothing to buy any more: nothing to say
    assert "Accounts must be at least" not in client.get(f"/products/{p.pk}/").content.decode()


def _form(p: Product, **fields: str) -> dict[str, str]:
    return {"sku": p.sku, "name": p.name, "description": "", "price": str(p.price), "active": "on",
            "max_per_user": "", "opens_at_0": "", "opens_at_1": "", "closes_at_0": "", "closes_at_1": "",
            "min_account_age": "", "line_prequeue_seconds": "0", "line_order": "shuffle", **fields}


def test_the_product_form_sets_and_clears_the_rule_beside_the_window(admin_client, make_product):
    p = make_product()
    page = admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    assert page.index('name="closes_at_0"') < page.index('name="min_account_age"')
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/", _form(p, min_account_age="7d"))
    assert response.status_code == 302, response.content.decode()[:2000]
    p.refresh_from_db()
    assert p.min_account_age == WEEK
    assert 'value="7d"' in admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/", _form(p, min_account_age="soon"))
    assert response.status_code == 200 and "Write an age as" in response.content.decode()
    p.refresh_from_db()
    assert p.min_account_age == WEEK
    assert admin_client.post(f"/admin/shop/product/{p.pk}/change/", _form(p)).status_code == 302
    p.refresh_from_db()
    assert p.min_account_age is None


def test_a_refresh_never_shows_a_thread_no_rules(make_product, monkeypatch):
    """gunicorn's threads share the rules: one refreshing them must not leave another a moment
    with none (a young account would slip through). The rows are read once, then handed out again
    at once, so that refreshes come as fast as they can."""
    import sys
    import threading

    from shop.reads import selectors

    p = require(make_product(), WEEK)
    rows = selectors.drop_rules(now=timezone.now())
    monkeypatch.setattr(selectors, "drop_rules", lambda now: rows)
    assert p.pk in account_age.rules([p.pk])
    stop, missed = threading.Event(), []

    def refresher():
        while not stop.is_set():
            account_age.forget()
            account_age.rules([p.pk])

    def reader():
        for _ in range(200_000):
            if p.pk not in account_age.rules([p.pk]):
                missed.append(1)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        worker = threading.Thread(target=refresher)
        worker.start()
        reader()
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(interval)
    assert missed == []
