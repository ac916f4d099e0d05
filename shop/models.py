"""The shop's tables. Invariants that must hold under any bug are database constraints.

Stock and coupon counters are only ever changed by guarded UPDATEs in `shop.services`;
the CHECK constraints below are the last line of defence, not the mechanism.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from shop import errors
from shop.conf import shop_settings
from shop.plumbing import clock, lock_names

# Where a product stands in its drop window (`Product.drop_state`).
UPCOMING, OPEN, ENDED = "upcoming", "open", "ended"


class ProductQuerySet(models.QuerySet):
    def listed(self) -> ProductQuerySet:
        """The products shoppers see: active ones, whatever their drop window (an upcoming drop
        is shown with its countdown, an ended one as ended). `Product.on_sale` says if one sells now."""
        return self.filter(active=True)

    @staticmethod
    def drop_state_is(state: str, now: datetime) -> Q:
        """`drop_state(opens_at, closes_at, now) == state` as a condition (`drop_state` is the rule)."""
        upcoming = Q(opens_at__gt=now)
        return {UPCOMING: upcoming, OPEN: ~upcoming & ~Q(closes_at__lte=now),
                ENDED: ~upcoming & Q(closes_at__lte=now)}[state]

    def in_drop_state(self, state: str, *, now: datetime | None = None) -> ProductQuerySet:
        """The products whose window is in `state` (UPCOMING, OPEN or ENDED) at `now` (default:
        the database's clock, which decides the window)."""
        return self.filter(self.drop_state_is(state, clock.now() if now is None else now))

    def on_sale(self, *, now: datetime | None = None) -> ProductQuerySet:
        """The products that sell at `now`: `Product.on_sale` as a filter."""
        return self.filter(active=True).in_drop_state(OPEN, now=now)

    def not_over(self, *, now: datetime | None = None) -> ProductQuerySet:
        """The products whose sale has not ended at `now` (upcoming, open, or without a window)."""
        return self.exclude(self.drop_state_is(ENDED, clock.now() if now is None else now))

    def windowed(self) -> ProductQuerySet:
        """The products with a drop window (an opening time, a closing time or both)."""
        return self.exclude(opens_at__isnull=True, closes_at__isnull=True)


def drop_state(opens_at: datetime | None, closes_at: datetime | None, now: datetime) -> str:
    """The window [opens_at, closes_at): open from opens_at on (inclusive), ended from closes_at
    on; an empty end is no bound. The one comparison of the window, for pages and checkout alike."""
    if opens_at is not None and now < opens_at:
        return UPCOMING
    if closes_at is not None and now >= closes_at:
        return ENDED
    return OPEN


class Product(models.Model):
    """A product on sale while it is active and inside its drop window.

    The window is two columns of the product row, not a Drop table that products belong to: the
    checkout writer decides "on sale" from the row it already locks FOR UPDATE, so the window
    costs no join, no query and no extra row lock on the hot path, and a window cannot move under
    an order being written. A sale over several products is the same window given to each of
    them in one call (`shop.services.drops.schedule_drop`: the admin's action on the selected
    products, `manage.py shop drop P1 P2 ...`); moving it is the same call again. Both empty: on
    sale whenever active, as before drops existed.
    """

    sku = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    stock = models.PositiveIntegerField(default=0)
    # Highest lock fencing token that has written this row; a stale holder's write is refused.
    fence = models.BigIntegerField(default=0, editable=False)
    active = models.BooleanField(default=True)
    # Units one buyer may hold in placed orders (cancelled ones give theirs back); empty: no cap.
    # Checked under the product's lock, so bots with many requests cannot drain a drop.
    max_per_user = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="max per buyer",
        help_text="Units one buyer may buy of this product (placed orders). Empty: no limit.")
    # The drop window (empty: no bound). Written only by shop.services.drops, which logs who did.
    opens_at = models.DateTimeField(
        null=True, blank=True, verbose_name="opens at",
        help_text="The drop opens at this time: before it the page counts down and orders are refused. "
                  "Empty: on sale now.")
    closes_at = models.DateTimeField(
        null=True, blank=True, verbose_name="closes at",
        help_text="The sale ends at this time: orders are refused from then on. Empty: no end.")
    # The line of a drop (shop/line/): buyers who come this many seconds before opens_at join a
    # pre-queue, put in line at the opening in arrival order ("fifo") or at random ("shuffle":
    # arriving early buys nothing). Paused: nobody new is let through to the checkout.
    line_prequeue_seconds = models.PositiveIntegerField(
        default=0, verbose_name="pre-queue (seconds)",
        help_text="Buyers who come this many seconds before the drop opens join its line early. 0: no pre-queue.")
    line_order = models.CharField(
        max_length=8, choices=[("shuffle", "Shuffle at the opening"), ("fifo", "Arrival order")], default="shuffle",
        verbose_name="pre-queue order",
        help_text="How the pre-queue is put in line at the opening: shuffled (the default) or in arrival order.")
    line_paused = models.BooleanField(
        default=False, verbose_name="line paused",
        help_text="Let nobody new from the drop's line to the checkout (buyers keep their places).")
    # When this drop's line was first made in Redis (shop/line/): a line found missing after it
    # is one Redis lost, and is rebuilt from the buyers' tickets.
    line_started_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Against bots on fresh accounts: only accounts at least this old may buy (shop/account_age.py).
    min_account_age = models.DurationField(
        null=True, blank=True, verbose_name="min account age",
        help_text="Only accounts at least this old may buy this product, e.g. 7d, 24h, 90m. Empty: any account.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProductQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(stock__gte=0), name="product_stock_not_negative"),
            models.CheckConstraint(condition=Q(price__gte=0), name="product_price_not_negative"),
            # Equal only when a drop was ended before it opened (an empty window: never on sale).
            models.CheckConstraint(
                condition=Q(opens_at__isnull=True) | Q(closes_at__isnull=True) | Q(closes_at__gte=F("opens_at")),
                name="product_drop_closes_after_opens", violation_error_message="A drop must close after it opens."),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"

    @property
    def lock_name(self) -> str:
        return lock_names.product_lock(self.pk)

    # --- may it be sold now: the one rule (the checkout writer, the cart, the catalog) --------
    # The writer reads rows with plain SQL: it asks `row_on_sale` of the row's ON_SALE_FIELDS,
    # with the one `now` it stamps on the orders it writes (the database's, read with the rows).
    # Its guarded UPDATE repeats the part that does not depend on the time as ON_SALE_SQL; the
    # window cannot change under it (the row is locked FOR UPDATE from the read to the COMMIT).
    ON_SALE_FIELDS = ("active", "opens_at", "closes_at")
    ON_SALE_SQL = "active"

    @property
    def drop_state(self) -> str:
        """UPCOMING, OPEN or ENDED now, by the database's clock (shop/clock.py), as the writer decides."""
        return drop_state(self.opens_at, self.closes_at, clock.now())

    @property
    def on_sale(self) -> bool:
        return self.active and self.drop_state == OPEN

    @property
    def called_off(self) -> bool:
        """A drop ended before it opened (`end_drop` leaves an empty window): it never sold, so
        shoppers are told it was called off, not that its sale ended."""
        return self.opens_at is not None and self.opens_at == self.closes_at

    @staticmethod
    def row_on_sale(row: dict, now: datetime) -> bool:
        return bool(row["active"]) and drop_state(row["opens_at"], row["closes_at"], now) == OPEN


# Codes travel in URLs (/coupons/<code>/claim/) and are typed by shoppers: letters, digits,
# "-" and "_" only. A code with "/" once turned the coupon page into a 500.
COUPON_CODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*\Z"
validate_coupon_code = RegexValidator(
    COUPON_CODE_PATTERN, "Use letters, digits, '-' and '_' only (e.g. SPRING-10).", code="invalid_coupon_code",
)


class Coupon(models.Model):
    code = models.CharField(max_length=40, unique=True, validators=[validate_coupon_code],
                            help_text="Letters, digits, '-' and '_'.")
    description = models.CharField(max_length=200, blank=True)
    discount = models.DecimalField(max_digits=10, decimal_places=2, help_text="Amount off the order")
    total = models.PositiveIntegerField(help_text="How many users may claim it")
    remaining = models.PositiveIntegerField()
    valid_from = models.DateTimeField(null=True, blank=True)
    valid_until = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    fence = models.BigIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(remaining__gte=0), name="coupon_remaining_not_negative"),
            models.CheckConstraint(condition=Q(remaining__lte=F("total")), name="coupon_remaining_le_total"),
            models.CheckConstraint(condition=Q(discount__gte=0), name="coupon_discount_not_negative"),
        ]

    def __str__(self) -> str:
        return self.code

    @property
    def lock_name(self) -> str:
        return lock_names.coupon_lock(self.pk)

    @staticmethod
    def refusal(coupon: Coupon | None, code: str, now: datetime | None = None) -> errors.ShopError | None:
        """Why `coupon` (looked up by the `code` a buyer gave) cannot be used at `now` (default:
        now), or None if it can."""
        if coupon is None:
            return errors.CouponUnknown(details={"coupon_code": code})
        now = timezone.now() if now is None else now
        if not coupon.active or (coupon.valid_from and now < coupon.valid_from) or (
                coupon.valid_until and now >= coupon.valid_until):
            return errors.CouponExpired(details={"coupon_code": code})
        return None


class Order(models.Model):
    """An order reserves its stock from checkout until it is cancelled, expires or is refunded.

    Lifecycle: checkout -> pending_payment (with a `pay_by` deadline) -> paid
    -> refunded (staff; the provider pays the money back), or pending_payment -> cancelled
    (buyer or staff) / expired (unpaid past `pay_by`; `shop.expire_unpaid`). Cancel, expire and
    refund each give the stock and the coupon back exactly once. A paid order is never cancelled:
    its money must go back too, so it is refunded.

    "placed" is the status of orders from before the payment step: they are kept as they are and
    count as settled (paid-equivalent): they reserve stock, cannot be paid or expire, and staff
    can still cancel them. New orders are never "placed"; the admin's status filter offers it only
    while such orders exist.
    """

    class Status(models.TextChoices):
        PLACED = "placed", "Placed (legacy)"  # settled before the payment step existed
        PENDING_PAYMENT = "pending_payment", "Awaiting payment"
        PAID = "paid", "Paid"
        REFUNDED = "refunded", "Refunded"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="orders")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    subtotal = models.DecimalField(max_digits=12, decimal_places=2)
    discount = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    total = models.DecimalField(max_digits=12, decimal_places=2)
    coupon = models.ForeignKey(Coupon, null=True, blank=True, on_delete=models.PROTECT, related_name="orders")
    # NULL (not "") when absent: the unique (user, key) constraint must ignore keyless orders.
    # Binary collation: keys compare byte for byte in MySQL exactly as in Python and in the Redis
    # records ("Key" and "key" are two keys). Keys never end in a space (validation), so the
    # collation's PAD SPACE cannot make two of them equal either.
    idempotency_key = models.CharField(max_length=128, null=True, blank=True, db_collation="utf8mb4_bin")  # noqa: DJ001
    # Digest of (lines, coupon) so a replayed key with a different body is detected.
    request_digest = models.CharField(max_length=64, blank=True, editable=False)
    # The checkout request that placed it (time-ordered, unique; NULL on orders from before it).
    # How the writer learns a batch's order ids where INSERT ... RETURNING does not exist (MySQL):
    # it reads them back by these, whatever the auto-increment lock mode or step.
    request_id = models.CharField(max_length=32, null=True, blank=True, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)  # cancelled or expired
    # Unpaid past this, the order expires and its stock goes back (SHOP["PAYMENT_WINDOW"]).
    pay_by = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    refunded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        # Exporting every order (buyers' names included) is its own permission, not "view".
        permissions = [("export_order", "Can export orders as CSV")]
        indexes = [models.Index(fields=["status", "pay_by"], name="order_status_pay_by")]
        constraints = [
            models.UniqueConstraint(fields=["user", "idempotency_key"], name="order_idempotency_key_per_user"),
            models.CheckConstraint(condition=Q(total__gte=0), name="order_total_not_negative"),
            # No order is both paid and expired: paid_at belongs to paid and refunded orders (and to
            # paid ones staff cancelled before refunds existed: the payment stays on record).
            models.CheckConstraint(
                condition=Q(paid_at__isnull=True) | Q(status__in=["paid", "refunded", "cancelled"]),
                name="order_paid_at_only_when_paid"),
            # A refund pays back a payment: a refunded order was paid and says when it was refunded;
            # refunded_at belongs to refunded orders only.
            models.CheckConstraint(
                condition=~Q(status="refunded") | Q(paid_at__isnull=False, refunded_at__isnull=False),
                name="order_refunded_was_paid"),
            models.CheckConstraint(condition=Q(refunded_at__isnull=True) | Q(status="refunded"),
                                   name="order_refunded_at_only_when_refunded"),
            models.CheckConstraint(condition=~Q(status="pending_payment") | Q(pay_by__isnull=False),
                                   name="order_pending_has_pay_by"),
        ]

    def __str__(self) -> str:
        return f"Order #{self.pk}"

    @staticmethod
    def pay_by_from(placed_at: datetime | None = None) -> datetime:
        """The payment deadline of an order placed at `placed_at` (default: now; SHOP["PAYMENT_WINDOW"] seconds)."""
        return (placed_at or timezone.now()) + timedelta(seconds=float(shop_settings.PAYMENT_WINDOW))

    @property
    def operator_action(self) -> str | None:
        """What an operator may do to this order: "cancel" an unpaid one (its stock and coupon go
        back), "refund" a paid one (the payment goes back too), or nothing. The admin's buttons
        and `manage.py shop` ask the same question."""
        return {self.Status.PENDING_PAYMENT: "cancel", self.Status.PLACED: "cancel",
                self.Status.PAID: "refund"}.get(self.status)

    @property
    def payable(self) -> bool:
        """Unpaid and inside its window (the service re-checks in its guarded UPDATE)."""
        return (self.status == self.Status.PENDING_PAYMENT and self.pay_by is not None
                and self.pay_by > timezone.now())


class ProductSales(Product):
    """No table of its own: the admin's Sales view (units sold, paid revenue, reserved units per
    product; `shop.selectors.product_sales`), with its own view permission: revenue is not for
    everyone who may look at the catalog."""

    class Meta:
        proxy = True
        default_permissions = ("view",)
        verbose_name = "product's sales"
        verbose_name_plural = "sales by product"


class ProductLine(Product):
    """No table of its own: the admin's Lines page (every drop's line, live from Redis), with its
    own view permission. Pausing or resuming a line is a change of the product (`change_product`)."""

    class Meta:
        proxy = True
        default_permissions = ("view",)
        verbose_name = "line"
        verbose_name_plural = "lines"


class Refund(models.Model):
    """The refund of a paid order: the record that makes its money go back once.

    The provider is called outside any transaction with `key` as its idempotency key, so a
    retried or dropped transaction never pays twice; whoever finishes the refund later (a second
    call, the `shop.finish_refunds` job) finds this record and carries on from its status:
    pending (the provider may not have paid yet: call it again, same key) -> sent (it paid) ->
    completed (the books too: the order refunded, stock and coupon back, in one transaction). One
    per order: a twin refund collides on the unique order. Whoever works on it claims it first
    (`claimed_until`, a lease), so two workers never run it at once.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending (provider not yet known to have paid)"
        SENT = "sent", "Sent (provider paid; books not done yet)"
        COMPLETED = "completed", "Completed"

    order = models.OneToOneField(Order, on_delete=models.PROTECT, related_name="refund")
    key = models.CharField(max_length=40, unique=True, editable=False,
                           help_text="The idempotency key the provider is called with")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    actor = models.CharField(max_length=150, help_text="Who asked for it (the ledger's actor)")
    attempts = models.PositiveIntegerField(default=0, help_text="Times it was claimed to be worked on")
    last_error = models.TextField(blank=True)
    claimed_by = models.CharField(max_length=32, blank=True, editable=False)
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    UNFINISHED = (Status.PENDING, Status.SENT)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "claimed_until"], name="refund_status_claimed")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="refund_amount_not_negative"),
            models.CheckConstraint(condition=Q(status="pending") | Q(sent_at__isnull=False),
                                   name="refund_sent_has_sent_at"),
            models.CheckConstraint(condition=~Q(status="completed") | Q(completed_at__isnull=False),
                                   name="refund_completed_has_completed_at"),
        ]

    def __str__(self) -> str:
        return f"refund of order {self.order_id} ({self.status})"


class OutboxMail(models.Model):
    """A mail to send: never sent inside a request. It is written in the
    transaction of what it tells (an order's payment commits with its confirmation's row, or
    neither does) and sent by the `shop.send_mail` job (manage.py run_jobs): claimed, sent,
    marked sent; a failure is kept in `last_error` and retried later (`next_attempt_at`), up to
    SHOP["MAIL_ATTEMPTS"] times, then the mail is marked failed. What it says is rendered when it
    is sent (`shop.services.emails`, one renderer per kind), so a row holds no secret (a password
    reset's token is made at send time). A mail about an order is queued once per kind (unique
    kind + order); a mail with no order (a password reset) is not deduplicated. An order's buyer
    hears of each step that changes what they paid or hold: reserved (with its pay-by time, queued
    by the mail job for orders still unpaid: `queue_reservation_mails`), paid, then refunded,
    cancelled or expired (each queued with its status change, `shop.services.orders`).
    """

    class Kind(models.TextChoices):
        ORDER_RESERVED = "order_reserved", "Order reserved (pay by)"
        ORDER_PAID = "order_paid", "Order paid"
        ORDER_REFUNDED = "order_refunded", "Order refunded"
        ORDER_CANCELLED = "order_cancelled", "Order cancelled"
        ORDER_EXPIRED = "order_expired", "Order not paid in time"
        PASSWORD_RESET = "password_reset", "Password reset"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        SKIPPED = "skipped", "Nothing to send"  # e.g. a reset for an address with no account
        FAILED = "failed", "Failed (gave up)"

    kind = models.CharField(max_length=32, choices=Kind.choices)
    order = models.ForeignKey(Order, null=True, blank=True, on_delete=models.CASCADE, related_name="mails")
    # The buyer's address when it was queued; a password reset's: the address asked for.
    recipient = models.EmailField()
    # What the kind needs besides the order (a password reset: the site's domain and protocol).
    context = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Not sent before this: a failed attempt backs off; a claimed mail is not due until its claim ends.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "mail"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="outboxmail_due")]
        constraints = [
            models.UniqueConstraint(fields=["kind", "order"], name="outboxmail_once_per_order"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.recipient} ({self.status})"


# Orders that hold their stock: I2 counts their units as taken.
RESERVING_STATUSES = (Order.Status.PENDING_PAYMENT, Order.Status.PAID, Order.Status.PLACED)


class CheckoutRequest(models.Model):
    """A combined checkout request, by id: claimed by the order that served it, or by its buyer
    who gave up waiting (order NULL). The unique id is the last word on "at most once": a
    combiner that serves a request twice (after a crash) or after its buyer gave up fails on it
    and rolls back, and a buyer that gives up learns from it whether its order was committed.
    """

    request_id = models.CharField(max_length=32, unique=True)
    order = models.OneToOneField(Order, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="checkout_request")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"request {self.request_id} -> {self.order_id or 'given up'}"


class OrderLineQuerySet(models.QuerySet):
    def reserving(self) -> OrderLineQuerySet:
        """Lines of orders that hold their stock (`RESERVING_STATUSES`): what I2 counts as taken
        and a per-buyer cap counts as bought (unpaid orders too)."""
        return self.filter(order__status__in=RESERVING_STATUSES)

    def awaiting_payment(self) -> OrderLineQuerySet:
        """Lines of orders awaiting payment: the units reserved, back in the stock if not paid."""
        return self.filter(order__status=Order.Status.PENDING_PAYMENT)

    def units(self) -> int:
        """The units of these lines."""
        return self.aggregate(n=models.Sum("quantity"))["n"] or 0

    def units_by(self, field: str) -> dict[int, int]:
        """The units of these lines per `field` ("product_id", "order__user_id"); none left out."""
        rows = self.order_by().values(field).annotate(n=models.Sum("quantity")).values_list(field, "n")
        return {key: n for key, n in rows if n}


class OrderLine(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="order_lines")
    quantity = models.PositiveIntegerField()
    unit_price = models.DecimalField(max_digits=10, decimal_places=2)

    objects = OrderLineQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(quantity__gt=0), name="orderline_quantity_positive"),
            models.UniqueConstraint(fields=["order", "product"], name="orderline_one_per_product"),
        ]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.product_id}"


class CouponClaim(models.Model):
    coupon = models.ForeignKey(Coupon, on_delete=models.PROTECT, related_name="claims")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="coupon_claims")
    order = models.OneToOneField(
        Order, null=True, blank=True, on_delete=models.SET_NULL, related_name="coupon_claim"
    )
    claimed_at = models.DateTimeField(auto_now_add=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["coupon", "user"], name="couponclaim_one_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.coupon_id} → user {self.user_id}"


class StockLedger(models.Model):
    """Append-only record of every stock movement; its sum per product is the product's stock.

    A product's first row is its opening stock (reason opening; none when it started at 0).
    Orders move stock with the reasons order / cancel / expire / refund (each row names its
    order); an operator moves it with `shop.services.inventory.adjust_stock`, for one of
    OPERATOR_REASONS (no order), with a note and the operator as actor.
    """

    class Reason(models.TextChoices):
        # The stock a product started with (or, for products from before it, the stock its rows did
        # not explain): with it, a product's rows sum to its stock.
        OPENING = "opening", "Opening stock"
        ORDER = "order", "Order"
        CANCEL = "cancel", "Cancel"
        EXPIRE = "expire", "Expired unpaid"
        REFUND = "refund", "Refund"
        RESTOCK = "restock", "Restock (received)"
        # The operator's adjustments (`shop.services.inventory.ADJUSTMENT_REASONS` says which way each goes).
        CORRECTION = "correction", "Correction (count)"
        DAMAGED = "damaged", "Damaged"
        LOST = "lost", "Lost or stolen"
        PROMOTION = "promotion", "Promotion or donation"
        ADMIN = "admin", "Admin"  # rows from before adjustments had reasons; no longer written

    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="ledger")
    quantity = models.IntegerField(help_text="Signed: negative leaves stock, positive returns it")
    reason = models.CharField(max_length=16, choices=Reason.choices)
    order = models.ForeignKey(Order, null=True, blank=True, on_delete=models.PROTECT, related_name="ledger")
    fence = models.BigIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    # A default in the database too: the checkout writer's INSERT names its columns and has no note.
    note = models.CharField(max_length=200, blank=True, default="", db_default="",
                            help_text="The operator's words on an adjustment")
    # The one-time token of the admin's confirmation page that wrote this row: a second submission
    # of the same page finds it (and the UNIQUE key stops two at once), so it is applied once.
    confirmation = models.CharField(max_length=32, null=True, blank=True, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    # Stock moved by an operator rather than by an order: what I2 counts as refills (signed).
    OPERATOR_REASONS = (Reason.RESTOCK, Reason.CORRECTION, Reason.DAMAGED, Reason.LOST, Reason.PROMOTION,
                        Reason.ADMIN)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "stock ledger"
        constraints = [
            models.CheckConstraint(condition=~Q(quantity=0), name="stockledger_quantity_not_zero"),
        ]

    def __str__(self) -> str:
        return f"{self.product_id} {self.quantity:+d} ({self.reason})"


class DropLog(models.Model):
    """Append-only: every schedule, move, end or clear of a product's drop window, the window it
    left, and who did it ("admin:<user>", "cli:<user>@<host>", as on the stock ledger)."""

    class Action(models.TextChoices):
        SCHEDULE = "schedule", "Scheduled"
        END = "end", "Ended now"
        CLEAR = "clear", "Cleared"

    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="drop_log")
    action = models.CharField(max_length=16, choices=Action.choices)
    opens_at = models.DateTimeField(null=True, blank=True)
    closes_at = models.DateTimeField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "drop log entry"
        verbose_name_plural = "drop log"

    def __str__(self) -> str:
        return f"{self.product_id} {self.action} by {self.actor}"


class ApiToken(models.Model):
    """A bearer token for the JSON API (load-test tools, scripts). Only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, db_index=True, help_text="First characters, to recognise it")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}... (user {self.user_id})"

    @staticmethod
    def hash(raw: str) -> str:
        import hashlib

        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def issue(cls, *, user_id: int, name: str = "") -> str:
        """Create a token and return it in clear, once: it cannot be shown again."""
        import secrets

        raw = "shp_" + secrets.token_urlsafe(32)
        cls.objects.create(user_id=user_id, name=name[:100], prefix=raw[:12], key_hash=cls.hash(raw))
        return raw

    @property
    def active(self) -> bool:
        return self.revoked_at is None
