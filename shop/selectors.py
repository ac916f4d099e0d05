"""The shop's reads (the writes are in shop.services)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from decimal import Decimal

from django.db.models import Case, Count, DecimalField, F, OuterRef, Prefetch, QuerySet, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_redis import get_redis_connection

from shop import errors, redis_keys
from shop.conf import shop_settings
from shop.models import Coupon, CouponClaim, Order, OrderLine, Product


def product_list(*, include_inactive: bool = False) -> QuerySet[Product]:
    """The catalog: listed products, those whose sale has ended last."""
    ended = Case(When(closes_at__lte=timezone.now(), then=Value(1)), default=Value(0))
    qs = Product.objects.alias(ended=ended).order_by("ended", "id")
    return qs if include_inactive else qs.listed()


def product_detail(*, id: int) -> Product:
    product = Product.objects.listed().filter(pk=id).first()
    if product is None:
        raise errors.UnknownProduct(details={"product_ids": [id]})
    return product


def _orders() -> QuerySet[Order]:
    return Order.objects.select_related("coupon").prefetch_related(
        Prefetch("lines", queryset=OrderLine.objects.select_related("product").order_by("product_id"))
    )


def orders_for_user(*, user) -> QuerySet[Order]:
    return _orders().filter(user=user).order_by("-id")


def order_for_user(*, user, order_id: int) -> Order:
    """Only the owner sees an order; anyone else gets the same 404 as for a missing one."""
    order = _orders().filter(pk=order_id, user=user).first()
    if order is None:
        raise errors.OrderNotFound(details={"order_id": order_id})
    return order


def order_complete(*, user, order_id: int | None = None, idempotency_key: str | None = None) -> Order | None:
    """The user's order by id or by Idempotency-Key, with its coupon, lines and products, or None."""
    found = _orders().filter(user=user)
    found = found.filter(pk=order_id) if order_id is not None else found.filter(idempotency_key=idempotency_key)
    return found.first()


def coupon_list(*, active_only: bool = True) -> QuerySet[Coupon]:
    qs = Coupon.objects.annotate(claim_count=Count("claims")).order_by("id")
    return qs.filter(active=True) if active_only else qs


def claims_for_user(*, user) -> QuerySet[CouponClaim]:
    return CouponClaim.objects.filter(user=user).select_related("coupon", "order").order_by("-id")


def usable_claims_for_user(*, user) -> QuerySet[CouponClaim]:
    return claims_for_user(user=user).filter(used_at__isnull=True)


def products_by_id(ids: list[int], *, include_inactive: bool = False) -> dict[int, Product]:
    """Products by id; hidden ones only for staff (to others they do not exist: a cart flags
    them as gone rather than dropping them)."""
    qs = Product.objects.all() if include_inactive else Product.objects.listed()
    return qs.in_bulk(ids)


# --- the operator's views ---------------------------------------------------------------------
# Sold: paid orders, and the legacy "placed" ones (settled before the payment step existed).
SOLD_STATUSES = (Order.Status.PAID, Order.Status.PLACED)
STOCK_LEVELS = {"sold_out": "Sold out", "low": "Low stock", "in_stock": "In stock"}
_MONEY = DecimalField(max_digits=14, decimal_places=2)


def _lines_total(expression, statuses: tuple[str, ...], output_field=None):
    """Per product (a correlated subquery: evaluated for the rows shown, not the whole catalog)."""
    lines = (OrderLine.objects.filter(product=OuterRef("pk"), order__status__in=statuses)
             .order_by().values("product").annotate(n=Sum(expression, output_field=output_field)).values("n"))
    zero = Value(Decimal("0.00"), output_field=_MONEY) if output_field is not None else Value(0)
    return Coalesce(Subquery(lines, output_field=output_field), zero, output_field=output_field)


def by_stock_level(products: QuerySet[Product], *, level: str | None) -> QuerySet[Product]:
    """Sold out (0 left), low (1 to SHOP["LOW_STOCK"] left) or in stock (more); None: all."""
    low = int(shop_settings.LOW_STOCK)
    if level == "sold_out":
        return products.filter(stock=0)
    if level == "low":
        return products.filter(stock__gt=0, stock__lte=low)
    if level == "in_stock":
        return products.filter(stock__gt=low)
    return products


def product_sales(*, stock: str | None = None, products: QuerySet[Product] | None = None) -> QuerySet[Product]:
    """Products annotated with what an operator asks during a sale: `units_sold` and `revenue`
    (paid orders, at the lines' list prices: a coupon's discount belongs to its order, not to a
    line), `units_reserved` (awaiting payment: they return if unpaid) and `units_refunded`.
    `stock`: a key of STOCK_LEVELS, or None for all."""
    products = Product.objects.all() if products is None else products
    products = products.annotate(
        units_sold=_lines_total("quantity", SOLD_STATUSES),
        revenue=_lines_total(F("quantity") * F("unit_price"), SOLD_STATUSES, _MONEY),
        units_reserved=_lines_total("quantity", (Order.Status.PENDING_PAYMENT,)),
        units_refunded=_lines_total("quantity", (Order.Status.REFUNDED,)),
    )
    return by_stock_level(products, level=stock).order_by("id")


def orders_in_chunks(*, orders: QuerySet[Order], chunk_size: int = 1000) -> Iterator[Order]:
    """Every order of `orders`, newest first, with buyer, coupon and lines (their products), read
    `chunk_size` at a time by keyset (id < the last one seen): an export of a million orders
    holds one chunk in memory, and each chunk is one indexed range read plus one for its lines
    (MySQL drivers buffer a whole result set, so one big query would not stream)."""
    base = orders.order_by("-pk").select_related("user", "coupon").prefetch_related(
        Prefetch("lines", queryset=OrderLine.objects.select_related("product").order_by("id")))
    last: int | None = None
    while True:
        chunk = list((base if last is None else base.filter(pk__lt=last))[:chunk_size])
        yield from chunk
        if len(chunk) < chunk_size:
            return
        last = chunk[-1].pk


def fence_refusals(*, lock_names: Iterable[str]) -> int:
    """How often the fence refused a stale holder's write under these lock names, counted by every
    process of every app server (shop/plumbing/fence_refusals.py): what a failover test reports."""
    keys = [redis_keys.fence_refusals(name) for name in lock_names]
    if not keys:
        return 0
    pipe = get_redis_connection(shop_settings.REDIS_ALIAS).pipeline(transaction=False)
    for k in keys:  # GETs, not one MGET: on Redis Cluster the keys live in different slots
        pipe.get(k)
    return sum(int(v) for v in pipe.execute() if v is not None)
