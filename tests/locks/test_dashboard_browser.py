"""A screenshot of the lock dashboard in a real browser while a load holds product locks."""

from __future__ import annotations

import contextlib
import json
import os
import time
from urllib.parse import unquote

import pytest
from django.contrib.auth import get_user_model

from shop import errors
from shop.models import Product
from shop.services import place_order
from tests.browser import ARTIFACTS, launch
from tests.helpers import FORK, make_users

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _buy_for(user_id: int, product_ids: list[int], seconds: float, start) -> None:
    from django.db import connections

    connections.close_all()
    user = get_user_model().objects.get(pk=user_id)
    start.wait(10)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        with contextlib.suppress(errors.ShopError):
            place_order(user=user, lines=[(product_ids[i % len(product_ids)], 1)])
        i += 1
    connections.close_all()


def test_dashboard_screenshot_under_load(live_server, settings):
    from django.db import connections
    from playwright.sync_api import sync_playwright

    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 10.0}
    # A fresh key space: the dashboard shows only this test's load, not earlier tests' stats.
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": settings.LOCKS["KEY_PREFIX"] + "dashboard:"}
    products = [Product.objects.create(sku=f"LOAD-{i}", name=f"Load {i}", price=1, stock=100_000) for i in range(3)]
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    users = make_users(8, prefix="load")
    connections.close_all()
    start = FORK.Event()
    procs = [FORK.Process(target=_buy_for, args=(u.pk, [p.pk for p in products], 12.0, start)) for u in users]
    for p in procs:
        p.start()
    try:
        with sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/locks/lockdashboard/")
            page.fill("#id_username", "ops")
            page.fill("#id_password", "ops-password-1")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/locks/lockdashboard/")
            start.set()
            # Wait for the self-refresh to show the load: held locks, and the product family's
            # row with its three busiest names (stats arrive with each buyer's flush, <= 1 s).
            page.wait_for_function(
                "() => document.querySelectorAll('#held-locks tbody a').length > 0"
                " && document.querySelectorAll('#lock-stats tbody td.names a').length >= 3", timeout=15000)
            page.screenshot(path=str(ARTIFACTS / "lock-dashboard.png"), full_page=True)
            text = page.inner_text("#locks-dashboard")
            browser.close()
    finally:
        for p in procs:
            p.join(30)
    assert any(f"product:{p.pk}" in text for p in products) and "product:*" in text
    assert (ARTIFACTS / "lock-dashboard.png").stat().st_size > 10_000


def test_the_refresh_renders_queued_requests_and_the_combining_row(live_server, settings):
    """dashboard.js redraws the held table's queued requests and the Combining table from the
    JSON: 2 requests queued behind our hold, then (after we serve them) a batch of 3."""
    import uuid

    from playwright.sync_api import sync_playwright

    from locks import Lock, stats
    from locks.combining import submit
    from tests.locks.test_combining import start_submitter

    name = f"t:x{uuid.uuid4().hex[:12]}"
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    turn = submit(Lock(name, ttl=30.0), "mine")
    stats.flush()
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(2)]
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page()
        page.goto(f"{live_server.url}/admin/login/?next=/admin/locks/lockdashboard/%3Fprefix%3D{name}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "ops-password-1")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/locks/lockdashboard/**")
        page.wait_for_function("() => document.getElementById('refresh-state').textContent.startsWith('Updated')",
                               timeout=10000)
        cells = page.locator("#held-locks tbody tr").first.locator("td").all_inner_texts()
        assert cells[0] == name and cells[5:7] == ["2", "2"]  # waiters, queued requests
        with turn:
            turn.reply({r.token: "ok" for r in turn.take(limit=10)})
        stats.flush()
        page.wait_for_function(
            f"() => (document.querySelector('#lock-combining tbody td') || {{}}).textContent === {name!r}",
            timeout=10000)
        row = page.locator("#lock-combining tbody tr").first.locator("td").all_inner_texts()
        browser.close()
    for proc, queue in waiters:
        queue.get(timeout=10)
        proc.join(5)
    assert row[1:6] == ["1", "3", "3", "≤ 4", "≤ 4"] and row[6] == "3-4: 1" and row[7].endswith("s ago")


def test_force_release_links_encode_every_character_of_the_lock_name():
    """A lock name is one URL path segment's worth of data: `#`, `?` and `%` must not cut it short
    (encodeURI left them as they are, so "odd#1" linked to the release page of "odd")."""
    from django.conf import settings
    from django.urls import resolve
    from playwright.sync_api import sync_playwright

    script = (settings.BASE_DIR / "locks" / "static" / "locks" / "dashboard.js").read_text()
    release_url = "/admin/locks/lockdashboard/release/NAME/"
    page_html = f"""<!doctype html><div id="locks-dashboard" data-url="/data/" data-release-url="{release_url}"
      data-can-release="1"><span id="held-count"></span><span id="stats-count"></span><span id="refresh-state"></span>
      <table id="held-locks"><tbody></tbody></table><table id="lock-stats"><tbody></tbody></table></div>
      <script src="/dashboard.js"></script>"""
    names = ["odd#1", "what?2", "100%", "a/b c"]
    data = {"held": [{"name": n, "url": None, "owner": "h:1", "fence": 1, "held_for": 0.5, "ttl_left": 1.0,
                      "waiters": 0} for n in names],
            "stats": [], "stats_families": 0, "totals": {"acquired": 0, "contention": 0, "timeouts": 0, "lost": 0,
                                                        "force_released": 0},
            "next_cursor": None, "at": 0}
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page()
        page.route("http://dashboard.test/**", lambda route: route.fulfill(
            status=200,
            content_type={"/": "text/html", "/dashboard.js": "text/javascript"}.get(
                route.request.url.removeprefix("http://dashboard.test"), "application/json"),
            body={"/": page_html, "/dashboard.js": script}.get(
                route.request.url.removeprefix("http://dashboard.test").split("?")[0], json.dumps(data))))
        page.goto("http://dashboard.test/")
        page.wait_for_function("() => document.querySelectorAll('#held-locks tbody a').length === 4")
        hrefs = page.eval_on_selector_all("#held-locks tbody a", "links => links.map(a => a.getAttribute('href'))")
        browser.close()
    prefix = release_url.removesuffix("NAME/")
    for name, href in zip(names, hrefs, strict=True):
        assert href.startswith(prefix) and "#" not in href and "?" not in href, href
        assert resolve(unquote(href)).kwargs == {"name": name}  # the server sees the whole name
