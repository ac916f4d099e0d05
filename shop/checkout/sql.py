"""The writer's hand-written SQL, each statement beside the ORM query it stands for.

The ORM's compile of these statements, its model instance per row and the driver's escaping of
every parameter were most of a batch's client CPU (issue 29's profile), so the checkout writes
them by hand; what each does is what its ORM twin (in its docstring) would do. Nothing else of
the shop writes SQL by hand.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, models
from django.utils import timezone

from shop.models import Order, Product
from shop.plumbing import clock
from shop.plumbing.lock_names import product_lock
from shop.plumbing.locking import StaleFence

ROW_FIELDS = ("id", "price", *Product.ON_SALE_FIELDS, "stock", "fence", "sku", "name", "max_per_user")

ORDER_FIELDS = ("request_id", "user", "status", "subtotal", "discount", "total", "coupon", "idempotency_key",
                "request_digest", "created_at", "pay_by")


def lock_rows(product_ids: list[int]) -> tuple[dict[int, dict], datetime]:
    """The products' rows, locked FOR UPDATE in id order, and the database's time once the last
    of them was locked, read by the same statement (no round trip of its own). The window's
    times come back naive (the database's UTC): made aware, as the ORM would.

    ORM twin: `Product.objects.select_for_update().filter(id__in=ids).order_by("id").values(*ROW_FIELDS)`,
    then `clock.now()`."""
    qn = connection.ops.quote_name
    cols = ", ".join(qn(Product._meta.get_field(f).column) for f in ROW_FIELDS)
    marks = ", ".join(["%s"] * len(product_ids))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {cols}, {clock.ROW_NOW_SQL} FROM {qn(Product._meta.db_table)} "
                       f"WHERE {qn('id')} IN ({marks}) ORDER BY {qn('id')} FOR UPDATE", product_ids)
        fetched = cursor.fetchall()
    rows = {row[0]: dict(zip(ROW_FIELDS, row[:-1], strict=True)) for row in fetched}
    for row in rows.values():
        for f in ("opens_at", "closes_at"):
            if row[f] is not None and timezone.is_naive(row[f]):
                row[f] = timezone.make_aware(row[f], connection.timezone)
    # No row (every product gone): nothing is on sale, and the time only stamps refusals.
    at = clock.aware(max(row[-1] for row in fetched)) if fetched else clock.now()
    return rows, at


def take_stock(totals: dict[int, int], fences: dict[int, int | None]) -> None:
    """THE write of stock, one statement for the batch's products: each row guarded (never below
    0) and, under a lock (a fence), fenced (only a holder newer than the row's last writer may
    write it). StaleFence if a row did not match (it changed behind our locks).

    ORM twin, per product: `Product.objects.filter(id=pid, active=True, stock__gte=n, fence__lt=fence)
    .update(stock=F("stock") - n, fence=fence)` (without the fence: no fence guard, fence kept)."""
    qn = connection.ops.quote_name
    ids = sorted(totals)
    stock_case, fence_case, guards, args_stock, args_fence, args_guard = [], [], [], [], [], []
    for pid in ids:
        fence = fences.get(pid)
        stock_case.append("WHEN %s THEN stock - %s")
        args_stock += [pid, totals[pid]]
        if fence is None:
            guards.append("(id = %s AND stock >= %s)")
            args_guard += [pid, totals[pid]]
        else:
            fence_case.append("WHEN %s THEN %s")
            args_fence += [pid, fence]
            guards.append("(id = %s AND stock >= %s AND fence < %s)")
            args_guard += [pid, totals[pid], fence]
    fence_set = f", fence = CASE id {' '.join(fence_case)} ELSE fence END" if fence_case else ""
    sql = (f"UPDATE {qn(Product._meta.db_table)} SET stock = CASE id {' '.join(stock_case)} END{fence_set} "
           f"WHERE id IN ({', '.join(['%s'] * len(ids))}) AND {Product.ON_SALE_SQL} AND ({' OR '.join(guards)})")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*args_stock, *args_fence, *ids, *args_guard])
        if cursor.rowcount != len(ids):
            # A row changed behind our locks (a newer holder, stock taken by SQL): read it again.
            # (The rows were read FOR UPDATE and checked, so this is a last guard; the refusal is
            # counted under the first product's lock.)
            raise StaleFence(product_lock(ids[0]))


def insert_orders(values: list[tuple]) -> dict[str, int]:
    """INSERT the orders (one statement, `values` in ORDER_FIELDS' order, in their database
    form); their ids by request id. MariaDB returns them from the INSERT itself (RETURNING);
    MySQL has no RETURNING, and the ids of a multi-row INSERT need not be consecutive there
    (innodb_autoinc_lock_mode 2, its default; auto_increment_increment > 1 under replication),
    so they are read back by the orders' own unique request ids.

    ORM twin: `Order.objects.bulk_create([Order(**dict(zip(ORDER_FIELDS, v))) for v in values])`."""
    qn = connection.ops.quote_name
    table, pk, request_id = qn(Order._meta.db_table), qn(Order._meta.pk.column), qn("request_id")
    returning = connection.features.can_return_rows_from_bulk_insert
    with connection.cursor() as cursor:
        cursor.execute(insert_sql(Order, ORDER_FIELDS, values)
                       + (f" RETURNING {request_id}, {pk}" if returning else ""))
        if not returning:
            marks = ", ".join(["%s"] * len(values))
            cursor.execute(f"SELECT {request_id}, {pk} FROM {table} WHERE {request_id} IN ({marks})",
                           [row[0] for row in values])
        return dict(cursor.fetchall())


def insert_rows(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> None:
    """One multi-row INSERT from plain values (already in their database form).

    ORM twin: `model.objects.bulk_create([model(**dict(zip(fields, row))) for row in rows])`, which
    builds and compiles a model instance per row: most of a batch's client CPU."""
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(insert_sql(model, fields, rows))


def insert_sql(model: type[models.Model], fields: tuple[str, ...], rows: list[tuple]) -> str:
    """INSERT ... VALUES with the values as SQL literals, each distinct value escaped once by the
    driver: a batch repeats its status, times, prices, reasons and actors in every row, and the
    driver's escaping of every parameter was the largest share of a batch's INSERT cost (issue
    29's profile). Integers (ids, quantities, fences) need no escaping."""
    opts = model._meta
    qn = connection.ops.quote_name
    columns = ", ".join(qn(opts.get_field(f).column) for f in fields)
    escape, encoding = connection.connection.literal, connection.connection.encoding
    seen: dict[tuple[type, object], str] = {}

    def literal(value: object) -> str:
        if type(value) is int:
            return str(value)
        if value is None:
            return "NULL"
        key = (type(value), value)
        if (text := seen.get(key)) is None:
            text = seen[key] = escape(value).decode(encoding)
        return text

    values = ", ".join("(" + ", ".join(map(literal, row)) + ")" for row in rows)
    return f"INSERT INTO {qn(opts.db_table)} ({columns}) VALUES {values}"
