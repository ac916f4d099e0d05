"""`manage.py run_jobs`: the scheduler. Run it on every app server; each tick runs once in all.

    manage.py run_jobs                 run forever: sleep until the next tick (or lease end), run
                                       what is due, repeat; SIGTERM/Ctrl-C stop after the current job
    manage.py run_jobs --once          run what is due now, then exit
    manage.py run_jobs --ticks 30      stop after 30 passes that began a new tick (tests, smoke runs)
    manage.py run_jobs --job NAME      only this job (repeatable)
    manage.py run_jobs --list          recent runs per job: who ran each tick, when, how long, outcome
                                       (the command-line twin of the admin's Job runs page)
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from locks.jobs import Job, Runner, TickResult, registry
from locks.models import JobRun


class Command(BaseCommand):
    help = "Run the scheduled jobs (each tick once in the whole cluster), or list their recent runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run what is due now, then exit")
        parser.add_argument("--ticks", type=int, metavar="N", help="stop after N passes that began a new tick")
        parser.add_argument("--job", action="append", metavar="NAME", help="only this job (repeatable)")
        parser.add_argument("--list", action="store_true", help="show recent runs per job and exit")
        parser.add_argument("--limit", type=int, default=10, help="--list: runs shown per job (default 10)")

    def handle(self, *args: Any, **opts: Any) -> None:
        self.verbosity = opts["verbosity"]
        if opts["ticks"] is not None and opts["ticks"] < 1:
            raise CommandError("--ticks must be at least 1")
        try:
            jobs = [registry.get(name) for name in opts["job"]] if opts["job"] else registry.all()
        except KeyError as exc:
            raise CommandError(exc.args[0]) from exc
        if opts["list"]:
            self._list(jobs, opts["limit"], only=bool(opts["job"]))
            return
        runner = Runner(jobs)
        if opts["once"]:
            for result in runner.run_due():
                self._report(result)
            return
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.stdout.write(f"running {len(jobs)} job{'s' if len(jobs) != 1 else ''}: "
                              f"{', '.join(j.name for j in jobs) or 'none'} (idle ticks are not printed; -v 2 "
                              f"prints them)")
            runner.run(ticks=opts["ticks"], stop=stop, on_result=self._report)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _report(self, result: TickResult) -> None:
        """One line per tick that did something or failed; an idle tick ("sent 0", every 5 s) only
        with -v 2: in a terminal shared with the dev server's mail, it drowned the mail."""
        if result.idle and self.verbosity < 2:
            return
        took = " (taken over)" if result.took_over else ""
        detail = f": {result.detail}" if result.detail else ""
        self.stdout.write(f"{result.job} tick {result.tick}: {result.outcome}{took}{detail}")

    def _list(self, jobs: list[Job], limit: int, *, only: bool) -> None:
        names = {j.name for j in jobs}
        if not only:
            names |= set(JobRun.objects.values_list("job", flat=True).distinct())
        known = {j.name: j for j in registry.all()}
        now = time.time()
        for name in sorted(names):
            job = known.get(name)
            every = f"every {job.every:g}s, lease {job.lease:g}s" if job else "not registered here"
            self.stdout.write(self.style.MIGRATE_HEADING(f"{name} ({every})"))
            runs = list(JobRun.objects.filter(job=name).order_by("-tick")[:limit])
            if not runs:
                self.stdout.write("  no runs yet")
                continue
            self.stdout.write(f"  {'tick':>12} {'due':<19} {'runner':<32} {'started':<23} {'ms':>9} {'outcome':<10} "
                              f"{'takeovers':>9}")
            for r in runs:
                ms = "-" if r.duration is None else f"{r.duration * 1000:.1f}"
                outcome = r.outcome
                if outcome in JobRun.ACTIVE and r.lease_until.timestamp() < now:
                    outcome += " (lease over)"
                started = f"{r.started_at:%Y-%m-%d %H:%M:%S.%f}"[:-3]  # to the ms
                self.stdout.write(f"  {r.tick:>12} {r.due_at:%Y-%m-%d %H:%M:%S} {r.runner:<32} {started:<23} "
                                  f"{ms:>9} {outcome:<10} {r.takeovers:>9}")
                if r.taken_over_from:
                    self.stdout.write(f"  {'':>12} taken over from {r.taken_over_from}")
                if r.error:
                    self.stdout.write(f"  {'':>12} error: {r.error.strip().splitlines()[-1]}")
