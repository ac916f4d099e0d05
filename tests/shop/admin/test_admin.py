"""The shop in the admin: counters move only through the services, under the same locks."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from locks import Lock
from shop.models import Coupon, Order, Product, StockLedger
from shop.services import place_order
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_changelists_render_with_the_live_lock_column(admin_client, make_product, make_coupon):
    p = make_product(stock=4)
    make_coupon()
    with Lock(f"product:{p.pk}", ttl=10.0):
        page = admin_client.get("/admin/shop/product/").content.decode()
        assert "held · " in page
    assert "free" in admin_client.get("/admin/shop/product/").content.decode()
    for url in ("/admin/shop/coupon/", "/admin/shop/order/", "/admin/shop/couponclaim/", "/admin/shop/stockledger/",
                "/admin/shop/apitoken/", "/admin/"):
        assert admin_client.get(url).status_code == 200, url


def test_restock_goes_through_the_service(admin_client, make_product):
    p = make_product(stock=0)
    assert admin_client.get(f"/admin/shop/product/{p.pk}/restock/").status_code == 200
    response = admin_client.post(f"/admin/shop/product/{p.pk}/restock/", {"quantity": 25})
    assert response.status_code == 302
    p.refresh_from_db()
    assert p.stock == 25 and p.fence > 0  # written under the lock, fenced
    entry = StockLedger.objects.get(product=p)
    assert (entry.quantity, entry.reason, entry.actor) == (25, "restock", "admin:root")
    bad = admin_client.post(f"/admin/shop/product/{p.pk}/restock/", {"quantity": -3})
    assert bad.status_code == 200 and StockLedger.objects.count() == 1


def test_saving_the_change_form_never_writes_back_an_old_stock(admin_client, make_product, user):
    p = make_product(stock=10)
    form = admin_client.get(f"/admin/shop/product/{p.pk}/change/")
    assert form.status_code == 200
    place_order(user=user, lines=[(p.pk, 3)])  # stock moves while the operator edits
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/", {
        "sku": p.sku, "name": "Renamed", "description": "", "price": "10.00", "active": "on", "stock": 10,
        "line_prequeue_seconds": "0", "line_order": "shuffle",
    })
    assert response.status_code == 302
    p.refresh_from_db()
    assert (p.name, p.stock) == ("Renamed", 7)


def test_cancel_order_goes_through_the_service(admin_client, make_product, user):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    assert "Cancel order" in admin_client.get(f"/admin/shop/order/{order.pk}/cancel/").content.decode()
    assert admin_client.post(f"/admin/shop/order/{order.pk}/cancel/").status_code == 302
    order.refresh_from_db()
    p.refresh_from_db()
    assert order.status == Order.Status.CANCELLED and p.stock == 5
    again = admin_client.post(f"/admin/shop/order/{order.pk}/cancel/", follow=True)
    assert "cannot be cancelled" in again.content.decode()
    p.refresh_from_db()
    assert p.stock == 5


def test_ledger_and_claims_are_read_only(admin_client, make_product, user):
    p = make_product(stock=5)
    place_order(user=user, lines=[(p.pk, 1)])
    entry = StockLedger.objects.get()
    assert admin_client.get("/admin/shop/stockledger/add/").status_code == 403
    assert admin_client.post(f"/admin/shop/stockledger/{entry.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/shop/order/add/").status_code == 403


def test_staff_without_permissions_cannot_restock(make_product):
    p = make_product(stock=1)
    staff = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.post(f"/admin/shop/product/{p.pk}/restock/", {"quantity": 5}).status_code == 403
    p.refresh_from_db()
    assert p.stock == 1
    assert Client().get(f"/admin/shop/product/{p.pk}/restock/").status_code == 302  # to the login


def test_adjust_stock_asks_with_before_and_after_then_goes_through_the_service(admin_client, make_product, user):
    p = make_product(stock=10)
    place_order(user=user, lines=[(p.pk, 3)])  # 7 left to sell, 3 reserved
    url = f"/admin/shop/product/{p.pk}/adjust/"
    form = admin_client.get(url).content.decode()
    assert "<strong>7</strong> left to sell; 3 more reserved by orders awaiting payment" in form
    assert '<option value="damaged">Damaged: removes</option>' in form
    asked = admin_client.post(url, {"delta": -2, "reason": "damaged", "note": "crushed box"})
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Stock <strong>7 → 5</strong>" in page and "-2 (Damaged), “crushed box”" in page
    assert 'name="confirm"' in page and "Yes, adjust the stock" in page
    assert not StockLedger.objects.filter(product=p, order=None).exists()  # nothing written before confirming

    done = admin_client.post(url, {"delta": -2, "reason": "damaged", "note": "crushed box", "confirm": "1",
                                   "confirmation": _confirmation(page)}, follow=True)
    assert "Product" in done.content.decode() and "-2 (Damaged), stock 7 → 5." in done.content.decode()
    p.refresh_from_db()
    assert p.stock == 5 and p.fence > 0
    entry = StockLedger.objects.get(product=p, order=None)
    assert (entry.quantity, entry.reason, entry.note, entry.actor) == (-2, "damaged", "crushed box", "admin:root")
    ledger = admin_client.get("/admin/shop/stockledger/?q=crushed").content.decode()
    assert "crushed box" in ledger and "Damaged" in ledger  # the ledger list shows (and finds) the note


def _confirmation(page: str) -> str:
    """The one-time token of an adjustment's confirmation page."""
    return re.search(r'name="confirmation" value="([0-9a-f]{32})"', page).group(1)


def test_a_double_submitted_adjustment_is_applied_once(admin_client, make_product):
    """Refunds are idempotent; an adjustment's confirmation is too: it carries a one-time token,
    and the second submission of the same page (a double click, a reload) changes nothing."""
    p = make_product(stock=10)
    url = f"/admin/shop/product/{p.pk}/adjust/"
    asked = admin_client.post(url, {"delta": -2, "reason": "damaged"}).content.decode()
    confirm = {"delta": -2, "reason": "damaged", "note": "", "confirm": "1", "confirmation": _confirmation(asked)}
    first = admin_client.post(url, confirm, follow=True).content.decode()
    again = admin_client.post(url, confirm, follow=True).content.decode()
    assert "-2 (Damaged), stock 10 → 8." in first
    assert "This adjustment was applied already" in again and "nothing was changed again" in again
    p.refresh_from_db()
    assert p.stock == 8 and StockLedger.objects.filter(product=p).count() == 1
    asked_again = admin_client.post(url, {"delta": -2, "reason": "damaged"}).content.decode()
    assert _confirmation(asked_again) != confirm["confirmation"]  # a new page, a new token


def test_a_confirmation_without_its_token_asks_again(admin_client, make_product):
    p = make_product(stock=10)
    page = admin_client.post(f"/admin/shop/product/{p.pk}/adjust/",
                             {"delta": -2, "reason": "damaged", "confirm": "1"}).content.decode()
    assert "Yes, adjust the stock" in page and _confirmation(page)
    p.refresh_from_db()
    assert p.stock == 10 and not StockLedger.objects.exists()


@pytest.mark.parametrize(("delta", "reason", "red"), [(-2, "damaged", True), (4, "restock", False)])
def test_removing_units_is_confirmed_with_the_red_button(admin_client, make_product, delta, reason, red):
    """Units taken away cannot be sold: its confirm looks like refund's and force release's (the
    admin's delete confirmation), not like the harmless "No, change it" beside it."""
    p = make_product(stock=10)
    page = admin_client.post(f"/admin/shop/product/{p.pk}/adjust/", {"delta": delta, "reason": reason}).content.decode()
    form = page[page.index('name="confirm"'):]
    assert ('<div class="delete-confirmation">' in page[:page.index('name="confirm"')]) is red
    assert "Yes, adjust the stock" in form


@pytest.mark.parametrize(("data", "message"), [
    ({"delta": 3, "reason": "damaged"}, "&#x27;Damaged&#x27; cannot add units: give one of restock, correction."),
    ({"delta": 0, "reason": "correction"}, "An adjustment must add or remove at least one unit."),
    ({"delta": -6, "reason": "lost", "confirm": "1"}, "Only 5 left to sell: remove at most 5."),
    ({"delta": 2_000_000, "reason": "restock", "confirm": "1"}, "from -1000000 to 1000000"),
])
def test_a_refused_adjustment_says_why_and_writes_nothing(admin_client, make_product, data, message):
    p = make_product(stock=5)
    if "confirm" in data:
        unconfirmed = {k: v for k, v in data.items() if k != "confirm"}
        asked = admin_client.post(f"/admin/shop/product/{p.pk}/adjust/", unconfirmed).content.decode()
        data = {**data, "confirmation": _confirmation(asked)} if 'name="confirmation"' in asked else data
    page = admin_client.post(f"/admin/shop/product/{p.pk}/adjust/", data)
    assert page.status_code == 200 and message in page.content.decode()
    assert "Yes, adjust the stock" not in page.content.decode()
    p.refresh_from_db()
    assert (p.stock, p.fence) == (5, 0) and not StockLedger.objects.exists()


def test_the_product_list_and_page_offer_adjust_stock(admin_client, make_product):
    p = make_product(stock=1)
    page = admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    assert f'href="/admin/shop/product/{p.pk}/adjust/"' in page and "Adjust stock…" in page
    listed = admin_client.get("/admin/shop/product/").content.decode()
    assert f'href="/admin/shop/product/{p.pk}/adjust/"' in listed and f'/admin/shop/product/{p.pk}/restock/' in listed


# --- every admin action declares the permission it needs ----------------------------------------
def _staff_with(*codenames: str):
    from django.contrib.auth.models import Permission

    staff = get_user_model().objects.create_user(f"staff-{'-'.join(codenames) or 'none'}", password="pw",
                                                 is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return get_user_model().objects.get(pk=staff.pk)  # fresh: no cached permissions


def test_a_view_only_staff_user_cannot_revoke_tokens(user, other_user):
    from shop.models import ApiToken

    tokens = [ApiToken.issue(user_id=u.pk, name="t") for u in (user, other_user)]
    ids = [str(t.pk) for t in ApiToken.objects.all()]
    viewer = Client()
    viewer.force_login(_staff_with("view_apitoken"))
    page = viewer.get("/admin/shop/apitoken/")
    assert page.status_code == 200 and "revoke_tokens" not in page.content.decode()
    response = viewer.post("/admin/shop/apitoken/", {"action": "revoke_tokens", "_selected_action": ids})
    assert response.status_code in (200, 302)
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    from shop.api.tokens import user_for_token

    assert all(user_for_token(raw) for raw in tokens)  # still valid
    editor = Client()
    editor.force_login(_staff_with("view_apitoken", "change_apitoken"))
    assert "revoke_tokens" in editor.get("/admin/shop/apitoken/").content.decode()
    done = editor.post("/admin/shop/apitoken/", {"action": "revoke_tokens", "_selected_action": ids}, follow=True)
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 2
    assert "Revoked 2 tokens." in done.content.decode()  # not "token(s)"


def test_every_shop_and_locks_admin_action_declares_its_permission_and_view_only_staff_get_none(rf):
    from django.contrib import admin

    superuser = get_user_model().objects.create_superuser("su", "su@example.com", "pw")
    checked = 0
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("shop", "locks"):
            continue
        request = rf.get("/admin/")
        request.user = superuser
        for name, (func, _, _) in model_admin.get_actions(request).items():
            where = f"{type(model_admin).__name__}.{name}"
            assert getattr(func, "allowed_permissions", ()), f"{where} declares no permission"
            checked += 1
        request.user = _staff_with(f"view_{model._meta.model_name}")
        assert model_admin.get_actions(request) == {}, type(model_admin).__name__
    assert checked >= 1  # revoke_tokens at least


@pytest.mark.parametrize("code", ["A/B", "50%", "x#y", "with space", "-LEADING", "ünï"])
def test_coupon_codes_must_be_slug_like(admin_client, code):
    from django.core.exceptions import ValidationError

    from shop.models import Coupon

    with pytest.raises(ValidationError) as refused:
        Coupon(code=code, discount="1.00", total=5, remaining=5).full_clean()
    assert "code" in refused.value.message_dict
    response = admin_client.post("/admin/shop/coupon/add/", {"code": code, "discount": "1.00", "total": 5,
                                                             "active": "on"})
    assert response.status_code == 200 and "letters, digits" in response.content.decode()
    assert not Coupon.objects.exists()
    ok = admin_client.post("/admin/shop/coupon/add/", {"code": "SPRING_10-B", "discount": "1.00", "total": 5,
                                                       "active": "on"})
    assert ok.status_code == 302 and Coupon.objects.get().code == "SPRING_10-B"


# --- the order page is read-only; Restock and Cancel on the object pages -------------------------
def test_the_order_page_is_read_only_labels_its_lines_and_offers_cancel(admin_client, make_product, user):
    p = make_product(stock=5, price="129.00")
    p.name = "Limited sneaker drop"
    p.save(update_fields=["name"])
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    page = admin_client.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    line = re.search(r'<tr class="form-row has_original".*?</tr>', page, re.S).group()
    cells = [re.sub(r"<[^>]+>|\s+", " ", cell).strip()
             for cell in re.findall(r'<td class="field-[^"]*">(.*?)</td>', line, re.S)]
    assert cells == [f"Limited sneaker drop ({p.sku})", "2", "$129.00"]  # the shop's money format
    assert "OrderLine object" not in page and "2 x" not in page  # no caption repeating the columns
    assert 'name="_save"' not in page and 'name="_continue"' not in page  # no Save buttons
    cancel = f"/admin/shop/order/{order.pk}/cancel/"
    assert f'href="{cancel}"' in page and "Cancel order…" in page
    posted = admin_client.post(f"/admin/shop/order/{order.pk}/change/", {"status": "paid"})
    assert posted.status_code == 403
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert admin_client.post(cancel).status_code == 302  # the object tool's view still works
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    assert cancel not in admin_client.get(f"/admin/shop/order/{order.pk}/change/").content.decode()  # nothing to cancel


def test_the_order_page_shows_each_amount_once_as_money(admin_client, make_product, make_coupon, user):
    """Subtotal, Discount, Total and a line's Unit price, each once and formatted: not also raw
    (Django added the model fields beside the *_money ones)."""
    from shop.services import claim_coupon

    p = make_product(stock=5, price="1658.00")
    coupon = make_coupon(discount="15.00")
    claim_coupon(user=user, code=coupon.code)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)], coupon_code=coupon.code))
    page = admin_client.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    labels = re.findall(r"<label[^>]*>([^<]+):</label>", page)
    for label in ("Subtotal", "Discount", "Total"):
        assert labels.count(label) == 1, labels
    assert re.findall(r'<th class="column-[^"]*">\s*Unit price', page) and page.count(">Unit price") == 1
    for money, raw in (("$3,316.00", "3316.00"), ("$15.00", "15.00"), ("$3,301.00", "3301.00"),
                       ("$1,658.00", "1658.00")):
        assert page.count(money) == 1, money
        assert raw not in page.replace(money, ""), raw


def test_the_product_form_leaves_the_internal_fence_out(admin_client, make_product):
    """The fence is the lock's business (the stock ledger and the lock dashboard show fences):
    neither the change form nor the add form shows it to the operator."""
    p = make_product(stock=3)
    Product.objects.filter(pk=p.pk).update(fence=1795729126554934)
    for url in (f"/admin/shop/product/{p.pk}/change/", "/admin/shop/product/add/"):
        page = admin_client.get(url).content.decode()
        assert "field-fence" not in page and "Fence" not in page and "1795729126554934" not in page, url
        assert "field-stock" in page and "field-name" in page, url  # the form itself is all there


def test_the_coupon_form_leaves_the_internal_fence_out(admin_client, make_coupon):
    coupon = make_coupon()
    Coupon.objects.filter(pk=coupon.pk).update(fence=1795729126554934)
    for url in (f"/admin/shop/coupon/{coupon.pk}/change/", "/admin/shop/coupon/add/"):
        page = admin_client.get(url).content.decode()
        assert "field-fence" not in page and "Fence" not in page and "1795729126554934" not in page, url
        assert "field-code" in page, url


def test_the_product_page_offers_restock(admin_client, make_product):
    p = make_product(stock=1)
    page = admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    assert f'href="/admin/shop/product/{p.pk}/restock/"' in page and "Restock…" in page
    assert 'name="_save"' in page  # products stay editable (name, price, ...)


def test_view_only_staff_see_no_restock_or_cancel_and_cannot_trigger_them(make_product, user):
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    viewer = Client()
    viewer.force_login(_staff_with("view_product", "view_order"))
    for url in (f"/admin/shop/product/{p.pk}/change/", "/admin/shop/product/"):
        page = viewer.get(url)
        assert page.status_code == 200 and "/restock/" not in page.content.decode(), url
        assert "/adjust/" not in page.content.decode(), url
    for url in (f"/admin/shop/order/{order.pk}/change/", "/admin/shop/order/"):
        page = viewer.get(url)
        assert page.status_code == 200 and "/cancel/" not in page.content.decode(), url
    assert viewer.post(f"/admin/shop/product/{p.pk}/restock/", {"quantity": 5}).status_code == 403
    assert viewer.get(f"/admin/shop/product/{p.pk}/adjust/").status_code == 403
    assert viewer.post(f"/admin/shop/product/{p.pk}/adjust/", {"delta": -1, "reason": "lost",
                                                               "confirm": "1"}).status_code == 403
    assert viewer.post(f"/admin/shop/order/{order.pk}/cancel/").status_code == 403
    p.refresh_from_db()
    order.refresh_from_db()
    assert p.stock == 3 and order.status == Order.Status.PENDING_PAYMENT


def test_staff_who_may_change_orders_get_the_cancel_tool_but_no_save(make_product, user):
    order = order_of(place_order(user=user, lines=[(make_product(stock=5).pk, 1)]))
    editor = Client()
    editor.force_login(_staff_with("view_order", "change_order"))
    page = editor.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    assert f"/admin/shop/order/{order.pk}/cancel/" in page and 'name="_save"' not in page
    assert f"/admin/shop/order/{order.pk}/cancel/" in editor.get("/admin/shop/order/").content.decode()
    assert editor.post(f"/admin/shop/order/{order.pk}/cancel/").status_code == 302
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED


# --- paid orders are refunded, never cancelled; a list that fits --------------------------------
def _paid(user, product, quantity: int = 2) -> Order:
    from shop.services import pay_order

    return pay_order(order=order_of(place_order(user=user, lines=[(product.pk, quantity)])), actor="test")


def test_a_paid_order_offers_refund_and_never_cancel(admin_client, make_product, user):
    p = make_product(stock=5, price="129.00")
    paid = _paid(user, p)
    pending = order_of(place_order(user=user, lines=[(p.pk, 1)]))
    refund, cancel = f"/admin/shop/order/{paid.pk}/refund/", f"/admin/shop/order/{paid.pk}/cancel/"
    page = admin_client.get(f"/admin/shop/order/{paid.pk}/change/").content.decode()
    assert f'href="{refund}"' in page and "Refund order…" in page
    assert cancel not in page and "Cancel order…" not in page
    listing = admin_client.get("/admin/shop/order/").content.decode()
    assert f'href="{refund}"' in listing and cancel not in listing
    assert f"/admin/shop/order/{pending.pk}/cancel/" in listing
    assert f"/admin/shop/order/{pending.pk}/refund/" not in listing

    # The cancel page of a paid order says it is paid and offers the refund instead; a POST is refused.
    confirm = admin_client.get(cancel).content.decode()
    assert "is paid" in confirm and 'value="Yes, cancel it"' not in confirm and f'href="{refund}"' in confirm
    refused = admin_client.post(cancel, follow=True).content.decode()
    assert "refund it instead" in refused
    paid.refresh_from_db()
    assert paid.status == Order.Status.PAID

    confirm = admin_client.get(refund).content.decode()
    assert "is paid" in confirm and "258.00" in confirm and 'value="Yes, refund it"' in confirm
    assert admin_client.post(refund).status_code == 302
    paid.refresh_from_db()
    p.refresh_from_db()
    assert paid.status == Order.Status.REFUNDED and p.stock == 4  # the pending order still holds 1
    entry = StockLedger.objects.get(order=paid, reason=StockLedger.Reason.REFUND)
    assert (entry.quantity, entry.actor) == (2, "admin:root")
    again = admin_client.post(refund, follow=True).content.decode()
    assert "can be refunded" in again
    page = admin_client.get(f"/admin/shop/order/{paid.pk}/change/").content.decode()
    assert refund not in page and cancel not in page  # nothing left to do
    assert "is refunded" in admin_client.get(refund).content.decode()
    # The refund's record: read-only, where it stands.
    refunds = admin_client.get("/admin/shop/refund/").content.decode()
    assert f"Order #{paid.pk}" in refunds and "Completed" in refunds and "admin:root" in refunds


def test_the_cancel_page_says_what_state_the_order_is_in(admin_client, make_product, user):
    order = order_of(place_order(user=user, lines=[(make_product(stock=5).pk, 1)]))
    page = admin_client.get(f"/admin/shop/order/{order.pk}/cancel/").content.decode()
    assert "is awaiting payment" in page and 'value="Yes, cancel it"' in page
    admin_client.post(f"/admin/shop/order/{order.pk}/cancel/")
    page = admin_client.get(f"/admin/shop/order/{order.pk}/cancel/").content.decode()
    assert "is cancelled" in page and 'value="Yes, cancel it"' not in page


def test_view_only_staff_see_no_refund_and_cannot_post_one(make_product, user):
    paid = _paid(user, make_product(stock=5))
    viewer = Client()
    viewer.force_login(_staff_with("view_order"))
    for url in (f"/admin/shop/order/{paid.pk}/change/", "/admin/shop/order/"):
        page = viewer.get(url)
        assert page.status_code == 200 and "/refund/" not in page.content.decode(), url
    assert viewer.get(f"/admin/shop/order/{paid.pk}/refund/").status_code == 403
    assert viewer.post(f"/admin/shop/order/{paid.pk}/refund/").status_code == 403
    paid.refresh_from_db()
    assert paid.status == Order.Status.PAID
    editor = Client()
    editor.force_login(_staff_with("view_order", "change_order"))
    assert editor.post(f"/admin/shop/order/{paid.pk}/refund/").status_code == 302
    paid.refresh_from_db()
    assert paid.status == Order.Status.REFUNDED


def test_the_status_filter_offers_placed_only_while_legacy_orders_exist(admin_client, make_product, user):
    import re

    def offered() -> list[str]:
        page = admin_client.get("/admin/shop/order/").content.decode()
        filters = page[page.index('id="changelist-filter"'):]
        return re.findall(r"status__exact=(\w+)", filters)

    place_order(user=user, lines=[(make_product(stock=5).pk, 1)])
    assert offered() == ["pending_payment", "paid", "refunded", "cancelled", "expired"]
    Order.objects.create(user=user, status=Order.Status.PLACED, subtotal=1, total=1)  # from before payments
    assert "placed" in offered()
    assert admin_client.get("/admin/shop/order/?status__exact=placed").status_code == 200


def test_the_orders_list_is_compact(admin_client, make_product, user):
    """Money as money, dates short, one actions column (the browser test checks the width)."""
    p = make_product(stock=5, price="1658.00")
    _paid(user, p)
    page = admin_client.get("/admin/shop/order/").content.decode()
    assert "column-order_actions" in page and "column-cancel_link" not in page
    assert "3,316.00" in page or "3316.00" in page  # the `money` filter, whatever its locale


# --- a sales view per product; orders as CSV -----------------------------------------------------
def _sales_fixture(make_product, make_coupon, user, other_user):
    """A: 2 paid, 1 awaiting payment, 1 refunded; B: 3 paid with a coupon, 1 cancelled; C: sold out."""
    from shop.services import cancel_order, claim_coupon, pay_order, refund_order

    a = make_product(stock=20, price="1250.00")
    b = make_product(stock=6, price="5.00")
    c = make_product(stock=1, price="9.00")
    coupon = make_coupon(total=5, discount="2.00")
    pay_order(order=order_of(place_order(user=user, lines=[(a.pk, 2)])), actor="t")
    place_order(user=other_user, lines=[(a.pk, 1)])
    refund_order(order=pay_order(order=order_of(place_order(user=other_user, lines=[(a.pk, 1)])), actor="t"), actor="t")
    claim_coupon(user=user, code=coupon.code)
    pay_order(order=order_of(place_order(user=user, lines=[(b.pk, 3), (c.pk, 1)], coupon_code=coupon.code)), actor="t")
    cancel_order(order=order_of(place_order(user=other_user, lines=[(b.pk, 1)])), actor="t")
    return a, b, c


def test_the_sales_selector_counts_sold_paid_revenue_and_reserved_units(make_product, make_coupon, user,
                                                                         other_user, settings):
    from decimal import Decimal

    from shop.reads.selectors import product_sales

    a, b, c = _sales_fixture(make_product, make_coupon, user, other_user)
    rows = {p.pk: p for p in product_sales()}
    assert (rows[a.pk].units_sold, rows[a.pk].revenue, rows[a.pk].units_reserved, rows[a.pk].units_refunded) == (
        2, Decimal("2500.00"), 1, 1)
    # B and C in one order: $24 of lines, paid $22 with the coupon: B $15 x 22/24 = $13.75, C the rest.
    assert (rows[b.pk].units_sold, rows[b.pk].revenue, rows[b.pk].units_reserved, rows[b.pk].units_refunded) == (
        3, Decimal("13.75"), 0, 0)  # what the buyer paid, not the list price ($15.00)
    assert (rows[c.pk].units_sold, rows[c.pk].revenue, rows[c.pk].stock) == (1, Decimal("8.25"), 0)
    assert [Product.objects.get(pk=p.pk).stock for p in (a, b, c)] == [17, 3, 0]
    settings.SHOP = {**settings.SHOP, "LOW_STOCK": 3}  # low: 1 to 3 left
    assert [p.pk for p in product_sales(stock="sold_out")] == [c.pk]
    assert [p.pk for p in product_sales(stock="low")] == [b.pk]
    assert [p.pk for p in product_sales(stock="in_stock")] == [a.pk]
    settings.SHOP = {**settings.SHOP, "LOW_STOCK": 2}
    assert [p.pk for p in product_sales(stock="low")] == []


def test_the_sales_page_lists_products_with_their_sales_and_filters_by_stock(admin_client, make_product,
                                                                             make_coupon, user, other_user):
    a, b, c = _sales_fixture(make_product, make_coupon, user, other_user)
    page = admin_client.get("/admin/shop/productsales/")
    assert page.status_code == 200
    text = page.content.decode()
    for column in ("Sold", "Net revenue", "Units / min", "Reserved", "Refunded", "Stock", "units in paid orders",
                   "awaiting payment", "last 5 minutes"):
        assert column in text, column
    assert "2,500.00" in text or "2500.00" in text
    sold_out = admin_client.get("/admin/shop/productsales/?stock=sold_out").content.decode()
    assert c.name in sold_out and a.name not in sold_out and b.name not in sold_out
    low = admin_client.get("/admin/shop/productsales/?stock=low").content.decode()
    assert b.name in low and a.name not in low and c.name not in low  # LOW_STOCK 10 by default; c is sold out
    assert admin_client.get("/admin/shop/productsales/?o=-4").status_code == 200  # sortable by its columns
    assert admin_client.get("/admin/shop/productsales/add/").status_code == 403
    assert "/admin/shop/productsales/" in admin_client.get("/admin/").content.decode()


def test_the_sales_page_has_a_totals_row_over_every_selected_product_and_refreshes(admin_client, make_product,
                                                                                 make_coupon, user, other_user,
                                                                                 monkeypatch):
    import re

    from shop.admin.sales import ProductSalesAdmin

    _sales_fixture(make_product, make_coupon, user, other_user)
    monkeypatch.setattr(ProductSalesAdmin, "list_per_page", 2)  # 3 products: 2 on this page
    page = admin_client.get("/admin/shop/productsales/").content.decode()
    assert re.search(r"Updated <time>\d\d:\d\d:\d\d</time>", page) and 'data-every="5"' in page
    assert 'data-action="pause"' in page and 'data-action="refresh"' in page and "shop/admin-sales.js" in page
    footer = page[page.index('<tfoot id="sales-totals">'):page.index("</tfoot>")]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", footer)
    # name, sku, drop, stock, sold, gross, coupons, net revenue, units/min, reserved, refunded (units, and
    # the money paid back): every product the filters select, on every page. 7 units in orders of the last
    # 5 minutes that hold their stock: 1.4 a minute.
    assert cells == ["Total (3 products)", "", "", "20", "6", "$2,524.00", "$2.00", "$2,522.00", "1.4", "1",
                     '1<br><span class="paid-back">$1,250.00</span>'], cells
    low = admin_client.get("/admin/shop/productsales/?stock=low").content.decode()
    assert "Total (1 product)" in low and "$13.75" in low


def test_the_sales_page_shows_each_drop_and_the_money_of_its_sale(admin_client, make_product, make_coupon, user,
                                                                 other_user):
    """Issue 37: the drop's state and window, refunded money (not only units), and gross = net +
    coupons, each against the orders of the fixture."""
    from shop.services import end_drop, schedule_drop

    a, b, c = _sales_fixture(make_product, make_coupon, user, other_user)
    end_drop(products=[a], actor="t")
    schedule_drop(products=[c], opens_at=timezone.now() + timedelta(days=1), closes_at=None, actor="t")
    page = admin_client.get("/admin/shop/productsales/").content.decode()
    for title in ("Drop", "Gross", "Coupons", "Net revenue", "Refunded"):
        assert f">{title}</a>" in page, title

    def row(product) -> dict[str, str]:
        tr = re.search(rf"<tr>(?:(?!</tr>).)*?{product.sku}.*?</tr>", page, re.S).group(0)
        cells = re.findall(r'class="field-(\w+)[^"]*">(.*?)</t[dh]>', tr, re.S)
        return {field: re.sub(r"<[^>]+>", "", html).strip() for field, html in cells}

    ra, rb, rc = row(a), row(b), row(c)
    assert ra["drop"].startswith("ended ") and rc["drop"].startswith("opens ") and rb["drop"] == "-"
    # A: 2 sold at $1,250, no coupon; 1 refunded ($1,250 paid back). B: 3 x $5 = $15 less $1.25 of the coupon.
    assert (ra["gross"], ra["coupons"], ra["revenue"], ra["units_refunded"]) == (
        "$2,500.00", "$0.00", "$2,500.00", "1$1,250.00")
    assert (rb["gross"], rb["coupons"], rb["revenue"], rb["units_refunded"]) == ("$15.00", "$1.25", "$13.75", "0")
    ended = admin_client.get("/admin/shop/productsales/?drop=ended").content.decode()
    assert a.sku in ended and b.sku not in ended and c.sku not in ended


def test_the_sales_page_needs_its_own_view_permission(make_product, user):
    make_product(stock=1)
    products_only = Client()
    products_only.force_login(_staff_with("view_product"))
    assert products_only.get("/admin/shop/productsales/").status_code == 403
    sales = Client()
    sales.force_login(_staff_with("view_productsales"))
    assert sales.get("/admin/shop/productsales/").status_code == 200


def test_orders_export_as_csv_with_the_list_filters_for_those_allowed(make_product, user, other_user):
    import csv
    import io

    from django.http import StreamingHttpResponse

    from shop.services import pay_order

    p, q = make_product(stock=20, price="1250.00"), make_product(stock=20)
    formula = get_user_model().objects.create_user("=HYPERLINK(evil)", password="x")
    paid = pay_order(order=order_of(place_order(user=formula, lines=[(p.pk, 2), (q.pk, 1)])), actor="t")
    place_order(user=other_user, lines=[(p.pk, 1)])
    url = "/admin/shop/order/export.csv"

    viewer = Client()
    viewer.force_login(_staff_with("view_order"))
    assert url not in viewer.get("/admin/shop/order/").content.decode()
    assert viewer.get(url).status_code == 403

    exporter = Client()
    exporter.force_login(_staff_with("view_order", "export_order"))
    listing = exporter.get("/admin/shop/order/?status__exact=paid").content.decode()
    assert f'href="{url}?status__exact=paid"' in listing  # the export keeps the list's filter
    response = exporter.get(url, {"status__exact": "paid"})
    assert response.status_code == 200 and isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="orders-')
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    header, body = rows[0], rows[1:]
    assert header[:4] == ["order", "created_at", "status", "buyer"]
    assert [r[0] for r in body] == [str(paid.pk)]  # only the paid one
    row = dict(zip(header, body[0], strict=True))
    assert row["buyer"] == "'=HYPERLINK(evil)"  # a spreadsheet must not run a buyer's name as a formula
    assert row["total"] == "2510.00" and row["status"] == "paid" and row["paid_at"]
    assert row["items"] == f"2 x {p.sku} @ 1250.00; 1 x {q.sku} @ 10.00"
    everything = exporter.get(url)
    assert len(list(csv.reader(io.StringIO(b"".join(everything.streaming_content).decode())))) == 3


def test_the_export_reads_orders_in_bounded_chunks(make_product, user, django_assert_max_num_queries):
    from shop.reads.selectors import orders_in_chunks

    p = make_product(stock=50)
    placed = [place_order(user=user, lines=[(p.pk, 1)]).order_id for _ in range(7)]
    with django_assert_max_num_queries(2 * 4 + 1):  # 4 chunks of 2: each an order page and its lines
        seen = [(o.pk, [line.quantity for line in o.lines.all()]) for o in
                orders_in_chunks(orders=Order.objects.all(), chunk_size=2)]
    assert seen == [(pk, [1]) for pk in sorted(placed, reverse=True)]


def test_a_drops_orders_can_be_found_by_product_and_exported_line_by_line_for_the_books(
        admin_client, make_product, make_coupon, user, other_user):
    """Issue 37: no product filter, a SKU searched found nothing, and the CSV had only an `items`
    text column. Now the list filters by product and finds a SKU; "Export lines CSV" gives one row
    per line (only the filtered product's), with what each paid: they add up to the Sales view."""
    import csv
    import io

    from shop.reads.selectors import product_sales

    a, b, _c = _sales_fixture(make_product, make_coupon, user, other_user)
    with_b = set(Order.objects.filter(lines__product=b).values_list("pk", flat=True))
    page = admin_client.get("/admin/shop/order/").content.decode()
    assert f"?product={b.pk}" in page  # the filter offers the products that have orders

    def listed(query: str) -> set[int]:
        text = admin_client.get(f"/admin/shop/order/?{query}").content.decode()
        return {int(pk) for pk in re.findall(r'<th class="field-id"><a href="/admin/shop/order/(\d+)/', text)}

    assert listed(f"product={b.pk}") == with_b and len(with_b) == 2
    assert listed(f"q={b.sku}") == with_b
    assert listed(f"product={a.pk}&status__exact=paid") == set(
        Order.objects.filter(lines__product=a, status="paid").values_list("pk", flat=True))
    assert f'href="/admin/shop/order/export-lines.csv?product={b.pk}"' in admin_client.get(
        f"/admin/shop/order/?product={b.pk}").content.decode()

    response = admin_client.get("/admin/shop/order/export-lines.csv", {"product": b.pk})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="order-lines-' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {r["sku"] for r in rows} == {b.sku} and {int(r["order"]) for r in rows} == with_b  # not C's line
    paid = [r for r in rows if r["status"] == "paid"]
    sales = product_sales(products=Product.objects.filter(pk=b.pk)).get()
    assert sum(int(r["quantity"]) for r in paid) == sales.units_sold
    assert sum(Decimal(r["amount"]) for r in paid) == sales.gross
    assert sum(Decimal(r["paid"]) for r in paid) == sales.revenue == Decimal("13.75")
    assert [r["paid"] for r in rows if r["status"] == "cancelled"] == [""]  # never paid
    everything = admin_client.get("/admin/shop/order/export-lines.csv")
    assert len(list(csv.reader(io.StringIO(b"".join(everything.streaming_content).decode())))) == 1 + 6


def test_the_ledger_names_buyers_by_username_with_a_link(admin_client, make_product, user):
    """Issue 37: buyers appeared as `user:6`."""
    p = make_product(stock=5)
    order = order_of(place_order(user=user, lines=[(p.pk, 2)]))
    row = StockLedger.objects.get(order=order)
    assert row.actor == f"user:{user.pk}"
    page = admin_client.get("/admin/shop/stockledger/").content.decode()
    assert f'<a href="/admin/auth/user/{user.pk}/change/">{user.username}</a>' in page
    assert f"user:{user.pk}" not in page
    found = admin_client.get(f"/admin/shop/stockledger/?q={user.username}").content.decode()
    assert f"/admin/auth/user/{user.pk}/change/" in found


def test_admin_dates_have_one_style_and_the_window_fields_say_their_time_zone(admin_client, make_product, user):
    """Issue 37: "Nov. 28, 2026, 8:15 p.m." on some pages, "28 Nov 20:13" on others; the Add
    product form's "Opens at" did not say in which time zone it is read."""
    from shop.services import end_drop, pay_order

    p = make_product(stock=5)
    order = pay_order(order=order_of(place_order(user=user, lines=[(p.pk, 1)])), actor="t")
    end_drop(products=[p], actor="t")
    us_style = re.compile(r"\b(Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\. \d|\d (a|p)\.m\.|\bnoon\b|\bmidnight\b")
    ours = re.compile(r"\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d\b")
    for url in ("/admin/shop/droplog/", "/admin/shop/stockledger/", f"/admin/shop/order/{order.pk}/change/",
                f"/admin/shop/product/{p.pk}/change/", "/admin/shop/coupon/"):
        page = admin_client.get(url).content.decode()
        assert not us_style.search(page), (url, us_style.search(page).group(0))
        if "coupon" not in url:
            assert ours.search(page), url
    form = admin_client.get("/admin/shop/product/add/").content.decode()
    assert "Opens at (UTC)" in form and "Closes at (UTC)" in form
