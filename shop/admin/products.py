"""Products and coupons in the admin: counts change only through the services."""

from __future__ import annotations

import re
import uuid
from functools import partial

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods

from shop import errors
from shop.admin.columns import count_of, lock_state, money_column, short_time
from shop.admin.filters import DropFilter
from shop.admin.forms import WINDOW, AdjustStockForm, DropForm, ProductForm, RestockForm
from shop.conf import shop_settings
from shop.models import Coupon, Product, StockLedger
from shop.reads.selectors import reservations, reserved_units
from shop.services import clear_drop, end_drop, inventory, restock, schedule_drop
from shop.services.lines import steer_line


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


# The one-time token an adjustment's confirmation page carries (uuid4().hex): one page, one adjustment.
CONFIRMATION = re.compile(r"[0-9a-f]{32}")


# The line's fields (shop/line/), written by `steer_line` as `manage.py shop line` does.
LINE_FIELDS = ("line_prequeue_seconds", "line_order", "line_paused")


@admin.register(Product)
class ProductAdmin(GuardedSaveMixin, admin.ModelAdmin):
    form = ProductForm
    list_display = ("name", "sku", "price_money", "stock", "max_per_user", "active", "drop", "lock", "stock_links")
    list_filter = ("active", DropFilter)
    search_fields = ("name", "sku")
    readonly_fields = ("stock", "created_at", "updated_at")  # not the fence: the ledger and lock dashboard show it
    # The window is written by the drop service (with its log row), the line's fields by
    # `steer_line`, not by the form's save.
    guarded_fields = ("stock", "fence", *WINDOW, *LINE_FIELDS)
    price_money = money_column("price", "Price")
    actions = ["schedule_drop_action", "end_sale_now"]

    def save_model(self, request, obj, form, change):
        window = [getattr(obj, f) for f in WINDOW]
        moved = bool(getattr(form, "moved", ()))
        if not change:
            obj.opens_at = obj.closes_at = None  # a new product's window, too, goes through the service
        super().save_model(request, obj, form, change)
        if not change:
            inventory.open_stock(product=obj, actor=f"admin:{request.user.get_username()}")
        if moved:
            self._schedule(request, obj, *window)
        if steered := {f: form.cleaned_data[f] for f in LINE_FIELDS if f in form.changed_data}:
            steer_line(product=obj, paused=steered.get("line_paused"),
                       prequeue_seconds=steered.get("line_prequeue_seconds"), order=steered.get("line_order"))
        if change and "active" in form.changed_data and not obj.active:
            # The admin's save is one transaction: its sold-out marker goes once the hide commits.
            transaction.on_commit(partial(self._hidden, request, obj))

    def _schedule(self, request, product: Product, opens_at, closes_at) -> None:
        """The form's window, through the service (inside the form's transaction: they commit together)."""
        actor = f"admin:{request.user.get_username()}"
        try:
            if opens_at is None and closes_at is None:
                clear_drop(products=[product], actor=actor)
            else:
                schedule_drop(products=[product], opens_at=opens_at, closes_at=closes_at, actor=actor)
        except errors.ShopError as exc:
            messages.error(request, f"{product.name}: the drop window was not changed ({exc.message})")
            return
        product.opens_at, product.closes_at = opens_at, closes_at

    @admin.display(description="Drop")
    def drop(self, obj: Product) -> str:
        state = obj.drop_state
        if state == "upcoming":
            return format_html("opens {}", short_time(obj.opens_at))
        if state == "ended":
            return format_html("ended {}", short_time(obj.closes_at))
        return format_html("until {}", short_time(obj.closes_at)) if obj.closes_at else "-"

    @admin.action(description="Schedule drop for the selected products…", permissions=["change"])
    def schedule_drop_action(self, request, queryset):
        """One window for every selected product: a page asks for it, then the service, once."""
        form = DropForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            try:
                changed = schedule_drop(products=list(queryset), opens_at=form.cleaned_data["opens_at"],
                                        closes_at=form.cleaned_data["closes_at"],
                                        actor=f"admin:{request.user.get_username()}")
            except errors.ShopError as exc:
                self.message_user(request, exc.message, messages.ERROR)
            else:
                self.message_user(request, f"Drop scheduled for {count_of(len(changed), 'product')}.",
                                  messages.SUCCESS)
            return None
        return TemplateResponse(request, "admin/shop/schedule_drop.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "products": queryset, "form": form,
            "title": "Schedule drop", "zone": timezone.get_current_timezone_name(),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media + form.media,
        })

    @admin.action(description="End sale now for the selected products…", permissions=["change"])
    def end_sale_now(self, request, queryset):
        """A confirmation page (what ends, what happens to orders awaiting payment), then the
        service, once: orders are refused from the moment it runs."""
        if "confirm" in request.POST:
            try:
                changed = end_drop(products=list(queryset), actor=f"admin:{request.user.get_username()}")
            except errors.ShopError as exc:
                self.message_user(request, exc.message, messages.ERROR)
                return None
            self.message_user(request, f"Sale ended for {count_of(len(changed), 'product')}: orders are "
                                       f"refused from now on; orders awaiting payment may still be paid until "
                                       f"their pay-by time.", messages.SUCCESS)
            return None
        products = list(queryset.order_by("pk"))
        held = reservations(product_ids=[p.pk for p in products])
        for product in products:
            product.held = held.get(product.pk)
        return TemplateResponse(request, "admin/shop/end_sale.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "products": products,
            "title": "End the sale now?", "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "orders": sum(h["orders"] for h in held.values()), "units": sum(h["units"] for h in held.values()),
            "last_pay_by": max((h["last_pay_by"] for h in held.values()), default=None),
        })

    def _hidden(self, request, product: Product) -> None:
        try:
            inventory.hidden(product_id=product.pk)
        except errors.ShopError as exc:
            messages.warning(request, f"{product.name} is hidden, but its sold-out marker could not be cleared yet "
                                      f"({exc.message}): until the jobs runner (manage.py run_jobs) clears it, "
                                      f"within seconds once the product's lock is free, buyers may still be told "
                                      f"it is sold out.")

    def get_readonly_fields(self, request, obj=None):
        # A new product gets its opening stock from the form; after that only the services move it.
        return ("created_at", "updated_at") if obj is None else self.readonly_fields

    @admin.display(description="Lock")
    def lock(self, obj: Product) -> str:
        return lock_state(obj.lock_name)

    @admin.display(description="")
    def stock_links(self, obj: Product) -> str:
        return format_html('<a href="{}">Restock…</a> <a href="{}" class="nowrap">Adjust…</a>',
                           reverse("admin:shop_product_restock", args=[obj.pk]),
                           reverse("admin:shop_product_adjust", args=[obj.pk]))

    def get_list_display(self, request):
        """No restock / adjust column for staff who may only view products."""
        shown = super().get_list_display(request)
        return shown if self.has_change_permission(request) else [f for f in shown if f != "stock_links"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The change page offers Restock and Adjust stock among its object tools (staff who may
        change products)."""
        product = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if product is not None and self.has_change_permission(request, product):
            extra["restock_url"] = reverse("admin:shop_product_restock", args=[product.pk])
            extra["adjust_url"] = reverse("admin:shop_product_adjust", args=[product.pk])
        return super().change_view(request, object_id, form_url, extra)

    def get_urls(self):
        return [
            path("<int:product_id>/restock/", self.admin_site.admin_view(self.restock_view),
                 name="shop_product_restock"),
            path("<int:product_id>/adjust/",
                 self.admin_site.admin_view(require_http_methods(["GET", "POST"])(self.adjust_view)),
                 name="shop_product_adjust"),
            *super().get_urls(),
        ]

    def adjust_view(self, request, product_id: int):
        """Adjust stock…: the form (units signed, reason, note); POSTed, a confirmation page with the
        stock before and after; confirmed, the service (`adjust_stock`, under the product's lock),
        once. A refusal (typed, nothing written) shows its message over the form."""
        product = get_object_or_404(Product, pk=product_id)
        if not self.has_change_permission(request, product):
            raise PermissionDenied
        form = AdjustStockForm(request.POST or None)
        confirm = False
        if request.method == "POST" and form.is_valid():
            delta, reason, note = (form.cleaned_data[f] for f in ("delta", "reason", "note"))
            token = request.POST.get("confirmation", "")
            try:
                if "confirm" not in request.POST or not CONFIRMATION.fullmatch(token):
                    inventory.check_adjustment(delta=delta, reason=reason, note=note)  # refused before asking
                    confirm = True
                else:
                    done = inventory.adjust_stock(product=product, delta=delta, reason=reason, note=note,
                                                  actor=f"admin:{request.user.get_username()}", confirmation=token)
                    label = StockLedger.Reason(done.reason).label
                    messages.success(request, f"{product.name}: {done.delta:+d} ({label}), stock {done.before} → "
                                              f"{done.after}.")
                    return redirect("admin:shop_product_changelist")
            except errors.AdjustmentAlreadyApplied as exc:  # the same page sent twice: said, not an error
                messages.warning(request, exc.message)
                return redirect("admin:shop_product_changelist")
            except errors.ShopError as exc:
                messages.error(request, exc.message)
        product.refresh_from_db()
        return TemplateResponse(request, "admin/shop/adjust_stock.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "product": product, "form": form,
            "title": f"Adjust the stock of {product.name}", "lock": lock_state(product.lock_name),
            "reserved": reserved_units(product_id=product.pk), "confirm": confirm,
            "after": product.stock + form.cleaned_data["delta"] if confirm else None,
            "reason_label": StockLedger.Reason(form.cleaned_data["reason"]).label if confirm else "",
            "confirmation": uuid.uuid4().hex if confirm else "",
        })

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

    exclude = ("fence",)  # the lock's business, as on the product form

    def get_readonly_fields(self, request, obj=None):
        return ("created_at",) if obj is None else ("total", "remaining", "created_at")

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
