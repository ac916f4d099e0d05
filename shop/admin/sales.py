"""The live pages: Sales by product and Lines, refreshing themselves while open."""

from __future__ import annotations

from functools import partial

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods

from locks.admin_base import ReadOnlyAdmin
from shop.admin.columns import count_of, short_time
from shop.admin.filters import DropFilter, StockLevelFilter
from shop.conf import shop_settings
from shop.line.board import board
from shop.models import Product, ProductLine, ProductSales
from shop.plumbing import clock
from shop.reads.selectors import RATE_WINDOW, product_sales, sales_totals, units_per_minute
from shop.services.lines import steer_line
from shop.templatetags.shop_tags import money

# The Sales view refreshes its figures this often (seconds) while it is open and not paused.
SALES_REFRESH = 5


def _sales_column(field: str, description: str, render=None):
    """A Sales column showing the annotation `field` of `shop.reads.selectors.product_sales`, sortable."""

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
    `shop.reads.selectors.product_sales` and `sales_totals`."""

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
            return format_html("opens {}", short_time(obj.opens_at))
        if state == "ended":
            return format_html("ended {}", short_time(obj.closes_at))
        since = format_html(" since {}", short_time(obj.opens_at)) if obj.opens_at else ""
        until = format_html(" until {}", short_time(obj.closes_at)) if obj.closes_at else ""
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
