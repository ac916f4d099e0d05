"""`manage.py coupon_storm`: arguments, and exact counts when many users claim one coupon at once."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from shop.models import Coupon


def run(*args: str) -> str:
    out = StringIO()
    call_command("coupon_storm", "--no-progress", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize("option", ["--users", "--total", "--processes", "--attempts"])
def test_counts_must_be_positive(option):
    with pytest.raises(CommandError, match=f"{option} must be at least 1"):
        run(option, "0")


@pytest.mark.django_db(transaction=True)
def test_more_users_than_coupons_exactly_total_claims(tmp_path):
    out = run("--users", "24", "--total", "10", "--processes", "3", "--attempts", "2",
              "--json", str(tmp_path / "s.json"))
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["result"] == "PASS", out
    assert data["claims"] == 10 and data["remaining"] == 0
    s = data["summary"]
    assert s["attempted"] == 48
    assert s["counts"]["placed"] == 10
    # 14 users came too late (sold out); the 10 winners' second attempts are refused one way or the other.
    assert s["counts"]["out_of_stock"] + s["counts"]["rejected"] == 38
    assert "coupon storm: PASS" in out
    assert not Coupon.objects.filter(code=f"LT-{data['run_id']}".upper()).exists()


@pytest.mark.django_db(transaction=True)
def test_fewer_users_than_coupons_everyone_gets_one(tmp_path):
    run("--users", "6", "--total", "10", "--processes", "2", "--json", str(tmp_path / "s.json"))
    data = json.loads((tmp_path / "s.json").read_text())
    assert (data["result"], data["claims"], data["remaining"]) == ("PASS", 6, 4)


def counts(placed: int = 0, out_of_stock: int = 0, busy: int = 0, rejected: int = 0, error: int = 0) -> dict:
    return {"placed": placed, "out_of_stock": out_of_stock, "busy": busy, "rejected": rejected, "error": error}


def test_checks_hold_when_the_figures_agree():
    from loadtest.scenarios import StormConfig, storm_checks

    checks = storm_checks(StormConfig(users=20, total=5), counts(placed=5, out_of_stock=15),
                          claims=5, distinct_users=5, remaining=0)
    assert all(ok is True for _, ok in checks), checks


@pytest.mark.parametrize(("figures", "failing"), [
    ({"claims": 6, "distinct_users": 6, "remaining": -1}, ["database (6) == successes the clients saw (5)",
                                                            "claims (6) <= coupon total (5)",
                                                            "nobody wrongly refused"]),
    ({"claims": 5, "distinct_users": 4, "remaining": 0}, ["one claim per user (4 users hold 5 claims)"]),
    ({"claims": 5, "distinct_users": 5, "remaining": 1}, ["remaining (1) == total - claims"]),
])
def test_a_disagreement_is_never_ok(figures, failing):
    from loadtest.scenarios import StormConfig, storm_checks

    checks = storm_checks(StormConfig(users=20, total=5), counts(placed=5, out_of_stock=15), **figures)
    failed = [text for text, ok in checks if ok is False]
    assert len(failed) == len(failing), failed
    for text, part in zip(failed, failing, strict=True):
        assert part in text


def test_checks_a_run_cannot_make_are_skipped_not_ok():
    from django.core.management.color import no_style

    from loadtest.management.commands.coupon_storm import check_line
    from loadtest.scenarios import StormConfig, storm_checks

    # Two users were busy: "nobody wrongly refused" cannot be judged, and 3 claims != min(5, 20).
    checks = storm_checks(StormConfig(users=20, total=5), counts(placed=3, out_of_stock=15, busy=2),
                          claims=3, distinct_users=3, remaining=2)
    skipped = [text for text, ok in checks if ok is None]
    assert len(skipped) == 2 and "not checked" in skipped[0]
    lines = [check_line(text, ok, no_style()) for text, ok in checks]
    assert not any(line.startswith("ok") and "not checked" in line for line in lines)
    assert sum(line.startswith("skip  ") for line in lines) == 2


@pytest.mark.django_db(transaction=True)
def test_the_table_has_a_legend_and_skipped_checks_say_so(tmp_path):
    out = run("--users", "6", "--total", "3", "--processes", "2", "--attempts", "2", "--json", str(tmp_path / "s.json"))
    assert "already_claimed: refused, this user holds one" in out and "claims/s: successes" in out
    assert "skip  sold-out refusals" in out and "coupon storm: PASS" in out
    checks = json.loads((tmp_path / "s.json").read_text())["checks"]
    assert [c["skipped"] for c in checks].count(True) == 1 and all(c["ok"] is not False for c in checks)


@pytest.mark.django_db(transaction=True)
def test_the_progress_line_speaks_the_tables_vocabulary():
    """The progress said "placed / out_of_stock" where the table says "claimed /
    sold_out" (the API's coupon_sold_out, coupon_already_claimed)."""
    out, err = StringIO(), StringIO()  # not a terminal: the last progress state is printed at the end
    call_command("coupon_storm", "--users", "6", "--total", "4", "--processes", "2", "--attempts", "2",
                 stdout=out, stderr=err)
    progress = err.getvalue().strip().splitlines()[-1]
    headers = next(line for line in out.getvalue().splitlines() if line.startswith("attempted")).split()
    labels = re.findall(r"([a-z_]+) \d+", progress)
    assert labels == ["claimed", "sold_out", "already_claimed", "busy", "errors"], progress
    assert set(labels) <= set(headers)
    assert "claimed 4 " in progress and "placed" not in progress and "out_of_stock" not in progress
