"""The admin's user list as the operator's view of sign-ups and API tokens (issue 36, bots): when
each account joined, when it made its first API token and how soon after sign-up, filters for
recent sign-ups and quick tokens, and the last hour's sign-ups and tokens per minute."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from shop.models import ApiToken
from shop.reads.selectors import signups_per_minute

pytestmark = pytest.mark.django_db(transaction=True)
User = get_user_model()


def account(name: str, *, joined_ago: timedelta, token_after: timedelta | None = None):
    """An account that joined `joined_ago`, with an API token made `token_after` its sign-up."""
    now = timezone.now()
    user = User.objects.create_user(name, password="pw-not-used")
    User.objects.filter(pk=user.pk).update(date_joined=now - joined_ago)
    if token_after is not None:
        ApiToken.issue(user_id=user.pk, name="t")
        ApiToken.objects.filter(user=user).update(created_at=now - joined_ago + token_after)
    return user


@pytest.fixture
def accounts():
    return {
        "bot": account("bot-1", joined_ago=timedelta(seconds=90), token_after=timedelta(seconds=3)),
        "person": account("person", joined_ago=timedelta(days=3), token_after=timedelta(days=2)),
        "quiet": account("quiet", joined_ago=timedelta(minutes=20)),
    }


@pytest.fixture
def operator():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    User.objects.filter(username="root").update(date_joined=timezone.now() - timedelta(days=30))
    return client


def names(response) -> list[str]:
    return sorted(u.username for u in response.context["cl"].result_list)


def test_the_user_list_shows_when_each_account_made_its_first_token(operator, accounts):
    response = operator.get("/admin/auth/user/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "First API token" in page and "Token after sign-up" in page and "Date joined" in page
    rows = {u.username: u for u in response.context["cl"].result_list}
    assert rows["bot-1"].first_token_at is not None and rows["quiet"].first_token_at is None
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "bot-1" in text and "3 s" in text and "2 days" in text


def test_filters_pick_recent_sign_ups_and_quick_tokens(operator, accounts):
    assert names(operator.get("/admin/auth/user/?joined=hour")) == ["bot-1", "quiet"]
    assert names(operator.get("/admin/auth/user/?joined=week")) == ["bot-1", "person", "quiet"]
    assert names(operator.get("/admin/auth/user/?first_token=quick")) == ["bot-1"]
    assert names(operator.get("/admin/auth/user/?first_token=none")) == ["quiet", "root"]
    assert names(operator.get("/admin/auth/user/?first_token=any")) == ["bot-1", "person"]


def test_the_last_hour_per_minute_counts_sign_ups_tokens_and_quick_ones(operator, accounts):
    now = timezone.now()
    minutes = signups_per_minute(now=now)
    assert sum(m["accounts"] for m in minutes) == 2  # bot-1 and quiet; person joined days ago
    assert sum(m["tokens"] for m in minutes) == 1 and sum(m["quick_tokens"] for m in minutes) == 1
    assert all(m["accounts"] or m["tokens"] for m in minutes)  # only minutes that saw something
    assert [m["minute"] for m in minutes] == sorted((m["minute"] for m in minutes), reverse=True)
    page = operator.get("/admin/auth/user/").content.decode()
    assert "Sign-ups and API tokens, last hour" in page
    assert re.search(r'id="signups-total".*?<td>2</td>\s*<td>1</td>\s*<td>1</td>', page, re.S)


def test_staff_who_may_only_view_users_see_the_list(accounts):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_user"))
    client = Client()
    client.force_login(viewer)
    response = client.get("/admin/auth/user/?first_token=quick")
    assert response.status_code == 200 and names(response) == ["bot-1"]
    assert Client().get("/admin/auth/user/").status_code == 302  # not logged in: the login page
