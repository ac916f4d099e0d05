"""locks/redis_urls.py: every Redis URL form -> a django-redis CACHES entry; a bad one refused
with an example of each correct form."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from locks.redis_urls import EXAMPLES, cache_config, kind


def _config(url: str) -> dict:
    return cache_config(url, socket_timeout=0.5, pool_kwargs={"max_connections": 200}, setting="LOCKS_REDIS_URL")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/2", "rediss://:pw@redis.example:6380/0",
                                 "unix:///run/redis.sock?db=1"])
def test_a_single_server_url_is_used_as_it_is(url):
    config = _config(url)
    assert config["LOCATION"] == url
    assert config["OPTIONS"]["CLIENT_CLASS"] == "django_redis.client.DefaultClient"
    assert config["OPTIONS"]["CONNECTION_POOL_KWARGS"] == {"max_connections": 200}
    assert kind(config) == "single"


def test_sentinel_is_the_master_only_with_a_bounded_retry():
    config = _config("redis+sentinel://:s3cret@127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster/2")
    options = config["OPTIONS"]
    # DefaultClient with is_master=1: every read and write on the master (SentinelClient would read
    # a replica, where a lock just taken may not be yet).
    assert config["LOCATION"] == "redis://mymaster/2?is_master=1"
    assert options["CLIENT_CLASS"] == "django_redis.client.DefaultClient"
    assert options["CONNECTION_FACTORY"] == "django_redis.pool.SentinelConnectionFactory"
    assert options["SENTINELS"] == [("127.0.0.1", 26379), ("127.0.0.1", 26380), ("127.0.0.1", 26381)]
    assert options["PASSWORD"] == "s3cret"
    assert (options["SOCKET_TIMEOUT"], options["SENTINEL_KWARGS"]["socket_timeout"]) == (0.5, 0.5)
    retry = options["CONNECTION_POOL_KWARGS"]["retry"]
    assert retry.get_retries() == 1  # once, at once: not 10 tries with backoff against a dead master
    assert options["SENTINEL_KWARGS"]["retry"].get_retries() == 0
    assert kind(config) == "sentinel"


def test_cluster_uses_the_cluster_factory_and_client():
    config = _config("redis+cluster://10.0.0.1:7000,10.0.0.2:7001")
    options = config["OPTIONS"]
    assert options["CONNECTION_FACTORY"] == "locks.django_redis_cluster.ClusterConnectionFactory"
    assert options["CLIENT_CLASS"] == "locks.django_redis_cluster.ClusterClient"
    assert options["CLUSTER_NODES"] == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert config["LOCATION"] == "redis://10.0.0.1:7000/0"
    assert kind(config) == "cluster"


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:6379", "not a Redis URL"),
    ("redis://", "no host"),
    ("redis+sentinel://127.0.0.1:26379", "master name"),
    ("redis+sentinel://127.0.0.1:26379/mymaster/0/1", "master name"),
    ("redis+sentinel://127.0.0.1:26379/mymaster/zero", "not a number"),
    ("redis+sentinel://127.0.0.1:x/mymaster", "not host:port"),
    ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
    ("redis+cluster://127.0.0.1:7000,:7001/0", "not host:port"),
    ("redis+cluster://127.0.0.1:7000/0?read_from_replicas=1", "not supported"),
])
def test_a_bad_url_is_refused_with_an_example_of_each_form(url, why):
    with pytest.raises(ImproperlyConfigured) as refused:
        _config(url)
    message = str(refused.value)
    assert message.startswith(f"LOCKS_REDIS_URL={url!r}") and why in message, message
    assert EXAMPLES in message
    assert "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster/0" in EXAMPLES
    assert "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0" in EXAMPLES
