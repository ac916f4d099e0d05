"""The lock dashboard in the admin: permissions, live state from other processes, force release."""

from __future__ import annotations

import re
import socket
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from django_redis import get_redis_connection

from locks import Lock, LockLost, stats
from locks.conf import locks_settings
from locks.events import FORCE_RELEASE, TIMEOUT
from locks.keys import LockKeys, held_key, held_member
from locks.lock import current_holder
from locks.models import ForceRelease
from tests.locks.conftest import start_waiter

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "/admin/locks/lockdashboard/"


def make_user(username: str, *, staff: bool = False, superuser: bool = False, can_release: bool = False,
              perms: tuple[str, ...] = ()):
    """A user; `can_release` also lets them see the dashboard (view_lockdashboard)."""
    user = get_user_model().objects.create_user(username, password="pw", is_staff=staff or superuser,
                                                is_superuser=superuser)
    codenames = [*perms, *(("view_lockdashboard", "force_release_lock") if can_release else ())]
    if codenames:
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="locks",
                                                             codename__in=codenames))
    return user


def make_viewer(username: str = "viewer"):
    """Staff who may look at the dashboard (is_staff alone is not enough)."""
    return make_user(username, staff=True, perms=("view_lockdashboard",))


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_permission_matrix(name):
    anonymous = Client()
    plain = client_for(make_user("plain"))
    staff = client_for(make_user("staff", staff=True))
    viewer = client_for(make_viewer())
    releaser = client_for(make_user("releaser", staff=True, can_release=True))
    root = client_for(make_user("root", superuser=True))
    release_url = f"{DASHBOARD}release/{name}/"

    for client in (anonymous, plain):
        for url in (DASHBOARD, f"{DASHBOARD}data/", f"{DASHBOARD}events/", release_url):
            response = client.get(url)
            assert response.status_code == 302 and "/admin/login/" in response["Location"]
        assert client.post(release_url).status_code == 302
    for client in (viewer, releaser, root):
        assert client.get(DASHBOARD).status_code == 200
        assert client.get(f"{DASHBOARD}data/").status_code == 200
        assert client.get(f"{DASHBOARD}events/").status_code == 200
    for client in (staff, viewer):
        assert client.get(release_url).status_code == 403
        assert client.post(release_url).status_code == 403
    assert releaser.get(release_url).status_code == 200
    assert root.get(release_url).status_code == 200
    assert 'data-can-release="0"' in viewer.get(DASHBOARD).content.decode()
    assert 'data-can-release="1"' in releaser.get(DASHBOARD).content.decode()
    # The dashboard is linked from the admin index.
    assert DASHBOARD in root.get("/admin/").content.decode()


# --- the lock pages need the lock models' view permissions, not just is_staff ------------------
def test_staff_without_the_lock_view_permissions_see_no_lock_page(name):
    from locks.models import JobRun

    run = JobRun.objects.create(job="t.secret", tick=1, due_at=timezone.now(), runner="host:1", fence=1,
                                started_at=timezone.now(), lease_until=timezone.now(), outcome=JobRun.ERROR,
                                error="Traceback (most recent call last):\n  DATABASE_PASSWORD=hunter2")
    ForceRelease.objects.create(lock_name=name, fence=1, owner="host:1", held_for=1.0, actor_name="ops")
    pages = {"view_lockdashboard": [DASHBOARD, f"{DASHBOARD}data/", f"{DASHBOARD}events/"],
             "view_forcerelease": ["/admin/locks/forcerelease/"],
             "view_jobrun": ["/admin/locks/jobrun/", f"/admin/locks/jobrun/{run.pk}/change/"]}
    staff = client_for(make_user("staff", staff=True))
    for url in [u for urls in pages.values() for u in urls]:
        page = staff.get(url)
        assert page.status_code == 403, url
        assert "hunter2" not in page.content.decode(), url
    index = staff.get("/admin/").content.decode()
    assert DASHBOARD not in index and "/admin/locks/jobrun/" not in index
    for perm, urls in pages.items():
        client = client_for(make_user(f"only-{perm}", staff=True, perms=(perm,)))
        for url in urls:
            assert client.get(url).status_code == 200, (perm, url)
        others = [u for p, us in pages.items() if p != perm for u in us]
        for url in others:
            assert client.get(url).status_code == 403, (perm, url)
    # The traceback is shown to those who may view job runs, and only on the run's page.
    runs = client_for(make_user("runs", staff=True, perms=("view_jobrun",)))
    assert "hunter2" in runs.get(f"/admin/locks/jobrun/{run.pk}/change/").content.decode()
    # The dashboard links only the pages the user may open (the audit needs its own permission).
    page = client_for(make_viewer("dash")).get(DASHBOARD).content.decode()
    assert "/admin/locks/forcerelease/" not in page and "Recent force releases" not in page
    both = client_for(make_user("both", staff=True, perms=("view_lockdashboard", "view_forcerelease")))
    page = both.get(DASHBOARD).content.decode()
    assert "/admin/locks/forcerelease/" in page and "Recent force releases" in page


def test_force_release_needs_the_dashboard_view_permission_too(held_elsewhere):
    name, _, fence = held_elsewhere
    blind = client_for(make_user("blind", staff=True, perms=("force_release_lock",)))
    assert blind.get(f"{DASHBOARD}release/{name}/").status_code == 403
    assert blind.post(f"{DASHBOARD}release/{name}/", {"fence": fence}).status_code == 403
    assert Lock(name).locked() and not ForceRelease.objects.exists()


def test_release_needs_post_with_csrf(held_elsewhere):
    name, _, _ = held_elsewhere
    user = make_user("root", superuser=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(f"{DASHBOARD}release/{name}/").status_code == 403  # no CSRF token
    assert Lock(name).locked()
    assert client.put(f"{DASHBOARD}release/{name}/").status_code == 403  # CSRF first
    assert client_for(user).put(f"{DASHBOARD}release/{name}/").status_code == 405
    assert Lock(name).locked()


def test_dashboard_shows_a_lock_held_by_another_process(held_elsewhere):
    name, pid, fence = held_elsewhere
    client = client_for(make_viewer())
    data = client.get(f"{DASHBOARD}data/", {"prefix": name}).json()
    (row,) = data["held"]
    assert row["name"] == name
    assert row["owner"] == f"{socket.gethostname()}:{pid}"
    assert row["fence"] == fence
    assert 0 < row["ttl_left"] <= 30
    page = client.get(DASHBOARD, {"prefix": name}).content.decode()
    assert name in page and str(fence) in page and f":{pid}" in page


def test_force_release_frees_it_wakes_a_waiter_and_is_audited(held_elsewhere):
    name, pid, fence = held_elsewhere
    waiter, queue = start_waiter(name)
    user = make_user("releaser", staff=True, can_release=True, perms=("view_forcerelease",))  # and reads the audit
    client = client_for(user)
    confirm = client.get(f"{DASHBOARD}release/{name}/").content.decode()
    assert "Force-release" in confirm and f":{pid}" in confirm and "1 waiting" in confirm
    response = client.post(f"{DASHBOARD}release/{name}/", {"fence": fence})
    assert response.status_code == 302
    waited, new_fence = queue.get(timeout=5)
    waiter.join(10)
    assert waited < 5 and new_fence > fence  # woken at once, not after the 30 s lease
    audit = ForceRelease.objects.get()
    assert (audit.lock_name, audit.fence, audit.owner, audit.actor, audit.waiters) == (
        name, fence, f"{socket.gethostname()}:{pid}", user, 1)
    assert name in client.get("/admin/locks/forcerelease/").content.decode()
    events = client.get(f"{DASHBOARD}events/", {"kind": FORCE_RELEASE}).content.decode()
    assert name in events


def test_force_release_acts_only_on_the_holder_it_showed(name):
    """The confirmation carries the fence it showed; a new holder meanwhile is not released."""
    first = Lock(name, ttl=30.0)
    first_hold = first._acquire(current_holder(), blocking=True, wait=1.0)
    client = client_for(make_user("releaser", staff=True, can_release=True))
    confirm = client.get(f"{DASHBOARD}release/{name}/").content.decode()
    assert f'name="fence" value="{first_hold.fence}"' in confirm
    first.release()  # the holder finishes; someone else takes the lock before we click "Yes"
    second = Lock(name, ttl=30.0)
    second_hold = second._acquire(current_holder(), blocking=True, wait=1.0)
    response = client.post(f"{DASHBOARD}release/{name}/", {"fence": first_hold.fence}, follow=True)
    assert "holder changed" in response.content.decode()
    second_hold.check()  # still held: nothing was released
    assert not ForceRelease.objects.exists()
    # Confirming the new holder's fence releases it.
    client.post(f"{DASHBOARD}release/{name}/", {"fence": second_hold.fence})
    with pytest.raises(LockLost):
        second_hold.check()
    assert ForceRelease.objects.get().fence == second_hold.fence


def test_force_release_post_without_a_fence_is_refused(name):
    with Lock(name, ttl=30.0) as held:
        client = client_for(make_user("releaser", staff=True, can_release=True))
        response = client.post(f"{DASHBOARD}release/{name}/", follow=True)
        assert "confirm" in response.content.decode().lower()
        held.check()
    for bad in ("x", "-1", "1e30"):
        assert client.post(f"{DASHBOARD}release/{name}/", {"fence": bad}).status_code == 302
    assert not ForceRelease.objects.exists()


def test_event_log_shows_timeouts(name):
    with Lock(name, ttl=5.0):
        assert not Lock(name, wait=0.02).acquire()
    page = client_for(make_viewer()).get(f"{DASHBOARD}events/", {"kind": TIMEOUT})
    assert name in page.content.decode()


def test_ten_thousand_held_locks_are_paged_not_listed_at_once(name):
    client_redis = get_redis_connection(locks_settings.CACHE_ALIAS)
    pipe = client_redis.pipeline(transaction=False)
    now_us = int(time.time() * 1e6)
    for i in range(10_000):
        key = LockKeys.for_name(f"{name}:{i}").lock
        pipe.hset(key, mapping={"token": "x", "fence": i + 1, "owner": "bulk:1", "since_us": now_us, "ttl": 60000})
        pipe.pexpire(key, 60_000)
        # ... and published in the held index, as the holders' stats flushes would do.
        pipe.zadd(held_key(), {held_member(f"{name}:{i}", f"x{i}"): now_us // 1000 + 60_000})
    pipe.execute()
    client = client_for(make_viewer())
    seen, cursor, pages = set(), 0, 0
    while True:
        data = client.get(f"{DASHBOARD}data/", {"prefix": name, "cursor": cursor}).json()
        assert len(data["held"]) <= 1000  # a page, never everything
        seen.update(h["name"] for h in data["held"])
        pages += 1
        cursor = data["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 10_000 and pages > 5
    assert client.get(DASHBOARD, {"prefix": name}).status_code == 200


def test_redis_down_shows_an_error_not_a_500(settings, redis_server):
    settings.CACHES = {**settings.CACHES, "locks": {**settings.CACHES["locks"], "LOCATION": redis_server.url}}
    redis_server.stop()
    client = client_for(make_viewer())
    assert "unreachable" in client.get(DASHBOARD).content.decode()
    assert client.get(f"{DASHBOARD}data/").status_code == 503


def test_the_dashboard_never_scans_the_keyspace(settings, redis_server):
    """Every refresh reads the families, their busiest names and the held index: no SCAN."""
    settings.CACHES = {**settings.CACHES, "locks": {**settings.CACHES["locks"], "LOCATION": redis_server.url}}
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    for i in range(50):
        with Lock(f"product:{i}", ttl=5.0):
            pass
    long_one = Lock("report:nightly", ttl=30.0)
    long_one.acquire()
    stats.flush()
    staff = client_for(make_viewer())
    before = client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
    data = staff.get(f"{DASHBOARD}data/").json()
    page = staff.get(DASHBOARD).content.decode()
    assert client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0) == before
    assert [h["name"] for h in data["held"]] == ["report:nightly"]
    assert {s["name"] for s in data["stats"]} == {"product:*", "report:nightly"}
    assert "product:*" in page and "report:nightly" in page
    long_one.release()


def test_the_dashboard_shows_queued_requests_then_the_batch_that_served_them(name):
    """Three children queue requests behind our hold: the dashboard says 3 queued requests; once
    we served them (a batch of 4) and flushed, the family's combining row says so."""
    from locks.combining import submit
    from tests.locks.test_combining import start_submitter

    staff = client_for(make_viewer())
    turn = submit(Lock(name, ttl=10.0), "mine")
    stats.flush()  # publish our hold in the held index
    waiters = [start_submitter(name, f"r{i}", queued_before=i) for i in range(3)]
    data = staff.get(f"{DASHBOARD}data/", {"prefix": name}).json()
    [row] = data["held"]
    assert (row["name"], row["waiters"], row["queued_requests"], row["plain_waiters"]) == (name, 3, 3, 0)
    assert data["combining"] == []  # no batch yet
    page = staff.get(DASHBOARD, {"prefix": name}).content.decode()
    assert "Queued requests" in page and "No combining batch yet." in page
    with turn:
        batch = turn.take(limit=10)
        turn.reply({r.token: "ok" for r in batch})
    for proc, queue in waiters:
        assert queue.get(timeout=10)[1] == "served"
        proc.join(5)
    stats.flush()
    data = staff.get(f"{DASHBOARD}data/", {"prefix": name}).json()
    assert data["held"] == []
    [fam] = data["combining"]
    assert (fam["name"], fam["batches"], fam["batched_requests"], fam["mean_batch"]) == (name, 1, 4, 4.0)
    assert (fam["batch_p50"], fam["batch_p99"], fam["batch_sizes"]) == (4, 4, {"3-4": 1})
    assert 0 <= fam["last_batch_ago"] < 5 and fam["last_batch_text"].endswith(" s ago")
    assert data["totals"]["batches"] == 1
    page = staff.get(DASHBOARD, {"prefix": name}).content.decode()
    assert f'<tr><td class="name">{name}</td><td class="num">1</td><td class="num">4</td>' in page
    assert "3-4: 1" in page and " s ago</td>" in page


# --- legend, gone targets, a permissioned statistics reset ---------------------------------------
@pytest.fixture
def own_prefix(settings):
    """A key prefix of this test's own: a reset here must not wipe other tests' statistics."""
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": f"{settings.LOCKS['KEY_PREFIX']}{time.monotonic_ns()}:"}
    return settings.LOCKS["KEY_PREFIX"]


def _families() -> set[str]:
    from locks import inspect

    return {s.name for s in inspect.lock_stats()}


def test_the_dashboard_explains_its_numbers_and_what_to_do(name):
    page = client_for(make_viewer()).get(DASHBOARD).content.decode()
    legend = page[page.index('id="lock-legend"'):]
    for term in ("Fence", "Contention", "p99", "Combining", "Timeouts", "Lost"):
        assert term in legend, term
    assert "What to do" in legend or "what to do" in legend
    for column in ("Fence", "Contention", "Wait p99", "Mean batch"):
        assert re.search(rf'<th[^>]* title="[^"]{{20,}}"[^>]*>{column}</th>', page), column


def test_locks_of_deleted_products_are_marked_gone_and_not_linked(own_prefix):
    from shop.models import Product

    kept = Product.objects.create(sku="KEPT", name="Kept", price=1, stock=1)
    gone = Product.objects.create(sku="GONE", name="Gone", price=1, stock=1)
    for product in (kept, gone):
        with Lock(f"product:{product.pk}", ttl=5.0):
            pass
    held = Lock(f"product:{gone.pk}", ttl=30.0)
    held.acquire()
    stats.flush()
    gone_pk = gone.pk
    gone.delete()
    viewer = client_for(make_viewer())
    data = viewer.get(f"{DASHBOARD}data/").json()
    [family] = [s for s in data["stats"] if s["name"] == "product:*"]
    names = {n["name"]: n for n in family["top_names"]}
    assert names[f"product:{gone_pk}"]["gone"] and names[f"product:{gone_pk}"]["url"] is None
    assert not names[f"product:{kept.pk}"]["gone"]
    assert names[f"product:{kept.pk}"]["url"] == f"/admin/shop/product/{kept.pk}/change/"
    [row] = [h for h in data["held"] if h["name"] == f"product:{gone_pk}"]
    assert row["gone"] and row["url"] is None
    page = viewer.get(DASHBOARD).content.decode()
    assert f'href="/admin/shop/product/{gone_pk}/change/"' not in page
    assert '<span class="gone" title="' in page and f"product:{gone_pk} (gone)" in page
    assert f'href="/admin/shop/product/{kept.pk}/change/"' in page
    held.release()


def test_reset_statistics_needs_its_permission_a_confirmation_and_a_post(name, own_prefix):
    with Lock(name, ttl=5.0):
        pass
    stats.flush()
    assert name in _families()
    url = f"{DASHBOARD}reset-stats/"
    viewer = client_for(make_viewer())
    assert url not in viewer.get(DASHBOARD).content.decode()
    assert viewer.get(url).status_code == 403 and viewer.post(url).status_code == 403
    resetter = make_user("resetter", staff=True, perms=("view_lockdashboard", "reset_lock_stats"))
    blind = client_for(make_user("blind", staff=True, perms=("reset_lock_stats",)))
    assert blind.post(url).status_code == 403  # the dashboard's view permission too
    assert name in _families()

    client = client_for(resetter)
    assert f'href="{url}"' in client.get(DASHBOARD).content.decode()
    confirm = client.get(url).content.decode()
    assert "Reset lock statistics?" in confirm and "1 lock famil" in confirm and 'name="confirm"' in confirm
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(resetter)
    assert csrf.post(url, {"confirm": "yes"}).status_code == 403  # no CSRF token
    assert client.get(url).status_code == 200 and name in _families()  # a GET changes nothing
    assert client.post(url).status_code == 302 and name in _families()  # not confirmed
    done = client.post(url, {"confirm": "yes"}, follow=True).content.decode()
    assert "Reset the statistics of 1 lock famil" in done
    assert _families() == set()
    assert "No lock activity yet." in done
    # New activity counts from zero.
    with Lock(name, ttl=5.0):
        pass
    stats.flush()
    from locks import inspect

    [row] = inspect.lock_stats()
    assert row.counters["acquired"] == 1
    events = client.get(f"{DASHBOARD}events/", {"kind": "stats_reset"}).content.decode()
    assert "resetter" in events  # who reset them, in the event log


def test_the_locks_command_resets_the_statistics(name, own_prefix, monkeypatch):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with Lock(name, ttl=5.0):
        pass
    stats.flush()
    out = StringIO()
    call_command("locks", "reset-stats", "--yes", stdout=out)
    assert "reset the statistics of 1 lock famil" in out.getvalue()
    assert _families() == set()
    with Lock(name, ttl=5.0):
        pass
    stats.flush()
    monkeypatch.setattr("builtins.input", lambda prompt="": "n")
    with pytest.raises(CommandError, match="not reset"):
        call_command("locks", "reset-stats", stdout=StringIO())
    assert name in _families()


# --- a stuck hold is marked; the lock pages write units and one date style (issue 30) -----------
def test_the_stuck_threshold_is_ten_times_the_familys_hold_p99_and_at_least_a_second():
    from locks.inspect import stuck_after

    assert stuck_after(0.027) == 1.0  # a checkout's 27 ms p99: the floor
    assert stuck_after(4.0) == 40.0  # a job's 4 s p99
    assert stuck_after(None) == 1.0  # no finished hold in the family yet


def _stuck(staff: Client, name: str) -> dict:
    [row] = [h for h in staff.get(f"{DASHBOARD}data/", {"prefix": "t:"}).json()["held"] if h["name"] == name]
    return row


def test_a_hold_far_longer_than_its_familys_hold_p99_is_marked_stuck(own_prefix):
    """t:fast holds take microseconds (p99 far under 0.1 s: marked past the 1 s floor); t:slow ones
    take 0.3 s (p99 >= 0.3 s: marked only past 10 x that, 3 s or more). Held 1.2 s, the first is stuck? and
    the second is not; the page shows the badge on the first row only, with its threshold."""
    fast, slow = "t:fast", "t:slow"
    for _ in range(20):
        with Lock(fast, ttl=5.0):
            pass
    for _ in range(2):
        with Lock(slow, ttl=5.0):
            time.sleep(0.3)
    staff = client_for(make_viewer())
    with Lock(fast, ttl=30.0), Lock(slow, ttl=30.0):
        stats.flush()
        assert not _stuck(staff, fast)["stuck"]  # just taken
        time.sleep(1.2)
        fast_row, slow_row = _stuck(staff, fast), _stuck(staff, slow)
        page = staff.get(DASHBOARD, {"prefix": "t:"}).content.decode()
    assert fast_row["stuck"] and fast_row["stuck_after"] == 1.0
    assert "Held longer than 1 s" in fast_row["stuck_title"]
    assert not slow_row["stuck"] and slow_row["stuck_after"] >= 3.0
    held = page[page.index('id="held-locks"'):page.index('id="lock-stats"')]
    assert re.findall(r'<tr><td class="name">\s*(t:\w+)\s*</td>', held) == [fast, slow]
    fast_html, slow_html = held[held.index(fast):held.index(slow)], held[held.index(slow):]
    assert '<span class="stuck" title="Held longer than 1 s' in fast_html and "stuck?</span>" in fast_html
    assert 'class="stuck"' not in slow_html
    legend = page[page.index('id="lock-legend"'):]
    for advice in ("10 &times; its family", "force-release</strong> a stuck", "<strong>Do not</strong> force-release",
                   "TTL left only counts down"):
        assert advice in legend, advice


RAW_FLOAT = re.compile(r"\d+\.\d{3,}")  # 14.756, 0.0006738749998476123: a figure as it was stored
ONE_DATE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
OTHER_DATES = re.compile(r"[ap]\.m\.|midnight|noon|\d\d:\d\d:\d\d(?! UTC)|[A-Z][a-z]{2}\. \d")


def _visible_text(html: str) -> str:
    """The page's text (no scripts, styles or tags), where figures and dates show."""
    html = re.sub(r"<(script|style|svg)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def test_the_lock_pages_show_no_raw_figures_and_one_date_style(name):
    """Durations with units (a job run's 0.000674 s, a force release's 14.756 s, an event's wait),
    and every moment in one style: the dashboard, its JSON, the event log, the audit and the job runs."""
    from django.utils import timezone

    from locks.models import JobRun

    now = timezone.now()
    run = JobRun.objects.create(job="t.fast", tick=1, due_at=now, runner="web-1:77", fence=1, started_at=now,
                                lease_until=now, finished_at=now, duration=0.0006738749998476123, outcome=JobRun.OK)
    ForceRelease.objects.create(lock_name=name, fence=1, owner="web-1:77", held_for=14.756, waiters=3, actor_name="ops")
    with Lock(name, ttl=5.0):
        assert not Lock(name, wait=0.02).acquire()  # a timeout in the event log, with its wait
    stats.flush()
    root = client_for(make_user("root", superuser=True))
    audit = ForceRelease.objects.get()
    urls = (DASHBOARD, f"{DASHBOARD}events/", "/admin/locks/forcerelease/",
            f"/admin/locks/forcerelease/{audit.pk}/change/", "/admin/locks/jobrun/",
            f"/admin/locks/jobrun/{run.pk}/change/")
    pages = {url: _visible_text(root.get(url).content.decode()) for url in urls}
    for url, text in pages.items():
        assert not RAW_FLOAT.search(text), (url, RAW_FLOAT.search(text))
        assert ONE_DATE.search(text), url
        assert not OTHER_DATES.search(text), (url, OTHER_DATES.search(text))
    assert "0.67 ms" in pages["/admin/locks/jobrun/"] and "0.67 ms" in pages[f"/admin/locks/jobrun/{run.pk}/change/"]
    assert "14.8 s" in pages["/admin/locks/forcerelease/"] and "14.8 s" in pages[DASHBOARD]
    assert re.search(r"waited=\d+(\.\d+)? ms", pages[f"{DASHBOARD}events/"])
    data = root.get(f"{DASHBOARD}data/", {"prefix": name}).json()
    assert ONE_DATE.fullmatch(data["at_text"])
    [family] = data["stats"]
    assert all(re.fullmatch(r"\d+(\.\d+)? (ms|s|min|h)", family[f"{k}_text"])
               for k in ("wait_p50", "wait_p99", "hold_p50", "hold_p99"))
