"""The one rule for order requests (shop/edge/order_requests.py), which the worker's triage applies to
raw client bytes in its main loop: it never raises, whatever the bytes, and reads no further than
its bounds. Property tests (Hypothesis) feed it arbitrary bytes and hostile requests by the
thousand; examples pin each spelling of a path."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import pytest
from django.urls import Resolver404, resolve, reverse
from gunicorn.util import split_request_uri, unquote_to_wsgi_str
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from config.gunicorn_worker import _PARTIAL, _TOO_LARGE, _WHOLE, ShopWorker, _body_length, _Conn, busy_response
from shop import validation
from shop.api import views as api
from shop.edge import order_requests
from shop.edge.order_requests import (
    READ_MAX,
    body,
    checkout_form,
    is_order,
    is_order_request,
    product_ids,
    request_line,
    target_path,
    to_refuse_while_full,
)
from shop.web import views


def cases(n: int) -> settings:
    """n examples, no deadline (the machine is shared: timing is noise here, not the property)."""
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def never_sold_out(ids) -> bool:
    return False


def always_sold_out(ids) -> bool:
    return True


def request(target: bytes, body: bytes = b"", *, method: bytes = b"POST", headers: bytes | None = None) -> bytes:
    if headers is None:
        headers = b"Host: shop.test\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
    return method + b" " + target + b" HTTP/1.1\r\n" + headers + b"\r\n\r\n" + body


def order(*ids: object) -> bytes:
    return json.dumps({"lines": [{"product_id": i, "quantity": 1} for i in ids]}).encode()


class _Sock:
    def send(self, data: bytes) -> int:  # the main loop's "100 Continue"
        return len(data)


def reading(data: bytes, pieces: int = 3) -> str:
    """The main loop's read of a request that comes in `pieces` (config/gunicorn_worker.py): its
    verdict once all of `data` has come; every verdict on the way is one of the three too."""
    conn = _Conn.__new__(_Conn)
    conn.sock, conn.request, conn.whole_at, conn.scanned = _Sock(), bytearray(), 0, 0
    worker = SimpleNamespace(head_max=32 * 1024, body_buffer=64 * 1024)
    step = max(1, len(data) // pieces)
    verdict = _PARTIAL
    for start in range(0, max(len(data), 1), step):
        conn.request += data[start:start + step]
        verdict = ShopWorker._progress(worker, conn)
        assert verdict in (_PARTIAL, _WHOLE, _TOO_LARGE)
    return verdict


def everything(data: bytes) -> None:
    """Every function the worker applies to a client's bytes; each answer of an allowed kind."""
    assert isinstance(is_order(data), bool)
    line = request_line(data)
    assert line is None or (isinstance(line[0], str) and (line[1] is None or line[1].startswith("/")))
    ids = product_ids(data)
    assert ids is None or (ids and all(type(i) is int and 1 <= i <= validation.MAX_ID for i in ids))
    got = body(data)
    assert got is None or len(got) <= order_requests.BODY_MAX
    refused = to_refuse_while_full(data, known_sold_out=never_sold_out)
    assert refused is is_order(data)  # nothing is sold out: every order is refused
    assert to_refuse_while_full(data, known_sold_out=always_sold_out) is (is_order(data) and ids is None)
    assert isinstance(checkout_form(data, ("idempotency_key",)), list)
    head = data.partition(b"\r\n\r\n")[0]
    length = _body_length(head)
    assert length is None or (type(length) is int and length >= 0)
    assert reading(data) in (_PARTIAL, _WHOLE, _TOO_LARGE)
    for reason in ("queue_full", "queue_delay", "full"):
        assert busy_response(data, reason).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    # What it decides on is bounded: the bytes past READ_MAX change nothing.
    assert (is_order(data), ids, refused) == (is_order(data[:READ_MAX]), product_ids(data[:READ_MAX]),
                                              to_refuse_while_full(data[:READ_MAX], known_sold_out=never_sold_out))


# --- the reproduction ------------------------------------------------------------------
HEAD = b"POST /api/orders/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize("evil", [b'{"lines":[{"product_id":1e999,"quantity":1}]}', b"[" * 5000,
                                  b'{"lines":' + b"[" * 5000, b'{"a":' * 5000])
def test_the_bodies_that_killed_the_worker_are_refused_without_an_exception(evil):
    """Before, the triage raised OverflowError (1e999) and RecursionError (the brackets) in the
    worker's main loop: the worker ended, and every buyer it served with it."""
    data = HEAD + b"Content-Length: " + str(len(evil)).encode() + b"\r\n\r\n" + evil
    assert product_ids(data) is None  # not known: it names no product the triage can read
    assert to_refuse_while_full(data, known_sold_out=always_sold_out) is True  # an order, refused busy
    everything(data)


def test_an_exception_in_the_triage_lets_the_request_go_on_and_is_logged(caplog):
    """The last guard in the worker: should the rule ever raise, the app gets the request."""
    def broken(ids):
        raise RuntimeError("the index of sold-out products broke")

    worker = SimpleNamespace(_known_sold_out=broken, log=logging.getLogger("test.worker"))
    data = request(b"/api/orders/", order(1))
    with caplog.at_level(logging.ERROR, logger="test.worker"):
        assert ShopWorker._order_to_refuse(worker, data) is False
    assert "triage failed" in caplog.text


# --- arbitrary bytes and hostile requests --------------------------------------------------------
# Inputs around READ_MAX, built cheaply (Hypothesis draws big binaries slowly): what came, padded.
around_the_cap = st.tuples(st.binary(max_size=200), st.sampled_from([b"a", b"[", b"\r\n", b"9", b"\xff"]),
                           st.integers(min_value=READ_MAX - 300, max_value=READ_MAX + 300),
                           st.binary(max_size=50)).map(lambda t: (t[0] + t[1] * t[2])[:t[2]] + t[3])


@cases(1500)
@given(st.binary(max_size=400) | around_the_cap)
def test_arbitrary_bytes_never_raise(data):
    everything(data)


@cases(800)
@given(prefix=st.sampled_from([b"POST /api/orders/ HTTP/1.1\r\n", b"POST /checkout/ HTTP/1.1\r\n",
                               b"POST http://h/api/orders/?x HTTP/1.1\r\n", b""]),
       rest=st.binary(max_size=400))
def test_arbitrary_bytes_after_an_order_line_never_raise(prefix, rest):
    everything(prefix + rest)


huge_numbers = st.sampled_from(["1e999", "-1e999", "1E400", str(10**400), str(-(10**400)), "9" * 5000,
                                "NaN", "Infinity", "-Infinity", "1.5", "-0", "0", "1e2", "0x10",
                                str(2**63), str(2**63 - 1), "true", "null", '"7"', "[7]", "{}"])
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=1, max_value=2**63 - 1),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)


@st.composite
def order_bodies(draw) -> bytes:
    """JSON that is, nearly is, or pretends to be an order: hostile numbers, deep nesting,
    invalid UTF-8, truncation."""
    kind = draw(st.sampled_from(["raw number", "json", "deep", "order", "many lines"]))
    if kind == "raw number":
        text = '{"lines":[{"product_id":' + draw(huge_numbers) + ',"quantity":1}]}'
    elif kind == "json":
        text = json.dumps({"lines": draw(st.lists(st.dictionaries(st.sampled_from(["product_id", "quantity", "x"]),
                                                                   json_values), max_size=5) | json_values)})
    elif kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=10_000))
        text = draw(st.sampled_from(["[", "{\"a\":", '{"lines":['])) * depth
    elif kind == "order":
        text = order(*draw(st.lists(st.integers(min_value=1, max_value=2**63 - 1), min_size=1, max_size=20))).decode()
    else:
        text = order(*range(1, draw(st.integers(min_value=20, max_value=600)))).decode()  # up to 25 KB
    data = text.encode()
    if draw(st.booleans()):  # damage: cut it, or put bytes that are not UTF-8 in it
        cut = draw(st.integers(min_value=0, max_value=len(data)))
        data = data[:cut] + draw(st.sampled_from([b"", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[cut:]
    return data


@st.composite
def hostile_requests(draw) -> bytes:
    payload = draw(order_bodies())
    method = draw(st.sampled_from([b"POST", b"POST", b"GET", b"HEAD", b"post", b"PUT", b"POST\t", b""]))
    target = draw(st.sampled_from([b"/api/orders/", b"/checkout/", b"/api/orders/?x=1", b"http://h/api/orders/",
                                   b"//api//orders/", b"/api/%6Frders/", b"/api/orders", b"/api/x/../orders/",
                                   b"/api/orders/%00", b"*", b"", b"/\xff/", b"/api/orders/" + b"a" * 9000]))
    length = draw(st.sampled_from(["honest", "more", "less", "huge", "negative", "words", "twice", "none",
                                   "digits", "unicode digits"]))
    lengths = {"honest": [str(len(payload))], "more": [str(len(payload) + 100)],
               "less": [str(max(0, len(payload) - 3))], "huge": ["9" * 5000], "negative": ["-5"],
               "words": ["ten"], "twice": [str(len(payload)), "3"], "none": [],
               "digits": [str(len(payload)).zfill(12)], "unicode digits": ["\u0661\u0662"]}[length]
    headers = [b"Host: h", b"Content-Type: application/json"]
    headers += [b"Content-Length: " + value.encode() for value in lengths]
    if draw(st.booleans()):
        headers.append(draw(st.sampled_from([b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked",
                                             b"X-Absurd: " + b"x" * 10_000, b"no colon at all", b": empty name",
                                             b"Accept: text/html", b"\xff\xfe: \x00\x01", b"Cookie: " + b"=" * 3000])))
    data = request(target, payload, method=method, headers=b"\r\n".join(headers))
    if draw(st.booleans()):  # the request as far as it came
        data = data[:draw(st.integers(min_value=0, max_value=len(data)))]
    return data


@cases(1200)
@given(hostile_requests())
@example(request(b"/api/orders/", b'{"lines":[{"product_id":1e999,"quantity":1}]}'))
@example(request(b"/api/orders/", b"[" * 10_000))
def test_hostile_requests_never_raise_and_get_an_allowed_decision(data):
    everything(data)


@cases(300)
@given(ids=st.lists(st.integers(min_value=1, max_value=2**63 - 1), min_size=1, max_size=20, unique=True),
       target=st.sampled_from([b"/api/orders/", b"/api/orders/?x=1", b"http://h/api/orders/", b"//api//orders/",
                               b"/api/%6Frders/"]))
def test_an_order_is_read_exactly_and_passes_only_when_all_its_products_are_known_sold_out(ids, target):
    data = request(target, order(*ids))
    assert product_ids(data) == tuple(ids)
    assert to_refuse_while_full(data, known_sold_out=lambda named: set(named) <= set(ids)) is False
    assert to_refuse_while_full(data, known_sold_out=lambda named: set(named) <= set(ids[1:])) is True


# --- examples: what is an order --------------------------------------------------------------
@pytest.mark.parametrize(("line", "expected"), [
    (b"POST /api/orders/ HTTP/1.1", True),
    (b"POST /checkout/ HTTP/1.1", True),
    (b"POST /api/orders/?x=1 HTTP/1.1", True),
    (b"POST /api/orders/#top HTTP/1.1", True),
    (b"POST http://host/api/orders/ HTTP/1.1", True),
    (b"POST https://host:8443/checkout/?a=b HTTP/1.1", True),
    (b"POST //api//orders/ HTTP/1.1", True),
    (b"POST /api/%6Frders/ HTTP/1.1", True),
    (b"POST /api%2Forders/ HTTP/1.1", True),
    (b"POST /api/x/../orders/ HTTP/1.1", True),
    (b"POST /api/./orders/. HTTP/1.1", True),
    (b"POST /%2e%2e/api/orders/ HTTP/1.1", True),
    (b"post /api/orders/ HTTP/1.1", False),  # methods are case-sensitive: gunicorn answers it 400
    (b"GET /api/orders/ HTTP/1.1", False),
    (b"HEAD /checkout/ HTTP/1.1", False),
    (b"POST /api/orders/1/pay/ HTTP/1.1", False),
    (b"POST /api/orders HTTP/1.1", False),
    (b"POST /API/ORDERS/ HTTP/1.1", False),
    (b"POST /checkout/code/ HTTP/1.1", False),
    (b"POST /api/%256Frders/ HTTP/1.1", False),  # decoded once, as the app does: "/api/%6Frders/"
    (b"POST api/orders/ HTTP/1.1", False),  # neither a path nor an absolute URI
    (b"POST /api/orders/ HTTP/1.1 extra", False),
    (b"POST /api/orders/", False),  # the line has not all come
])
def test_what_is_an_order(line, expected):
    assert is_order(line + b"\r\n") is expected


def test_the_rule_takes_paths_as_the_app_sees_them():
    assert is_order_request("POST", "/api/orders/") and is_order_request("POST", "/checkout/")
    assert is_order_request("POST", "//api//orders/")
    assert not is_order_request("GET", "/api/orders/") and not is_order_request("POST", "/api/products/")
    assert target_path(b"/api/%6Frders/?x=%2F") == "/api/orders/"


def test_the_order_paths_are_the_apps_order_views():
    assert {reverse("api_orders"), reverse("checkout")} == order_requests.ORDER_PATHS
    assert resolve(order_requests.API_ORDERS).func.__name__ == api.orders.__name__
    assert resolve(order_requests.CHECKOUT).func.__name__ == views.checkout.__name__
    assert order_requests.MAX_ID == validation.MAX_ID


def _app_path(target: bytes) -> str | None:
    """The path the app routes for a request target: gunicorn's reading, then Django's resolver."""
    text = target.decode("ascii")
    if not (text.startswith("/") or "://" in text):
        return None  # gunicorn answers 400
    try:
        return unquote_to_wsgi_str(split_request_uri(text).path or "/")
    except ValueError:
        return None


order_view_names = {"api_orders", "checkout"}
pieces = st.sampled_from(["/", "//", "api", "orders", "checkout", "%6F", "%2F", "%2e", ".", "..", "?x=1", "#f",
                          "http://h", "%", "o", "rders", "code", "1", "pay"])


@cases(600)
@given(st.lists(pieces, max_size=8).map(lambda parts: "".join(parts).encode()))
@example(b"/api/orders/?x=1")
@example(b"http://h/api/orders/")
@example(b"/api/%6Frders/")
@example(b"/api%2Forders/")
def test_whatever_the_app_routes_to_an_order_view_the_worker_calls_an_order(target):
    """The worker's rule is never narrower than the app's routes: no spelling of an order reaches
    the app's order views without the triage seeing it (it may be wider: "//api//orders/")."""
    path = _app_path(target)
    if path is None:
        return
    try:
        routed = resolve(path).url_name in order_view_names
    except Resolver404:
        routed = False
    if routed:
        assert is_order(b"POST " + target + b" HTTP/1.1\r\n"), (target, path)


@pytest.mark.parametrize(("headers", "payload", "expected"), [
    (b"Content-Length: 4", b"abcd", b"abcd"),
    (b"Content-Length: 2", b"abcd", b"ab"),  # the rest is the next request's
    (b"content-length:   4  ", b"abcd", b"abcd"),
    (b"Content-Length: 5", b"abcd", None),  # not all come (or a lie)
    (b"Content-Length: 4\r\nContent-Length: 4", b"abcd", None),
    (b"Content-Length: 4\r\nTransfer-Encoding: chunked", b"abcd", None),
    (b"Transfer-Encoding: chunked", b"4\r\nabcd\r\n0\r\n\r\n", None),
    (b"Content-Length: -4", b"abcd", None),
    (b"Content-Length: 1e3", b"abcd", None),
    (b"Content-Length: " + b"9" * 5000, b"abcd", None),
    (b"Content-Length: 8193", b"a" * 8193, None),  # over BODY_MAX: not read
    (b"Host: x", b"abcd", b""),
])
def test_a_body_is_read_by_one_plain_content_length_within_the_cap(headers, payload, expected):
    assert body(request(b"/api/orders/", payload, headers=headers)) == expected


def test_json_hooks_refuse_what_is_no_product_id():
    for number in ("1e999", "NaN", "Infinity", "-Infinity", "2.0", str(10**400)):
        assert order_requests.order_json(('{"a":' + number + "}").encode()) is None, number
    assert order_requests.order_json(b'{"a":' + b"9" * 19 + b"}") == {"a": int("9" * 19)}
    assert len(order_requests.order_json(order(*range(1, 21)))["lines"]) == 20


# --- the line's ticket and arrival stamp, read in the main loop (issue 36) ------------------------
class _Log:
    """The worker's log: the main loop's guards log an exception instead of raising; none may."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def exception(self, message: str, *args) -> None:
        self.failures.append(message)


def _line_worker(drop: int) -> SimpleNamespace:
    from shop.line import Front

    front = Front(product_id=7, drop=drop, serving=1_000, let_through=3, in_turn=1, waiting=40, first_waiting=1_500,
                  last=9_000, cut=None, rate=4.0, window=2, default_rate=10.0, retry_max=5)
    return SimpleNamespace(_fronts={7: front}, _fronts_at=time.monotonic(), _known_sold_out=never_sold_out,
                           _clock_offset=1_795_000_000.0 - time.monotonic(), _lined=frozenset({7}),
                           _session_cookie=b"sessionid", log=_Log())


AUTH = b"Bearer shp_test"  # the token the API gave the tickets below with (tickets.bound)


def _ticket_text(score: int, drop: int = 1_795_000_000) -> str:
    from shop.line import tickets
    from shop.line.tickets import PLACE, Ticket

    return tickets.bound(Ticket(product_id=7, drop=drop, kind=PLACE, score=score).text(user_id=42), credential=AUTH)


def _not_yet(worker, data: bytes) -> bytes | None:
    """The main loop's "not your turn yet" to these bytes."""
    return ShopWorker._not_yet(worker, ShopWorker._ticket(worker, data))


line_headers = st.one_of(
    st.builds(lambda s: b"Line-Ticket: " + _ticket_text(s).encode(), st.integers(min_value=0, max_value=10**19)),
    st.builds(lambda s, cut: b"Line-Ticket: " + _ticket_text(s).encode()[:cut],
              st.integers(min_value=1001, max_value=9000), st.integers(min_value=0, max_value=90)),
    st.builds(lambda b: b"Line-Ticket: " + b, st.binary(max_size=150)),
    st.builds(lambda b: b"Line-Arrival: " + b, st.binary(max_size=60)),
    st.builds(lambda b: b"Cookie: sessionid=" + b + b"; line_arrival=" + b, st.binary(max_size=60)),
    st.builds(lambda b: b"Authorization: " + b, st.binary(max_size=60)),
    st.just(b"Authorization: " + AUTH),
    st.sampled_from([b"Line-Ticket:", b"line-ticket: 7.1795000000.p.5000.42.", b"Cookie: ;;==;",
                     b"Line-Arrival: 1795000000000.AAAAAAAAAAAAAAAAAAAAAAAA"]))


@cases(800)
@given(headers=st.lists(line_headers, max_size=4), payload=order_bodies() | st.just(order(7)),
       target=st.sampled_from([b"/api/orders/", b"/checkout/", b"/api/orders/?x", b"/api/products/"]),
       cut=st.none() | st.integers(min_value=0, max_value=400))
def test_the_main_loops_ticket_and_arrival_checks_never_raise(headers, payload, target, cut):
    """A Line-Ticket, Line-Arrival or cookie of any shape: the worker answers 202 only to a valid
    waiting ticket of an order that names its product, adds a stamp only to busy orders, sends to
    the line's door only an order of the lined product, and never raises (nor needs its last
    guard)."""
    worker = _line_worker(1_795_000_000)
    data = request(target, payload, headers=b"\r\n".join([b"Host: h", b"Content-Type: application/json",
                                                          b"Content-Length: " + str(len(payload)).encode(), *headers]))
    if cut is not None:
        data = data[:cut]
    answer = _not_yet(worker, data)
    stamp = ShopWorker._arrival_headers(worker, data)
    door = ShopWorker._at_door(worker, data)  # the line's door takes an order of the lined product only
    assert worker.log.failures == []
    assert door is None or (door.startswith(b"7 ") and set(product_ids(data) or ()) == {7})
    assert answer is None or (answer.startswith(b"HTTP/1.1 202 Accepted\r\n") and 7 in (product_ids(data) or ()))
    assert stamp == b"" or (is_order(data) and stamp.startswith(b"Line-Arrival: "))
    everything(data)


def test_only_a_valid_waiting_ticket_for_an_ordered_product_gets_the_workers_202():
    worker = _line_worker(1_795_000_000)

    def asked(ticket: str, *ids: int, auth: bytes = AUTH) -> bytes | None:
        return _not_yet(worker, request(b"/api/orders/", order(*ids), headers=(
            b"Host: h\r\nAuthorization: " + auth + b"\r\nLine-Ticket: " + ticket.encode()
            + b"\r\nContent-Length: " + str(len(order(*ids))).encode())))

    waiting = _ticket_text(5_000)
    answer = asked(waiting, 7)
    assert answer is not None
    body = json.loads(answer.partition(b"\r\n\r\n")[2])["line"]
    assert body["ticket"] == waiting and body["state"] == "waiting" and body["now_serving"] == 3
    assert 1 <= body["retry_after"] <= 5 and body["ahead"] >= 1 and body["place"] > 3
    assert asked(_ticket_text(900), 7) is None  # its turn has come: the app decides
    assert asked(waiting, 8) is None  # an order of another product
    assert asked(waiting[:-1] + ("A" if waiting[-1] != "A" else "B"), 7) is None  # forged: the app refuses it
    assert asked(waiting, 7, auth=b"Bearer shp_another") is None  # replayed by another token: the app refuses it
    assert asked(waiting.rsplit(".", 1)[0], 7) is None  # not bound to a token: the app decides
    assert asked(_ticket_text(5_000, drop=1_795_000_060), 7) is None  # another drop
    worker._fronts_at -= 10
    assert asked(waiting, 7) is None  # fronts not read for a while: nothing is answered from them
