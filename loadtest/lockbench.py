"""Lock-only benchmark: ours against redis-py's Lock and python-redis-lock, side by side.

Every contender runs the same critical section (read a counter, do the work, write counter+1)
in the same number of OS processes, released together; rounds are interleaved (ours, redis-py,
python-redis-lock, ours, ...) so machine noise hits all alike. Reported per contender: the
median over rounds of acquisitions/s and the wait percentiles (wait = time from asking for the
lock to holding it), and fairness (fewest/most acquisitions of any one process). The counter must
equal the number of acquisitions, or mutual exclusion failed.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.core.cache import caches
from django.db import connections
from django_redis import get_redis_connection

from locks.conf import locks_settings
from locks.lock import Lock

CONTENDERS = ("ours", "redis-py", "python-redis-lock")
# On N independent Redis masters (Config.redlock_urls): not in the default run, ask for them with --only.
REDLOCK_CONTENDERS = ("redlock", "pottery")
ALL_CONTENDERS = CONTENDERS + REDLOCK_CONTENDERS
DESCRIPTIONS = {
    "redlock": "ours (redlock backend): a majority of the masters in parallel, fenced, waiters woken (BLPOP) in turn",
    "pottery": "pottery 3.0.1 Redlock on the same masters: no fencing, a waiter polls (random sleep up to 0.2 s)",
}
CRITICAL = ("redis", "sleep", "mysql")
FORK = multiprocessing.get_context("fork")


@dataclass
class Config:
    processes: int = 16
    duration: float = 5.0
    rounds: int = 3
    locks: int = 1
    work_ms: float = 1.0
    critical: str = "sleep"
    contenders: tuple[str, ...] = CONTENDERS
    ttl: float = 10.0
    wait: float = 30.0
    redlock_urls: tuple[str, ...] = ()  # the masters of the redlock/pottery contenders


@dataclass
class RoundResult:
    contender: str
    round: int
    acquisitions: int
    per_process: list[int]
    rate: float
    wait_p50: float
    wait_p95: float
    wait_p99: float
    wait_max: float
    counter_ok: bool
    timeouts: int

    @property
    def fairness(self) -> float:
        return min(self.per_process) / max(self.per_process) if max(self.per_process) else 0.0

    def starved(self, processes: int) -> int:
        fair = self.acquisitions / processes
        return sum(1 for n in self.per_process if n < fair / 4)


@dataclass
class Summary:
    contender: str
    rate: float
    wait_p50: float
    wait_p99: float
    wait_max: float
    fairness: float
    starved: int
    counter_ok: bool
    rounds: list[RoundResult] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rounds"] = [{**asdict(r), "fairness": r.fairness} for r in self.rounds]
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _make_lock(contender: str, name: str, config: Config, prefix: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    """(acquire, release) for one contender, as users of each library would write them."""
    if contender == "ours":
        lock = Lock(name, ttl=config.ttl, wait=config.wait, key_prefix=prefix)
        return lock.acquire, lock.release
    if contender == "redis-py":
        # Exactly what `django-redis` users get: cache.lock() -> redis.lock.Lock, default 0.1 s polling.
        rlock = caches[locks_settings.CACHE_ALIAS].lock(f"{prefix}{name}", timeout=config.ttl,
                                                        blocking_timeout=config.wait)
        return rlock.acquire, rlock.release
    if contender == "redlock":
        from django.conf import settings  # a forked worker: this changes its own settings only

        settings.LOCKS = {**settings.LOCKS, "BACKEND": "redlock", "REDLOCK_URLS": list(config.redlock_urls)}
        lock = Lock(name, ttl=config.ttl, wait=config.wait, key_prefix=prefix)
        return lock.acquire, lock.release
    if contender == "pottery":
        import logging

        from pottery import Redlock  # benchmark-only dependency (requirements-bench.txt)

        logging.getLogger("pottery").setLevel(logging.ERROR)  # it logs every wait at INFO
        masters = {_redlock_client(url) for url in config.redlock_urls}
        redlock = Redlock(key=f"{prefix}{name}", masters=masters, auto_release_time=config.ttl)
        return (lambda: redlock.acquire(blocking=True, timeout=config.wait)), redlock.release
    import redis_lock  # python-redis-lock: benchmark-only dependency (requirements-bench.txt)

    plock = redis_lock.Lock(get_redis_connection(locks_settings.CACHE_ALIAS), f"{prefix}{name}",
                            expire=int(config.ttl))
    # It refuses a timeout longer than its expire (without auto-renewal).
    timeout = max(1, int(min(config.wait, config.ttl)))
    return (lambda: plock.acquire(blocking=True, timeout=timeout)), plock.release


def _redlock_client(url: str):
    """A master's client as the Redlock backend builds it: no retries, 0.2 s timeouts (scaleout.md)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))


def _critical_section(config: Config, counter_key: str) -> Callable[[], None]:
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    work = config.work_ms / 1000
    if config.critical == "mysql":
        from django.db import connection

        def mysql_work() -> None:
            value = int(client.get(counter_key) or 0)
            with connection.cursor() as cursor:
                cursor.execute("SELECT SLEEP(%s)", [work])
            client.set(counter_key, value + 1)

        return mysql_work

    def redis_or_sleep_work() -> None:
        value = int(client.get(counter_key) or 0)
        if config.critical == "sleep" and work > 0:
            time.sleep(work)
        client.set(counter_key, value + 1)

    return redis_or_sleep_work


def _worker(index: int, contender: str, config: Config, prefix: str, start, deadline_holder, queue) -> None:
    try:
        _work_loop(index, contender, config, prefix, start, deadline_holder, queue)
    except BaseException:
        import traceback

        queue.put((index, None, traceback.format_exc()))
        raise


def _work_loop(index: int, contender: str, config: Config, prefix: str, start, deadline_holder, queue) -> None:
    connections.close_all()
    name = f"bench:{index % config.locks}"
    acquire, release = _make_lock(contender, name, config, prefix)
    work = _critical_section(config, f"{prefix}counter:{index % config.locks}")
    waits: list[float] = []
    timeouts = 0
    start.wait()
    end = deadline_holder.value
    while time.monotonic() < end:
        asked = time.monotonic()
        if not acquire():
            timeouts += 1
            continue
        waits.append(time.monotonic() - asked)
        try:
            work()
        finally:
            release()
    queue.put((index, waits, timeouts))
    connections.close_all()


def run_round(contender: str, config: Config, round_no: int) -> RoundResult:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    client = get_redis_connection(locks_settings.CACHE_ALIAS)
    connections.close_all()
    start, queue = FORK.Event(), FORK.Queue()
    deadline = FORK.Value("d", 0.0)
    procs = [FORK.Process(target=_worker, args=(i, contender, config, prefix, start, deadline, queue))
             for i in range(config.processes)]
    for p in procs:
        p.start()
    time.sleep(0.3 + 0.02 * config.processes)  # let every process get to the start line
    began = time.monotonic()
    deadline.value = began + config.duration
    start.set()
    results = [queue.get(timeout=config.duration + config.wait + 60) for _ in procs]
    elapsed = time.monotonic() - began
    failed = [r[2] for r in results if r[1] is None]
    if failed:
        raise RuntimeError(f"a {contender} worker failed:\n{failed[0]}")
    for p in procs:
        p.join(30)
    per_process = [len(w) for _, w, _ in sorted(results)]
    waits = sorted(w for _, ws, _ in results for w in ws)
    total = sum(per_process)
    counted = sum(int(client.get(f"{prefix}counter:{i}") or 0) for i in range(config.locks))
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    for key in client.scan_iter(match=f"lock:{{{prefix}*", count=1000):  # python-redis-lock's own keys
        client.delete(key)
    if contender in REDLOCK_CONTENDERS:  # the masters' lock, fence and wake keys of this round
        for url in config.redlock_urls:
            master = _redlock_client(url)
            for key in master.scan_iter(match=f"*{prefix}*", count=1000):
                master.delete(key)
            master.close()
    return RoundResult(
        contender=contender, round=round_no, acquisitions=total, per_process=per_process,
        rate=total / elapsed if elapsed else 0.0, wait_p50=percentile(waits, 0.50),
        wait_p95=percentile(waits, 0.95), wait_p99=percentile(waits, 0.99), wait_max=waits[-1] if waits else 0.0,
        counter_ok=counted == total, timeouts=sum(t for _, _, t in results),
    )


def run(config: Config, progress: Callable[[str], None] = lambda _: None) -> list[Summary]:
    rounds: dict[str, list[RoundResult]] = {c: [] for c in config.contenders}
    for round_no in range(1, config.rounds + 1):
        for contender in config.contenders:
            progress(f"round {round_no}/{config.rounds}: {contender}")
            rounds[contender].append(run_round(contender, config, round_no))
    out = []
    for contender, results in rounds.items():
        out.append(Summary(
            contender=contender,
            rate=statistics.median(r.rate for r in results),
            wait_p50=statistics.median(r.wait_p50 for r in results),
            wait_p99=statistics.median(r.wait_p99 for r in results),
            wait_max=max(r.wait_max for r in results),
            fairness=statistics.median(r.fairness for r in results),
            starved=max(r.starved(config.processes) for r in results),
            counter_ok=all(r.counter_ok for r in results),
            rounds=results,
        ))
    return out


def targets(summaries: list[Summary], processes: int) -> list[tuple[str, bool, str]]:
    """The issue's targets, each as (label, met, figures)."""
    by = {s.contender: s for s in summaries}
    ours, peer = by.get("ours"), by.get("redis-py")
    if ours is None or peer is None:
        return []
    p99_ratio = ours.wait_p99 / peer.wait_p99 if peer.wait_p99 else float("inf")
    rate_ratio = ours.rate / peer.rate if peer.rate else float("inf")
    return [
        ("p99 wait at most 1/5 of redis-py's", p99_ratio <= 0.2, f"{p99_ratio:.3f}x"),
        ("every process served (no process below 1/4 of its fair share)", ours.starved == 0,
         f"ours starved {ours.starved}, redis-py starved {peer.starved} of {processes}"),
        ("acquisitions/s at least 0.8x redis-py's", rate_ratio >= 0.8, f"{rate_ratio:.2f}x"),
    ]
