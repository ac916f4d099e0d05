"""`manage.py coupon_storm`: many users claim one coupon at the same moment; the counts must be exact.

    manage.py coupon_storm                                500 users, 100 coupons, 8 processes
    manage.py coupon_storm --users 2000 --total 300 --processes 16 --attempts 2 --json storm.json
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from loadtest import report, scenarios, workload
from loadtest.runner import RunError
from loadtest.scenarios import StormConfig
from loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, PLACED, REJECTED

LEGEND = """\
attempted: claim requests sent; claimed: successes the clients were told; sold_out: refused, none left;
already_claimed: refused, this user holds one; busy: lock wait timed out, nothing written; errors: unexpected;
claims/s: successes over the measured window (first request start to last end); p50-max: latency of every request.
The checks below compare these with the claim rows in the database and the coupon's remaining count."""


def check_line(text: str, ok: bool | None, style: Any) -> str:
    """"ok" only for a check that held; "skip" for one the run could not make."""
    if ok is None:
        return style.WARNING(f"skip  {text}")
    return style.SUCCESS(f"ok    {text}") if ok else style.ERROR(f"FAIL  {text}")


class Command(BaseCommand):
    help = "Many users claim one coupon at once; check that exactly the right number got it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--users", type=int, default=500, help="users claiming (default 500)")
        parser.add_argument("--total", type=int, default=100, help="how many may claim it (default 100)")
        parser.add_argument("--processes", type=int, default=8, help="worker processes (default 8)")
        parser.add_argument("--attempts", type=int, default=1, help="claims per user (default 1; 2+ tests duplicates)")
        parser.add_argument("--lock-wait", type=float, default=3.0, help="lock wait timeout, seconds (default 3)")
        parser.add_argument("--seed", type=int, default=0, help="random seed for the users' order (default 0)")
        parser.add_argument("--json", metavar="FILE", help="write the figures and checks as JSON")
        parser.add_argument("--keep", action="store_true", help="keep the run's users, coupon and claims")
        parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")

    def handle(self, *args: Any, **opts: Any) -> None:
        for option in ("users", "total", "processes", "attempts"):
            if opts[option] < 1:
                raise CommandError(f"--{option} must be at least 1")
        if opts["lock_wait"] < 0:
            raise CommandError("--lock-wait cannot be negative")
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        config = StormConfig(users=opts["users"], total=opts["total"], processes=opts["processes"],
                             attempts=opts["attempts"], lock_wait=opts["lock_wait"], keep=opts["keep"],
                             seed=opts["seed"])
        self.stdout.write(f"coupon_storm: {config.users:,} users x {config.attempts} claim(s), "
                          f"coupon total {config.total:,}, {config.processes} processes")
        progress = None
        if not opts["no_progress"]:  # in the table's words: claimed, sold_out, already_claimed
            progress = report.ProgressLine(self.stderr, "claims", counts=report.CLAIM_COUNTS)
        try:
            outcome = scenarios.coupon_storm(config, progress)
        except RunError as exc:
            raise CommandError(str(exc)) from exc
        if progress:
            progress.done()
        s = outcome.summary
        self.stdout.write("")
        self.stdout.write(report.table(
            ("attempted", "claimed", "sold_out", "already_claimed", "busy", "errors", "claims/s",
             "p50 ms", "p95 ms", "p99 ms", "max ms"),
            [[s.attempted, s.counts[PLACED], s.counts[OUT_OF_STOCK], s.counts[REJECTED], s.counts[BUSY],
              s.counts[ERROR], s.orders_per_s, s.latency_ms["p50"], s.latency_ms["p95"], s.latency_ms["p99"],
              s.latency_ms["max"]]],
        ))
        self.stdout.write(LEGEND)
        if outcome.result.errors:
            self.stdout.write("first errors:")
            for line in outcome.result.errors[:5]:
                self.stdout.write(f"  {line}")
        self.stdout.write("")
        for text, ok in outcome.checks:
            self.stdout.write(check_line(text, ok, self.style))
        for v in outcome.violations:
            self.stdout.write(self.style.ERROR(f"FAIL  {v}"))
        verdict = "PASS" if outcome.passed else "FAIL"
        self.stdout.write((self.style.SUCCESS if outcome.passed else self.style.ERROR)(f"coupon storm: {verdict}"))
        if opts["json"]:
            report.write_json(opts["json"], {
                "run_id": outcome.workload.run_id, "users": config.users, "total": config.total,
                "attempts": config.attempts, "processes": config.processes, "summary": s.as_dict(),
                "claims": outcome.claims, "remaining": outcome.remaining,
                "checks": [{"check": t, "ok": ok, "skipped": ok is None} for t, ok in outcome.checks],
                "violations": outcome.violations, "result": verdict,
            })
            self.stdout.write(f"JSON written to {opts['json']}")
        if not outcome.passed:
            raise CommandError("coupon storm check FAILED")
