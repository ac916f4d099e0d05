"""Arrival stamps: a buyer told `busy` keeps the time it first came (docs/design.md, "The line").

When the worker (or the app) answers an order for a lined product `busy`, the buyer is given a
stamp of that moment: `<ms>.<signature>`, the shop's time (shop/plumbing/clock.py) in ms and an
HMAC-SHA256 of it and of the request's credential (its Authorization header, else its session
cookie), under a key derived from SECRET_KEY for this purpose only. It comes back as a
`Line-Arrival` header or cookie, and the line places a new buyer at min(stamp, now): being told
`busy` no longer means losing one's turn to those who retried faster.

A stamp is honoured for MAX_AGE seconds, and never from before the drop's pre-queue window (see
`shop.line.join`). Bound to a credential, it is no use to another account or token; and since an
account takes one place, at its first join, a script gains nothing from it: its earliest stamp is
its own first arrival. Everything here is pure and never raises: the worker's main loop uses it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from functools import cache

from django.conf import settings

HEADER, COOKIE = "Line-Arrival", "line_arrival"
MAX_AGE = 60  # seconds a stamp is honoured
_FORM = re.compile(rb"(\d{13})\.([A-Za-z0-9_-]{24})", re.ASCII)


@cache
def _key(secret: str) -> bytes:
    return hashlib.sha256(b"shop.line.arrival:" + secret.encode()).digest()


def _signature(at_ms: int, credential: bytes) -> bytes:
    mac = hmac.new(_key(settings.SECRET_KEY), str(at_ms).encode() + b":" + credential, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:18])


def stamp(*, at_ms: int, credential: bytes) -> str:
    return f"{at_ms}.{_signature(at_ms, credential).decode()}"


def read(text: object, *, credential: bytes) -> int | None:
    """The time (ms) a stamp this shop gave for this credential holds; None if it is not one."""
    if isinstance(text, str):
        text = text.encode("latin-1", "replace")
    if not isinstance(text, bytes) or not isinstance(credential, bytes) or not (found := _FORM.fullmatch(text.strip())):
        return None
    at_ms = int(found[1])
    return at_ms if hmac.compare_digest(found[2], _signature(at_ms, credential)) else None


def honoured(at_ms: int | None, *, now_ms: int, window_ms: int) -> int | None:
    """The arrival a stamp gives a buyer joining at `now_ms` (never later than now), or None when it
    is older than MAX_AGE or from before `window_ms` (the start of the drop's pre-queue window)."""
    if at_ms is None or at_ms < window_ms or now_ms - at_ms > MAX_AGE * 1000:
        return None
    return min(at_ms, now_ms)


def credential(*, authorization: bytes | None, session: bytes | None) -> bytes:
    """What a stamp is bound to: the bearer token sent, else the session cookie (b"" without
    either: then it is bound to nothing but its age)."""
    return authorization or session or b""


def of_request(request) -> bytes:
    """A Django request's credential (`credential`), as the worker reads it from the bytes."""
    from django.conf import settings as django_settings

    auth = request.META.get("HTTP_AUTHORIZATION")
    session = request.COOKIES.get(django_settings.SESSION_COOKIE_NAME)
    return credential(authorization=auth.strip().encode("latin-1", "replace") if auth else None,
                      session=session.encode("latin-1", "replace") if session else None)


def brought(request) -> int | None:
    """The time of the arrival stamp a Django request brought (header, else cookie), if valid."""
    text = request.META.get("HTTP_LINE_ARRIVAL") or request.COOKIES.get(COOKIE)
    return read(text, credential=of_request(request)) if text else None


def arrived(request) -> tuple[int | None, int | None]:
    """When a Django request came, for a new place in a line: (the shop's clock in ms, Redis's
    clock in µs or None). A valid stamp it brought (it was told `busy` before): that time. Else
    when its bytes reached the machine, as the shop's worker read it (`environ["shop.received"]`,
    the kernel's receive time as a time.monotonic()), so a buyer through the app is dated as one
    through the line's door is. (None, None) without either: the line dates it as it joins."""
    if (stamp := brought(request)) is not None:
        return stamp, None
    received = request.META.get("shop.received")
    if received is None:
        return None, None
    from redis.exceptions import RedisError

    from shop.line import redis_clock
    from shop.plumbing import clock

    at_ms = int((received + clock.now().timestamp() - time.monotonic()) * 1000)
    try:
        return at_ms, int((received + redis_clock.offset()) * 1_000_000)
    except RedisError:
        return at_ms, None
