"""`manage.py loadtest`: argument handling, the printed report, files, exit status, cleanup."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from shop.models import Order, Product
from tests.helpers import order_of

SMALL = ["--processes", "2", "--users", "5", "--no-progress"]


def run(*args: str) -> str:
    out = StringIO()
    call_command("loadtest", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--quantity", "x"], "--quantity 'x'"),
    (["--quantity", "3-1"], "low before high"),
    (["--quantity", "0"], "whole numbers >= 1"),
    (["--processes", "0"], "--processes must be at least 1"),
    (["--requests", "0"], "--requests must be at least 1"),
    (["--duration", "-1"], "--duration must be a positive"),
    (["--lines", "2"], "--lines cannot exceed --products"),
    (["--strategy", "guarded", "--coupon", "5"], "--coupon works with --strategy ours"),
    (["--strategy", "naive", "--no-lock"], "--no-lock applies to --strategy ours"),
    (["--plot", "out.jpg"], "give a FILE.png"),
    (["--url", "ftp://x"], "--url must start with http"),
    (["--compare", "--strategies", "guarded,nope"], "--strategies: unknown nope"),
    (["--compare", "--scenarios", "cold"], "--scenarios: unknown cold"),
    (["--compare", "--url", "http://127.0.0.1:1"], "does not take --url"),
    (["--fault", "kill-everything"], "--fault: unknown kill-everything; choose from kill-holder"),
    (["--fault", "kill-holder", "--fault-length", "0"], "--fault-length: seconds, above 0"),
    (["--fault", "kill-holder", "--fault-duration", "3"], "at least --fault-length \\+ 4"),
    (["--fault", "kill-holder", "--fault-buyers", "1"], "--fault-buyers must be at least 2"),
])
def test_bad_arguments_are_refused_with_a_message(args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(*SMALL, *args)  # last wins: the bad value is the one used


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--units", "0"], "--units must be above 0"),
    (["--load", "-4"], "--load must be above 0"),
    (["--arrival-seconds", "0"], "--arrival-seconds must be above 0"),
    (["--prequeue-seconds", "-1"], "--prequeue-seconds must be 0 or more"),
    (["--people", "0", "--scripts", "0"], "a drop needs at least one buyer"),
    (["--patience", "0"], "--patience must be above 0"),
])
def test_bad_drop_arguments_are_refused_before_anything_is_sent(args, message):
    with pytest.raises(CommandError, match=message):
        run("--url", "http://127.0.0.1:1", "--profile", "drop", *args)
    assert not Product.objects.exists()


def test_unknown_strategy_is_an_argparse_error():
    with pytest.raises(CommandError, match="invalid choice: 'nope'"):
        run("--strategy", "nope")


@pytest.mark.django_db(transaction=True)
def test_a_run_prints_the_table_passes_and_cleans_up(tmp_path):
    out = run("--strategy", "for_update", "--requests", "40", "--stock", "25", "--products", "2",
              "--quantity", "1-2", "--json", str(tmp_path / "run.json"), "--plot", str(tmp_path / "run.png"), *SMALL)
    header = next(line for line in out.splitlines() if line.startswith("strategy"))
    for column in ("attempted", "placed", "out_of_stock", "rejected", "busy", "errors", "orders/s",
                   "p50 ms", "p95 ms", "p99 ms", "max ms"):
        assert column in header
    row = next(line for line in out.splitlines() if line.startswith("for_update")).split()
    assert row[2] == "40"  # attempted
    assert "invariants I1-I6: PASS" in out
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["invariants"] == "PASS" and data["phases"][0]["attempted"] == 40
    assert data["timeline"]["main"]
    assert (tmp_path / "run.png").read_bytes().startswith(b"\x89PNG")
    assert not Product.objects.filter(sku__startswith=f"lt-{data['run_id']}-").exists()
    assert not get_user_model().objects.filter(username__startswith=f"lt-{data['run_id']}-").exists()


@pytest.mark.django_db(transaction=True)
def test_naive_oversell_is_reported_plainly_and_exits_non_zero(tmp_path):
    out = StringIO()
    with pytest.raises(CommandError, match="invariant check FAILED"):
        call_command("loadtest", "--strategy", "naive", "--jitter", "5", "--requests", "60", "--stock", "30",
                     "--processes", "3", "--users", "5", "--no-progress", "--json", str(tmp_path / "n.json"),
                     stdout=out, stderr=StringIO())
    text = out.getvalue()
    assert "OVERSOLD:" in text
    assert "invariants I1-I6: FAIL" in text
    assert "I2" in text
    assert json.loads((tmp_path / "n.json").read_text())["invariants"] == "FAIL"


@pytest.mark.django_db(transaction=True)
def test_keep_leaves_the_rows_for_inspection(tmp_path):
    out = run("--strategy", "guarded", "--requests", "10", "--keep", "--json", str(tmp_path / "k.json"), *SMALL)
    run_id = json.loads((tmp_path / "k.json").read_text())["run_id"]
    assert f"lt-{run_id}-" in out
    assert Order.objects.filter(user__username__startswith=f"lt-{run_id}-").count() == 10


@pytest.mark.django_db(transaction=True)
def test_sellout_reports_what_the_storm_touched():
    out = run("--strategy", "guarded", "--sellout", "--stock", "5", "--requests", "30", *SMALL)
    assert "after sell-out:" in out and "SQL statements" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("guarded")]
    assert [r[1] for r in rows] == ["sell-out", "storm"]
    assert rows[1][2] == "30" and rows[1][4] == "30"  # every storm request was out of stock


@pytest.mark.django_db(transaction=True)
def test_a_run_reports_the_cpu_of_an_order_and_profiles_its_workers(tmp_path):
    """Clients measure their own CPU; the local mysqld and Redis are read from /proc (issue 29)."""
    out = run("--strategy", "ours", "--requests", "60", "--stock", "100", "--cpu-profile", str(tmp_path / "prof"),
              "--json", str(tmp_path / "run.json"), *SMALL)
    line = next(line for line in out.splitlines() if line.startswith("CPU per placed order"))
    assert "clients" in line and "mysqld" in line and "redis" in line and "not local" not in line
    cost = json.loads((tmp_path / "run.json").read_text())["phases"][0]["cpu_ms"]
    assert cost["clients"] > 0 and cost["mysqld"] > 0 and cost["redis"] > 0
    assert cost["total"] == pytest.approx(cost["clients"] + cost["mysqld"] + cost["redis"])
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == ["worker-0.prof", "worker-1.prof"]
    assert "place_order" in out  # the merged profile is printed


@pytest.mark.django_db
def test_cpu_profile_is_for_one_run():
    with pytest.raises(CommandError, match="--cpu-profile profiles one run"):
        run("--compare", "--cpu-profile", "/tmp/x", *SMALL)


@pytest.mark.django_db(transaction=True)
def test_compare_prints_ratios_and_tolerates_the_expected_oversell(tmp_path):
    out = run("--compare", "--strategies", "guarded,naive,redis_py", "--scenarios", "hot,sellout", "--repeat", "1",
              "--duration", "0.5", "--sellout-stock", "5", "--jitter", "2", "--json", str(tmp_path / "c.json"),
              "--plot", str(tmp_path / "c.png"), *SMALL)
    assert "vs guarded" in out and "vs cache.lock" in out and "CPU ms/order" in out
    hot_guarded = next(line.split() for line in out.splitlines() if line.split()[:1] == ["guarded"])
    assert hot_guarded[2] == "1.00x"  # the first table (hot) is relative to guarded itself
    assert "rejections/s" in out
    assert "naive (hot) OVERSOLD" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert set(data["scenarios"]) == {"hot", "sellout"}
    assert {a["strategy"] for a in data["scenarios"]["hot"]["aggregates"]} == {"guarded", "naive", "redis_py"}
    assert (tmp_path / "c.png").stat().st_size < 150_000


@pytest.mark.django_db(transaction=True)
def test_http_mode_drives_the_json_api_and_counts_refusals_right(live_server):
    out = run("--url", live_server.url, "--processes", "3", "--requests", "60", "--stock", "20", "--users", "5",
              "--no-progress")
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["http"])
    attempted, placed, out_of_stock, rejected, busy, errors = (int(x.replace(",", "")) for x in row[2:8])
    assert (attempted, placed, out_of_stock, rejected, errors) == (60, 20, 40 - busy, 0, 0)
    assert "invariants I1-I6: PASS" in out


@pytest.mark.django_db(transaction=True)
def test_coupon_mode_claims_then_uses_the_coupon_within_its_total():
    from shop.models import CouponClaim, Order

    out = run("--coupon", "4", "--requests", "40", "--stock", "30", "--keep", *SMALL)
    assert "invariants I1-I6: PASS" in out and " 30 " in next(
        line for line in out.splitlines() if line.startswith("ours"))
    claims = CouponClaim.objects.filter(coupon__code__startswith="LT-")
    assert claims.count() == 4  # 5 users, 4 coupons: claimed exactly up to the total
    with_coupon = Order.objects.filter(coupon__code__startswith="LT-")
    assert with_coupon.count() == 4 and all(o.discount > 0 for o in with_coupon)


def test_fault_list_names_every_scenario():
    out = run("--fault-list")
    for name in ("kill-holder", "pause-holder", "long-pause", "kill-waiter", "kill-mysql-connection", "restart-redis",
                 "freeze-redis", "restock-in-pause"):
        assert name in out


@pytest.mark.django_db(transaction=True)
def test_a_fault_run_prints_its_row_and_passes():
    out = run("--fault", "kill-holder", "--fault-duration", "5", "--fault-length", "1", "--fault-buyers", "3")
    row = next(line for line in out.splitlines() if line.startswith("kill-holder "))
    assert row.split()[1] == "1" and row.endswith("PASS")  # one fault injected


@pytest.mark.django_db
def test_plot_without_matplotlib_is_refused_before_the_run(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without it looks like
    with pytest.raises(CommandError, match=r"--plot needs matplotlib.* -m pip install -r \S*requirements-bench\.txt"):
        run(*SMALL, "--plot", str(tmp_path / "run.png"))
    assert not Order.objects.exists() and not Product.objects.exists()  # refused before any run


def test_every_option_of_the_load_test_commands_has_help():
    from django.core.management import load_command_class

    for command in ("loadtest", "coupon_storm"):
        parser = load_command_class("loadtest", command).create_parser("manage.py", command)
        own = [a for a in parser._actions if a.dest not in {"help", "version", "verbosity", "settings", "pythonpath",
                                                               "traceback", "no_color", "force_color", "skip_checks"}]
        assert own and all(a.help for a in own), [a.dest for a in own if not a.help]


@pytest.mark.django_db(transaction=True)
def test_pay_mode_balances_paid_and_pending_then_the_expiry_returns_every_unpaid_unit(tmp_path):
    out = run("--pay", "0.5", "--requests", "40", "--stock", "30", "--products", "2", "--quantity", "1-2",
              "--keep", "--json", str(tmp_path / "p.json"), *SMALL)
    data = json.loads((tmp_path / "p.json").read_text())
    p = data["payments"]
    assert p["passed"] and data["invariants"] == "PASS", out
    assert p["paid"] > 0 and p["pending"] > 0  # 0.5 over ~40 orders: both kinds (seeded per process)
    assert p["stock"] + p["paid"] + p["pending"] == p["initial"] == 60
    assert p["expiry"] == "ran" and p["pending_after"] == 0
    assert p["stock_after"] + p["paid_after"] == 60 and p["paid_after"] == p["paid"]
    orders = Order.objects.filter(user__username__startswith=f"lt-{data['run_id']}-")
    assert set(orders.values_list("status", flat=True)) == {"paid", "expired"}
    assert orders.filter(status="expired").count() == p["expired_orders"]
    assert "ok    stock (" in out and "ok    after expiry: stock (" in out
    assert "phases" in data and data["phases"][0]["attempted"] == 40  # the existing shape is kept


@pytest.mark.django_db(transaction=True)
def test_pay_mode_skips_the_expiry_when_it_would_expire_someone_elses_order(user, make_product):
    from shop.services import place_order

    other = order_of(place_order(user=user, lines=[(make_product(stock=3).pk, 1)]))
    out = run("--pay", "0", "--requests", "5", "--stock", "10", *SMALL)
    assert "expiry skipped: 1 unpaid order(s) outside this run" in out
    other.refresh_from_db()
    assert other.status == "pending_payment"


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--pay", "1.5"], "between 0 and 1"),
    (["--pay", "0.5", "--strategy", "guarded"], "--pay works with a single run"),
    (["--pay", "0.5", "--compare"], "--pay works with a single run"),
])
def test_pay_arguments_are_checked(args, message):
    with pytest.raises(CommandError, match=message):
        run(*SMALL, *args)


@pytest.mark.django_db(transaction=True)
def test_pay_mode_over_http_pays_through_the_api(live_server, tmp_path):
    run("--url", live_server.url, "--pay", "1", "--processes", "2", "--requests", "10", "--stock", "6",
        "--users", "3", "--no-progress", "--json", str(tmp_path / "h.json"))
    p = json.loads((tmp_path / "h.json").read_text())["payments"]
    assert (p["paid"], p["pending"], p["stock"], p["expiry"], p["passed"]) == (6, 0, 0, "not needed", True)


def _rows(out: str, first: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[:1] == [first]]


def _column(out: str, row: list[str], name: str) -> int:
    """The figure of `row` under the header `name` (the table's headers are one word each)."""
    header = next(line for line in out.splitlines() if line.startswith("strategy"))
    names = header.replace(" ms", "_ms").split()
    return int(row[names.index(name)].replace(",", ""))


@pytest.mark.django_db(transaction=True)
def test_http_business_refusals_are_rejected_by_code_not_errors(tmp_path):
    """A real server with its unpaid-orders limit on (2 per buyer): the refusals are `rejected`,
    named by code, and the errors column stays 0."""
    from loadtest import appservers

    with appservers.running(1, workers=1, threads=4, env={"SHOP_MAX_UNPAID_ORDERS": "2"}) as servers:
        out = run("--url", servers.urls[0], "--processes", "2", "--requests", "30", "--stock", "100",
                  "--users", "3", "--no-progress", "--json", str(tmp_path / "r.json"))
    (row,) = _rows(out, "http")
    placed, rejected = _column(out, row, "placed"), _column(out, row, "rejected")
    busy, errors = _column(out, row, "busy"), _column(out, row, "errors")
    assert errors == 0 and placed <= 6 and placed + rejected + busy == 30 and rejected >= 20, out
    assert f"rejected (main): unpaid_limit {rejected}" in out
    assert "errors include" not in out
    phase = json.loads((tmp_path / "r.json").read_text())["phases"][0]
    assert phase["rejected"] == {"unpaid_limit": rejected} and phase["counts"]["error"] == 0
    assert "invariants I1-I6: PASS" in out


class _Canned:
    """A real HTTP server in a thread that answers POST /api/orders/ from a list, in turn."""

    ANSWERS = [
        (409, "application/json", b'{"error": {"code": "unpaid_limit", "message": "pay first", "details": {}}}'),
        (500, "text/html", b"<h1>Server Error (500)</h1>"),
        (429, "application/json", b'{"error": {"code": "rate_limited", "message": "slow down", "details": {}}}'),
        (201, "text/html", b"<html>a proxy's page</html>"),
        (409, "application/json", b'{"error": {"code": "some_new_rule", "message": "no", "details": {}}}'),
        (400, "application/json", b'{"error": {"code": "invalid_input", "message": "bad", "details": {}}}'),
    ]

    def __enter__(self) -> str:
        import itertools
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        answers = itertools.cycle(self.ANSWERS)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    status, kind, body = next(answers)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.django_db(transaction=True)
def test_http_real_errors_are_counted_apart_and_named(tmp_path):
    """5xx answers, bodies that are not the API's and 4xx input errors are errors, shown with what
    they were; typed refusals (409, 429) are rejected by code, whatever the code."""
    with _Canned() as url:
        out = run("--url", url, "--processes", "1", "--requests", "12", "--users", "2", "--no-progress",
                  "--json", str(tmp_path / "e.json"))
    (row,) = _rows(out, "http")
    assert (_column(out, row, "placed"), _column(out, row, "rejected"), _column(out, row, "errors")) == (0, 6, 6), out
    assert "rejected (main): unpaid_limit 2, rate_limited 2, some_new_rule 2" in out
    errors = out[out.index("first errors:"):]
    assert "HTTP 500" in errors and "HTTP 201" in errors and "invalid_input" in errors
    assert json.loads((tmp_path / "e.json").read_text())["phases"][0]["counts"]["error"] == 6


@pytest.mark.django_db
@pytest.mark.parametrize("args", [
    ["--compare", "--scenarios", "hot", "--repeat", "1"],  # the default --strategies has python_redis_lock
    ["--compare", "--strategies", "guarded,python_redis_lock", "--scenarios", "hot", "--repeat", "1"],
    ["--strategy", "python_redis_lock"],
])
def test_python_redis_lock_missing_is_refused_before_the_run_with_the_pip_command(monkeypatch, args):
    """`./dev.sh run` installs requirements.txt only: a benchmark extra missing stops the command at
    once, naming the one command that installs the extras (and how to run without it)."""
    import sys

    monkeypatch.setitem(sys.modules, "redis_lock", None)  # what `./dev.sh run`'s virtualenv looks like
    with pytest.raises(CommandError, match=r"python-redis-lock.* -m pip install -r \S*requirements-bench\.txt") as exc:
        run(*SMALL, "--duration", "0.5", *args)
    assert "(or " in str(exc.value) and "--strateg" in str(exc.value)  # the way round it
    assert not Order.objects.exists() and not Product.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--url", "http://127.0.0.1:1"], "--compare-http starts its own app servers: leave out --url"),
    (["--compare"], "give --compare or --compare-http, not both"),
    (["--strategy", "guarded"], "leave out --strategy"),
    (["--sellout"], "leave out --sellout"),
    (["--coupon", "5"], "leave out --coupon"),
    (["--pay", "0.5"], "--pay works with a single run"),
    (["--server-threads", "0"], "--server-threads must be at least 1"),
    (["--warmup", "-1"], "--warmup cannot be negative"),
])
def test_compare_http_arguments_are_refused_before_any_server_starts(args, message):
    with pytest.raises(CommandError, match=message):
        run(*SMALL, "--compare-http", *args)
    assert not Product.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_compare_http_measures_in_process_http_and_the_floor_in_one_run(tmp_path):
    """A short real run: the shipped server config (gunicorn.conf.py, the shop's worker) started
    for it, one round of each mode; every figure positive, the books checked after every run."""
    out = run("--compare-http", "--duration", "1", "--processes", "2", "--repeat", "1", "--warmup", "0.5",
              "--server-workers", "2", "--server-threads", "4", "--users", "5", "--no-progress",
              "--json", str(tmp_path / "h.json"))
    assert "config/gunicorn.conf.py), 2 workers x 4 threads" in out
    header = next(line for line in out.splitlines() if line.startswith("mode"))
    for column in ("orders/s", "requests/s", "p50 ms", "p99 ms", "CPU ms/request", "app", "invariants"):
        assert column in header
    rows = {mode: next(line for line in out.splitlines() if line.startswith(f"{mode} ")) for mode in
            ("in-process", "http", "floor")}
    assert "place_order" in rows["in-process"] and "POST /api/orders/" in rows["http"]
    assert "GET /api/ping/" in rows["floor"]
    assert all(row.rstrip().endswith("PASS") for row in rows.values()), out
    assert re.search(r"HTTP / in-process: \d+\.\d\dx orders/s \(target >= 0\.85x: (met|missed)\)", out), out
    assert re.search(r"floor: [\d,]+ requests/s on the same servers; HTTP orders/s / floor requests/s: \d", out), out
    assert "invariants I1-I6: PASS (after each of the 4 runs, the warm-up's included)" in out

    data = json.loads((tmp_path / "h.json").read_text())
    assert set(data["modes"]) == {"in-process", "http", "floor"}
    assert data["app_servers"] == {"count": 1, "workers": 2, "threads": 4, "config": "config/gunicorn.conf.py"}
    for mode, figures in data["modes"].items():
        assert figures["rounds"] == 1 and figures["invariants"] == "PASS" and figures["errors"] == 0, mode
        assert figures["requests_per_s"] > 0 and figures["p50_ms"] > 0 and figures["p99_ms"] >= figures["p50_ms"]
        assert figures["cpu_ms"]["total"] > 0 and figures["cpu_ms"]["clients"] > 0, mode
        (run_,) = figures["runs"]
        assert run_["invariants"] == "PASS" and all(b["oversold"] == 0 for b in run_["books"])
    inproc, http, floor = (data["modes"][m] for m in ("in-process", "http", "floor"))
    assert inproc["orders_per_s"] > 0 and http["orders_per_s"] > 0 and floor["orders_per_s"] is None
    assert http["cpu_ms"]["app"] > 0 and floor["cpu_ms"]["app"] > 0  # the servers' own CPU, read from /proc
    assert "app" not in inproc["cpu_ms"]  # in process the clients run the checkout
    assert http["runs"][0]["strategy"] == "http" and floor["runs"][0]["strategy"] == "http_ping"
    assert sum(b["sold"] for b in http["runs"][0]["books"]) == http["runs"][0]["phases"][0]["counts"]["placed"] > 0
    ratios = data["ratios"]
    assert ratios["http_vs_in_process"] == pytest.approx(http["orders_per_s"] / inproc["orders_per_s"])
    assert ratios["target"] == 0.85 and ratios["met"] == (ratios["http_vs_in_process"] >= 0.85)
    assert ratios["http_vs_floor"] == pytest.approx(http["orders_per_s"] / floor["requests_per_s"])
    assert data["warmup"] == {"seconds": 0.5, "invariants": "PASS"}
    assert not Product.objects.exists() and not Order.objects.exists()  # every run cleaned up after itself


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_http_fault_run_starts_its_app_servers_with_the_default_shape():
    """--fault with an HTTP scenario and no --server-workers/--server-threads: the servers get the
    small default shape (the options default to nothing so that --compare-http can tell)."""
    out = run("--fault", "kill-app-server", "--fault-duration", "5", "--fault-length", "1", "--fault-buyers", "3")
    assert "(2 workers x 4 threads)" in out
    row = next(line for line in out.splitlines() if line.startswith("kill-app-server "))
    assert row.endswith("PASS")
