"""The rows a load-test run creates, tagged with its run id, and their removal.

Users are "lt-<run id>-<n>", products "lt-<run id>-p<n>", the coupon "LT-<RUN ID>". Everything
a run wrote (orders, lines, ledger rows, claims, lock rows and lock keys) is found again
through those tags, so cleanup never touches anyone else's data.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Sum
from django_redis import get_redis_connection

from loadtest.models import DbLock
from locks.conf import locks_settings
from locks.keys import LockKeys
from shop.conf import shop_settings
from shop.models import (
    RESERVING_STATUSES,
    CheckoutRequest,
    Coupon,
    CouponClaim,
    Order,
    OrderLine,
    Product,
    StockLedger,
)
from shop.plumbing import redis_keys
from shop.plumbing.lock_names import coupon_lock, product_lock

PREFIX = "lt-"


NOT_MIGRATED = "the database is not migrated: run `manage.py createdb && manage.py migrate` first"


def is_migrated() -> bool:
    """A fresh database must be migrated before a run can create its rows."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return not executor.migration_plan(executor.loader.graph.leaf_nodes())


def new_run_id() -> str:
    return secrets.token_hex(3)


@dataclass
class Workload:
    run_id: str
    product_ids: list[int]
    initial_stock: dict[int, int]
    prices: dict[int, Decimal]
    user_ids: list[int]
    coupon_id: int | None = None
    coupon_code: str | None = None
    coupon_total: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.run_id}-"


def create(run_id: str, *, products: int, stock: int, users: int, price: Decimal = Decimal("9.99"),
           coupon_total: int | None = None, coupon_discount: Decimal = Decimal("1.00")) -> Workload:
    """Create the run's products, users and (optionally) a coupon, in one transaction."""
    tag = f"{PREFIX}{run_id}-"
    User = get_user_model()
    with transaction.atomic():
        Product.objects.bulk_create(
            Product(sku=f"{tag}p{i}", name=f"Load test {run_id} #{i}", price=price, stock=stock)
            for i in range(products)
        )
        # "!" is Django's unusable-password marker: these accounts can never log in.
        User.objects.bulk_create(User(username=f"{tag}{n}", password="!") for n in range(users))
        coupon = None
        if coupon_total is not None:
            coupon = Coupon.objects.create(code=f"LT-{run_id}".upper(), discount=coupon_discount,
                                           total=coupon_total, remaining=coupon_total)
    rows = list(Product.objects.filter(sku__startswith=tag).values_list("pk", "stock", "price"))
    return Workload(
        run_id=run_id,
        product_ids=[pk for pk, _, _ in rows],
        initial_stock={pk: s for pk, s, _ in rows},
        prices={pk: p for pk, _, p in rows},
        user_ids=list(User.objects.filter(username__startswith=tag).order_by("pk").values_list("pk", flat=True)),
        coupon_id=coupon.pk if coupon else None,
        coupon_code=coupon.code if coupon else None,
        coupon_total=coupon_total,
    )


def lock_names(workload: Workload) -> list[str]:
    """The shop's locks for this workload (its products', its coupon's)."""
    names = [product_lock(pk) for pk in workload.product_ids]
    if workload.coupon_id is not None:
        names.append(coupon_lock(workload.coupon_id))
    return names


def leftover_keys(workload: Workload) -> dict[str, list[str]]:
    """Per cache alias, every Redis key the strategies may have left for this workload."""
    db = connection.settings_dict["NAME"]
    peers = []
    for pk in workload.product_ids:
        name = f"lt:{db}:product:{pk}"
        peers += [f":1:{name}", f"lock:{name}", f"lock-signal:{name}"]  # redis-py, python-redis-lock
    ours = [k for name in lock_names(workload) for k in LockKeys.for_name(name).all()]
    refusals = [redis_keys.fence_refusals(name) for name in lock_names(workload)]
    markers = [key for pk in workload.product_ids
               for key in (redis_keys.sold_out_marker(pk), redis_keys.refill_floor(pk))]
    keys = {"default": peers, locks_settings.CACHE_ALIAS: ours}
    keys.setdefault(shop_settings.REDIS_ALIAS, []).extend(refusals + markers)
    return keys


def cleanup(workload: Workload) -> None:
    """Delete everything the run created or wrote. Set-based deletes: fast for 100k orders."""
    tag = workload.tag
    User = get_user_model()
    users = User.objects.filter(username__startswith=tag)
    products = Product.objects.filter(sku__startswith=tag)
    records = (Order.objects.filter(user__in=users, idempotency_key__isnull=False)
               .values_list("user_id", "idempotency_key"))
    keys = [redis_keys.idempotency_record(user_id, key) for user_id, key in records.iterator(chunk_size=5000)]
    client = get_redis_connection(shop_settings.REDIS_ALIAS)
    for i in range(0, len(keys), 1000):  # the records would stay in a shared Redis for IDEMPOTENCY_TTL
        client.delete(*keys[i : i + 1000])
    with transaction.atomic():
        StockLedger.objects.filter(product__in=products).delete()
        StockLedger.objects.filter(order__user__in=users).delete()
        CouponClaim.objects.filter(user__in=users).delete()
        OrderLine.objects.filter(order__user__in=users).delete()
        CheckoutRequest.objects.filter(order__user__in=users).delete()
        with connection.cursor() as cursor:  # raw: the ORM would load every order to cascade
            cursor.execute(
                f"DELETE FROM {Order._meta.db_table} WHERE user_id IN "
                f"(SELECT id FROM {User._meta.db_table} WHERE username LIKE %s)",
                [tag + "%"],  # tags are hex and dashes: nothing to escape
            )
        DbLock.objects.filter(name__in=[f"lt:{connection.settings_dict['NAME']}:product:{pk}"
                                        for pk in workload.product_ids]).delete()
        products.delete()
        if workload.coupon_id is not None:
            Coupon.objects.filter(pk=workload.coupon_id).delete()
        users.delete()
    for alias, keys in leftover_keys(workload).items():
        client = get_redis_connection(alias)
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    if workload.product_ids:
        get_redis_connection(shop_settings.REDIS_ALIAS).zrem(
            redis_keys.sold_out_index(), *[str(pid) for pid in workload.product_ids])


@dataclass
class Books:
    """Stock accounting of one product after a run (what I2 of docs/design.md compares)."""

    product_id: int
    initial: int
    current: int
    sold: int  # sum of the quantities in the run's reserving (pending, paid, placed) order lines
    ledger: int  # minus the sum of the product's ledger rows

    @property
    def oversold(self) -> int:
        """Units sold beyond what left the stock: lost updates (0 when the books balance)."""
        return self.sold - (self.initial - self.current)


def batch_sizes(workload: Workload) -> list[int]:
    """Orders per lock hold, from the ledger: every order a hold commits carries that hold's fence
    (one per order without combining, one per batch with it). Empty for lock-free strategies."""
    return list(StockLedger.objects.filter(product_id__in=workload.product_ids, reason=StockLedger.Reason.ORDER,
                                           fence__isnull=False)
                .values("product_id", "fence").annotate(n=Count("id")).values_list("n", flat=True))


def books(workload: Workload) -> list[Books]:
    current = dict(Product.objects.filter(pk__in=workload.product_ids).values_list("pk", "stock"))
    sold = dict(OrderLine.objects.filter(product_id__in=workload.product_ids, order__status__in=RESERVING_STATUSES)
                .values_list("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n"))
    ledger = dict(StockLedger.objects.filter(product_id__in=workload.product_ids)
                  .values_list("product_id").annotate(n=Sum("quantity")).values_list("product_id", "n"))
    return [Books(product_id=pk, initial=workload.initial_stock[pk], current=current.get(pk, 0),
                  sold=sold.get(pk) or 0, ledger=-(ledger.get(pk) or 0)) for pk in workload.product_ids]


def units_by_status(workload: Workload) -> dict[int, dict[str, int]]:
    """Per product, the units in the run's order lines by order status ({"paid": 3, "pending_payment": 2})."""
    out: dict[int, dict[str, int]] = {pk: {} for pk in workload.product_ids}
    rows = (OrderLine.objects.filter(product_id__in=workload.product_ids).order_by()
            .values("product_id", "order__status").annotate(n=Sum("quantity"))
            .values_list("product_id", "order__status", "n"))
    for pk, status, n in rows:
        out[pk][status] = out[pk].get(status, 0) + (n or 0)
    return out
