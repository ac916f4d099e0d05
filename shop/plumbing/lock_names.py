"""The names of the shop's locks, in one place (the lock library keys its Redis state by them).

A product's stock is written under its own lock; a coupon's claims under the coupon's. With
combining, a buyer of one product queues on the lock its batch is served under: the product's
own, or with lanes (SHOP["COMBINE_LANES"]) the lane the product falls in.
"""

from __future__ import annotations

import functools
import os

from shop.conf import shop_settings

# "auto" lanes: one per CPUS_PER_LANE CPUs the process may run on, within these bounds. A lane's
# batches get smaller as lanes multiply (docs/benchmarks.md, "Checkout lanes by default": on 2
# CPUs 2 lanes beat 4 and 8); since a batch takes its products' locks in its own round trip
# (issue 39's multi-lock take), one lane on 2 CPUs sells 8 and 32 products faster than two
# ("One lane on two CPUs (issue 39)").
CPUS_PER_LANE = 2
MIN_LANES, MAX_LANES = 1, 32


def product_lock(product_id: int) -> str:
    return f"product:{product_id}"


def coupon_lock(coupon_id: int) -> str:
    return f"coupon:{coupon_id}"


def lane_lock(product_id: int, *, lanes: int) -> str:
    """The queue a single-product order waits in: its product's own lock, or its lane's."""
    return product_lock(product_id) if lanes <= 0 else f"checkout-lane:{product_id % lanes}"


def lanes() -> int:
    """SHOP["COMBINE_LANES"] as a number ("auto": from this machine's CPUs)."""
    chosen = shop_settings.COMBINE_LANES
    return _machine_lanes() if chosen == "auto" else int(chosen)


@functools.cache
def _machine_lanes() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(MIN_LANES, min(MAX_LANES, cpus // CPUS_PER_LANE))


def checkout_queue(product_id: int) -> str:
    """The lock a buyer of this one product waits on under the current settings."""
    if not shop_settings.COMBINING:
        return product_lock(product_id)
    return lane_lock(product_id, lanes=lanes())
