"""Bearer-token authentication for the JSON API (`Authorization: Bearer shp_...`)."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils import timezone

from shop.models import ApiToken


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


def user_for_token(raw: str):
    token = ApiToken.objects.select_related("user").filter(key_hash=ApiToken.hash(raw)).first()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        raise BadToken("unknown or revoked token")
    # At most one write a minute per token, so heavy load tests do not hammer this row.
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
        token.refresh_from_db()
    return token
