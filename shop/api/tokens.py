"""Bearer-token authentication for the JSON API (`Authorization: Bearer shp_...`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import time

from django.core.cache import caches
from django.db import connection, transaction
from django.http import HttpRequest
from django.utils import timezone

from shop.conf import shop_settings
from shop.models import ApiToken
from shop.plumbing import redis_keys


class BadToken(Exception):
    """The request sent a bearer token we do not accept (unknown, revoked or malformed)."""


def bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip() or len(raw) > 200:
        raise BadToken("expected 'Authorization: Bearer <token>'")
    return raw.strip()


def _cache_key(key_hash: str) -> str:
    return redis_keys.token_user(key_hash)


def _cache():
    return caches[shop_settings.REDIS_ALIAS]


# key hash -> (time.monotonic() it lapses, the user): TOKEN_LOCAL_TTL, in front of the cache.
_local: dict[str, tuple[float, object]] = {}
LOCAL_MAX = 10_000  # tokens kept per process; past it the oldest entries go


def user_for_token(raw: str):
    """The token's user. Cached for TOKEN_CACHE_TTL seconds: a storm of API requests must not
    send a SELECT each (a sold-out storm is refused with no SQL at all). Cache errors fall back
    to MySQL. In front of that, each process keeps it TOKEN_LOCAL_TTL seconds (a copy per
    request: a view that changes its user changes no other request's)."""
    key_hash = ApiToken.hash(raw)
    if (kept := _local.get(key_hash)) is not None and kept[0] > time.monotonic():
        return copy.copy(kept[1])
    user = _user_for_hash(key_hash)
    local_ttl = float(shop_settings.TOKEN_LOCAL_TTL)
    if local_ttl > 0:
        if len(_local) >= LOCAL_MAX:
            for old in list(_local)[: LOCAL_MAX // 10]:
                _local.pop(old, None)
        _local[key_hash] = (time.monotonic() + local_ttl, copy.copy(user))
    return user


def _user_for_hash(key_hash: str):
    ttl = int(shop_settings.TOKEN_CACHE_TTL)
    if ttl > 0:
        try:
            user = _cache().get(_cache_key(key_hash))
        except Exception:  # Redis away: MySQL still answers
            user = None
        if user is not None:
            return user
    token = ApiToken.objects.select_related("user").filter(key_hash=key_hash).first()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        raise BadToken("unknown or revoked token")
    # At most one write a minute per token, so heavy load tests do not hammer this row.
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    if ttl > 0:
        with contextlib.suppress(Exception):
            _cache().set(_cache_key(key_hash), token.user, ttl)
    return token.user


def users_for_tokens(raws: list[str]) -> dict[str, object]:
    """`user_for_token` for many tokens at once (the line's door, a crowd's first requests): one
    cache read, one SELECT for those not cached, one UPDATE of their `last_used_at`. Unknown,
    revoked and inactive ones are left out."""
    hashes = {raw: ApiToken.hash(raw) for raw in raws}
    ttl = int(shop_settings.TOKEN_CACHE_TTL)
    users: dict[str, object] = {}
    if ttl > 0:
        try:
            cached = _cache().get_many([_cache_key(h) for h in set(hashes.values())])
        except Exception:  # Redis away: MySQL still answers
            cached = {}
        users = {h: user for h in hashes.values() if (user := cached.get(_cache_key(h))) is not None}
    missing = {h for h in hashes.values() if h not in users}
    if missing:
        found = [t for t in ApiToken.objects.select_related("user").filter(key_hash__in=missing)
                 if t.revoked_at is None and t.user.is_active]
        now = timezone.now()
        stale = [t.pk for t in found if t.last_used_at is None or (now - t.last_used_at).total_seconds() > 60]
        if stale:
            ApiToken.objects.filter(pk__in=stale).update(last_used_at=now)
        users.update({t.key_hash: t.user for t in found})
        if ttl > 0 and found:
            with contextlib.suppress(Exception):
                _cache().set_many({_cache_key(t.key_hash): t.user for t in found}, ttl)
    return {raw: users[h] for raw, h in hashes.items() if h in users}


def _forget(key_hash: str) -> None:
    _local.pop(key_hash, None)
    with contextlib.suppress(Exception):
        _cache().delete(_cache_key(key_hash))


def revoke(*, token: ApiToken) -> ApiToken:
    """Revoke now: the row first, then the cached user (if Redis is away, the cache entry lapses
    within TOKEN_CACHE_TTL). Inside a transaction the cached user is dropped again at COMMIT: a
    request that read the row before then may have cached it meanwhile."""
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
        token.refresh_from_db()
    _forget(token.key_hash)
    if connection.in_atomic_block:
        transaction.on_commit(functools.partial(_forget, token.key_hash))
    return token


def revoke_all(*, user_id: int) -> int:
    """Revoke every active token of a user; how many were."""
    tokens = list(ApiToken.objects.filter(user_id=user_id, revoked_at=None))
    for token in tokens:
        revoke(token=token)
    return len(tokens)


def revoke_on_password_change(sender, instance, created: bool = False, raw: bool = False, **kwargs) -> None:
    """post_save of the user model: a new password ends the user's API tokens, whoever held the
    old one may have made them. Every route sets it through set_password() and
    save() (the password-change and reset views, the admin's form, `manage.py changepassword`),
    and AbstractBaseUser keeps the raw password in `_password` until its save() returns; a hash
    upgrade at log-in clears it first, so it revokes nothing."""
    if created or raw or getattr(instance, "_password", None) is None:
        return
    revoke_all(user_id=instance.pk)
