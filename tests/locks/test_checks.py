"""System checks name the setting to fix."""

from __future__ import annotations

import copy

import pytest

from locks.checks import check_locks_settings

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def _ids() -> set[str]:
    return {e.id for e in check_locks_settings()}


def test_the_project_settings_pass():
    assert _ids() == set()


def test_a_non_django_redis_cache_is_an_error(settings):
    caches = copy.deepcopy(settings.CACHES)
    caches["locks"]["BACKEND"] = "django.core.cache.backends.redis.RedisCache"
    settings.CACHES = caches
    errors = check_locks_settings()
    assert "locks.E003" in {e.id for e in errors}
    assert any("CACHES['locks']['BACKEND']" in e.msg for e in errors)


def test_a_missing_alias_is_an_error(settings):
    settings.LOCKS = {**settings.LOCKS, "CACHE_ALIAS": "nope"}
    assert "locks.E002" in _ids()


def test_ignore_exceptions_and_sharding_are_errors(settings):
    caches = copy.deepcopy(settings.CACHES)
    caches["locks"]["OPTIONS"]["IGNORE_EXCEPTIONS"] = True
    caches["locks"]["OPTIONS"]["CLIENT_CLASS"] = "django_redis.client.ShardClient"
    settings.CACHES = caches
    assert {"locks.E004", "locks.E005"} <= _ids()


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0",
                                 "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0"])
def test_sentinel_and_cluster_urls_pass_the_checks(settings, url):
    from locks.redis_urls import cache_config

    settings.CACHES = {**settings.CACHES, "locks": cache_config(url, socket_timeout=0.5)}
    assert not {"locks.E003", "locks.E004", "locks.E005"} & _ids()


def test_sentinel_client_reads_replicas_and_is_an_error(settings):
    caches = copy.deepcopy(settings.CACHES)
    caches["locks"]["OPTIONS"]["CLIENT_CLASS"] = "django_redis.client.SentinelClient"
    settings.CACHES = caches
    assert "locks.E004" in _ids()


def test_atomic_requests_is_an_error(settings):
    databases = copy.deepcopy(settings.DATABASES)
    databases["default"]["ATOMIC_REQUESTS"] = True
    settings.DATABASES = databases
    errors = check_locks_settings()
    assert any(e.id == "locks.E006" and "ATOMIC_REQUESTS" in e.msg for e in errors)


def test_insane_ttl_wait_and_unknown_keys(settings):
    settings.LOCKS = {**settings.LOCKS, "DEFAULT_TTL": 0, "DEFAULT_WAIT": -1, "TYPO": 1}
    assert {"locks.E001", "locks.E007", "locks.E008"} <= _ids()
    settings.LOCKS = {**settings.LOCKS, "DEFAULT_TTL": 1.0, "DEFAULT_WAIT": 30.0, "MAX_HOLD": 0.5}
    ids = _ids()
    assert {"locks.W002", "locks.E009"} <= ids


def test_repeatable_read_is_a_warning(settings):
    databases = copy.deepcopy(settings.DATABASES)
    databases["default"]["OPTIONS"]["isolation_level"] = "repeatable read"
    settings.DATABASES = databases
    assert "locks.W001" in _ids()
