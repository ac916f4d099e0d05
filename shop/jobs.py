"""The shop's scheduled jobs, run exactly once per tick cluster-wide by `manage.py run_jobs`."""

from __future__ import annotations

from locks import jobs
from shop.services.orders import expire_unpaid


def expire_unpaid_orders(ctx: jobs.JobContext) -> str:
    """Give back the stock of orders left unpaid past pay_by. Not atomic: every order commits
    in its own transaction under its products' locks (the checkout rule), and the job checks it
    still holds its lease before each one."""
    return f"expired {expire_unpaid(check=ctx.check)} orders"


jobs.register("shop.expire_unpaid", expire_unpaid_orders, every=30, lease=60, atomic=False)
