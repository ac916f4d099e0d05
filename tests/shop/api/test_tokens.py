"""API tokens end with the password they were made under, by every route that
sets one, at once even when the token's user is cached (TOKEN_CACHE_TTL)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.management import call_command
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from shop.conf import shop_settings
from shop.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)

NEW_PASSWORD = "a-brand-new-pass-456"
REVOKED_NOTE = "Your API tokens, if you had any, were revoked with the old password"


def api_status(token: str) -> int:
    return Client().get("/api/orders/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code


@pytest.fixture
def cached_token(user) -> str:
    """A working token whose user is in the cache now (the next request reads no row)."""
    assert int(shop_settings.TOKEN_CACHE_TTL) > 0
    raw = ApiToken.issue(user_id=user.pk, name="script")
    assert api_status(raw) == 200
    return raw


def test_set_password_and_save_revokes_the_users_tokens_at_once(user, other_user, cached_token):
    theirs = ApiToken.issue(user_id=other_user.pk)
    earlier = ApiToken.objects.get(key_hash=ApiToken.hash(ApiToken.issue(user_id=user.pk)))
    earlier.revoked_at = earlier.created_at
    earlier.save(update_fields=["revoked_at"])
    user.set_password(NEW_PASSWORD)
    user.save()
    assert api_status(cached_token) == 401
    assert api_status(theirs) == 200  # another user's token is not touched
    assert not ApiToken.objects.filter(user=user, revoked_at=None).exists()
    earlier_revoked_at = earlier.revoked_at
    earlier.refresh_from_db()
    assert earlier.revoked_at == earlier_revoked_at  # revoked once, not again


def test_saves_that_set_no_password_keep_the_tokens(client, user, cached_token):
    """A log-in (it saves last_login) or another field saved: nothing to revoke."""
    assert client.post("/login/", {"username": user.username, "password": "pw-not-used"}).status_code == 302
    user.refresh_from_db()
    user.email = "new@example.com"
    user.save()
    get_user_model().objects.create_user("newcomer", password=NEW_PASSWORD)  # a new account's first one
    assert api_status(cached_token) == 200
    assert ApiToken.objects.get(key_hash=ApiToken.hash(cached_token)).revoked_at is None


def test_the_password_reset_revokes_the_tokens_and_says_so(client, user, cached_token):
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    link = client.get(f"/password-reset/{uid}/{default_token_generator.make_token(user)}/")
    assert link.status_code == 302  # to the form's own URL, the token kept in the session
    done = client.post(link["Location"], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302
    assert api_status(cached_token) == 401
    page = client.get(done["Location"]).content.decode()
    assert REVOKED_NOTE in page


def test_the_admin_password_change_revokes_the_tokens_and_says_so(client, user, cached_token):
    user.is_staff = True
    user.set_password("pw-of-a-staff-member-1")
    user.save()
    token = ApiToken.issue(user_id=user.pk)  # made after that change
    assert api_status(token) == 200
    client.force_login(user)
    done = client.post("/admin/password_change/", {"old_password": "pw-of-a-staff-member-1",
                                                   "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302
    assert api_status(token) == 401
    page = client.get(done["Location"]).content.decode()
    assert "Your password was changed" in page and REVOKED_NOTE in page


def test_a_password_set_by_staff_in_the_admin_revokes_the_tokens(client, user, cached_token):
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    response = client.post(f"/admin/auth/user/{user.pk}/password/", {
        "password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"})
    assert response.status_code == 302
    assert api_status(cached_token) == 401


def test_manage_py_changepassword_revokes_the_tokens(user, cached_token, monkeypatch):
    from django.contrib.auth.management.commands import changepassword

    monkeypatch.setattr(changepassword.Command, "_get_pass", lambda self, prompt="": NEW_PASSWORD)
    call_command("changepassword", user.username, stdout=None)
    assert api_status(cached_token) == 401


def test_a_password_saved_inside_a_transaction_drops_the_cached_user_again_at_commit(user, cached_token):
    """A request that read the token's row before the COMMIT may cache its user meanwhile (here,
    written by hand where such a request would): the COMMIT drops it again."""
    from django.db import transaction

    from shop.api import tokens

    with transaction.atomic():
        user.set_password(NEW_PASSWORD)
        user.save()
        tokens._cache().set(tokens._cache_key(ApiToken.hash(cached_token)), user, 60)
    assert api_status(cached_token) == 401


def test_a_process_keeps_a_tokens_user_for_token_local_ttl_and_hands_out_copies(user, settings):
    """In front of the shared cache each process keeps the user TOKEN_LOCAL_TTL seconds: a
    revocation made elsewhere (another process: the row and the shared cache, not this
    process's memory) is seen here within that time, and at once where it was made."""
    from shop.api import tokens

    def revoked_elsewhere(raw: str) -> None:
        ApiToken.objects.filter(key_hash=ApiToken.hash(raw)).update(revoked_at=user.date_joined)
        tokens._cache().delete(tokens._cache_key(ApiToken.hash(raw)))  # what another process's revoke() does

    settings.SHOP = {**settings.SHOP, "TOKEN_LOCAL_TTL": 600}  # cannot lapse during the test
    raw = ApiToken.issue(user_id=user.pk, name="script")
    first, second = tokens.user_for_token(raw), tokens.user_for_token(raw)
    assert first.pk == second.pk == user.pk and first is not second  # a view changing its user changes no other
    revoked_elsewhere(raw)
    assert api_status(raw) == 200  # this process has not heard yet

    settings.SHOP = {**settings.SHOP, "TOKEN_LOCAL_TTL": 0.2}
    lapsing = ApiToken.issue(user_id=user.pk, name="lapsing")
    assert api_status(lapsing) == 200
    revoked_elsewhere(lapsing)
    time.sleep(0.4)
    assert api_status(lapsing) == 401  # heard within TOKEN_LOCAL_TTL

    other = ApiToken.issue(user_id=user.pk, name="second")
    assert api_status(other) == 200
    tokens.revoke(token=ApiToken.objects.get(key_hash=ApiToken.hash(other)))
    assert api_status(other) == 401  # revoked here: at once
