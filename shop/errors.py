"""The one error hierarchy of the shop. Every failure a caller can see is a `ShopError`.

Each class carries a stable `code` (part of the public API: clients switch on it), the HTTP
status the views map it to, a `details` dict safe to show to the client, and the one wording of
its refusal: `message` (its `default_message`, or what its constructor `of` words from the
details), which the web pages, the API, the cart and the writer all show (`words` adds the
products' names where a page knows them).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.transaction import TransactionManagementError

from shop.plumbing import clock
from shop.plumbing.clock import shop_time

# Every error class by its code, filled as the classes are defined (`ShopError.__init_subclass__`):
# a combined buyer's reply names its error by code, and a new error is found without a list kept
# by hand.
ERRORS_BY_CODE: dict[str, type[ShopError]] = {}


class ShopError(Exception):
    code: str = "shop_error"
    status: int = 400
    default_message: str = "The request could not be completed."
    retry_after: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # a class of its own code (not a mixin or an alias)
            if ERRORS_BY_CODE.get(cls.code, cls) is not cls:
                raise TypeError(f"error code {cls.code!r} is taken by {ERRORS_BY_CODE[cls.code].__name__}")
            ERRORS_BY_CODE[cls.code] = cls

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        self.message = message or self.default_message
        self.details = details or {}
        super().__init__(self.message)

    def words(self, names: dict[int, str] | None = None) -> str:
        """What a shopper reads: the message (a page that knows the products' `names`, by id,
        may have them named)."""
        return self.message

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, details={self.details!r})"


# --- input -----------------------------------------------------------------------------------
class InvalidInput(ShopError):
    code = "invalid_input"
    default_message = "The request is not valid."


class InvalidDropWindow(InvalidInput):
    """A drop window that cannot be: it closes before it opens or is already over, or a time that
    cannot be read. details = {"opens_at", "closes_at"} as given, and/or {"time": the bad text}."""

    code = "invalid_drop_window"
    default_message = "A drop must close after it opens, and not in the past."


class InvalidAccountAge(InvalidInput):
    """An operator's minimum account age that cannot be read or is out of range (shop/account_age.py):
    details = {"min_account_age": what was given}. Nothing was written."""

    code = "invalid_account_age"


class InvalidQuantity(InvalidInput):
    code = "invalid_quantity"
    default_message = "Quantities must be whole numbers from 1 to the per-line maximum."


# --- catalog ---------------------------------------------------------------------------------
class UnknownProduct(ShopError):
    code = "unknown_product"
    status = 404
    default_message = "This product no longer exists."


class InactiveProduct(ShopError):
    """Shown to staff only: everyone else gets UnknownProduct (see `as_seen_by`). details =
    {"product_ids": every line that cannot be sold, hidden or missing}."""

    code = "inactive_product"
    status = 409
    default_message = "This product is no longer on sale."


class NotOpenYet(ShopError):
    """The drop has not opened: details = {"product_ids": the lines not open yet, "opens_at": when
    the last of them opens (ISO 8601), i.e. when this order could first be placed}. Retry-After
    says the seconds until then. Nothing was written."""

    code = "not_open_yet"
    status = 409
    default_message = "This sale has not opened yet."

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after = _seconds_until(self.details.get("opens_at"))

    @staticmethod
    def wording(opens_at: datetime) -> str:
        """What a shopper is told of a drop not open yet (the cart's flag and the checkout's refusal)."""
        return f"Not on sale yet: opens {shop_time(opens_at)}."

    @classmethod
    def of(cls, product_ids: list[int], *, opens_at: datetime) -> NotOpenYet:
        return cls(cls.wording(opens_at), details={"product_ids": product_ids, "opens_at": opens_at.isoformat()})

    def words(self, names: dict[int, str] | None = None) -> str:
        return _named(self, names)


class SaleEnded(ShopError):
    """The drop is over: details = {"product_ids": the lines whose sale ended, "closes_at": when
    the first of them closed (ISO 8601)}. Nothing was written."""

    code = "sale_ended"
    status = 409
    default_message = "This sale has ended."
    CALLED_OFF = "This drop was called off before it opened."

    @classmethod
    def wording(cls, *, closes_at: datetime | None = None, called_off: bool = False) -> str:
        """A drop called off before it opened (an empty window) never was on sale: said so."""
        if called_off:
            return cls.CALLED_OFF
        return f"This sale ended {shop_time(closes_at)}." if closes_at is not None else cls.default_message

    @classmethod
    def of(cls, product_ids: list[int], *, closes_at: datetime, called_off: bool = False) -> SaleEnded:
        return cls(cls.wording(closes_at=closes_at, called_off=called_off),
                   details={"product_ids": product_ids, "closes_at": closes_at.isoformat()})

    def words(self, names: dict[int, str] | None = None) -> str:
        return _named(self, names)


class OutOfStock(ShopError):
    """Lists every short line: details = {"lines": [{"product_id", "requested", "available"}]}."""

    code = "out_of_stock"
    status = 409
    default_message = "Sold out."

    @staticmethod
    def wording(lines: list[dict], names: dict[int, str] | None = None) -> str:
        """The one wording of a stock refusal, the product by its name as the cap's refusal says
        it: "Sneaker: only 2 left; Cap: sold out." (`lines` as the details' {"product_id",
        "available"}; a line whose name is not known is said without one)."""
        names = names or {}
        parts = []
        for line in lines:
            left = line["available"]
            what = "sold out" if left == 0 else f"only {left} left"
            name = names.get(line["product_id"])
            parts.append(f"{name}: {what}" if name else what)
        text = "; ".join(parts) or "sold out"
        return f"{text[0].upper()}{text[1:]}."

    @classmethod
    def of(cls, lines: list[dict], names: dict[int, str] | None = None, **details: Any) -> OutOfStock:
        return cls(cls.wording(lines, names), details={"lines": lines, **details})

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        lines = (details or {}).get("lines")
        super().__init__(message or (self.wording(lines) if lines else None), details=details)

    def words(self, names: dict[int, str] | None = None) -> str:
        """Named by the page when the refusal could not (the sold-out fast path has no names)."""
        return self.wording(self.details.get("lines", []), names) if names else self.message


class PurchaseLimitExceeded(ShopError):
    """details = {"product_id", "limit", "bought", "requested"}: `bought` counts placed orders."""

    code = "purchase_limit"
    status = 409
    default_message = "This order would take you past the number of units one buyer may buy."

    @staticmethod
    def wording(*, limit: int, bought: int = 0, in_cart: int = 0, requested: int = 0) -> str:
        """The one wording of the per-buyer cap, with what the buyer already has (in orders, in
        the cart) and what is still allowed: "Limit 2 per customer; you already have 1 in your
        orders, so you can add 1 more." (the cart's flag and the checkout's refusal)."""
        have = [f"{bought} in your orders"] if bought else []
        have += [f"{in_cart} in your cart"] if in_cart else []
        left = max(limit - bought - in_cart, 0)
        if have:
            more = f", so you can add {left} more" if left else ""
            return f"Limit {limit} per customer; you already have {' and '.join(have)}{more}."
        asked = f"; you asked for {requested}" if requested else ""
        return f"Limit {limit} per customer{asked}."

    @classmethod
    def of(cls, *, product_id: int, name: str, limit: int, bought: int, requested: int) -> PurchaseLimitExceeded:
        """The checkout's refusal (the product by its name, from the row the writer holds)."""
        return cls(f"{name}: {cls.wording(limit=limit, bought=bought, requested=requested)}",
                   details={"product_id": product_id, "limit": limit, "bought": bought, "requested": requested})


class CartFull(ShopError):
    """details = {"max_lines": SHOP["MAX_CART_LINES"]}: a new line would pass it."""

    code = "cart_full"
    status = 409
    default_message = "Your cart is full."


class UnpaidOrdersLimit(ShopError):
    """details = {"limit", "unpaid"}: pay or cancel an unpaid order first (SHOP["MAX_UNPAID_ORDERS"])."""

    code = "unpaid_limit"
    status = 409
    default_message = "You have too many unpaid orders: pay or cancel one first."

    @classmethod
    def of(cls, *, limit: int, unpaid: int) -> UnpaidOrdersLimit:
        return cls(f"You have {unpaid} unpaid orders (at most {limit}): pay or cancel one first.",
                   details={"limit": limit, "unpaid": unpaid})


# --- stock adjustments (an operator's; shop.services.inventory.adjust_stock) -----------------
class ZeroAdjustment(InvalidInput):
    """An adjustment of 0 units: nothing to write (the ledger holds no zero rows)."""

    code = "zero_adjustment"
    default_message = "An adjustment must add or remove at least one unit."


class AdjustmentOutOfRange(InvalidInput):
    """details = {"delta", "maximum"}: not a whole number, or more than SHOP["MAX_RESTOCK"] units
    either way at once."""

    code = "adjustment_out_of_range"
    default_message = "An adjustment must be a whole number of units within the allowed range."


class InvalidAdjustmentReason(InvalidInput):
    """details = {"reason", "allowed"}: an unknown reason, or one that goes the other way (units
    are not added as "damaged", nor removed as "restock"). `allowed`: the reasons for this sign."""

    code = "invalid_adjustment_reason"
    default_message = "That is not a reason for this adjustment."


class AdjustmentExceedsStock(ShopError):
    """details = {"product_id", "stock", "delta", "reserved"}: removing these units would take the
    stock below 0, that is, take units that unpaid orders reserved (`reserved` of them: they are no
    longer in the stock, and come back to it if their orders are not paid)."""

    code = "adjustment_exceeds_stock"
    status = 409
    default_message = "Not that many units are left to sell."


class AdjustmentAlreadyApplied(ShopError):
    """details = {"product_id", "ledger_id", "delta"}: this confirmation (its one-time token) was
    applied already, by the ledger row named; a double-submitted page changes nothing again."""

    code = "adjustment_already_applied"
    status = 409
    default_message = "This adjustment was applied already; nothing was changed again."


# --- coupons ---------------------------------------------------------------------------------
class CouponUnknown(ShopError):
    code = "coupon_unknown"
    status = 404
    default_message = "We don't know that coupon."


class CouponExpired(ShopError):
    code = "coupon_expired"
    status = 409
    default_message = "This coupon is not valid right now."


class CouponSoldOut(ShopError):
    code = "coupon_sold_out"
    status = 409
    default_message = "This coupon has run out."


class CouponAlreadyClaimed(ShopError):
    code = "coupon_already_claimed"
    status = 409
    default_message = "You already have this coupon."


class CouponAlreadyUsed(ShopError):
    """details = {"coupon_code"}: the buyer's claim of it went on an earlier order (a claim is used once)."""

    code = "coupon_already_used"
    status = 409
    default_message = "You already used this coupon on an earlier order (a coupon is used once)."


class CouponNotClaimed(ShopError):
    code = "coupon_not_claimed"
    status = 409
    default_message = "Claim this coupon first (or it was already used)."


# --- orders ----------------------------------------------------------------------------------
class OrderNotFound(ShopError):
    code = "order_not_found"
    status = 404
    default_message = "No such order."


class OrderNotCancellable(ShopError):
    """details = {"order_id", "status"}: already cancelled, expired or refunded, or paid (a paid
    order is refunded, not cancelled)."""

    code = "order_not_cancellable"
    status = 409
    default_message = "This order cannot be cancelled (it is paid, cancelled or expired)."


class OrderNotRefundable(ShopError):
    """details = {"order_id", "status"}: only a paid order is refunded (once)."""

    code = "order_not_refundable"
    status = 409
    default_message = "Only a paid order can be refunded, and only once."


class OrderNotPayable(ShopError):
    """details = {"order_id", "status"}: the order is cancelled, expired, or past its pay_by."""

    code = "order_not_payable"
    status = 409
    default_message = "This order can no longer be paid: it was cancelled or its payment time ran out."


class IdempotencyConflict(ShopError):
    code = "idempotency_conflict"
    status = 422
    default_message = "This checkout was already submitted with a different cart."


# --- abuse ---------------------------------------------------------------------------------
class RateLimited(ShopError):
    """Too many requests of one kind from one client: details = {"limit", "rate", "retry_after"}."""

    code = "rate_limited"
    status = 429
    retry_after = 60
    default_message = "Too many requests; please wait a moment and retry."

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message, details=details)
        if retry_after is not None:
            self.retry_after = retry_after


class AccountTooNew(ShopError):
    """The drop lets only accounts of a minimum age buy (Product.min_account_age) and this one is
    younger: details = {"product_ids": the lines with that rule, "min_account_age": the age asked
    (seconds, the largest of them), "eligible_at": when this account may buy (ISO 8601)}. Refused
    before any lock or write (shop/account_age.py)."""

    code = "account_too_new"
    status = 403
    default_message = "Your account is too new to buy in this drop."

    def words(self, names: dict[int, str] | None = None) -> str:
        return _named(self, names)


class OrderNotWritable(ShopError):
    """This request's rows could not be written (e.g. its account was deleted while it queued).

    Refused alone: the other orders committed with it in the same batch are not affected (I9).
    """

    code = "order_not_writable"
    status = 409
    default_message = "We could not place this order for your account. Nothing was charged."


# --- overload (retryable) -------------------------------------------------------------------
class Busy(ShopError):
    """More buyers than can be served within their deadline: this request was not started, and
    nothing was written. details = {"reason": "full" (the server lets no more buyers wait) or
    "deadline" (its deadline had passed before its work would start), "retry_after"}. A buyer who
    waited in line until its deadline gets `lock_timeout` instead."""

    code = "busy"
    status = 503
    retry_after = 1  # a place frees within the time one batch takes (milliseconds)
    default_message = "The shop is very busy right now; nothing was done. Please retry in a moment."


# --- the line of a drop (shop/line/) ----------------------------------------------------------
class InLine(ShopError):
    """Not this buyer's turn yet: it holds a place in the drop's line, and nothing was written.
    Not a failure (HTTP 202): the API answers {"line": details}, with Retry-After and a
    Line-Ticket header. details = {"product_id", "place", "ahead", "now_serving",
    "estimated_wait", "retry_after", "ticket", "state" ("waiting" or "pre_queue"), and
    "opens_at" for the pre-queue}."""

    code = "in_line"
    status = 202
    default_message = "You have a place in line; come back when it is your turn."

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after = int(self.details.get("retry_after") or 1)

    def words(self, names: dict[int, str] | None = None) -> str:
        """The buyer's place, for a page (the API gives the details)."""
        if self.details.get("state") == "pre_queue":
            return "You are in the line for this drop: it opens soon, and your place is kept."
        return (f"You are number {self.details.get('place')} in line, with {self.details.get('ahead')} ahead of "
                f"you: about {max(1, round(self.details.get('estimated_wait') or 0))} s to go. Your place is kept.")


class InvalidLineTicket(InvalidInput):
    """The Line-Ticket sent is not one this shop gave this account (forged, altered, or another
    account's). Send the order again without it: the account's place is kept by the shop."""

    code = "invalid_line_ticket"
    default_message = "This line ticket is not valid for your account."


# --- infrastructure (retryable) --------------------------------------------------------------
class LockTimeout(ShopError):
    code = "lock_timeout"
    status = 503
    retry_after = 1
    default_message = "So many people are buying right now that your turn did not come in time. Please retry."


class LockUnavailable(ShopError):
    code = "lock_unavailable"
    status = 503
    retry_after = 5
    default_message = "We can't take orders this second. Nothing was charged; please retry."


class DatabaseUnavailable(ShopError):
    """MySQL went away mid-request (errors 2006/2013/2055, a restart, KILL, a network cut).

    details["outcome"]: "not_written" (the connection was lost before COMMIT: the transaction
    rolled back) or "unknown" (lost during COMMIT: it may have committed). Either way a retry
    with the same Idempotency-Key is safe: it returns the order if it committed, else places it
    exactly once.
    """

    code = "database_unavailable"
    status = 503
    retry_after = 2
    default_message = ("We lost our connection to the database while placing your order. Place order again: "
                       "if the order went through you'll get it, never twice.")


class ProviderUnavailable(ShopError):
    """The payment provider failed a refund call. The refund stays recorded (pending) and is
    retried with the same idempotency key: by a second call, or by the `shop.finish_refunds` job.
    details = {"order_id", "refund"}."""

    code = "provider_unavailable"
    status = 503
    retry_after = 60
    default_message = "The payment provider did not answer; the refund is recorded and will be retried."


class Conflict(ShopError):
    """Deadlocks, lock-wait timeouts or stale fences that outlasted the bounded retries."""

    code = "conflict"
    status = 503
    retry_after = 1
    default_message = "Busy right now, please retry."




def _seconds_until(when: object) -> int | None:
    """Whole seconds (at least 1) until an ISO 8601 time, for Retry-After, by the clock that
    decides drop windows (shop/clock.py); None if unreadable."""
    try:
        moment = datetime.fromisoformat(str(when))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    try:
        now = clock.now()
    except (DatabaseError, TransactionManagementError):  # no reading yet, and no database: no hint
        return None
    return max(1, math.ceil((moment - now).total_seconds()))


def _named(exc: ShopError, names: dict[int, str] | None) -> str:
    """A refusal whose message says when (a drop's window, an account's age), after the names of
    the products it refuses: "Sneaker: Not on sale yet: opens ..."."""
    products = ", ".join((names or {}).get(pid, "This product") for pid in exc.details.get("product_ids", []))
    return f"{products or 'This product'}: {exc.message}"


def as_seen_by(exc: ShopError, *, staff: bool) -> ShopError:
    """The error a client is shown. To non-staff a hidden (inactive) product is a missing one:
    same code, status, message and details, so product ids cannot be walked to find unannounced
    drops. Staff, who see hidden products in the admin anyway, get the truth."""
    if isinstance(exc, InactiveProduct) and not staff:
        return UnknownProduct(details=exc.details)
    return exc
