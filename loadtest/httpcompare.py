"""The checkout in process against the same checkout over HTTP, in one run (`loadtest --compare-http`).

Three modes, each closed loop with the same client processes, for the same time, on the same
kind of workload (its own products, stock and buyers, as every run): the rounds alternate (the
order rotates each round, so a noisy minute is spread over all three) and the figures are
medians over the rounds.

- in-process: the client processes call the checkout themselves (`ours`:
  `shop.services.place_order`), as `loadtest --compare` does;
- http: the same checkout through the JSON API (POST /api/orders/, a Bearer token per buyer) on
  app servers started for the run with the shipped configuration (config/gunicorn.conf.py: the
  shop's worker; the image's workers and threads unless told otherwise: loadtest/appservers.py);
- floor: GET /api/ping/ on the same servers, through the same middleware and token check, a
  JSON answer and no work of its own: what the request path alone allows.

The servers are started once for the whole run and warmed up first (`warmup` seconds of HTTP
orders, not counted, their books checked too): otherwise the first round's HTTP runs pay for
every worker's first requests (connections, lazy imports, scripts loaded) and the others do not.

CPU per request: the client processes' own time, and the app servers' (their process groups,
read from /proc), mysqld's and Redis's over the phase. In process the clients run the checkout
itself; over HTTP they only send the requests. Issue 39's target: HTTP orders/s at least 0.85x
in process.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loadtest import cpu, report, scenarios, strategies
from loadtest.runner import Progress
from loadtest.scenarios import LoadConfig, Outcome

IN_PROCESS, HTTP, FLOOR = "in-process", "http", "floor"
MODES = (IN_PROCESS, HTTP, FLOOR)
WHAT = {IN_PROCESS: "place_order, in the clients", HTTP: "POST /api/orders/", FLOOR: "GET /api/ping/"}
TARGET = 0.85  # issue 39: HTTP orders/s >= 0.85x in process
CPU_PARTS = ("clients", "app", "mysqld", "redis")


@dataclass
class Figures:
    """One mode: medians over its rounds (busy and errors: totals)."""

    mode: str
    what: str
    rounds: int
    requests: float  # per round (median)
    requests_per_s: float
    orders_per_s: float | None  # placed orders/s; None for the floor (it places none)
    p50_ms: float
    p99_ms: float
    busy: int
    errors: int
    cpu_ms: dict[str, float]  # per request: clients, app, mysqld, redis, total
    invariants: str  # "PASS" or "FAIL (n/rounds)"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def per_request(outcome: Outcome) -> dict[str, float]:
    """CPU ms per request (every answer, placed or not) of the run's measured phase."""
    summary, phase = outcome.summaries[-1], outcome.result.phases[-1]
    return cpu.per_order(client_cpu_s=phase.client_cpu, server=phase.server_delta, placed=summary.attempted)


def figures(mode: str, outcomes: list[Outcome]) -> Figures:
    summaries = [o.summaries[-1] for o in outcomes]
    costs = [per_request(o) for o in outcomes]
    failures = sum(not o.passed for o in outcomes)
    return Figures(
        mode=mode, what=WHAT[mode], rounds=len(outcomes),
        requests=_median(s.attempted for s in summaries),
        requests_per_s=_median(s.attempted / s.window if s.window else 0.0 for s in summaries),
        orders_per_s=None if mode == FLOOR else _median(s.orders_per_s for s in summaries),
        p50_ms=_median(s.latency_ms["p50"] for s in summaries),
        p99_ms=_median(s.latency_ms["p99"] for s in summaries),
        busy=sum(s.counts[strategies.BUSY] for s in summaries),
        errors=sum(s.counts[strategies.ERROR] for s in summaries),
        cpu_ms={k: _median(c[k] for c in costs if k in c) for k in (*CPU_PARTS, "total") if any(k in c for c in costs)},
        invariants="PASS" if not failures else f"FAIL ({failures}/{len(outcomes)})",
    )


@dataclass
class HttpComparison:
    """What the run is, and its outcomes per mode (one per round)."""

    base: LoadConfig
    repeat: int
    servers: int
    workers: int
    threads: int
    warmup: float = 1.0  # seconds of HTTP orders before the first round, not counted (0: none)
    runs: dict[str, list[Outcome]] = field(default_factory=lambda: {m: [] for m in MODES})
    warmed: Outcome | None = None  # the warm-up run (its books are checked like the others')

    def config(self, mode: str, urls: list[str], groups: list[int]) -> LoadConfig:
        if mode == IN_PROCESS:
            return dataclasses.replace(self.base, strategy=strategies.Ours.name, url=None, urls=[], app_groups=[])
        name = strategies.Ping.name if mode == FLOOR else strategies.Ours.name
        return dataclasses.replace(self.base, strategy=name, url=urls[0], urls=list(urls), app_groups=list(groups))

    def figures(self) -> dict[str, Figures]:
        return {mode: figures(mode, outs) for mode, outs in self.runs.items() if outs}

    def ratios(self) -> dict[str, Any]:
        f = self.figures()
        inproc, http, floor = f.get(IN_PROCESS), f.get(HTTP), f.get(FLOOR)
        vs_inproc = (http.orders_per_s / inproc.orders_per_s
                     if http and inproc and http.orders_per_s is not None and inproc.orders_per_s else None)
        vs_floor = (http.orders_per_s / floor.requests_per_s
                    if http and floor and http.orders_per_s is not None and floor.requests_per_s else None)
        return {"http_vs_in_process": vs_inproc, "target": TARGET,
                "met": vs_inproc is not None and vs_inproc >= TARGET,
                "floor_requests_per_s": floor.requests_per_s if floor else None, "http_vs_floor": vs_floor}

    def failures(self) -> dict[str, list[Outcome]]:
        """The runs whose books did not balance, by mode (the warm-up's as "warm-up")."""
        runs = {**self.runs, **({"warm-up": [self.warmed]} if self.warmed is not None else {})}
        failed = {mode: [o for o in outs if not o.passed] for mode, outs in runs.items()}
        return {mode: outs for mode, outs in failed.items() if outs}

    def as_dict(self) -> dict[str, Any]:
        b, f = self.base, self.figures()
        return {
            "mode": "compare-http", "repeat": self.repeat, "processes": b.processes, "duration": b.duration,
            "products": b.products, "stock": b.stock, "users": b.users,
            "app_servers": {"count": self.servers, "workers": self.workers, "threads": self.threads,
                            "config": "config/gunicorn.conf.py"},
            "modes": {mode: {**f[mode].as_dict(), "runs": [o.as_dict() for o in outs]}
                      for mode, outs in self.runs.items() if outs},
            "ratios": self.ratios(),
            "warmup": {"seconds": self.warmup, "invariants": "PASS" if self.warmed.passed else "FAIL"}
            if self.warmed is not None else {"seconds": 0},
        }


def run(comparison: HttpComparison, *, urls: list[str], groups: list[int],
        progress: Callable[[Progress], None] | None = None,
        on_run: Callable[[int, str, Outcome], None] | None = None) -> HttpComparison:
    """`repeat` rounds of the three modes against the running servers `urls` (process groups
    `groups`), the order rotating each round, after the warm-up; fill `comparison.runs`."""
    if comparison.warmup > 0:
        config = dataclasses.replace(comparison.config(HTTP, urls, groups), duration=comparison.warmup)
        comparison.warmed = scenarios.run_once(config, progress)
    for r in range(comparison.repeat):
        for mode in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:
            config = dataclasses.replace(comparison.config(mode, urls, groups), seed=comparison.base.seed + r)
            outcome = scenarios.run_once(config, progress)
            comparison.runs[mode].append(outcome)
            if on_run is not None:
                on_run(r, mode, outcome)
    return comparison


# --- the report -------------------------------------------------------------------------------
HEADERS = ("mode", "what", "rounds", "requests", "busy", "errors", "orders/s", "requests/s", "p50 ms", "p99 ms",
           "CPU ms/request", "clients", "app", "mysqld", "redis", "invariants")


def table(comparison: HttpComparison) -> str:
    rows = []
    for mode, f in comparison.figures().items():
        rows.append([mode, f.what, f.rounds, round(f.requests), f.busy, f.errors, f.orders_per_s, f.requests_per_s,
                     f.p50_ms, f.p99_ms, _cpu(f.cpu_ms, "total"), *(_cpu(f.cpu_ms, k) for k in CPU_PARTS),
                     f.invariants])
    return report.table(HEADERS, rows)


def _cpu(cost: dict[str, float], key: str) -> str:
    return f"{cost[key]:.3f}" if key in cost else "-"


def verdict(comparison: HttpComparison) -> list[str]:
    """The ratios, in words: HTTP against in process (the target) and against the floor."""
    r = comparison.ratios()
    lines = []
    if r["http_vs_in_process"] is not None:
        met = "met" if r["met"] else "missed"
        lines.append(f"HTTP / in-process: {r['http_vs_in_process']:.2f}x orders/s "
                     f"(target >= {TARGET:.2f}x: {met})")
    if r["floor_requests_per_s"] is not None:
        vs = f"; HTTP orders/s / floor requests/s: {r['http_vs_floor']:.2f}x" if r["http_vs_floor"] is not None else ""
        lines.append(f"floor: {r['floor_requests_per_s']:,.0f} requests/s on the same servers{vs}")
    return lines


NOTE = ("medians over the rounds; busy and errors: totals. CPU ms/request = clients + app + mysqld + redis (mysqld "
        "and redis server-wide: other clients' work counts too); in process the clients run the checkout, over "
        "HTTP they only send requests (http.client, one kept-alive connection each) and the app servers run it.")
