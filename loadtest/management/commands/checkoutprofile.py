"""Where one order's time goes (issue 22): the checkout against the guarded ORM loop.

    manage.py checkoutprofile                          per order: client CPU, wall, SQL, Redis
    manage.py checkoutprofile --products 8 --profile   and the cProfile (CPU clock) of each path

Sequential orders in one process: every order is a batch of one, the uncontended case. Run with
DEBUG off (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from loadtest import profile, report, workload


class Command(BaseCommand):
    help = "Client CPU, MySQL statements and Redis round trips per order: the checkout vs the guarded loop."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--orders", type=int, default=1000, help="orders per path (default 1000)")
        parser.add_argument("--products", type=int, default=8, help="products, ordered round robin (default 8)")
        parser.add_argument("--profile", action="store_true", help="print each path's cProfile (CPU clock)")
        parser.add_argument("--top", type=int, default=30, help="functions per profile (default 30)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["orders"] < 1 or opts["products"] < 1:
            raise CommandError("--orders and --products must be at least 1")
        if not workload.is_migrated():
            raise CommandError(workload.NOT_MIGRATED)
        settings.SHOP = {**getattr(settings, "SHOP", {}), "MAX_UNPAID_ORDERS": None}  # these buyers never pay
        costs = profile.compare(orders=opts["orders"], products=opts["products"], profile=opts["profile"],
                                top=opts["top"])
        if opts["profile"]:
            for cost in costs:
                self.stdout.write(f"--- {cost.name} ---\n{cost.profile}")
        base = costs[-1]
        rows = [[c.name, f"{c.cpu_ms:.2f}", f"{c.wall_ms:.2f}", f"{c.sql:.1f}", f"{c.redis:.1f}",
                 f"{c.cpu_ms / base.cpu_ms:.2f}x"] for c in costs]
        self.stdout.write(report.table(["path", "CPU ms/order", "wall ms/order", "SQL/order", "Redis/order",
                                        "CPU vs guarded"], rows))
