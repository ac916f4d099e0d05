"""The busy path's fast readings decide exactly as the full ones (issue 35, "the edge must not get
slower"): `request_line`'s fast path for the usual order lines, the body and JSON readings, the
worker's `_body_length` and its canned busy answers. The full readings are kept here as they were
before they were made faster (the oracle); Hypothesis feeds both the same bytes, arbitrary and
hostile, and near misses of the usual lines, and asks for the same answer."""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from config import gunicorn_worker
from shop.edge import order_requests
from shop.edge.order_requests import (
    API_ORDERS,
    BODY_MAX,
    HEAD_MAX,
    MAX_BRACKETS,
    MAX_ID,
    READ_MAX,
    _request_line,
    _small_int,
    _Unreadable,
    body,
    cookie,
    cookie_in,
    header,
    headers,
    is_order,
    order_json,
    product_ids,
    request_line,
    to_refuse_while_full,
)
from tests.shop.edge.test_order_requests import around_the_cap, cases, hostile_requests, order, request


# --- the oracle: the readings as they were (main at 6f6f46f) --------------------------------------
def full_clean_path(path: str) -> str:
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


def full_is_order_request(method: str, path: str) -> bool:
    return method == "POST" and full_clean_path(path) in order_requests.ORDER_PATHS


# The module's own full reading, which `request_line` falls back to past its table of plain lines.
full_request_line = order_requests._request_line


def full_is_order(request: bytes) -> bool:
    line = full_request_line(request)
    return line is not None and line[1] is not None and full_is_order_request(line[0], line[1])


def _values(head: bytes, name: bytes) -> list[bytes]:
    values, key = [], b"\r\n" + name + b":"
    at = head.find(key)
    while at >= 0:
        start = at + len(key)
        end = head.find(b"\r\n", start)
        values.append(head[start:end if end >= 0 else len(head)].strip())
        at = head.find(key, start)
    return values


def full_body(request: bytes) -> bytes | None:
    request = request[:READ_MAX]
    end = request.find(b"\r\n\r\n", 0, HEAD_MAX + 4)
    if end < 0:
        return None
    head = request[:end].lower()
    lengths = _values(head, b"content-length")
    if _values(head, b"transfer-encoding") or len(lengths) > 1:
        return None
    if not lengths:
        return b""
    length = lengths[0]
    if not (0 < len(length) <= 5 and length.isdigit()) or int(length) > BODY_MAX:
        return None
    rest = request[end + 4:]
    return rest[:int(length)] if len(rest) >= int(length) else None


def _refuse(value: str) -> Any:
    raise _Unreadable(value[:20])


def full_order_json(data: bytes) -> Any:
    if len(data) > BODY_MAX or data.count(b"[") + data.count(b"{") > MAX_BRACKETS:
        return None
    try:
        return json.loads(data.decode("utf-8"), parse_int=_small_int, parse_float=_refuse, parse_constant=_refuse)
    except (ValueError, _Unreadable, RecursionError):
        return None


def full_ids(request: bytes) -> tuple[int, ...] | None:
    raw = full_body(request)
    order = full_order_json(raw) if raw else None
    lines = order.get("lines") if isinstance(order, dict) else None
    if not isinstance(lines, list) or not lines:
        return None
    ids = tuple(line.get("product_id") if isinstance(line, dict) else None for line in lines)
    if not all(type(pid) is int and 1 <= pid <= MAX_ID for pid in ids):
        return None
    return ids


def full_product_ids(request: bytes) -> tuple[int, ...] | None:
    line = full_request_line(request)
    if line is None or line[0] != "POST" or line[1] != API_ORDERS:
        return None
    return full_ids(request)


def full_to_refuse(request: bytes, *, known_sold_out, crowded=None) -> bool:
    line = full_request_line(request)
    if line is None or line[1] is None or not full_is_order_request(line[0], line[1]):
        return False
    ids = full_ids(request) if line[1] == API_ORDERS else None
    return ids is None or (not known_sold_out(ids) and (crowded is None or crowded(ids)))


def full_body_length(head: bytes) -> int | None:
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or len(value) > 15:
                return None
            length = int(value)
    return length


def full_header(request: bytes, name: bytes) -> bytes | None:
    end = request.find(b"\r\n\r\n", 0, HEAD_MAX + 4)
    if end < 0:
        return None
    head = request[:end]
    at = head.lower().find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    stop = head.find(b"\r\n", start)
    return head[start:stop if stop >= 0 else len(head)].strip()


def full_cookie(request: bytes, name: bytes) -> bytes | None:
    jar = full_header(request, b"cookie")
    for pair in (jar or b"").split(b";"):
        key, sep, value = pair.strip().partition(b"=")
        if sep and key == name:
            return value.strip()
    return None


def full_busy_checkout(request: bytes) -> bytes | None:
    w = gunicorn_worker
    fields = order_requests.checkout_form(request, w._CHECKOUT_FIELDS)
    if not any(k == "idempotency_key" for k, _ in fields):
        return None
    inputs = "".join(f'<input type=hidden name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields)
    return w._page(
        "<p id=busy-retry>Nothing was ordered yet. Trying again in a moment with the same order "
        "(it is never placed twice).</p>"
        f"<form method=post action='/checkout/' id=again>{inputs}<button type=submit>Try now</button></form>"
        f"<script>{w._SCRIPT}</script>")


def full_busy_response(request: bytes, reason: str, extra: bytes = b"") -> bytes:
    """The worker's busy answer, built per request as it was (the readings above)."""
    w = gunicorn_worker
    line = full_request_line(request)
    method, path = line if line is not None and line[1] is not None else ("", "")
    api = full_clean_path(path).startswith(order_requests.API_PREFIX) if path else False
    checkout = not api and full_is_order_request(method, path)
    page = full_busy_checkout(request) if checkout else None
    if page is not None:
        kind, csp = b"text/html; charset=utf-8", w._CSP_CHECKOUT
    elif not api and (checkout or b"text/html" in request[:HEAD_MAX].lower()):
        page, kind, csp = w._BUSY_HTML, b"text/html; charset=utf-8", w._CSP_PAGE
    else:
        page, kind, csp = w._BUSY_JSON[reason], b"application/json", w._CSP_JSON
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + kind + b"\r\nRetry-After: "
            + str(w.RETRY_AFTER).encode() + b"\r\nCache-Control: no-store\r\n" + w._SITE_HEADERS + extra
            + b"Content-Security-Policy: " + csp + b"\r\nConnection: close\r\nContent-Length: "
            + str(len(page)).encode() + b"\r\n\r\n" + page)


# --- the same decisions ---------------------------------------------------------------------------
def never_sold_out(ids) -> bool:
    return False


def sold_out_if_even(ids) -> bool:
    return all(i % 2 == 0 for i in ids)


def crowded_if_odd_first(ids) -> bool:
    return ids[0] % 2 == 1


def same(data: bytes) -> None:
    """Every reading of the busy path, fast and full, on the same bytes."""
    assert request_line(data) == full_request_line(data) == _request_line(data)
    assert is_order(data) is full_is_order(data)
    assert body(data) == full_body(data)
    assert product_ids(data) == full_product_ids(data)
    for known_sold_out in (never_sold_out, sold_out_if_even):
        for crowded in (None, crowded_if_odd_first):
            assert (to_refuse_while_full(data, known_sold_out=known_sold_out, crowded=crowded)
                    is full_to_refuse(data, known_sold_out=known_sold_out, crowded=crowded))
    head = data.partition(b"\r\n\r\n")[0]
    assert gunicorn_worker._body_length(head) == full_body_length(head)
    names = (b"authorization", b"cookie", b"line-arrival", b"content-length", b"host")
    assert headers(data, names) == tuple(header(data, name) for name in names) == tuple(
        full_header(data, name) for name in names)
    for name in (b"sessionid", b"line_arrival", b""):
        assert cookie(data, name) == cookie_in(header(data, b"cookie"), name) == full_cookie(data, name)
    for reason in ("full", "queue_full"):
        for extra in (b"", b"Line-Arrival: 1.x\r\n"):
            assert gunicorn_worker.busy_response(data, reason, extra) == full_busy_response(data, reason, extra)


# The usual order lines and their near misses: one byte changed, dropped or added anywhere in
# them, another version, case, spacing or line end, then any rest.
USUAL = [b"POST /api/orders/ HTTP/1.1\r\n", b"POST /checkout/ HTTP/1.1\r\n", b"POST /api/orders/ HTTP/1.0\r\n",
         b"POST /checkout/ HTTP/1.0\r\n"]


@st.composite
def near_usual_lines(draw) -> bytes:
    line = bytearray(draw(st.sampled_from(USUAL)))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        at = draw(st.integers(min_value=0, max_value=len(line)))
        edit = draw(st.sampled_from(["replace", "drop", "insert"]))
        byte = draw(st.sampled_from(b" \r\n\t/.%?#0129AaPpHTxX\xff"))
        if edit == "replace" and at < len(line):
            line[at] = byte
        elif edit == "drop" and at < len(line):
            del line[at]
        else:
            line.insert(at, byte)
    return bytes(line)


rests = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda ids, extra: b"Host: h\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(order(*ids))).encode() + extra + b"\r\n\r\n" + order(*ids),
              st.lists(st.integers(min_value=-5, max_value=2**64), min_size=1, max_size=4),
              st.sampled_from([b"", b"\r\nContent-Length: 3", b"\r\nTransfer-Encoding: chunked",
                               b"\r\nAccept: text/html", b"\r\n content-length : 9", b"\r\nx-content-length: 1"])),
    st.builds(lambda key: b"Host: h\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: "
              + str(len(key) + 16).encode() + b"\r\n\r\nidempotency_key=" + key,
              st.binary(max_size=40)),
)


@pytest.mark.slow  # thousands of examples, seconds: left out of the fast tier
@cases(2000)
@given(line=near_usual_lines(), rest=rests)
@example(line=b"POST /api/orders/ HTTP/1.1\r\n", rest=b"")
@example(line=b"POST /api/orders/ HTTP/1.1", rest=b"")
@example(line=b"POST /api/orders/ HTTP/1.1\r", rest=b"\n")
@example(line=b"\r\nPOST /api/orders/ HTTP/1.1\r\n", rest=b"")
@example(line=b"POST /api/orders/ HTTP/1.10\r\n", rest=b"")
@example(line=b"POST /checkout/ HTTP/1.1 \r\n", rest=b"")
def test_the_usual_lines_and_their_near_misses_read_as_the_full_reading(line, rest):
    same(line + rest)


@cases(1500)
@given(st.binary(max_size=400) | around_the_cap)
def test_arbitrary_bytes_read_as_the_full_reading(data):
    same(data)


@pytest.mark.slow  # thousands of examples, seconds: left out of the fast tier
@cases(1500)
@given(hostile_requests())
@example(request(b"/api/orders/", b'{"lines":[{"product_id":7,"quantity":1}]} '))  # whitespace after
@example(request(b"/api/orders/", b' \t\n{"lines":[{"product_id":7}]}'))  # before
@example(request(b"/api/orders/", b'{"lines":[{"product_id":7}]} x'))  # data after: unreadable
@example(request(b"/api/orders/", b'\xef\xbb\xbf{"lines":[{"product_id":7}]}'))  # a BOM: unreadable
@example(request(b"/api/orders/", b'{"lines":[{"product_id":7}]}\x0c'))  # not JSON whitespace
@example(request(b"/api/orders/", b""))
@example(request(b"/api/orders/", b" "))
def test_hostile_requests_read_as_the_full_reading(data):
    same(data)


header_lines = st.sampled_from([
    b"Content-Length: 12", b"content-length:7", b"CONTENT-LENGTH : 3", b" Content-Length: 4", b"Content-Length",
    b"Content-Length: ", b"Content-Length: 1e3", b"Content-Length: " + b"9" * 16, b"Content-Length: \xd9\xa1",
    b"Transfer-Encoding: chunked", b"transfer-encoding", b"x: content-length", b"x-content-length: 5",
    b"content-length-x: 5", b"content-length: content-length", b"Host: h\rcontent-length: 5", b"\ncontent-length: 5",
    b"content-length\t: 5", b"\x0bcontent-length: 5"])


@pytest.mark.slow  # thousands of examples, seconds: left out of the fast tier
@cases(1500)
@given(st.lists(header_lines | st.binary(max_size=30), max_size=8),
       st.sampled_from([b"POST / HTTP/1.1", b"POST /content-length HTTP/1.1", b""]))
def test_the_workers_body_length_reads_as_the_full_reading(lines, first):
    head = b"\r\n".join([first, *lines])
    assert gunicorn_worker._body_length(head) == full_body_length(head)


@cases(600)
@given(st.binary(max_size=60))
def test_order_json_reads_as_json_loads(data):
    assert order_json(data) == full_order_json(data)


@cases(300)
@given(st.text(max_size=30) | st.text(alphabet="&<>\"'ab-_=", max_size=10))
def test_the_checkout_pages_fields_are_escaped_as_html_escape_does(text):
    assert gunicorn_worker._escape(text) == html.escape(text)


@cases(300)
@given(fields=st.lists(st.tuples(st.sampled_from(["csrfmiddlewaretoken", "idempotency_key", "coupon_code", "x"]),
                                 st.text(max_size=12)), max_size=5))
def test_the_checkout_page_is_the_one_built_before(fields):
    from urllib.parse import urlencode

    form = urlencode(fields).encode()
    data = request(b"/checkout/", form, headers=b"Host: h\r\nContent-Length: " + str(len(form)).encode())
    assert gunicorn_worker._busy_checkout(data) == full_busy_checkout(data)
    same(data)


def test_the_canned_answers_follow_the_sites_headers():
    """The busy answers are built once; the site's headers read when the app loads rebuild them."""
    usual = b"POST /api/orders/ HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    saved = gunicorn_worker._SITE_HEADERS
    try:
        gunicorn_worker._SITE_HEADERS = b"X-Test: 1\r\n"
        gunicorn_worker._CANNED = gunicorn_worker._canned()
        assert b"\r\nX-Test: 1\r\n" in gunicorn_worker.busy_response(usual, "full")
        gunicorn_worker.use_site_headers()
        assert b"X-Test" not in gunicorn_worker.busy_response(usual, "full")
        assert gunicorn_worker.busy_response(usual, "full") == full_busy_response(usual, "full")
    finally:
        gunicorn_worker._SITE_HEADERS = saved
        gunicorn_worker._CANNED = gunicorn_worker._canned()
