"""One load-test run end to end, and the side-by-side comparison of strategies.

A run creates its own products and users, drives them from many processes, checks the books
with the shop's invariant checker (I1-I6 of docs/design.md) and removes what it created (unless
`keep`). The comparison repeats every strategy on the same workload, interleaved (the order
rotates each repeat, so a noisy minute is spread over all of them), for three scenarios:
one hot product, several products, and a storm of requests after a sell-out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from loadtest import report, runner, strategies, workload
from loadtest.runner import Phase, Plan, Progress, RunResult
from loadtest.strategies import Options


@dataclass
class LoadConfig:
    """What one run does. Stock and quantities are per product; requests/duration per phase."""

    strategy: str = "ours"
    products: int = 1
    stock: int = 1000
    users: int = 100
    processes: int = 8
    requests: int | None = 2000
    duration: float | None = None
    quantity: tuple[int, int] = (1, 1)
    lines_per_order: int = 1
    coupon_total: int | None = None
    jitter: float = 0.0
    lock_wait: float = 3.0
    lock_ttl: float = 10.0
    lock: bool = True
    url: str | None = None
    urls: list[str] = field(default_factory=list)  # several app servers (worker i -> urls[i mod n]); url is urls[0]
    pay: float | None = None  # each placed order is paid at once with this probability (None: never)
    sellout: bool = False  # sell the stock out first, then measure a storm of `requests`/`duration`
    keep: bool = False
    seed: int = 0
    cpu_profile: str | None = None  # a directory for the workers' cProfiles (loadtest/cpu.py)
    app_groups: list[int] = field(default_factory=list)  # the app servers' process groups (their CPU)

    @property
    def plan_strategy(self) -> str:
        """What the workers run: the strategy, or with `url` the JSON API's order ("http"), unless
        the strategy is one of the API's own (the floor, "http_ping")."""
        if strategies.get(self.strategy).over_http:
            return self.strategy
        return strategies.Http.name if self.url else self.strategy

    def phases(self) -> list[Phase]:
        main = Phase("storm" if self.sellout else "main", requests=None if self.duration else self.requests,
                     duration=self.duration)
        return [Phase("sell-out", until_sold_out=True), main] if self.sellout else [main]


@dataclass
class Outcome:
    config: LoadConfig
    workload: workload.Workload
    result: RunResult
    summaries: list[report.Summary]
    violations: list[str]
    books: list[workload.Books]
    batches: list[int] = field(default_factory=list)  # orders per lock hold (workload.batch_sizes)
    payments: Payments | None = None  # with `pay`: the books before and after the expiry

    @property
    def passed(self) -> bool:
        return not self.violations and (self.payments is None or self.payments.passed)

    @property
    def oversold(self) -> int:
        return sum(max(0, b.oversold) for b in self.books)

    def as_dict(self) -> dict[str, Any]:
        return report.run_json(self.result, self.summaries, {
            "run_id": self.workload.run_id,
            "invariants": "PASS" if self.passed else "FAIL",
            "violations": self.violations,
            "books": [{**dataclasses.asdict(b), "oversold": b.oversold} for b in self.books],
            "batches": report.batch_summary(self.batches),
            **({"servers": self.result.servers} if self.result.servers else {}),
            **({"payments": self.payments.as_dict()} if self.payments is not None else {}),
        })


def check(w: workload.Workload, result: RunResult | None) -> list[str]:
    """The shop's invariant checker over this run's rows; each violation as one line of text."""
    try:
        from shop.ops.invariants import check_invariants
    except ImportError:
        return ["the invariant checker (shop/ops/invariants.py) is not available in this checkout"]
    return [str(v) for v in check_invariants(
        product_ids=w.product_ids,
        initial_stock=w.initial_stock,
        coupon_ids=[w.coupon_id] if w.coupon_id is not None else [],
        seen_order_ids=result.order_ids if result is not None else None,
    )]


@dataclass
class Payments:
    """Units by state after a `pay` run, then after the expiry job ran (totals over the run's products)."""

    initial: int
    stock: int
    paid: int
    pending: int
    expired_orders: int = 0
    expiry: str = "not needed"  # "ran", "not needed" (nothing pending) or "skipped: <why>"
    stock_after: int = 0
    paid_after: int = 0
    pending_after: int = 0
    checks: list[tuple[str, bool]] = field(default_factory=list)  # (what was checked, held)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "checks": [{"check": t, "ok": ok} for t, ok in self.checks],
                "passed": self.passed}


def _units(w: workload.Workload) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """(stock, paid units, pending units) per product."""
    from shop.models import Order, Product

    stock = dict(Product.objects.filter(pk__in=w.product_ids).values_list("pk", "stock"))
    units = workload.units_by_status(w)
    paid = {pk: units[pk].get(Order.Status.PAID, 0) for pk in w.product_ids}
    pending = {pk: units[pk].get(Order.Status.PENDING_PAYMENT, 0) for pk in w.product_ids}
    return stock, paid, pending


def settle_payments(w: workload.Workload) -> Payments:
    """Check stock + paid + pending == initial, run the expiry as the job would once every pay_by
    has passed, then check stock + paid == initial with nothing pending (per product).

    The expiry (`expire_unpaid`) is not limited to this run's orders, so it is skipped, and the
    second check not made, if other unpaid orders would be expired early by it.
    """
    from shop.models import Order
    from shop.services import expire_unpaid

    initial = w.initial_stock
    stock, paid, pending = _units(w)
    result = Payments(initial=sum(initial.values()), stock=sum(stock.values()), paid=sum(paid.values()),
                      pending=sum(pending.values()))
    balanced = all(stock[pk] + paid[pk] + pending[pk] == initial[pk] for pk in w.product_ids)
    result.checks.append((f"stock ({result.stock:,}) + paid units ({result.paid:,}) + pending units "
                          f"({result.pending:,}) == initial stock ({result.initial:,})", balanced))
    mine = Order.objects.filter(user__username__startswith=w.tag, status=Order.Status.PENDING_PAYMENT)
    last = max(mine.values_list("pay_by", flat=True), default=None)
    if last is not None:
        now = last + timedelta(seconds=1)
        others = (Order.objects.filter(status=Order.Status.PENDING_PAYMENT, pay_by__lte=now)
                  .exclude(user__username__startswith=w.tag).count())
        if others:
            result.expiry = f"skipped: {others} unpaid order(s) outside this run would expire early"
        else:
            while (n := expire_unpaid(now=now)):
                result.expired_orders += n
            result.expiry = "ran"
    stock, paid, pending = _units(w)
    result.stock_after, result.paid_after = sum(stock.values()), sum(paid.values())
    result.pending_after = sum(pending.values())
    if not result.expiry.startswith("skipped"):
        back = all(stock[pk] + paid[pk] == initial[pk] and not pending[pk] for pk in w.product_ids)
        result.checks.append((f"after expiry: stock ({result.stock_after:,}) + paid units ({result.paid_after:,}) "
                              f"== initial stock ({result.initial:,}), pending units {result.pending_after:,} == 0",
                              back))
        result.checks.append((f"paid units unchanged by the expiry ({result.paid} -> {result.paid_after})",
                              result.paid == result.paid_after))
    return result


def _tokens(user_ids: list[int]) -> dict[int, str]:
    """An API token per load user, for HTTP mode (the web layer's ApiToken)."""
    from shop.models import ApiToken  # the web layer's model; HTTP mode needs it

    return {uid: ApiToken.issue(user_id=uid) for uid in user_ids}


def run_once(config: LoadConfig, progress: Callable[[Progress], None] | None = None) -> Outcome:
    w = workload.create(workload.new_run_id(), products=config.products, stock=config.stock, users=config.users,
                        coupon_total=config.coupon_total)
    try:
        options = Options(run_id=w.run_id, prices=w.prices, lock_wait=config.lock_wait, lock_ttl=config.lock_ttl,
                          jitter=config.jitter, coupon_code=w.coupon_code, url=config.url, urls=config.urls,
                          lock=config.lock,
                          user_ids=w.user_ids, pay=config.pay,
                          tokens=_tokens(w.user_ids) if config.url else {})
        plan = Plan(strategy=config.plan_strategy, options=options,
                    processes=config.processes, product_ids=w.product_ids, user_ids=w.user_ids,
                    phases=config.phases(), quantity=config.quantity, lines_per_order=config.lines_per_order,
                    lock_names=workload.lock_names(w), seed=config.seed, cpu_profile=config.cpu_profile,
                    app_groups=config.app_groups)
        result = runner.run(plan, progress)
        summaries = [report.summarize(plan.strategy, ph) for ph in result.phases]
        violations, books = check(w, result), workload.books(w)
        payments = None
        if config.pay is not None:
            payments = settle_payments(w)
            violations += [f"after expiry: {v}" for v in check(w, result) if v not in violations]
        return Outcome(config=config, workload=w, result=result, summaries=summaries, violations=violations,
                       books=books, batches=workload.batch_sizes(w), payments=payments)
    finally:
        if not config.keep:
            workload.cleanup(w)


# --- the comparison -------------------------------------------------------------------------
SCENARIOS: dict[str, str] = {
    "hot": "one hot product",
    "spread": "several products (one line each, product chosen at random)",
    "sellout": "a storm of requests after a sell-out",
}


@dataclass
class Comparison:
    strategies: list[str]
    scenarios: list[str]
    repeat: int
    base: LoadConfig
    runs: dict[str, dict[str, list[Outcome]]] = field(default_factory=dict)  # scenario -> strategy -> repeats

    def aggregates(self, scenario: str) -> list[report.Aggregate]:
        out = []
        for name in self.strategies:
            outcomes = self.runs.get(scenario, {}).get(name, [])
            if outcomes:
                out.append(report.aggregate(name, scenario, [o.summaries[-1] for o in outcomes],
                                            failures=sum(not o.passed for o in outcomes),
                                            batches=[report.batch_summary(o.batches) for o in outcomes]))
        return out

    def unexpected_failures(self) -> list[Outcome]:
        """Failed invariant checks of strategies that should never oversell."""
        return [o for per in self.runs.values() for outcomes in per.values() for o in outcomes
                if not o.passed and not strategies.get(o.config.strategy).oversells]


def scenario_config(base: LoadConfig, scenario: str, strategy: str, spread: int, sellout_stock: int) -> LoadConfig:
    if scenario == "hot":
        return dataclasses.replace(base, strategy=strategy, products=1)
    if scenario == "spread":
        return dataclasses.replace(base, strategy=strategy, products=spread)
    if scenario == "sellout":
        return dataclasses.replace(base, strategy=strategy, products=1, stock=sellout_stock, sellout=True,
                                   quantity=(1, 1), lines_per_order=1)
    raise ValueError(f"unknown scenario {scenario!r}")


def compare(comparison: Comparison, *, spread: int = 8, sellout_stock: int = 50,
            progress: Callable[[Progress], None] | None = None,
            on_run: Callable[[str, int, Outcome], None] | None = None) -> Comparison:
    """Run every strategy `repeat` times per scenario, interleaved; fill `comparison.runs`."""
    names = comparison.strategies
    for scenario in comparison.scenarios:
        per = comparison.runs.setdefault(scenario, {name: [] for name in names})
        for r in range(comparison.repeat):
            for name in names[r % len(names):] + names[: r % len(names)]:
                config = scenario_config(comparison.base, scenario, name, spread, sellout_stock)
                outcome = run_once(dataclasses.replace(config, seed=comparison.base.seed + r), progress)
                per[name].append(outcome)
                if on_run is not None:
                    on_run(scenario, r, outcome)
    return comparison


# --- the coupon storm -----------------------------------------------------------------------
@dataclass
class StormConfig:
    users: int = 500
    total: int = 100
    processes: int = 8
    attempts: int = 1  # claims per user (more than 1 tests "at most one claim per user")
    lock_wait: float = 3.0
    keep: bool = False
    seed: int = 0


@dataclass
class StormOutcome:
    config: StormConfig
    workload: workload.Workload
    result: RunResult
    summary: report.Summary
    claims: int  # claim rows in the database
    distinct_users: int
    remaining: int
    checks: list[tuple[str, bool | None]]  # (what was checked, held; None: not applicable to this run)
    violations: list[str]

    @property
    def passed(self) -> bool:
        return all(ok is not False for _, ok in self.checks) and not self.violations


def storm_checks(config: StormConfig, counts: dict[str, int], *, claims: int, distinct_users: int,
                 remaining: int) -> list[tuple[str, bool | None]]:
    """Compare the real figures: claim rows in the database, successes the clients saw, the coupon's
    total and remaining, distinct holders. None marks a check this run cannot make (never "ok")."""
    seen = counts[strategies.PLACED]
    clean = not (counts[strategies.BUSY] or counts[strategies.ERROR])
    expected = min(config.total, config.users)
    too_late = config.users - expected
    return [
        (f"claims in the database ({claims}) == successes the clients saw ({seen})", claims == seen),
        (f"claims ({claims}) <= coupon total ({config.total})", claims <= config.total),
        (f"one claim per user ({distinct_users} users hold {claims} claims)", distinct_users == claims),
        (f"remaining ({remaining}) == total - claims ({config.total} - {claims} = {config.total - claims})",
         remaining == config.total - claims),
        (f"nobody wrongly refused: claims ({claims}) == min(total, users) ({expected})"
         + ("" if clean else ": not checked, some claims were busy or failed"),
         claims == expected if clean else None),
        (f"sold-out refusals ({counts[strategies.OUT_OF_STOCK]}) == users who came too late ({too_late})"
         + ("" if config.attempts == 1 and clean else ": not checked, only for one clean attempt per user"),
         counts[strategies.OUT_OF_STOCK] == too_late if config.attempts == 1 and clean else None),
    ]


def coupon_storm(config: StormConfig, progress: Callable[[Progress], None] | None = None) -> StormOutcome:
    """Every user claims one coupon `attempts` times, all at once; the counts must be exact."""
    from shop.models import Coupon, CouponClaim

    w = workload.create(workload.new_run_id(), products=0, stock=0, users=config.users, coupon_total=config.total)
    try:
        plan = Plan(strategy="claim_coupon", processes=config.processes, product_ids=[], user_ids=w.user_ids,
                    options=Options(run_id=w.run_id, prices={}, lock_wait=config.lock_wait,
                                    coupon_code=w.coupon_code, user_ids=w.user_ids),
                    phases=[Phase("claim", requests=config.users * config.attempts)],
                    lock_names=workload.lock_names(w), users_in_order=True, seed=config.seed)
        result = runner.run(plan, progress)
        summary = report.summarize("claim_coupon", result.phases[0])
        rows = CouponClaim.objects.filter(coupon_id=w.coupon_id)
        claims, distinct = rows.count(), rows.values("user_id").distinct().count()
        remaining = Coupon.objects.get(pk=w.coupon_id).remaining
        checks = storm_checks(config, summary.counts, claims=claims, distinct_users=distinct, remaining=remaining)
        return StormOutcome(config=config, workload=w, result=result, summary=summary, claims=claims,
                            distinct_users=distinct, remaining=remaining, checks=checks,
                            violations=check(w, None))
    finally:
        if not config.keep:
            workload.cleanup(w)

