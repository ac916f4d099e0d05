"""`manage.py lockbench`: our lock against redis-py's Lock and python-redis-lock, interleaved."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from loadtest import extras, lockbench
from locks.conf import locks_settings


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


class Command(BaseCommand):
    help = ("Benchmark our lock against redis-py's Lock (django-redis cache.lock()) and python-redis-lock. "
            "Redlock: --only redlock,pottery compares our redlock backend with pottery's Redlock on the same "
            "masters: LOCKS_REDLOCK_URLS (or --redlock-urls), or --redlock-servers N to start N private "
            "masters (loadtest/servers/redlock.py) for the run.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=int, default=16)
        parser.add_argument("--duration", type=float, default=5.0, help="seconds per round (default 5)")
        parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per contender (default 3)")
        parser.add_argument("--locks", type=int, default=1, help="distinct lock names (default 1: one hot lock)")
        parser.add_argument("--work-ms", type=float, default=1.0, help="critical section length (default 1 ms)")
        parser.add_argument("--critical", choices=lockbench.CRITICAL, default="sleep",
                            help="sleep: GET+sleep+SET in Redis; redis: GET+SET only; mysql: SELECT SLEEP()")
        parser.add_argument("--only", default=",".join(lockbench.CONTENDERS),
                            help=f"comma-separated contenders (default {','.join(lockbench.CONTENDERS)}; also "
                                 f"{','.join(lockbench.REDLOCK_CONTENDERS)}, on the Redlock masters)")
        parser.add_argument("--redlock-urls", default="",
                            help="comma-separated redis:// URLs of the Redlock masters (default LOCKS_REDLOCK_URLS)")
        parser.add_argument("--redlock-servers", type=int, default=0, metavar="N",
                            help="start N private Redis masters for redlock/pottery (stopped afterwards); "
                                 "overrides --redlock-urls")
        parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")

    def handle(self, *args: Any, **opts: Any) -> None:
        contenders = tuple(c.strip() for c in opts["only"].split(",") if c.strip())
        unknown = set(contenders) - set(lockbench.ALL_CONTENDERS)
        if unknown or not contenders:
            raise CommandError(f"--only takes {', '.join(lockbench.ALL_CONTENDERS)} (got {opts['only']!r})")
        if not 1 <= opts["processes"] <= 256:
            raise CommandError("--processes must be from 1 to 256")
        if not 0.1 <= opts["duration"] <= 600:
            raise CommandError("--duration must be from 0.1 to 600 seconds")
        if not 1 <= opts["rounds"] <= 50:
            raise CommandError("--rounds must be from 1 to 50")
        if not 1 <= opts["locks"] <= opts["processes"]:
            raise CommandError("--locks must be from 1 to --processes")
        if not 0 <= opts["work_ms"] <= 10_000:
            raise CommandError("--work-ms must be from 0 to 10000")
        if "python-redis-lock" in contenders:
            others = ",".join(c for c in contenders if c != "python-redis-lock")
            extras.require("redis_lock", package="python-redis-lock", needed_by="the python-redis-lock contender",
                           instead=f"leave it out: --only {others}" if others else "")
        if "pottery" in contenders:
            extras.require("pottery", package="pottery", needed_by="the pottery contender")
        servers = None
        urls = tuple(u.strip() for u in opts["redlock_urls"].split(",") if u.strip()) or tuple(
            locks_settings.REDLOCK_URLS)
        if set(contenders) & set(lockbench.REDLOCK_CONTENDERS):
            if opts["redlock_servers"]:
                from loadtest.servers.redlock import RedlockServers

                if not 3 <= opts["redlock_servers"] <= 9:
                    raise CommandError("--redlock-servers must be from 3 to 9")
                servers = RedlockServers(opts["redlock_servers"]).start()
                urls = tuple(servers.urls)
            elif len(urls) < 3:
                raise CommandError("redlock/pottery need at least 3 Redis masters: set LOCKS_REDLOCK_URLS, "
                                   "pass --redlock-urls, or --redlock-servers 5 to start private ones")
        config = lockbench.Config(processes=opts["processes"], duration=opts["duration"], rounds=opts["rounds"],
                              locks=opts["locks"], work_ms=opts["work_ms"], critical=opts["critical"],
                              contenders=contenders, redlock_urls=urls)
        try:
            summaries = lockbench.run(config, progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
        finally:
            if servers is not None:
                servers.stop()
        self._report(config, summaries)
        if opts["json"]:
            with open(opts["json"], "w") as fh:
                json.dump({"config": vars(config) | {"contenders": list(contenders)},
                           "results": [s.as_dict() for s in summaries],
                           "targets": [{"target": t, "met": m, "figures": f}
                                       for t, m, f in lockbench.targets(summaries, config.processes)]}, fh, indent=2)
        if not all(s.counter_ok for s in summaries):
            raise CommandError("FAIL: a counter did not match the acquisitions: mutual exclusion was broken")

    def _report(self, config: lockbench.Config, summaries: list[lockbench.Summary]) -> None:
        w = self.stdout.write
        w(f"lockbench: {config.processes} processes, {config.locks} lock(s), {config.critical} critical section of "
          f"{config.work_ms:g} ms, {config.rounds} interleaved round(s) of {config.duration:g} s; medians over rounds")
        w("")
        w(f"{'contender':<18} {'acq/s':>8} {'wait p50 ms':>12} {'wait p99 ms':>12} {'wait max ms':>12} "
          f"{'fairness':>9} {'starved':>8} {'mutex':>6}")
        for s in summaries:
            w(f"{s.contender:<18} {s.rate:>8.0f} {_ms(s.wait_p50):>12} {_ms(s.wait_p99):>12} {_ms(s.wait_max):>12} "
              f"{s.fairness:>9.2f} {s.starved:>8} {'ok' if s.counter_ok else 'FAIL':>6}")
        by = {s.contender: s for s in summaries}
        ours = by.get("ours")
        if ours is not None:
            w("")
            for peer in summaries:
                if peer.contender == "ours":
                    continue
                rate = ours.rate / peer.rate if peer.rate else float("inf")
                p99 = ours.wait_p99 / peer.wait_p99 if peer.wait_p99 else float("inf")
                w(f"ours / {peer.contender}: throughput {rate:.2f}x, p99 wait {p99:.3f}x")
        notes = [s.contender for s in summaries if s.contender in lockbench.DESCRIPTIONS]
        if notes:
            w("")
            w(f"on {len(config.redlock_urls)} Redis masters:")
            for contender in notes:
                w(f"  {contender}: {lockbench.DESCRIPTIONS[contender]}")
            by_name = {s.contender: s for s in summaries}
            if "redlock" in by_name and "pottery" in by_name:
                ours_rl, pot = by_name["redlock"], by_name["pottery"]
                rate = ours_rl.rate / pot.rate if pot.rate else float("inf")
                p99 = ours_rl.wait_p99 / pot.wait_p99 if pot.wait_p99 else float("inf")
                w(f"redlock / pottery: throughput {rate:.2f}x, p99 wait {p99:.3f}x")
        checks = lockbench.targets(summaries, config.processes)
        if checks:
            w("")
            for label, met, figures in checks:
                w(f"{'PASS' if met else 'MISS'}  {label}: {figures}")
