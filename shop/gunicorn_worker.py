"""The shop's gunicorn worker: gthread, with the one queue it owns bounded by time and by length.

gthread accepts every connection and hands it to a thread pool whose queue has no bound: past
capacity, requests wait there (and in the kernel's backlog behind it) far longer than their
buyers do, and the server works off requests whose buyers have left, and does not recover when
the load falls again (docs/benchmarks.md, "A crowd bigger than the server"). This
worker keeps gthread's threads and accepts as eagerly, and answers what it cannot serve in time
at once, 503 `busy` with Retry-After, without the app:

- in the main loop, when more requests already wait for a thread than SHOP["QUEUE_MAX"]
  (default: the number of threads), or when this process's lines are full (as many buyers wait
  as it admits: shop/admission.py) and the request is an order, unless it orders only products
  known to be sold out (those go on: the app answers "sold out" at once). It looks at the
  request without taking it off the socket (MSG_PEEK), and never waits for I/O. What is an
  order, and which products it names, is shop/order_requests.py's rule: it reads at most
  READ_MAX (16 KiB) of a request, never raises, and what it cannot read of an order is refused;
  should it raise all the same, the request goes on to the app (logged), never ends the worker;
- in the thread that picks a request up, when it waited longer than the queue allows: CoDel's
  rule (Facebook's "controlled delay"): SHOP["QUEUE_INTERVAL"] (100 ms) while the queue drains
  now and then (a burst), SHOP["QUEUE_TARGET"] (20 ms) once it has not been empty for a whole
  interval (a standing queue: more arrives than the threads serve); or when the lines filled
  since it was queued.

Its answers carry the security headers Django's middleware gives the site's (read from the
settings when the app loads) and a Content-Security-Policy of their own.

Every other request is stamped with the time it was queued (`environ["shop.arrived"]`,
time.monotonic() of this process): its deadline counts from there (shop/deadlines.py). A thread
of the worker reads the index of sold-out products four times a second and adds the overload
counts to Redis once a second (shop/overload.py: the lock dashboard's panel).

    gunicorn shop.wsgi -c gunicorn.conf.py        (worker_class = "shop.gunicorn_worker.ShopWorker")
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import html
import logging
import selectors
import socket
import threading
import time
from collections import deque
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

from shop import order_requests

RETRY_AFTER = 1  # seconds: a thread frees within milliseconds; a second spreads the retries
# How long a connection chosen for a "busy" answer may take to send its request.
SEND_WITHIN = 2.0

def _busy_json(reason: str) -> bytes:
    return (b'{"error":{"code":"busy","message":"The shop is very busy right now; nothing was done. '
            b'Please retry in a moment.","details":{"retry_after":1,"where":"server","reason":"'
            + reason.encode() + b'"}}}')


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


_BUSY_JSON = {reason: _busy_json(reason) for reason in ("queue_full", "queue_delay", "full")}
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


def use_site_headers() -> None:
    global _SITE_HEADERS
    _SITE_HEADERS = site_headers()


def _busy_checkout(request: bytes) -> bytes | None:
    """The checkout's busy page: it sends the same order again by itself in a moment; None
    without the order's idempotency key."""
    fields = order_requests.checkout_form(request, _CHECKOUT_FIELDS)
    if not any(k == "idempotency_key" for k, _ in fields):
        return None
    inputs = "".join(f'<input type=hidden name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields)
    return _page(
        "<p id=busy-retry>Nothing was ordered yet. Trying again in a moment with the same order "
        "(it is never placed twice).</p>"
        f"<form method=post action='/checkout/' id=again>{inputs}<button type=submit>Try now</button></form>"
        f"<script>{_SCRIPT}</script>")


def busy_response(request: bytes, reason: str) -> bytes:
    """The whole 503 answer to a request (its bytes as far as they came): the checkout's busy page
    (it retries by itself) for a checkout, a short page for other browser pages, JSON (the API's
    error shape) for everything else; with the site's security headers. It never raises (the
    main loop calls it): should reading the request fail all the same, the answer is JSON."""
    try:
        page, kind, csp = _busy_answer(request, reason)
    except Exception:
        logging.getLogger("gunicorn.error").exception("busy answer: the request could not be read")
        page, kind, csp = _BUSY_JSON[reason], b"application/json", _CSP_JSON
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + kind + b"\r\nRetry-After: "
            + str(RETRY_AFTER).encode() + b"\r\nCache-Control: no-store\r\n" + _SITE_HEADERS
            + b"Content-Security-Policy: " + csp + b"\r\nConnection: close\r\nContent-Length: "
            + str(len(page)).encode() + b"\r\n\r\n" + page)


def _busy_answer(request: bytes, reason: str) -> tuple[bytes, bytes, bytes]:
    """(page, its content type, its Content-Security-Policy)."""
    line = order_requests.request_line(request)
    method, path = line if line is not None and line[1] is not None else ("", "")
    api = order_requests.is_api_path(path) if path else False
    checkout = not api and order_requests.is_order_request(method, path)  # the web checkout
    page = _busy_checkout(request) if checkout else None
    if page is not None:
        return page, b"text/html; charset=utf-8", _CSP_CHECKOUT
    if not api and (checkout or b"text/html" in request[:order_requests.HEAD_MAX].lower()):
        return _BUSY_HTML, b"text/html; charset=utf-8", _CSP_PAGE
    return _BUSY_JSON[reason], b"application/json", _CSP_JSON


def _whole(request: bytes) -> bool:
    """The request's head and its (Content-Length) body have come."""
    head, sep, body = request.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()  # at most 9 digits: int() of thousands of digits raises
            return value.isdigit() and len(value) <= 9 and len(body) >= int(value)
    return True


class ShopWorker(ThreadWorker):
    """gthread, with its thread pool's queue bounded (see the module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._arrival = threading.local()
        self._queue_empty_at = time.monotonic()
        self._shedding: deque = deque()  # (connection, give-up time) chosen for a "busy" answer
        self.queue_max = self.queue_target = self.queue_interval = 0.0
        self._count = self._observe = None

    def load_wsgi(self) -> None:
        super().load_wsgi()
        from shop import admission, metrics
        from shop.conf import shop_settings
        from shop.plumbing import soldout

        self.queue_max = int(shop_settings.QUEUE_MAX or self.cfg.threads)
        self.queue_target = float(shop_settings.QUEUE_TARGET)
        self.queue_interval = float(shop_settings.QUEUE_INTERVAL)
        self._count, self._observe = metrics.shed, metrics.queue_waited
        admission.serve_with_threads(int(self.cfg.threads))
        use_site_headers()
        self._lines_full, self._known_sold_out = admission.full, soldout.known_sold_out
        threading.Thread(target=self._keep_known_sold_out, args=(soldout,), name="shop-worker-chores",
                         daemon=True).start()
        app, arrival = self.wsgi, self._arrival

        def stamped(environ, start_response):
            environ["shop.arrived"] = getattr(arrival, "at", None) or time.monotonic()
            return app(environ, start_response)

        self.wsgi = stamped

    def _keep_known_sold_out(self, soldout) -> None:
        """Which products are sold out, read every quarter of a second, and the overload counts
        flushed every second (never in the main loop)."""
        from shop import overload

        flushed = time.monotonic()
        while self.alive:
            soldout.refresh_known()
            if time.monotonic() - flushed >= 1.0:
                overload.flush()
                flushed = time.monotonic()
            time.sleep(soldout.KNOWN_REFRESH)

    # --- the main loop -------------------------------------------------------------------
    def _waiting(self) -> int:
        return self.tpool._work_queue.qsize()

    def enqueue_req(self, conn) -> None:
        conn.queued_at = time.monotonic()
        waiting = self._waiting()
        if waiting == 0:
            self._queue_empty_at = conn.queued_at
        if waiting >= self.queue_max or self._lines_full():
            self._triage_when_readable(conn)  # look at it first: it may be answered at once
            return
        super().enqueue_req(conn)

    def _triage_when_readable(self, conn) -> None:
        conn.sock.setblocking(False)
        self._shedding.append((conn, time.monotonic() + SEND_WITHIN))
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._triage, conn))

    def _triage(self, conn, _sock=None) -> None:
        """Readable, while threads or lines are full: peek at the request (it stays on the socket)
        and answer it 503 `busy` here, unless it may go on: the threads have room again and it is
        no order while the lines are full, or it orders only products known to be sold out (the
        app answers those at once). Never blocks the loop."""
        self._forget_shedding(conn)
        try:
            head = conn.sock.recv(order_requests.READ_MAX, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            self._triage_when_readable(conn)
            return
        except OSError:
            self._close(conn)
            return
        if not head:
            self._close(conn)
            return
        if self._waiting() >= self.queue_max:
            self._answer_busy(conn, "queue_full")
        elif self._lines_full() and self._order_to_refuse(head):
            self._answer_busy(conn, "full")
        else:
            conn.data_ready = True
            super().enqueue_req(conn)

    def _answer_busy(self, conn, reason: str) -> None:
        """Read what the client sent, answer 503, close."""
        head = b""
        try:
            while len(head) < order_requests.READ_MAX:  # what it decides on; the rest is not read
                chunk = conn.sock.recv(order_requests.READ_MAX - len(head))
                if not chunk:
                    break
                head += chunk
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn)
            return
        try:
            conn.sock.send(busy_response(head, reason))  # a few hundred bytes: the socket buffer takes them
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._counted(reason)
        self._close(conn)

    def _forget_shedding(self, conn) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        for i, (queued, _) in enumerate(self._shedding):
            if queued is conn:
                del self._shedding[i]
                break

    def _close(self, conn) -> None:
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        while self._shedding and self._shedding[0][1] <= now:  # never sent a request: just close
            conn, _ = self._shedding[0]
            self._forget_shedding(conn)
            self._close(conn)

    # --- a thread ----------------------------------------------------------------------
    def handle(self, conn):
        now = time.monotonic()
        queued_at = getattr(conn, "queued_at", now)
        waited = now - queued_at
        if self._waiting() == 0:
            self._queue_empty_at = now
        standing = now - self._queue_empty_at > self.queue_interval
        if waited > (self.queue_target if standing else self.queue_interval):
            self._answer_busy_here(conn, "queue_delay")
            return False  # close
        if self._lines_full() and self._is_order_to_refuse(conn):  # they filled since it was queued
            self._answer_busy_here(conn, "full")
            return False
        if self._observe is not None:
            self._observe(waited)
        self._arrival.at = queued_at
        try:
            return super().handle(conn)
        finally:
            self._arrival.at = None

    def _is_order_to_refuse(self, conn) -> bool:
        """An order (not only of products known sold out) waits on the socket, as far as a peek
        shows now without waiting."""
        try:
            conn.sock.setblocking(False)
            head = conn.sock.recv(order_requests.READ_MAX, socket.MSG_PEEK)
        except OSError:
            return False
        return self._order_to_refuse(head)

    def _order_to_refuse(self, request: bytes) -> bool:
        """The triage's rule (shop/order_requests.py: bounded, it never raises). Should it raise
        all the same, the request goes on to the app, which answers it: an exception here would
        end the worker and every request it serves."""
        try:
            return order_requests.to_refuse_while_full(request, known_sold_out=self._known_sold_out)
        except Exception:
            self.log.exception("triage failed; the request goes on to the app")
            return False

    def _answer_busy_here(self, conn, reason: str) -> None:
        """In a thread: read the request (briefly), answer 503; the main loop closes it."""
        head = b""
        try:
            conn.sock.settimeout(0.05)
            while len(head) < order_requests.READ_MAX and not _whole(head):
                chunk = conn.sock.recv(order_requests.READ_MAX - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:
            pass
        if head:
            try:
                conn.sock.settimeout(0.5)
                conn.sock.sendall(busy_response(head, reason))
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                    self.log.debug("busy answer not sent: %s", exc)
            self._counted(reason)

    def _counted(self, reason: str) -> None:
        if self._count is not None:
            self._count(reason)
