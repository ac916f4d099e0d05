"""`manage.py apitoken`: create (shown once), list, revoke."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from shop.models import ApiToken

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("apitoken", *args, stdout=out)
    return out.getvalue()


def test_create_list_revoke(user):
    token = run("create", user.username, "--name", "wrk").strip()
    stored = ApiToken.objects.get(user=user)
    assert stored.key_hash == ApiToken.hash(token) and stored.name == "wrk"
    assert stored.prefix in run("list", user.username) and "active" in run("list")
    assert "revoked" in run("revoke", stored.prefix)
    stored.refresh_from_db()
    assert stored.revoked_at is not None


def test_errors(user):
    with pytest.raises(CommandError, match="no user"):
        run("create", "nobody-here")
    with pytest.raises(CommandError, match="matches 0"):
        run("revoke", "shp_nothing")
