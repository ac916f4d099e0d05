"""`manage.py coupon_storm`: arguments, and exact counts when many users claim one coupon at once."""

from __future__ import annotations

import json
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
