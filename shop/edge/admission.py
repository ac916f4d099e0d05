"""How many buyers one process lets wait in the products' lines at once.

A buyer waiting for its order holds a thread of its server. If every thread waits, nothing is
left for the cheap answers (sold out, a replay, a page), and new buyers queue behind the waiting
ones. So a process admits at most MAX_WAITING buyers into the lines at once; the next one is told
`busy` (503, Retry-After) at once, before it costs a queue slot, a lock or a database
connection. The sold-out and replay checks come before admission (shop/services/checkout.py), so
"sold out" is always answered. While the lines are full, the shop's gunicorn worker refuses new
orders before they reach the app (config/gunicorn_worker.py), except those for products this
process knows are sold out (`soldout.known_sold_out`): those go on, to be answered "sold out".

MAX_WAITING: SHOP["MAX_WAITING"] if set; under the shop's gunicorn worker, its threads minus a
quarter (at least 2 kept free); elsewhere (runserver, management commands, tests) unbounded.

The gate is per product where it can be: once it is full, a buyer of a product nobody waits for
in this process still gets in, up to the threads but one (`spare`): one product's crowd fills
the gate for its own buyers, not for everyone's (issue 36). The worker asks `crowded` which
orders to refuse before the app.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from shop import errors
from shop.conf import shop_settings
from shop.ops import metrics

_threads: int | None = None  # the gunicorn worker's threads, when it runs us (config/gunicorn_worker.py)
_guard = threading.Lock()
_waiting = 0
_by_product: Counter[int] = Counter()  # buyers waiting here, per product of their orders


def serve_with_threads(threads: int) -> None:
    """Called by the shop's gunicorn worker: this process has `threads` threads."""
    global _threads
    _threads = threads


def limit() -> int | None:
    most = shop_settings.MAX_WAITING  # read once: the worker's main loop asks twice per busy answer
    if most is not None:
        return int(most)
    if _threads is None:
        return None
    return max(1, _threads - max(2, _threads // 4))


def spare() -> int | None:
    """The most buyers let wait at once, counting those of products nobody else waits for: the
    threads but one (the limit, outside the gunicorn worker)."""
    most = limit()
    return most if _threads is None or most is None else max(most, _threads - 1)


def crowded(product_ids: Iterable[int]) -> bool:
    """Whether an order of these products is refused while the gate is full: one of them has
    buyers waiting here (its crowd fills the process), or no spare place is left. No I/O."""
    if any(_by_product.get(pid) for pid in product_ids):
        return True
    most = spare()
    return most is not None and _waiting >= most


def waiting() -> int:
    return _waiting


def full() -> bool:
    """No place left for another buyer (the worker then refuses new orders before the app)."""
    most = limit()
    return most is not None and _waiting >= most


def enter(product_ids: Iterable[int] = ()) -> bool:
    """Take a place in the lines for this buyer of these products; False when the process has
    none left for them (then answer `refusal()`). Every True must be paired with `leave()` of
    the same products."""
    global _waiting
    ids = tuple(product_ids)
    most = limit()
    with _guard:
        if most is not None and _waiting >= most and (not ids or crowded(ids)):
            return False
        _waiting += 1
        _by_product.update(ids)
        return True


def leave(product_ids: Iterable[int] = ()) -> None:
    global _waiting
    with _guard:
        _waiting -= 1
        _by_product.subtract(product_ids)
        for pid in [pid for pid, n in _by_product.items() if n <= 0]:
            del _by_product[pid]


def refusal() -> errors.Busy:
    """The answer to a buyer that found no place: `busy`, counted."""
    metrics.shed("admission")
    return errors.Busy(details={"reason": "full", "retry_after": errors.Busy.retry_after})
