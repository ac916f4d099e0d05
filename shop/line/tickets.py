"""Line tickets: a buyer's place in a drop's line, signed, checked without Redis or MySQL.

A ticket is `<product>.<drop>.<kind>.<score>.<account>.<signature>[.<binding>]`: kind `p` (a place in the
open line, its score the Redis time of arrival in µs) or `q` (a place in the pre-queue, its score
the pre-queue's order). The signature is an HMAC-SHA256 of those, under a key derived from
SECRET_KEY for this purpose only: another account's ticket, or an altered one, does not verify.
The account is written out so that the shop's gunicorn worker, which does not know who sends a
request, can check the signature too (`verify`): it only answers "not your turn yet" from it, and only
to the credential (API token) the ticket was given with: the API binds its tickets to it
(`bound`, a second HMAC), so another account replaying a ticket is left to the app.
Tickets let a line rebuilt after Redis lost it give each buyer back the place they
had (shop/line/__init__.py), and let a server tell "not your turn yet" from the ticket and the
line's "now serving" alone (`not_yet`), without the app.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from functools import cache

from django.conf import settings

PLACE, PRE_QUEUE = "p", "q"
MAX_LENGTH = 120
# Digits in ASCII only, written the one way the shop writes them (int() would read "+5" or "٣").
_FORM = re.compile(r"((\d{1,12})\.(\d{1,12})\.([pq])\.(\d{1,20})\.(\d{1,19})\.([A-Za-z0-9_-]{24}))"
                   r"(?:\.([A-Za-z0-9_-]{16}))?", re.ASCII)


@dataclass(frozen=True)
class Ticket:
    product_id: int
    drop: int  # the drop's opens_at, unix seconds
    kind: str  # PLACE or PRE_QUEUE
    score: int

    def text(self, *, user_id: int) -> str:
        return f"{self._body()}.{user_id}.{_signature(user_id, self._body())}"

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
    found = verify(text)
    return found[0] if found is not None and found[1] == user_id else None


def verify(text: object) -> tuple[Ticket, int] | None:
    """(the ticket, the account it was given to) if this shop signed `text`, else None. Pure and
    never raises: the worker's main loop calls it on whatever a client sent."""
    found = _verified(text)
    return (found[0], found[1]) if found is not None else None


def verify_bound(text: object, *, credential: bytes) -> tuple[Ticket, int] | None:
    """`verify`, and only for a ticket `bound` to this credential: the worker, which does not know
    whose token a request carries, answers from a ticket only when it is sent by whom it was
    given to (a ticket replayed by another account goes on to the app, which refuses it)."""
    found = _verified(text)
    if found is None or found[3] is None or not credential:
        return None
    return (found[0], found[1]) if hmac.compare_digest(found[3].encode(), _binding(found[2], credential)) else None


def bound(text: str, *, credential: bytes) -> str:
    """The ticket `text`, bound to the credential it is given with (an API token)."""
    found = _verified(text)
    if found is None or not credential:
        return text
    return f"{found[2]}.{_binding(found[2], credential).decode()}"


def _binding(signed: str, credential: bytes) -> bytes:
    mac = hmac.new(_key(settings.SECRET_KEY), b"bound:" + signed.encode() + b":" + credential, hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()[:12])


def _verified(text: object) -> tuple[Ticket, int, str, str | None] | None:
    if not isinstance(text, str) or len(text) > MAX_LENGTH or not (found := _FORM.fullmatch(text.strip())):
        return None
    ticket = Ticket(product_id=int(found[2]), drop=int(found[3]), kind=found[4], score=int(found[5]))
    account = int(found[6])
    if not hmac.compare_digest(found[7].encode(), _signature(account, ticket._body()).encode()):
        return None
    return ticket, account, found[1], found[8]


def not_yet(ticket: Ticket, serving: int) -> bool:
    """Is it too early for this ticket's buyer, given the line's "now serving" score? Pure: a
    front door can answer from the ticket alone (the app decides the rest)."""
    return ticket.kind == PRE_QUEUE or ticket.score > serving
