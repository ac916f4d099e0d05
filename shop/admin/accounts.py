"""Accounts and API tokens in the admin: who signs up, who makes tokens (against bots)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from shop.admin.columns import count_of, short_time
from shop.admin.filters import FirstTokenFilter, JoinedFilter
from shop.api.tokens import revoke
from shop.models import ApiToken
from shop.reads.selectors import QUICK_TOKEN, signups_per_minute

# Staff changing their own password read that it revoked their API tokens (shop.api.tokens).
admin.site.password_change_done_template = "admin/shop/password_change_done.html"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("prefix", "user", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke_tokens"]
    exclude = ("key_hash",)

    def has_add_permission(self, request) -> bool:
        return False  # `manage.py apitoken create` or the user's own page: the token is shown once

    # Revoking is a change: staff who may only view tokens must not see (or post) the action.
    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request, queryset):
        for token in queryset:
            revoke(token=token)
        self.message_user(request, f"Revoked {count_of(queryset.count(), 'token')}.")


def _short_span(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h" if seconds < 2 * 86400 else f"{seconds // 86400} days"


class AccountAdmin(UserAdmin):
    """Django's user admin, plus what an operator watching for bots asks: when each account joined,
    when it made its first API token and how soon after sign-up (scripts do it at once), filters
    for both, and over the list the last hour's sign-ups and tokens per minute
    (`shop.reads.selectors.signups_per_minute`)."""

    list_display = ("username", "joined", "first_token", "token_after")
    list_filter = (JoinedFilter, FirstTokenFilter, "is_staff", "is_superuser", "is_active")
    ordering = ("-date_joined",)

    def get_queryset(self, request):
        first = ApiToken.objects.filter(user=OuterRef("pk")).order_by("created_at").values("created_at")[:1]
        return super().get_queryset(request).annotate(first_token_at=Subquery(first))  # a WHERE, not a HAVING

    @admin.display(description="Date joined", ordering="date_joined")
    def joined(self, obj) -> str:
        return short_time(obj.date_joined)

    @admin.display(description="First API token", ordering="first_token_at")
    def first_token(self, obj) -> str:
        return short_time(obj.first_token_at)

    @admin.display(description="Token after sign-up")
    def token_after(self, obj) -> str:
        return _short_span(obj.first_token_at - obj.date_joined) if obj.first_token_at else "-"

    def changelist_view(self, request, extra_context=None):
        minutes = signups_per_minute(now=timezone.now())
        totals = {k: sum(m[k] for m in minutes) for k in ("accounts", "tokens", "quick_tokens")}
        return super().changelist_view(request, {"signups": minutes, "signups_total": totals,
                                                 "quick_seconds": int(QUICK_TOKEN.total_seconds()),
                                                 **(extra_context or {})})


User = get_user_model()


if admin.site.is_registered(User):
    admin.site.unregister(User)


admin.site.register(User, AccountAdmin)
