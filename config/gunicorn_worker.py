"""The shop's gunicorn worker: gthread, with the one queue it owns bounded by time and by length,
and no thread for a client that is slow to send its request.

gthread accepts every connection and hands it to a thread pool whose queue has no bound: past
capacity, requests wait there (and in the kernel's backlog behind it) far longer than their
buyers do, and the server works off requests whose buyers have left, and does not recover when
the load falls again (docs/benchmarks.md, "A crowd bigger than the server"). It also gives a
connection its thread before the request has come, and the thread then reads without a timeout:
as many clients as threads that send half a request hold every thread for as long as they like.
This worker keeps gthread's threads and accepts as eagerly, and:

- reads each request in the main loop first, without a thread and without ever waiting for I/O:
  what a connection sends goes into a buffer of its own until the head and a body up to its
  Content-Length (at most SHOP["BODY_BUFFER"] bytes) have come. Only then does it get a thread,
  whose gunicorn parser reads those bytes first (`Unreader.unread`). A request must be whole
  within SHOP["HEAD_TIMEOUT"] of its connection (or, kept alive, of its first byte), or the
  connection is closed (408 if it sent part of one); a head longer than SHOP["HEAD_MAX"] is
  answered 431. Once the worker holds half its worker_connections, one client address may have
  SHOP["HEAD_SLOTS_PER_CLIENT"] connections still sending: one more closes its oldest (sending
  for SLOT_GRACE s or more, nothing of it waiting unread). At worker_connections the oldest idle
  connection is closed, so a new one is accepted (one whose request waits unread is kept: the
  worker is behind, not the client). A body larger than BODY_BUFFER, or chunked, goes on once its head
  has come: the thread reads it, and the app's limits apply;
- answers what it cannot serve in time at once, 503 `busy` with Retry-After, without the app:
  in the main loop, once the request is whole, when more requests already wait for a thread
  than SHOP["QUEUE_MAX"] (default: the number of threads), or when this process's lines are
  full (as many buyers wait as it admits: shop/edge/admission.py) and the request is an order,
  unless it orders only products known to be sold out (those go on: the app answers "sold out"
  at once); in the thread that picks a request up, when it waited longer than the queue allows:
  CoDel's rule (Facebook's "controlled delay"): SHOP["QUEUE_INTERVAL"] (100 ms) while the queue
  drains now and then (a burst), SHOP["QUEUE_TARGET"] (20 ms) once it has not been empty for a
  whole interval (a standing queue: more arrives than the threads serve); or when the lines
  filled since it was queued;
- closes a connection without waiting for its client in the main loop (gthread lingers there,
  blocking, until the client closes too: up to 2 s per client that never does).

Every other request is stamped with the time it became whole and was queued
(`environ["shop.arrived"]`, time.monotonic() of this process): its deadline counts from there
(shop/edge/deadlines.py), so a client slow to send costs its own deadline nothing. A thread of the
worker reads the index of sold-out products four times a second and adds the overload counts to
Redis once a second (shop/edge/overload.py: the lock dashboard's panel). With TLS in gunicorn itself
(certfile), HTTP/2 or the PROXY protocol the main loop does not read requests: they go to a
thread as in gthread.

What is an order, and which products it names, is shop/edge/order_requests.py's rule, the app's too:
it reads at most READ_MAX (16 KiB) of a request, never raises, and what it cannot read of an
order is refused while the lines are full; should it raise all the same, the request goes on to
the app (logged), never ends the worker. The worker's answers carry the security headers
Django's middleware gives the site's (read from the settings when the app loads) and a
Content-Security-Policy of their own.

    gunicorn config.wsgi -c config/gunicorn.conf.py        (worker_class = "config.gunicorn_worker.ShopWorker")
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import heapq
import html
import itertools
import json
import logging
import math
import os
import queue
import re
import selectors
import socket
import struct
import threading
import time
from functools import partial

from gunicorn import http, util
from gunicorn.workers.gthread import TConn, ThreadWorker

from shop.edge import order_requests

_gunicorn_http_date = util.http_date
_date_now: tuple[int, str] = (0, "")


def http_date(timestamp: float | None = None) -> str:
    """gunicorn's Date header, formatted once a second instead of per response (email.utils'
    formatdate was ~4% of a request's CPU at the floor: `loadtest --compare-http`). The same text:
    the header has whole seconds. Installed over gunicorn.util.http_date with the worker."""
    global _date_now
    if timestamp is not None:
        return _gunicorn_http_date(timestamp)
    now = int(time.time())
    known = _date_now
    if known[0] != now:
        known = _date_now = (now, _gunicorn_http_date(now))
    return known[1]


RETRY_AFTER = 1  # seconds: a thread frees within milliseconds; a second spreads the retries
RECV_SIZE = 65536  # bytes the main loop takes from a connection at a time
# A connection closed after its answer waits this long for its client to close too (gthread's
# close_graceful), reading at most LINGER_BYTES of what it still sends.
LINGER, LINGER_BYTES = 2.0, 65536
# A client over its HEAD_SLOTS_PER_CLIENT loses its oldest unfinished connection only once that
# one has been sending this long: a burst of new connections (a NAT, a load generator, a client
# starved of CPU between connect and send) whose requests are on their way is not cut off.
SLOT_GRACE = 1.0
# To make room, the oldest this many unfinished connections are looked at for one that is stalled.
ROOM_SCAN = 8
# The line's door takes at most this many orders' places at once (one read of their tokens).
DOOR_BATCH = 256
DOOR_KEPT_MAX = 100_000  # answers the door keeps for retries (by token), at most
# A buyer the door told to come back in N seconds (202 "in line", 503 "in the checkout") who asks
# again sooner, on any connection with the same token (a script's parallel, fast retries), is
# held, not answered: its request waits without a thread until the time it was told (at most
# HOLD_MAX s), then goes on as any other and gets the line's answer of that moment. A product
# that sells out meanwhile frees its held requests within HOLD_CHECK s of the worker knowing it.
# Retrying sooner than told then buys nothing and costs the server nothing (docs/design.md).
HOLD_MAX = 5.0
HOLD_CHECK = 0.1
# An order whose turn waits only for a lagging door's watermark (its place is near the front, but
# an earlier arrival may still be at a door behind its backlog: shop/line/line.lua `advance`) is
# held without a thread and brought to the door again every SOON_AGAIN s, for at most SOON_MAX s
# from its first time there, instead of being told to come back in a second: a drop's first buyers
# then buy in one request as soon as the doors catch up.
SOON_AGAIN = 0.15
SOON_MAX = 2.0
# gthread tells the arbiter it is alive (a utime of a file) and asks whether its parent is (a
# getppid) on every turn of its main loop, about twice a request under a crowd: here at most this
# often (the arbiter's timeout is seconds).
HEARTBEAT = 0.1
# The kernel hands a TCP connection to accept() only once its first bytes have come (Linux's
# TCP_DEFER_ACCEPT, nginx's `deferred`), or after about this many seconds: a request is read at
# accept, in one turn of the main loop, and a client that connects and sends nothing (a slow
# client, a load generator short of CPU) costs the worker nothing meanwhile.
DEFER_ACCEPT = 1
# A line's place is dated when the request's last bytes reached this machine's kernel (the
# receive timestamp Linux keeps with the data, SO_TIMESTAMPNS on the listeners, read with the
# request), not when this worker got to read it: a worker that was behind (short of CPU, its
# backlog long) cannot put a buyer behind one who sent later to a quicker worker. Here at most
# this many seconds before the read (a stamp older than a request can wait is not one to trust).
STAMP_MAX_AGE = 30.0
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value where Python does not name it
_STAMP_SPACE = socket.CMSG_SPACE(16)
# The lines' fronts older than this (the chores thread could not read them) answer no ticket.
FRONTS_STALE = 2.0

def _busy_json(reason: str) -> bytes:
    return (b'{"error":{"code":"busy","message":"The shop is very busy right now; nothing was done. '
            b'Please retry in a moment.","details":{"retry_after":1,"where":"server","reason":"'
            + reason.encode() + b'"}}}')


def _uncounted() -> None:
    """Before the app loads, nothing is counted."""


def _uncounted_as(what: str) -> None:
    """Before the app loads, nothing is counted."""


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


_BUSY_JSON = {reason: _busy_json(reason) for reason in ("queue_full", "queue_delay", "full", "door_full")}
# The pages' one style and one script are inline; the Content-Security-Policy allows exactly them
# (by hash), and nothing else: no other source, no frame, no base, forms to this site only.
_STYLE = "body{font-family:system-ui,sans-serif;max-width:32em;margin:3em auto;padding:0 1em}"
_SCRIPT = ("setTimeout(function(){document.getElementById('again').submit()},"
           f"{RETRY_AFTER * 1000}+Math.random()*{RETRY_AFTER * 500})")


def _page(body: str) -> bytes:
    return ("<!doctype html><html lang=en><meta charset=utf-8><meta name=viewport "
            "content='width=device-width,initial-scale=1'><title>Very busy</title>"
            f"<style>{_STYLE}</style><body><h1>The shop is very busy</h1>{body}</body></html>").encode()


_BUSY_HTML = _page("<p>Nothing was done with your request. Please try again in a moment: go back and "
                   "press the button again (an order is never placed twice).</p>")
_CSP_JSON = b"default-src 'none'; frame-ancestors 'none'"
_CSP_PAGE = (f"default-src 'none'; style-src {_sha256(_STYLE)}; base-uri 'none'; form-action 'none'; "
             "frame-ancestors 'none'").encode()
_CSP_CHECKOUT = (f"default-src 'none'; style-src {_sha256(_STYLE)}; script-src {_sha256(_SCRIPT)}; "
                 "base-uri 'none'; form-action 'self'; frame-ancestors 'none'").encode()
# The checkout form's fields sent again by the busy page (the same idempotency key: never two orders).
_CHECKOUT_FIELDS = ("csrfmiddlewaretoken", "idempotency_key", "coupon_code")


def site_headers() -> bytes:
    """The security headers Django's middleware gives the site's answers (SecurityMiddleware,
    XFrameOptionsMiddleware), from the settings: the worker's own answers carry them too."""
    from django.conf import settings

    headers = [b"X-Frame-Options: " + str(getattr(settings, "X_FRAME_OPTIONS", "DENY")).upper().encode()]
    if getattr(settings, "SECURE_CONTENT_TYPE_NOSNIFF", True):
        headers.append(b"X-Content-Type-Options: nosniff")
    referrer = getattr(settings, "SECURE_REFERRER_POLICY", "same-origin")
    if referrer:
        referrer = referrer if isinstance(referrer, str) else ",".join(referrer)
        headers.append(b"Referrer-Policy: " + referrer.encode())
    opener = getattr(settings, "SECURE_CROSS_ORIGIN_OPENER_POLICY", "same-origin")
    if opener:
        headers.append(b"Cross-Origin-Opener-Policy: " + opener.encode())
    return b"".join(h + b"\r\n" for h in headers)


# Django's defaults; the worker reads the site's own when it loads the app (`ShopWorker.load_wsgi`).
_SITE_HEADERS = (b"X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: same-origin\r\n"
                 b"Cross-Origin-Opener-Policy: same-origin\r\n")


_JSON, _HTML = b"application/json", b"text/html; charset=utf-8"


def _answer_parts(page: bytes, kind: bytes, csp: bytes) -> tuple[bytes, bytes]:
    """A busy answer in two, around the place of `busy_response`'s `extra` header lines."""
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + kind + b"\r\nRetry-After: "
            + str(RETRY_AFTER).encode() + b"\r\nCache-Control: no-store\r\n" + _SITE_HEADERS,
            b"Content-Security-Policy: " + csp + b"\r\nConnection: close\r\nContent-Length: "
            + str(len(page)).encode() + b"\r\n\r\n" + page)


def _canned() -> dict[str, tuple[bytes, bytes]]:
    """The busy answers that depend on no request's bytes, built once (the main loop sends them
    at the highest rate): JSON by reason, and the plain page ("page")."""
    answers = {reason: _answer_parts(page, _JSON, _CSP_JSON) for reason, page in _BUSY_JSON.items()}
    answers["page"] = _answer_parts(_BUSY_HTML, _HTML, _CSP_PAGE)
    return answers


_CANNED = _canned()


def use_site_headers() -> None:
    global _SITE_HEADERS, _CANNED
    _SITE_HEADERS = site_headers()
    _CANNED = _canned()


def _escape(text: str) -> str:
    """html.escape, which a token or key rarely needs."""
    return html.escape(text) if _TO_ESCAPE(text) else text


_TO_ESCAPE = re.compile("[&<>\"']").search


def _busy_checkout(request: bytes) -> bytes | None:
    """The checkout's busy page: it sends the same order again by itself in a moment; None
    without the order's idempotency key."""
    fields = order_requests.checkout_form(request, _CHECKOUT_FIELDS)
    if not any(k == "idempotency_key" for k, _ in fields):
        return None
    inputs = "".join(f'<input type=hidden name="{k}" value="{_escape(v)}">' for k, v in fields)  # k: ours
    return _page(
        "<p id=busy-retry>Nothing was ordered yet. Trying again in a moment with the same order "
        "(it is never placed twice).</p>"
        f"<form method=post action='/checkout/' id=again>{inputs}<button type=submit>Try now</button></form>"
        f"<script>{_SCRIPT}</script>")


def busy_response(request: bytes, reason: str, extra: bytes = b"") -> bytes:
    """The whole 503 answer to a request (its bytes as far as they came): the checkout's busy page
    (it retries by itself) for a checkout, a short page for other browser pages, JSON (the API's
    error shape) for everything else; with the site's security headers. It never raises (the
    main loop calls it): should reading the request fail all the same, the answer is JSON.
    `extra`: more header lines (an arrival stamp)."""
    try:
        head, rest = _busy_answer(request, reason)
    except Exception:
        logging.getLogger("gunicorn.error").exception("busy answer: the request could not be read")
        head, rest = _CANNED[reason]
    return head + extra + rest


def json_answer(status: bytes, data: dict, extra: bytes = b"") -> bytes:
    """A whole JSON answer from the worker, with the site's headers; `extra`: more header lines."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n" + extra
            + b"Cache-Control: no-store\r\n" + _SITE_HEADERS + b"Content-Security-Policy: " + _CSP_JSON
            + b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def line_response(details: dict) -> bytes:
    """The worker's 202 to a waiting ticket: the app's answer (shop/api/views.py `line_response`)."""
    return json_answer(b"202 Accepted", {"line": details}, b"Retry-After: " + str(details["retry_after"]).encode()
                       + b"\r\nLine-Ticket: " + details["ticket"].encode() + b"\r\n")


def _busy_answer(request: bytes, reason: str) -> tuple[bytes, bytes]:
    """The answer in two (`_answer_parts`): the checkout's page, the plain page, or JSON."""
    line = order_requests.request_line(request)
    method, path = line if line is not None and line[1] is not None else ("", "")
    api = order_requests.is_api_path(path) if path else False
    checkout = not api and order_requests.is_order_request(method, path)  # the web checkout
    page = _busy_checkout(request) if checkout else None
    if page is not None:
        return _answer_parts(page, _HTML, _CSP_CHECKOUT)
    if not api and (checkout or b"text/html" in request[:order_requests.HEAD_MAX].lower()):
        return _CANNED["page"]
    return _CANNED[reason]



_PARTIAL, _WHOLE, _TOO_LARGE = "partial", "whole", "too large"
_STAMP_HEADERS = (b"authorization", b"cookie", b"line-arrival")  # what an arrival stamp reads
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _body_length(head: bytes) -> int | None:
    """The Content-Length of a request's head (0 without one; the last one); None when the body
    is not read here: chunked, or a length gunicorn refuses anyway."""
    low = head.lower()
    first = low.find(b"\r\n")  # the header lines follow the request line
    if first < 0:
        return 0
    if b"transfer-encoding" in low and _header_values(low, b"transfer-encoding", first):
        return None
    if low.count(b"content-length") == 1 and (at := low.find(b"\r\ncontent-length:")) >= 0:
        end = low.find(b"\r\n", at + 17)  # the usual head: the one line that names a length, plainly
        lengths = [low[at + 17:end if end >= 0 else len(low)].strip()]
    else:
        lengths = _header_values(low, b"content-length", first)
    for value in lengths:
        if not value.isdigit() or len(value) > 15:
            return None
    return int(lengths[-1]) if lengths else 0


def _header_values(low: bytes, name: bytes, start: int) -> list[bytes]:
    """The values (stripped) of the lines of a lower-cased head past `start` whose name (before
    the line's first colon, stripped) is `name`: only the lines where `name` occurs are read."""
    values = []
    at = low.find(name, start)
    while at >= 0:
        end = low.find(b"\r\n", at)
        line = low[low.rfind(b"\r\n", start, at) + 2:end if end >= 0 else len(low)]
        key, _, value = line.partition(b":")
        if key.strip() == name:
            values.append(value.strip())
        at = low.find(name, end) if end >= 0 else -1
    return values


def _plain_answer(status: bytes, text: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: "
            b"nosniff\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: "
            + str(len(text)).encode() + b"\r\n\r\n" + text)


_TIMED_OUT = _plain_answer(b"408 Request Timeout", b"The request did not arrive in time.\n")
_HEAD_TOO_LARGE = _plain_answer(b"431 Request Header Fields Too Large", b"The request's head is too large.\n")


def _stalled(conn) -> bool:
    """Whether nothing a connection sent waits unread in the kernel: its client is slow (or gone),
    not the worker. One peek, only for a connection about to be closed to make room: under a
    crowd the worker may accept a new connection before it reads requests that came earlier."""
    try:
        return not conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing waiting (BlockingIOError), or the connection is gone
        return True


def _address(conn) -> str:
    """The client's address (its IP; one for every client of a UNIX socket)."""
    return conn.client[0] if isinstance(conn.client, tuple) else ""


_STAMP = struct.Struct("qq")  # struct timespec


def _product_of(door_key: bytes) -> int:
    """The product of a door key (`_at_door`: b"<product id> <authorization>")."""
    return int(door_key.split(b" ", 1)[0])


class _Conn(TConn):
    """gthread's connection, with what the main loop has read of its request so far."""

    def __init__(self, *args, linger) -> None:
        super().__init__(*args)
        self.linger = linger
        self.request = bytearray()
        self.whole_at = 0  # its length once its head has come (0: not yet)
        self.scanned = 0  # bytes already searched for the end of the head
        self.reading_since = self.read_until = self.queued_at = 0.0
        self.kernel_at = 0.0  # time.time() its last bytes reached the kernel (0: unknown)
        self.arrived_at = 0.0  # the same as a time.monotonic() (else when it was read whole)
        self.polled = False
        self.drained = 0  # bytes read while lingering after the answer
        self.held = self.follower = False  # held once until its token's told time; came behind one at the door
        self.door_first = 0.0  # when it first reached the door (monotonic; 0: never)
        self.door_key = b""

    def close(self, graceful: bool = False) -> None:
        """gthread closes gracefully in its main loop, blocking until the client closes too (up to
        2 s each: a few clients that never close would stall the worker): the worker lingers
        without blocking instead."""
        if graceful:
            self.linger(self)
        else:
            super().close()


class ShopWorker(ThreadWorker):
    """gthread, with requests read before they get a thread and its pool's queue bounded (see the
    module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._arrival = threading.local()
        self._queue_empty_at = time.monotonic()
        self.queue_max = self.queue_target = self.queue_interval = 0.0
        # More queued requests allowed for buyers whose turn the line gave, and for orders at the
        # line's door (a Redis call each, no request through Django).
        self.turn_room = self.door_room = 0
        self.door_open = False
        self.door_budget = 4.0
        self._door_inbox: queue.SimpleQueue = queue.SimpleQueue()
        # The door's answers by token and product, and until when they may be given again; until
        # when each was told to come back; the requests of each at the door now, and those that
        # came behind it (answered with it); requests held until their token's told time (a heap).
        self._door_kept: dict[bytes, tuple[float, bytes]] = {}
        self._door_told: dict[bytes, float] = {}
        self._door_pending: dict[bytes, tuple[float, list]] = {}
        self._held: list[tuple[float, int, _Conn]] = []
        self._held_seq = itertools.count()
        self._held_checked_at = -math.inf
        self.hold_room = 0
        self._count = self._observe = None
        # Connections whose request is still coming, oldest first (dicts: ordered sets), and the
        # same per client address; connections closed after their answer, with their end.
        self._reading: dict[_Conn, None] = {}
        self._slots: dict[str, dict[_Conn, None]] = {}
        self._lingering: dict[_Conn, float] = {}
        # TLS in gunicorn itself, HTTP/2 and the PROXY protocol put other bytes first: their
        # requests go to a thread unread, as in gthread.
        self._reads_requests = (not self.cfg.is_ssl and "h2" not in self.cfg.http_protocols
                                and self.cfg.proxy_protocol in ("off", False, None))
        self.head_timeout, self.head_slots, self.head_max, self.body_buffer = 5.0, 16, 32768, 65536
        # The drops' lines, as the chores thread last read them (whole dicts, swapped), and the
        # shop's clock (shop/plumbing/clock.py) as an offset to time.monotonic(): the main loop reads both.
        self._lined: frozenset[int] = frozenset()
        self._fronts: dict = {}
        self._fronts_at = self._lines_failed_at = -math.inf
        self._clock_offset: float | None = None
        self._session_cookie = b"sessionid"
        self._not_yet_counted = _uncounted
        self._door_counted = _uncounted_as
        self._notify_at = self._parent_checked_at = -math.inf
        self._listener_names: dict = {}
        self._deferred = False  # the listeners hand over connections with their first bytes
        self._stamped = False  # the kernel stamps the data it receives (SO_TIMESTAMPNS)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        from django.conf import settings

        from shop.conf import shop_settings
        from shop.edge import admission, deadlines, overload
        from shop.ops import metrics
        from shop.plumbing import soldout

        self.queue_max = int(shop_settings.QUEUE_MAX or self.cfg.threads)
        self.door_open, self.door_room = bool(shop_settings.LINE_DOOR), 32 * int(self.cfg.threads)
        self.turn_room = min(int(shop_settings.LINE_WINDOW), 4 * int(self.cfg.threads))
        self.door_budget = deadlines.budget()
        self.hold_room = self.worker_connections // 2
        if self.door_open:
            threading.Thread(target=self._door_loop, name="shop-line-door", daemon=True).start()
        self.queue_target = float(shop_settings.QUEUE_TARGET)
        self.queue_interval = float(shop_settings.QUEUE_INTERVAL)
        self.head_timeout = float(shop_settings.HEAD_TIMEOUT)
        self.head_slots = int(shop_settings.HEAD_SLOTS_PER_CLIENT or 0)
        self.head_max, self.body_buffer = int(shop_settings.HEAD_MAX), int(shop_settings.BODY_BUFFER)
        self._count, self._observe = metrics.shed, metrics.queue_waited
        admission.serve_with_threads(int(self.cfg.threads))
        use_site_headers()
        self._lines_full, self._known_sold_out = admission.full, soldout.known_sold_out
        self._product_crowded = admission.crowded
        self._session_cookie = settings.SESSION_COOKIE_NAME.encode()
        self._not_yet_counted = metrics.line_answered_at_worker
        self._door_counted = overload.count
        threading.Thread(target=self._keep_known_sold_out, args=(soldout,), name="shop-worker-chores",
                         daemon=True).start()
        app, arrival = self.wsgi, self._arrival

        def stamped(environ, start_response):
            environ["shop.arrived"] = getattr(arrival, "at", None) or time.monotonic()
            environ["shop.received"] = getattr(arrival, "received", None) or environ["shop.arrived"]
            return app(environ, start_response)

        self.wsgi = stamped

    def _keep_known_sold_out(self, soldout) -> None:
        """Which products are sold out and the fronts of the drops' lines, read every quarter of a
        second, and the overload counts flushed every second (never in the main loop)."""
        from shop.edge import overload

        flushed = time.monotonic()
        while self.alive:
            soldout.refresh_known()
            self._read_lines()
            if time.monotonic() - flushed >= 1.0:
                overload.flush()
                flushed = time.monotonic()
            time.sleep(soldout.KNOWN_REFRESH)

    def _read_lines(self) -> None:
        """The drops' lines and their fronts (one pipelined read of Redis), and the shop's clock."""
        from django.db import close_old_connections

        from shop import line
        from shop.conf import shop_settings
        from shop.plumbing import clock

        try:
            self._clock_offset = clock.now().timestamp() - time.monotonic()
            configs = line.every_line() if shop_settings.LINES else {}
            self._lined = frozenset(configs)
            self._fronts = line.fronts(configs.values())
            self._fronts_at = time.monotonic()
        except Exception:
            if time.monotonic() - self._lines_failed_at >= 60:  # once a minute, not 4x a second
                self._lines_failed_at = time.monotonic()
                self.log.warning("the lines' fronts could not be read", exc_info=True)
            close_old_connections()

    def init_process(self) -> None:
        if self._reads_requests and DEFER_ACCEPT and hasattr(socket, "TCP_DEFER_ACCEPT"):
            tcp = [s for s in self.sockets if s.FAMILY in (socket.AF_INET, socket.AF_INET6)]
            with contextlib.suppress(OSError):
                for listener in tcp:
                    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
                self._deferred = len(tcp) == len(self.sockets)
        if self._reads_requests:
            with contextlib.suppress(OSError):  # accepted sockets inherit it
                for listener in self.sockets:
                    listener.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._stamped = True
        util.http_date = http_date
        super().init_process()

    # --- the main loop: reading requests ---------------------------------------------------
    def notify(self) -> None:
        if (now := time.monotonic()) - self._notify_at >= HEARTBEAT:
            self._notify_at = now
            super().notify()

    def is_parent_alive(self) -> bool:
        if (now := time.monotonic()) - self._parent_checked_at < HEARTBEAT:
            return True
        self._parent_checked_at = now
        return super().is_parent_alive()

    def accept(self, listener) -> None:
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self._make_room()
        if (name := self._listener_names.get(listener)) is None:  # a syscall a connection in gthread
            name = self._listener_names[listener] = listener.getsockname()
        self.enqueue_req(_Conn(self.cfg, sock, client, name, linger=self._linger))

    def _make_room(self) -> None:
        """At worker_connections gthread stops accepting. Before that, the oldest connection that
        only waits is closed (one lingering after its answer, one still sending its request, one
        kept alive), so slow or idle clients never lock a new one out. Those being served or
        queued for a thread cannot fill it: the queue is bounded. A connection whose request waits
        unread is not slow, the worker is (short of CPU): it is kept, and if no other can go, the
        worker stops accepting until it has room, as gthread does (the kernel's backlog holds the
        rest)."""
        while self.nr_conns + len(self._lingering) >= self.worker_connections:
            if self._lingering:
                self._end_linger(next(iter(self._lingering)))
            elif (stalled := next((c for c in itertools.islice(self._reading, ROOM_SCAN) if _stalled(c)), None)):
                self._stop_reading(stalled, close=True)
            elif self.keepalived_conns:
                conn = self.keepalived_conns.popleft()
                with contextlib.suppress(OSError, KeyError, ValueError):
                    self.poller.unregister(conn.sock)
                self._close(conn)
            else:
                return

    def enqueue_req(self, conn) -> None:
        """A connection is to send a request (new, kept alive, or with the next one read already):
        read it here first; it gets a thread once it is whole (`_triage`)."""
        if not self._reads_requests:
            conn.queued_at = time.monotonic()
            super().enqueue_req(conn)
            return
        if conn.sock.getblocking():  # a thread left it blocking (a new one is not: TConn); no syscall to ask
            conn.sock.setblocking(False)
        conn.request = bytearray(conn.parser.unreader.take_buffered() if conn.parser else b"")
        conn.whole_at = conn.scanned = 0
        conn.kernel_at = 0.0
        conn.reading_since = time.monotonic()
        conn.read_until = conn.reading_since + self.head_timeout
        if conn.parser is None and not self._deferred:  # a new one: its request races accept
            self._wait_for_more(conn)
        else:
            self._receive(conn)  # with its first bytes (DEFER_ACCEPT), or kept alive: readable or read already

    def _receive(self, conn, _sock=None) -> None:
        """Take what the client sent, without waiting; once the request is whole, triage it."""
        try:
            if self._stamped:
                chunk, stamp, _, _ = conn.sock.recvmsg(RECV_SIZE, _STAMP_SPACE)
                if stamp and len(stamp[0][2]) >= _STAMP.size:  # when these bytes came (time.time())
                    seconds, nanoseconds = _STAMP.unpack_from(stamp[0][2])
                    conn.kernel_at = seconds + nanoseconds * 1e-9
            else:
                chunk = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            chunk = None
        except OSError:
            self._stop_reading(conn, close=True)
            return
        if chunk == b"":  # the client closed before its request was whole
            self._stop_reading(conn, close=True)
            return
        if chunk:
            conn.request += chunk.lstrip(b"\r\n") if not conn.request else chunk  # RFC 9112 2.2
        state = self._progress(conn)
        if state is _PARTIAL:
            if not conn.polled:
                self._wait_for_more(conn)
            return
        self._stop_reading(conn)
        if state is _TOO_LARGE:
            self._answer_and_close(conn, _HEAD_TOO_LARGE)
        else:
            self._triage(conn)

    def _wait_for_more(self, conn) -> None:
        """Poll a connection whose request is not whole yet. While the worker holds half its
        worker_connections or more, a client with too many unfinished connections loses its
        oldest (sending for SLOT_GRACE s, and nothing of it waiting unread: `_stalled`): one address
        cannot take the room of the others.
        Below that an unfinished connection costs no thread and little memory: it may wait."""
        self._reading[conn] = None
        slots = self._slots.setdefault(_address(conn), {})
        slots[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._receive, conn))
        conn.polled = True
        if 0 < self.head_slots < len(slots) and self._crowded():
            oldest = next(iter(slots))
            if oldest.reading_since <= time.monotonic() - SLOT_GRACE and _stalled(oldest):
                self._stop_reading(oldest, close=True)

    def _crowded(self) -> bool:
        return 2 * (self.nr_conns + len(self._lingering)) >= self.worker_connections

    def _progress(self, conn) -> str:
        """Whether the request has come whole: its head, and a body up to BODY_BUFFER bytes (a
        larger or chunked body: its head); too large: a head over HEAD_MAX."""
        data = conn.request
        if not conn.whole_at:
            end = data.find(b"\r\n\r\n", max(0, conn.scanned - 3))
            conn.scanned = len(data)
            if end < 0 or end > self.head_max:
                return _TOO_LARGE if len(data) > self.head_max + 3 else _PARTIAL
            head = bytes(data[:end])
            length = _body_length(head)
            if length is None or length > self.body_buffer:
                return _WHOLE
            conn.whole_at = end + 4 + length
            if len(data) < conn.whole_at and b"100-continue" in head.lower():
                with contextlib.suppress(OSError):  # the client waits for it before its body
                    conn.sock.send(_CONTINUE)
        return _WHOLE if len(data) >= conn.whole_at else _PARTIAL

    def _stop_reading(self, conn, *, close: bool = False) -> None:
        if conn.polled:
            del self._reading[conn]
            address = _address(conn)
            slots = self._slots[address]
            del slots[conn]
            if not slots:
                del self._slots[address]
            try:  # noqa: SIM105 (contextlib.suppress costs 0.35 us more, here for most requests)
                self.poller.unregister(conn.sock)
            except (OSError, KeyError, ValueError):
                pass
            conn.polled = False
        if close:
            self._close(conn)

    # --- the main loop: the queue for a thread ------------------------------------------------
    def _waiting(self) -> int:
        return self.tpool._work_queue.qsize()

    def _triage(self, conn) -> None:
        """A whole request: answered 503 `busy` here when the threads are full, or when the lines
        are full and it is an order, unless it orders only products known to be sold out (the app
        answers those at once); otherwise queued for a thread, whose parser gets its bytes back
        (gunicorn's Unreader reads what was unread first, then the socket)."""
        now = time.monotonic()
        conn.queued_at = conn.door_first or now  # held before its turn (`_hold_for_turn`): its first deadline
        conn.arrived_at = now
        if conn.kernel_at:
            conn.arrived_at -= min(max(time.time() - conn.kernel_at, 0.0), STAMP_MAX_AGE)
        waiting = self._waiting()
        if waiting == 0:
            self._queue_empty_at = now
        conn.request = request = bytes(conn.request)
        ticketed = self._ticket(request) if b"icket" in request or b"ICKET" in request else None
        conn.turn = False
        if (waiting_in_line := self._not_yet(ticketed)) is not None:
            self._answer_and_close(conn, waiting_in_line)
            self._not_yet_counted()
        elif waiting < self.queue_max + self.turn_room and self._turn_came(ticketed):
            conn.turn = True
            self._give_thread(conn)
        elif self.door_open and (at_door := self._at_door(request)) is not None:
            self._to_door(conn, at_door, now)
        elif waiting >= self.queue_max:
            self._answer_busy(conn, "queue_full")
        elif self._lines_full() and self._order_to_refuse(request):
            self._answer_busy(conn, "full")
        else:
            self._give_thread(conn)

    def _to_door(self, conn, key: bytes, now: float) -> None:
        """An API order of a lined product, `key` its token and product: held if its token was told
        to come back later (HOLD_MAX), the door's answer to that token a moment ago, behind another
        request of the token at the door now (answered with it), or to the door."""
        conn.door_key = key
        kept = self._door_kept.get(key)
        # Held once at most, and never one that came behind another at the door: it came before
        # that one's answer (then it gets it).
        if (not (conn.held or conn.follower) and (told := self._door_told.get(key, 0.0)) > now
                and len(self._held) < self.hold_room):
            conn.held = True
            heapq.heappush(self._held, (min(told, now + HOLD_MAX), next(self._held_seq), conn))
            self._door_counted("door:held")
        elif kept is not None and kept[0] > now:
            self._answer_and_close(conn, kept[1])  # the door's answer to this token a moment ago
            self._door_counted("door:kept")
        elif (pending := self._door_pending.get(key)) is not None and pending[0] > now:
            conn.follower = True
            pending[1].append(conn)
        elif self._door_inbox.qsize() < self.door_room:
            conn.door_first = conn.door_first or now
            self._door_pending[key] = (now + self.door_budget + 1.0, [])
            self._door_inbox.put(conn)  # the door's thread answers it, or hands it back (`_after_door`)
        else:
            self._answer_busy(conn, "door_full")

    def _door_done(self, key: bytes) -> None:
        """The door answered or handed back a request of `key`: those that came behind it go on
        (the door's kept answer, if it gave one)."""
        pending = self._door_pending.pop(key, None)
        for conn in pending[1] if pending is not None else ():
            self._triage(conn)

    def _release_held(self, now: float) -> None:
        """Held requests whose time came, all while the worker stops, and every few tenths of a
        second those of products now known sold out (or no longer lined): on as any other."""
        held = self._held
        due = []
        if not self.alive:
            due, self._held = [c for *_, c in held], []
        else:
            while held and held[0][0] <= now:
                due.append(heapq.heappop(held)[2])
            if held and now - self._held_checked_at >= HOLD_CHECK:
                self._held_checked_at = now
                gone = {pid for pid in {_product_of(c.door_key) for *_, c in held}
                        if pid not in self._lined or self._known_sold_out([pid])}
                if gone:
                    due += [c for *_, c in held if _product_of(c.door_key) in gone]
                    self._held = [entry for entry in held if _product_of(entry[2].door_key) not in gone]
                    heapq.heapify(self._held)
        for conn in due:
            # A retry of a token that has its place: dated now, so the door's lag (how late new
            # places reach the line, shop/line/door.py) counts only requests that may take one.
            conn.kernel_at = 0.0
            self._triage(conn)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """gthread's, waking in time for the first held request."""
        if self._held:
            timeout = min(timeout, max(self._held[0][0] - time.monotonic(), 0.0), HOLD_CHECK)
        super().wait_for_and_dispatch_events(timeout)

    def _give_thread(self, conn) -> None:
        conn.door_first = 0.0  # done with the door: a next request on this connection starts afresh
        if conn.parser is None:  # TConn.init() keeps a parser it finds
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(conn.request)
        conn.data_ready = True  # gthread's handle() would wait for the socket otherwise
        super().enqueue_req(conn)

    def _answer_busy(self, conn, reason: str) -> None:
        """Answer 503 (the request was read), close."""
        self._answer_and_close(conn, busy_response(conn.request, reason,
                                                   self._arrival_headers(conn.request, conn.arrived_at)))
        self._counted(reason)

    def _ticket(self, request: bytes):
        """(ticket, its text, its line's front) for an API order that brings a Line-Ticket this shop
        signed and gave to the request's credential (tickets.verify_bound), for a line whose front
        (read a few times a second) is fresh, ordering that line's product and not one known sold
        out; None for anything else. Never raises: the main loop's."""
        fronts = self._fronts
        if not fronts or time.monotonic() - self._fronts_at > FRONTS_STALE:
            return None
        try:
            from shop.line import arrivals, tickets

            text = order_requests.header(request, b"line-ticket")
            credential = arrivals.credential(authorization=order_requests.header(request, b"authorization"),
                                             session=order_requests.cookie(request, self._session_cookie))
            found = tickets.verify_bound(text.decode("latin-1"), credential=credential) if text else None
            front = fronts.get(found[0].product_id) if found else None
            if front is None:
                return None
            ids = order_requests.product_ids(request)
            if not ids or found[0].product_id not in ids or self._known_sold_out([found[0].product_id]):
                return None
            return found[0], text.decode("latin-1"), front
        except Exception:
            self.log.exception("line ticket check failed; the request goes on to the app")
            return None

    def _not_yet(self, ticketed) -> bytes | None:
        """The 202 "not your turn yet" to a ticket (`_ticket`) whose place the front has not
        reached; None otherwise (the app decides, and refuses a bad ticket). The ticket is trusted
        for this answer only, never for a turn."""
        if ticketed is None:
            return None
        try:
            details = ticketed[2].not_yet(ticketed[0], ticketed[1])
            return line_response(details) if details is not None else None
        except Exception:
            self.log.exception("line ticket check failed; the request goes on to the app")
            return None

    def _turn_came(self, ticketed) -> bool:
        """A ticket whose place the line has let through: its buyer gets a thread even while the
        queue is full (the line lets at most LINE_WINDOW buyers through at once, so this bounds
        itself), or the line's drain would depend on winning the `busy` lottery."""
        return ticketed is not None and ticketed[2].let_through_to(ticketed[0])

    def _at_door(self, request: bytes) -> bytes | None:
        """For an API order of one product with a line open (sold out or not): the key of its
        token and product (its buyer's place is taken by the line's door, shop/line/door.py, in a
        thread before the app, never as a `busy` lottery); None for anything else. Never raises:
        the main loop's."""
        lined = self._lined
        if not lined or not request.startswith(b"POST "):
            return None
        try:
            ids = order_requests.product_ids(request)
            if ids is None or len(set(ids)) != 1 or ids[0] not in lined:
                return None
            return b"%d " % ids[0] + (order_requests.header(request, b"authorization") or b"")
        except Exception:
            self.log.exception("door check failed; the request goes on as any other")
            return None

    def _door_loop(self) -> None:
        """The line's door (shop/line/door.py), one thread per process: it takes the places of the
        orders `_at_door` picked, in the order they were read, without waiting behind the app's
        requests; it answers a waiting or cut place itself and hands the rest back to the main
        loop (`method_queue`: the main loop owns the connections' bookkeeping)."""
        from django.db import close_old_connections

        from shop.line import door, redis_clock
        from shop.plumbing import clock

        marks = door.Watermarks(name=f"{socket.gethostname()}:{os.getpid()}")
        while True:  # also while the worker stops: what waits at the door is still answered
            batch = [self._door_inbox.get()]  # then what else came meanwhile: one token read for all
            while len(batch) < DOOR_BATCH and not self._door_inbox.empty():
                batch.append(self._door_inbox.get_nowait())
            try:
                # Each arrival as the shop's clock reads it, from the offset the join will use too:
                # its age in the line (now - arrival) is then this process's monotonic clock's.
                # The same on Redis's clock, where the places are dated: exact however long the
                # batch waits on its way there.
                offset = clock.now().timestamp() - time.monotonic()
                on_redis = redis_clock.offset()
                verdicts = door.doors([(bytes(c.request), int((c.arrived_at + offset) * 1000),
                                        int((c.arrived_at + on_redis) * 1_000_000)) for c in batch],
                                      until=batch[0].queued_at + self.door_budget, marks=marks)
            except Exception:
                self.log.warning("the line's door failed; the app answers", exc_info=True)
                close_old_connections()
                verdicts = [door.APP] * len(batch)
            kept, told = self._door_kept, self._door_told
            if len(kept) > DOOR_KEPT_MAX:
                self._door_kept = kept = {}  # swapped whole: the main loop reads it meanwhile
            if len(told) > DOOR_KEPT_MAX:
                self._door_told = told = {}
            for conn, verdict in zip(batch, verdicts, strict=True):
                try:
                    answer = (json_answer(verdict.status, verdict.body, verdict.headers())
                              if isinstance(verdict, door.Answer) else None)
                except Exception:
                    self.log.warning("the line's door could not write its answer; the app answers", exc_info=True)
                    answer, verdict = None, door.APP
                if answer is None:
                    self._door_counted("door:turn" if verdict == door.TURN else "door:app")
                    self.method_queue.defer(self._after_door, conn, verdict == door.TURN)
                    continue
                at = time.monotonic()
                if verdict.soon and at < conn.door_first + SOON_MAX:
                    self.method_queue.defer(self._hold_for_turn, conn, answer)
                    continue
                self._door_counted("door:answered")
                if verdict.keep > 0:
                    kept[conn.door_key] = (at + verdict.keep, answer)
                if verdict.retry_after:  # "later" (in line, in the checkout), not "no" (cut, sold out)
                    told[conn.door_key] = at + verdict.retry_after
                with contextlib.suppress(OSError):  # a few hundred bytes: the socket's buffer takes them
                    conn.sock.settimeout(0.5)
                    conn.sock.sendall(answer)
                    conn.sock.shutdown(socket.SHUT_WR)
                self.method_queue.defer(self._door_answered, conn)
            if self._door_inbox.empty():
                marks.caught_up()  # lines that its lag held back may move on

    def _hold_for_turn(self, conn, answer: bytes) -> None:
        """Its turn waits only for a lagging door: held a moment, then to the door again (its place
        stands); the door's answer now if the worker holds too many already."""
        self._door_done(conn.door_key)
        if len(self._held) < self.hold_room:
            conn.held = True
            heapq.heappush(self._held, (time.monotonic() + SOON_AGAIN, next(self._held_seq), conn))
            self._door_counted("door:soon")
        else:
            self._answer_and_close(conn, answer)
            self._door_counted("door:answered")

    def _door_answered(self, conn) -> None:
        self._close(conn)
        self._door_done(conn.door_key)

    def _after_door(self, conn, turn: bool) -> None:
        """Back from the door: its buyer's turn (a thread even while the queue is full, as a
        let-through ticket gets), or for the app as any request."""
        self._door_done(conn.door_key)
        waiting = self._waiting()
        if turn and waiting < self.queue_max + self.turn_room:
            conn.turn = True
            self._give_thread(conn)
        elif waiting >= self.queue_max:
            self._answer_busy(conn, "queue_full")
        else:
            self._give_thread(conn)

    def _arrival_headers(self, request: bytes, arrived_at: float = 0.0) -> bytes:
        """The arrival stamp for a `busy` order of a lined product (a web checkout: while any line
        is open): the one it brought if valid, else when it reached the machine (`arrived_at`, a
        time.monotonic(); 0: now); b"" for anything else. Never raises."""
        try:
            offset, lined = self._clock_offset, self._lined
            if offset is None or not lined or not order_requests.is_order(request):
                return b""  # no line, or no order (the usual busy answers): nothing more to read
            from shop.line import arrivals

            ids = order_requests.product_ids(request)
            if ids is not None and lined.isdisjoint(ids):
                return b""
            authorization, jar, brought = order_requests.headers(request, _STAMP_HEADERS)  # the head read once
            credential = arrivals.credential(authorization=authorization,
                                             session=order_requests.cookie_in(jar, self._session_cookie))
            now_ms = int(((arrived_at or time.monotonic()) + offset) * 1000)  # when it reached the machine
            brought = brought or order_requests.cookie_in(jar, b"line_arrival")
            at_ms = arrivals.read(brought, credential=credential) if brought else None
            if at_ms is None or not 0 <= now_ms - at_ms <= arrivals.MAX_AGE * 1000:
                at_ms = now_ms
            stamp = arrivals.stamp(at_ms=at_ms, credential=credential).encode()
            return (b"Line-Arrival: " + stamp + b"\r\nSet-Cookie: line_arrival=" + stamp + b"; Max-Age="
                    + str(arrivals.MAX_AGE).encode() + b"; Path=/; HttpOnly; SameSite=Lax\r\n")
        except Exception:
            self.log.exception("arrival stamp failed; busy without one")
            return b""

    def _answer_and_close(self, conn, answer: bytes) -> None:
        """Answer from the main loop and close at once: what the client sent so far has been read,
        so the close is a FIN after the answer (no lingering: a lost `busy` costs a retry)."""
        try:  # not contextlib.suppress (0.35 us more): once per busy answer
            conn.sock.send(answer)  # a few hundred bytes: the socket's buffer takes them at once
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn) -> None:
        self.nr_conns -= 1
        conn.close()

    def _linger(self, conn) -> None:
        """Close a connection after its answer as RFC 9112 9.6 asks: FIN now, and the socket once
        the client closes too, or after LINGER s (unread bytes of its request would otherwise
        become a reset that can destroy the answer). The poller waits for that, not the loop."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._drain, conn))
        except (OSError, ValueError, KeyError):
            util.close(conn.sock)
            return
        self._lingering[conn] = time.monotonic() + LINGER

    def _drain(self, conn, _sock=None) -> None:
        try:
            chunk = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        conn.drained += len(chunk)
        if not chunk or conn.drained >= LINGER_BYTES:
            self._end_linger(conn)

    def _end_linger(self, conn) -> None:
        self._lingering.pop(conn, None)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        util.close(conn.sock)

    def murder_pending(self) -> None:
        """gthread's, and: a request not whole within HEAD_TIMEOUT is answered 408 (nothing, if
        none of it came) and closed; a lingering connection is closed after LINGER s."""
        super().murder_pending()
        now = time.monotonic()
        if self._held:
            self._release_held(now)
        while self._reading:
            conn = next(iter(self._reading))  # the oldest: the first to time out
            if conn.read_until > now:
                break
            self._stop_reading(conn)
            if conn.request:
                self._answer_and_close(conn, _TIMED_OUT)
            else:
                self._close(conn)
        while self._lingering:
            conn, until = next(iter(self._lingering.items()))
            if until > now:
                break
            self._end_linger(conn)

    # --- a thread ----------------------------------------------------------------------
    def handle(self, conn):
        now = time.monotonic()
        queued_at = getattr(conn, "queued_at", now)
        waited = now - queued_at
        if self._waiting() == 0:
            self._queue_empty_at = now
        standing = now - self._queue_empty_at > self.queue_interval
        if waited > (self.queue_target if standing else self.queue_interval) and not getattr(conn, "turn", False):
            self._answer_busy_here(conn, "queue_delay")
            return False  # close
        if self._lines_full() and self._is_order_to_refuse(conn):  # they filled since it was queued
            self._answer_busy_here(conn, "full")
            return False
        if self._observe is not None:
            self._observe(waited)
        self._arrival.at = queued_at
        self._arrival.received = getattr(conn, "arrived_at", 0.0) or queued_at  # the kernel's receive time
        conn.request = b""  # its parser has them
        try:
            return super().handle(conn)
        finally:
            self._arrival.at = self._arrival.received = None

    def _is_order_to_refuse(self, conn) -> bool:
        """An order, and not only of products known sold out (its bytes, as the main loop read them)."""
        return self._order_to_refuse(bytes(getattr(conn, "request", b"")))

    def _order_to_refuse(self, request: bytes) -> bool:
        """The triage's rule (shop/edge/order_requests.py: bounded, it never raises). Should it raise
        all the same, the request goes on to the app, which answers it: an exception here would
        end the worker and every request it serves."""
        try:
            return order_requests.to_refuse_while_full(request, known_sold_out=self._known_sold_out,
                                                       crowded=self._crowded_here)
        except Exception:
            self.log.exception("triage failed; the request goes on to the app")
            return False

    def _crowded_here(self, product_ids: tuple[int, ...]) -> bool:
        """An order of products whose buyers fill this process (shop/edge/admission.py), and not only
        of products with a line (their waiting costs no thread: the line answers it)."""
        return not self._lined.issuperset(product_ids) and self._product_crowded(product_ids)

    def _answer_busy_here(self, conn, reason: str) -> None:
        """In a thread: answer 503 to the request the main loop read; the main loop closes it."""
        head = bytes(getattr(conn, "request", b""))
        if head:
            self._send_here(conn, busy_response(head, reason, self._arrival_headers(head, conn.arrived_at)))
            self._counted(reason)

    def _send_here(self, conn, answer: bytes) -> None:
        """In a thread: send a whole answer; the main loop closes the connection after."""
        try:
            conn.sock.settimeout(0.5)
            conn.sock.sendall(answer)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.debug("answer not sent: %s", exc)

    def _counted(self, reason: str) -> None:
        if self._count is not None:
            self._count(reason)
