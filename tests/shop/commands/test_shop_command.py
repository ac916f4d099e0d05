"""`manage.py shop`: the admin's operator actions from the command line, against the real database.

The same services as the admin (so the same refusals), the same audit rows with a "cli:" actor,
and the Sales view's figures from the same selector.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from locks.services import cli_actor_name
from shop.models import Order, Product, Refund, StockLedger
from shop.reads.selectors import product_sales
from shop.services import pay_order, place_order
from tests.config.test_settings import ROOT
from tests.helpers import order_of
from tests.shop.admin.test_admin import _sales_fixture

pytestmark = pytest.mark.django_db(transaction=True)

ME = f"cli:{cli_actor_name()}"


class _Terminal(io.StringIO):
    """A stdin that is a terminal, with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


def shop(*args: str, answer: str | None = None, monkeypatch=None) -> str:
    out = io.StringIO()
    if answer is not None:
        monkeypatch.setattr("sys.stdin", _Terminal(answer + "\n"))
    call_command("shop", *args, stdout=out)
    return out.getvalue()


def _paid(user, product, quantity: int = 2) -> Order:
    return pay_order(order=order_of(place_order(user=user, lines=[(product.pk, quantity)])), actor="test")


# --- restock -----------------------------------------------------------------------------------
def test_restock_adds_stock_under_the_lock_and_writes_the_ledger_row_with_the_actor(make_product):
    p = make_product(stock=0)
    out = shop("restock", str(p.pk), "25")
    p.refresh_from_db()
    assert p.stock == 25 and p.fence > 0  # written under the lock, fenced
    assert f"{p.name} ({p.sku}): +25, stock now 25." in out
    entry = StockLedger.objects.get(product=p)
    assert (entry.quantity, entry.reason, entry.actor) == (25, "restock", ME)

    shop("restock", p.sku, "5", "--actor", "ops-oncall")  # by SKU, with a name for the audit
    p.refresh_from_db()
    assert p.stock == 30
    assert StockLedger.objects.filter(product=p).order_by("id").last().actor == "cli:ops-oncall"


@pytest.mark.parametrize("quantity", ["0", "-3", "1000001"])
def test_restock_refuses_what_the_admin_refuses(make_product, quantity):
    p = make_product(stock=4)
    with pytest.raises(CommandError, match=r"Quantity must be a whole number from 1 to 1000000\."):
        shop("restock", str(p.pk), quantity)
    p.refresh_from_db()
    assert p.stock == 4 and not StockLedger.objects.filter(product=p).exists()


def test_restock_of_an_unknown_product_names_it(db):
    with pytest.raises(CommandError, match="No product 'NO-SUCH-SKU'"):
        shop("restock", "NO-SUCH-SKU", "5")
    with pytest.raises(CommandError, match="--actor: at most 146 characters"):
        shop("restock", "NO-SUCH-SKU", "5", "--actor", "x" * 147)


def test_restock_json(make_product):
    p = make_product(stock=2)
    data = json.loads(shop("restock", p.sku, "3", "--json"))
    assert data == {"product": {"id": p.pk, "sku": p.sku, "name": p.name, "active": True, "stock": 5}, "added": 3,
                    "actor": ME}


# --- adjust ------------------------------------------------------------------------------------
def test_adjust_removes_and_adds_with_a_reason_and_note_as_the_admin_does(make_product, user):
    p = make_product(stock=10)
    place_order(user=user, lines=[(p.pk, 4)])  # 6 left to sell, 4 reserved
    out = shop("adjust", p.sku, "-2", "--reason", "damaged", "--note", "wet cartons")
    assert f"{p.name} ({p.sku}): -2 (Damaged), stock 6 -> 4." in out
    entry = StockLedger.objects.get(product=p, order=None)
    assert (entry.quantity, entry.reason, entry.note, entry.actor) == (-2, "damaged", "wet cartons", ME)

    data = json.loads(shop("adjust", str(p.pk), "3", "--reason", "correction", "--json", "--actor", "counter"))
    assert data == {"product": {"id": p.pk, "sku": p.sku, "name": p.name, "active": True, "stock": 7}, "delta": 3,
                    "reason": "correction", "note": "", "before": 4, "after": 7, "actor": "cli:counter"}


def test_adjust_refuses_what_the_service_refuses_with_its_code(make_product, user):
    p = make_product(stock=5)
    place_order(user=user, lines=[(p.pk, 2)])
    with pytest.raises(CommandError, match=r"Only 3 left to sell: remove at most 3\. 2 more are reserved"):
        shop("adjust", p.sku, "-4", "--reason", "lost")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("shop", "adjust", p.sku, "5", "--reason", "damaged", "--json", stdout=out)
    assert json.loads(out.getvalue())["error"] == {
        "code": "invalid_adjustment_reason", "message": "'Damaged' cannot add units: give one of restock, correction.",
        "details": {"reason": "damaged", "allowed": ["restock", "correction"]}}
    with pytest.raises(CommandError, match="An adjustment must add or remove at least one unit"):
        shop("adjust", p.sku, "0", "--reason", "correction")
    with pytest.raises(CommandError, match="the following arguments are required: --reason"):
        shop("adjust", p.sku, "-1")
    p.refresh_from_db()
    assert p.stock == 3 and not StockLedger.objects.filter(product=p, order=None).exists()


# --- cancel and refund -------------------------------------------------------------------------
def test_cancel_asks_then_returns_the_stock_with_the_actor(make_product, user, monkeypatch):
    p = make_product(stock=5, price="129.00")
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    with pytest.raises(CommandError, match="not cancelled"):
        shop("cancel", str(order.pk), answer="n", monkeypatch=monkeypatch)
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT

    out = shop("cancel", str(order.pk), answer="y", monkeypatch=monkeypatch)
    assert f"Order #{order.pk} of {user.username} is awaiting payment: $258.00 (2 x {p.name})." in out
    assert f"Order #{order.pk} cancelled; stock and coupon returned." in out
    order.refresh_from_db()
    p.refresh_from_db()
    assert order.status == Order.Status.CANCELLED and p.stock == 5
    entry = StockLedger.objects.get(order=order, reason=StockLedger.Reason.CANCEL)
    assert (entry.quantity, entry.actor) == (2, ME)


def test_cancel_gives_the_buyer_the_reason_as_the_admin_does(make_product, user):
    from shop.models import OutboxMail

    user.email = "ann@example.com"
    user.save()
    order = order_of(place_order(user=user, lines=[(make_product(stock=5).pk, 1)]))
    shop("cancel", str(order.pk), "--yes", "--reason", "Duplicate order")
    mail = OutboxMail.objects.get(order=order, kind="order_cancelled")
    assert mail.context == {"by": "shop", "reason": "Duplicate order"}


def test_cancel_refuses_a_paid_order_as_the_admin_does(make_product, user):
    paid = _paid(user, make_product(stock=5))
    with pytest.raises(CommandError, match="This order is paid: refund it instead"):
        shop("cancel", str(paid.pk))  # no question for what the order's status does not allow
    paid.refresh_from_db()
    assert paid.status == Order.Status.PAID
    assert not StockLedger.objects.filter(order=paid, reason=StockLedger.Reason.CANCEL).exists()


def test_refund_pays_back_returns_the_stock_and_refuses_a_second_time(make_product, user):
    p = make_product(stock=5)
    paid = _paid(user, p)
    out = shop("refund", str(paid.pk), "--yes", "--actor", "finance")
    assert f"Order #{paid.pk} refunded; the payment goes back, stock and coupon returned." in out
    paid.refresh_from_db()
    p.refresh_from_db()
    assert paid.status == Order.Status.REFUNDED and p.stock == 5
    refund = Refund.objects.get(order=paid)
    assert (refund.status, refund.actor, refund.amount) == (Refund.Status.COMPLETED, "cli:finance", paid.total)
    assert StockLedger.objects.get(order=paid, reason=StockLedger.Reason.REFUND).actor == "cli:finance"

    with pytest.raises(CommandError, match=r"Only a paid order can be refunded, and only once\."):
        shop("refund", str(paid.pk), "--yes")
    assert Refund.objects.filter(order=paid).count() == 1


def test_refund_refuses_an_unpaid_order_and_an_unknown_one(make_product, user):
    pending = order_of(place_order(user=user, lines=[(make_product(stock=5).pk, 1)]))
    with pytest.raises(CommandError, match="Only a paid order can be refunded"):
        shop("refund", str(pending.pk), "--yes")
    pending.refresh_from_db()
    assert pending.status == Order.Status.PENDING_PAYMENT and not Refund.objects.exists()
    with pytest.raises(CommandError, match=r"No order #999999\."):
        shop("refund", "999999", "--yes")


def test_json_output_and_a_refusal_as_json(make_product, user):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    with pytest.raises(CommandError, match="needs --yes"):
        shop("cancel", str(order.pk), "--json")
    data = json.loads(shop("cancel", str(order.pk), "--json", "--yes"))
    assert data["order"] == {"id": order.pk, "user": user.username, "status": "cancelled", "total": "10.00",
                             "lines": [{"product_id": p.pk, "sku": p.sku, "quantity": 1}]}
    assert data["actor"] == ME
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("shop", "cancel", str(order.pk), "--json", "--yes", stdout=out)
    error = json.loads(out.getvalue())["error"]
    assert error["code"] == "order_not_cancellable" and error["details"]["status"] == "cancelled"


# --- sales -------------------------------------------------------------------------------------
def test_sales_shows_the_figures_of_the_admins_sales_view(make_product, make_coupon, user, other_user):
    a, b, c = _sales_fixture(make_product, make_coupon, user, other_user)
    data = json.loads(shop("sales", "--json", "--product", str(a.pk), b.sku, str(c.pk)))
    rows = {row["id"]: row for row in data["products"]}
    # What the orders say: A 2 paid (1 awaiting payment, 1 refunded), B 3 paid (1 cancelled), C 1 paid.
    # B and C were bought in one order with a $2 coupon ($24 of lines, paid $22): net revenue $13.75 and $8.25.
    assert [(rows[p.pk]["units_sold"], rows[p.pk]["revenue"], rows[p.pk]["units_per_minute"],
             rows[p.pk]["units_reserved"], rows[p.pk]["units_refunded"], rows[p.pk]["stock"]) for p in (a, b, c)] == [
        (2, "2500.00", "0.6", 1, 1, 17), (3, "13.75", "0.6", 0, 0, 3), (1, "8.25", "0.2", 0, 0, 0)]
    assert data["totals"] == {"products": 3, "stock": 20, "units_sold": 6, "revenue": "2522.00", "units_recent": 7,
                              "units_per_minute": "1.4", "units_reserved": 1, "units_refunded": 1,
                              "gross": "2524.00", "coupons": "2.00", "refunded": "1250.00", "units_paid_late": 0}
    assert data["rate_window_minutes"] == 5
    # ...and what the admin's selector says, row for row.
    for p in product_sales(products=Product.objects.filter(pk__in=[a.pk, b.pk, c.pk])):
        assert (rows[p.pk]["units_sold"], Decimal(rows[p.pk]["revenue"]), rows[p.pk]["units_recent"],
                rows[p.pk]["units_reserved"], rows[p.pk]["units_refunded"]) == (
            p.units_sold, p.revenue, p.units_recent, p.units_reserved, p.units_refunded)

    mine = ["--product", str(a.pk), str(b.pk), str(c.pk)]
    assert [r["id"] for r in json.loads(shop("sales", "--json", "--stock", "sold_out", *mine))["products"]] == [c.pk]
    assert [r["id"] for r in json.loads(shop("sales", "--json", "--stock", "low", *mine))["products"]] == [b.pk]
    table = shop("sales", *mine)
    assert "Sales by product (3)" in table and "$2,500.00" in table and "$13.75" in table
    total = next(line for line in table.splitlines() if line.lstrip().startswith("total"))
    assert total.split() == ["total", "20", "6", "0", "$2,524.00", "$2.00", "$2,522.00", "1.4", "1", "1",
                             "$1,250.00"], total
    assert "last 5 minutes" in table
    assert a.name in table and c.sku in table
    one = shop("sales", "--product", str(c.pk))  # a totals row for one product too
    assert [line.split() for line in one.splitlines() if line.lstrip().startswith("total")] == [
        ["total", "0", "1", "0", "$9.00", "$0.75", "$8.25", "0.2", "0", "0", "$0.00"]]
    assert "none" in shop("sales", "--stock", "in_stock", "--product", str(c.pk))
    with pytest.raises(CommandError, match="No product 'NOPE'"):
        shop("sales", "--product", str(a.pk), "NOPE")


def test_sales_says_each_products_state_in_a_column_of_its_own(make_product, user):
    """Issue 37: "(ended)", "(upcoming)", "(hidden)" were appended to the name and then cut off with
    it for names over ~20 characters."""
    from shop.services import end_drop, schedule_drop

    long = "A rather long product name for a drop"
    ended, upcoming, _hidden = (Product.objects.create(sku=f"LONG-{i}", name=f"{long} {i}", price="5.00", stock=3,
                                                      active=i != 3) for i in (1, 2, 3))
    end_drop(products=[ended], actor="t")
    schedule_drop(products=[upcoming], opens_at=timezone.now() + timedelta(days=1), closes_at=None, actor="t")
    table = shop("sales", "--product", "LONG-1", "LONG-2", "LONG-3")
    header = next(line for line in table.splitlines() if line.split()[:1] == ["id"])
    assert header.split()[:4] == ["id", "sku", "name", "state"], header
    rows = {line.split()[1]: line for line in table.splitlines() if line.split()[1:2] and
            line.split()[1].startswith("LONG-")}
    at = header.index("state")
    assert {sku: line[at:].split("  ")[0].strip() for sku, line in rows.items()} == {
        "LONG-1": "ended", "LONG-2": "upcoming", "LONG-3": "hidden, open"}
    data = json.loads(shop("sales", "--json", "--product", "LONG-1", "LONG-2", "LONG-3"))
    assert [(p["sku"], p["state"], p["drop"]) for p in data["products"]] == [
        ("LONG-1", "ended", "ended"), ("LONG-2", "upcoming", "upcoming"), ("LONG-3", "hidden, open", "open")]


# --- from a shell ------------------------------------------------------------------------------
def _manage_env(lock_key_prefix: str) -> dict[str, str]:
    """manage.py in a child process, on the test database."""
    from django.db import connection

    db = connection.settings_dict
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "LOCKS_KEY_PREFIX": lock_key_prefix,
            "DATABASE_URL": f"mysql://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}/{db['NAME']}"}


def test_exit_status_from_the_command_line(make_product, _lock_key_prefix):
    """manage.py itself: 0 after a restock, 1 and the service's message after a refusal."""
    p = make_product(stock=1)
    env = _manage_env(_lock_key_prefix)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "shop", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    done = run("restock", p.sku, "4")
    assert done.returncode == 0, done.stderr
    assert "stock now 5" in done.stdout
    p.refresh_from_db()
    assert p.stock == 5
    refused = run("restock", p.sku, "0")
    assert refused.returncode == 1
    assert "CommandError: Quantity must be a whole number from 1 to" in refused.stderr, refused.stderr
    removed = run("adjust", p.sku, "-5", "--reason", "lost", "--note", "shelf 4 empty")  # a negative argument
    assert removed.returncode == 0 and "stock 5 -> 0" in removed.stdout, removed.stderr
    too_many = run("adjust", p.sku, "-1", "--reason", "damaged")
    assert too_many.returncode == 1 and "CommandError: Only 0 left to sell" in too_many.stderr, too_many.stderr


def test_refund_without_a_terminal_asks_nothing_and_says_to_add_yes(make_product, user, _lock_key_prefix):
    """Run from a script (stdin not a terminal), the question once went out with no answer and the
    CommandError came glued to its "[y/N]": now no question, one clear line, nothing refunded."""
    paid = _paid(user, make_product(stock=5))
    done = subprocess.run([sys.executable, "manage.py", "shop", "refund", str(paid.pk)], cwd=ROOT,
                          env=_manage_env(_lock_key_prefix), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert "[y/N]" not in done.stdout, done.stdout
    error = [line for line in done.stdout.splitlines() if "CommandError" in line]
    assert error and error[0].startswith("CommandError: ") and "--yes" in error[0], done.stdout
    paid.refresh_from_db()
    assert paid.status == Order.Status.PAID and not Refund.objects.exists()
