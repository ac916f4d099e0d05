"""Slow clients hold no thread of the shop's worker (config/gunicorn_worker.py), on a real server.

A small real gunicorn (the shipped config/gunicorn.conf.py and settings: the shop's worker, 1 worker x 4
threads), and one with tighter bounds set through the environment (`tight_server`).
The attackers connect from 127.0.0.1; the normal client from 127.0.0.2 (on Linux the whole of
127/8 is this machine), so it is another client address, as it is on the internet.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import threading
import time
import weakref
from pathlib import Path

import pytest
from django.db import connections

from config.gunicorn_worker import DEFER_ACCEPT, SLOT_GRACE
from loadtest import appservers

# django_db: pytest-django sets up the test database only for a run that holds a test marked so
# (the servers use it), as a run of this module alone does not otherwise.
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

THREADS = 4
TIGHT_HEAD_TIMEOUT = 3  # seconds: SHOP_HEAD_TIMEOUT of `tight_server` (the default is 5)
HALF_HEAD = b"POST /api/orders/ HTTP/1.1\r\nHost: x\r\n"
NORMAL = "127.0.0.2"


def _server(**env: str) -> appservers.AppServer:
    connections.close_all()
    server = appservers.AppServer(workers=1, threads=THREADS, env=env)
    server.start()
    return server


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        small = _server()
    yield small
    small.stop()


def _connect(server: appservers.AppServer, *, source: str = "127.0.0.1", send: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0))
    if send:
        sock.sendall(send)
    return sock


def _get(server: appservers.AppServer, path: str = "/api/products/", *, source: str = NORMAL,
         timeout: float = 10.0) -> tuple[int, float]:
    """A normal client's GET on a new connection: (status, seconds to the whole answer)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        conn.close()


def _closed_by_server(sock: socket.socket, *, within: float) -> tuple[bool, bytes]:
    """Whether the server closes the connection within `within` s, and what it sent before."""
    sock.settimeout(within)
    got = b""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got
    return False, got


def _read_response(sock: socket.socket, *, timeout: float = 5.0) -> bytes:
    """The next whole response (Content-Length framed) on a connection; interim ones (100
    Continue, RFC 9110 15.2) are skipped. Reads through the socket's one buffered reader, so
    pipelined answers are not lost between calls."""
    sock.settimeout(timeout)
    reader = _readers.setdefault(sock, sock.makefile("rb"))
    while True:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = reader.readline()
            assert line, f"closed before a response: {head!r}"
            head += line
        if not head.startswith(b"HTTP/1.1 1"):
            break
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + reader.read(length)


_readers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _each_served_in_turn(socks: list[socket.socket]) -> None:
    """A GET on each connection, its answer read before the next is sent (all at once, a few
    would be answered `busy` by a worker of 4 threads): each gets its 200."""
    for sock in socks:
        sock.sendall(b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200 ")


class _Attackers:
    """`count` connections that each send `first` and then nothing, held open: one the server
    closes is opened again (every half second), as an attacker would."""

    def __init__(self, server: appservers.AppServer, count: int, first: bytes) -> None:
        self.server, self.count, self.first = server, count, first
        self.socks: list[socket.socket] = []
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> _Attackers:
        self.socks = [_connect(self.server, send=self.first) for _ in range(self.count)]
        self._thread.start()
        return self

    def _hold(self) -> None:
        while not self._stop.wait(0.5):
            for i, sock in enumerate(self.socks):
                sock.setblocking(False)
                try:
                    gone = sock.recv(65536) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    sock.close()
                    with contextlib.suppress(OSError):
                        self.socks[i] = _connect(self.server, send=self.first)
                        self.reopened += 1

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close()


@pytest.mark.parametrize("gap", [0.6, pytest.param(1.4, marks=pytest.mark.liveness)], ids=["7s", "15s"])
def test_slow_and_silent_clients_hold_no_thread(server, gap):
    """The issue's case: 4 x threads connections sending half a head and as many sending nothing,
    held open 15 s, while a normal client's 10 GETs are each answered within 1 s. By default 7 s
    (past the 5 s head timeout: the attackers are cut off and come back); 15 s under liveness."""
    assert _get(server)[0] == 200
    with _Attackers(server, 4 * THREADS, HALF_HEAD), _Attackers(server, 4 * THREADS, b""):
        time.sleep(0.5)  # every attacker connection is in (and, without the fix, holds a thread)
        took = []
        for _ in range(10):
            status, seconds = _get(server)
            assert status == 200
            took.append(seconds)
            time.sleep(gap)  # ten GETs spread over the 7 (15) s the attackers hold on
    assert max(took) < 1.0, [round(t, 2) for t in took]


def test_a_client_that_never_closes_after_its_answer_does_not_stall_the_worker(server):
    """An answer with "Connection: close" is followed by a graceful close that waits for the client
    to close too: gthread waits for it in its main loop (up to 2 s each), so a few clients that
    never close would stop the worker from accepting anyone."""
    ask = b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    lingerers = [_connect(server, send=ask) for _ in range(8)]
    try:
        time.sleep(0.2)
        took = [_get(server)[1] for _ in range(5)]
        assert max(took) < 1.0, [round(t, 2) for t in took]
        for sock in lingerers:  # each got its whole answer, then the server's FIN
            closed, answer = _closed_by_server(sock, within=5)
            assert answer.startswith(b"HTTP/1.1 200 ") and closed
    finally:
        for sock in lingerers:
            sock.close()


def _post(path: str, body: bytes, *extra: bytes) -> tuple[bytes, bytes]:
    """A POST's head (Content-Length set) and its body."""
    head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + b"".join(line + b"\r\n" for line in extra) + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head, body


def test_a_body_that_trickles_in_holds_no_thread_and_is_served_once_whole(server):
    """4 x threads clients send their head, then their body a few bytes at a time; a normal client
    is answered at once meanwhile, and each of them once its body is whole."""
    body = b'{"lines": [{"product_id": 1, "quantity": 1}]}'
    head, body = _post("/api/nowhere/", body)
    socks = [_connect(server, send=head) for _ in range(4 * THREADS)]
    try:
        took = []
        for start in range(0, len(body), 6):
            for sock in socks:
                sock.sendall(body[start:start + 6])
            took.append(_get(server)[1])
            time.sleep(0.1)
        assert max(took) < 1.0, [round(t, 2) for t in took]
        # Whole at once, 16 of them: as many as the threads and their queue take go to the app,
        # the rest are answered `busy` (the queue's bound).
        answers = [_read_response(sock) for sock in socks]
        assert {a[:13] for a in answers} <= {b"HTTP/1.1 404 ", b"HTTP/1.1 503 "}
        assert sum(a.startswith(b"HTTP/1.1 404 ") for a in answers) >= THREADS
    finally:
        for sock in socks:
            sock.close()


def test_a_request_not_whole_in_time_is_closed(tight_server):
    """Half a head is answered 408 and closed after HEAD_TIMEOUT; a connection that sent nothing is
    just closed. Not before: a slow network gets its time."""
    started = time.monotonic()
    half, silent = _connect(tight_server, send=HALF_HEAD), _connect(tight_server)
    try:
        closed, answer = _closed_by_server(half, within=TIGHT_HEAD_TIMEOUT + 3)
        half_took = time.monotonic() - started
        assert closed and answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in answer
        closed, answer = _closed_by_server(silent, within=3)
        assert closed and answer == b""
        assert TIGHT_HEAD_TIMEOUT / 2 < half_took < TIGHT_HEAD_TIMEOUT + 3
    finally:
        half.close()
        silent.close()


def test_keep_alive_pipelining_and_a_head_in_pieces_are_served(server):
    ask = b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sock = _connect(server)
    try:
        for _ in range(3):  # one connection, one request after the other
            sock.sendall(ask)
            assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        head, body = _post("/api/nowhere/", b"{}")
        sock.sendall(ask + head + body + ask)  # three at once: answered in order
        answers = [_read_response(sock) for _ in range(3)]
        assert [a[:13] for a in answers] == [b"HTTP/1.1 200 ", b"HTTP/1.1 404 ", b"HTTP/1.1 200 "]
        for i in range(0, len(ask), 7):  # a head in pieces
            sock.sendall(ask[i:i + 7])
            time.sleep(0.02)
        assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"POST /api/nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"2\r\n{}\r\n0\r\n\r\n" + ask)  # chunked: its thread reads the body
        assert [_read_response(sock)[:13] for _ in range(2)] == [b"HTTP/1.1 404 ", b"HTTP/1.1 200 "]
    finally:
        sock.close()


def test_expect_100_continue_gets_its_go_ahead_before_the_body(server):
    head, body = _post("/api/nowhere/", b'{"x": 1}', b"Expect: 100-continue")
    sock = _connect(server, send=head)
    try:
        sock.settimeout(5)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert _read_response(sock).startswith(b"HTTP/1.1 404 ")  # gunicorn's own 100 skipped
    finally:
        sock.close()


def test_a_head_too_large_is_refused_with_431(server):
    sock = _connect(server, send=b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 40_000)
    try:
        closed, answer = _closed_by_server(sock, within=5)
        assert answer.startswith(b"HTTP/1.1 431 ") and closed
    finally:
        sock.close()


@pytest.fixture(scope="module")
def tight_server(django_db_setup, django_db_blocker):
    """A server with few slots: 3 unfinished connections per client once it holds 12 (half of the
    24 connections it holds in all), and a request must be whole within 3 s."""
    with django_db_blocker.unblock():
        small = _server(SHOP_HEAD_SLOTS_PER_CLIENT="3", WEB_WORKER_CONNECTIONS="24",
                        SHOP_HEAD_TIMEOUT=str(TIGHT_HEAD_TIMEOUT))
    yield small
    small.stop()


@contextlib.contextmanager
def _crowded(server: appservers.AppServer):
    """Half the server's connections taken by unfinished requests of other addresses (a first
    byte each: a silent connection reaches the worker only after DEFER_ACCEPT s)."""
    others = [_connect(server, source=f"127.0.2.{i}", send=b"G") for i in range(1, 11)]
    try:
        yield
    finally:
        for sock in others:
            sock.close()


def test_a_client_over_its_slots_loses_its_oldest_unfinished_connection(tight_server):
    with _crowded(tight_server):
        first, second, third = (_connect(tight_server, send=HALF_HEAD) for _ in range(3))
        try:
            time.sleep(SLOT_GRACE + 0.3)  # a connection younger than that is not cut off
            fourth = _connect(tight_server, send=b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert _closed_by_server(first, within=1) == (True, b"")
            assert _closed_by_server(second, within=0.3) == (False, b"")
            fourth.sendall(b"\r\n")  # the newest is read: a new connection always is
            assert _read_response(fourth).startswith(b"HTTP/1.1 200 ")
            fourth.close()
        finally:
            for sock in (first, second, third):
                sock.close()


def test_unfinished_connections_wait_while_the_worker_has_room(tight_server):
    """Below half its connections, a client over its slots loses nothing: an unfinished
    connection costs no thread (a load generator short of CPU connects long before it sends)."""
    half = b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    socks = [_connect(tight_server, send=half) for _ in range(6)]
    try:
        time.sleep(SLOT_GRACE + 0.3)
        socks.append(_connect(tight_server, send=half))
        for sock in socks:
            assert _closed_by_server(sock, within=0.1) == (False, b"")
            sock.sendall(b"\r\n")
        assert all(_read_response(sock).startswith(b"HTTP/1.1 200 ") for sock in socks)
    finally:
        for sock in socks:
            sock.close()


def test_a_burst_of_new_connections_from_one_address_is_not_cut_off(tight_server):
    """More connections than the slots, their requests sent a moment after connecting (a NAT, a
    load generator short of CPU), while the worker is crowded: none is older than SLOT_GRACE, so
    all are served."""
    with _crowded(tight_server):
        socks = [_connect(tight_server) for _ in range(8)]
        try:
            time.sleep(SLOT_GRACE / 4)
            _each_served_in_turn(socks)
        finally:
            for sock in socks:
                sock.close()


def test_idle_connections_from_many_addresses_never_lock_a_new_client_out(tight_server):
    """More silent connections than worker_connections (24), each from another address: the
    kernel holds them for DEFER_ACCEPT s, then hands them over; the oldest are closed to make
    room, and a new client is accepted and answered at once, before and after."""
    socks = [_connect(tight_server, source=f"127.0.1.{i}") for i in range(1, 41)]
    try:
        time.sleep(0.3)
        took = [_get(tight_server)[1] for _ in range(3)]
        time.sleep(DEFER_ACCEPT + 0.5)  # the worker holds them now, as many as it can
        took += [_get(tight_server)[1] for _ in range(3)]
        assert max(took) < 1.0, [round(t, 2) for t in took]
        closed = sum(_closed_by_server(sock, within=0.05)[0] for sock in socks)
        assert closed >= len(socks) - 24, closed  # they made room
    finally:
        for sock in socks:
            sock.close()


def test_a_client_that_sends_a_moment_after_connecting_is_not_cut_off(tight_server):
    """A load generator short of CPU (or a NAT of many buyers) connects, and sends its requests a
    second or more later, while the worker is crowded and the address is over its slots: the
    kernel hands a connection over only with its first bytes (DEFER_ACCEPT), so the slot's grace
    counts from then, and every request is served."""
    with _crowded(tight_server):
        socks = [_connect(tight_server) for _ in range(6)]  # 3 slots per address
        try:
            time.sleep(SLOT_GRACE + 0.5)
            socks.append(_connect(tight_server))  # over its slots, the oldest silent for 1.5 s
            time.sleep(0.2)
            _each_served_in_turn(socks)
        finally:
            for sock in socks:
                sock.close()


def _worker(server: appservers.AppServer) -> int:
    (pid,) = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    return int(pid)


def test_a_request_that_came_while_the_worker_was_behind_is_not_cut_off_as_slow(tight_server):
    """A crowded worker short of CPU (here: stopped) is behind its clients, not they behind it: a
    connection whose whole request waits unread in the kernel is never closed as a slow client,
    however long it waited. Here the worker accepts a new connection of the same address (over its
    slots, after SLOT_GRACE) before it reads the others' requests."""
    with _crowded(tight_server):
        socks = [_connect(tight_server) for _ in range(3)]
        worker = _worker(tight_server)
        time.sleep(0.3)  # accepted, nothing read yet
        os.kill(worker, signal.SIGSTOP)
        try:
            time.sleep(SLOT_GRACE + 0.3)
            newest = _connect(tight_server)  # ready for the worker before the others' requests
            for sock in socks:
                sock.sendall(b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            time.sleep(0.2)
        finally:
            os.kill(worker, signal.SIGCONT)
        try:
            newest.sendall(b"GET /api/products/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            for sock in [*socks, newest]:
                assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in [*socks, newest]:
                sock.close()


def test_answers_on_a_kept_alive_connection_carry_the_current_date(server):
    """The worker's once-a-second Date header (config/gunicorn_worker.py `http_date`) is the one
    gunicorn sends, and it moves on with the clock."""
    from email.utils import parsedate_to_datetime

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(NORMAL, 0))
    try:
        dates = []
        for _ in range(2):
            before = int(time.time())
            conn.request("GET", "/api/products/")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            dates.append(parsedate_to_datetime(response.getheader("Date")).timestamp())
            assert before <= dates[-1] <= time.time()
            time.sleep(1.1)
        assert dates[1] > dates[0]
    finally:
        conn.close()
