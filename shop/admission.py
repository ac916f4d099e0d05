"""How many buyers one process lets wait in the products' lines at once.

A buyer waiting for its order holds a thread of its server. If every thread waits, nothing is
left for the cheap answers (sold out, a replay, a page), and new buyers queue behind the waiting
ones. So a process admits at most MAX_WAITING buyers into the lines at once; the next one is told
`busy` (503, Retry-After) at once, before it costs a queue slot, a lock or a database
connection. The sold-out and replay checks come before admission (shop/services/checkout.py), so
"sold out" is always answered. While the lines are full, the shop's gunicorn worker refuses new
orders before they reach the app (shop/gunicorn_worker.py), except those for products this
process knows are sold out (`soldout.known_sold_out`): those go on, to be answered "sold out".

MAX_WAITING: SHOP["MAX_WAITING"] if set; under the shop's gunicorn worker, its threads minus a
quarter (at least 2 kept free); elsewhere (runserver, management commands, tests) unbounded.
"""

from __future__ import annotations

import threading

from shop import errors, metrics
from shop.conf import shop_settings

_threads: int | None = None  # the gunicorn worker's threads, when it runs us (shop/gunicorn_worker.py)
_guard = threading.Lock()
_waiting = 0


def serve_with_threads(threads: int) -> None:
    """Called by the shop's gunicorn worker: this process has `threads` threads."""
    global _threads
    _threads = threads


def limit() -> int | None:
    if shop_settings.MAX_WAITING is not None:
        return int(shop_settings.MAX_WAITING)
    if _threads is None:
        return None
    return max(1, _threads - max(2, _threads // 4))


def waiting() -> int:
    return _waiting


def full() -> bool:
    """No place left for another buyer (the worker then refuses new orders before the app)."""
    most = limit()
    return most is not None and _waiting >= most


def enter() -> bool:
    """Take a place in the lines for this buyer; False when the process has none left (then
    answer `refusal()`). Every True must be paired with `leave()`."""
    global _waiting
    most = limit()
    with _guard:
        if most is not None and _waiting >= most:
            return False
        _waiting += 1
        return True


def leave() -> None:
    global _waiting
    with _guard:
        _waiting -= 1


def refusal() -> errors.Busy:
    """The answer to a buyer that found no place: `busy`, counted."""
    metrics.shed("admission")
    return errors.Busy(details={"reason": "full", "retry_after": errors.Busy.retry_after})
