"""gunicorn settings of the shop: its worker (overload), Prometheus multi-process mode (docs/metrics.md).

    gunicorn -c config/gunicorn.conf.py config.wsgi --workers 4 --threads 16 --bind 0.0.0.0:8000

The worker is gthread with its queue bounded (config/gunicorn_worker.py): past capacity a request
is answered 503 `busy` with Retry-After at once instead of waiting unbounded for a thread, and a
request gets a thread only once it has come whole (slow clients: docs/operations.md). It
accepts eagerly (worker_connections), so the kernel's backlog stays short: a crowd is answered,
not left in SYN retransmits (docs/operations.md, "A crowd bigger than the server").

Each worker is a process with its own counters; a scrape lands on one of them. So every worker
writes its values to files in PROMETHEUS_MULTIPROC_DIR and /metrics sums the files of all of
them (shop/ops/metrics.py). The directory must be set before a worker imports the app (here, in the
master, which the workers inherit), belong to this server only, and start empty: a file left by
an earlier run would be added to this run's counters.

- PROMETHEUS_MULTIPROC_DIR unset: a fresh private directory per server (removed at exit), so
  two servers on one host (docs/bench_http_combining.sh) never mix their counts.
- Set: used as given, emptied of metric files when the server starts.
- The control socket (`gunicornc`) is `gunicorn.ctl` in that directory, or GUNICORN_CONTROL_SOCKET.
- A worker that exits (timeout, max_requests, crash): `mark_process_dead` drops its live gauges;
  its counters stay in the sums, as counters must.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_OWN_DIR = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _OWN_DIR:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="flashsale-metrics-")
    os.environ["FLASHSALE_METRICS_OWN_DIR"] = "1"  # survives a config reload (HUP) in the master
elif os.environ.get("FLASHSALE_METRICS_OWN_DIR") == "1":
    _OWN_DIR = True


worker_class = "config.gunicorn_worker.ShopWorker"
# Threads per worker (--threads wins): buyers waiting in a product's line hold one each, and the
# shop admits a quarter fewer waiting buyers than threads, so the cheap answers always find one.
threads = int(os.environ.get("WEB_THREADS", "16"))
# Connections one worker holds (being served, waiting for a thread, kept alive): far more than
# its threads, so a crowd is accepted and answered rather than left in the kernel's backlog.
worker_connections = int(os.environ.get("WEB_WORKER_CONNECTIONS", "1000"))


def _dir() -> Path:
    return Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


# gunicorn's control socket (`gunicornc`) is one path per user by default, which a second server on
# the host takes over with a warning. Each server gets its own, beside its metrics files, unless
# GUNICORN_CONTROL_SOCKET names one.
control_socket = os.environ.get("GUNICORN_CONTROL_SOCKET") or str(_dir() / "gunicorn.ctl")


def on_starting(server) -> None:
    """In the master, before any worker: an empty directory for this run."""
    path = _dir()
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


def child_exit(server, worker) -> None:
    """In the master, after a worker exited: its live gauges go away with it."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    if _OWN_DIR:
        shutil.rmtree(_dir(), ignore_errors=True)
