"""Prometheus lock metrics (locks/metrics.py): real locks on the real Redis, real processes.

Counters in the default registry live for the whole test session, so every test reads the
values before and after and checks the difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from locks import Lock, LockNotOwned, LockTimeout, inspect, metrics, stats
from tests.locks.conftest import FORK, wait_until_queued

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _room_for_families():
    """The family cap counts the families seen in this process; earlier tests (each lock name
    its own family) must not push this test's families into `other`."""
    metrics._children.clear()


@pytest.fixture
def family() -> str:
    return f"t:mx{uuid.uuid4().hex[:10]}"


def value(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def test_uncontended_acquisitions_count_their_wait_and_hold(family):
    before = (value("locks_acquisitions_total", family=family, contended="false"),
              value("locks_wait_seconds_count", family=family), value("locks_hold_seconds_count", family=family))
    for _ in range(3):
        with Lock(f"{family}:a", family=family):
            time.sleep(0.02)
    assert value("locks_acquisitions_total", family=family, contended="false") == before[0] + 3
    assert value("locks_acquisitions_total", family=family, contended="true") == 0
    assert value("locks_wait_seconds_count", family=family) == before[1] + 3
    assert value("locks_hold_seconds_count", family=family) == before[2] + 3
    # Each hold lasted at least 20 ms: none of them is in a bucket below that.
    assert value("locks_hold_seconds_bucket", family=family, le="0.01") == 0
    assert value("locks_hold_seconds_sum", family=family) >= 3 * 0.02


def test_a_contended_acquisition_is_a_hand_off_and_its_wait_is_observed(family):
    name = f"{family}:b"
    got = {}

    def wait() -> None:
        with Lock(name, family=family, wait=10) as hold:
            got["waited"] = hold.waited

    t = threading.Thread(target=wait)
    with Lock(name, family=family, ttl=10) as first:
        t.start()
        wait_until_queued(name)
        time.sleep(0.1)
    t.join(10)
    assert got["waited"] >= 0.1
    assert value("locks_acquisitions_total", family=family, contended="true") == 1
    assert value("locks_handoffs_total", family=family) == 1
    # Only the holder's uncontended wait can be in the lowest bucket, and it is there unless a
    # loaded machine made even that take over 50 ms (its measured wait says which).
    assert value("locks_wait_seconds_bucket", family=family, le="0.05") == (first.waited <= 0.05)
    assert value("locks_wait_seconds_count", family=family) == 2
    assert value("locks_wait_seconds_sum", family=family) >= 0.1


def test_timeouts_lost_locks_and_force_releases_are_counted(family):
    name = f"{family}:c"
    with Lock(name, family=family), pytest.raises(LockTimeout), Lock(name, family=family, wait=0.05):
        pass
    assert value("locks_timeouts_total", family=family) == 1

    short = Lock(name, family=family, ttl=0.1)
    assert short.acquire()
    time.sleep(0.25)  # the lease ran out; someone else takes the lock meanwhile
    with Lock(name, family=family):
        pass
    with pytest.raises(LockNotOwned):
        short.release()
    assert value("locks_lost_total", family=family) == 1

    holds = value("locks_hold_seconds_count", family=family)
    assert Lock(name, family=family, ttl=30).acquire()
    assert inspect.force_release(name, family=family) is not None
    assert value("locks_force_releases_total", family=family) == 1
    assert value("locks_hold_seconds_count", family=family) == holds + 1  # the hold it ended


def test_family_labels_are_capped(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_FAMILIES", 2)
    families = [f"t:cap{uuid.uuid4().hex[:8]}" for _ in range(4)]
    other = value("locks_acquisitions_total", family="other", contended="false")
    for fam in families:
        with Lock(f"{fam}:x", family=fam):
            pass
    assert value("locks_acquisitions_total", family=families[0], contended="false") == 1
    assert value("locks_acquisitions_total", family=families[1], contended="false") == 1
    assert value("locks_acquisitions_total", family="other", contended="false") == other + 2


def _wait_for(name: str, queue) -> None:
    with Lock(name, wait=20):
        queue.put(1)


def test_queue_depth_is_read_at_scrape_time_for_the_hot_family():
    name = f"product:{900_000_000 + int(uuid.uuid4().int % 1_000_000)}"
    for _ in range(60):  # among the family's busiest names (the gauge reads the top ones)
        with Lock(name):
            pass
    stats.flush()
    holder = Lock(name, ttl=30)
    holder.acquire()
    queue = FORK.Queue()
    procs = [FORK.Process(target=_wait_for, args=(name, queue)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        wait_until_queued(name, 2)
        depth = _sample(inspect.ScrapeCollector(top=50), "locks_queue_depth", family="product:*")
        assert depth >= 2
    finally:
        holder.release()
        for p in procs:
            p.join(20)
    assert [p.exitcode for p in procs] == [0, 0]
    assert _sample(inspect.ScrapeCollector(), "locks_backend_info", backend="redis") == 1


def _sample(collector, name: str, **labels: str) -> float:
    for family in collector.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name}{labels} not collected")


# --- multi-process mode ------------------------------------------------------------------------
_RECORD = """
import os, sys, django
django.setup()
from locks import Lock
from shop.ops import metrics
family, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    with Lock(family + ":mp", family=family):
        pass
metrics.soldout_rejected()
print(os.getpid())
"""


def _record_in_new_process(directory: Path, family: str, n: int) -> int:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "LOCKS_KEY_PREFIX": settings.LOCKS["KEY_PREFIX"]}  # the session's: its keys are deleted at the end
    out = subprocess.run([sys.executable, "-c", _RECORD, family, str(n)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_one_scrape_sums_the_files_of_every_worker_process(tmp_path, monkeypatch, family):
    """Two worker processes (fresh interpreters, as gunicorn's workers import the app after the
    fork) write their own files; the view's MultiProcessCollector adds them up; the master's
    child_exit hook (config/gunicorn.conf.py) keeps a dead worker's counters in the sum."""
    from shop.ops.metrics import exposition

    pids = [_record_in_new_process(tmp_path, family, 3), _record_in_new_process(tmp_path, family, 5)]
    assert len(set(pids)) == 2
    assert {p.name for p in tmp_path.glob("counter_*.db")} == {f"counter_{pid}.db" for pid in pids}

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    conf = _gunicorn_conf()
    for pid in pids:
        conf.child_exit(None, type("Worker", (), {"pid": pid}))
    scraped = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(exposition().decode()) for s in fam.samples}
    assert scraped[("locks_acquisitions_total", (("contended", "false"), ("family", family)))] == 8
    assert scraped[("locks_hold_seconds_count", (("family", family),))] == 8
    assert scraped[("flashsale_soldout_rejections_total", ())] == 2
    assert ("locks_backend_info", (("backend", "redis"),)) in scraped  # scrape-time collectors too


def _gunicorn_conf():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gunicorn_conf_under_test", ROOT / "config/gunicorn.conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # PROMETHEUS_MULTIPROC_DIR is set: it makes no directory
    return module
