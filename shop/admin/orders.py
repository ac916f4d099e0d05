"""Orders in the admin: read-only pages, cancel and refund through the services, CSV exports."""

from __future__ import annotations

from functools import partial

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime
from django.views.decorators.http import require_http_methods

from shop import errors
from shop.admin.columns import money_column, short_time
from shop.admin.exports import line_csv, order_csv
from shop.admin.filters import OrderProductFilter, OrderStatusFilter
from shop.models import Order, OrderLine
from shop.reads.selectors import orders_in_chunks
from shop.services import cancel_order, refund_order
from shop.templatetags.shop_tags import money


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
        return short_time(obj.created_at)

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
