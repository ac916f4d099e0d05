"""Turn a run's records into numbers people can compare: tables, percentiles, JSON, a plot.

Throughput is counted over the measured window (first request start to last request end),
latency percentiles over every request of the phase (nearest rank), and fairness is the
smallest per-process share of placed orders over the largest: a starved process drags it
towards 0. Comparisons use medians over repeats and ratios within one run, because the
machines are small and noisy (docs/design.md, "Measuring").
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest import cpu, drop, openloop
from loadtest.runner import PhaseRun, Progress, Record, RunResult
from loadtest.strategies import BUSY, ERROR, OUT_OF_STOCK, OUTCOMES, PLACED, REJECTED

PLACED_I, OUT_OF_STOCK_I, REJECTED_I = OUTCOMES.index(PLACED), OUTCOMES.index(OUT_OF_STOCK), OUTCOMES.index(REJECTED)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Summary:
    strategy: str
    phase: str
    processes: int
    counts: dict[str, int]
    window: float  # seconds, first start to last end
    orders_per_s: float
    rejections_per_s: float  # out of stock + other refusals, per second
    latency_ms: dict[str, float]  # p50, p95, p99, max over all requests
    fairness: float  # min / max placed orders per process (1.0 = perfectly even)
    placed_per_process: list[int]
    queries: int  # SQL statements the workers sent (counted client side)
    lock_acquisitions: int  # client-side count; for "ours", the lock service's own counter
    server: dict[str, int] = field(default_factory=dict)  # MySQL global status deltas (server-wide)
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per placed order: clients, mysqld, redis, total
    rejected: dict[str, int] = field(default_factory=dict)  # business refusals by error code, most first

    @property
    def attempted(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "attempted": self.attempted}


def summarize(strategy: str, phase_run: PhaseRun) -> Summary:
    records = [r for worker in phase_run.records for r in worker]
    counts = {o: 0 for o in OUTCOMES}
    for r in records:
        counts[OUTCOMES[r[2]]] += 1
    window = (max(r[1] for r in records) - min(r[0] for r in records)) if records else 0.0
    latencies = sorted(r[1] - r[0] for r in records)
    placed = [sum(1 for r in worker if r[2] == PLACED_I) for worker in phase_run.records]
    delta = phase_run.server_delta
    client_locks = sum(r[4] for r in records)
    refusals = counts[OUT_OF_STOCK] + counts[REJECTED]
    return Summary(
        strategy=strategy,
        phase=phase_run.phase.name,
        processes=len(phase_run.records),
        counts=counts,
        window=window,
        orders_per_s=counts[PLACED] / window if window else 0.0,
        rejections_per_s=refusals / window if window else 0.0,
        latency_ms={name: percentile(latencies, q) * 1000
                    for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))},
        fairness=min(placed) / max(placed) if placed and max(placed) else 0.0,
        placed_per_process=placed,
        queries=sum(r[3] for r in records),
        lock_acquisitions=client_locks + delta.get("lock_acquired", 0),
        server={k: v for k, v in delta.items() if k.startswith("mysql_")},
        cpu_ms=cpu.per_order(client_cpu_s=phase_run.client_cpu, server=delta, placed=counts[PLACED]),
        rejected=dict(phase_run.rejected),
    )


def timeline(records: Iterable[Record], bins: int = 40) -> list[dict[str, float]]:
    """Per time slice (by request end): placed/s, rejected/s, latency p50/p99 in ms."""
    records = list(records)
    if not records:
        return []
    t0 = min(r[0] for r in records)
    span = max(r[1] for r in records) - t0
    width = max(span / bins, 0.01)
    slices: list[list[Record]] = [[] for _ in range(int(span / width) + 1)]
    for r in records:
        slices[min(int((r[1] - t0) / width), len(slices) - 1)].append(r)
    out = []
    for i, chunk in enumerate(slices):
        lat = sorted(r[1] - r[0] for r in chunk)
        out.append({
            "t": round((i + 0.5) * width, 4),
            "placed_per_s": sum(1 for r in chunk if r[2] == PLACED_I) / width,
            "rejected_per_s": sum(1 for r in chunk if r[2] in (OUT_OF_STOCK_I, REJECTED_I)) / width,
            "p50_ms": percentile(lat, 0.5) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000,
        })
    return out


# --- text tables ----------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned table: text left, numbers right."""
    rows = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in rows) if rows else False for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]).rstrip()


def servers_table(servers: dict[str, dict[str, int]]) -> str:
    """Requests per app server by outcome (errors include timeouts and connection errors)."""
    rows = [[url, sum(counts.values()), *(counts.get(o, 0) for o in OUTCOMES)] for url, counts in servers.items()]
    return table(("server", "requests", *OUTCOMES), rows)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _is_number(text: str) -> bool:
    return text == "-" or text.replace(",", "").replace(".", "", 1).lstrip("-").rstrip("x%").isdigit()


RUN_HEADERS = ("strategy", "phase", "attempted", "placed", "out_of_stock", "rejected", "busy", "errors",
               "orders/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "fairness")


STORM_PHASE = "storm"  # after a sell-out nothing can be placed: orders/s and fairness mean nothing there


def run_rows(summaries: Iterable[Summary]) -> list[list[Any]]:
    """One row per phase; the storm phase shows "-" for orders/s and fairness (the JSON keeps them)."""
    rows = []
    for s in summaries:
        storm = s.phase == STORM_PHASE
        rows.append([s.strategy, s.phase, s.attempted, s.counts[PLACED], s.counts[OUT_OF_STOCK], s.counts[REJECTED],
                     s.counts[BUSY], s.counts[ERROR], None if storm else s.orders_per_s, s.latency_ms["p50"],
                     s.latency_ms["p95"], s.latency_ms["p99"], s.latency_ms["max"], None if storm else s.fairness])
    return rows


def by_code(counts: dict[str, int]) -> str:
    """"unpaid_limit 1,980, purchase_limit 3": refusals by error code, as counted."""
    return ", ".join(f"{code or '(no code)'} {n:,}" for code, n in counts.items())


def run_table(summaries: Sequence[Summary]) -> str:
    """The run's table; below it, each phase's rejections by code (the shop's rules said no: not errors)."""
    text = table(RUN_HEADERS, run_rows(summaries))
    if any(s.phase == STORM_PHASE for s in summaries):
        text += "\n(storm: requests after the sell-out, all refused; its rate is the rejections/s line below)"
    for s in summaries:
        if s.rejected:
            text += f"\nrejected ({s.phase}): {by_code(s.rejected)}"
    return text


# --- progress -----------------------------------------------------------------------------
# What the progress line counts, in the words of the run's final table: (label, outcomes summed).
ORDER_COUNTS = (("placed", (PLACED,)), ("out_of_stock", (OUT_OF_STOCK,)), ("rejected", (REJECTED,)),
                ("busy", (BUSY,)), ("errors", (ERROR,)))
CLAIM_COUNTS = (("claimed", (PLACED,)), ("sold_out", (OUT_OF_STOCK,)), ("already_claimed", (REJECTED,)),
                ("busy", (BUSY,)), ("errors", (ERROR,)))


class ProgressLine:
    """One self-rewriting line on stderr (a plain line every few seconds when stderr is not a terminal)."""

    WIDTH = 24

    def __init__(self, out: Any, label: str, *, final: bool = True,
                 counts: Sequence[tuple[str, tuple[str, ...]]] = ORDER_COUNTS) -> None:
        """`out`: a management command's OutputWrapper (write(text, ending=...), flush(), isatty()).

        `final`: when not on a terminal, print the last state at `done()`. `counts`: the labels
        shown, the same as the final table's (ORDER_COUNTS, CLAIM_COUNTS).
        """
        self.out, self.label, self.final, self.counts = out, label, final, counts
        self.tty = out.isatty()
        self.last_plain = time.monotonic()
        self.text = ""

    def __call__(self, p: Progress) -> None:
        target = p.phase.requests
        fraction = p.done / target if target else p.elapsed / p.phase.duration if p.phase.duration else 0.0
        bar = "#" * int(min(1.0, fraction) * self.WIDTH)
        counts = "  ".join(f"{name} {sum(p.counts[o] for o in outcomes):,}" for name, outcomes in self.counts)
        text = f"{self.label} {p.phase.name:<8} [{bar:<{self.WIDTH}}] {p.done:>7,} req  {counts}  {p.elapsed:5.1f}s"
        self.text = text
        if self.tty:
            self.out.write("\r" + text + "\033[K", ending="")
            self.out.flush()
        elif time.monotonic() - self.last_plain > 5:
            self.out.write(text)
            self.last_plain = time.monotonic()

    def done(self) -> None:
        """Clear the line (terminal) or print the final state (log)."""
        if self.tty:
            self.out.write("\r\033[K", ending="")
            self.out.flush()
        elif self.text and self.final:
            self.out.write(self.text)
        self.text, self.last_plain = "", time.monotonic()


# --- comparisons ----------------------------------------------------------------------------
BASELINE = "guarded"  # the unlocked ORM loop on the hot row
RAW = "raw"  # the row's own limit: hand-written MySQLdb, no ORM, no lock
PEER = "redis_py"  # what everyone has: django-redis cache.lock()


@dataclass
class Aggregate:
    """One strategy in one scenario: medians over its repeats."""

    strategy: str
    scenario: str
    repeats: int
    orders_per_s: float
    rejections_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    fairness: float
    busy: int
    queries: int  # median per repeat
    lock_acquisitions: int
    server: dict[str, int]
    invariants: str  # "PASS" or "FAIL (n)" over all repeats
    batch_mean: float = 0.0  # orders per lock hold (median over repeats; 0: no fenced holds)
    batch_p99: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per placed order (medians): clients, mysqld, ...

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_summary(sizes: Sequence[int]) -> dict[str, Any]:
    """Orders per lock hold: how much combining batched (all 1 without it)."""
    if not sizes:
        return {"holds": 0, "mean": 0.0, "p50": 0, "p99": 0, "max": 0, "histogram": {}}
    ordered = sorted(sizes)
    histogram: dict[str, int] = {}
    for size in ordered:
        top = 1
        while top < size:
            top *= 2
        label = str(top) if top <= 2 else f"{top // 2 + 1}-{top}"
        histogram[label] = histogram.get(label, 0) + 1
    return {"holds": len(ordered), "mean": round(sum(ordered) / len(ordered), 2),
            "p50": percentile(ordered, 0.5), "p99": percentile(ordered, 0.99), "max": ordered[-1],
            "histogram": histogram}


def aggregate(strategy: str, scenario: str, summaries: Sequence[Summary], failures: int,
              batches: Sequence[dict[str, Any]] = ()) -> Aggregate:
    def med(values: Iterable[float]) -> float:
        values = list(values)
        return statistics.median(values) if values else 0.0

    keys = {k for s in summaries for k in s.server}
    return Aggregate(
        strategy=strategy,
        scenario=scenario,
        repeats=len(summaries),
        orders_per_s=med(s.orders_per_s for s in summaries),
        rejections_per_s=med(s.rejections_per_s for s in summaries),
        p50_ms=med(s.latency_ms["p50"] for s in summaries),
        p99_ms=med(s.latency_ms["p99"] for s in summaries),
        max_ms=max((s.latency_ms["max"] for s in summaries), default=0.0),
        fairness=min((s.fairness for s in summaries), default=0.0),
        busy=sum(s.counts[BUSY] for s in summaries),
        queries=round(med(s.queries for s in summaries)),
        lock_acquisitions=round(med(s.lock_acquisitions for s in summaries)),
        server={k: round(med(s.server.get(k, 0) for s in summaries)) for k in sorted(keys)},
        invariants="PASS" if not failures else f"FAIL ({failures}/{len(summaries)})",
        batch_mean=med(b["mean"] for b in batches if b["holds"]),
        batch_p99=med(b["p99"] for b in batches if b["holds"]),
        cpu_ms={k: med(s.cpu_ms[k] for s in summaries if k in s.cpu_ms)
                for k in ("clients", "mysqld", "redis", "total") if any(k in s.cpu_ms for s in summaries)},
    )


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def comparison_table(aggregates: Sequence[Aggregate]) -> str:
    """Throughput and latency, with ratios to guarded UPDATE (orders/s) and to cache.lock()."""
    by = {a.strategy: a for a in aggregates}
    base, peer, raw = by.get(BASELINE), by.get(PEER), by.get(RAW)
    rows = [[a.strategy, a.orders_per_s, _ratio(a.orders_per_s, base and base.orders_per_s),
             _ratio(a.orders_per_s, raw and raw.orders_per_s), _ratio(a.orders_per_s, peer and peer.orders_per_s),
             a.p50_ms, a.p99_ms, _ratio(a.p99_ms, base and base.p99_ms), _ratio(a.p99_ms, peer and peer.p99_ms),
             a.max_ms, a.fairness, f"{a.batch_mean:.1f}" if a.batch_mean else "-", _cpu_cell(a.cpu_ms), a.busy,
             a.invariants]
            for a in aggregates]
    return table(("strategy", "orders/s", "vs guarded", "vs raw", "vs cache.lock", "p50 ms", "p99 ms",
                  "p99 vs guarded", "p99 vs cache.lock", "max ms", "fairness", "per hold",
                  "CPU ms/order (clients+db+redis)", "busy", "invariants"),
                 rows)


def _cpu_cell(cost: dict[str, float]) -> str:
    """The CPU one placed order cost, and its clients' share: what bounds orders/s on a small machine."""
    if "total" not in cost:
        return "-"
    parts = "+".join(f"{cost[k]:.2f}" for k in ("clients", "mysqld", "redis") if k in cost)
    return f"{cost['total']:.2f} ({parts})"


def sellout_table(aggregates: Sequence[Aggregate], placed_rate: dict[str, float]) -> str:
    """After sell-out: rejections/s, their ratio to the strategy's placed orders/s, and what they touched."""
    rows = []
    for a in aggregates:
        placed = placed_rate.get(a.strategy)
        rows.append([a.strategy, a.rejections_per_s, placed, _ratio(a.rejections_per_s, placed), a.p99_ms,
                     a.queries, a.lock_acquisitions, a.server.get("mysql_questions"),
                     a.server.get("mysql_com_update"), a.invariants])
    return table(("strategy", "rejections/s", "placed/s", "ratio", "p99 ms", "SQL sent", "lock acq.",
                  "Questions (server)", "Com_update (server)", "invariants"), rows)


def scaling_table(one: Sequence[Aggregate], many: Sequence[Aggregate], products: int) -> str:
    by_one = {a.strategy: a for a in one}
    rows = [[a.strategy, by_one[a.strategy].orders_per_s if a.strategy in by_one else None, a.orders_per_s,
             _ratio(a.orders_per_s, by_one[a.strategy].orders_per_s if a.strategy in by_one else None)]
            for a in many]
    return table(("strategy", "1 product orders/s", f"{products} products orders/s", "ratio"), rows)


# --- files ----------------------------------------------------------------------------------
def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


def plot(path: str | Path, series: dict[str, list[dict[str, float]]], title: str) -> None:
    """Throughput (top) and latency p50/p99 (bottom) over time, one line per series; a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for label, points in series.items():
        t = [p["t"] for p in points]
        (line,) = top.plot(t, [p["placed_per_s"] for p in points], label=f"{label} placed", linewidth=1.2)
        if any(p["rejected_per_s"] for p in points):
            top.plot(t, [p["rejected_per_s"] for p in points], linestyle=":", color=line.get_color(),
                     label=f"{label} rejected", linewidth=1)
        bottom.plot(t, [p["p99_ms"] for p in points], color=line.get_color(), label=f"{label} p99", linewidth=1.2)
        bottom.plot(t, [p["p50_ms"] for p in points], color=line.get_color(), linestyle="--", linewidth=0.8)
    top.set_ylabel("per second")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=7, ncol=2, loc="upper right")
    top.grid(alpha=0.3)
    bottom.set_ylabel("latency ms (p99 solid, p50 dashed)")
    bottom.set_xlabel("seconds since start")
    bottom.set_yscale("log")
    bottom.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def run_json(result: RunResult, summaries: Sequence[Summary], extra: dict[str, Any]) -> dict[str, Any]:
    plan = result.plan
    return {
        "strategy": plan.strategy,
        "processes": plan.processes,
        "products": len(plan.product_ids),
        "users": len(plan.user_ids),
        "quantity": list(plan.quantity),
        "phases": [s.as_dict() for s in summaries],
        "timeline": {ph.phase.name: timeline(r for w in ph.records for r in w) for ph in result.phases},
        "errors": result.errors,
        **extra,
    }


# --- a crowd, open loop (loadtest/openloop.py) ----------------------------------------------
def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def crowd_report(c: openloop.Crowd) -> str:
    """Every phase of an open-loop run: what was offered, what the buyers saw, and the books."""
    plan = c.result.plan
    head = (f"open loop, {c.profile} on {plan.url}: capacity C = {c.capacity:,.0f} orders/s"
            f"{' (closed loop, 32 buyers)' if c.profile != 'rate' else ''}; a buyer waits {plan.patience:g} s, "
            f"the server's deadline {c.deadline:g} s; {plan.clients} client processes used "
            f"{c.result.client_cpu:.1f} CPU s")
    rows = []
    for s, (committed, unseen), sold_out_at in zip(c.summaries, c.unseen, c.sold_out_at, strict=True):
        n = s.counts
        rows.append([s.phase.name, s.offered_rate, s.sent_rate, s.goodput,
                     f"{s.goodput / c.capacity:.2f}" if c.capacity else "-", _ms(s.p50), _ms(s.p99),
                     f"{s.within_deadline:.1%}", n[openloop.BUSY], _ms(s.busy_p99), n[openloop.TIMEOUT],
                     n[openloop.SOLD_OUT], _ms(s.sold_out_p99), n[openloop.REJECTED], n[openloop.ABANDONED],
                     n[openloop.CONN_ERROR], n[openloop.UNAVAILABLE], n[openloop.ERROR], committed, unseen,
                     _ms(s.first_second_p99), sold_out_at])
    body = table(("phase", "offered/s", "sent/s", "goodput/s", "x C", "p50 ms", "p99 ms", "in deadline", "busy",
                  "busy p99 ms", "timeout", "sold out", "sold-out p99 ms", "rejected", "abandoned", "conn errors",
                  "unavailable", "errors", "orders", "unseen", "1st s p99 ms", "sold out at s"), rows)
    body += "".join(f"\nrejected ({s.phase.name}): {by_code(s.rejected)}" for s in c.summaries if s.rejected)
    total = sum(u for _, u in c.unseen)
    books = (f"books: {sum(o for o, _ in c.unseen):,} orders committed, {total:,} of them for buyers who never saw "
             f"them, {c.oversold} units oversold")
    books += "".join(f"\nunseen ({s.phase.name}), what the buyer got: {by_code(by)}"
                     for s, by in zip(c.summaries, c.unseen_by, strict=False) if by)
    return "\n".join([head, body, books])


def crowd_json(c: openloop.Crowd) -> dict[str, Any]:
    return {"profile": c.profile, "capacity": c.capacity, "deadline": c.deadline, "client_cpu": c.result.client_cpu,
            "oversold": c.oversold,
            "phases": [{"name": s.phase.name, "offered_rate": s.offered_rate, "sent_rate": s.sent_rate,
                        "goodput": s.goodput, "p50": s.p50, "p99": s.p99, "within_deadline": s.within_deadline,
                        "busy_p99": s.busy_p99, "sold_out_p99": s.sold_out_p99, "counts": s.counts,
                        "first_second_p99": s.first_second_p99, "rejected": s.rejected, "orders": committed,
                        "unseen": unseen, "unseen_by": by,
                        "sold_out_at": at}
                       for s, (committed, unseen), at, by in zip(
                           c.summaries, c.unseen, c.sold_out_at, c.unseen_by or [{}] * len(c.summaries), strict=True)]}


# --- a drop's crowd (loadtest/drop.py) ----------------------------------------------------------
def _s(seconds: float | None, unit: str = " s") -> str:
    return "-" if seconds is None else f"{seconds:.2f}{unit}"


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def drop_report(d: drop.DropRun) -> str:
    """A drop's crowd: who won, how soon everyone heard, what it cost, and the books."""
    plan, f = d.result.plan, d.figures()
    order = "shuffled" if d.prequeue_order == "shuffle" else "in arrival order"
    window = (f"in a pre-queue of {d.prequeue_seconds:g} s before the opening ({order} at it)" if d.prequeue_seconds
              else f"in the first {d.arrival_seconds:g} s after the opening")
    load = f" ({d.load:g}x C)" if d.load else ""
    head = (f"drop on {plan.url}: {plan.units:,} units, 1 per buyer; {d.people:,} people + {d.scripts:,} scripts"
            f"{load} arriving {window}; C = {d.capacity:,.0f} orders/s"
            f"{' (closed loop, 32 buyers)' if d.capacity_measured else ' (given)'}; a buyer tries for "
            f"{plan.patience:g} s; {plan.clients} client processes used {f['client_cpu']:.1f} CPU s, sent first "
            f"requests late by p50 {_s(f['send_lag_p50'])}, p99 {_s(f['send_lag_p99'])} (max {_s(f['send_lag_max'])})")
    rate = f["win_rate"]
    lines = [head,
             f"FIFO share: {_x(f['fifo_share'])} (first come, first served 1.0; chance {f['chance']:.2f}); "
             f"places stamped in arrival order: {_x(f['placed_in_arrival_order'])}, winners served in place "
             f"order: {_x(f['won_in_place_order'])}",
             f"script advantage: {_x(f['script_advantage'])} (scripts won {_x(rate[drop.SCRIPT], 3)}, "
             f"people {_x(rate[drop.PERSON], 3)})"]
    rows = [[name, *(_s(v) for v in (t["p50"], t["p99"]))] for name, t in f["time_to_final"].items()]
    lines.append(table(("arrival to final answer", "p50", "p99"), rows))
    gave_up = f["gave_up"]
    lines += [
        f"gave up without a final answer: {gave_up[drop.PERSON]:,} people, {gave_up[drop.SCRIPT]:,} scripts",
        f"sales (the orders' times): first at {_s(f['first_sale_at'])}, last at {_s(f['last_sale_at'])} after the "
        f"opening (the last placed answer heard at {_s(f['last_placed_answer_at'])}); "
        f"losers told within 1 s of the last: {_x(f['losers_told_within_1s_of_last_sale'])}",
        f"requests: {f['requests']:,}, {_x(f['requests_per_unit'], 1)} per unit sold (buyers per unit, the floor: "
        f"{_x(f['buyers_per_unit'], 1)}); answers: "
        + ", ".join(f"{k} {v:,}" for k, v in f["answers"].items()),
        "Retry-After given: " + (", ".join(f"{k} s {v:,}" for k, v in f["retry_after"].items()) or "none"),
        f"people told \"not now\" (503/202) first who still won: {f['waited_then_won']:,}, of them told busy "
        f"(503) first: {f.get('busy_then_won', 0):,}",
        f"goodput while stock lasted: {_x(f['goodput'], 0)} units/s = {_x(f['goodput_x_capacity'])}x C",
        f"the first second: {f['first_second']['units']:,} units sold, {f['first_second']['sent']:,} requests sent, "
        f"answered in p50 {_s(f['first_second']['p50'])} / p99 {_s(f['first_second']['p99'])}",
    ]
    b = d.books
    books = (f"books: {b.units:,} units, {b.sold:,} sold, {b.orders:,} orders, {b.seen:,} seen placed; "
             f"{b.accounts_over_cap} accounts over the cap, {b.not_orders} placed answers without an order, "
             f"{b.unseen} orders never seen ({b.late} committed more than {d.deadline + drop.LATE_SLACK:g} s after "
             f"their request was sent, by the client's clock); the line's invariants "
             f"{'held' if not b.line else 'broken'}")
    lines.append(books + (": OK" if not b.problems else ": FAIL " + "; ".join(b.problems)))
    if b.unseen_heard:
        lines.append("what the buyers of the unseen orders heard of them: "
                     + ", ".join(f"{k} {v:,}" for k, v in b.unseen_heard.items()))
    return "\n".join(lines)
