"""The shop in the admin: counters move only through the services, under the same locks."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from locks import Lock
from shop.models import Order, StockLedger
from shop.services import place_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client():
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


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
    })
    assert response.status_code == 302
    p.refresh_from_db()
    assert (p.name, p.stock) == ("Renamed", 7)


def test_cancel_order_goes_through_the_service(admin_client, make_product, user):
    p = make_product(stock=5)
    order = place_order(user=user, lines=[(p.pk, 2)])
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


# --- issue 12: every admin action declares the permission it needs ------------------------------
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
    from shop.tokens import user_for_token

    assert all(user_for_token(raw) for raw in tokens)  # still valid
    editor = Client()
    editor.force_login(_staff_with("view_apitoken", "change_apitoken"))
    assert "revoke_tokens" in editor.get("/admin/shop/apitoken/").content.decode()
    editor.post("/admin/shop/apitoken/", {"action": "revoke_tokens", "_selected_action": ids})
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 2


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


# --- issue 13: the order page is read-only; Restock and Cancel on the object pages ---------------
def test_the_order_page_is_read_only_labels_its_lines_and_offers_cancel(admin_client, make_product, user):
    p = make_product(stock=5, price="129.00")
    p.name = "Limited sneaker drop"
    p.save(update_fields=["name"])
    order = place_order(user=user, lines=[(p.pk, 2)])
    page = admin_client.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    assert "2 x Limited sneaker drop @ $129.00" in page  # the shop's money format
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


def test_the_product_page_offers_restock(admin_client, make_product):
    p = make_product(stock=1)
    page = admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    assert f'href="/admin/shop/product/{p.pk}/restock/"' in page and "Restock…" in page
    assert 'name="_save"' in page  # products stay editable (name, price, ...)


def test_view_only_staff_see_no_restock_or_cancel_and_cannot_trigger_them(make_product, user):
    p = make_product(stock=5)
    order = place_order(user=user, lines=[(p.pk, 2)])
    viewer = Client()
    viewer.force_login(_staff_with("view_product", "view_order"))
    for url in (f"/admin/shop/product/{p.pk}/change/", "/admin/shop/product/"):
        page = viewer.get(url)
        assert page.status_code == 200 and "/restock/" not in page.content.decode(), url
    for url in (f"/admin/shop/order/{order.pk}/change/", "/admin/shop/order/"):
        page = viewer.get(url)
        assert page.status_code == 200 and "/cancel/" not in page.content.decode(), url
    assert viewer.post(f"/admin/shop/product/{p.pk}/restock/", {"quantity": 5}).status_code == 403
    assert viewer.post(f"/admin/shop/order/{order.pk}/cancel/").status_code == 403
    p.refresh_from_db()
    order.refresh_from_db()
    assert p.stock == 3 and order.status == Order.Status.PENDING_PAYMENT


def test_staff_who_may_change_orders_get_the_cancel_tool_but_no_save(make_product, user):
    order = place_order(user=user, lines=[(make_product(stock=5).pk, 1)])
    editor = Client()
    editor.force_login(_staff_with("view_order", "change_order"))
    page = editor.get(f"/admin/shop/order/{order.pk}/change/").content.decode()
    assert f"/admin/shop/order/{order.pk}/cancel/" in page and 'name="_save"' not in page
    assert f"/admin/shop/order/{order.pk}/cancel/" in editor.get("/admin/shop/order/").content.decode()
    assert editor.post(f"/admin/shop/order/{order.pk}/cancel/").status_code == 302
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
