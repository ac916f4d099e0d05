"""The shop in the Django admin. Stock and coupon counts change only through the services.

The change forms keep `stock` and `remaining` read-only (fences are not shown), and saves write only the
fields that changed (`update_fields`), so an operator renaming a product can never write back a
stock value read minutes ago. Restock, adjust stock and cancel are custom admin views (not actions
or change forms, which Django wraps in a transaction) that call the services under the same locks;
hiding a product (clearing Active) drops its sold-out marker under its lock once the save commits.
A paid order offers Refund, never Cancel. A product's drop window (Opens at / Closes at on its
form, the "Schedule drop…" and "End sale now" actions over the selected products) is written by
shop.services.drops, which logs who did it, as the command line's `shop drop` does.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from functools import partial

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers, widgets
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F, OuterRef, Subquery
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime
from django.views.decorators.http import require_http_methods

from locks import inspect
from locks.exceptions import LockUnavailable
from shop import account_age, clock, errors
from shop.conf import shop_settings
from shop.exports import line_csv, order_csv
from shop.line.board import board
from shop.models import (
    ENDED,
    OPEN,
    UPCOMING,
    ApiToken,
    Coupon,
    CouponClaim,
    DropLog,
    Order,
    OrderLine,
    OutboxMail,
    Product,
    ProductLine,
    ProductSales,
    Refund,
    StockLedger,
)
from shop.selectors import (
    QUICK_TOKEN,
    RATE_WINDOW,
    STOCK_LEVELS,
    by_stock_level,
    orders_in_chunks,
    product_sales,
    reservations,
    reserved_units,
    sales_totals,
    signups_per_minute,
    units_per_minute,
)
from shop.services import cancel_order, clear_drop, end_drop, inventory, refund_order, restock, schedule_drop
from shop.services.drops import window_problem
from shop.services.lines import MAX_PREQUEUE, steer_line
from shop.templatetags.shop_tags import money
from shop.tokens import revoke

# The Sales view refreshes its figures this often (seconds) while it is open and not paused.
SALES_REFRESH = 5

# Staff changing their own password read that it revoked their API tokens (shop.tokens).
admin.site.password_change_done_template = "admin/shop/password_change_done.html"


def count_of(count: int, noun: str) -> str:
    """"1 product", "2 products": messages say the number in words that agree with it."""
    return f"{count} {noun}{'s' if count != 1 else ''}"


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


def _reason_choices() -> list[tuple[str, str]]:
    """Each reason with the way it goes: "Damaged: removes"."""
    way = {1: "adds", -1: "removes", 0: "adds or removes"}
    return [(r, f"{StockLedger.Reason(r).label}: {way[inventory.ADJUSTMENT_REASONS[r]]}")
            for r in inventory.adjustment_reasons()]


class AdjustStockForm(forms.Form):
    """The fields of an adjustment; `inventory.check_adjustment` (through the service) is the rule."""

    delta = forms.IntegerField(label="Units", help_text="Positive adds units, negative removes them (e.g. -2).")
    reason = forms.ChoiceField(choices=_reason_choices)
    note = forms.CharField(required=False, max_length=inventory.MAX_NOTE_LENGTH,
                           help_text="For the ledger, e.g. “box crushed in transit”.")


# The one-time token an adjustment's confirmation page carries (uuid4().hex): one page, one adjustment.
CONFIRMATION = re.compile(r"[0-9a-f]{32}")

WINDOW = ("opens_at", "closes_at")
# The line's fields (shop/line/), written by `steer_line` as `manage.py shop line` does.
LINE_FIELDS = ("line_prequeue_seconds", "line_order", "line_paused")


def _check_window(opens_at, closes_at) -> None:
    """The service's own check of a window, as a form error before anything is saved."""
    if problem := window_problem(opens_at=opens_at, closes_at=closes_at, now=clock.now()):
        raise ValidationError(problem)


def _to_the_second(value):
    return value.replace(microsecond=0) if value is not None else None


class AccountAgeField(forms.Field):
    """A minimum account age as operators write it ("7d", "24h", "90m"; empty: none), read by
    `shop.account_age.parse_age` as the command line reads it."""

    def prepare_value(self, value):
        return account_age.compact(value) if isinstance(value, timedelta) else value

    def to_python(self, value):
        try:
            return account_age.parse_age(str(value or ""))
        except errors.InvalidAccountAge as exc:
            longest = account_age.describe(account_age.MAX_AGE)
            raise ValidationError(f"Write an age as 7d, 24h, 90m or 45s (at most {longest}), or leave it empty "
                                  f"({exc.message})") from None


class ProductForm(forms.ModelForm):
    """The product form; a moved drop window must close after it opens, and not in the past.

    The widgets show whole seconds, so a window counts as moved (`moved`) only when a field
    differs to the second, and one left as shown keeps its exact time (an "End now" has
    microseconds): renaming a product never rewrites, or re-checks, its window."""

    moved: tuple[str, ...] = ()
    min_account_age = AccountAgeField(
        required=False, label="Min account age",
        help_text="Only accounts at least this old may buy (against bots on fresh accounts): 7d, 24h, 90m. "
                  "Empty: any account.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        zone = timezone.get_current_timezone_name()
        for name in WINDOW:  # the time typed is read in the shop's time zone: say which
            if name in self.fields:
                self.fields[name].label = f"{self.fields[name].label} ({zone})"

    def clean_line_prequeue_seconds(self):
        seconds = self.cleaned_data.get("line_prequeue_seconds")
        if seconds is not None and seconds > MAX_PREQUEUE:
            raise ValidationError(f"The pre-queue window is 0 to {MAX_PREQUEUE} seconds (a week).")
        return seconds

    def clean(self):
        data = super().clean()
        self.moved = tuple(f for f in WINDOW if f in data
                           and _to_the_second(data[f]) != _to_the_second(self.initial.get(f)))
        for f in set(WINDOW) - set(self.moved):
            data[f] = self.initial.get(f)
        if self.moved:
            _check_window(data.get("opens_at"), data.get("closes_at"))
        return data


class DropForm(forms.Form):
    """"Schedule drop…" over the selected products: one window for all of them."""

    opens_at = forms.SplitDateTimeField(required=False, widget=widgets.AdminSplitDateTime,
                                        label="Opens at", help_text="Empty: on sale now.")
    closes_at = forms.SplitDateTimeField(required=False, widget=widgets.AdminSplitDateTime,
                                         label="Closes at", help_text="Empty: no end.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        zone = timezone.get_current_timezone_name()
        for field in self.fields.values():
            field.label = f"{field.label} ({zone})"

    def clean(self):
        data = super().clean()
        if not self.errors:
            _check_window(data.get("opens_at"), data.get("closes_at"))
        return data


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
            return format_html("opens {}", _short_time(obj.opens_at))
        if state == "ended":
            return format_html("ended {}", _short_time(obj.closes_at))
        return format_html("until {}", _short_time(obj.closes_at)) if obj.closes_at else "-"

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


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    extra = 0
    can_delete = False
    exclude = ("unit_price",)  # shown once, as money (unit_price_money), not also raw
    readonly_fields = ("product", "quantity", "unit_price_money")
    unit_price_money = money_column("unit_price", "Unit price")
    template = "admin/shop/order/lines_inline.html"  # no "OrderLine object (1)" above each line

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("product")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


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


def _short_time(value) -> str:
    """"25 Nov 14:03" in the site's time zone, which may wrap before the time: dates that fit a
    1280 px list."""
    if value is None:
        return "-"
    value = localtime(value)
    return format_html('<span class="nowrap">{}</span> {}', date_format(value, "j M"), date_format(value, "H:i"))


# What an operator may do to an order in each status (the services re-check under the locks).


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "state", "amount", "coupon", "ordered", "order_actions")
    list_display_links = ("id",)
    list_filter = (OrderStatusFilter, OrderProductFilter)
    list_select_related = ("user", "coupon")
    # A product's SKU or name finds the orders with a line of it.
    search_fields = ("id", "user__username", "idempotency_key", "lines__product__sku", "lines__product__name")
    inlines = [OrderLineInline]
    readonly_fields = ("user", "status", "subtotal_money", "discount_money", "total_money", "coupon",
                       "idempotency_key", "created_at", "pay_by", "paid_at", "refunded_at", "cancelled_at")
    exclude = ("request_digest", "subtotal", "discount", "total")  # shown once, as money (*_money), not also raw
    subtotal_money = money_column("subtotal", "Subtotal")
    discount_money = money_column("discount", "Discount")
    total_money = money_column("total", "Total")

    class Media:
        css = {"all": ["shop/admin-orders.css"]}

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        """An order is never edited in a form: its change page is read-only (no Save buttons).
        Changes go through the services (cancel, refund); `may_operate` is the permission for those."""
        return False if obj is not None else self.may_operate(request)

    def may_operate(self, request, obj=None) -> bool:
        """Whether the user holds the change permission on orders (needed to cancel or refund one)."""
        return super().has_change_permission(request, obj)

    @admin.display(description="Total", ordering="total")
    def amount(self, obj: Order) -> str:
        return money(obj.total)

    @admin.display(description="Ordered", ordering="created_at")
    def ordered(self, obj: Order) -> str:
        return _short_time(obj.created_at)

    @admin.display(description="Status", ordering="status")
    def state(self, obj: Order) -> str:
        """The status, and under it the pay-by time of an unpaid order (one column, not two)."""
        if obj.status != Order.Status.PENDING_PAYMENT:
            return obj.get_status_display()
        return format_html('{}<br><span class="pay-by">pay by <span class="nowrap">{}</span></span>',
                           obj.get_status_display(), date_format(localtime(obj.pay_by), "j M H:i"))

    def action_url(self, order: Order) -> tuple[str, str] | None:
        """(url, label) of what the order's status allows (cancel or refund), or None."""
        action = order.operator_action
        if action is None:
            return None
        return reverse(f"admin:shop_order_{action}", args=[order.pk]), action.capitalize()

    @admin.display(description="")
    def order_actions(self, obj: Order) -> str:
        found = self.action_url(obj)
        return "" if found is None else format_html('<a href="{}">{}…</a>', *found)

    def get_list_display(self, request):
        """No actions column for staff who may only view orders."""
        shown = super().get_list_display(request)
        return shown if self.may_operate(request) else [f for f in shown if f != "order_actions"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The read-only change page offers Cancel (unpaid) or Refund (paid) among its object tools."""
        order = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if order is not None and self.may_operate(request, order) and (found := self.action_url(order)):
            extra["action_url"], extra["action_label"] = found
        return super().change_view(request, object_id, form_url, extra)

    def get_urls(self):
        def operate(view):
            return self.admin_site.admin_view(require_http_methods(["GET", "POST"])(view))

        return [
            path("<int:order_id>/cancel/", operate(self.cancel_view), name="shop_order_cancel"),
            path("<int:order_id>/refund/", operate(self.refund_view), name="shop_order_refund"),
            path("export.csv", self.admin_site.admin_view(require_http_methods(["GET"])(self.export_view)),
                 name="shop_order_export"),
            path("export-lines.csv",
                 self.admin_site.admin_view(require_http_methods(["GET"])(partial(self.export_view, lines=True))),
                 name="shop_order_export_lines"),
            *super().get_urls(),
        ]

    def may_export(self, request) -> bool:
        return self.has_view_permission(request) and request.user.has_perm("shop.export_order")

    def changelist_view(self, request, extra_context=None):
        """The list offers "Export CSV" (with its current filters and search) to those allowed."""
        extra = dict(extra_context or {})
        if self.may_export(request):
            query = request.GET.urlencode()
            extra["export_url"] = reverse("admin:shop_order_export") + (f"?{query}" if query else "")
            extra["export_lines_url"] = reverse("admin:shop_order_export_lines") + (f"?{query}" if query else "")
        return super().changelist_view(request, extra)

    def export_view(self, request, lines: bool = False):
        """The orders the list shows (same filters and search), newest first, as a streamed CSV:
        one row per order, or (`lines`) one per order line, only the filtered product's if the
        list is filtered by product, each with what it paid (for the books of a drop)."""
        if not self.may_export(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("Unknown filter in the query string.")
        orders = orders_in_chunks(orders=changelist.queryset)
        if lines:
            product = next((f.product_id() for f in changelist.filter_specs if isinstance(f, OrderProductFilter)),
                           None)
            rows, name = line_csv(orders, product_id=product), "order-lines"
        else:
            rows, name = order_csv(orders), "orders"
        response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
        stamp = localtime().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="{name}-{stamp}.csv"'
        return response

    def cancel_view(self, request, order_id: int):
        return self._operate(request, order_id, action="cancel", service=cancel_order,
                             done="cancelled; stock and coupon returned")

    def refund_view(self, request, order_id: int):
        return self._operate(request, order_id, action="refund", service=refund_order,
                             done="refunded; the payment goes back, stock and coupon returned")

    def _operate(self, request, order_id: int, *, action: str, service, done: str):
        """GET: a confirmation page that says the order's state; POST: the service, once."""
        order = get_object_or_404(Order.objects.select_related("user"), pk=order_id)
        if not self.may_operate(request, order):
            raise PermissionDenied
        if request.method == "POST":
            # A cancel tells the buyer why (the mail quotes the reason typed here).
            said = {"reason": request.POST.get("reason", "")} if action == "cancel" else {}
            try:
                service(order=order, actor=f"admin:{request.user.get_username()}", **said)
            except errors.ShopError as exc:
                messages.error(request, exc.message)
            else:
                messages.success(request, f"Order #{order.pk} {done}.")
            return redirect("admin:shop_order_changelist")
        allowed = self.action_url(order)
        return TemplateResponse(request, "admin/shop/order_action.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "order": order, "action": action,
            "allowed": allowed is not None and allowed[0].endswith(f"/{action}/"), "other": allowed,
            "title": f"{action.capitalize()} order #{order.pk}?",
        })

class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class StockLevelFilter(admin.SimpleListFilter):
    title = "stock"
    parameter_name = "stock"

    def lookups(self, request, model_admin):
        low = int(shop_settings.LOW_STOCK)
        return [(k, f"{label} (1-{low} left)" if k == "low" else label) for k, label in STOCK_LEVELS.items()]

    def queryset(self, request, queryset):
        return by_stock_level(queryset, level=self.value())


def _sales_column(field: str, description: str, render=None):
    """A Sales column showing the annotation `field` of `shop.selectors.product_sales`, sortable."""

    @admin.display(description=description, ordering=field)
    def column(obj: Product):
        value = getattr(obj, field)
        return value if render is None else render(value)

    column.__name__ = field
    return column


def _refunded(units: int, amount) -> str:
    """Units refunded and, under them, the money paid back for them."""
    return format_html('{}<br><span class="paid-back">{}</span>', units, money(amount)) if units else "0"


@admin.register(ProductSales)
class ProductSalesAdmin(ReadOnlyAdmin):
    """Shop > Sales by product, to watch a sale: per product, its drop (state and window), units
    sold, their gross (list) amount, what coupons took off and the net revenue (what buyers paid),
    units per minute (over the sale's own active time within the last 5 minutes), units reserved
    by orders awaiting payment, units refunded and the money paid back, stock left; a totals row
    over every product the filters select; the figures refresh every SALES_REFRESH seconds (a
    small script: "updated at", Pause, Refresh now). Filter sold out / low stock / drop state.
    Read-only, its own view permission (`view_productsales`); the reading is
    `shop.selectors.product_sales` and `sales_totals`."""

    # No price column (the product list has it): twelve columns did not fit 1280 px beside the menus.
    list_display = ("name", "sku", "drop", "stock", "units_sold", _sales_column("gross", "Gross", money),
                    _sales_column("coupons", "Coupons", money), _sales_column("revenue", "Net revenue", money),
                    _sales_column("rate", "Units / min", units_per_minute),
                    _sales_column("units_reserved", "Reserved"), "units_refunded")
    list_display_links = None
    list_filter = (StockLevelFilter, DropFilter, "active")
    search_fields = ("name", "sku")
    list_per_page = 50

    class Media:
        css = {"all": ["shop/admin-sales.css"]}
        js = ["shop/admin-sales.js"]

    @admin.display(description="Sold", ordering="units_sold")
    def units_sold(self, obj: Product) -> str:
        """Units sold and, under them, how many of those were paid after the sale's end (placed
        before it: the "End sale now" policy)."""
        if not obj.units_paid_late:
            return str(obj.units_sold)
        return format_html('{}<br><span class="paid-late">{} paid after the end</span>', obj.units_sold,
                           obj.units_paid_late)

    @admin.display(description="Refunded", ordering="units_refunded")
    def units_refunded(self, obj: Product) -> str:
        return _refunded(obj.units_refunded, obj.refunded)

    @admin.display(description="Drop", ordering="closes_at")
    def drop(self, obj: Product) -> str:
        """Where its drop stands, with the window: "open until …", "ended …", "opens …"; "-": none."""
        state = obj.drop_state
        if obj.opens_at is None and obj.closes_at is None:
            return "-"
        if state == "upcoming":
            return format_html("opens {}", _short_time(obj.opens_at))
        if state == "ended":
            return format_html("ended {}", _short_time(obj.closes_at))
        since = format_html(" since {}", _short_time(obj.opens_at)) if obj.opens_at else ""
        until = format_html(" until {}", _short_time(obj.closes_at)) if obj.closes_at else ""
        return format_html("open{}{}", since, until)

    def get_queryset(self, request):
        return product_sales(products=super().get_queryset(request))

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, {
            "title": "Sales by product", "refresh_every": SALES_REFRESH,
            "rate_minutes": int(RATE_WINDOW.total_seconds() // 60), **(extra_context or {})})
        cl = getattr(response, "context_data", None) and response.context_data.get("cl")
        if cl is not None:  # the results template shows it under the rows (it sees `cl`, not this context)
            cl.totals_row = self.totals_row(cl)
        return response

    def totals_row(self, cl) -> list[str]:
        """One cell per column shown: the sums of `sales_totals` over every product the list's
        filters and search select (not only this page)."""
        totals = sales_totals(products=cl.queryset)
        cells = {"name": f"Total ({count_of(totals['products'], 'product')})", "stock": totals["stock"],
                 "units_sold": totals["units_sold"], "gross": money(totals["gross"]),
                 "coupons": money(totals["coupons"]), "revenue": money(totals["revenue"]),
                 "rate": units_per_minute(totals["rate"]), "units_reserved": totals["units_reserved"],
                 "units_refunded": _refunded(totals["units_refunded"], totals["refunded"])}
        return [str(cells.get(getattr(column, "__name__", column), "")) for column in cl.list_display]


# The Lines page's figures refresh this often (seconds): a line moves faster than sales.
LINES_REFRESH = 2


@admin.register(ProductLine)
class ProductLineAdmin(ReadOnlyAdmin):
    """Shop > Lines, to watch and steer a drop's line (docs/design.md, "The line"): per drop, the
    line's state, places, waiting, let through now, now serving, finished and lapsed turns, the
    drain rate, the estimated wait at the back, stock left and reserved, the pre-queue window and
    order. It refreshes itself as the Sales view does. Pause and Resume ask first, then go
    through `steer_line`, as `manage.py shop line --pause/--resume` does (`change_product`)."""

    class Media:
        css = {"all": ["shop/admin-lines.css"]}
        js = ["shop/admin-sales.js"]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(request, "admin/shop/productline/lines.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": "Lines",
            "rows": board(now=clock.now()), "refresh_every": LINES_REFRESH, "media": self.media,
            "may_steer": request.user.has_perm("shop.change_product"), "window": int(shop_settings.LINE_WINDOW),
        })

    def get_urls(self):
        def steer(view):
            return self.admin_site.admin_view(require_http_methods(["GET", "POST"])(view))

        return [
            path("<int:product_id>/pause/", steer(partial(self.steer_view, paused=True)),
                 name="shop_productline_pause"),
            path("<int:product_id>/resume/", steer(partial(self.steer_view, paused=False)),
                 name="shop_productline_resume"),
            *super().get_urls(),
        ]

    def steer_view(self, request, product_id: int, *, paused: bool):
        """A page that asks first (GET); its POST pauses or resumes the line through the service."""
        product = get_object_or_404(Product, pk=product_id)
        if not (self.has_view_permission(request) and request.user.has_perm("shop.change_product")):
            raise PermissionDenied
        if request.method == "POST":
            steer_line(product=product, paused=paused)
            word = "paused: nobody new is let through, places are kept" if paused else "resumed"
            messages.success(request, f"{product.name}: line {word}.")
            return redirect("admin:shop_productline_changelist")
        return TemplateResponse(request, "admin/shop/productline/steer.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "product": product,
            "paused": paused, "title": f"{'Pause' if paused else 'Resume'} the line of {product.name}?",
        })


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


# --- accounts: who signs up, who makes API tokens (issue 36, bots) ----------------------------------
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
    (`shop.selectors.signups_per_minute`)."""

    list_display = ("username", "joined", "first_token", "token_after")
    list_filter = (JoinedFilter, FirstTokenFilter, "is_staff", "is_superuser", "is_active")
    ordering = ("-date_joined",)

    def get_queryset(self, request):
        first = ApiToken.objects.filter(user=OuterRef("pk")).order_by("created_at").values("created_at")[:1]
        return super().get_queryset(request).annotate(first_token_at=Subquery(first))  # a WHERE, not a HAVING

    @admin.display(description="Date joined", ordering="date_joined")
    def joined(self, obj) -> str:
        return _short_time(obj.date_joined)

    @admin.display(description="First API token", ordering="first_token_at")
    def first_token(self, obj) -> str:
        return _short_time(obj.first_token_at)

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
