"""What the line's door costs in process (issue 36; shop/line/door.py): N new accounts' first
API orders of a drop through `door.doors`, in batches, then the same orders again (their tokens
cached, their places kept); CPU and wall time per order. With --hogs, that many threads burn CPU
beside it, as a worker's busy app threads do (the door waits for the GIL after each round trip).

    DEBUG=false SECRET_KEY=bench DATABASE_URL=mysql://root@127.0.0.1:3306/shop_bench DEV_ENV_FILE= \
        PYTHONPATH=. .venv/bin/python docs/bench_door.py --orders 1000 --batch 64
    ... docs/bench_door.py --orders 1000 --batch 256 --hogs 16 --switch 0.0005

It writes a product, accounts and tokens on that database (a bench one, never production's).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import threading
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django

django.setup()

from datetime import timedelta  # noqa: E402

from django.contrib.auth import get_user_model  # noqa: E402
from django.utils import timezone  # noqa: E402

from shop import line  # noqa: E402
from shop.line import door  # noqa: E402
from shop.models import ApiToken, Product  # noqa: E402
from shop.plumbing import clock  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hogs", type=int, default=0, help="threads burning CPU beside the door")
    parser.add_argument("--switch", type=float, default=sys.getswitchinterval(), help="sys.setswitchinterval")
    parser.add_argument("--profile", action="store_true", help="cProfile each pass: top TOP (25) by SORT")
    opts = parser.parse_args()
    product = Product.objects.create(sku=f"BENCH-DOOR-{time.time_ns()}", name="Door", price="1.00", stock=10**6,
                                     opens_at=timezone.now() - timedelta(seconds=5))
    line.forget()
    users = get_user_model()
    tag = f"bd{time.time_ns()}"
    users.objects.bulk_create(users(username=f"{tag}-{i}", password="!") for i in range(opts.orders))
    body = b'{"lines":[{"product_id":%d,"quantity":1}]}' % product.pk
    requests = [b"POST /api/orders/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ApiToken.issue(user_id=pk).encode()
                + b"\r\nContent-Type: application/json\r\nIdempotency-Key: k%d\r\nContent-Length: %d\r\n\r\n"
                % (pk, len(body)) + body
                for pk in users.objects.filter(username__startswith=tag).values_list("pk", flat=True)]
    stop = threading.Event()

    def burn() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i * i

    sys.setswitchinterval(opts.switch)
    hogs = [threading.Thread(target=burn, daemon=True) for _ in range(opts.hogs)]
    for hog in hogs:
        hog.start()
    try:
        for name in ("first orders (tokens not cached)", "again (cached, places kept)"):
            answers: dict[str, int] = {}
            profile = cProfile.Profile() if opts.profile else None
            if profile:
                profile.enable()
            wall, cpu = time.perf_counter(), time.thread_time()
            for i in range(0, len(requests), opts.batch):
                now_ms = int(clock.now().timestamp() * 1000)
                for verdict in door.doors([(r, now_ms, None) for r in requests[i:i + opts.batch]],
                                          until=time.monotonic() + 4):
                    kind = verdict if isinstance(verdict, str) else verdict.status.split(b" ")[0].decode()
                    answers[kind] = answers.get(kind, 0) + 1
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if profile:
                profile.disable()
                stats = pstats.Stats(profile).sort_stats(os.environ.get("SORT", "tottime"))
                stats.print_stats(int(os.environ.get("TOP", "25")))
            print(f"{name}: {len(requests) / wall:,.0f} orders/s, {cpu / len(requests) * 1e6:,.0f} us CPU "
                  f"(this thread) and {wall / len(requests) * 1e6:,.0f} us wall each; batch {opts.batch}, "
                  f"{opts.hogs} hogs, switch {opts.switch * 1000:g} ms; answers {answers}")
    finally:
        stop.set()


if __name__ == "__main__":
    main()
