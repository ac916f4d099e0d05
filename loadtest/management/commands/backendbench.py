"""Every lock backend on the same hot-product load, side by side in one run.

    manage.py backendbench                        # all backends, 16 processes, 5 s, 3 repeats
    manage.py backendbench --backends redis,mysql --duration 3 --repeat 1

Each backend runs on private servers this command starts (and stops by pid); the buyers call
the shop's checkout (`place_order`, strategy "ours") in forked processes, exactly as
`loadtest --compare` does; runs are interleaved (the order rotates each repeat) so a noisy
minute is spread over all backends. Prints orders/s, latency percentiles and the ratio to one
Redis; the books (I1-I6) are checked after every run. DEBUG off for figures worth quoting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from loadtest import lockservices, report, scenarios, workload
from loadtest.management.commands.loadtest import name_list
from loadtest.scenarios import LoadConfig, Outcome
from loadtest.servers import zookeeper


class Command(BaseCommand):
    help = "Compare the lock backends (Redis, Sentinel, Cluster, Redlock, ZooKeeper, MySQL) on one hot product."

    def add_arguments(self, parser: CommandParser) -> None:
        names = ",".join(lockservices.SERVICES)
        parser.add_argument("--backends", default=names, help=f"comma-separated (default: all: {names})")
        parser.add_argument("--processes", type=int, default=16, help="buyer processes (default 16)")
        parser.add_argument("--duration", type=float, default=5.0, help="seconds per run (default 5)")
        parser.add_argument("--repeat", type=int, default=3, help="runs per backend (default 3)")
        parser.add_argument("--users", type=int, default=100, help="distinct buyers (default 100)")
        parser.add_argument("--json", metavar="FILE", help="write every figure as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        # Load-test buyers never pay: the unpaid-orders limit would refuse them after a few orders.
        settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_UNPAID_ORDERS": None}
        names = name_list(opts["backends"], list(lockservices.SERVICES), "--backends")
        if opts["processes"] < 1 or opts["repeat"] < 1 or opts["users"] < 1:
            raise CommandError("--processes, --repeat and --users must be at least 1")
        if opts["duration"] <= 0:
            raise CommandError("--duration must be a positive number of seconds")
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        if "zookeeper" in names and not zookeeper.installed():
            others = ",".join(n for n in names if n != "zookeeper")
            raise CommandError("ZooKeeper is not installed (Debian's zookeeper package, with Java): "
                               "./dev.sh setup test installs it"
                               + (f" (or leave it out: --backends {others})" if others else ""))
        base = LoadConfig(strategy="ours", products=1, stock=1_000_000, users=opts["users"],
                          processes=opts["processes"], requests=None, duration=opts["duration"])
        runs: dict[str, list[Outcome]] = {name: [] for name in names}
        self.stdout.write(f"backendbench: {', '.join(names)}; one hot product, {base.processes} processes, "
                          f"{base.duration:g} s x {opts['repeat']}")
        with lockservices.started(names) as found:
            for r in range(opts["repeat"]):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    with found[name].switched():
                        outcome = scenarios.run_once(dataclasses.replace(base, seed=r))
                    runs[name].append(outcome)
                    s = outcome.summaries[-1]
                    self.stdout.write(f"  {name:<14} run {r + 1}: {s.orders_per_s:8,.1f} orders/s  "
                                      f"p99 {s.latency_ms['p99']:7.1f} ms  busy {s.counts['busy']:>4}  "
                                      f"{'PASS' if outcome.passed else 'FAIL'}")
        aggregates = [report.aggregate(name, "hot", [o.summaries[-1] for o in runs[name]],
                                       failures=sum(not o.passed for o in runs[name]),
                                       batches=[report.batch_summary(o.batches) for o in runs[name]])
                      for name in names]
        self.stdout.write("")
        self.stdout.write(table(aggregates))
        if opts["json"]:
            report.write_json(opts["json"], {
                "config": dataclasses.asdict(base), "repeat": opts["repeat"],
                "backends": {a.strategy: {**a.as_dict(), "description": lockservices.SERVICES[a.strategy].description}
                             for a in aggregates},
            })
            self.stdout.write(f"JSON written to {opts['json']}")
        failed = [name for name, outcomes in runs.items() if any(not o.passed for o in outcomes)]
        if failed:
            raise CommandError(f"invariant check FAILED on: {', '.join(failed)}")


def table(aggregates: list[report.Aggregate]) -> str:
    by = {a.strategy: a for a in aggregates}
    base = by.get("redis")
    rows = [[a.strategy, a.orders_per_s, report._ratio(a.orders_per_s, base and base.orders_per_s), a.p50_ms,
             a.p99_ms, report._ratio(a.p99_ms, base and base.p99_ms), a.max_ms, a.fairness,
             f"{a.batch_mean:.1f}" if a.batch_mean else "-", a.busy, a.invariants] for a in aggregates]
    return report.table(("backend", "orders/s", "vs redis", "p50 ms", "p99 ms", "p99 vs redis", "max ms",
                         "fairness", "per hold", "busy", "invariants"), rows)
