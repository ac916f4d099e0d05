"""The shop's reads (the writes are in shop.services)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    DateTimeField,
    DecimalField,
    ExpressionWrapper,
    F,
    Func,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Greatest, Least, Mod
from django.utils import timezone
from django_redis import get_redis_connection

from shop import errors
from shop.conf import shop_settings
from shop.models import (
    ENDED,
    RESERVING_STATUSES,
    ApiToken,
    Coupon,
    CouponClaim,
    Order,
    OrderLine,
    Product,
    ProductQuerySet,
)
from shop.plumbing import clock, redis_keys
from shop.reads.compiled import TimedRead


def product_list(*, include_inactive: bool = False) -> QuerySet[Product]:
    """The catalog: listed products, those whose sale has ended last (by the database's clock)."""
    ended = Case(When(ProductQuerySet.drop_state_is(ENDED, clock.now()), then=Value(1)), default=Value(0))
    qs = Product.objects.alias(ended=ended).order_by("ended", "id")
    return qs if include_inactive else qs.listed()


# A product page asks for its drop window every few seconds (`drop_window`): each process keeps
# what it read for WINDOW_TTL seconds, so a crowd on one page costs one query per process per
# WINDOW_TTL, not one per poll. An "End sale now" shows within WINDOW_TTL plus the poll's interval.
WINDOW_TTL = 2.0
_windows: dict[int, tuple[float, dict]] = {}


def drop_window(*, product_id: int) -> dict | None:
    """The listed product's drop window ({"opens_at", "closes_at"}: aware datetimes or None),
    read at most WINDOW_TTL seconds ago by this process; None for no such listed product."""
    now = time.monotonic()
    cached = _windows.get(product_id)
    if cached is not None and cached[0] > now:
        return cached[1]
    window = Product.objects.listed().filter(pk=product_id).values("opens_at", "closes_at").first()
    if window is not None:  # only real products: made-up ids must not grow the dict
        _windows[product_id] = (now + WINDOW_TTL, window)
    return window


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


def shows_api_tokens(*, user) -> bool:
    """Whether the menu links to the API tokens page (a developer's page, not a shopper's):
    for staff and for users who already made a token. Anyone else finds it at the foot of their
    orders page."""
    return user.is_authenticated and (user.is_staff or ApiToken.objects.filter(user=user).exists())


def coupon_list(*, active_only: bool = True) -> QuerySet[Coupon]:
    qs = Coupon.objects.annotate(claim_count=Count("claims")).order_by("id")
    return qs.filter(active=True) if active_only else qs


def claims_for_user(*, user) -> QuerySet[CouponClaim]:
    return CouponClaim.objects.filter(user=user).select_related("coupon", "order").order_by("-id")


def usable_claims_for_user(*, user) -> QuerySet[CouponClaim]:
    return claims_for_user(user=user).filter(used_at__isnull=True)


def units_held(*, user, product_ids: Iterable[int]) -> dict[int, int]:
    """Units of each product the user holds in orders that reserve stock (unpaid ones too): what
    counts against a per-buyer cap (`Product.max_per_user`), as the checkout writer counts it
    under its locks. One query; for the cart and the product page, off the checkout's path."""
    ids = list(product_ids)
    if not ids or not getattr(user, "is_authenticated", False):
        return {}
    return OrderLine.objects.reserving().filter(product_id__in=ids, order__user=user).units_by("product_id")


def products_by_id(ids: list[int], *, include_inactive: bool = False) -> dict[int, Product]:
    """Products by id; hidden ones only for staff (to others they do not exist: a cart flags
    them as gone rather than dropping them)."""
    qs = Product.objects.all() if include_inactive else Product.objects.listed()
    return qs.in_bulk(ids)


# --- the operator's views ---------------------------------------------------------------------
# Sold: paid orders, and the legacy "placed" ones (settled before the payment step existed).
SOLD_STATUSES = (Order.Status.PAID, Order.Status.PLACED)
STOCK_LEVELS = {"sold_out": "Sold out", "low": "Low stock", "in_stock": "In stock"}
# The units-per-minute rate counts the orders placed within this window (the Sales view's "last 5 min").
RATE_WINDOW = timedelta(minutes=5)
SALES_FIGURES = ("units_sold", "units_paid_late", "gross", "coupons", "revenue", "units_recent", "rate",
                 "units_reserved", "units_refunded", "refunded")
MONEY_FIGURES = ("gross", "coupons", "revenue", "refunded")
_MONEY = DecimalField(max_digits=14, decimal_places=2)
_CENTS = DecimalField(max_digits=40, decimal_places=0)
_RATE = DecimalField(max_digits=20, decimal_places=4)


def _lines_total(expression, statuses: tuple[str, ...], output_field=None, **line_filter):
    """Per product (a correlated subquery: evaluated for the rows shown, not the whole catalog)."""
    lines = (OrderLine.objects.filter(product=OuterRef("pk"), order__status__in=statuses, **line_filter)
             .order_by().values("product").annotate(n=Sum(expression, output_field=output_field)).values("n"))
    zero = Value(Decimal("0.00"), output_field=_MONEY) if output_field is not None else Value(0)
    return Coalesce(Subquery(lines, output_field=output_field), zero, output_field=output_field)


def _cents(expression) -> ExpressionWrapper:
    return ExpressionWrapper(expression * 100, output_field=_CENTS)


def _net_revenue(statuses: tuple[str, ...] = SOLD_STATUSES):
    """Per product: what buyers paid for its lines in orders of `statuses` (sold ones by default),
    the order's discount spread over its lines as `shop.money.line_shares` does (in proportion to
    their list amounts, whole cents, rounding the running total in product-id order, so an order's
    lines add up to its total).

    In SQL, per line: share = R(A + a) - R(A), where a is the line's list amount, A the amounts of
    the order's lines of lower product ids (a correlated sum; not needed when the line is the whole
    order), R(x) = floor((2xT + S) / 2S), T the order's total and S its subtotal, all in cents.
    The floor is taken exactly, as (n - MOD(n, d)) / d: a decimal division would round first.
    """
    amount = _cents(F("quantity") * F("unit_price"))
    earlier = (OrderLine.objects.filter(order=OuterRef("order_id"), product_id__lt=OuterRef("product_id"))
               .order_by().values("order").annotate(s=Sum(F("quantity") * F("unit_price"), output_field=_MONEY))
               .values("s"))
    before = _cents(Coalesce(Subquery(earlier, output_field=_MONEY), Value(Decimal("0.00"), output_field=_MONEY)))
    total, subtotal = _cents(F("order__total")), _cents(F("order__subtotal"))

    def rounded(running) -> ExpressionWrapper:
        n = ExpressionWrapper(2 * running * total + subtotal, output_field=_CENTS)
        d = ExpressionWrapper(2 * subtotal, output_field=_CENTS)
        return ExpressionWrapper((n - Mod(n, d)) / d, output_field=_CENTS)

    share = Case(
        When(order__subtotal=0, then=Value(0)),
        When(order__subtotal=F("quantity") * F("unit_price"), then=total),  # the whole order: all it paid
        default=ExpressionWrapper(rounded(before + amount) - rounded(before), output_field=_CENTS),
        output_field=_CENTS,
    )
    lines = (OrderLine.objects.filter(product=OuterRef("pk"), order__status__in=statuses)
             .order_by().values("product").annotate(n=Sum(share, output_field=_CENTS)).values("n"))
    cents = Coalesce(Subquery(lines, output_field=_CENTS), Value(0), output_field=_CENTS)
    return Cast(ExpressionWrapper(cents / 100, output_field=_MONEY), output_field=_MONEY)


def reserved_units(*, product_id: int) -> int:
    """Units of `product_id` that orders awaiting payment hold: out of the stock (an order takes its
    units at checkout), back in it if they are not paid (`units_reserved` of `product_sales`)."""
    return OrderLine.objects.awaiting_payment().filter(product_id=product_id).units()


def reservations(*, product_ids: Iterable[int]) -> dict[int, dict]:
    """Per product: the orders awaiting payment that hold its units (`orders`, `units`) and the
    latest pay-by among them (`last_pay_by`): what "End sale now" leaves in place. One query."""
    rows = (OrderLine.objects.filter(product_id__in=list(product_ids), order__status=Order.Status.PENDING_PAYMENT)
            .order_by().values("product_id")
            .annotate(orders=Count("order_id", distinct=True), units=Sum("quantity"), last_pay_by=Max("order__pay_by")))
    return {row.pop("product_id"): row for row in rows}


LINE_FIELDS = ("id", "opens_at", "closes_at", "line_prequeue_seconds", "line_order", "line_paused")


def lined_products(*, now) -> QuerySet[Product]:
    """Products whose drop has a line now (shop/line/): active, with opens_at, not closed yet."""
    return (Product.objects.filter(active=True, opens_at__isnull=False).not_over(now=now)
            .filter(Q(closes_at__isnull=True) | Q(closes_at__gt=F("opens_at")))  # not called off
            .only(*LINE_FIELDS))


_lines = TimedRead(lambda now: lined_products(now=now).values_list(*LINE_FIELDS))


def line_rows(*, now) -> list[tuple]:
    """`lined_products` as rows of LINE_FIELDS: what every process reads every second (compiled once)."""
    return _lines.rows(now=now)


def stock_and_reserved(*, product_id: int) -> tuple[int, int]:
    """A product's stock, and the units unpaid orders hold (they come back if not paid): what a
    drop's line can still sell (shop/line/)."""
    stock = Product.objects.filter(pk=product_id).values_list("stock", flat=True).first() or 0
    return stock, reserved_units(product_id=product_id)


def drop_rules(*, now) -> list[tuple[int, timedelta | None, datetime | None]]:
    """(id, min_account_age, opens_at) of the products with a minimum account age or a drop window,
    whose sale is not over: what the checkout's account-age check keeps per process (shop/account_age.py)."""
    return _drop_rules.rows(now=now)


_drop_rules = TimedRead(lambda now: Product.objects.filter(Q(min_account_age__isnull=False) | Q(opens_at__isnull=False))
                        .not_over(now=now).values_list("pk", "min_account_age", "opens_at"))


# An API token made this soon after its account's sign-up is "quick": scripts do that, people rarely.
QUICK_TOKEN = timedelta(minutes=1)


def signups_per_minute(*, now: datetime, minutes: int = 60) -> list[dict]:
    """The admin's view of sign-ups and API tokens: per minute of the last `minutes` that saw any,
    newest first, the accounts created, the API tokens created, and the tokens made within
    QUICK_TOKEN of their account's sign-up. Counted in Python over the rows of that hour (no
    time-zone functions in SQL)."""
    since = now - timedelta(minutes=minutes)
    counts: dict[datetime, dict] = {}

    def minute(at: datetime) -> dict:
        start = at.replace(second=0, microsecond=0)
        return counts.setdefault(start, {"minute": start, "accounts": 0, "tokens": 0, "quick_tokens": 0})

    user_model = get_user_model()
    for joined in user_model.objects.filter(date_joined__gt=since).values_list("date_joined", flat=True):
        minute(joined)["accounts"] += 1
    for made, joined in ApiToken.objects.filter(created_at__gt=since).values_list("created_at", "user__date_joined"):
        row = minute(made)
        row["tokens"] += 1
        row["quick_tokens"] += int(made - joined <= QUICK_TOKEN)
    return sorted(counts.values(), key=lambda row: row["minute"], reverse=True)


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


class _Micros(Func):
    """Microseconds from one time to another (MySQL and MariaDB)."""

    template = "TIMESTAMPDIFF(MICROSECOND, %(expressions)s)"
    arg_joiner = ", "
    output_field = BigIntegerField()


def product_sales(*, stock: str | None = None, products: QuerySet[Product] | None = None,
                  now: datetime | None = None) -> QuerySet[Product]:
    """Products annotated with what an operator watches during a sale:

    - `units_sold` and `revenue`: units in sold orders (paid, and legacy placed) and what their
      buyers paid for them: net of the order's coupon, spread over its lines (`_net_revenue`);
      `gross`: their list amounts, `coupons`: gross - revenue (what coupons took off);
      `units_paid_late`: those of them paid at or after the sale's end (orders placed before the
      end keep their units and may be paid until their pay-by time: docs/operations.md);
    - `units_recent` and `rate`: units of the orders placed in the product's rate window that still
      hold their stock (awaiting payment or sold), and those units per minute. The window is the
      last RATE_WINDOW (5 minutes) of the sale's own active time: it starts no earlier than the
      drop opened and ends when it closed (or now), and is at least a second long, so a drop that
      sold 10 units in its first second reads 600 a minute, not 2;
    - `units_reserved` (awaiting payment: they return if unpaid), `units_refunded` and `refunded`
      (what was paid back for them, spread as revenue is);
    - `stock`, the model's own: what is left to sell.

    `stock`: a key of STOCK_LEVELS, or None for all. Totals: `sales_totals`.
    """
    now = now or timezone.now()
    at_now = Value(now, output_field=DateTimeField())
    products = Product.objects.all() if products is None else products
    products = products.alias(  # not selected: MariaDB returns LEAST() of a parameter and a column as text
        rate_until=Least(at_now, Coalesce(F("closes_at"), at_now), output_field=DateTimeField()),
    ).alias(
        rate_since=Greatest(ExpressionWrapper(F("rate_until") - Value(RATE_WINDOW), output_field=DateTimeField()),
                            Coalesce(F("opens_at"), F("rate_until") - Value(RATE_WINDOW)),
                            output_field=DateTimeField()),
    ).annotate(
        units_sold=_lines_total("quantity", SOLD_STATUSES),
        units_paid_late=_lines_total("quantity", SOLD_STATUSES, order__paid_at__gte=OuterRef("closes_at")),
        gross=_lines_total(F("quantity") * F("unit_price"), SOLD_STATUSES, output_field=_MONEY),
        revenue=_net_revenue(),
        units_recent=_lines_total("quantity", RESERVING_STATUSES, order__created_at__gte=OuterRef("rate_since"),
                                  order__created_at__lte=OuterRef("rate_until")),
        units_reserved=_lines_total("quantity", (Order.Status.PENDING_PAYMENT,)),
        units_refunded=_lines_total("quantity", (Order.Status.REFUNDED,)),
        refunded=_net_revenue((Order.Status.REFUNDED,)),
    ).annotate(
        coupons=ExpressionWrapper(F("gross") - F("revenue"), output_field=_MONEY),
        rate=ExpressionWrapper(F("units_recent") * Value(60_000_000) / Greatest(
            _Micros(F("rate_since"), F("rate_until")), Value(1_000_000)), output_field=_RATE),
    )
    return by_stock_level(products, level=stock).order_by("id")


def units_per_minute(rate: Decimal | int) -> Decimal:
    """A `rate` of `product_sales` (or of the totals) to one decimal."""
    return Decimal(rate).quantize(Decimal("0.1"))


def sales_totals(*, products: QuerySet[Product]) -> dict[str, int | Decimal]:
    """The totals row of `product_sales(...)` (every product it lists, on every page): the sums of
    its figures and of the stock, and the count of products; the rate is the sum of the products'
    rates. One query."""
    sums = products.order_by().aggregate(total_products=Count("pk"), total_stock=Sum("stock"),
                                         **{f"total_{f}": Sum(f) for f in SALES_FIGURES})
    totals = {k.removeprefix("total_"): v for k, v in sums.items()}
    money = Decimal("0.00")
    return {k: (v if v is not None else (money if k in MONEY_FIGURES else 0)) for k, v in totals.items()}


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
