"""Line tickets: a buyer's place in a drop's line, signed, checked without Redis or MySQL.

A ticket is `<product>.<drop>.<kind>.<score>.<signature>`: kind `p` (a place in the open line,
its score the Redis time of arrival in µs) or `q` (a place in the pre-queue, its score the
pre-queue's order). The signature is an HMAC-SHA256 of those and the account's id, under a key
derived from SECRET_KEY for this purpose only: another account's ticket, or an altered one, does
not verify. Tickets let a line rebuilt after Redis lost it give each buyer back the place they
had (shop/line/__init__.py), and let a server tell "not your turn yet" from the ticket and the
line's "now serving" alone (`not_yet`), without the app.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from functools import cache

from django.conf import settings

PLACE, PRE_QUEUE = "p", "q"
MAX_LENGTH = 120


@dataclass(frozen=True)
class Ticket:
    product_id: int
    drop: int  # the drop's opens_at, unix seconds
    kind: str  # PLACE or PRE_QUEUE
    score: int

    def text(self, *, user_id: int) -> str:
        return f"{self._body()}.{_signature(user_id, self._body())}"

    def _body(self) -> str:
        return f"{self.product_id}.{self.drop}.{self.kind}.{self.score}"


@cache
def _key(secret: str) -> bytes:
    return hashlib.sha256(b"shop.line.ticket:" + secret.encode()).digest()


def _signature(user_id: int, body: str) -> str:
    mac = hmac.new(_key(settings.SECRET_KEY), f"{user_id}:{body}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:18]).decode()


def read(text: str, *, user_id: int) -> Ticket | None:
    """The ticket `text` carries if this shop signed it for this account, else None (malformed,
    altered, forged or another account's)."""
    if not isinstance(text, str) or len(text) > MAX_LENGTH:
        return None
    parts = text.strip().split(".")
    if len(parts) != 5 or parts[2] not in (PLACE, PRE_QUEUE) or not all(p.isdigit() for p in (parts[0], parts[1])):
        return None
    try:
        ticket = Ticket(product_id=int(parts[0]), drop=int(parts[1]), kind=parts[2], score=int(parts[3]))
    except ValueError:
        return None
    if not hmac.compare_digest(parts[4], _signature(user_id, ticket._body())):
        return None
    return ticket


def not_yet(ticket: Ticket, serving: int) -> bool:
    """Is it too early for this ticket's buyer, given the line's "now serving" score? Pure: a
    front door can answer from the ticket alone (the app decides the rest)."""
    return ticket.kind == PRE_QUEUE or ticket.score > serving
