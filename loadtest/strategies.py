"""The ways to take stock under contention, one small class each, behind one interface.

Every strategy except "ours" writes an order the same way: one transaction that decrements
the stock (guarded or not, depending on the strategy) and inserts the order, its lines and
its ledger rows. So the invariant checker applies to all of them, and the only difference
measured is how each one keeps concurrent buyers apart. "ours" calls the real service.

A strategy object lives in one worker process (built after the fork). `place()` never
raises for an expected outcome: it returns (outcome, order id or None). What is not expected
(bad input, a 5xx, a body that is not the API's, a timeout) raises: the runner counts it as an
error and keeps its message.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import ClassVar

from django.core.cache import caches
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone
from django_redis import get_redis_connection

from loadtest.models import DbLock
from shop.errors import ERRORS_BY_CODE
from shop.models import Order, OrderLine, Product, StockLedger

PLACED = "placed"
OUT_OF_STOCK = "out_of_stock"
BUSY = "busy"  # lock wait timed out, retries exhausted, deadlock: nothing written, retry later
REJECTED = "rejected"  # another business refusal, counted by its code (unpaid_limit, purchase_limit, coupon_*)
ERROR = "error"  # anything unexpected: bad input, a 5xx, a body that is not the API's, a timeout
OUTCOMES = (PLACED, OUT_OF_STOCK, BUSY, REJECTED, ERROR)

Lines = list[tuple[int, int]]  # (product id, quantity), sorted by product id
Result = tuple[str, int | None]

# MySQL errors that mean "contention, nothing written": deadlock, lock wait timeout.
_RETRYABLE_MYSQL = {1213, 1205}


@dataclass
class Options:
    """What a strategy needs to know about the run; built in the parent, copied into each worker."""

    run_id: str
    prices: dict[int, Decimal]
    lock_wait: float = 3.0  # seconds a lock-based strategy waits before giving up (busy)
    lock_ttl: float = 10.0  # lease of the Redis and table locks
    jitter: float = 0.0  # naive: seconds slept between the read and the write (widens the race)
    retries: int = 20  # optimistic: attempts before giving up (busy)
    poll: float = 0.01  # lock table: seconds between insert attempts
    coupon_code: str | None = None
    url: str | None = None  # http: base URL of the shop
    urls: list[str] = field(default_factory=list)  # http: several app servers; worker i uses urls[i % n]
    worker: int = 0  # the index of the worker process this copy lives in (set after the fork)
    tokens: dict[int, str] = field(default_factory=dict)  # http: API token per user id
    user_ids: list[int] = field(default_factory=list)  # ours: users loaded before the start line
    lock: bool = True  # ours: take the Redis lock (False only if the service supports it)
    pay: float | None = None  # ours, http: pay each placed order at once with this probability (None: never)


def wants_to_pay(rng: random.Random, options: Options) -> bool:
    """Whether this buyer pays the order just placed (`--pay`)."""
    return options.pay is not None and rng.random() < options.pay


class OutOfStockSignal(Exception):
    """Raised inside a transaction to roll it back when a line cannot be served."""


class Strategy:
    """One way to place an order. Subclasses set `name`, `label` and implement `place`."""

    name: ClassVar[str]
    label: ClassVar[str]
    uses_lock: ClassVar[bool] = False  # takes a lock before touching MySQL
    oversells: ClassVar[bool] = False  # expected to oversell (the naive one)
    over_http: ClassVar[bool] = False  # sends requests to app servers (needs `url` and `tokens`)

    def __init__(self, options: Options) -> None:
        self.options = options
        self.acquisitions = 0  # lock acquisitions by this process (client side)
        self.rejected: Counter[str] = Counter()  # business refusals by code (the runner reads it per phase)

    def place(self, user_id: int, lines: Lines) -> Result:
        raise NotImplementedError

    def refusal(self, code: str, status: int | None = None) -> str:
        """The outcome of the shop's refusal `code` (`outcome_of_code`); a rejection is counted by its code."""
        outcome = outcome_of_code(code, status)
        if outcome == REJECTED:
            self.rejected[code] += 1
        return outcome

    def close(self) -> None:
        """Release per-process resources (connections)."""

    # -- the common write -------------------------------------------------------------------
    def write_order(self, user_id: int, lines: Lines) -> int:
        """INSERT the order, its lines and its ledger rows (inside the caller's transaction)."""
        prices = self.options.prices
        subtotal = sum((prices[pid] * qty for pid, qty in lines), Decimal(0))
        order = Order.objects.create(user_id=user_id, subtotal=subtotal, total=subtotal)
        OrderLine.objects.bulk_create(
            OrderLine(order=order, product_id=pid, quantity=qty, unit_price=prices[pid]) for pid, qty in lines
        )
        StockLedger.objects.bulk_create(
            StockLedger(product_id=pid, quantity=-qty, reason=StockLedger.Reason.ORDER, order=order,
                        actor=f"loadtest:{self.name}")
            for pid, qty in lines
        )
        return order.pk

    def guarded_transaction(self, user_id: int, lines: Lines) -> Result:
        """UPDATE ... WHERE stock >= n for every line, then the inserts; all in one transaction."""
        try:
            with transaction.atomic():
                for pid, qty in lines:
                    if not Product.objects.filter(pk=pid, stock__gte=qty).update(stock=F("stock") - qty):
                        raise OutOfStockSignal
                return PLACED, self.write_order(user_id, lines)
        except OutOfStockSignal:
            return OUT_OF_STOCK, None


def _mysql_busy(exc: OperationalError) -> bool:
    return bool(exc.args) and exc.args[0] in _RETRYABLE_MYSQL


class Naive(Strategy):
    """Read the stock into Python, write back stock - n. No lock, no guard: loses updates."""

    name = "naive"
    label = "naive read-then-write (no lock)"
    oversells = True

    def place(self, user_id: int, lines: Lines) -> Result:
        try:
            with transaction.atomic():
                stock = dict(Product.objects.filter(pk__in=[p for p, _ in lines]).values_list("pk", "stock"))
                if any(stock[pid] < qty for pid, qty in lines):
                    raise OutOfStockSignal
                if self.options.jitter:
                    time.sleep(random.uniform(0, self.options.jitter))
                for pid, qty in lines:
                    Product.objects.filter(pk=pid).update(stock=stock[pid] - qty)  # the lost update
                return PLACED, self.write_order(user_id, lines)
        except OutOfStockSignal:
            return OUT_OF_STOCK, None


class GuardedUpdate(Strategy):
    """No lock at all: the conditional UPDATE is the only guard. The hot row's own limit."""

    name = "guarded"
    label = "guarded UPDATE only (no lock)"

    def place(self, user_id: int, lines: Lines) -> Result:
        return self.guarded_transaction(user_id, lines)


class Optimistic(Strategy):
    """Version column with retries; `Product.fence` serves as the version (+1 per write).

    The products of a run are its own, so no other writer interprets their fence.
    """

    name = "optimistic"
    label = "optimistic version column + retries"

    class _Stale(Exception):
        pass

    def place(self, user_id: int, lines: Lines) -> Result:
        ids = [pid for pid, _ in lines]
        for attempt in range(self.options.retries):
            rows = {pk: (stock, version) for pk, stock, version
                    in Product.objects.filter(pk__in=ids).values_list("pk", "stock", "fence")}
            if any(rows[pid][0] < qty for pid, qty in lines):
                return OUT_OF_STOCK, None
            try:
                with transaction.atomic():
                    for pid, qty in lines:
                        stock, version = rows[pid]
                        if not Product.objects.filter(pk=pid, fence=version).update(
                            stock=stock - qty, fence=version + 1
                        ):
                            raise self._Stale
                    return PLACED, self.write_order(user_id, lines)
            except self._Stale:
                time.sleep(random.uniform(0, 0.001 * (attempt + 1)))
        return BUSY, None


class SelectForUpdate(Strategy):
    """Pessimistic row locks: SELECT ... FOR UPDATE in id order, check, decrement, insert."""

    name = "for_update"
    label = "SELECT ... FOR UPDATE"

    def place(self, user_id: int, lines: Lines) -> Result:
        try:
            with transaction.atomic():
                stock = dict(
                    Product.objects.select_for_update().filter(pk__in=[p for p, _ in lines])
                    .order_by("pk").values_list("pk", "stock")
                )
                if any(stock[pid] < qty for pid, qty in lines):
                    raise OutOfStockSignal
                for pid, qty in lines:
                    Product.objects.filter(pk=pid).update(stock=F("stock") - qty)
                return PLACED, self.write_order(user_id, lines)
        except OutOfStockSignal:
            return OUT_OF_STOCK, None


class _LockThenGuard(Strategy):
    """Take one lock per product (sorted), run the guarded transaction, release in reverse."""

    uses_lock = True

    def lock_name(self, pid: int) -> str:
        return f"lt:{connection.settings_dict['NAME']}:product:{pid}"

    def acquire(self, pid: int) -> object | None:
        """A handle to pass to `release`, or None if the wait timed out."""
        raise NotImplementedError

    def release(self, handle: object) -> None:
        raise NotImplementedError

    def place(self, user_id: int, lines: Lines) -> Result:
        held = []
        try:
            for pid, _ in lines:
                handle = self.acquire(pid)
                if handle is None:
                    return BUSY, None
                self.acquisitions += 1
                held.append(handle)
            return self.guarded_transaction(user_id, lines)
        finally:
            for handle in reversed(held):
                # A failed release (a lock-wait timeout on the lock row, an expired Redis key)
                # must never turn an order that already committed into a reported failure (I5).
                with contextlib.suppress(Exception):
                    self.release(handle)


class LockTable(_LockThenGuard):
    """A row per held lock: INSERT into a unique key acquires; stale rows (crashed holders) expire."""

    name = "lock_table"
    label = "database lock table (unique insert)"

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def acquire(self, pid: int) -> object | None:
        name = self.lock_name(pid)
        deadline = time.monotonic() + self.options.lock_wait
        while True:
            try:
                DbLock.objects.create(name=name, owner=self.owner,
                                      expires_at=timezone.now() + timedelta(seconds=self.options.lock_ttl))
                return name
            except IntegrityError:
                # Someone holds it. If that someone died, its row has expired: remove it.
                with contextlib.suppress(OperationalError):  # lost a deadlock: just try again
                    DbLock.objects.filter(name=name, expires_at__lt=timezone.now()).delete()
            except OperationalError as exc:
                # The INSERT's duplicate-key check takes a shared lock on the key, so waiters'
                # INSERTs and the holder's DELETE can deadlock; InnoDB rolls one back. For a
                # waiter that is only a failed attempt, never a reason to give up before its wait.
                if not _mysql_busy(exc):
                    raise
            if time.monotonic() >= deadline:
                return None
            time.sleep(random.uniform(0.5, 1.5) * self.options.poll)

    def release(self, handle: object) -> None:
        # The DELETE can lose a deadlock against waiters' INSERT/DELETE on the same key under
        # load; a release given up leaves the row to its expiry and stalls the product for the
        # whole lease, so try again a few times first.
        for attempt in range(3):
            try:
                DbLock.objects.filter(name=handle, owner=self.owner).delete()
                return
            except OperationalError:
                if attempt == 2:
                    raise
                time.sleep(0.005)


class MySQLGetLock(_LockThenGuard):
    """MySQL/MariaDB named locks: GET_LOCK(name, timeout) ... RELEASE_LOCK(name)."""

    name = "get_lock"
    label = "MySQL GET_LOCK"

    def acquire(self, pid: int) -> object | None:
        name = self.lock_name(pid)
        with connection.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, %s)", [name, self.options.lock_wait])
            return name if cursor.fetchone()[0] == 1 else None

    def release(self, handle: object) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT RELEASE_LOCK(%s)", [handle])


class RedisPyLock(_LockThenGuard):
    """django-redis `cache.lock()`, i.e. redis-py's Lock: SET NX PX, polls every 0.1 s."""

    name = "redis_py"
    label = "django-redis cache.lock() (redis-py Lock)"

    def acquire(self, pid: int) -> object | None:
        lock = caches["default"].lock(self.lock_name(pid), timeout=self.options.lock_ttl,
                                      blocking_timeout=self.options.lock_wait)
        return lock if lock.acquire() else None

    def release(self, handle: object) -> None:
        from redis.exceptions import LockError

        with contextlib.suppress(LockError):  # expired while held: the guarded UPDATE kept the books right
            handle.release()


class PythonRedisLock(_LockThenGuard):
    """python-redis-lock: SET NX EX, waiters BLPOP a signal list that the release pushes to."""

    name = "python_redis_lock"
    label = "python-redis-lock (BLPOP hand-off)"

    def acquire(self, pid: int) -> object | None:
        import redis_lock

        lock = redis_lock.Lock(get_redis_connection("default"), self.lock_name(pid),
                               expire=max(1, round(self.options.lock_ttl)))
        return lock if lock.acquire(timeout=max(1, round(self.options.lock_wait))) else None

    def release(self, handle: object) -> None:
        import redis_lock

        with contextlib.suppress(redis_lock.NotAcquired):
            handle.release()


# Error codes of the service (shop.errors) that mean "busy, nothing written, retry".
_BUSY_CODES = {"busy", "lock_timeout", "lock_unavailable", "conflict", "database_unavailable"}
# HTTP statuses of a business refusal: the shop's state or rules said no (409), or a rate limit (429).
_REFUSAL_STATUSES = {409, 429}


def outcome_of_code(code: str, status: int | None = None) -> str:
    """The outcome of a refusal by the shop: its error code, and over HTTP the answer's status.

    One rule for the service called in process and for the JSON API: `out_of_stock`; busy (a 503:
    nothing written, retry); rejected, the shop's rules said no (a code whose status is 409 or 429,
    registered in shop.errors or new to this client, and the coupon family: `unpaid_limit`,
    `purchase_limit`, `coupon_sold_out`, `rate_limited`, ...); anything else (bad input, an unknown
    product, a 5xx, no code at all) is an error: the load test or the server is wrong.
    """
    if code == "out_of_stock":
        return OUT_OF_STOCK
    known = ERRORS_BY_CODE.get(code)
    status = known.status if known is not None else status
    if code in _BUSY_CODES or status == 503:
        return BUSY
    if code and (status in _REFUSAL_STATUSES or code.startswith("coupon_")):
        return REJECTED
    return ERROR


class UnexpectedAnswer(Exception):
    """An HTTP answer that is neither an order nor one of the shop's refusals (a 5xx, a 4xx for bad
    input, a body that is not the API's): the runner counts it as an error and keeps this message."""


class Ours(Strategy):
    """The real service: `shop.services.place_order` (Redis lock + fenced guarded UPDATE)."""

    name = "ours"
    label = "ours (shop.services.place_order)"
    uses_lock = True

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        from django.contrib.auth import get_user_model

        from shop import services

        self.services = services
        self.user_model = get_user_model()
        # Loaded before the start: a request's SQL count must be the service's alone.
        self.users: dict[int, object] = self.user_model.objects.in_bulk(options.user_ids)
        self.rng = random.Random(f"{options.run_id}-{os.getpid()}")

    def user(self, user_id: int) -> object:
        user = self.users.get(user_id)
        if user is None:
            user = self.users[user_id] = self.user_model.objects.get(pk=user_id)
        return user

    def place(self, user_id: int, lines: Lines) -> Result:
        from shop.errors import ShopError

        user = self.user(user_id)
        kwargs = {} if self.options.lock else {"use_lock": False}
        code = self.options.coupon_code
        try:
            try:
                placed = self.services.place_order(user=user, lines=lines, coupon_code=code, **kwargs)
            except ShopError as exc:
                if exc.code != "coupon_not_claimed":
                    raise
                # A shopper claims the coupon the first time (if any are left), and buys with or without it.
                code = self._claim(user)
                placed = self.services.place_order(user=user, lines=lines, coupon_code=code, **kwargs)
        except ShopError as exc:
            if (outcome := self.refusal(exc.code)) == ERROR:
                raise  # bad input or a code the load test does not expect: an error, with its message
            return outcome, None
        if wants_to_pay(self.rng, self.options):
            from shop.models import Order

            with contextlib.suppress(ShopError):  # too late to pay: the order stays unpaid (the books show it)
                self.services.pay_order(order=Order.objects.get(pk=placed.order_id), actor=f"loadtest:{user_id}")
        return PLACED, placed.order_id

    def _claim(self, user) -> str | None:
        from shop.errors import CouponAlreadyClaimed, CouponSoldOut

        try:
            self.services.claim_coupon(user=user, code=self.options.coupon_code)
        except CouponSoldOut:
            return None
        except CouponAlreadyClaimed:
            # Claimed earlier and already used on another order: no second use.
            return None
        return self.options.coupon_code


class ClaimCoupon(Strategy):
    """Not a checkout strategy: `shop.services.claim_coupon` for the coupon storm (lines ignored).

    Outcomes: claimed = PLACED (the id returned is the claim's), coupon sold out = OUT_OF_STOCK,
    already claimed = REJECTED.
    """

    name = "claim_coupon"
    label = "ours (shop.services.claim_coupon)"
    uses_lock = True

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.ours = Ours(options)

    def place(self, user_id: int, lines: Lines) -> Result:
        from shop.errors import ShopError

        try:
            claim = self.ours.services.claim_coupon(user=self.ours.user(user_id), code=self.options.coupon_code)
        except ShopError as exc:
            if exc.code == "coupon_sold_out":
                return OUT_OF_STOCK, None
            if (outcome := self.refusal(exc.code)) == ERROR:
                raise
            return outcome, None
        return PLACED, claim.pk


class Http(Strategy):
    """The JSON API: POST {url}/api/orders/ with a Bearer token per load user (stdlib http.client,
    one kept-alive connection per worker, as an API client holds one; opened again when the
    server closes it).

    Answers are classified as in process (`outcome_of_code`): a 201 with the order's id is placed;
    the shop's refusals are out of stock, busy or rejected (by code); anything else raises
    (`UnexpectedAnswer`, a timeout, a connection error) and the runner records it as an error.
    With several app servers (`urls`), worker i sends every request to urls[i mod n] and counts
    its outcomes per server (`servers`), errors included."""

    name = "http"
    label = "ours over HTTP (POST /api/orders/)"
    uses_lock = True
    over_http = True

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        targets = options.urls or [options.url]
        self.base = targets[options.worker % len(targets)].rstrip("/")
        self.servers: dict[str, dict[str, int]] = {}
        self._conn: http.client.HTTPConnection | None = None

    def _send(self, method: str, path: str, *, headers: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
        """One request on the kept-alive connection: (status, body). A connection the server had
        closed meanwhile (its keep-alive timeout, a restart) fails the first send: opened again
        and sent once more. Safe to repeat: an order carries its Idempotency-Key."""
        for attempt in range(2):
            if self._conn is None:
                url = urllib.parse.urlsplit(self.base)
                kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
                self._conn = kind(url.hostname or "127.0.0.1", url.port, timeout=30)
            try:
                self._conn.request(method, path, body=body, headers=headers)
                response = self._conn.getresponse()
                raw = response.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if response.will_close:
                self._conn.close()
                self._conn = None
            return response.status, raw
        raise AssertionError("unreachable")

    def place(self, user_id: int, lines: Lines) -> Result:
        counts = self.servers.setdefault(self.base, {o: 0 for o in OUTCOMES})
        try:
            outcome, order_id = self._place(user_id, lines)
        except Exception:
            counts[ERROR] += 1
            raise
        counts[outcome] += 1
        return outcome, order_id

    def _place(self, user_id: int, lines: Lines) -> Result:
        body: dict[str, object] = {"lines": [{"product_id": pid, "quantity": qty} for pid, qty in lines]}
        if self.options.coupon_code:
            body["coupon_code"] = self.options.coupon_code
        status, raw = self._send(
            "POST", "/api/orders/", body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json",
                     "Authorization": f"Bearer {self.options.tokens[user_id]}",
                     # As a real client sends it (a retry would reuse it): the service must
                     # still refuse a sold-out storm without SQL.
                     "Idempotency-Key": uuid.uuid4().hex})
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        data = data if isinstance(data, dict) else {}
        if 200 <= status < 300:
            order_id = data.get("id")
            if not isinstance(order_id, int):
                raise UnexpectedAnswer(f"HTTP {status} without an order id: {raw[:120]!r}")
        else:
            error = data.get("error")  # {"error": {"code", "message", "details"}}
            code = str(error.get("code") or "") if isinstance(error, dict) else ""
            outcome = self.refusal(code, status)
            if outcome == ERROR:
                what = f"{code}: {error.get('message', '')}" if code else f"{raw[:120]!r}"
                raise UnexpectedAnswer(f"HTTP {status} {what}")
            return outcome, None
        if wants_to_pay(self.rng, self.options):
            self._pay(user_id, order_id)
        return PLACED, order_id

    @property
    def rng(self) -> random.Random:
        if not hasattr(self, "_rng"):
            self._rng = random.Random(f"{self.options.run_id}-{os.getpid()}")
        return self._rng

    def _pay(self, user_id: int, order_id: int) -> None:
        """POST {url}/api/orders/<id>/pay/; a refusal leaves the order unpaid (the books show it)."""
        self._send("POST", f"/api/orders/{order_id}/pay/", body=b"{}",
                   headers={"Content-Type": "application/json", "Accept": "application/json",
                            "Authorization": f"Bearer {self.options.tokens[user_id]}"})


class Ping(Http):
    """Not a checkout: GET {url}/api/ping/ with the buyer's Bearer token, the request path's floor
    (the same middleware and token check as an order, a JSON answer, no work of its own). A 200
    `{"ok": true}` counts as placed (no order id); a 503 busy (the worker's queue) as busy;
    anything else raises, as an order's unexpected answer does."""

    name = "http_ping"
    label = "GET /api/ping/ (the request path's floor)"
    uses_lock = False

    def _place(self, user_id: int, lines: Lines) -> Result:
        status, raw = self._send("GET", "/api/ping/", headers={
            "Accept": "application/json", "Authorization": f"Bearer {self.options.tokens[user_id]}"})
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if status == 200 and data == {"ok": True}:
            return PLACED, None
        error = data.get("error") if isinstance(data, dict) else None
        code = str(error.get("code") or "") if isinstance(error, dict) else ""
        if outcome_of_code(code, status) == BUSY:
            return BUSY, None
        raise UnexpectedAnswer(f"HTTP {status} {raw[:120]!r}")


class _OursWith(Ours):
    """The real service with SHOP settings of its own (`shop`), in this worker process only."""

    shop: dict = {}

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        from django.conf import settings

        settings.SHOP = {**getattr(settings, "SHOP", {}), **self.shop}


class OursPerOrder(_OursWith):
    """The real service with combining off: every order takes its locks and is a batch of one."""

    name = "ours_per_order"
    label = "ours, combining off (batch size 1: one hold per order)"
    shop = {"COMBINING": False}


class OursLanes(_OursWith):
    """The real service with two checkout lanes: the products share two queues, and a lane's
    holder commits orders for several products in one transaction (SHOP["COMBINE_LANES"])."""

    name = "ours_lanes"
    label = "ours, 2 checkout lanes (SHOP_COMBINE_LANES=2)"
    shop = {"COMBINE_LANES": 2}


class OursQueues(_OursWith):
    """The real service with a queue per product (no lanes: the default before lanes were on):
    a batch holds the orders of one product."""

    name = "ours_queues"
    label = "ours, a queue per product (SHOP_COMBINE_LANES=0)"
    shop = {"COMBINE_LANES": 0}


class Raw(Strategy):
    """The row's own limit: hand-written MySQLdb (guarded UPDATE, then the order, line and ledger
    INSERTs, one transaction), no ORM, no lock. How far every other strategy is from the row."""

    name = "raw"
    label = "raw MySQLdb guarded UPDATE + INSERTs (no ORM, no lock)"

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.tables = (Product._meta.db_table, Order._meta.db_table, OrderLine._meta.db_table,
                       StockLedger._meta.db_table)

    def place(self, user_id: int, lines: Lines) -> Result:
        product, order, line, ledger = self.tables
        prices = self.options.prices
        connection.ensure_connection()
        db = connection.connection  # the MySQLdb connection itself, in autocommit mode
        cursor = db.cursor()
        try:
            cursor.execute("START TRANSACTION")
            for pid, qty in lines:
                if not cursor.execute(f"UPDATE {product} SET stock = stock - %s WHERE id = %s AND stock >= %s",
                                      (qty, pid, qty)):
                    cursor.execute("ROLLBACK")
                    return OUT_OF_STOCK, None
            subtotal = sum((prices[pid] * qty for pid, qty in lines), Decimal(0))
            now = timezone.now().replace(tzinfo=None)  # the ORM stores UTC naive on MySQL
            cursor.execute(
                f"INSERT INTO {order} (user_id, status, subtotal, discount, total, request_digest, created_at) "
                "VALUES (%s, 'placed', %s, 0, %s, '', %s)", (user_id, subtotal, subtotal, now))
            order_id = cursor.lastrowid
            cursor.execute(
                f"INSERT INTO {line} (order_id, product_id, quantity, unit_price) VALUES "
                + ", ".join(["(%s, %s, %s, %s)"] * len(lines)),
                [v for pid, qty in lines for v in (order_id, pid, qty, prices[pid])])
            cursor.execute(
                f"INSERT INTO {ledger} (product_id, quantity, reason, order_id, actor, created_at) VALUES "
                + ", ".join(["(%s, %s, 'order', %s, 'loadtest:raw', %s)"] * len(lines)),
                [v for pid, qty in lines for v in (pid, -qty, order_id, now)])
            cursor.execute("COMMIT")
            return PLACED, order_id
        except BaseException:
            with contextlib.suppress(Exception):
                cursor.execute("ROLLBACK")
            raise
        finally:
            cursor.close()


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (Naive, GuardedUpdate, Optimistic, SelectForUpdate, LockTable, MySQLGetLock, RedisPyLock,
                PythonRedisLock, Raw, Ours, OursPerOrder, OursQueues, OursLanes)
}


# Not checkout strategies to compare: the JSON API's order, its floor, the coupon storm's claim.
OTHERS: dict[str, type[Strategy]] = {cls.name: cls for cls in (Http, Ping, ClaimCoupon)}


def get(name: str) -> type[Strategy]:
    if name in OTHERS:
        return OTHERS[name]
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None


def is_busy_error(exc: BaseException) -> bool:
    """A MySQL deadlock or lock-wait timeout: contention, nothing written."""
    return isinstance(exc, OperationalError) and _mysql_busy(exc)
