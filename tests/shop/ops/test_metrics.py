"""/metrics (shop/ops/metrics.py): who may scrape it, and what real checkouts make it show.

Real MariaDB and Redis. Counters live for the whole test session (the default registry), so
the tests compare a scrape before with a scrape after.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from locks import Lock
from locks import metrics as lock_metrics
from shop import errors
from shop.models import Product
from shop.plumbing import hooks
from shop.plumbing.lock_names import checkout_queue, product_lock
from shop.services import place_order
from tests.helpers import make_users

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "scrape-token-0123456789"
DASHBOARD = ROOT / "docs" / "grafana" / "flashsale.json"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.fixture(autouse=True)
def _room_for_families():
    lock_metrics._children.clear()  # see tests/locks/test_metrics.py


@pytest.fixture
def metrics_on(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_IPS = []
    return settings


@pytest.fixture
def scrape(client, metrics_on):
    def get() -> Samples:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain; version=")
        return parse(response.content.decode())

    return get


@pytest.fixture(params=[True, False], ids=["combining", "per-order"])
def combining(request, settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": request.param}
    return request.param


# --- access -------------------------------------------------------------------------------------
def test_off_by_default_answers_404(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = []
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything")
    assert response.status_code == 404
    assert b"flashsale_" not in response.content


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x"])
def test_a_missing_or_wrong_token_gets_401_and_no_metrics(client, metrics_on, header):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = client.get("/metrics", **extra)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"flashsale_" not in response.content and b"locks_" not in response.content


def test_the_right_token_gets_the_metrics(client, metrics_on):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert b"# TYPE flashsale_orders_placed_total counter" in response.content
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_allowed_networks_match_remote_addr_only(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = ["10.0.0.0/8", "::1"]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    refused = client.get("/metrics", REMOTE_ADDR="192.168.1.5", HTTP_X_FORWARDED_FOR="10.0.0.1")
    assert refused.status_code == 403  # a header the client wrote proves nothing
    assert b"flashsale_" not in refused.content
    assert client.get("/metrics", REMOTE_ADDR="not-an-address").status_code == 403


def test_with_both_set_both_must_pass(client, metrics_on):
    metrics_on.METRICS_ALLOWED_IPS = ["127.0.0.1/32"]
    ok = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", **ok).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer no").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="10.9.9.9", **ok).status_code == 403


def test_a_bad_network_in_the_environment_fails_at_start():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "METRICS_ALLOWED_IPS": "10.0.0.0/8,not-a-net"}
    out = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "METRICS_ALLOWED_IPS" in out.stderr and "not-a-net" in out.stderr


# --- what checkouts show ------------------------------------------------------------------------
def test_checkout_outcomes_are_counted_once_each_on_both_paths(combining, scrape, make_product):
    buyer, capped_buyer, late_buyer = make_users(3, prefix=f"mx-{combining}")
    p = make_product(stock=4)
    Product.objects.filter(pk=p.pk).update(max_per_user=2)
    before = scrape()

    place_order(user=capped_buyer, lines=[(p.pk, 2)])
    with pytest.raises(errors.PurchaseLimitExceeded):
        place_order(user=capped_buyer, lines=[(p.pk, 1)])
    place_order(user=buyer, lines=[(p.pk, 2)], idempotency_key="mx-key-1")  # the last 2: sold out now
    assert place_order(user=buyer, lines=[(p.pk, 2)], idempotency_key="mx-key-1").replayed
    for _ in range(2):
        with pytest.raises(errors.OutOfStock):
            place_order(user=late_buyer, lines=[(p.pk, 1)])
    with pytest.raises(errors.InvalidQuantity):
        place_order(user=late_buyer, lines=[(p.pk, 0)])

    after = scrape()
    assert delta(before, after, "flashsale_orders_placed_total") == 2
    assert delta(before, after, "flashsale_orders_replayed_total") == 1
    assert delta(before, after, "flashsale_orders_refused_total", reason="purchase_limit") == 1
    assert delta(before, after, "flashsale_orders_refused_total", reason="out_of_stock") == 2
    assert delta(before, after, "flashsale_orders_refused_total", reason="invalid_quantity") == 1
    refused = sum(delta(before, after, "flashsale_orders_refused_total", reason=r) for r in
                  {dict(k[1]).get("reason") for k in after if k[0] == "flashsale_orders_refused_total"})
    assert refused == 4  # no refusal counted under a second reason
    # The marker: the one writer marks the product when a batch (of one, too) leaves 0. After
    # that, refusals need neither the lock nor MySQL.
    assert delta(before, after, "flashsale_soldout_rejections_total") == 2
    # The lock side moved too: the product locks of the orders that got to the lock.
    family = {"family": "product:*"}
    assert delta(before, after, "locks_acquisitions_total", contended="false", **family) >= 3
    assert delta(before, after, "locks_hold_seconds_count", **family) >= 3
    assert delta(before, after, "locks_wait_seconds_count", **family) >= 3
    # One batch per order that reached the lock on the combining path (none on the other), counted
    # under the lock the buyers queued on (their product's lane by default).
    queue = {"family": Lock(checkout_queue(p.pk)).family}
    assert delta(before, after, "locks_batch_size_count", **queue) == (3 if combining else 0)
    assert delta(before, after, "locks_batch_size_sum", **queue) == (3 if combining else 0)


def test_a_stale_fence_is_counted_once_and_the_retry_places_the_order(combining, scrape, user, make_product,
                                                                     monkeypatch):
    p = make_product(stock=5)
    refused_fences = []

    def newer_holder_wrote(stage: str, holds: dict) -> None:
        """Once: the row gets our own fence, as if a newer holder had written it (in our transaction,
        so it rolls back with the refused attempt)."""
        if stage == "before_update" and not refused_fences:
            fence = holds[product_lock(p.pk)].fence
            Product.objects.filter(pk=p.pk).update(fence=fence)
            refused_fences.append(fence)

    monkeypatch.setattr(hooks, "checkout_hook", newer_holder_wrote)
    before = scrape()
    placed = place_order(user=user, lines=[(p.pk, 1)])
    after = scrape()
    assert refused_fences and not placed.replayed
    p.refresh_from_db()
    assert p.stock == 4 and p.fence > refused_fences[0]
    assert delta(before, after, "flashsale_fence_refusals_total", operation="place_order") == 1
    assert delta(before, after, "flashsale_orders_placed_total") == 1
    assert sum(v for (name, _), v in after.items() if name == "flashsale_orders_refused_total") == \
        sum(v for (name, _), v in before.items() if name == "flashsale_orders_refused_total")


def test_an_api_checkout_is_counted_once(client, scrape, user, make_product):
    """The API view maps the service's errors to responses; it counts nothing itself."""
    p = make_product(stock=1)
    client.force_login(user)
    before = scrape()
    placed = client.post("/api/orders/", data={"lines": [{"product_id": p.pk, "quantity": 1}]},
                         content_type="application/json")
    refused = client.post("/api/orders/", data={"lines": [{"product_id": p.pk, "quantity": 1}]},
                          content_type="application/json")
    after = scrape()
    assert (placed.status_code, refused.status_code) == (201, 409), (placed.content, refused.content)
    assert delta(before, after, "flashsale_orders_placed_total") == 1
    assert delta(before, after, "flashsale_orders_refused_total", reason="out_of_stock") == 1


# --- the Grafana dashboard ------------------------------------------------------------------------
METRIC_NAME = re.compile(r"\b((?:flashsale|locks)_[a-z0-9_]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def test_the_dashboard_parses_and_every_metric_it_plots_is_exported(client, scrape, user, make_product):
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    plotted = {m for expr in exprs for m in METRIC_NAME.findall(expr)}
    for panel in dashboard["panels"]:
        if panel.get("type") != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]

    p = make_product(stock=1)  # some activity: a placed order, a refusal, a lock
    place_order(user=user, lines=[(p.pk, 1)])
    with pytest.raises(errors.OutOfStock):
        place_order(user=user, lines=[(p.pk, 1)])
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    exported = {family.name + suffix for family in text_string_to_metric_families(response.content.decode())
                for suffix in SUFFIXES.get(family.type, ("",))}
    assert plotted - exported == set()
    assert {"flashsale_orders_placed_total", "locks_wait_seconds_bucket", "locks_hold_seconds_bucket",
            "flashsale_fence_refusals_total", "locks_batch_size_bucket", "locks_queue_depth"} <= plotted


# --- a real gunicorn ----------------------------------------------------------------------------
def _workers(master: int) -> set[int]:
    path = Path(f"/proc/{master}/task/{master}/children")
    return {int(pid) for pid in path.read_text().split()} if path.exists() else set()


def _get(url: str, headers: dict[str, str], data: bytes | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except urllib.error.URLError:
        return 0, b""  # not listening yet


def _record_stale_counter(directory: Path) -> Path:
    """A counter file as an earlier run of the server would have left it."""
    code = ("import os; from prometheus_client import Counter; "
            "Counter('flashsale_orders_placed', 'stale').inc(1000); print(os.getpid())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
                         check=True, timeout=30, capture_output=True, text=True)
    return directory / f"counter_{int(out.stdout)}.db"


def test_gunicorn_with_two_workers_serves_the_sum_of_both(tmp_path, make_product, settings):
    """gunicorn -c config/gunicorn.conf.py, 2 workers: orders over HTTP land on both; one scrape (served
    by either) counts every order; a worker SIGKILLed keeps its orders in the sum; the files an
    earlier run left are gone at start."""
    import concurrent.futures
    import signal
    import time

    from django.db import connection

    from shop.models import ApiToken
    from tests.helpers import free_port

    directory = tmp_path / "prom"
    directory.mkdir()
    stale = _record_stale_counter(directory)
    assert stale.exists()
    users = make_users(8, prefix="mx-gunicorn")
    tokens = [ApiToken.issue(user_id=u.pk, name="mx") for u in users]
    p = make_product(stock=100_000)
    port = free_port()
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "METRICS_TOKEN": TOKEN,
           "RATELIMIT_ENABLE": "false", "PROMETHEUS_MULTIPROC_DIR": str(directory),
           "DATABASE_URL": f"mysql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "LOCKS_KEY_PREFIX": settings.LOCKS["KEY_PREFIX"]}
    env.pop("FLASHSALE_METRICS_OWN_DIR", None)
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi", "-c", "config/gunicorn.conf.py",
                               "-w", "2", "--threads", "16", "-b", f"127.0.0.1:{port}", "--log-level", "warning"],
                              cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    scrape_headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        deadline = time.monotonic() + 30
        while _get(f"{base}/metrics", scrape_headers)[0] != 200:
            assert server.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
        assert not stale.exists(), "the earlier run's files were not removed at start"

        def buy(i: int) -> int:
            body = json.dumps({"lines": [{"product_id": p.pk, "quantity": 1}]}).encode()
            return _get(f"{base}/api/orders/", {"Authorization": f"Bearer {tokens[i % len(tokens)]}",
                                                 "Content-Type": "application/json"}, body)[0]

        # Which worker accepts a connection is the kernel's choice, and a worker that is still
        # loading Django takes none: 40 orders all went to one worker in a CI run (2026-11-27).
        # So orders are sent in rounds until both workers have taken some (30 s at most).
        statuses: list[int] = []
        deadline = time.monotonic() + 30
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            while True:
                statuses += pool.map(buy, range(len(statuses), len(statuses) + 16))
                by_worker = _placed_by_worker(directory)
                if len([n for n in by_worker.values() if n > 0]) == 2:
                    break
                assert time.monotonic() < deadline, f"for 30 s every order went to one worker: {by_worker}"
        placed = statuses.count(201)
        assert placed >= 0.75 * len(statuses), statuses  # a few may be busy (503) on 2 shared cores
        assert sum(by_worker.values()) == placed

        victim = max(by_worker, key=by_worker.get)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while victim in _workers(server.pid) or len(_workers(server.pid)) < 2:
            assert time.monotonic() < deadline, "gunicorn did not replace the killed worker"
            time.sleep(0.1)
        for _ in range(6):  # whichever worker answers, the sum is the same
            status, body = _get(f"{base}/metrics", scrape_headers)
            assert status == 200
            samples = parse(body.decode())
            assert samples[("flashsale_orders_placed_total", ())] == placed
            assert ("python_gc_objects_collected_total", (("generation", "0"),)) not in samples  # multi-process
    finally:
        server.terminate()
        server.wait(30)


def _placed_by_worker(directory: Path) -> dict[int, float]:
    """flashsale_orders_placed_total in each process's own counter file."""
    import shutil

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    out = {}
    for f in directory.glob("counter_*.db"):
        alone = directory.parent / f"alone-{f.stem}"
        shutil.rmtree(alone, ignore_errors=True)  # read again on every call: the counts move
        alone.mkdir()
        shutil.copy(f, alone / f.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        out[int(f.stem.split("_")[1])] = registry.get_sample_value("flashsale_orders_placed_total") or 0.0
    return out


# --- bots: sign-ups, API tokens, young accounts at a drop's opening ------------------------------
def test_sign_ups_and_api_tokens_are_counted_with_the_accounts_age(client, scrape, settings):
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    settings.RATELIMIT_ENABLE = False
    before = scrape()
    response = client.post("/signup/", {"username": "fresh-bot", "password1": "a-long-pass-123",
                                        "password2": "a-long-pass-123"})
    assert response.status_code == 302  # signed up and logged in
    assert client.post("/account/tokens/", {"name": "at once"}).context["new_token"]
    after = scrape()
    assert delta(before, after, "flashsale_accounts_created_total") == 1
    assert delta(before, after, "flashsale_api_tokens_created_total") == 1
    age = "flashsale_api_token_account_age_seconds"
    assert delta(before, after, f"{age}_count") == 1
    assert delta(before, after, f"{age}_bucket", le="10.0") == 1  # seconds after sign-up

    veteran = get_user_model().objects.create_user("veteran", password="pw-not-used")
    get_user_model().objects.filter(pk=veteran.pk).update(date_joined=timezone.now() - timedelta(days=3))
    client.force_login(veteran)
    assert client.post("/account/tokens/", {"name": "later"}).context["new_token"]
    later = scrape()
    assert delta(after, later, "flashsale_accounts_created_total") == 1  # create_user counts too
    assert delta(after, later, f"{age}_count") == 1
    assert delta(after, later, f"{age}_bucket", le="86400.0") == 0
    assert delta(after, later, f"{age}_bucket", le="604800.0") == 1


def test_young_accounts_at_a_drops_opening_are_counted_once_each(scrape, make_product, settings):
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from shop.edge import account_age
    from shop.services.drops import require_account_age
    from tests.shop.services.test_drops import window

    settings.SHOP = {**getattr(settings, "SHOP", {}), "YOUNG_ACCOUNT_AGE": 3600, "DROP_OPENING_WINDOW": 60}
    young, other_young, veteran = make_users(3, prefix="drop-signal")
    get_user_model().objects.filter(pk=veteran.pk).update(date_joined=timezone.now() - timedelta(hours=2))
    veteran.refresh_from_db()
    opening = window(make_product(stock=50), opens_in=-5)
    long_open = window(make_product(stock=50), opens_in=-120)
    ruled = window(make_product(stock=50), opens_in=-5)
    require_account_age(products=[ruled], min_account_age=timedelta(days=1), actor="test")
    account_age.forget()
    before = scrape()
    for _ in range(3):  # retries and new keys of one account: one account
        place_order(user=young, lines=[(opening.pk, 1)])
    place_order(user=veteran, lines=[(opening.pk, 1)])  # old enough: not a signal
    place_order(user=other_young, lines=[(long_open.pk, 1)])  # two minutes after the opening: not either
    with pytest.raises(errors.AccountTooNew):  # refused by the age rule: counted all the same
        place_order(user=other_young, lines=[(ruled.pk, 1)])
    after = scrape()
    assert delta(before, after, "flashsale_drop_young_buyers_total") == 2
    assert delta(before, after, "flashsale_orders_refused_total", reason="account_too_new") == 1


def test_every_shop_metric_is_listed_in_the_docs():
    """docs/metrics.md has a row for every flashsale_* metric the shop defines."""
    from prometheus_client import REGISTRY

    documented = (ROOT / "docs" / "metrics.md").read_text()
    defined = {family.name for family in REGISTRY.collect()}
    missing = sorted(name for name in defined if name.startswith("flashsale_") and f"`{name}" not in documented)
    assert missing == [], missing
