"""`manage.py loadtest`: place orders from many processes, then prove the books still balance.

    manage.py loadtest                                   ours, 8 processes, 2,000 orders on 1 product
    manage.py loadtest --strategy naive --jitter 2       watch the naive way oversell (exit status 1)
    manage.py loadtest --processes 16 --duration 10 --products 8 --quantity 1-3 --plot run.png
    manage.py loadtest --url http://127.0.0.1:8000       the same through the JSON API
    manage.py loadtest --url http://a:8000,http://b:8000 several app servers: buyer i -> URL i mod n
    manage.py loadtest --servers 3 --duration 10         start 3 gunicorn servers for the run, drive them
    manage.py loadtest --pay 0.7                         70% of buyers pay; the rest expire, stock must come back
    manage.py loadtest --compare --duration 5 --repeat 3 --json compare.json --plot compare.png
    manage.py loadtest --compare-http --processes 16 --duration 5 --repeat 3 --json http.json
                                                         in process vs over HTTP vs the floor (GET /api/ping/)
    manage.py loadtest --fault all                       inject each fault, check the books and liveness
    manage.py loadtest --url URL --profile drop --load 4 a drop's crowd at 4x C: who won, how soon, the books
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from loadtest import (
    appservers,
    cpu,
    drop,
    extras,
    fault_harness,
    faults,
    httpcompare,
    httpfaults,
    openloop,
    report,
    scenarios,
    strategies,
    workload,
)
from loadtest.inprocess_harness import FaultConfig
from loadtest.runner import RunError
from loadtest.scenarios import Comparison, LoadConfig, Outcome


def quantity_range(text: str) -> tuple[int, int]:
    """"2" -> (2, 2); "1-3" -> (1, 3)."""
    low, _, high = text.partition("-")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise CommandError(f"--quantity {text!r}: use a number (2) or a range (1-3)") from None
    if not 1 <= lo <= hi:
        raise CommandError(f"--quantity {text!r}: quantities are whole numbers >= 1, low before high")
    return lo, hi


def name_list(text: str, allowed: list[str], option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise CommandError(f"{option}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(allowed)}")
    return names


class Command(BaseCommand):
    help = "Load-test checkout from many processes and check the invariants (or compare strategies)."

    def add_arguments(self, parser: CommandParser) -> None:
        names = list(strategies.STRATEGIES)
        parser.add_argument("--strategy", default="ours", choices=names, help="how stock is taken (default ours)")
        parser.add_argument("--url", action="append",
                            help="drive the JSON API at this base URL instead of calling the service; several "
                                 "app servers: comma-separated or repeated (worker i uses URL i mod n)")
        parser.add_argument("--servers", type=int, metavar="N",
                            help="start N gunicorn app servers on this database and Redis for the run and drive "
                                 "them as with --url (stopped at the end)")
        parser.add_argument("--server-workers", type=int,
                            help="--servers: gunicorn workers each (2; --compare-http: the shipped "
                                 f"{appservers.SHIPPED_WORKERS})")
        parser.add_argument("--server-threads", type=int,
                            help="--servers: threads per worker (4; --compare-http: the shipped "
                                 f"{appservers.SHIPPED_THREADS})")
        parser.add_argument("--products", type=int, default=1, help="products in the run (default 1)")
        parser.add_argument("--stock", type=int,
                            help="stock per product (default 1000; 1,000,000 with --compare or --compare-http)")
        parser.add_argument("--requests", type=int, default=2000, help="requests in all (default 2000)")
        parser.add_argument("--duration", type=float, help="run for this many seconds instead of --requests")
        parser.add_argument("--processes", type=int, default=8, help="worker processes (default 8)")
        parser.add_argument("--quantity", type=quantity_range, default=(1, 1), help="units per line: 2 or 1-3")
        parser.add_argument("--lines", type=int, default=1, help="products per order (default 1)")
        parser.add_argument("--users", type=int, default=100, help="distinct buyers (default 100)")
        parser.add_argument("--coupon", type=int, metavar="TOTAL",
                            help="create a coupon that TOTAL users may claim; every order uses it (ours, --url)")
        parser.add_argument("--pay", type=float, metavar="P",
                            help="each buyer pays the order just placed with probability P (0-1; ours or --url); "
                                 "then the unpaid ones are expired and every unit must be back")
        parser.add_argument("--sellout", action="store_true",
                            help="sell the stock out first, then measure a storm of --requests/--duration")
        parser.add_argument("--jitter", type=float, default=0.0, metavar="MS",
                            help="naive: sleep up to MS ms between reading and writing the stock")
        parser.add_argument("--lock-wait", type=float, default=3.0, help="lock wait timeout, seconds (default 3)")
        parser.add_argument("--lock-ttl", type=float, default=10.0,
                            help="lease of the competitor locks (lock_table, redis_py, python_redis_lock), "
                                 "seconds (default 10); ours uses SHOP['LOCK_TTL']")
        parser.add_argument("--no-lock", action="store_true", help="ours: skip the Redis lock (guarded UPDATE only)")
        parser.add_argument("--seed", type=int, default=0, help="random seed for products, users and quantities")
        parser.add_argument("--json", metavar="FILE", help="write every figure (and the timeline) as JSON")
        parser.add_argument("--plot", metavar="FILE.png", help="plot throughput and latency over time")
        parser.add_argument("--keep", action="store_true", help="keep the run's users, products and orders")
        parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
        parser.add_argument("--cpu-profile", metavar="DIR",
                            help="each worker's cProfile on the CPU clock written to DIR, merged and printed")
        flt = parser.add_argument_group("fault injection (--fault; docs/reliability.md)")
        flt.add_argument("--fault", metavar="SCENARIO",
                         help="run the hot-product load test while injecting this fault (or 'all'), then check "
                              "the books and liveness; see --fault-list")
        flt.add_argument("--fault-list", action="store_true", help="list the fault scenarios and exit")
        flt.add_argument("--fault-length", type=float, default=2.0,
                         help="seconds a pause, freeze or outage lasts (default 2)")
        flt.add_argument("--fault-duration", type=float, default=8.0, help="seconds of buying per scenario (default 8)")
        flt.add_argument("--fault-buyers", type=int, default=6, help="buyer processes per scenario (default 6)")
        crowd = parser.add_argument_group("a crowd, open loop over HTTP (--url with --profile or --rate; "
                                          "docs/benchmarks.md)")
        crowd.add_argument("--profile", choices=("spike", "flash", "drop"),
                           help="spike: 0.5x, 1x, 2x, 4x, 10x, 0.5x the capacity C, a phase each; flash: a sale of "
                                f"{openloop.FLASH_STOCK} units at 4x C, then another at 10x C; drop: a drop's crowd "
                                "of people and scripts (the options below)")
        crowd.add_argument("--rate", type=float, metavar="R", help="send R orders per second for --phase-seconds")
        crowd.add_argument("--capacity", type=float, metavar="C",
                           help="orders/s the profile's multiples are of (default: measured first, closed-loop, "
                                "32 buyers for 5 s)")
        crowd.add_argument("--phase-seconds", type=float, default=8.0, help="seconds per phase (default 8)")
        crowd.add_argument("--clients", type=int, help="client processes sending (default 3; drop: 6)")
        crowd.add_argument("--patience", type=float,
                           help="seconds a buyer waits for an answer before it gives up (default 10; drop: "
                                "seconds a buyer keeps trying, default 30)")
        crowd.add_argument("--prefer-wait", type=float, metavar="S", help="send 'Prefer: wait=S' with every order")
        dr = parser.add_argument_group("a drop (--profile drop; loadtest/drop.py)")
        dr.add_argument("--units", type=int, default=300, help="the drop's units, 1 per buyer (default 300)")
        dr.add_argument("--people", type=int, default=3000,
                        help="buyers who wait the Retry-After they are given (default 3000)")
        dr.add_argument("--scripts", type=int, default=500,
                        help="buyers that keep 3 attempts in flight and retry every 50 ms (default 500)")
        dr.add_argument("--arrival-seconds", type=float, default=1.0,
                        help="buyers arrive evenly over this many seconds after the opening (default 1)")
        dr.add_argument("--prequeue-seconds", type=float, default=0.0,
                        help="buyers arrive evenly over this many seconds before the opening instead, in the "
                             "product's pre-queue (default 0)")
        dr.add_argument("--prequeue-order", choices=("shuffle", "fifo"), default="shuffle",
                        help="how the pre-queue is put in line at the opening (default shuffle)")
        dr.add_argument("--load", type=float, metavar="X",
                        help="as many buyers as X x C arrivals over the arrival window (people and scripts in "
                             "the ratio of --people to --scripts)")
        cmp = parser.add_argument_group("comparison (--compare, --compare-http)")
        cmp.add_argument("--compare", action="store_true", help="run several strategies side by side")
        cmp.add_argument("--strategies", default=",".join(names), help="comma-separated (default: all)")
        cmp.add_argument("--scenarios", default=",".join(scenarios.SCENARIOS),
                         help="comma-separated from hot, spread, sellout (default: all)")
        cmp.add_argument("--repeat", type=int, default=3,
                         help="runs per strategy and scenario; --compare-http: rounds (default 3)")
        cmp.add_argument("--spread-products", type=int, default=8, help="products in 'spread' (default 8)")
        cmp.add_argument("--sellout-stock", type=int, default=50, help="stock in 'sellout' (default 50)")
        cmp.add_argument("--compare-http", action="store_true",
                         help="in one run, alternating --repeat rounds of --duration (default 5 s), the same "
                              "--processes each: the checkout (ours) in process, the same checkout over HTTP "
                              "(POST /api/orders/) and the request path's floor (GET /api/ping/) on app servers "
                              "started with the shipped config (config/gunicorn.conf.py; --servers, default 1; "
                              "--server-workers/--server-threads, default the image's "
                              f"{appservers.SHIPPED_WORKERS} x {appservers.SHIPPED_THREADS}); orders or "
                              "requests/s, p50, p99, CPU per request, HTTP / in process against the 0.85x "
                              "target, HTTP / floor; the books checked after each run")
        cmp.add_argument("--warmup", type=float, default=1.0, metavar="S",
                         help="--compare-http: seconds of HTTP orders before the first round, not counted, so "
                              "the app servers' workers are warm (default 1; 0: none)")

    def handle(self, *args: Any, **opts: Any) -> None:
        # Load-test buyers never pay: the unpaid-orders limit would refuse them after a few orders.
        settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_UNPAID_ORDERS": None}
        if opts["fault_list"]:
            for scenario in [*faults.SCENARIOS.values(), *httpfaults.SCENARIOS.values()]:
                self.stdout.write(f"{scenario.name:<22} {scenario.description}")
            return
        shipped = opts["compare_http"]  # the shipped server's shape; the others' small default
        if opts["server_workers"] is None:
            opts["server_workers"] = appservers.SHIPPED_WORKERS if shipped else 2
        if opts["server_threads"] is None:
            opts["server_threads"] = appservers.SHIPPED_THREADS if shipped else 4
        if opts["fault"]:
            self._faults(opts)
            return
        opts["url"] = self._urls(opts)
        if opts["profile"] or opts["rate"]:
            self._crowd(opts)
            return
        config = self._config(opts)
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        try:
            if opts["compare_http"]:
                self._compare_http(config, opts)
            elif opts["compare"]:
                self._compare(config, opts)
            elif opts["servers"]:
                self._on_servers(config, opts)
            else:
                self._single(config, opts)
        except RunError as exc:
            raise CommandError(str(exc)) from exc

    # -- a crowd, open loop --------------------------------------------------------------------
    def _crowd(self, opts: dict[str, Any]) -> None:
        if len(opts["url"]) != 1:
            raise CommandError("--profile and --rate drive one server: give one --url")
        if opts["profile"] and opts["rate"]:
            raise CommandError("give --profile or --rate, not both")
        for name in ("rate", "capacity", "phase_seconds", "clients", "patience", "prefer_wait"):
            if opts[name] is not None and opts[name] <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be above 0")
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        if opts["profile"] == "drop":
            self._drop(opts)
            return
        opts["patience"] = opts["patience"] or 10.0
        opts["clients"] = opts["clients"] or 3
        outcome = openloop.crowd(opts["url"][0], profile=opts["profile"] or "rate", capacity=opts["capacity"],
                                 rate=opts["rate"], seconds=opts["phase_seconds"], clients=opts["clients"],
                                 patience=opts["patience"], users=opts["users"], prefer_wait=opts["prefer_wait"])
        self.stdout.write(report.crowd_report(outcome))
        if opts["json"]:
            report.write_json(opts["json"], report.crowd_json(outcome))
        if outcome.oversold:
            raise CommandError(f"FAIL: {outcome.oversold} units oversold")

    def _drop(self, opts: dict[str, Any]) -> None:
        for name in ("units", "arrival_seconds", "load"):
            if opts[name] is not None and opts[name] <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be above 0")
        for name in ("people", "scripts", "prequeue_seconds"):
            if opts[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must be 0 or more")
        if opts["people"] + opts["scripts"] == 0:
            raise CommandError("--people and --scripts: a drop needs at least one buyer")
        outcome = drop.drop(opts["url"][0], units=opts["units"], people=opts["people"], scripts=opts["scripts"],
                            arrival_seconds=opts["arrival_seconds"], prequeue_seconds=opts["prequeue_seconds"],
                            load=opts["load"], capacity=opts["capacity"], patience=opts["patience"] or 30.0,
                            clients=opts["clients"] or 6, seed=opts["seed"], prequeue_order=opts["prequeue_order"])
        self.stdout.write(report.drop_report(outcome))
        if opts["json"]:
            report.write_json(opts["json"], outcome.as_dict())
        if outcome.books.problems:
            raise CommandError("FAIL: the books do not balance: " + "; ".join(outcome.books.problems))

    # -- several app servers ---------------------------------------------------------------
    def _urls(self, opts: dict[str, Any]) -> list[str]:
        given = opts["url"] or []
        given = [given] if isinstance(given, str) else given  # call_command(url="...") skips the parser
        urls = [u.strip() for item in given for u in item.split(",") if u.strip()]
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise CommandError(f"--url must start with http:// or https:// (got {bad[0]!r})")
        if opts.get("compare_http"):
            if urls:
                raise CommandError("--compare-http starts its own app servers: leave out --url")
            if opts["compare"]:
                raise CommandError("give --compare or --compare-http, not both")
        if opts["servers"] is not None:
            if urls:
                raise CommandError("--servers starts its own app servers: leave out --url")
            if opts["compare"]:
                raise CommandError("--compare calls the strategies directly; it does not take --servers")
            if opts["servers"] < 1 or opts["server_workers"] < 1 or opts["server_threads"] < 1:
                raise CommandError("--servers, --server-workers and --server-threads must be at least 1")
        return urls

    def _on_servers(self, config: LoadConfig, opts: dict[str, Any]) -> None:
        n, w, t = opts["servers"], opts["server_workers"], opts["server_threads"]
        self.stdout.write(f"starting {n} gunicorn app server(s), {w} workers x {t} threads each ...")
        servers = appservers.AppServers(n, workers=w, threads=t)
        try:
            servers.start()
        except RuntimeError as exc:
            raise CommandError(f"an app server did not start: {exc}\n{servers.logs()}") from exc
        try:
            config.url, config.urls, config.app_groups = servers.urls[0], servers.urls, servers.groups
            self._single(config, opts)
        finally:
            servers.stop()

    # -- fault injection -------------------------------------------------------------------
    def _faults(self, opts: dict[str, Any]) -> None:
        every = [*faults.SCENARIOS, *httpfaults.SCENARIOS]
        names = every if opts["fault"] == "all" else name_list(opts["fault"], every, "--fault")
        if not 0 < opts["fault_length"] <= 10:
            raise CommandError("--fault-length: seconds, above 0 and at most 10")
        if opts["fault_duration"] < opts["fault_length"] + 4:
            raise CommandError("--fault-duration must leave time around the fault: at least --fault-length + 4")
        if opts["fault_buyers"] < 2:
            raise CommandError("--fault-buyers must be at least 2 (one holder, one waiter)")
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        config = FaultConfig(buyers=opts["fault_buyers"], duration=opts["fault_duration"],
                                    fault_length=opts["fault_length"], seed=opts["seed"])
        over_http = httpfaults.HttpFaultConfig(
            servers=opts["servers"] or 3, server_workers=opts["server_workers"],
            server_threads=opts["server_threads"], buyers=opts["fault_buyers"], duration=opts["fault_duration"],
            fault_length=opts["fault_length"], seed=opts["seed"])
        if over_http.servers < 2:
            raise CommandError("--servers: the app-server faults need at least 2 (one to lose, one to move to)")
        outcomes, http_outcomes = [], []

        def say(line: str) -> None:
            self.stdout.write(f"  {line}")

        for name in names:
            if name in httpfaults.SCENARIOS:
                self.stdout.write(f"{name}: {httpfaults.SCENARIOS[name].description} ...")
                http_outcomes.append(httpfaults.run_scenario(name, over_http, keep=opts["keep"], say=say))
                for line in httpfaults.servers_lines(http_outcomes[-1]):
                    say(line)
            else:
                self.stdout.write(f"{name}: {faults.SCENARIOS[name].description} ...")
                outcomes.append(faults.run_scenario(name, config, keep=opts["keep"], say=say))
        if outcomes:
            self.stdout.write("")
            self.stdout.write(fault_harness.table(outcomes))
        if http_outcomes:
            self.stdout.write("")
            self.stdout.write(f"over HTTP, {over_http.servers} app servers ({over_http.server_workers} workers x "
                              f"{over_http.server_threads} threads), {over_http.buyers} buyers:")
            self.stdout.write(httpfaults.table(http_outcomes))
            if opts["json"]:
                report.write_json(opts["json"], {"http_faults": [o.as_dict() for o in http_outcomes]})
                self.stdout.write(f"JSON written to {opts['json']}")
        failed = [o.scenario.name for o in [*outcomes, *http_outcomes] if not o.passed]
        if failed:
            raise CommandError(f"fault injection FAILED: {', '.join(failed)}")

    # -- options ---------------------------------------------------------------------------
    def _config(self, opts: dict[str, Any]) -> LoadConfig:
        for option in ("products", "processes", "users", "lines", "repeat", "spread_products", "sellout_stock"):
            if opts[option] < 1:
                raise CommandError(f"--{option.replace('_', '-')} must be at least 1")
        if opts["requests"] < 1:
            raise CommandError("--requests must be at least 1")
        if opts["duration"] is not None and opts["duration"] <= 0:
            raise CommandError("--duration must be a positive number of seconds")
        if opts["lines"] > opts["products"]:
            raise CommandError("--lines cannot exceed --products (one line per product)")
        if opts["stock"] is not None and opts["stock"] < 0:
            raise CommandError("--stock cannot be negative")
        if opts["coupon"] is not None and opts["coupon"] < 1:
            raise CommandError("--coupon TOTAL must be at least 1")
        http = bool(opts["url"] or opts["servers"])
        if opts["coupon"] is not None and not http and opts["strategy"] != "ours":
            raise CommandError("--coupon works with --strategy ours or --url (the other strategies sell stock only)")
        if opts["pay"] is not None:
            if not 0 <= opts["pay"] <= 1:
                raise CommandError("--pay P is a probability between 0 and 1")
            if opts["compare"] or opts["compare_http"] or (not http and opts["strategy"] != "ours"):
                raise CommandError("--pay works with a single run of --strategy ours or --url")
        if opts["no_lock"] and opts["strategy"] != "ours":
            raise CommandError("--no-lock applies to --strategy ours")
        if opts["jitter"] < 0 or opts["lock_wait"] < 0 or opts["lock_ttl"] <= 0:
            raise CommandError("--jitter and --lock-wait cannot be negative; --lock-ttl must be positive")
        if opts["plot"] and not opts["plot"].lower().endswith(".png"):
            raise CommandError("--plot writes a PNG: give a FILE.png")
        if opts["plot"]:  # refused now, not after a long run
            extras.require("matplotlib", package="matplotlib", needed_by="--plot")
        if not http and opts["strategy"] == strategies.PythonRedisLock.name and not opts["compare"]:
            extras.require("redis_lock", package="python-redis-lock", needed_by="--strategy python_redis_lock",
                           instead="choose another --strategy")
        default_stock = 1_000_000 if opts["compare"] or opts["compare_http"] else 1000
        return LoadConfig(
            strategy=opts["strategy"], products=opts["products"],
            stock=default_stock if opts["stock"] is None else opts["stock"], users=opts["users"],
            processes=opts["processes"], requests=opts["requests"], duration=opts["duration"],
            quantity=opts["quantity"], lines_per_order=opts["lines"], coupon_total=opts["coupon"],
            jitter=opts["jitter"] / 1000, lock_wait=opts["lock_wait"], lock_ttl=opts["lock_ttl"],
            lock=not opts["no_lock"], url=opts["url"][0] if opts["url"] else None, urls=opts["url"],
            pay=opts["pay"], sellout=opts["sellout"], keep=opts["keep"], cpu_profile=opts["cpu_profile"],
            seed=opts["seed"],
        )

    def _progress(self, opts: dict[str, Any], label: str, final: bool = True) -> report.ProgressLine | None:
        if opts["no_progress"]:
            return None
        return report.ProgressLine(self.stderr, label, final=final)

    # -- one run ---------------------------------------------------------------------------
    def _single(self, config: LoadConfig, opts: dict[str, Any]) -> None:
        name = "http" if config.url else config.strategy
        on = f" on {len(config.urls)} app servers" if len(config.urls) > 1 else ""
        self.stdout.write(
            f"loadtest: {name}{on}, {config.processes} processes, {config.products} product(s) x "
            f"{config.stock:,} stock, "
            f"{config.users} users, quantity {config.quantity[0]}-{config.quantity[1]}, "
            + (f"{config.duration:g} s" if config.duration else f"{config.requests:,} requests")
        )
        progress = self._progress(opts, name)
        if config.cpu_profile:
            cpu.prepare_profile_dir(config.cpu_profile)
        outcome = scenarios.run_once(config, progress)
        if progress:
            progress.done()
        self._print_outcome(outcome)
        if config.cpu_profile:
            self.stdout.write(f"\nthe workers' cProfile, merged (CPU clock; files in {config.cpu_profile}):")
            self.stdout.write(cpu.merged_profile(config.cpu_profile))
        if opts["json"]:
            report.write_json(opts["json"], outcome.as_dict())
            self.stdout.write(f"JSON written to {opts['json']}")
        if opts["plot"]:
            series = {f"{name} {s.phase}": report.timeline(r for w in ph.records for r in w)
                      for s, ph in zip(outcome.summaries, outcome.result.phases, strict=True)}
            report.plot(opts["plot"], series, f"{name}: {config.processes} processes, {config.products} product(s)")
            self.stdout.write(f"plot written to {opts['plot']}")
        if config.keep:
            self.stdout.write(f"kept the run's rows: users and products tagged lt-{outcome.workload.run_id}-")
        if not outcome.passed:
            raise CommandError("invariant check FAILED" if outcome.violations else "payment check FAILED")

    def _print_outcome(self, outcome: Outcome) -> None:
        self.stdout.write("")
        self.stdout.write(report.run_table(outcome.summaries))
        if len(outcome.result.servers) > 1:
            self.stdout.write("")
            self.stdout.write(report.servers_table(outcome.result.servers))
        if outcome.result.errors:
            self.stdout.write("first errors:")
            for line in outcome.result.errors[:5]:
                self.stdout.write(f"  {line}")
        for s in outcome.summaries:
            if s.phase == "storm":
                self.stdout.write(
                    f"after sell-out: {s.rejections_per_s:,.0f} rejections/s; the workers sent {s.queries:,} SQL "
                    f"statements and took {s.lock_acquisitions:,} locks; MySQL server-wide (all clients): "
                    + ", ".join(f"{k.removeprefix('mysql_')} +{v:,}" for k, v in s.server.items())
                )
        for s in outcome.summaries:
            if s.cpu_ms and s.phase != "storm":
                self.stdout.write(cpu.describe(s.cpu_ms) + (f" [{s.phase}]" if len(outcome.summaries) > 1 else ""))
        sold = sum(b.sold for b in outcome.books)
        drop = sum(b.initial - b.current for b in outcome.books)
        self.stdout.write(f"\nbooks: {sold:,} units in placed orders; stock fell by {drop:,}")
        if outcome.oversold:
            self.stdout.write(self.style.ERROR(
                f"OVERSOLD: {outcome.oversold:,} units were sold that the stock never had "
                f"(lost updates: concurrent buyers read the same stock and each wrote back its own result)"
            ))
        if outcome.payments is not None:
            self._print_payments(outcome.payments)
        if not outcome.violations:
            self.stdout.write(self.style.SUCCESS("invariants I1-I6: PASS"))
        else:
            self.stdout.write(self.style.ERROR("invariants I1-I6: FAIL"))
            for v in outcome.violations:
                self.stdout.write(self.style.ERROR(f"  {v}"))

    def _print_payments(self, p: scenarios.Payments) -> None:
        expired = f" ({p.expired_orders:,} orders expired)" if p.expiry == "ran" else ""
        self.stdout.write(f"payments: {p.paid:,} units paid, {p.pending:,} units unpaid; expiry {p.expiry}{expired}")
        for text, ok in p.checks:
            self.stdout.write(self.style.SUCCESS(f"ok    {text}") if ok else self.style.ERROR(f"FAIL  {text}"))
        if p.expiry.startswith("skipped"):
            self.stdout.write(self.style.WARNING("the check after expiry was not made (see above)"))

    # -- the comparison --------------------------------------------------------------------
    def _compare(self, base: LoadConfig, opts: dict[str, Any]) -> None:
        if opts["url"]:
            raise CommandError("--compare calls the strategies directly; it does not take --url")
        if opts["cpu_profile"]:
            raise CommandError("--cpu-profile profiles one run: use it without --compare")
        names = name_list(opts["strategies"], list(strategies.STRATEGIES), "--strategies")
        chosen = name_list(opts["scenarios"], list(scenarios.SCENARIOS), "--scenarios")
        if strategies.PythonRedisLock.name in names:
            others = ",".join(n for n in names if n != strategies.PythonRedisLock.name)
            extras.require("redis_lock", package="python-redis-lock", needed_by="--compare with python_redis_lock",
                           instead=f"leave it out: --strategies {others}")
        if base.duration is None:
            base.duration = 5.0  # comparisons run for a fixed time: orders/s is then like for like
        comparison = Comparison(strategies=names, scenarios=chosen, repeat=opts["repeat"], base=base)
        total = len(names) * len(chosen) * opts["repeat"]
        self.stdout.write(
            f"loadtest --compare: {len(names)} strategies x {len(chosen)} scenarios x {opts['repeat']} repeats "
            f"= {total} runs of {base.duration:g} s, {base.processes} processes each"
        )
        progress = self._progress(opts, "compare", final=False)
        finished = self._run_lines(progress, total)

        def on_run(scenario: str, repeat: int, outcome: Outcome) -> None:
            s = outcome.summaries[-1]
            rate = (f"{s.rejections_per_s:,.0f} rejections/s" if s.phase == report.STORM_PHASE
                    else f"{s.orders_per_s:,.0f} orders/s")
            finished(f"{scenario} #{repeat + 1} {outcome.config.strategy}", outcome, rate)

        scenarios.compare(comparison, spread=opts["spread_products"], sellout_stock=opts["sellout_stock"],
                          progress=progress, on_run=on_run)
        if progress:
            progress.done()
        self._print_comparison(comparison, opts)
        failed = comparison.unexpected_failures()
        if failed:
            raise CommandError(f"invariant check FAILED for {', '.join(sorted({o.config.strategy for o in failed}))}")

    def _run_lines(self, progress: Any, total: int) -> Callable[[str, Outcome, str], None]:
        """For a run of runs (--compare, --compare-http): a line on stderr as each one ends,
        `[done/total] label: rate, p99, PASS|FAIL`, and the progress line moved on."""
        done = 0

        def finished(label: str, outcome: Outcome, rate: str) -> None:
            nonlocal done
            done += 1
            if progress:
                progress.done()
            p99 = outcome.summaries[-1].latency_ms["p99"]
            self.stderr.write(f"[{done}/{total}] {label}: {rate}, p99 {p99:,.1f} ms, "
                              f"{'PASS' if outcome.passed else 'FAIL'}")

        return finished

    def _print_comparison(self, comparison: Comparison, opts: dict[str, Any]) -> None:
        data: dict[str, Any] = {"strategies": comparison.strategies, "repeat": comparison.repeat,
                                "processes": comparison.base.processes, "duration": comparison.base.duration,
                                "scenarios": {}}
        for scenario in comparison.scenarios:
            aggregates = comparison.aggregates(scenario)
            self.stdout.write("")
            self.stdout.write(self.style.MIGRATE_HEADING(
                f"{scenario}: {scenarios.SCENARIOS[scenario]} (medians of {comparison.repeat})"))
            if scenario == "sellout":
                hot = {a.strategy: a.orders_per_s for a in comparison.aggregates("hot")}
                if not hot:  # no hot scenario in this run: compare with the sell-out phase itself
                    hot = {name: report.aggregate(name, scenario, [o.summaries[0] for o in outs], 0).orders_per_s
                           for name, outs in comparison.runs[scenario].items() if outs}
                self.stdout.write(report.sellout_table(aggregates, hot))
                self.stdout.write("ratio = rejections/s after sell-out / placed orders/s (hot scenario when run). "
                                  "SQL sent and lock acq. are counted by the clients and the lock service during "
                                  "the storm; Questions/Com_update are server-wide and include other clients.")
            else:
                self.stdout.write(report.comparison_table(aggregates))
            data["scenarios"][scenario] = {
                "aggregates": [a.as_dict() for a in aggregates],
                "runs": {name: [o.as_dict() for o in outs] for name, outs in comparison.runs[scenario].items()},
            }
        if "hot" in comparison.scenarios and "spread" in comparison.scenarios:
            self.stdout.write("")
            self.stdout.write(report.scaling_table(comparison.aggregates("hot"), comparison.aggregates("spread"),
                                                   opts["spread_products"]))
        for scenario, per in comparison.runs.items():
            for name, outs in per.items():
                if any(o.oversold for o in outs):
                    worst = max(o.oversold for o in outs)
                    self.stdout.write(self.style.ERROR(
                        f"{name} ({scenario}) OVERSOLD: up to {worst:,} units more than the stock had"))
        if opts["json"]:
            report.write_json(opts["json"], data)
            self.stdout.write(f"JSON written to {opts['json']}")
        if opts["plot"]:
            scenario = "hot" if "hot" in comparison.runs else comparison.scenarios[0]
            series = {}
            for name, outs in comparison.runs[scenario].items():
                if outs:  # the median run by orders/s
                    mid = sorted(outs, key=lambda o: o.summaries[-1].orders_per_s)[len(outs) // 2]
                    series[name] = report.timeline(r for w in mid.result.phases[-1].records for r in w)
            report.plot(opts["plot"], series, f"{scenario}: {comparison.base.processes} processes (median run each)")
            self.stdout.write(f"plot written to {opts['plot']}")

    # -- in process against over HTTP ----------------------------------------------------------
    def _compare_http(self, base: LoadConfig, opts: dict[str, Any]) -> None:
        refused = [name for name, given in (
            ("--strategy (the checkout is ours)", base.strategy != strategies.Ours.name),
            ("--sellout", base.sellout), ("--coupon", base.coupon_total is not None), ("--no-lock", not base.lock),
            ("--cpu-profile", bool(base.cpu_profile))) if given]
        if refused:
            raise CommandError(f"--compare-http runs the shop's checkout as it ships, the same on both paths: "
                               f"leave out {', '.join(refused)}")
        n, w, t = opts["servers"] or 1, opts["server_workers"], opts["server_threads"]
        if n < 1 or w < 1 or t < 1:
            raise CommandError("--servers, --server-workers and --server-threads must be at least 1")
        if opts["warmup"] < 0:
            raise CommandError("--warmup cannot be negative")
        if base.duration is None:
            base.duration = 5.0  # a fixed time: orders/s is then like for like
        comparison = httpcompare.HttpComparison(base=base, repeat=opts["repeat"], servers=n, workers=w, threads=t,
                                                warmup=opts["warmup"])
        total = len(httpcompare.MODES) * comparison.repeat
        self.stdout.write(
            f"loadtest --compare-http: in process, over HTTP and the floor (GET /api/ping/), {comparison.repeat} "
            f"alternating round(s) = {total} runs of {base.duration:g} s, {base.processes} client processes each, "
            f"{base.products} product(s) x {base.stock:,} stock, {base.users} users; {n} app server(s) with the "
            f"shipped config (config/gunicorn.conf.py), {w} workers x {t} threads each")
        if settings.DEBUG:
            self.stdout.write(self.style.WARNING(
                "DEBUG is on in this process: the in-process checkout keeps every SQL statement and runs slower "
                "than the app servers (always DEBUG off); run with DEBUG=false for figures"))
        servers = appservers.AppServers(n, workers=w, threads=t)
        try:
            servers.start()
        except RuntimeError as exc:
            raise CommandError(f"an app server did not start: {exc}\n{servers.logs()}") from exc
        progress = self._progress(opts, "compare-http", final=False)
        finished = self._run_lines(progress, total)

        def on_run(round_: int, mode: str, outcome: Outcome) -> None:
            s = outcome.summaries[-1]
            rate = (f"{s.attempted / s.window if s.window else 0:,.0f} requests/s" if mode == httpcompare.FLOOR
                    else f"{s.orders_per_s:,.0f} orders/s")
            finished(f"round {round_ + 1} {mode}", outcome, rate)

        if comparison.warmup:
            self.stderr.write(f"warming the app servers up: {comparison.warmup:g} s of HTTP orders, not counted")
        try:
            httpcompare.run(comparison, urls=servers.urls, groups=servers.groups, progress=progress, on_run=on_run)
        finally:
            servers.stop()
        if progress:
            progress.done()
        self._print_http_comparison(comparison, opts)
        failed = comparison.failures()
        if failed:
            raise CommandError(f"invariant check FAILED for {', '.join(failed)}")

    def _print_http_comparison(self, comparison: httpcompare.HttpComparison, opts: dict[str, Any]) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(
            f"the checkout in process, over HTTP, and the request path's floor (medians of {comparison.repeat})"))
        self.stdout.write(httpcompare.table(comparison))
        self.stdout.write(httpcompare.NOTE)
        self.stdout.write("")
        for line in httpcompare.verdict(comparison):
            self.stdout.write(line)
        for mode, outs in comparison.runs.items():
            errors = [e for o in outs for e in o.result.errors]
            if errors:
                self.stdout.write(f"first errors ({mode}):")
                for line in errors[:5]:
                    self.stdout.write(f"  {line}")
            worst = max((o.oversold for o in outs), default=0)
            if worst:
                self.stdout.write(self.style.ERROR(f"{mode} OVERSOLD: up to {worst:,} units more than the stock had"))
        failed = comparison.failures()
        runs = sum(map(len, comparison.runs.values())) + (comparison.warmed is not None)
        if not failed:
            self.stdout.write(self.style.SUCCESS(
                f"invariants I1-I6: PASS (after each of the {runs} runs, the warm-up's included)"
                if comparison.warmed is not None else f"invariants I1-I6: PASS (after each of the {runs} runs)"))
        else:
            self.stdout.write(self.style.ERROR("invariants I1-I6: FAIL"))
            for mode, outs in failed.items():
                for v in (v for o in outs for v in o.violations):
                    self.stdout.write(self.style.ERROR(f"  {mode}: {v}"))
        if opts["json"]:
            report.write_json(opts["json"], comparison.as_dict())
            self.stdout.write(f"JSON written to {opts['json']}")
        if opts["plot"]:
            series = {}
            for mode, outs in comparison.runs.items():
                if outs:  # the median run by requests/s
                    mid = sorted(outs, key=lambda o: o.summaries[-1].attempted / (o.summaries[-1].window or 1))
                    series[mode] = report.timeline(r for w in mid[len(mid) // 2].result.phases[-1].records for r in w)
            report.plot(opts["plot"], series,
                        f"in process / HTTP / floor: {comparison.base.processes} processes (median run each)")
            self.stdout.write(f"plot written to {opts['plot']}")
