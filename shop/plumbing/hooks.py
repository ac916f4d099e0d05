"""A test hook in the checkout: where tests and the fault-injection load test pause or kill a
lock holder. The checkout writer (writer.py: a combined batch or a batch of one) calls it at:
"before_update" (locks held, nothing written), "before_commit" (everything written, not
committed), "at_commit" (every check before COMMIT passed: the COMMIT is next) and
"after_commit" (committed, locks still held), with the holds by lock name; and
"before_sold_out_mark" (the stock was read as 0 under the product's lock, the sold-out marker is
not written yet: shop/plumbing/soldout.py), with no holds. A combiner (shop/checkout/combining.py)
calls it at "before_take" (its turn came, nothing taken yet), with its turn's hold.
"""

from __future__ import annotations

from collections.abc import Callable

checkout_hook: Callable[[str, dict], None] | None = None


def call(stage: str, holds: dict) -> None:
    if checkout_hook is not None:
        checkout_hook(stage, holds)
