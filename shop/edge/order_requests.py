"""Which requests are orders: the one rule, and what a request's raw bytes say about it.

The shop's gunicorn worker refuses orders before the app while its process's lines are full
(config/gunicorn_worker.py); it reads the client's bytes in its main loop, where an exception would
end the process and every request it serves. So everything here is pure, bounded and never
raises:

- it looks at most at HEAD_MAX bytes of head and BODY_MAX bytes of body (READ_MAX in all);
- JSON is parsed only when it has at most MAX_BRACKETS brackets (so nesting is shallow), with
  integers of at most ID_DIGITS digits and no floats, NaN or Infinity;
- whatever it cannot read is "not known" (None), never an error. A request not known to be an
  order goes on to the app (which answers bad input 400); an order whose products are not known
  is refused like any order while the lines are full (nothing shows it is cheap).

A request target is read as the app reads it (gunicorn, then Django): the query string and the
fragment go, an absolute URI ("http://host/api/orders/") gives its path, percent-escapes are
decoded once. Then doubled slashes and dot segments are cleaned away, which the app would not do
(it answers 404): so an odd spelling of an order is still an order, and buys no cheaper answer.
Methods are case-sensitive (RFC 9110): gunicorn answers "post" 400 itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

# The paths of the two ways to order (config/urls.py routes them: tests/shop/edge/test_order_requests.py
# checks that the app routes no other spelling to its order views).
API_ORDERS = "/api/orders/"
CHECKOUT = "/checkout/"
ORDER_PATHS = frozenset({API_ORDERS, CHECKOUT})
API_PREFIX = "/api/"

HEAD_MAX = 8 * 1024  # request line and headers: a longer head is not read
BODY_MAX = 8 * 1024  # an order of MAX_LINES_PER_ORDER lines is well under 2 KiB
READ_MAX = HEAD_MAX + 4 + BODY_MAX  # what the worker reads of a request before it decides (+ the blank line)
MAX_BRACKETS = 64  # "[" and "{" in an order's body: 2 + one per line
ID_DIGITS = 19  # a product id is a BIGINT: at most 2**63 - 1
MAX_ID = 2**63 - 1
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_TARGET = re.compile(rb"[\x21-\x7e]+")  # printable ASCII: gunicorn refuses any other target
_PLAIN = {path.encode(): path for path in ORDER_PATHS}  # the usual spellings need no reading
# The usual request lines of an order, as `request_line` reads them (its fast path: tests/shop/
# test_order_requests_fast.py checks that it decides as the full reading on any bytes).
_PLAIN_LINES = {b"POST " + target + b" HTTP/1." + minor: ("POST", path)
                for target, path in _PLAIN.items() for minor in (b"1", b"0")}
_PLAIN_LINE_MAX = max(map(len, _PLAIN_LINES))
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's (json.decoder.WHITESPACE)


class _Unreadable(Exception):
    """Raised by the JSON hooks below and caught here: never leaves this module."""


def clean_path(path: str) -> str:
    """A decoded path without doubled slashes and dot segments ("/api//x/../orders/" is
    "/api/orders/"); a trailing slash stays."""
    if path in ORDER_PATHS:  # the usual case, clean already
        return path
    parts: list[str] = []
    segments = path.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "..":
            if parts:
                parts.pop()
        elif segment not in ("", "."):
            parts.append(segment)
        if last and segment in ("", ".", "..") and i > 0:
            parts.append("")
    return "/" + "/".join(parts) if parts != [""] else "/"


def target_path(target: bytes) -> str | None:
    """The path of a request target as the app routes it, cleaned (`clean_path`); None for a
    target gunicorn refuses (not printable ASCII, or neither a path nor an absolute URI)."""
    if target in _PLAIN:
        return _PLAIN[target]
    if not 0 < len(target) <= HEAD_MAX or not _TARGET.fullmatch(target):
        return None
    text = target.decode("ascii").split("#", 1)[0].split("?", 1)[0]
    if not text.startswith("/"):
        scheme, sep, rest = text.partition("://")
        if not sep or not _SCHEME.fullmatch(scheme):
            return None
        slash = rest.find("/")
        text = rest[slash:] if slash >= 0 else "/"
    return clean_path(unquote_to_bytes(text).decode("latin-1"))  # gunicorn's PATH_INFO: latin-1


def is_order_request(method: str, path: str) -> bool:
    """The one rule: a POST to the API's orders or to the web checkout (`path` decoded, as the
    app sees it)."""
    return method == "POST" and clean_path(path) in ORDER_PATHS


def is_api_path(path: str) -> bool:
    """The API answers in JSON, the rest of the site with pages."""
    return clean_path(path).startswith(API_PREFIX)


def request_line(request: bytes) -> tuple[str, str | None] | None:
    """(method, path) of a request's first line, once it came whole within HEAD_MAX bytes; the
    path is None when the target cannot be routed (`target_path`)."""
    end = request.find(b"\r\n", 0, _PLAIN_LINE_MAX + 2)
    plain = _PLAIN_LINES.get(request[:end]) if end > 0 else None
    return plain if plain is not None else _request_line(request)


def _request_line(request: bytes) -> tuple[str, str | None] | None:
    """`request_line`'s full reading: any request line."""
    line, sep, _ = request[:HEAD_MAX].partition(b"\r\n")
    parts = line.split(b" ")
    if not sep or len(parts) != 3 or not parts[2].startswith(b"HTTP/") or not parts[0].isalpha():
        return None
    return parts[0].decode("ascii"), target_path(parts[1])


def is_order(request: bytes) -> bool:
    """Whether a request's bytes (as far as they came) begin an order."""
    line = request_line(request)
    return line is not None and line[1] is not None and is_order_request(line[0], line[1])


def body(request: bytes) -> bytes | None:
    """A request's whole body by its Content-Length, at most BODY_MAX bytes; None when its head or
    body has not all come, it is longer, chunked, or its length is not one plain number."""
    request = request[:READ_MAX]
    end = request.find(b"\r\n\r\n", 0, HEAD_MAX + 4)
    if end < 0:
        return None
    head = request[:end].lower()
    key = b"\r\ncontent-length:"
    at = head.find(key)
    if b"\r\ntransfer-encoding:" in head or (at >= 0 and head.find(key, at + len(key)) >= 0):
        return None  # a Transfer-Encoding, or more than one Content-Length
    if at < 0:
        return b""
    stop = head.find(b"\r\n", at + len(key))
    length = head[at + len(key):stop if stop >= 0 else len(head)].strip()
    if not (0 < len(length) <= 5 and length.isdigit()) or (size := int(length)) > BODY_MAX:
        return None
    start = end + 4
    return request[start:start + size] if len(request) - start >= size else None


def _small_int(digits: str) -> int:
    if len(digits.lstrip("-")) > ID_DIGITS:
        raise _Unreadable(digits[:20])
    return int(digits)


def _refuse(value: str) -> Any:
    raise _Unreadable(value[:20])  # a float, NaN, Infinity: no product id


# One decoder, made once (json.loads with hooks makes one per call): json.loads' reading, by its
# scanner (thread-safe: json's own default decoder is shared alike).
_SCAN = json.JSONDecoder(parse_int=_small_int, parse_float=_refuse, parse_constant=_refuse).scan_once


def order_json(data: bytes) -> Any:
    """An API order's body as JSON, parsed within the bounds above; None when unreadable."""
    if len(data) > BODY_MAX or data.count(b"[") + data.count(b"{") > MAX_BRACKETS:
        return None
    try:
        text = data.decode("utf-8")
        value, end = _SCAN(text, 0 if text[:1] == "{" else _WHITESPACE.match(text).end())
    except (ValueError, StopIteration, _Unreadable, RecursionError):
        return None
    if end != len(text) and _WHITESPACE.match(text, end).end() != len(text):
        return None  # something after it
    return value


def product_ids(request: bytes) -> tuple[int, ...] | None:
    """The product ids an API order names (its request's bytes, as far as they came); None when
    not known: not an API order, not all come yet, or not a readable order."""
    line = request_line(request)
    if line is None or line[0] != "POST" or line[1] != API_ORDERS:
        return None
    return _ids(request)


def _ids(request: bytes) -> tuple[int, ...] | None:
    raw = body(request)
    order = order_json(raw) if raw else None
    lines = order.get("lines") if isinstance(order, dict) else None
    if not isinstance(lines, list) or not lines:
        return None
    ids = []
    for line in lines:
        pid = line.get("product_id") if isinstance(line, dict) else None
        if type(pid) is not int or not 1 <= pid <= MAX_ID:
            return None
        ids.append(pid)
    return tuple(ids)


def to_refuse_while_full(request: bytes, *, known_sold_out: Callable[[Iterable[int]], bool],
                         crowded: Callable[[tuple[int, ...]], bool] | None = None) -> bool:
    """Whether the worker refuses this request (as far as it came) `busy` while its lines are
    full: an order, unless it names only products known to be sold out (the app answers those
    "sold out" at once) or, given `crowded`, none of the products whose buyers fill the process.
    An order it cannot read is refused: nothing shows it is cheap. A web checkout's products are
    in its session: it is refused."""
    line = request_line(request)
    if line is None or line[1] is None or not is_order_request(line[0], line[1]):
        return False
    ids = _ids(request) if line[1] == API_ORDERS else None
    return ids is None or (not known_sold_out(ids) and (crowded is None or crowded(ids)))


def header(request: bytes, name: bytes) -> bytes | None:
    """The first value of a header (`name` lower-case, without its colon), as sent, stripped;
    None without it or without a whole head within HEAD_MAX bytes."""
    return headers(request, (name,))[0]


def headers(request: bytes, names: tuple[bytes, ...]) -> tuple[bytes | None, ...]:
    """`header` of each of `names`, the head read once."""
    end = request.find(b"\r\n\r\n", 0, HEAD_MAX + 4)
    if end < 0:
        return (None,) * len(names)
    head = request[:end]
    low = head.lower()
    found: list[bytes | None] = []
    for name in names:
        at = low.find(b"\r\n" + name + b":")
        if at < 0:
            found.append(None)
            continue
        start = at + len(name) + 3
        stop = head.find(b"\r\n", start)
        found.append(head[start:stop if stop >= 0 else len(head)].strip())
    return tuple(found)


def cookie(request: bytes, name: bytes) -> bytes | None:
    """A cookie's value from the request's (first) Cookie header; None without it."""
    return cookie_in(header(request, b"cookie"), name)


def cookie_in(jar: bytes | None, name: bytes) -> bytes | None:
    """A cookie's value from a Cookie header's value (`header(request, b"cookie")`)."""
    for pair in (jar or b"").split(b";"):
        key, sep, value = pair.strip().partition(b"=")
        if sep and key == name:
            return value.strip()
    return None


def checkout_form(request: bytes, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The named fields of a web checkout's form body (each once, in order), for the busy page
    that posts them again; [] when the body is not a readable form."""
    raw = body(request)
    if not raw:
        return []
    try:
        fields = parse_qsl(raw.decode("ascii"), keep_blank_values=True, max_num_fields=64)
    except (UnicodeDecodeError, ValueError):
        return []
    seen: dict[str, str] = {}
    for name, value in fields:
        if name in names and name not in seen:
            seen[name] = value
    return list(seen.items())
