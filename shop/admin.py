"""The shop in the Django admin. Stock and coupon counts change only through the services.

The change forms keep `stock`, `remaining` and `fence` read-only, and saves write only the
fields that changed (`update_fields`), so an operator renaming a product can never write back a
stock value read minutes ago. Restock and cancel are custom admin views (not actions or change
forms, which Django wraps in a transaction) that call the services under the same locks.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods

from locks import inspect
from locks.exceptions import LockUnavailable
from shop import errors
from shop.conf import shop_settings
from shop.models import RESERVING_STATUSES, ApiToken, Coupon, CouponClaim, Order, OrderLine, Product, StockLedger
from shop.services import cancel_order, restock
from shop.templatetags.shop_tags import money
from shop.tokens import revoke


def money_column(field: str, description: str):
    """A changelist column showing `field` as the shop's pages do ("$1,658.00"), still sortable."""

    @admin.display(description=description, ordering=field)
    def column(self, obj) -> str:
        return money(getattr(obj, field))

    column.__name__ = f"{field}_money"
    return column


class GuardedSaveMixin:
    """Save only what the form changed; never the guarded counters."""

    guarded_fields: tuple[str, ...] = ()

    def save_model(self, request, obj, form, change):
        if not change:
            obj.save()
            return
        fields = [f for f in form.changed_data if f not in self.guarded_fields]
        if fields:
            obj.save(update_fields=fields)


def lock_state(name: str) -> str:
    try:
        info = inspect.lock_info(name)
    except LockUnavailable:
        return "unknown (Redis down)"
    if info is None:
        return "free"
    return f"held · {info.ttl_left:.1f}s left" + (f" · {info.waiters} waiting" if info.waiters else "")


class RestockForm(forms.Form):
    quantity = forms.IntegerField(min_value=1, max_value=1_000_000)


@admin.register(Product)
class ProductAdmin(GuardedSaveMixin, admin.ModelAdmin):
    list_display = ("name", "sku", "price_money", "stock", "max_per_user", "active", "lock", "restock_link")
    list_filter = ("active",)
    search_fields = ("name", "sku")
    readonly_fields = ("stock", "fence", "created_at", "updated_at")
    guarded_fields = ("stock", "fence")
    price_money = money_column("price", "Price")

    def get_readonly_fields(self, request, obj=None):
        # A new product gets its opening stock from the form; after that only the services move it.
        return ("fence", "created_at", "updated_at") if obj is None else self.readonly_fields

    @admin.display(description="Lock")
    def lock(self, obj: Product) -> str:
        return lock_state(obj.lock_name)

    @admin.display(description="")
    def restock_link(self, obj: Product) -> str:
        return format_html('<a href="{}">Restock…</a>', reverse("admin:shop_product_restock", args=[obj.pk]))

    def get_list_display(self, request):
        """No restock column for staff who may only view products."""
        shown = super().get_list_display(request)
        return shown if self.has_change_permission(request) else [f for f in shown if f != "restock_link"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The change page offers Restock among its object tools (staff who may change products)."""
        product = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if product is not None and self.has_change_permission(request, product):
            extra["restock_url"] = reverse("admin:shop_product_restock", args=[product.pk])
        return super().change_view(request, object_id, form_url, extra)

    def get_urls(self):
        return [
            path("<int:product_id>/restock/", self.admin_site.admin_view(self.restock_view),
                 name="shop_product_restock"),
            *super().get_urls(),
        ]

    def restock_view(self, request, product_id: int):
        product = get_object_or_404(Product, pk=product_id)
        if not self.has_change_permission(request, product):
            raise PermissionDenied
        form = RestockForm(request.POST or None)
        form.fields["quantity"].max_value = int(shop_settings.MAX_RESTOCK)
        if request.method == "POST" and form.is_valid():
            try:
                product = restock(product=product, quantity=form.cleaned_data["quantity"],
                                  actor=f"admin:{request.user.get_username()}")
            except errors.ShopError as exc:
                messages.error(request, exc.message)
            else:
                added = form.cleaned_data["quantity"]
                messages.success(request, f"{product.name}: +{added}, stock now {product.stock}.")
                return redirect("admin:shop_product_changelist")
        return TemplateResponse(request, "admin/shop/restock.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "product": product, "form": form,
            "title": f"Restock {product.name}", "lock": lock_state(product.lock_name),
        })


@admin.register(Coupon)
class CouponAdmin(GuardedSaveMixin, admin.ModelAdmin):
    list_display = ("code", "discount_money", "total", "remaining", "claims", "valid_from", "valid_until", "active",
                    "lock")
    list_filter = ("active",)
    search_fields = ("code",)
    guarded_fields = ("total", "remaining", "fence")
    discount_money = money_column("discount", "Discount")

    def get_readonly_fields(self, request, obj=None):
        return ("fence", "created_at") if obj is None else ("total", "remaining", "fence", "created_at")

    def save_model(self, request, obj, form, change):
        if not change:
            obj.remaining = obj.total
        super().save_model(request, obj, form, change)

    def get_exclude(self, request, obj=None):
        return ("remaining",) if obj is None else ()

    @admin.display(description="Claims")
    def claims(self, obj: Coupon) -> int:
        return obj.total - obj.remaining

    @admin.display(description="Lock")
    def lock(self, obj: Coupon) -> str:
        return lock_state(obj.lock_name)


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    extra = 0
    can_delete = False
    readonly_fields = ("product", "quantity", "unit_price_money")
    unit_price_money = money_column("unit_price", "Unit price")
    template = "admin/shop/order/lines_inline.html"  # labels each line "2 x Name @ 129.00"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("product")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "status", "total_money", "coupon", "created_at", "pay_by", "cancel_link")
    list_filter = ("status",)
    search_fields = ("id", "user__username", "idempotency_key")
    inlines = [OrderLineInline]
    readonly_fields = ("user", "status", "subtotal_money", "discount_money", "total_money", "coupon", "idempotency_key",
                       "created_at", "pay_by", "paid_at", "cancelled_at")
    exclude = ("request_digest",)
    subtotal_money = money_column("subtotal", "Subtotal")
    discount_money = money_column("discount", "Discount")
    total_money = money_column("total", "Total")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        """An order is never edited in a form: its change page is read-only (no Save buttons).
        Changes go through the services (cancel); `may_operate` is the permission for those."""
        return False if obj is not None else self.may_operate(request)

    def may_operate(self, request, obj=None) -> bool:
        """Whether the user holds the change permission on orders (needed to cancel one)."""
        return super().has_change_permission(request, obj)

    def get_list_display(self, request):
        """No cancel column for staff who may only view orders."""
        shown = super().get_list_display(request)
        return shown if self.may_operate(request) else [f for f in shown if f != "cancel_link"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The read-only change page offers Cancel among its object tools while the order holds stock."""
        order = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if order is not None and order.status in RESERVING_STATUSES and self.may_operate(request, order):
            extra["cancel_url"] = reverse("admin:shop_order_cancel", args=[order.pk])
        return super().change_view(request, object_id, form_url, extra)

    @admin.display(description="")
    def cancel_link(self, obj: Order) -> str:
        if obj.status not in RESERVING_STATUSES:
            return ""
        return format_html('<a href="{}">Cancel…</a>', reverse("admin:shop_order_cancel", args=[obj.pk]))

    def get_urls(self):
        view = self.admin_site.admin_view(require_http_methods(["GET", "POST"])(self.cancel_view))
        return [path("<int:order_id>/cancel/", view, name="shop_order_cancel"), *super().get_urls()]

    def cancel_view(self, request, order_id: int):
        order = get_object_or_404(Order, pk=order_id)
        if not self.may_operate(request, order):
            raise PermissionDenied
        if request.method == "POST":
            try:
                cancel_order(order=order, actor=f"admin:{request.user.get_username()}")
            except errors.ShopError as exc:
                messages.error(request, exc.message)
            else:
                messages.success(request, f"Order #{order.pk} cancelled; stock and coupon returned.")
            return redirect("admin:shop_order_changelist")
        return TemplateResponse(request, "admin/shop/cancel_order.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "order": order,
            "title": f"Cancel order #{order.pk}?",
        })


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CouponClaim)
class CouponClaimAdmin(ReadOnlyAdmin):
    list_display = ("coupon", "user", "claimed_at", "used_at", "order")
    list_filter = ("coupon",)
    search_fields = ("user__username", "coupon__code")


@admin.register(StockLedger)
class StockLedgerAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "product", "quantity", "reason", "order", "fence", "actor")
    list_filter = ("reason",)
    search_fields = ("product__sku", "actor")


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
        self.message_user(request, f"Revoked {queryset.count()} token(s).")
