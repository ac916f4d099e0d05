"""place_order: the path of one checkout (see DESIGN.md).

    validate -> sold-out markers + idempotency record (one MGET) -> replay if the key has a
    record -> refuse if sold out ->
      one product, SHOP["COMBINING"]: queue on its lock and be served in a batch
        (shop/services/combining.py)
      otherwise: locks (sorted) -> durable transaction { guarded, fenced UPDATE per line; use
        the coupon claim; INSERT order, lines, ledger; idempotency record } -> COMMIT -> release

The Redis lock keeps buyers of one product in an orderly queue outside MySQL; the guarded UPDATE
(`stock >= n AND fence < :fence`) is what guarantees no oversell, even when a lock was lost.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

from django.db import IntegrityError
from django.db.models import F
from django.utils import timezone

import locks
from locks.backends import get_backend
from shop import errors, metrics
from shop.conf import shop_settings
from shop.models import CouponClaim, Order, OrderLine, Product, StockLedger
from shop.services import hooks, idempotency, limits, soldout
from shop.services.combining import place_combined
from shop.services.coupons import valid_coupon
from shop.services.locking import (
    StaleFence,
    check_before_commit,
    claim_lock,
    held,
    product_lock,
    refuse_outer_transaction,
    with_retries,
)
from shop.services.orders import pay_by_from
from shop.services.transactions import connection_errors, durable_transaction
from shop.services.validation import validate_code, validate_idempotency_key, validate_lines


def request_digest(lines: list[tuple[int, int]], coupon_code: str | None) -> str:
    body = json.dumps({"lines": sorted(lines), "coupon": coupon_code or ""}, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _idempotency_lock(user_id: int, key: str) -> str:
    return f"idem:{user_id}:{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def _replay(*, user, key: str, digest: str) -> Order | None:
    """The order a key already produced (marked `replayed`), or None; a different body conflicts."""
    order = Order.objects.filter(user=user, idempotency_key=key).first()
    if order is None:
        return None
    if order.request_digest != digest:
        raise errors.IdempotencyConflict(details={"order_id": order.pk})
    order.replayed = True
    return order


@metrics.checkout_outcome  # outermost: sees DatabaseUnavailable from connection_errors
@connection_errors()
def place_order(
    *,
    user,
    lines: list[tuple[int, int]],
    coupon_code: str | None = None,
    idempotency_key: str | None = None,
    use_lock: bool | None = None,
) -> Order:
    """Place an order, all or nothing. Returns the Order; `order.replayed` is True for a replay.

    Raises a `shop.errors.ShopError` for every refusal, with nothing written.
    """
    refuse_outer_transaction("place_order")
    lines = validate_lines(lines)
    code = validate_code(coupon_code) if coupon_code is not None else None
    key = validate_idempotency_key(idempotency_key) if idempotency_key is not None else None
    digest = request_digest(lines, code)

    # Fast path, one Redis round trip: a product known to be sold out is refused without the
    # lock or MySQL, unless this key already placed an order (then it gets that order back).
    try:
        fast = soldout.lookup((pid for pid, _ in lines),
                              record_key=idempotency.record_key(user.pk, key) if key is not None else None)
    except soldout.SoldOutCheckFailed as exc:
        raise errors.LockUnavailable(details={"redis": "unreachable"}) from exc  # not a second wait
    asked_mysql = key is not None and fast.has_record is not False
    if asked_mysql and (order := _replay(user=user, key=key, digest=digest)) is not None:
        return order
    marked = fast.marked
    if marked:
        metrics.soldout_rejected()
        raise errors.OutOfStock(details={"lines": [
            {"product_id": pid, "requested": qty, "available": 0} for pid, qty in lines if pid in marked
        ]})

    use_locks = shop_settings.USE_LOCKS if use_lock is None else use_lock
    if use_locks and shop_settings.COMBINING and len(lines) == 1 and get_backend().supports_combining:
        # One product: queue on its lock; whoever holds it commits everyone queued at once. (The
        # queue is a Redis one: on Redlock, ZooKeeper or MySQL every order takes the lock itself.)
        [(product_id, quantity)] = lines
        return place_combined(user=user, product_id=product_id, quantity=quantity, code=code, key=key,
                              digest=digest)

    products = Product.objects.only("id", "price", "active", "max_per_user").in_bulk([pid for pid, _ in lines])
    # Hidden and missing ids in one list: to non-staff both read as unknown (errors.as_seen_by).
    unsold = [pid for pid, _ in lines if pid not in products or not products[pid].active]
    if unsold:
        hidden = any(pid in products for pid in unsold)
        raise (errors.InactiveProduct if hidden else errors.UnknownProduct)(details={"product_ids": unsold})

    claim = _usable_claim(user=user, code=code) if code is not None else None
    names = [product_lock(pid) for pid, _ in lines]
    if claim is not None:
        names.append(claim_lock(claim.coupon_id, user.pk))
    if key is not None:
        names.insert(0, _idempotency_lock(user.pk, key))

    def attempt() -> Order:
        with held(names, use_locks=use_locks) as holds:
            if key is not None and (order := _replay(user=user, key=key, digest=digest)) is not None:
                return order  # a twin request committed while we waited for its lock
            try:
                return _write_order(user=user, lines=lines, products=products, claim=claim, key=key,
                                    digest=digest, holds=holds, use_locks=use_locks)
            except errors.OutOfStock as exc:
                if use_locks:
                    _mark_sold_out(exc.details["lines"], holds)
                raise
            except IntegrityError as exc:
                if key is not None and (order := _replay(user=user, key=key, digest=digest)) is not None:
                    return order
                raise errors.OrderNotWritable() from exc  # e.g. the account was deleted meanwhile

    return with_retries(attempt, what="place_order")


def _mark_sold_out(short: list[dict], holds: dict) -> None:
    """Still under the product locks, after reading stock 0: mark those products sold out, with
    this hold's fence as the proof that no refill came after the read (soldout.py)."""
    for line in short:
        if line["available"] != 0:
            continue
        hold = holds.get(product_lock(line["product_id"]))
        if hold is None:
            continue
        try:
            hold.check(verify=True)  # a hold already lost has nothing left to prove
        except (locks.LockLost, locks.LockUnavailable):
            continue
        soldout.mark(line["product_id"], fence=hold.fence)


def _usable_claim(*, user, code: str) -> CouponClaim:
    coupon = valid_coupon(code)
    claim = CouponClaim.objects.select_related("coupon").filter(coupon=coupon, user=user, used_at__isnull=True).first()
    if claim is None:
        raise errors.CouponNotClaimed(details={"coupon_code": code})
    return claim


def _write_order(*, user, lines, products, claim, key, digest, holds, use_locks) -> Order:
    with durable_transaction():
        hooks.call("before_update", holds)
        short = []
        fences: dict[int, int | None] = {}
        for pid, qty in lines:
            hold = holds.get(product_lock(pid))
            fence = hold.fence if hold is not None else None
            fences[pid] = fence
            guarded = Product.objects.filter(pk=pid, active=True, stock__gte=qty)
            if fence is not None:
                updated = guarded.filter(fence__lt=fence).update(stock=F("stock") - qty, fence=fence)
            else:
                updated = guarded.update(stock=F("stock") - qty)
            if updated:
                continue
            row = Product.objects.filter(pk=pid).values("stock", "fence", "active").first()
            if row is None:
                raise errors.UnknownProduct(details={"product_ids": [pid]})
            if fence is not None and row["fence"] >= fence:
                raise StaleFence(product_lock(pid))
            if not row["active"]:
                raise errors.InactiveProduct(details={"product_ids": [pid]})
            short.append({"product_id": pid, "requested": qty, "available": row["stock"]})
        if short:
            raise errors.OutOfStock(_short_message(short), details={"lines": short})
        # Purchase caps, counted now that this order holds the capped products' rows (limits.py).
        caps = {pid: products[pid].max_per_user for pid, _ in lines if products[pid].max_per_user is not None}
        if caps:
            limits.check(user_id=user.pk, lines=lines, limits=caps)
        limits.check_unpaid(user_id=user.pk)

        subtotal = sum((products[pid].price * qty for pid, qty in lines), Decimal("0"))
        discount = Decimal("0")
        if claim is not None:
            used = CouponClaim.objects.filter(pk=claim.pk, used_at__isnull=True).update(used_at=timezone.now())
            if not used:
                raise errors.CouponNotClaimed(details={"coupon_code": claim.coupon.code})
            discount = min(claim.coupon.discount, subtotal)
        order = Order.objects.create(
            user=user, subtotal=subtotal, discount=discount, total=subtotal - discount,
            coupon=claim.coupon if claim is not None else None, idempotency_key=key, request_digest=digest,
            status=Order.Status.PENDING_PAYMENT, pay_by=pay_by_from(),
        )
        OrderLine.objects.bulk_create([
            OrderLine(order=order, product_id=pid, quantity=qty, unit_price=products[pid].price) for pid, qty in lines
        ])
        StockLedger.objects.bulk_create([
            StockLedger(product_id=pid, quantity=-qty, reason=StockLedger.Reason.ORDER, order=order,
                        fence=fences[pid], actor=f"user:{user.pk}")
            for pid, qty in lines
        ])
        if claim is not None:
            CouponClaim.objects.filter(pk=claim.pk).update(order=order)
        if key is not None:
            idempotency.write_record(user_id=user.pk, key=key, order_id=order.pk, required=use_locks)
        hooks.call("before_commit", holds)
        check_before_commit(holds)
    order.replayed = False
    return order


def _short_message(short: list[dict]) -> str:
    parts = []
    for line in short:
        left = line["available"]
        parts.append(f"product {line['product_id']}: " + ("sold out" if left == 0 else f"only {left} left"))
    return "Not enough stock: " + "; ".join(parts) + "."
