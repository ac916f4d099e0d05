"""`manage.py locks`: the command-line twin of the admin lock dashboard.

    manage.py locks                      held locks (waiters, queued combining requests), stats by lock
                                         family with the busiest names, combining batches by family
    manage.py locks --all                held locks found by SCANning the keyspace (complete, costly)
    manage.py locks --watch 2            the same, refreshed every 2 s (Ctrl-C to stop)

Like the dashboard, it lists held locks from the held index and the busiest names (no SCAN), so
a lock appears once its holder's stats flush ran (<= LOCKS["STATS_FLUSH_INTERVAL"]).
    manage.py locks events               recent timeouts, lost locks, force releases, long waits
    manage.py locks release product:42   force-release after confirmation (--yes to skip it;
                                         --fence F: only the holder with fence F)
    manage.py locks reset-stats          forget every family's statistics (after a load test), after
                                         confirmation (--yes to skip it); the admin's "Reset
                                         statistics" twin, written to the event log
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from locks import inspect
from locks.exceptions import HolderChanged, LockUnavailable
from locks.services import cli_actor_name, force_release_lock, reset_lock_stats


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _quantile(name: str) -> Callable[[inspect.LockStats], float]:
    return lambda s: s.quantiles()[name] or 0.0


# `--sort`: what orders the stats table (largest first, except name).
SORTS: dict[str, Callable[[inspect.LockStats], Any]] = {
    "acquired": lambda s: s.counters.get("acquired", 0),
    "contention": lambda s: s.contention,
    "timeouts": lambda s: s.counters.get("timeouts", 0),
    "lost": lambda s: s.counters.get("lost", 0),
    "wait": _quantile("wait_p99"),
    "hold": _quantile("hold_p99"),
    "batches": lambda s: s.counters.get("batches", 0),
    "name": lambda s: s.name,
}


class Command(BaseCommand):
    help = "Show held locks and lock statistics, or force-release a lock."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", default="show", choices=["show", "events", "release", "reset-stats"],
                            help="show held locks and stats (default), the event log, release a lock, or reset "
                                 "the statistics")
        parser.add_argument("name", nargs="?", help="lock name, for release (e.g. product:42)")
        parser.add_argument("--prefix", default="", help="only locks whose name starts with this")
        parser.add_argument("--limit", type=int, default=50, help="rows per table (default 50)")
        parser.add_argument("--all", action="store_true",
                            help="find held locks by SCANning the whole keyspace (complete, but costly)")
        parser.add_argument("--top", type=int, default=3, help="busiest names shown per family (default 3)")
        parser.add_argument("--sort", choices=sorted(SORTS), default="acquired",
                            help="order of the stats table, largest first (name: A-Z); default acquired")
        parser.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")
        parser.add_argument("--iterations", type=int, default=0, help="with --watch: stop after N refreshes")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--yes", action="store_true", help="release or reset without asking")
        parser.add_argument("--fence", type=int, help="release: only if the holder still has this fence")
        parser.add_argument("--actor", help="release, reset-stats: the name written to the audit trail / event log "
                                            "(default user@host)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        if opts["watch"] is not None and opts["watch"] <= 0:
            raise CommandError("--watch needs a positive number of seconds")
        try:
            if opts["action"] == "release":
                self._release(opts)
            elif opts["action"] == "reset-stats":
                self._reset_stats(opts)
            elif opts["action"] == "events":
                self._events(opts)
            elif opts["watch"]:
                n = 0
                while True:
                    self.stdout.write("\033[2J\033[H" if not opts["json"] else "")
                    self._show(opts)
                    n += 1
                    if opts["iterations"] and n >= opts["iterations"]:
                        break
                    time.sleep(opts["watch"])
            else:
                self._show(opts)
        except LockUnavailable as exc:
            raise CommandError(f"the lock backend is unreachable: {exc}") from exc
        except KeyboardInterrupt:
            pass

    def _show(self, opts: dict[str, Any]) -> None:
        stats = inspect.lock_stats(prefix=opts["prefix"], top=max(opts["top"], 0))
        stats.sort(key=SORTS[opts["sort"]], reverse=opts["sort"] != "name")
        if opts["all"]:
            held = inspect.held_locks(prefix=opts["prefix"], limit=opts["limit"])
        else:
            hot = [name for s in stats for name, _ in s.top_names]
            _, held = inspect.held_index_page(prefix=opts["prefix"], count=opts["limit"], also=hot)
            held = sorted(held, key=lambda h: h.name)[: opts["limit"]]
        total = inspect.totals(stats)
        if opts["json"]:
            self.stdout.write(json.dumps({
                "held": [h.as_dict() for h in held],
                "stats": [s.as_dict() for s in stats[: opts["limit"]]],
                "totals": total.as_dict(),
                "backend": inspect.backend_info(),
            }, indent=2))
            return
        backend = inspect.backend_info()
        self.stdout.write(f"Lock backend: {backend['label']}" + (f" ({backend['limitations']})"
                                                                 if backend["limitations"] else ""))
        self.stdout.write(self.style.MIGRATE_HEADING(f"Held locks ({len(held)})"))
        if held:
            self.stdout.write(f"{'name':<32} {'owner':<28} {'fence':>18} {'held ms':>9} {'ttl ms':>8} {'waiters':>7} "
                              f"{'requests':>8}")
            for h in held:
                requests = f"{h.queued_requests}{'+' if h.queued_requests_more else ''}"
                self.stdout.write(
                    f"{h.name:<32} {h.owner:<28} {h.fence:>18} {h.held_for * 1000:>9.1f} "
                    f"{h.ttl_left * 1000:>8.0f} {h.waiters:>7} {requests:>8}"
                )
        else:
            self.stdout.write("  none")
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Lock stats ({len(stats)} families)"))
        header = (f"{'name':<32} {'acquired':>9} {'contend%':>8} {'timeouts':>8} {'lost':>5} {'forced':>6} "
                  f"{'wait p50 ms':>11} {'wait p99 ms':>11} {'hold p50 ms':>11} {'hold p99 ms':>11}")
        self.stdout.write(header)
        for s in [*stats[: opts["limit"]], total] if stats else []:
            q = s.quantiles()
            c = s.counters
            self.stdout.write(
                f"{s.name:<32} {c.get('acquired', 0):>9} {s.contention * 100:>7.1f}% {c.get('timeouts', 0):>8} "
                f"{c.get('lost', 0):>5} {c.get('force_released', 0):>6} {_ms(q['wait_p50']):>11} "
                f"{_ms(q['wait_p99']):>11} {_ms(q['hold_p50']):>11} {_ms(q['hold_p99']):>11}"
            )
            if s.top_names:
                self.stdout.write("    busiest: " + ", ".join(f"{n} ({a})" for n, a in s.top_names))
        if not stats:
            self.stdout.write("  none")
        self._combining(stats, total)

    def _combining(self, stats: list[inspect.LockStats], total: inspect.LockStats) -> None:
        """Batches served by combiners, per family (sizes count the combiner's own request)."""
        rows = [s for s in stats if s.counters.get("batches")]
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Combining ({len(rows)} families)"))
        if not rows:
            self.stdout.write("  none")
            return
        self.stdout.write(f"{'name':<32} {'batches':>8} {'requests':>9} {'mean':>6} {'p50':>5} {'p99':>5} "
                          f"{'last batch':>12}  sizes (size: batches)")
        now = time.time()
        for s in [*rows, total] if len(rows) > 1 else rows:
            b = s.batch_summary()
            last = inspect.ago(None if b["last_batch_at"] is None else now - b["last_batch_at"])
            sizes = ", ".join(f"{k}: {n}" for k, n in b["batch_sizes"].items())
            self.stdout.write(
                f"{s.name:<32} {b['batches']:>8} {b['batched_requests']:>9} {b['mean_batch'] or 0:>6.2f} "
                f"{b['batch_p50'] or '-':>5} {b['batch_p99'] or '-':>5} {last:>12}  {sizes}"
            )

    def _events(self, opts: dict[str, Any]) -> None:
        events = inspect.recent_events(limit=opts["limit"])
        if opts["json"]:
            self.stdout.write(json.dumps(events, indent=2))
            return
        for e in events:
            at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            extra = " ".join(f"{k}={v}" for k, v in e.items() if k not in {"at", "kind", "name"})
            self.stdout.write(f"{at} {e['kind']:<14} {e['name']:<32} {extra}")
        if not events:
            self.stdout.write("no events")

    def _release(self, opts: dict[str, Any]) -> None:
        name = opts["name"]
        if not name:
            raise CommandError("usage: manage.py locks release NAME [--yes]")
        try:
            info = inspect.lock_info(name)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if info is None:
            raise CommandError(f"lock {name!r} is not held")
        expected = opts["fence"]
        if not opts["yes"]:
            self.stdout.write(
                f"{name} is held by {info.owner} (fence {info.fence}) for {info.held_for:.1f}s, "
                f"{info.ttl_left:.1f}s left, {info.waiters} waiting."
            )
            answer = input("Force-release it? The holder's later writes will be refused. [y/N] ")
            if answer.strip().lower() not in {"y", "yes"}:
                raise CommandError("not released")
            if expected is None:
                expected = info.fence  # release the holder that was shown, no other
        try:
            released = force_release_lock(name=name, expected_fence=expected,
                                          actor_name=opts["actor"] or cli_actor_name())
        except HolderChanged as exc:
            raise CommandError(f"not released: the holder changed ({exc.owner} holds it now, fence {exc.fence})"
                               ) from exc
        if released is None:
            self.stdout.write(f"{name} was released before we got to it")
        else:
            self.stdout.write(self.style.SUCCESS(
                f"released {name} (was {released.owner}, fence {released.fence}); next waiter woken"
            ))

    def _reset_stats(self, opts: dict[str, Any]) -> None:
        if not opts["yes"]:
            families = inspect.families()
            self.stdout.write(f"{len(families)} lock families have statistics: {', '.join(families[:10]) or '-'}"
                              f"{', ...' if len(families) > 10 else ''}")
            answer = input("Reset them? Held locks, fences and the event log are kept. [y/N] ")
            if answer.strip().lower() not in {"y", "yes"}:
                raise CommandError("not reset")
        families = reset_lock_stats(actor_name=opts["actor"] or cli_actor_name())
        self.stdout.write(self.style.SUCCESS(
            f"reset the statistics of {len(families)} lock famil{'y' if len(families) == 1 else 'ies'}"))
