"""The shop's reads (the writes are in shop.services)."""

from __future__ import annotations

from django.db.models import Count, Prefetch, QuerySet

from shop import errors
from shop.models import Coupon, CouponClaim, Order, OrderLine, Product


def product_list(*, include_inactive: bool = False) -> QuerySet[Product]:
    qs = Product.objects.order_by("id")
    return qs if include_inactive else qs.filter(active=True)


def product_detail(*, id: int) -> Product:
    product = Product.objects.filter(pk=id, active=True).first()
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
    qs = Product.objects.all() if include_inactive else Product.objects.filter(active=True)
    return qs.in_bulk(ids)
