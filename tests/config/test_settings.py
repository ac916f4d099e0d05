"""Settings come from the environment; a mistake stops the start with a message naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


SETTINGS_VARIABLES = {"DATABASE_URL", "REDIS_URL", "LOCKS_REDIS_URL", "DEBUG", "SECRET_KEY"}


def start(print_: str = "settings.DATABASES['default']['NAME'], settings.CACHES['locks']['LOCATION']",
          **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); from django.conf import settings; print({print_})"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True, text=True, timeout=60,
    )


def test_local_defaults_work():
    # DEBUG is off by default; the laptop turns it on, as `./dev.sh` does.
    result = start(DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["shop", "redis://127.0.0.1:6379/0"]


def test_debug_is_off_unless_asked_for():
    result = start("settings.DEBUG", SECRET_KEY="k" * 50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
    assert start("settings.DEBUG", DEBUG="true").stdout.split() == ["True"]


def test_no_secret_key_and_no_debug_refuses_to_start():
    result = start()  # neither DEBUG nor SECRET_KEY: a server someone forgot to configure
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY" in result.stderr


def test_urls_are_read_from_the_environment():
    result = start(DEBUG="true", DATABASE_URL="mysql://root@127.0.0.1:3306/other", REDIS_URL="redis://127.0.0.1:6379/3")
    assert result.stdout.split() == ["other", "redis://127.0.0.1:6379/3"]


@pytest.mark.parametrize(("env", "named"), [
    ({"DATABASE_URL": "postgres://u@h/db"}, "DATABASE_URL"),
    ({"DATABASE_URL": "mysql://root@127.0.0.1:3306/"}, "DATABASE_URL"),
    ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"),
    ({"DEBUG": "maybe"}, "DEBUG"),
    ({"DEBUG": "false"}, "SECRET_KEY"),
    ({"DEBUG": "true", "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO"}, "SECURE_PROXY_SSL_HEADER"),
    ({"DEBUG": "true", "RATE_LIMITS": "login"}, "RATE_LIMITS"),
    ({"DEBUG": "true", "SHOP_COMBINE_LANES": "two"}, "SHOP_COMBINE_LANES"),
])
def test_a_settings_mistake_fails_at_start_naming_the_setting(env, named):
    result = start(**{"DEBUG": "true", **env})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr


@pytest.mark.parametrize(("url", "location", "factory"), [
    ("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster/0", "redis://mymaster/0?is_master=1",
     "django_redis.pool.SentinelConnectionFactory"),
    ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0", "redis://127.0.0.1:7000/0",
     "locks.django_redis_cluster.ClusterConnectionFactory"),
])
def test_sentinel_and_cluster_urls_configure_both_aliases(url, location, factory):
    # Every URL form, valid and not, is tested in-process in tests/locks/test_redis_urls.py.
    printed = ("settings.CACHES['default']['LOCATION'], settings.CACHES['locks']['LOCATION'], "
               "settings.CACHES['locks']['OPTIONS']['CONNECTION_FACTORY']")
    result = start(printed, DEBUG="true", REDIS_URL=url)  # LOCKS_REDIS_URL defaults to REDIS_URL
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [location, location, factory]


@pytest.mark.parametrize(("setting", "url"), [("REDIS_URL", "redis+sentinel://127.0.0.1:26379"),
                                              ("LOCKS_REDIS_URL", "redis+cluster://127.0.0.1:7000/3")])
def test_a_bad_redis_url_is_refused_at_start_with_a_correct_example(setting, url):
    result = start(DEBUG="true", **{setting: url})
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in message and f"{setting}=" in message, message
    assert "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster/0" in message


def test_checkout_lanes_are_read_from_the_environment():
    assert start("settings.SHOP.get('COMBINE_LANES')", DEBUG="true").stdout.split() == ["None"]  # conf: auto
    assert start("settings.SHOP['COMBINE_LANES']", DEBUG="true", SHOP_COMBINE_LANES="4").stdout.split() == ["4"]
    assert start("settings.SHOP['COMBINE_LANES']", DEBUG="true", SHOP_COMBINE_LANES="auto").stdout.split() == ["auto"]


def test_atomic_requests_is_off_and_isolation_is_read_committed(settings):
    db = settings.DATABASES["default"]
    assert db["ATOMIC_REQUESTS"] is False
    assert db["OPTIONS"]["isolation_level"] == "read committed"
    assert db["OPTIONS"]["charset"] == "utf8mb4"
    assert settings.CACHES["locks"]["BACKEND"] == "django_redis.cache.RedisCache"


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def test_check_deploy_is_clean_with_the_production_example_env():
    from django.core.management.utils import get_random_secret_key

    env = _env_file(ROOT / "docs" / "production.env.example")
    assert env["SECRET_KEY"] == ""  # never a usable key in a file people copy
    env["SECRET_KEY"] = get_random_secret_key()  # what its comment tells the operator to do
    # A production environment: none of the developer's or the test run's settings variables
    # (the browser tests set DJANGO_ALLOW_ASYNC_UNSAFE in this process, which --deploy flags).
    clean = {k: v for k, v in os.environ.items()
             if k not in SETTINGS_VARIABLES | {"DJANGO_ALLOW_ASYNC_UNSAFE"} and not k.startswith("SECURE_")}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr
    assert "WARNING" not in result.stderr + result.stdout


def test_secure_settings_are_read_from_the_environment():
    result = start("settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS, settings.SESSION_COOKIE_SECURE, "
                   "settings.CSRF_COOKIE_SECURE, settings.SECURE_PROXY_SSL_HEADER",
                   SECRET_KEY="k" * 50, SECURE_SSL_REDIRECT="true", SECURE_HSTS_SECONDS="600",
                   SESSION_COOKIE_SECURE="true", CSRF_COOKIE_SECURE="true",
                   SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True 600 True True ('HTTP_X_FORWARDED_PROTO', 'https')"


def test_compose_requires_a_secret_key_and_has_no_default_one():
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "SECRET_KEY: ${SECRET_KEY:?" in compose
    assert "SECRET_KEY:-" not in compose


def test_compose_runs_the_tested_database_and_mysql8_is_an_override():
    """MariaDB 10.11 (what every test runs on) by default; MySQL 8.4 from its override file, on a
    volume of its own (the two servers' data files do not mix)."""
    import yaml

    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mysql8 = yaml.safe_load((ROOT / "docker-compose.mysql8.yml").read_text())
    assert base["services"]["mysql"]["image"] == "mariadb:10.11"
    assert mysql8["services"]["mysql"]["image"] == "mysql:8.4"
    base_volume = base["services"]["mysql"]["volumes"][0]
    mysql8_volume = mysql8["services"]["mysql"]["volumes"][0]
    assert base_volume.split(":")[1] == mysql8_volume.split(":")[1] == "/var/lib/mysql"  # one replaces the other
    assert base_volume.split(":")[0] != mysql8_volume.split(":")[0]
    assert "docker-compose.mysql8.yml" in (ROOT / "docs" / "configuration.md").read_text()


def _run_image_start(tmp_path: Path, **env: str) -> list[str]:
    """Run the Dockerfile's CMD with `python` and `gunicorn` stubs that only log their arguments."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = json.loads(next(line for line in dockerfile.splitlines() if line.startswith("CMD "))[4:])
    log = tmp_path / "calls.log"
    for name in ("python", "gunicorn"):
        stub = tmp_path / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n')
        stub.chmod(0o755)
    subprocess.run(cmd, env={"PATH": f"{tmp_path}:/usr/bin:/bin", **env}, check=True, timeout=30)
    return log.read_text().splitlines()


def test_the_image_never_loads_demo_data_unless_asked(tmp_path):
    calls = _run_image_start(tmp_path)
    assert calls[0] == "python manage.py migrate --no-input"
    assert not any("seed_demo" in call for call in calls), calls  # no admin/admin in any image
    assert calls[-1].startswith("gunicorn config.wsgi")
    (tmp_path / "calls.log").unlink()
    assert "python manage.py seed_demo" in _run_image_start(tmp_path, SEED_DEMO="1")


SECRET = "S3cr3tPW"
MASK = "********************"  # Django's SafeExceptionReporterFilter.cleansed_substitute


@pytest.mark.parametrize(("env", "named"), [
    ({"DATABASE_URL": f"postgres://shop:{SECRET}@db/shop"}, "DATABASE_URL"),
    ({"DATABASE_URL": f"mysql://shop:{SECRET}@db:3306/"}, "DATABASE_URL"),
    ({"DATABASE_URL": f"mysql://shop:{SECRET}@db:notaport/shop"}, "DATABASE_URL"),
    ({"DATABASE_URL": f"mysql://shop:{SECRET}@[::1/shop"}, "DATABASE_URL"),
    ({"DATABASE_URL": f"mysql://shop:a@{SECRET}@db:3306/"}, "DATABASE_URL"),  # an unescaped @ in it
    ({"REDIS_URL": f"http://:{SECRET}@127.0.0.1:6379"}, "REDIS_URL"),
    ({"REDIS_URL": f"unix://?password={SECRET}"}, "REDIS_URL"),
    ({"LOCKS_REDIS_URL": f"redis+sentinel://:{SECRET}@127.0.0.1:26379"}, "LOCKS_REDIS_URL"),
    ({"LOCKS_REDIS_URL": f"redis+cluster://:{SECRET}@127.0.0.1:7000/3"}, "LOCKS_REDIS_URL"),
    ({"LOCKS_REDLOCK_URLS": f"http://:{SECRET}@a:1,redis://b:1/0,redis://c:1/0"}, "LOCKS_REDLOCK_URLS"),
    ({"LOCKS_ZOOKEEPER_HOSTS": f"shop:{SECRET}@zookeeper"}, "LOCKS_ZOOKEEPER_HOSTS"),
])
def test_a_start_up_error_never_prints_a_password(env, named):
    """These messages go to stderr and container logs; the URL is shown, its password not."""
    result = start(**{"DEBUG": "true", **env})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr, result.stderr
    assert SECRET not in result.stderr, result.stderr
    assert MASK in result.stderr.strip().splitlines()[-1]  # shown masked, the rest of the URL kept


def test_a_bad_zookeeper_auth_is_refused_without_printing_it():
    result = start(DEBUG="true", LOCKS_ZOOKEEPER_AUTH=SECRET)  # no "user:"
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "LOCKS_ZOOKEEPER_AUTH" in result.stderr, result.stderr
    assert SECRET not in result.stderr
    good = start("settings.LOCKS['ZOOKEEPER_AUTH']", DEBUG="true", LOCKS_ZOOKEEPER_AUTH=f"shop:{SECRET}")
    assert good.returncode == 0, good.stderr
    assert good.stdout.split() == [f"shop:{SECRET}"]
    assert start("settings.LOCKS['ZOOKEEPER_AUTH']", DEBUG="true").stdout.split() == ["None"]


def _load_wsgi(tmp_path: Path, env_file_text: str | None, **env: str) -> subprocess.CompletedProcess:
    """Import config.wsgi (what gunicorn does) with DEV_ENV_FILE pointing at a file of this text."""
    dev_env = tmp_path / "dev.env"
    if env_file_text is not None:
        dev_env.write_text(env_file_text)
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    return subprocess.run([sys.executable, "-c", "import config.wsgi"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings",
                                           "DEV_ENV_FILE": str(dev_env), **env})


def test_a_server_whose_debug_comes_from_the_dev_env_file_says_so_at_start(tmp_path):
    loud = _load_wsgi(tmp_path, "DEBUG=true\nSECRET_KEY=" + "k" * 50 + "\n")
    assert loud.returncode == 0, loud.stderr
    assert "DEBUG is on, read from" in loud.stderr and str(tmp_path / "dev.env") in loud.stderr
    # DEBUG from the environment (./dev.sh exports it) or off: nothing to say.
    assert "DEBUG is on" not in _load_wsgi(tmp_path, None, DEBUG="true").stderr
    assert "DEBUG is on" not in _load_wsgi(tmp_path, "SECRET_KEY=" + "k" * 50 + "\n").stderr


def test_the_crowd_limits_come_from_the_environment():
    result = start("settings.SHOP['MAX_WAITING'], settings.SHOP['QUEUE_TARGET']", DEBUG="true",
                   SHOP_MAX_WAITING="8", SHOP_QUEUE_TARGET="0.05")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8", "0.05"]
    for name, bad in (("SHOP_MAX_WAITING", "0"), ("SHOP_QUEUE_INTERVAL", "soon"), ("SHOP_QUEUE_MAX", "-3")):
        refused = start(DEBUG="true", **{name: bad})
        assert refused.returncode != 0 and name in refused.stderr


def test_a_misspelt_or_renamed_shop_key_is_a_system_check_error(settings):
    from shop.ops.checks import check_shop_keys

    settings.SHOP = {"LOCK_TTL": 2.0}
    assert check_shop_keys() == []
    settings.SHOP = {"SOLDOUT_CACHE_ALIAS": "markers", "LOCK_TLL": 2.0}
    found = {e.msg.split('"')[1]: e for e in check_shop_keys()}
    assert set(found) == {"SOLDOUT_CACHE_ALIAS", "LOCK_TLL"} and {e.id for e in found.values()} == {"shop.E003"}
    assert "REDIS_ALIAS" in found["SOLDOUT_CACHE_ALIAS"].hint


def test_shop_settings_follow_every_way_a_setting_changes(settings):
    """shop_settings reads SHOP from Django's own per-setting cache (shop/conf.py): an override, a
    plain assignment and the end of an override must each be seen at once."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    from shop.conf import DEFAULTS, shop_settings

    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 7}
    assert shop_settings.LINE_WINDOW == 7
    with override_settings(SHOP={"LINE_WINDOW": 3}):
        assert shop_settings.LINE_WINDOW == 3
        assert DEFAULTS["LINE_TURN"] == shop_settings.LINE_TURN  # not in SHOP: the default
    assert shop_settings.LINE_WINDOW == 7
    django_settings.SHOP = {**django_settings.SHOP, "LINE_WINDOW": 9}  # as a forked test process does
    assert shop_settings.LINE_WINDOW == 9
    with pytest.raises(AttributeError, match="unknown SHOP setting"):
        shop_settings.NO_SUCH_SETTING  # noqa: B018
