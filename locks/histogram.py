"""Log-scale histograms kept as Redis hash fields (`w<bucket>`, `h<bucket>`, in microseconds).

Bucket b covers [2^(b/4), 2^((b+1)/4)) us: about 19% wide, enough for p50/p99 and mergeable
across processes by plain HINCRBY. The Lua scripts compute the buckets (locks/scripts/common.lua).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def bucket_of(us: float) -> int:
    return 0 if us < 1 else math.floor(4 * math.log2(us))


def bucket_upper_us(b: int) -> float:
    return 2 ** ((b + 1) / 4)


def parse(fields: Mapping[str, int], prefix: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for k, v in fields.items():
        if k.startswith(prefix) and k[len(prefix):].lstrip("-").isdigit():
            out[int(k[len(prefix):])] = int(v)
    return out


def percentile(buckets: Mapping[int, int], q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding the q-th quantile (0 < q <= 1)."""
    total = sum(buckets.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for b in sorted(buckets):
        seen += buckets[b]
        if seen >= rank:
            return (bucket_upper_us(b) if b > 0 else 1.0) / 1e6
    return bucket_upper_us(max(buckets)) / 1e6


def merge(many: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in many:
        for b, n in h.items():
            out[b] = out.get(b, 0) + n
    return out


# Batch sizes (combining, locks/combining.py) are small counts, not times: exact powers of two.
# Field `b<k>` counts batches of size in (2^(k-1), 2^k]: b0 = 1, b1 = 2, b2 = 3-4, b3 = 5-8,
# b4 = 9-16, b5 = 17-32, ... Fine enough where it matters (is combining happening at all, does
# the batch reach its limit?), no cap to pick, and mergeable by HINCRBY like the time buckets.


def batch_bucket_of(size: int) -> int:
    return max(int(size) - 1, 0).bit_length()


def batch_bucket_label(b: int) -> str:
    """b2 -> "3-4"; b0 -> "1"."""
    lo, hi = (2 ** (b - 1) + 1 if b > 0 else 1), 2**b
    return str(hi) if lo == hi else f"{lo}-{hi}"


def batch_percentile(buckets: Mapping[int, int], q: float) -> int | None:
    """Upper bound (largest size) of the batch-size bucket holding the q-th quantile."""
    total = sum(buckets.values())
    if not total:
        return None
    seen = 0
    for b in sorted(buckets):
        seen += buckets[b]
        if seen >= q * total:
            return int(2**b)
    return int(2 ** max(buckets))
