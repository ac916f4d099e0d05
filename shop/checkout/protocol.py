"""What travels between a buyer and the writer: a request, and its result.

A buyer queued on a product's lock hands its `Request` to whoever holds the lock (as JSON in
Redis: `payload`, `from_payload`), and gets back one `Result` (`to_json`, `from_json`): `Placed`
(the order, with the receipt's lines), `Refused` (a shop error, by its code), `Again` (nothing
written, the lock was lost: queue again) or `Alone` (nothing written: take the product's lock
yourself).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from shop import errors
from shop.models import Order
from shop.reads.receipts import ReceiptLine as Line


def new_request_id() -> str:
    """32 hex digits, time-ordered (microseconds, then 72 random bits): unique, and appended at
    the end of the request-id indexes rather than scattered through them."""
    return f"{time.time_ns() // 1000:014x}{secrets.token_hex(9)}"


@dataclass(frozen=True)
class Request:
    """One buyer's order. `token`: the combining token of a queued buyer (None for the caller's
    own request); `recorded`: write its id (CheckoutRequest) so a buyer that stops waiting can
    settle what happened to it (combining); `deadline`: time.monotonic() of this process."""

    id: str
    user_id: int
    lines: tuple[tuple[int, int], ...]
    code: str | None
    key: str | None
    digest: str
    deadline: float
    token: str | None = None
    recorded: bool = False

    def payload(self) -> str:
        return json.dumps({"id": self.id, "u": self.user_id, "l": self.lines, "c": self.code, "k": self.key,
                           "d": self.digest}, separators=(",", ":"))

    @classmethod
    def from_payload(cls, payload: str, *, deadline: float, token: str) -> Request:
        data = json.loads(payload)
        return cls(id=data["id"], user_id=data["u"], lines=tuple((p, q) for p, q in data["l"]), code=data["c"],
                   key=data["k"], digest=data["d"], deadline=deadline, token=token, recorded=True)


@dataclass(frozen=True)
class Placed:
    """An order committed for the request (or, `replayed`, the one its key placed before).
    `lines` is None when the writer did not have them at hand (a replay): read the order back."""

    order_id: int
    subtotal: Decimal
    discount: Decimal
    total: Decimal
    coupon_id: int | None
    coupon_code: str | None
    status: str
    pay_by: datetime | None
    paid_at: datetime | None
    created_at: datetime
    lines: tuple[Line, ...] | None = None
    replayed: bool = False

    @classmethod
    def of(cls, order: Order, *, replayed: bool) -> Placed:
        return cls(order_id=order.pk, subtotal=order.subtotal, discount=order.discount, total=order.total,
                   coupon_id=order.coupon_id, coupon_code=None, status=order.status, pay_by=order.pay_by,
                   paid_at=order.paid_at, created_at=order.created_at, replayed=replayed)


@dataclass(frozen=True)
class Refused:
    code: str
    message: str
    details: dict = field(default_factory=dict)

    @classmethod
    def of(cls, exc: errors.ShopError) -> Refused:
        return cls(code=exc.code, message=exc.message, details=exc.details)

    def error(self) -> errors.ShopError:
        return errors.ERRORS_BY_CODE[self.code](self.message, details=self.details)


@dataclass(frozen=True)
class Again:
    """Nothing was written and the lock is gone (stale fence, lost lease): queue or lock again."""


@dataclass(frozen=True)
class Alone:
    """Nothing was written: the lane's holder could not take this product's lock without waiting
    (a cart or a buyer on its own holds it). The buyer takes the product lock itself."""


Result = Placed | Refused | Again | Alone
AGAIN = Again()
ALONE = Alone()


def to_json(result: Result) -> str:
    """The combiner's reply to a queued buyer, through Redis."""
    if isinstance(result, Again):
        return '{"again":1}'
    if isinstance(result, Alone):
        return '{"alone":1}'
    if isinstance(result, Refused):
        return json.dumps({"error": vars(result)}, separators=(",", ":"))
    # vars, not asdict: asdict deep-copies every field, a large share of a combiner's reply time.
    order = {**vars(result), "lines": None if result.lines is None else [vars(line) for line in result.lines]}
    return json.dumps({"order": order}, separators=(",", ":"), default=str)


def from_json(text: str) -> Result:
    data = json.loads(text)
    if "again" in data:
        return AGAIN
    if "alone" in data:
        return ALONE
    if "error" in data:
        return Refused(**data["error"])
    o = data["order"]

    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    lines = None if o["lines"] is None else tuple(
        Line(**{**line, "unit_price": Decimal(line["unit_price"])}) for line in o["lines"])
    return Placed(order_id=o["order_id"], subtotal=Decimal(o["subtotal"]), discount=Decimal(o["discount"]),
                  total=Decimal(o["total"]), coupon_id=o["coupon_id"], coupon_code=o["coupon_code"],
                  status=o["status"], pay_by=when(o["pay_by"]), paid_at=when(o["paid_at"]),
                  created_at=when(o["created_at"]), lines=lines, replayed=o["replayed"])


