"""The worker's busy path in process: the CPU its main loop spends on one order answered `busy`
while the lines are full (config/gunicorn_worker.py), from the request's bytes on a socket to the
answer sent and the socket closed. Not a test: it prints figures.

    .venv/bin/python docs/bench_busy_path.py                      # this tree
    .venv/bin/python docs/bench_busy_path.py --tree /path/to/other  # another tree (main, d85ccfe)
    .venv/bin/python docs/bench_busy_path.py --profile api         # cProfile (CPU clock) of one case

Each request comes on a fresh socketpair (made, written and read outside the timing): the
worker's own code runs as in a server (its connection object, the poller, recv, triage, the
answer, send, shutdown, close), with SHOP_MAX_WAITING=1 and one buyer waiting for the ordered
product (its lines full, the product crowded: the busy answer `full`). Counting is left out (the
same in every tree). Cases: `api` (a JSON order with a token, as docs/bench_edge.sh sends),
`checkout` (a browser's checkout form post), and with a line open for the product (the answer
carries an arrival stamp): `checkout-lined`, and `api-queue-lined` (the threads' queue full: the
busy answer `queue_full`; with only the lines full a lined product's order goes on to the app).
The tree before issue 35 (d85ccfe) has no lines: there the `-lined` cases are the plain ones.
Figures: CPU (time.process_time) per request, the median of ROUNDS (each BATCHES x BATCH), with
the request sent before the connection is taken ("ready") and after ("late"); either way a new
connection goes through one poller round (d85ccfe; main at 6f6f46f read it at once), except with
--tcp in a tree that defers accept (DEFER_ACCEPT: the request is read at accept, as in a server).
--tcp: real TCP connections from another process, accepted by the worker (its accept() and the
kernel's TCP work counted too; the client reads its answers only after the clock stops).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from functools import partial
from pathlib import Path

PRODUCT = 7
TOKEN = "tk_" + "Q" * 40
ORDER = b'{"lines":[{"product_id":7,"quantity":1}]}'
API = (b"POST /api/orders/ HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: python-requests/2.32.3\r\n"
       b"Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: close\r\nAuthorization: Bearer "
       + TOKEN.encode() + b"\r\nContent-Type: application/json\r\nIdempotency-Key: 6f1c2a9e-5b1d-4c1e-9a57-"
       b"3e0f8f6a2b11\r\nContent-Length: " + str(len(ORDER)).encode() + b"\r\n\r\n" + ORDER)
FORM = (b"csrfmiddlewaretoken=" + b"c" * 64 + b"&idempotency_key=0b9f4e2c-7d3a-4f7e-8c21-5a6b7c8d9e0f"
        b"&coupon_code=")
CHECKOUT = (b"POST /checkout/ HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; "
            b"rv:128.0) Gecko/20100101 Firefox/128.0\r\nAccept: text/html,application/xhtml+xml,application/"
            b"xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " + str(len(FORM)).encode()
            + b"\r\nOrigin: https://shop.example\r\nConnection: keep-alive\r\nReferer: https://shop.example/cart/"
            b"\r\nCookie: csrftoken=" + b"t" * 32 + b"; sessionid=" + b"s" * 32 + b"\r\nUpgrade-Insecure-Requests: 1"
            b"\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Site: same-origin\r\n"
            b"Sec-Fetch-User: ?1\r\nPriority: u=0, i\r\n\r\n" + FORM)
# name: (request, a line open for the product, the threads' queue full)
CASES = {"api": (API, False, False), "checkout": (CHECKOUT, False, False),
         "checkout-lined": (CHECKOUT, True, False), "api-queue-lined": (API, True, True)}
_queued = [0]


def setup(tree: Path):
    """Django and a ShopWorker of `tree`, its lines full, as after load_wsgi (no thread started)."""
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", SECRET_KEY="bench", DEBUG="false", DEV_ENV_FILE="",
                      SHOP_MAX_WAITING="1", DATABASE_URL="mysql://root@127.0.0.1:3306/shop_bench")
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    import django

    django.setup()
    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    from config import gunicorn_worker
    from shop.edge import admission
    from shop.plumbing import soldout

    assert Path(gunicorn_worker.__file__).is_relative_to(tree), gunicorn_worker.__file__
    cfg = Config()
    cfg.set("threads", 16)
    worker = gunicorn_worker.ShopWorker(0, os.getppid(), [], None, 30, cfg, Logger(cfg))
    worker.queue_max, worker.queue_target, worker.queue_interval = 16, 0.02, 0.1
    worker._count = worker._observe = None
    worker.tpool = type("Pool", (), {"_work_queue": type("Q", (), {"qsize": staticmethod(lambda: _queued[0])})()})()
    import selectors

    worker.poller = selectors.DefaultSelector()
    admission.serve_with_threads(16)
    per_product = "product_ids" in admission.enter.__code__.co_varnames  # d85ccfe: one count, no products
    assert (admission.enter([PRODUCT]) if per_product else admission.enter()) and admission.full()  # lines full
    worker._lines_full, worker._known_sold_out = admission.full, soldout.known_sold_out
    if hasattr(worker, "_crowded_here"):
        worker._product_crowded = admission.crowded
    if hasattr(gunicorn_worker, "use_site_headers"):
        gunicorn_worker.use_site_headers()
    return worker, gunicorn_worker


def arrange(worker, name: str) -> bytes:
    """The worker as the case has it; the case's request."""
    request, on, queue_full = CASES[name]
    _queued[0] = worker.queue_max if queue_full else 0
    if hasattr(worker, "_lined"):
        worker._lined = frozenset({PRODUCT}) if on else frozenset()
        worker._clock_offset = time.time() - time.monotonic()  # the chores thread reads it at once
    return request


def one_batch(worker, module, request: bytes, n: int, *, late: bool = False) -> tuple[float, bytes]:
    """CPU seconds for n requests answered busy by the main loop (the sockets made and the client's
    side written and read outside the clock). `late`: the connection is taken before its request
    has come (a round through the poller), else its bytes are there already."""
    pairs = [socket.socketpair() for _ in range(n)]
    if not late:
        for _, client in pairs:
            client.sendall(request)
    before = not hasattr(module, "_Conn")
    if before:
        from gunicorn.workers.gthread import TConn as conn_class
    else:
        conn_class = partial(module._Conn, linger=worker._linger)
    worker.nr_conns = n
    start = time.process_time()
    for server, _ in pairs:  # gthread's accept(), then the worker's
        conn = conn_class(worker.cfg, server, ("127.0.0.1", 40000), ("127.0.0.1", 8000))
        worker.enqueue_req(conn)
    spent = time.process_time() - start
    if late:
        for _, client in pairs:
            client.sendall(request)
    if worker.poller.get_map():  # the main loop's next round (d85ccfe always; since, new connections)
        start = time.process_time()
        for key, _ in worker.poller.select(0):
            key.data(key.fileobj)
        spent += time.process_time() - start
    answer = pairs[-1][1].recv(65536)
    for _, client in pairs:
        client.close()
    assert len(worker.poller.get_map()) == 0
    return spent, answer


_CLIENT = """
import socket, sys
port = int(sys.argv[1]); request = bytes.fromhex(sys.argv[2]); socks = []
for line in sys.stdin:
    if line.startswith("drain"):  # once the worker is done: no reading while it works
        last = b""
        for sock in socks:
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            last = answer
            sock.close()
        socks = []
        print(last.split(b"\\r\\n", 1)[0].decode(), flush=True)
    else:
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(int(line))]
        for sock in socks:
            sock.sendall(request)
        print("ready", flush=True)
"""


class TcpClient:
    """Another process that opens n connections to the worker's listener and sends the request
    on each (its CPU is not this process's), and reads the answers once the worker is done."""

    def __init__(self, request: bytes) -> None:
        import subprocess

        self.listener = socket.create_server(("127.0.0.1", 0), backlog=2048)
        self.listener.setblocking(False)
        port = self.listener.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-c", _CLIENT, str(port), request.hex()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def batch(self, worker, module, n: int) -> tuple[float, bytes]:
        """CPU seconds of this process for n connections accepted and answered by the worker."""
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ready"
        worker.nr_conns = 0
        if getattr(module, "DEFER_ACCEPT", 0):  # as the worker's init_process sets it up
            self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, module.DEFER_ACCEPT)
            worker._deferred = True
        start = time.process_time()
        for _ in range(n):
            worker.accept(self.listener)  # d85ccfe: gthread's, then polled until readable (below)
        if worker.poller.get_map():  # the main loop's next round
            for key, _ in worker.poller.select(0):
                key.data(key.fileobj)
        spent = time.process_time() - start
        self.proc.stdin.write("drain\n")
        self.proc.stdin.flush()
        status = self.proc.stdout.readline().strip().encode()
        assert len(worker.poller.get_map()) == 0
        return spent, status + b"\r\n"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self.listener.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=400)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--profile", choices=sorted(CASES))
    parser.add_argument("--late", action="store_true", help="profile: the request comes after the connection")
    parser.add_argument("--tcp", action="store_true", help="TCP connections from another process, accepted "
                        "by the worker (ready requests only)")
    args = parser.parse_args()
    worker, module = setup(args.tree.resolve())
    if args.profile:
        import cProfile
        import pstats

        request = arrange(worker, args.profile)
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(args.batches * 2):
            one_batch(worker, module, request, args.batch, late=args.late)
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(45)
        return
    print(f"tree {args.tree}  load average {os.getloadavg()[0]:.2f}")
    if not args.tcp:
        print(f"{'case':<16} {'ready: median':>13} {'min':>6} {'max':>6}   {'late: median':>12} {'min':>6} {'max':>6}"
              "   (us CPU per busy answer)")
    if args.tcp:
        print(f"{'case':<16} {'tcp: median':>13} {'min':>6} {'max':>6}   (us CPU per busy answer, accept included)")
        worker.worker_connections = 10 * args.batch
        for name in CASES:
            request = arrange(worker, name)
            client = TcpClient(request)
            try:
                _, status = client.batch(worker, module, 50)  # warm
                assert status.startswith(b"HTTP/1.1 503"), (name, status)
                rounds = []
                for _ in range(args.rounds):
                    total = sum(client.batch(worker, module, args.batch)[0] for _ in range(args.batches))
                    rounds.append(total / (args.batch * args.batches) * 1e6)
            finally:
                client.close()
            print(f"{name:<16} {statistics.median(rounds):13.1f} {min(rounds):6.1f} {max(rounds):6.1f}")
        return
    for name in CASES:
        request = arrange(worker, name)
        figures = []
        for late in (False, True):
            _, answer = one_batch(worker, module, request, 50, late=late)  # warm
            status = answer.split(b"\r\n", 1)[0].decode()
            assert status.startswith("HTTP/1.1 503"), (name, answer[:200])
            stamped = b"Line-Arrival:" in answer
            rounds = []
            for _ in range(args.rounds):
                total = sum(one_batch(worker, module, request, args.batch, late=late)[0] for _ in range(args.batches))
                rounds.append(total / (args.batch * args.batches) * 1e6)
            figures.append(f"{statistics.median(rounds):6.1f} {min(rounds):6.1f} {max(rounds):6.1f}")
        print(f"{name:<16} {figures[0]:>27}   {figures[1]:>26}   {status[9:12]}{' stamped' if stamped else ''}")


if __name__ == "__main__":
    main()
