"""`manage.py shop signups`: the admin user list's per-minute sign-ups and API tokens, from a shell."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from shop.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)


def shop(*args: str) -> str:
    out = io.StringIO()
    call_command("shop", *args, stdout=out)
    return out.getvalue()


def test_signups_lists_the_last_hours_minutes_and_their_totals():
    users = get_user_model()
    for i in range(3):
        bot = users.objects.create_user(f"bot-{i}", password="x")
        ApiToken.issue(user_id=bot.pk, name="script")
    old = users.objects.create_user("old-timer", password="x")
    users.objects.filter(pk=old.pk).update(date_joined=timezone.now() - timedelta(days=2))
    ApiToken.issue(user_id=old.pk, name="late")  # a token now, of an old account: not quick

    data = json.loads(shop("signups", "--json"))
    assert data["minutes"] == 60 and data["quick_token_seconds"] == 60
    assert data["totals"] == {"accounts": 3, "tokens": 4, "quick_tokens": 3}
    assert sum(m["accounts"] for m in data["per_minute"]) == 3
    assert all(set(m) == {"minute", "accounts", "tokens", "quick_tokens"} for m in data["per_minute"])

    text = shop("signups")
    assert "Sign-ups and API tokens, last 60 minutes" in text
    assert text.rstrip().splitlines()[-1].split() == ["total", "3", "4", "3"]
    assert json.loads(shop("signups", "--minutes", "5", "--json"))["totals"]["accounts"] == 3


@pytest.mark.parametrize("minutes", ["0", "1441"])
def test_signups_refuses_a_span_out_of_range(minutes):
    with pytest.raises(CommandError, match="minutes"):
        shop("signups", "--minutes", minutes)
