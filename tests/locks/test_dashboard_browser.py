"""The lock dashboard in a real browser: a screenshot while a load holds product locks, its
refresh, and its layout at 320, 375 and 1280 px (with the job runs' and force releases' lists)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from urllib.parse import unquote

import pytest
from django.contrib.auth import get_user_model

from locks import Lock, stats
from shop import errors
from shop.models import Product
from shop.services import place_order
from tests.browser import ARTIFACTS, logged_in_page, own_contexts
from tests.helpers import FORK, make_users

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _buy_for(user_id: int, product_ids: list[int], seconds: float, start, stop) -> None:
    """Order again and again from `start` until `stop` (at most `seconds`)."""
    from django.db import connections

    connections.close_all()
    user = get_user_model().objects.get(pk=user_id)
    start.wait(10)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end and not stop.is_set():
        with contextlib.suppress(errors.ShopError):
            place_order(user=user, lines=[(product_ids[i % len(product_ids)], 1)])
        i += 1
    connections.close_all()


def test_dashboard_screenshot_under_load(browser, live_server, settings):
    from django.db import connections

    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 10.0}
    # A fresh key space: the dashboard shows only this test's load, not earlier tests' stats.
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": settings.LOCKS["KEY_PREFIX"] + "dashboard:"}
    products = [Product.objects.create(sku=f"LOAD-{i}", name=f"Load {i}", price=1, stock=100_000) for i in range(3)]
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    users = make_users(8, prefix="load")
    connections.close_all()
    # The load goes on until the screenshot is taken (not a fixed 12 s of it).
    start, stop = FORK.Event(), FORK.Event()
    procs = [FORK.Process(target=_buy_for, args=(u.pk, [p.pk for p in products], 30.0, start, stop)) for u in users]
    for p in procs:
        p.start()
    try:
        with own_contexts(browser):
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
    finally:
        stop.set()
        for p in procs:
            p.join(30)
    assert any(f"product:{p.pk}" in text for p in products) and "product:*" in text
    assert (ARTIFACTS / "lock-dashboard.png").stat().st_size > 10_000


def test_the_refresh_renders_queued_requests_and_the_combining_row(browser, live_server, settings):
    """dashboard.js redraws the held table's queued requests and the Combining table from the
    JSON: 2 requests queued behind our hold, then (after we serve them) a batch of 3."""
    import uuid

    from locks import Lock, stats
    from locks.combining import submit
    from tests.locks.test_combining import start_submitter

    name = f"t:x{uuid.uuid4().hex[:12]}"
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    turn = submit(Lock(name, ttl=30.0), "mine")
    stats.flush()
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(2)]
    with own_contexts(browser):
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
    for proc, queue in waiters:
        queue.get(timeout=10)
        proc.join(5)
    assert row[1:6] == ["1", "3", "3", "≤ 4", "≤ 4"] and row[6] == "3-4: 1" and row[7].endswith("s ago")


def test_force_release_links_encode_every_character_of_the_lock_name(browser):
    """A lock name is one URL path segment's worth of data: `#`, `?` and `%` must not cut it short
    (encodeURI left them as they are, so "odd#1" linked to the release page of "odd")."""
    from django.conf import settings
    from django.urls import resolve

    script = (settings.BASE_DIR / "locks" / "static" / "locks" / "dashboard.js").read_text()
    release_url = "/admin/locks/lockdashboard/release/NAME/"
    page_html = f"""<!doctype html><div id="locks-dashboard" data-url="/data/" data-release-url="{release_url}"
      data-can-release="1"><span id="held-count"></span><span id="stats-count"></span><span id="refresh-state"></span>
      <table id="held-locks"><tbody></tbody></table><table id="lock-stats"><tbody></tbody></table></div>
      <script src="/dashboard.js"></script>"""
    names = ["odd#1", "what?2", "100%", "a/b c"]
    data = {"held": [{"name": n, "url": None, "owner": "h:1", "fence": 1, "held_for": 0.5, "ttl_left": 1.0,
                      "held_for_text": "500 ms", "ttl_left_text": "1 s", "stuck": False, "waiters": 0} for n in names],
            "stats": [], "stats_families": 0, "totals": {"acquired": 0, "contention": 0, "timeouts": 0, "lost": 0,
                                                        "force_released": 0},
            "next_cursor": None, "at": 0, "at_text": "1970-01-01 00:00:00 UTC"}
    with own_contexts(browser):
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
    prefix = release_url.removesuffix("NAME/")
    for name, href in zip(names, hrefs, strict=True):
        assert href.startswith(prefix) and "#" not in href and "?" not in href, href
        assert resolve(unquote(href)).kwargs == {"name": name}  # the server sees the whole name


WIDTHS = (320, 375, 1280)

# Every shown cell of the dashboard's tables, where it lies: inside its table's box and the
# window, or cut. On a phone the header rows are hidden (the cells carry their labels).
DASHBOARD_CELLS = """() => {
  const cut = [];
  for (const cell of document.querySelectorAll('#locks-dashboard table td, #locks-dashboard table th')) {
    const r = cell.getBoundingClientRect();
    if (!cell.offsetParent || r.width === 0) continue;
    const box = cell.closest('.table-box').getBoundingClientRect();
    if (r.left < Math.max(box.left, 0) - 1 || r.right > Math.min(box.right, innerWidth) + 1)
      cut.push([cell.closest('table').id || 'panel', cell.textContent.trim().slice(0, 24), r.left, r.right]);
  }
  const doc = document.documentElement;
  return {page: doc.scrollWidth - doc.clientWidth, cut,
          boxes: [...document.querySelectorAll('#locks-dashboard .table-box')].map(b => b.scrollWidth - b.clientWidth)};
}"""

# The held lock's row: its TTL left, Waiters and Force release cells, each with its label (the
# column header, or on a phone the label the cell carries) and whether it is on the screen.
HELD_ROW = """(name) => {
  const table = document.getElementById('held-locks');
  const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
  const row = [...table.querySelectorAll('tbody tr')].find(tr => tr.cells[0].textContent.trim() === name);
  const onScreen = el => {
    el.scrollIntoView({block: 'center'});
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.left >= 0 && r.right <= innerWidth && r.top >= 0 && r.bottom <= innerHeight;
  };
  const cell = (label) => { const td = row.cells[heads.indexOf(label)];
    return {text: td.textContent.trim(), onScreen: onScreen(td),
            label: table.tHead.offsetParent ? label : getComputedStyle(td, '::before').content.replace(/"/g, '')}; };
  const link = [...row.querySelectorAll('a')].find(a => a.textContent.startsWith('Force release'));
  return {ttl: cell('TTL left'), waiters: cell('Waiters'), held: cell('Held for'), release: onScreen(link)};
}"""


def _wide_names_and_a_held_lock(settings) -> tuple[str, object]:
    """Families and busiest names as a drop and the jobs leave them (long names without a space, gone
    products), a long-named lock held 30 s, and a force release in the audit."""
    from locks.models import ForceRelease

    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": settings.LOCKS["KEY_PREFIX"] + f"wide{time.monotonic_ns()}:"}
    names = ([f"product:{100000 + i}" for i in range(6)] + [f"checkout-lane:{i}" for i in range(3)]
             + [f"coupon:{9000 + i}" for i in range(5)]
             + ["job:shop.clear_hidden_markers", "job:shop.expire_unpaid", "report:a-rather-long-lock-name-for-a-phone"]
             )
    for _ in range(3):
        for name in names:
            with Lock(name, ttl=5.0):
                pass
    ForceRelease.objects.create(lock_name="product:100001", fence=1795729126554934, waiters=3,
                                owner="web-server-01.example.internal:123456", held_for=14.756, actor_name="ops")
    held = "report:a-rather-long-lock-name-for-a-phone"
    return held, Lock(held, ttl=30.0)


def test_the_dashboard_fits_1280_px_and_every_cell_is_on_a_phone_screen(browser, live_server, settings):
    """At 1280 px every table fits its box (Hold p99 included, no scrolling); at 375 and 320 px the
    rows are cards: every cell, TTL left, Waiters and Force release among them, is on the screen,
    labelled, and the page never scrolls sideways."""
    ops = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    name, lock = _wide_names_and_a_held_lock(settings)
    seen = {}
    with lock, logged_in_page(browser, live_server.url, ops) as page:
        stats.flush()
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{live_server.url}/admin/locks/lockdashboard/")
            page.screenshot(path=str(ARTIFACTS / f"lock-dashboard-{width}.png"), full_page=True)
            seen[width] = (page.evaluate(DASHBOARD_CELLS), page.evaluate(HELD_ROW, name),
                           page.locator("#lock-stats th", has_text="Hold p99").bounding_box())
    for width, (cells, held, _) in seen.items():
        assert cells["page"] == 0 and cells["cut"] == [], (width, cells)
        assert held["ttl"]["onScreen"] and held["waiters"]["onScreen"] and held["release"], (width, held)
        assert (held["ttl"]["label"], held["waiters"]["label"]) == ("TTL left", "Waiters"), (width, held)
        assert held["ttl"]["text"].endswith(" s") and held["waiters"]["text"] == "0", (width, held)
    table_fits = seen[1280][0]["boxes"]
    assert table_fits and set(table_fits) == {0}, table_fits  # no box needs its scroll bar at 1280 px
    hold_p99 = seen[1280][2]
    assert hold_p99 and hold_p99["x"] + hold_p99["width"] <= 1280, hold_p99


LIST_CELLS = """() => {
  const results = document.querySelector('#changelist .results'), box = results.getBoundingClientRect();
  const cut = [...results.querySelectorAll('td, th')].filter(c => c.getBoundingClientRect().right > box.right + 1)
    .map(c => c.textContent.trim().slice(0, 24));
  const doc = document.documentElement;
  return {page: doc.scrollWidth - doc.clientWidth, results: results.scrollWidth - results.clientWidth, cut};
}"""


def test_the_job_runs_and_the_force_release_audit_fit_1280_px(browser, live_server):
    """Long runners' and holders' host:pid, dates and durations: no column cut off at 1280 px; on a
    phone the page itself never scrolls sideways (the admin's results box may)."""
    from django.utils import timezone

    from locks.models import ForceRelease, JobRun

    ops = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-1")
    now = timezone.now()
    jobs = ["shop.expire_unpaid", "shop.finish_refunds", "shop.send_mail", "shop.clear_hidden_markers"]
    for i, job in enumerate(jobs):
        JobRun.objects.create(job=job, tick=58712345 + i, due_at=now, runner="web-server-01.example.internal:123456",
                              fence=1764000000123456, started_at=now, lease_until=now, finished_at=now,
                              duration=0.0006738749998476123, outcome=JobRun.OK, takeovers=1)
    ForceRelease.objects.create(lock_name="product:100001", fence=1795729126554934, waiters=3,
                                owner="web-server-01.example.internal:123456", held_for=14.756, actor_name="ops")
    seen = {}
    with logged_in_page(browser, live_server.url, ops) as page:
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            for url in ("/admin/locks/jobrun/", "/admin/locks/forcerelease/"):
                page.goto(f"{live_server.url}{url}")
                seen[width, url] = page.evaluate(LIST_CELLS)
                if width == 1280:
                    page.screenshot(path=str(ARTIFACTS / f"lock-list-{url.split('/')[-2]}-1280.png"), full_page=True)
    for (width, url), found in seen.items():
        assert found["page"] == 0, (width, url, found)
        if width == 1280:
            assert found["results"] == 0 and found["cut"] == [], (url, found)
