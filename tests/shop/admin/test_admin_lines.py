"""The admin's Lines page and the product form's line fields, over the real Redis and MariaDB."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from shop import errors, line
from shop.models import Product
from shop.services import place_order
from tests import helpers

pytestmark = pytest.mark.django_db(transaction=True)


def _row(page: str, product: Product) -> str:
    found = re.search(rf'<tr id="line-{product.pk}".*?</tr>', page, re.S)
    assert found, page[:3000]
    return found[0]


def _cell(row: str, label: str) -> str:
    found = re.search(rf'<td data-label="{re.escape(label)}"[^>]*>(.*?)</td>', row, re.S)
    assert found, (label, row)
    return re.sub(r"<[^>]+>", "", found[1]).strip()


def test_the_lines_page_shows_each_drops_line_with_its_figures(settings, admin_client, drop, make_product):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5, line_prequeue_seconds=120, line_order="fifo")
    upcoming = drop(stock=3, opens_at=timezone.now() + timedelta(hours=2))
    pre_queue = drop(stock=3, opens_at=timezone.now() + timedelta(seconds=60), line_prequeue_seconds=300)
    plain = make_product(stock=4)  # no drop: no line
    first, *others = helpers.make_users(3, prefix="liner")
    line.join(config=line.config_of(p), user_id=first.pk, start=True, until=time.monotonic() + 60)
    for user in others:
        with pytest.raises(errors.InLine):
            place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.InLine):
        place_order(user=first, lines=[(pre_queue.pk, 1)])

    response = admin_client.get("/admin/shop/productline/")
    assert response.status_code == 200
    page = response.content.decode()
    assert f'id="line-{plain.pk}"' not in page
    row = _row(page, p)
    assert _cell(row, "State") == "open"
    assert (_cell(row, "Places"), _cell(row, "Waiting"), _cell(row, "In checkout")) == ("3", "2", "1")
    assert _cell(row, "Now serving") == "1" and _cell(row, "Finished / lapsed") == "0 / 0"
    assert _cell(row, "Stock") == "5" and _cell(row, "Reserved") == "0"
    assert _cell(row, "Pre-queue") == "120 s, fifo"
    # Two waiting, one let through, a window of 1: the back waits for 3 turns at the default rate.
    default_rate = float(settings.SHOP.get("LINE_DEFAULT_RATE") or line.shop_settings.LINE_DEFAULT_RATE)
    assert _cell(row, "Wait at back") == f"~{3 / default_rate:.1f} s"
    assert "Pause…" in row and "/pause/" in row
    assert _cell(_row(page, upcoming), "State") == "upcoming"
    queued = _row(page, pre_queue)
    assert _cell(queued, "State") == "pre-queue" and "(1 in it)" in _cell(queued, "Pre-queue")
    assert 'data-every="2"' in page and "shop/admin-sales.js" in page  # refreshes itself


def test_the_lines_page_says_sold_out_and_reserved_units(admin_client, drop, user):
    p = drop(stock=1)
    place_order(user=user, lines=[(p.pk, 1)])  # the last unit, awaiting payment: reserved
    row = _row(admin_client.get("/admin/shop/productline/").content.decode(), p)
    assert _cell(row, "Stock") == "0" and _cell(row, "Reserved") == "1"
    assert _cell(row, "Finished / lapsed") == "1 / 0"


def test_pause_asks_first_then_goes_through_the_service_and_resume_lets_buyers_through(admin_client, drop, user):
    p = drop(stock=5)
    asked = admin_client.get(f"/admin/shop/productline/{p.pk}/pause/")
    assert asked.status_code == 200 and "Yes, pause the line" in asked.content.decode()
    assert "delete-confirmation" in asked.content.decode()  # the admin's red Yes
    assert not Product.objects.get(pk=p.pk).line_paused  # asking writes nothing

    response = admin_client.post(f"/admin/shop/productline/{p.pk}/pause/")
    assert response.status_code == 302 and Product.objects.get(pk=p.pk).line_paused
    with pytest.raises(errors.InLine):  # nobody new is let through
        place_order(user=user, lines=[(p.pk, 1)])
    row = _row(admin_client.get("/admin/shop/productline/").content.decode(), p)
    assert _cell(row, "State") == "paused" and "Resume…" in row

    assert "Yes, resume the line" in admin_client.get(f"/admin/shop/productline/{p.pk}/resume/").content.decode()
    assert admin_client.post(f"/admin/shop/productline/{p.pk}/resume/").status_code == 302
    assert not Product.objects.get(pk=p.pk).line_paused
    assert place_order(user=user, lines=[(p.pk, 1)]).order_id  # the same place, let through now


def test_the_lines_page_needs_its_view_permission_and_steering_needs_change_product(drop):
    p = drop()
    staff = get_user_model().objects.create_user("watcher", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/shop/productline/").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_productline"))
    page = client.get("/admin/shop/productline/")
    assert page.status_code == 200 and "Pause…" not in page.content.decode()
    assert client.post(f"/admin/shop/productline/{p.pk}/pause/").status_code == 403
    assert not Product.objects.get(pk=p.pk).line_paused


def test_the_lines_page_lists_the_drops_when_redis_does_not_answer(settings, admin_client, drop, private_redis):
    """A sick Redis (a private one, stopped): the page still answers, and says so per line."""
    p = drop()
    private_redis.stop()
    page = admin_client.get("/admin/shop/productline/").content.decode()
    assert "Redis did not answer" in _row(page, p)


# --- the product form's line fields ---------------------------------------------------------
def _form(p: Product, **fields: str) -> dict[str, str]:
    return {"sku": p.sku, "name": p.name, "description": "", "price": str(p.price), "active": "on",
            "max_per_user": "", "opens_at_0": "", "opens_at_1": "", "closes_at_0": "", "closes_at_1": "",
            "line_prequeue_seconds": "0", "line_order": "shuffle", **fields}


def test_the_product_form_shows_and_saves_the_line_fields_through_steer_line(admin_client, make_product):
    p = make_product()
    page = admin_client.get(f"/admin/shop/product/{p.pk}/change/").content.decode()
    for field in ("line_prequeue_seconds", "line_order", "line_paused"):
        assert f'name="{field}"' in page, field
    assert "Pre-queue (seconds)" in page and "join its line early" in page  # labelled, with help
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/",
                                 _form(p, line_prequeue_seconds="300", line_order="fifo", line_paused="on"))
    assert response.status_code == 302, response.content.decode()[:3000]
    saved = Product.objects.get(pk=p.pk)
    assert (saved.line_prequeue_seconds, saved.line_order, saved.line_paused) == (300, "fifo", True)


def test_the_product_form_refuses_a_prequeue_window_over_a_week_and_writes_nothing(admin_client, make_product):
    p = make_product()
    response = admin_client.post(f"/admin/shop/product/{p.pk}/change/",
                                 _form(p, name="Renamed", line_prequeue_seconds=str(7 * 24 * 3600 + 1)))
    assert response.status_code == 200 and "The pre-queue window is 0 to 604800 seconds" in response.content.decode()
    saved = Product.objects.get(pk=p.pk)
    assert (saved.name, saved.line_prequeue_seconds) == (p.name, 0)
