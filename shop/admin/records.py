"""The shop's records, read-only: coupon claims, drop log, stock ledger, refunds, mail outbox."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from locks.admin_base import ReadOnlyAdmin
from shop.models import CouponClaim, DropLog, OutboxMail, Refund, StockLedger


@admin.register(CouponClaim)
class CouponClaimAdmin(ReadOnlyAdmin):
    list_display = ("coupon", "user", "claimed_at", "used_at", "order")
    list_filter = ("coupon",)
    search_fields = ("user__username", "coupon__code")


@admin.register(DropLog)
class DropLogAdmin(ReadOnlyAdmin):
    """Every schedule, move, end or clear of a drop window, and who did it."""

    list_display = ("created_at", "product", "action", "opens_at", "closes_at", "actor")
    list_filter = ("action",)
    list_select_related = ("product",)
    search_fields = ("product__sku", "product__name", "actor")


@admin.register(StockLedger)
class StockLedgerAdmin(ReadOnlyAdmin):
    """Every stock movement, opening stock first: a product's rows sum to its stock."""

    list_display = ("created_at", "product", "quantity", "reason", "note", "order", "fence", "by")
    list_filter = ("reason",)
    list_select_related = ("product", "order__user")
    search_fields = ("product__sku", "actor", "note", "order__user__username")

    @admin.display(description="By", ordering="actor")
    def by(self, obj: StockLedger) -> str:
        """Who moved it: a buyer by username, linked to the user (the row's actor is "user:<id>");
        an operator as written ("admin:<user>", "cli:<user>@<host>")."""
        user = obj.order.user if obj.order is not None else None
        if user is None or obj.actor != f"user:{user.pk}":
            return obj.actor
        return format_html('<a href="{}">{}</a>', reverse("admin:auth_user_change", args=[user.pk]),
                           user.get_username())


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    """Refunds and where each stands (pending / sent / completed), read-only: a refund is asked for
    and finished through the order's "Refund…" (or the `shop.finish_refunds` job)."""

    list_display = ("order", "status", "amount", "actor", "attempts", "created_at", "sent_at", "completed_at",
                    "claimed_until")
    list_filter = ("status",)
    search_fields = ("order__id", "key", "actor")


@admin.register(OutboxMail)
class OutboxMailAdmin(ReadOnlyAdmin):
    """The mail outbox, read-only: what is queued, sent, skipped or given up, with the last error.
    The `shop.send_mail` job sends it (manage.py run_jobs)."""

    list_display = ("id", "kind", "recipient", "order", "status", "attempts", "created_at", "next_attempt_at",
                    "sent_at")
    list_filter = ("status", "kind")
    search_fields = ("recipient", "order__id")
    exclude = ("context",)
