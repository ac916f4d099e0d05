"""The shop's scheduled jobs, run exactly once per tick cluster-wide by `manage.py run_jobs`."""

from __future__ import annotations

from locks import jobs
from shop.services.inventory import clear_hidden_markers as clear_markers
from shop.services.orders import expire_unpaid


def expire_unpaid_orders(ctx: jobs.JobContext) -> str:
    """Give back the stock of orders left unpaid past pay_by. Not atomic: every order commits
    in its own transaction under its products' locks (the checkout rule), and the job checks it
    still holds its lease before each one."""
    return f"expired {expire_unpaid(check=ctx.check)} orders"


jobs.register("shop.expire_unpaid", expire_unpaid_orders, every=30, lease=60, atomic=False)


def clear_hidden_markers(ctx: jobs.JobContext) -> str:
    """Hidden products answer as missing, never "sold out": a hide that could not take its
    product's lock (a sale's queue longer than LOCK_WAIT) left the marker; this clears it as soon
    as the lock can be had."""
    cleared, left = clear_markers(check=ctx.check)
    return f"cleared {cleared} marker(s) of hidden products" + (f", {left} still queued" if left else "")


jobs.register("shop.clear_hidden_markers", clear_hidden_markers, every=5, lease=60, atomic=False)
