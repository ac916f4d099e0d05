"""Mail: the order confirmation on payment (after the commit, never failing the
payment), the password reset through Django's views, the mail settings from the environment, and
`next` after sign-up checked like Django's login checks it."""

from __future__ import annotations

import io
import logging
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.core.management import call_command
from django.utils import timezone

from shop import errors
from shop.models import ApiToken, Order
from shop.services import pay_order, place_order
from tests.config.test_settings import start
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "a-long-pass-123"


class BrokenBackend(BaseEmailBackend):
    """An SMTP server that is down."""

    def send_messages(self, messages):
        raise ConnectionRefusedError("mail server down")


class StatusAtSendBackend(BaseEmailBackend):
    """Records the order's stored status at the moment its mail leaves."""

    seen: list[str] = []

    def send_messages(self, messages):
        for message in messages:
            number = int(re.search(r"#(\d+)", message.subject).group(1))
            StatusAtSendBackend.seen.append(Order.objects.get(pk=number).status)
        return len(messages)


@pytest.fixture
def buyer(db):
    return get_user_model().objects.create_user("ann", email="ann@example.com", password=PASSWORD)


def outbox(**filters) -> list:
    """The queued mails (shop.models.OutboxMail), oldest first."""
    from shop.models import OutboxMail

    return list(OutboxMail.objects.filter(**filters).order_by("pk"))


def send_mail_job() -> str:
    """One pass of the mail job through the jobs runner; its run's detail."""
    from locks.models import JobRun

    JobRun.objects.filter(job="shop.send_mail").delete()  # the same tick may run again
    call_command("run_jobs", "--once", "--job", "shop.send_mail", stdout=io.StringIO())
    run = JobRun.objects.filter(job="shop.send_mail").latest("pk")
    assert run.outcome == JobRun.OK, run.error
    return run.detail


def send_pending(**kwargs) -> int:
    from shop.services.emails import send_pending_mail

    return send_pending_mail(**kwargs).sent


def test_paying_queues_the_confirmation_and_the_job_sends_it_once(client, buyer, make_product):
    p = make_product(stock=9, price="1658.00")
    order = order_of(place_order(user=buyer, lines=[(p.pk, 2)]))
    client.force_login(buyer)
    assert client.post(f"/orders/{order.pk}/pay/").status_code == 302
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    assert mail.outbox == []  # no SMTP inside the Pay request (old code: sent here, synchronously)
    [queued] = outbox()
    assert (queued.kind, queued.order_id, queued.recipient, queued.status) == (
        "order_paid", order.pk, "ann@example.com", "pending")

    assert send_mail_job() == "sent 1, failed 0"
    assert len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["ann@example.com"] and f"#{order.pk}" in sent.subject
    assert "2 \u00d7 Product" in sent.body and "$3,316.00" in sent.body and f"/orders/{order.pk}/" in sent.body
    [queued] = outbox()
    assert queued.status == "sent" and queued.sent_at is not None and queued.attempts == 1

    assert send_pending() == 0 and send_mail_job() == "sent 0, failed 0"  # sent once
    pay_order(order=order, actor="test")  # a retried payment: already paid, nothing queued
    assert len(outbox()) == 1 and send_pending() == 0 and len(mail.outbox) == 1


def test_the_confirmation_leaves_after_the_payment_is_committed(buyer, make_product, settings):
    settings.EMAIL_BACKEND = f"{__name__}.StatusAtSendBackend"
    StatusAtSendBackend.seen = []
    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))
    pay_order(order=order, actor="test")
    assert StatusAtSendBackend.seen == []
    assert send_pending() == 1
    assert StatusAtSendBackend.seen == [Order.Status.PAID]


def test_a_failing_mail_server_leaves_the_mail_pending_and_a_later_run_sends_it(buyer, make_product, settings,
                                                                               caplog):
    settings.EMAIL_BACKEND = f"{__name__}.BrokenBackend"
    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))
    assert pay_order(order=order, actor="test").status == Order.Status.PAID  # the mail is not the payment's
    with caplog.at_level(logging.WARNING, logger="shop"):
        assert send_mail_job() == "sent 0, failed 1"
    [queued] = outbox()
    assert queued.status == "pending" and queued.attempts == 1 and "mail server down" in queued.last_error
    assert queued.next_attempt_at > timezone.now()  # backs off
    assert any(f"order {order.pk}" in r.getMessage() and "order_paid" in r.getMessage() for r in caplog.records)
    assert send_pending() == 0  # not due yet

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert send_pending(now=timezone.now() + timedelta(hours=2)) == 1
    assert [m.to for m in mail.outbox] == [["ann@example.com"]]
    [queued] = outbox()
    assert queued.status == "sent" and queued.attempts == 2


def test_a_mail_that_keeps_failing_is_given_up_after_its_attempts(buyer, make_product, settings, caplog):
    settings.EMAIL_BACKEND = f"{__name__}.BrokenBackend"
    settings.SHOP = {**settings.SHOP, "MAIL_ATTEMPTS": 3}
    pay_order(order=order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)])), actor="test")
    later = timezone.now()
    with caplog.at_level(logging.ERROR, logger="shop"):
        for _ in range(4):
            later += timedelta(days=1)
            send_pending(now=later)
    [queued] = outbox()
    assert (queued.status, queued.attempts) == ("failed", 3)
    assert any("gave up" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_the_mail_row_commits_with_the_payment_or_not_at_all(buyer, make_product, monkeypatch):
    from django.db import OperationalError

    from shop.services import emails

    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))

    def lost(**kwargs):
        raise OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(emails.OutboxMail.objects, "create", lost)
    with pytest.raises(errors.DatabaseUnavailable) as caught:
        pay_order(order=order, actor="test")
    assert caught.value.details == {"outcome": "not_written"}
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT  # the flip went with it
    monkeypatch.undo()
    pay_order(order=order, actor="test")
    assert len(outbox(order=order)) == 1


def test_no_address_no_mail_and_the_api_pays_with_the_same_service(user, make_product, client):
    order = order_of(place_order(user=user, lines=[(make_product(stock=3).pk, 1)]))  # `user` has no e-mail address
    pay_order(order=order, actor="test")
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID and outbox() == []
    user.email = "u@example.com"
    user.save(update_fields=["email"])
    second = order_of(place_order(user=user, lines=[(make_product(stock=3).pk, 1)]))
    token = ApiToken.issue(user_id=user.pk, name="test")
    response = client.post(f"/api/orders/{second.pk}/pay/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert mail.outbox == [] and [m.recipient for m in outbox()] == ["u@example.com"]
    assert send_pending() == 1
    assert [m.to for m in mail.outbox] == [["u@example.com"]]


def test_password_reset_through_djangos_views(client, buyer):
    page = client.get("/login/").content.decode()
    assert 'href="/password-reset/' in page
    assert client.get("/password-reset/").status_code == 200
    response = client.post("/password-reset/", {"email": "ann@example.com"})
    assert response.status_code == 302 and response["Location"].startswith("/password-reset/sent/")
    assert mail.outbox == []  # the job sends it (its token is made then)
    assert send_mail_job() == "sent 1, failed 0"
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["ann@example.com"]
    link = re.search(r"http://testserver(/password-reset/\S+/\S+/)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200 and "new_password1" in form.content.decode()
    done = client.post(form.redirect_chain[-1][0], {"new_password1": "brand-new-pass-789",
                                                     "new_password2": "brand-new-pass-789"})
    assert done.status_code == 302 and done["Location"] == "/password-reset/done/"
    assert "Log in" in client.get("/password-reset/done/").content.decode()
    buyer.refresh_from_db()
    assert buyer.check_password("brand-new-pass-789")


def _normalized(queries: list[dict], address: str) -> list[str]:
    """The request's SQL with the address and the times taken out: what work it did."""
    sql = [q["sql"].replace(address, "<address>") for q in queries]
    return [re.sub(r"'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?'", "<time>", q) for q in sql]


def test_password_reset_does_the_same_work_whether_or_not_the_address_has_an_account(client, buyer):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    answers, work = [], []
    for address in ("ann@example.com", "nobody@example.com"):
        with CaptureQueriesContext(connection) as queries:
            response = client.post("/password-reset/", {"email": address})
        answers.append((response.status_code, response["Location"]))
        work.append(_normalized(queries.captured_queries, address))
        assert mail.outbox == []  # no SMTP inside the request (old code: the known address's mail)
    assert answers[0] == answers[1] == (302, "/password-reset/sent/")
    assert work[0] == work[1], work

    assert send_pending() == 1  # the account's mail; nothing for the unknown address
    assert [m.to for m in mail.outbox] == [["ann@example.com"]]
    assert [(m.recipient, m.status) for m in outbox(kind="password_reset")] == [
        ("ann@example.com", "sent"), ("nobody@example.com", "skipped")]


def test_password_reset_for_an_unknown_address_looks_the_same_and_sends_nothing(client, buyer):
    response = client.post("/password-reset/", {"email": "nobody@example.com"})
    assert response.status_code == 302 and response["Location"].startswith("/password-reset/sent/")
    send_pending()
    assert mail.outbox == []


def test_password_reset_requests_are_rate_limited(client, buyer, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "RATE_LIMITS": {"password_reset": "2/h"}}
    for _ in range(2):
        assert client.post("/password-reset/", {"email": "ann@example.com"}).status_code == 302
    assert client.post("/password-reset/", {"email": "ann@example.com"}).status_code == 429
    send_pending()
    assert len(mail.outbox) == 2


@pytest.mark.parametrize("target,lands", [
    ("/checkout/", "/checkout/"),
    ("/products/7/", "/products/7/"),
    ("https://evil.example/steal", "/"),
    ("//evil.example/", "/"),
    ("", "/"),
])
def test_signup_and_login_go_back_to_a_safe_next(client, target, lands):
    page = client.get("/login/", {"next": target} if target else {}).content.decode()
    if lands != "/":  # the login page's Sign up link carries a safe next only
        assert f'href="/signup/?next={target.replace("/", "%2F")}"' in page
    response = client.post("/signup/" + (f"?next={target}" if target else ""), {
        "username": "returning", "email": "r@example.com", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 302 and response["Location"] == lands
    client.post("/logout/")
    response = client.post("/login/", {"username": "returning", "password": PASSWORD, "next": target})
    assert response.status_code == 302 and response["Location"] == lands


def test_signup_asks_for_an_optional_email(client):
    page = client.get("/signup/").content.decode()
    assert 'name="email"' in page
    client.post("/signup/", {"username": "nomail", "password1": PASSWORD, "password2": PASSWORD})
    assert get_user_model().objects.get(username="nomail").email == ""


# --- mail settings from the environment -----------------------------------------------------------
MAIL = ("settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS, "
        "settings.DEFAULT_FROM_EMAIL")


def test_mail_goes_to_the_console_in_development():
    result = start(MAIL, DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "django.core.mail.backends.console.EmailBackend"


def test_smtp_from_email_url():
    result = start(MAIL, DEBUG="true", EMAIL_URL="smtp+tls://shop%40example.com:pw@mail.example.com:587",
                   DEFAULT_FROM_EMAIL="Flash sale <shop@example.com>")
    assert result.returncode == 0, result.stderr
    backend, host, port, tls, *sender = result.stdout.split()
    assert (backend, host, port, tls) == ("django.core.mail.backends.smtp.EmailBackend", "mail.example.com", "587",
                                          "True")
    assert " ".join(sender) == "Flash sale <shop@example.com>"


def test_smtp_from_email_variables_in_production():
    result = start(MAIL, SECRET_KEY="k" * 50, EMAIL_HOST="smtp.example.com", EMAIL_PORT="2525", EMAIL_USE_TLS="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:4] == ["django.core.mail.backends.smtp.EmailBackend", "smtp.example.com", "2525",
                                         "True"]


def test_a_bad_email_url_is_refused_at_start():
    result = start(MAIL, DEBUG="true", EMAIL_URL="http://mail.example.com")
    assert result.returncode != 0 and "EMAIL_URL" in result.stderr


def test_staff_see_the_outbox_in_the_admin(admin_client, buyer, make_product, settings):
    settings.EMAIL_BACKEND = f"{__name__}.BrokenBackend"
    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))
    pay_order(order=order, actor="test")
    send_pending()
    page = admin_client.get("/admin/shop/outboxmail/").content.decode()
    assert "ann@example.com" in page and "Order paid" in page and "Pending" in page
    [queued] = outbox()
    detail = admin_client.get(f"/admin/shop/outboxmail/{queued.pk}/change/").content.decode()
    assert "mail server down" in detail


def test_settled_mail_is_pruned_after_30_days_and_pending_mail_never(buyer, make_product):
    from shop.models import OutboxMail
    from shop.services.emails import prune_mail

    for status in ("sent", "skipped", "failed", "pending"):
        OutboxMail.objects.create(kind="password_reset", recipient="x@example.com", status=status)
    assert prune_mail() == 0
    assert prune_mail(now=timezone.now() + timedelta(days=31)) == 3
    assert [m.status for m in outbox()] == ["pending"]


# --- the buyer hears when an order gives its stock back: refunded, cancelled, not paid in time ----
def _refunded(order: Order, *, again: bool = False) -> None:
    from shop.services import refund_order

    if not again:
        pay_order(order=order, actor="test")
    refund_order(order=order, actor="staff:test")


def _cancelled(order: Order, *, again: bool = False) -> None:
    from shop.services import cancel_order

    cancel_order(order=order, actor="test", unpaid_only=True)


def _expired(order: Order, *, again: bool = False) -> None:
    from shop.services import expire_unpaid

    if expire_unpaid(now=order.pay_by + timedelta(seconds=1)) != 1:
        raise errors.OrderNotCancellable("nothing expired")


@pytest.mark.parametrize(("end", "kind", "subject", "says"), [
    (_refunded, "order_refunded", "Order #{pk} is refunded: $3,316.00",
     r"we refunded \$3,316\.00 for order #{pk} on \d{1,2} \w{3} \d{4}, \d\d:\d\d UTC\."),
    (_cancelled, "order_cancelled", "Order #{pk} is cancelled",
     r"you cancelled order #{pk} on \d{1,2} \w{3} \d{4}, \d\d:\d\d UTC: its items went back on sale\.\n"
     r"Nothing was charged\."),
    (_expired, "order_expired", "Order #{pk} was not paid in time",
     r"order #{pk} was not paid by \d{1,2} \w{3} \d{4}, \d\d:\d\d UTC, so it was released on "
     r"\d{1,2} \w{3} \d{4}, \d\d:\d\d UTC:\nits items went back on sale and nothing was charged\."),
])
def test_a_refund_a_cancellation_and_an_expiry_each_mail_the_buyer_once(buyer, make_product, make_coupon, end,
                                                                      kind, subject, says):
    from shop.services import claim_coupon, expire_unpaid

    p = make_product(stock=9, price="1663.00")
    coupon = make_coupon(discount="10.00")
    claim_coupon(user=buyer, code=coupon.code)
    order = order_of(place_order(user=buyer, lines=[(p.pk, 2)], coupon_code=coupon.code))
    end(order)
    order.refresh_from_db()
    mails = [m for m in outbox(order=order) if m.kind != "order_paid"]
    assert [(m.kind, m.recipient, m.status) for m in mails] == [(kind, "ann@example.com", "pending")]

    assert send_mail_job().startswith(f"sent {2 if kind == 'order_refunded' else 1}, failed 0")
    sent = mail.outbox[-1]
    assert sent.to == ["ann@example.com"] and sent.subject == subject.format(pk=order.pk)
    assert re.search(says.replace("{pk}", str(order.pk)), sent.body), sent.body
    assert "2 \u00d7 Product" in sent.body and f"Coupon {coupon.code} is yours again" in sent.body
    assert f"http://127.0.0.1:8000/orders/{order.pk}/" in sent.body  # SITE_URL (PORT unset: 8000)

    # Exactly once: a second try is refused (the expirer finds nothing due) and queues nothing.
    with pytest.raises(errors.ShopError):
        end(order, again=True)
    assert expire_unpaid(now=timezone.now() + timedelta(days=1)) == 0
    assert len([m for m in outbox(order=order) if m.kind == kind]) == 1
    assert send_pending() == 0


def test_a_paid_order_cancelled_before_refunds_existed_is_not_said_to_be_free(buyer, make_product):
    """An order staff cancelled after it was paid, before refunds existed, keeps its payment on
    record: its mail does not say that nothing was charged."""
    from shop.models import OutboxMail
    from shop.services.emails import queue_order_mail

    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))
    Order.objects.filter(pk=order.pk).update(status=Order.Status.CANCELLED, paid_at=timezone.now(),
                                             cancelled_at=timezone.now())
    queue_order_mail(kind=OutboxMail.Kind.ORDER_CANCELLED, order_id=order.pk)
    assert send_pending() == 1
    assert "was cancelled on" in mail.outbox[0].body and "Nothing was charged" not in mail.outbox[0].body


def test_the_mail_commits_with_the_cancellation_or_not_at_all(buyer, make_product, monkeypatch):
    """Queued inside the transaction that flips the order and returns its stock: a failure to
    queue it leaves the order as it was, and no cancellation goes without its mail."""
    from shop.models import OutboxMail, Product
    from shop.services import cancel_order, emails

    p = make_product(stock=3)
    order = order_of(place_order(user=buyer, lines=[(p.pk, 2)]))
    real = OutboxMail.objects.create

    def refused(**kwargs):
        raise RuntimeError("the outbox refused the row")

    monkeypatch.setattr(emails.OutboxMail.objects, "create", refused)
    with pytest.raises(RuntimeError):
        cancel_order(order=order, actor="test", unpaid_only=True)
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
    assert Product.objects.get(pk=p.pk).stock == 1 and outbox() == []  # the stock did not come back either
    monkeypatch.setattr(emails.OutboxMail.objects, "create", real)
    cancel_order(order=order, actor="test", unpaid_only=True)
    assert Product.objects.get(pk=p.pk).stock == 3 and [m.kind for m in outbox()] == ["order_cancelled"]


def test_a_buyer_without_an_address_gets_no_mail_and_the_order_still_goes_back(user, make_product):
    from shop.services import cancel_order

    order = order_of(place_order(user=user, lines=[(make_product(stock=3).pk, 1)]))  # no e-mail address
    assert cancel_order(order=order, actor="test").status == Order.Status.CANCELLED and outbox() == []


# --- SITE_URL: the links of mail sent by a job follow the dev server's port --------------------
SITE_URL = "settings.SITE_URL"


def test_site_url_follows_the_dev_servers_port_unless_set():
    assert start(SITE_URL, DEBUG="true").stdout.split() == ["http://127.0.0.1:8000"]
    assert start(SITE_URL, DEBUG="true", PORT="8765").stdout.split() == ["http://127.0.0.1:8765"]
    explicit = start(SITE_URL, DEBUG="true", PORT="8765", SITE_URL="https://shop.example.com/")
    assert explicit.stdout.split() == ["https://shop.example.com"], explicit.stderr


def test_a_port_that_is_not_one_is_refused_at_start_naming_it():
    result = start(SITE_URL, DEBUG="true", PORT="80a")
    assert result.returncode != 0
    assert "ImproperlyConfigured: PORT='80a': a port number (1-65535)" in result.stderr, result.stderr


def test_the_mail_job_of_a_server_on_another_port_links_to_that_port(buyer, make_product, _lock_key_prefix):
    """What `PORT=8765 ./dev.sh run` starts beside the server: `manage.py run_jobs`, in its own
    process with no request to learn the port from, PORT in its environment."""
    import os
    import subprocess
    import sys

    from django.db import connection

    from tests.config.test_settings import ROOT

    order = order_of(place_order(user=buyer, lines=[(make_product(stock=3).pk, 1)]))
    pay_order(order=order, actor="test")
    db = connection.settings_dict
    env = {**{k: v for k, v in os.environ.items() if k != "SITE_URL"},
           "DJANGO_SETTINGS_MODULE": "tests.settings", "LOCKS_KEY_PREFIX": _lock_key_prefix, "PORT": "8765",
           "DEBUG": "true", "EMAIL_URL": "consolemail://",
           "DATABASE_URL": f"mysql://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}/{db['NAME']}"}
    result = subprocess.run([sys.executable, "manage.py", "run_jobs", "--once", "--job", "shop.send_mail"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"Your order: http://127.0.0.1:8765/orders/{order.pk}/" in result.stdout, result.stdout + result.stderr


def test_check_deploy_warns_of_a_site_url_that_points_at_the_server_itself():
    import subprocess
    import sys

    from tests.config.test_settings import ROOT

    def check(**env: str) -> str:
        import os

        clean = {k: v for k, v in os.environ.items() if k not in {"SITE_URL", "PORT", "DEBUG", "DEV_ENV_FILE"}}
        result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--tag", "security"], cwd=ROOT,
                                env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "k" * 50,
                                     "DEV_ENV_FILE": "", **env},
                                capture_output=True, text=True, timeout=120)
        return result.stdout + result.stderr

    assert "shop.W003" in check() and "SITE_URL is http://127.0.0.1:8000" in check()
    assert "shop.W003" not in check(SITE_URL="https://shop.example.com")
    assert "shop.W003" not in check(DEBUG="true")  # a developer's laptop


# --- issue 37: the reservation, a staff cancel's reason, an ended drop's expiry -------------------
def test_a_reserved_order_is_mailed_its_pay_by_time_and_link_once(buyer, make_product):
    p = make_product(stock=9, price="20.00")
    order = order_of(place_order(user=buyer, lines=[(p.pk, 2)]))
    paid_at_once = order_of(place_order(user=buyer, lines=[(p.pk, 1)]))
    pay_order(order=paid_at_once, actor="test")  # paid before the job ran: no reminder to pay
    assert send_mail_job() == "sent 2, failed 0"  # the reservation of one, the payment of the other
    reserved = [m for m in mail.outbox if "reserved" in m.subject]
    assert len(reserved) == 1 and f"#{order.pk}" in reserved[0].subject
    pay_by = timezone.localtime(order.pay_by)
    assert pay_by.strftime("%H:%M") in reserved[0].subject
    body = reserved[0].body
    assert f"http://127.0.0.1:8000/orders/{order.pk}/" in body and "2 \u00d7 Product" in body
    assert f"{pay_by.day} {pay_by:%b %Y, %H:%M} UTC" in body and "released" in body
    assert [(m.kind, m.order_id) for m in outbox(kind="order_reserved")] == [("order_reserved", order.pk)]
    assert send_mail_job() == "sent 0, failed 0"  # once


def test_a_staff_cancel_tells_the_buyer_why_and_the_buyers_own_does_not_sound_like_it(
        buyer, make_product, admin_client):
    from shop.services import cancel_order

    p = make_product(stock=9)
    staff, own = (order_of(place_order(user=buyer, lines=[(p.pk, 1)])) for _ in range(2))
    too_long = "x" * 501
    with pytest.raises(errors.InvalidInput):
        cancel_order(order=staff, actor="admin:root", reason=too_long)
    assert Order.objects.get(pk=staff.pk).status == Order.Status.PENDING_PAYMENT and outbox() == []
    form = admin_client.get(f"/admin/shop/order/{staff.pk}/cancel/").content.decode()
    assert 'name="reason"' in form
    admin_client.post(f"/admin/shop/order/{staff.pk}/cancel/", {"reason": "We cannot ship to your address."})
    assert Order.objects.get(pk=staff.pk).status == Order.Status.CANCELLED
    cancel_order(order=own, actor=f"user:{buyer.pk}", unpaid_only=True)
    assert send_mail_job().startswith("sent 2,")
    by_staff = next(m.body for m in mail.outbox if f"#{staff.pk} " in m.subject)
    by_buyer = next(m.body for m in mail.outbox if f"#{own.pk} " in m.subject)
    assert "we cancelled your order" in by_staff.lower() and "We cannot ship to your address." in by_staff
    assert "you cancelled order" in by_buyer and "we cancelled" not in by_buyer.lower()


def test_the_expiry_of_an_order_whose_drop_ended_does_not_say_its_items_are_back_on_sale(buyer, make_product):
    from shop.models import Product
    from shop.services import expire_unpaid

    ended, running = make_product(stock=9), make_product(stock=9)
    order = order_of(place_order(user=buyer, lines=[(ended.pk, 1), (running.pk, 1)]))
    only_ended = order_of(place_order(user=buyer, lines=[(ended.pk, 2)]))
    Product.objects.filter(pk=ended.pk).update(opens_at=timezone.now() - timedelta(hours=1),
                                               closes_at=timezone.now())
    assert expire_unpaid(now=order.pay_by + timedelta(seconds=1)) == 2
    send_mail_job()
    mixed = next(m.body for m in mail.outbox if f"#{order.pk} " in m.subject and "not paid" in m.subject)
    gone = next(m.body for m in mail.outbox if f"#{only_ended.pk} " in m.subject and "not paid" in m.subject)
    assert "went back on sale" not in gone and "sale has ended" in gone and "Still want them?" not in gone
    assert f"{ended.name}: its sale has ended" in mixed and "Still want them?" in mixed
