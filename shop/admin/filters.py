"""List filters of the shop's admin: drop state, order status and product, stock level, sign-ups."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import F
from django.utils import timezone

from shop.conf import shop_settings
from shop.models import ENDED, OPEN, UPCOMING, Order, Product
from shop.reads.selectors import QUICK_TOKEN, STOCK_LEVELS, by_stock_level


class DropFilter(admin.SimpleListFilter):
    """Where each product stands in its drop window now (the ones of one drop, to select and move)."""

    title = "drop"
    parameter_name = "drop"

    def lookups(self, request, model_admin):
        return [("upcoming", "Upcoming"), ("open", "Open (a window, on sale now)"), ("ended", "Ended"),
                ("none", "No window")]

    def queryset(self, request, queryset):
        if self.value() in (UPCOMING, ENDED):
            return queryset.in_drop_state(self.value())
        if self.value() == OPEN:
            return queryset.windowed().in_drop_state(OPEN)
        if self.value() == "none":
            return queryset.filter(opens_at__isnull=True, closes_at__isnull=True)
        return queryset


class OrderStatusFilter(admin.SimpleListFilter):
    """The lifecycle's statuses; the legacy "placed" only while such orders exist."""

    title = "status"
    parameter_name = "status__exact"

    def lookups(self, request, model_admin):
        legacy = Order.objects.filter(status=Order.Status.PLACED).exists()
        return [(value, label) for value, label in Order.Status.choices
                if value != Order.Status.PLACED or legacy]

    def queryset(self, request, queryset):
        return queryset.filter(status=self.value()) if self.value() else queryset


class OrderProductFilter(admin.SimpleListFilter):
    """Orders with a line of one product (the products that have orders): a drop's orders, for
    the list and its exports."""

    title = "product"
    parameter_name = "product"

    def lookups(self, request, model_admin):
        return [(str(p.pk), f"{p.name} ({p.sku})")
                for p in Product.objects.filter(order_lines__isnull=False).distinct().order_by("name", "pk")]

    def queryset(self, request, queryset):
        product_id = self.product_id()
        return queryset if product_id is None else queryset.filter(lines__product_id=product_id).distinct()

    def product_id(self) -> int | None:
        value = self.value()
        return int(value) if value and value.isdigit() else None


class StockLevelFilter(admin.SimpleListFilter):
    title = "stock"
    parameter_name = "stock"

    def lookups(self, request, model_admin):
        low = int(shop_settings.LOW_STOCK)
        return [(k, f"{label} (1-{low} left)" if k == "low" else label) for k, label in STOCK_LEVELS.items()]

    def queryset(self, request, queryset):
        return by_stock_level(queryset, level=self.value())


class JoinedFilter(admin.SimpleListFilter):
    title = "joined"
    parameter_name = "joined"
    SPANS = {"hour": ("In the last hour", timedelta(hours=1)), "day": ("In the last day", timedelta(days=1)),
             "week": ("In the last 7 days", timedelta(days=7))}

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in self.SPANS.items()]

    def queryset(self, request, queryset):
        if self.value() not in self.SPANS:
            return queryset
        return queryset.filter(date_joined__gt=timezone.now() - self.SPANS[self.value()][1])


class FirstTokenFilter(admin.SimpleListFilter):
    title = "first API token"
    parameter_name = "first_token"

    def lookups(self, request, model_admin):
        return [("quick", f"Within {int(QUICK_TOKEN.total_seconds())} s of sign-up"), ("any", "Has one"),
                ("none", "None")]

    def queryset(self, request, queryset):
        return {
            "quick": lambda: queryset.filter(first_token_at__lte=F("date_joined") + QUICK_TOKEN),
            "any": lambda: queryset.filter(first_token_at__isnull=False),
            "none": lambda: queryset.filter(first_token_at__isnull=True),
        }.get(self.value(), lambda: queryset)()
