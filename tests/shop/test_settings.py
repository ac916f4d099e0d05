"""Settings come from the environment; a mistake stops the start with a message naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY"}}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "print(settings.DATABASES['default']['NAME'], settings.CACHES['locks']['LOCATION'])"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "shop.settings", **env},
        capture_output=True, text=True, timeout=60,
    )


def test_local_defaults_work():
    result = start()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["shop", "redis://127.0.0.1:6379/0"]


def test_urls_are_read_from_the_environment():
    result = start(DATABASE_URL="mysql://root@127.0.0.1:3306/other", REDIS_URL="redis://127.0.0.1:6379/3")
    assert result.stdout.split() == ["other", "redis://127.0.0.1:6379/3"]


@pytest.mark.parametrize(("env", "named"), [
    ({"DATABASE_URL": "postgres://u@h/db"}, "DATABASE_URL"),
    ({"DATABASE_URL": "mysql://root@127.0.0.1:3306/"}, "DATABASE_URL"),
    ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"),
    ({"DEBUG": "maybe"}, "DEBUG"),
    ({"DEBUG": "false"}, "SECRET_KEY"),
])
def test_a_settings_mistake_fails_at_start_naming_the_setting(env, named):
    result = start(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr


def test_atomic_requests_is_off_and_isolation_is_read_committed(settings):
    db = settings.DATABASES["default"]
    assert db["ATOMIC_REQUESTS"] is False
    assert db["OPTIONS"]["isolation_level"] == "read committed"
    assert db["OPTIONS"]["charset"] == "utf8mb4"
    assert settings.CACHES["locks"]["BACKEND"] == "django_redis.cache.RedisCache"
