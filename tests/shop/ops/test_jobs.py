"""The shop's scheduled jobs (shop/ops/jobs.py) as `manage.py run_jobs` runs them: real database and Redis."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from locks.models import JobRun
from shop.models import OutboxMail
from shop.services import pay_order, place_order
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_WHEN_IDLE = ["shop.send_mail", "shop.expire_unpaid", "shop.finish_refunds", "shop.clear_hidden_markers"]


def run_once(*jobs: str, verbosity: int = 1) -> str:
    out = io.StringIO()
    call_command("run_jobs", "--once", *[a for job in jobs for a in ("--job", job)], verbosity=verbosity, stdout=out)
    return out.getvalue()


def test_idle_ticks_print_nothing_and_are_recorded_as_idle(settings):
    """Issue 37: `./dev.sh run` shares its terminal with the dev server's mail, and 2-4 lines of
    "ok: sent 0" every 5 s drowned it. A tick with nothing to do says nothing."""
    out = run_once(*QUIET_WHEN_IDLE)
    assert out == "", out
    assert set(JobRun.objects.filter(job__in=QUIET_WHEN_IDLE).values_list("job", "outcome", "idle")) == {
        (job, "ok", True) for job in QUIET_WHEN_IDLE}


def test_a_tick_that_did_something_is_printed_and_kept(make_product, user, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    user.email = "buyer@example.com"
    user.save(update_fields=["email"])
    pay_order(order=order_of(place_order(user=user, lines=[(make_product(stock=3).pk, 1)])), actor="t")
    assert OutboxMail.objects.filter(status=OutboxMail.Status.PENDING).count() == 1
    out = run_once("shop.send_mail")
    assert "shop.send_mail tick" in out and "ok: sent 1, failed 0" in out, out
    run = JobRun.objects.get(job="shop.send_mail")
    assert (run.idle, run.detail) == (False, "sent 1, failed 0")
