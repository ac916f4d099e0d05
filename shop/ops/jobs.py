"""The shop's scheduled jobs, run exactly once per tick cluster-wide by `manage.py run_jobs`.

A tick that found nothing to do returns `jobs.Idle`: `run_jobs` does not print it (unless -v 2)
and its row is not kept, only counted (locks/jobs.py): most ticks of a 5-second job are idle."""

from __future__ import annotations

from locks import jobs
from shop.services.emails import prune_mail, send_pending_mail
from shop.services.inventory import clear_hidden_markers as clear_markers
from shop.services.orders import expire_unpaid, finish_refunds


def _said(count: int, what: str) -> str:
    """"expired 3 orders"; idle when the count is 0."""
    text = what.format(count)
    return text if count else jobs.Idle(text)


def expire_unpaid_orders(ctx: jobs.JobContext) -> str:
    """Give back the stock of orders left unpaid past pay_by. Not atomic: every order commits
    in its own transaction under its products' locks (the checkout rule), and the job checks it
    still holds its lease before each one."""
    return _said(expire_unpaid(check=ctx.check), "expired {} orders")


def finish_unfinished_refunds(ctx: jobs.JobContext) -> str:
    """Finish refunds left pending or sent once their worker's claim lapsed (a crash between the
    provider call and the books). Not atomic: the provider is called outside any transaction and
    each refund's books commit on their own, under its products' locks."""
    return _said(finish_refunds(check=ctx.check), "finished {} refunds")


def send_mail(ctx: jobs.JobContext) -> str:
    """Send the outbox's due mails (shop/services/emails.py). Not atomic: each mail is claimed
    and marked sent in its own autocommit UPDATE around its SMTP call, never in a transaction
    held open across it."""
    report = send_pending_mail(check=ctx.check)
    return str(report) if report.sent or report.failed else jobs.Idle(report)


def prune_old_mail(ctx: jobs.JobContext) -> str:
    """Delete outbox rows settled more than 30 days ago (they hold addresses)."""
    return _said(prune_mail(), "deleted {} mails")


def clear_hidden_markers(ctx: jobs.JobContext) -> str:
    """Hidden products answer as missing, never "sold out": a hide that could not take its
    product's lock (a sale's queue longer than LOCK_WAIT) left the marker; this clears it as soon
    as the lock can be had."""
    cleared, left = clear_markers(check=ctx.check)
    said = f"cleared {cleared} marker{'s' if cleared != 1 else ''} of hidden products" + (
        f", {left} still queued" if left else "")
    return said if cleared or left else jobs.Idle(said)


jobs.register("shop.expire_unpaid", expire_unpaid_orders, every=30, lease=60, atomic=False)
jobs.register("shop.finish_refunds", finish_unfinished_refunds, every=60, lease=120, atomic=False)
jobs.register("shop.send_mail", send_mail, every=5, lease=60, atomic=False)
jobs.register("shop.prune_mail", prune_old_mail, every=3600, lease=300)
jobs.register("shop.clear_hidden_markers", clear_hidden_markers, every=5, lease=60, atomic=False)
