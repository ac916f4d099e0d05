"""Choosing the lock backend from the environment, and the compose file for scale-out laptops."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.config.test_settings import ROOT, start

REDLOCK = ",".join(f"redis://127.0.0.1:{p}/0" for p in range(6382, 6387))


def test_the_backend_and_its_servers_come_from_the_environment():
    result = start("settings.LOCKS['BACKEND'], len(settings.LOCKS['REDLOCK_URLS']), settings.LOCKS['ZOOKEEPER_HOSTS']",
                   DEBUG="true", LOCKS_BACKEND="redlock", LOCKS_REDLOCK_URLS=REDLOCK,
                   LOCKS_ZOOKEEPER_HOSTS="10.0.0.1:2181,10.0.0.2:2181")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["redlock", "5", "10.0.0.1:2181,10.0.0.2:2181"]
    assert start("settings.LOCKS['BACKEND']", DEBUG="true").stdout.split() == ["redis"]


@pytest.mark.parametrize(("env", "message"), [
    ({"LOCKS_BACKEND": "etcd"},
     "LOCKS_BACKEND='etcd': use redis, redlock, zookeeper or mysql (e.g. LOCKS_BACKEND=redis)"),
    ({"LOCKS_BACKEND": "redlock"}, "needs at least 3 independent Redis masters in LOCKS_REDLOCK_URLS"),
    ({"LOCKS_BACKEND": "redlock", "LOCKS_REDLOCK_URLS": "redis://a:1/0,redis://b:1/0"}, "e.g. LOCKS_REDLOCK_URLS=redis://"),
    ({"LOCKS_REDLOCK_URLS": "http://a:1,redis://b:1/0,redis://c:1/0"}, "'http://a:1', not a redis:// URL (e.g. "),
    ({"LOCKS_ZOOKEEPER_HOSTS": "zookeeper"},
     "use host:port[,host:port...] (e.g. LOCKS_ZOOKEEPER_HOSTS=127.0.0.1:2181)"),
])
def test_a_bad_backend_setting_is_refused_with_a_correct_example(env, message):
    result = start(DEBUG="true", **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.scaleout.yml").read_text())


def test_the_scale_out_compose_file_runs_three_app_servers_on_one_configuration():
    services = _compose()["services"]
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["web"]["environment"]
    envs = [services[name]["environment"] for name in ("web2", "web3")]
    for env in envs:
        assert set(base) - {"SEED_DEMO"} <= set(env), set(base) - set(env)
        assert env["SEED_DEMO"] == "0"  # one server loads the demo data, not three
        assert env["LOCKS_BACKEND"] == "${LOCKS_BACKEND:-redis}"
    assert envs[0] == envs[1]
    assert services["web2"]["ports"] != services["web3"]["ports"]


def test_the_compose_addresses_agree():
    services = _compose()["services"]
    env = services["web2"]["environment"]
    # Redlock: five independent masters, each a service of the redlock profile.
    hosts = re.findall(r"redis://([a-z0-9]+):6379/0", env["LOCKS_REDLOCK_URLS"])
    assert len(hosts) == 5 and all(services[h]["profiles"] == ["redlock"] for h in hosts)
    # ZooKeeper.
    assert env["LOCKS_ZOOKEEPER_HOSTS"].startswith("${LOCKS_ZOOKEEPER_HOSTS:-zookeeper:2181}")
    assert services["zookeeper"]["profiles"] == ["zookeeper"]
    # Cluster: the create command names exactly the six nodes' fixed addresses.
    ips = {s["networks"]["scaleout"]["ipv4_address"] for n, s in services.items() if re.fullmatch(r"cluster\d", n)}
    created = set(re.findall(r"(172\.28\.0\.\d+):6379", " ".join(services["cluster-create"]["entrypoint"])))
    assert len(ips) == 6 and created == ips
    # Sentinel: the sentinels monitor the master's fixed address; the replica follows it.
    master = services["redis-master"]["networks"]["scaleout"]["ipv4_address"]
    assert f"sentinel monitor mymaster {master} 6379 2" in services["sentinel1"]["entrypoint"][-1]
    assert services["redis-replica"]["command"][-2:] == [master, "6379"]
    assert services["sentinel2"] == services["sentinel1"] == services["sentinel3"]


def test_the_monitoring_profile_scrapes_the_three_app_servers():
    services = _compose()["services"]
    [mount] = services["prometheus"]["volumes"]
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert sorted(job["static_configs"][0]["targets"]) == ["web2:8000", "web3:8000", "web:8000"]
    # The servers let the scaleout network in (no token needed inside it).
    subnet = _compose()["networks"]["scaleout"]["ipam"]["config"][0]["subnet"]
    assert services["web2"]["environment"]["METRICS_ALLOWED_IPS"] == "${METRICS_ALLOWED_IPS:-" + subnet + "}"
