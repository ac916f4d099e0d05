"""`manage.py shop drop`: the admin's drop window from the command line, through the same service
(shop.services.drops), with the "cli:" actor on the drop log; bad input writes nothing."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from locks.services import cli_actor_name
from shop.models import DropLog, Product
from tests.shop.services.test_drops import window

pytestmark = pytest.mark.django_db(transaction=True)

ME = f"cli:{cli_actor_name()}"


def shop(*args: str) -> str:
    out = io.StringIO()
    call_command("shop", *args, stdout=out)
    return out.getvalue()


def test_drop_schedules_several_products_by_id_or_sku_and_logs_the_actor(make_product):
    a, b = make_product(), make_product()
    out = shop("drop", str(a.pk), b.sku, "--opens", "2030-12-01 10:00", "--closes", "2030-12-01T14:00+02:00")
    for p in (a, b):
        p.refresh_from_db()
        assert (p.opens_at.isoformat(), p.closes_at.isoformat()) == ("2030-12-01T10:00:00+00:00",
                                                                     "2030-12-01T12:00:00+00:00")
        assert (f"{p.name} ({p.sku}): scheduled; opens 2030-12-01 10:00 UTC, closes 2030-12-01 12:00 UTC "
                f"(upcoming).") in out
    assert set(DropLog.objects.values_list("product_id", "action", "actor")) == {
        (a.pk, "schedule", ME), (b.pk, "schedule", ME)}

    shop("drop", a.sku, b.sku, "--opens", "2030-12-02 10:00", "--actor", "ops")  # moved: the window given
    assert {(p.opens_at.isoformat(), p.closes_at) for p in Product.objects.filter(pk__in=[a.pk, b.pk])} == {
        ("2030-12-02T10:00:00+00:00", None)}
    assert DropLog.objects.filter(actor="cli:ops").count() == 2


def test_drop_end_and_clear(make_product):
    running = window(make_product(), opens_in=-60)
    out = shop("drop", running.sku, "--end")
    running.refresh_from_db()
    assert running.drop_state == "ended" and running.closes_at <= timezone.now()
    assert f"{running.name} ({running.sku}): ended now;" in out
    assert "already ended" in shop("drop", running.sku, "--end")  # not moved later
    assert DropLog.objects.filter(action="end").count() == 1

    data = json.loads(shop("drop", running.sku, "--clear", "--json"))
    assert data["actor"] == ME
    assert data["products"] == [{"id": running.pk, "sku": running.sku, "name": running.name, "active": True,
                                 "stock": running.stock, "opens_at": None, "closes_at": None, "drop": "open",
                                 "min_account_age": None, "done": "window cleared"}]


def test_drop_without_products_lists_the_windows(make_product):
    assert "none: every product is on sale whenever it is active" in shop("drop")
    soon = window(make_product(), opens_in=3600)
    ended = window(make_product(), closes_in=-60)
    make_product()  # no window: not listed
    out = shop("drop")
    assert "Drops (2)" in out and "(upcoming)" in out and "(ended)" in out
    listed = json.loads(shop("drop", "--json"))["products"]
    assert [(p["id"], p["drop"]) for p in listed] == [(ended.pk, "ended"), (soon.pk, "upcoming")]
    row = next(line for line in shop("sales").splitlines() if soon.name in line)
    assert row.split()[3:5] == [soon.name.split()[1], "upcoming"], row  # the Sales listing says it too


@pytest.mark.parametrize(("args", "says"), [
    (["--opens", "2030-12-01 12:00", "--closes", "2030-12-01 10:00"], "must close after it opens"),
    (["--closes", "2020-01-01 10:00"], "has passed"),
    (["--opens", "next friday"], "Cannot read the time 'next friday'"),
    (["--opens", "2030-12-01 10:00", "--end"], re.escape("give --opens WHEN [--closes WHEN], or --end, or --clear")),
    ([], re.escape("give --opens WHEN [--closes WHEN], or --end, or --clear")),
])
def test_bad_input_is_a_command_error_and_writes_nothing(make_product, args, says):
    p = make_product()
    with pytest.raises(CommandError, match=says):
        shop("drop", p.sku, *args)
    p.refresh_from_db()
    assert (p.opens_at, p.closes_at) == (None, None) and not DropLog.objects.exists()


def test_an_unknown_product_writes_nothing_for_the_others_either(make_product):
    p = make_product()
    with pytest.raises(CommandError, match="No product 'NO-SUCH'"):
        shop("drop", p.sku, "NO-SUCH", "--opens", "2030-12-01 10:00")
    with pytest.raises(CommandError, match="name the products"):
        shop("drop", "--end")
    assert Product.objects.get(pk=p.pk).opens_at is None and not DropLog.objects.exists()


def test_a_refusal_with_json_is_the_error_object(make_product):
    p = make_product()
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("shop", "drop", p.sku, "--opens", "soon", "--json", stdout=out)
    error = json.loads(out.getvalue())["error"]
    assert (error["code"], error["details"]) == ("invalid_drop_window", {"time": "soon"})


def test_drop_sets_and_clears_a_minimum_account_age(make_product):
    from datetime import timedelta

    a, b = make_product(), make_product()
    out = shop("drop", str(a.pk), b.sku, "--min-account-age", "7d")
    for p in (a, b):
        p.refresh_from_db()
        assert p.min_account_age == timedelta(days=7)
        assert f"{p.name} ({p.sku}): accounts at least 7 days old;" in out
    # With a window in one call, and in the JSON listing (seconds).
    shop("drop", str(a.pk), "--opens", "2030-12-01 10:00", "--min-account-age", "24h")
    listed = {p["id"]: p for p in json.loads(shop("drop", "--json"))["products"]}
    assert listed[a.pk]["min_account_age"] == 86400 and listed[a.pk]["opens_at"] == "2030-12-01T10:00:00+00:00"
    assert "accounts at least 1 day old" in shop("drop")
    shop("drop", b.sku, "--min-account-age", "none")
    b.refresh_from_db()
    assert b.min_account_age is None


@pytest.mark.parametrize("value", ["soon", "-3d", "400d"])
def test_drop_refuses_an_age_it_cannot_read_and_writes_nothing(make_product, value):
    p = make_product()
    with pytest.raises(CommandError, match="age"):
        shop("drop", str(p.pk), "--opens", "2030-12-01 10:00", "--min-account-age", value)
    p.refresh_from_db()
    assert p.min_account_age is None and p.opens_at is None and not DropLog.objects.exists()
