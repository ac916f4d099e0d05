"""The registry of lock services (loadtest/lockservices.py): what points this process and
an app server at a service, and `manage.py backendbench`, which runs each one of them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from loadtest import lockservices
from loadtest.fault_harness import FaultOutcome
from loadtest.httpfaults import HttpFaultOutcome
from loadtest.lockservices import LockService
from locks import Lock
from locks.backends import get_backend

URLS = ["redis://10.0.0.1:6379/0", "redis://10.0.0.2:6379/0", "redis://10.0.0.3:6379/0"]


def test_a_service_says_the_same_thing_to_this_process_and_to_an_app_server():
    service = LockService("redlock", {"BACKEND": "redlock", "REDLOCK_URLS": URLS}, shop={"COMBINING": False})
    assert service.env == {"LOCKS_BACKEND": "redlock", "LOCKS_REDLOCK_URLS": ",".join(URLS), "SHOP_COMBINING": "false"}
    before = django_settings.LOCKS
    with service.switched():
        assert {**before, "BACKEND": "redlock", "REDLOCK_URLS": URLS} == django_settings.LOCKS
        assert django_settings.SHOP["COMBINING"] is False
    assert before == django_settings.LOCKS


def test_the_shared_service_is_this_process_own_settings():
    with lockservices.running(None) as service:
        assert service.env == {} and service.settings() == {} and service.servers is None


def test_a_private_redis_is_the_lock_redis_of_this_process_and_of_the_app_servers():
    with lockservices.running("redis") as service, service.switched():
        assert service.env == {"LOCKS_BACKEND": "redis", "LOCKS_REDIS_URL": service.servers.url}
        assert get_backend().name == "redis"
        with Lock("lockservices:probe", ttl=5) as held:
            assert service.servers.client().exists(held.lock.keys.lock)  # on the private server
        assert not service.servers.client().exists(Lock("lockservices:probe").keys.lock)


@pytest.mark.django_db(transaction=True)
def test_backendbench_runs_each_service_of_the_registry(tmp_path):
    out = StringIO()
    call_command("backendbench", "--backends", "redis,mysql", "--processes", "2", "--duration", "1",
                 "--repeat", "1", "--users", "4", "--json", str(tmp_path / "b.json"), stdout=out)
    data = json.loads((tmp_path / "b.json").read_text())
    assert set(data["backends"]) == {"redis", "mysql"}
    assert all(row["orders_per_s"] > 0 and row["invariants"] == "PASS" for row in data["backends"].values())
    assert data["backends"]["mysql"]["description"] == lockservices.SERVICES["mysql"].description


def test_both_fault_tables_render_through_report_table():
    from loadtest import fault_harness, faults, httpfaults, report

    assert issubclass(HttpFaultOutcome, FaultOutcome)
    assert httpfaults.table is fault_harness.table  # the in-process harness's command uses it too
    liveness = fault_harness.liveness([], in_stock=[(0, 1)], healed_at=0)
    outcome = FaultOutcome(scenario=faults.SCENARIOS["kill-holder"], faults=1, requests=[], oversold=0,
                           violations=[], liveness=liveness, stall_limit=4.0)
    assert fault_harness.table([outcome]) == report.table(FaultOutcome.COLUMNS, [outcome.row()])
    assert fault_harness.table([outcome]).splitlines()[0].split()[:3] == ["scenario", "faults", "orders"]


@pytest.mark.django_db
def test_backendbench_without_zookeeper_says_what_installs_it_before_anything_starts(monkeypatch):
    """`./dev.sh run` does not install ZooKeeper (Java): the default --backends stops at once, naming
    what installs it and the way round it, rather than with a traceback."""
    from loadtest.servers import zookeeper

    monkeypatch.setattr(zookeeper, "ZOOKEEPER_JAR", "/nonexistent/zookeeper.jar")
    with pytest.raises(CommandError, match=r"ZooKeeper is not installed.*\./dev\.sh setup test.*--backends redis,"):
        call_command("backendbench", "--duration", "0.1", "--repeat", "1", stdout=StringIO())
