"""The one table of environment variables (config/settings/environment.py), the settings that read
it, and docs/configuration.md's table of them (the README's until it became a front door), which
must name the same variables with the same defaults."""

from __future__ import annotations

import re

import pytest

from config.settings.environment import TABLE, value
from locks.backends import BACKENDS
from tests.config.test_settings import ROOT, start

SETTINGS_DIR = ROOT / "shop" / "settings"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def documented_rows() -> list[tuple[list[str], str, bool]]:
    """(names, default cell, is a note) of each row of docs/configuration.md's table. A note row
    says more about variables of other rows ("`REDIS_URL`, `LOCKS_REDIS_URL` forms")."""
    text = CONFIGURATION.read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, default, _meaning = (cell.strip() for cell in line.strip().strip("|").split("|", 2))
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", first)
        rows.append((names, default, bool(re.sub(r"`[A-Z][A-Z0-9_]*`|[,\s]", "", first))))
    return rows


def test_the_documented_table_names_exactly_the_variables_of_the_table():
    documented = {name for names, _, _ in documented_rows() for name in names}
    assert len(documented) > 50  # the table was found
    assert not set(TABLE) - documented, f"add to docs/configuration.md's table: {sorted(set(TABLE) - documented)}"
    assert not documented - set(TABLE), (f"docs/configuration.md names variables that config/settings/environment.py "
                                         f"lacks: {sorted(documented - set(TABLE))}")


def test_the_documented_table_shows_each_default_as_the_table_does():
    seen: list[str] = []
    for names, default, note in documented_rows():
        if note:
            continue
        seen += names
        shown = [TABLE[name].shown_default for name in names]
        # One default per name ("`10`, `3`"), or one for all of them ("`false`").
        assert default in {", ".join(shown)} | ({shown[0]} if len(set(shown)) == 1 else set()), (
            f"docs/configuration.md row {', '.join(names)}: default {default!r}, the table's {', '.join(shown)!r}")
    assert sorted(seen) == sorted(set(seen)), "a variable has two rows in docs/configuration.md"


def test_the_documented_table_lists_every_lock_backend_of_the_registry():
    (row,) = [line for line in CONFIGURATION.read_text().splitlines() if line.startswith("| `LOCKS_BACKEND`")]
    for name in BACKENDS:
        assert f"`{name}`" in row


def test_the_settings_read_every_variable_of_theirs():
    read = start("' '.join(sorted(__import__('config.settings.environment', fromlist=['READ']).READ))",
                 DEBUG="true", EMAIL_URL="")  # EMAIL_URL unset: the EMAIL_HOST... variables are read
    assert read.returncode == 0, read.stderr
    theirs = {name for name, var in TABLE.items() if not var.read_by}
    assert set(read.stdout.split()) == theirs


def test_variables_read_elsewhere_are_read_where_the_table_says():
    for var in TABLE.values():
        for path in var.read_by:
            assert var.name in (ROOT / path).read_text(), f"{path} does not read {var.name}"


def test_the_settings_modules_read_the_environment_only_through_the_table():
    for module in SETTINGS_DIR.glob("*.py"):
        if module.name == "environment.py":
            continue
        text = module.read_text()
        for reading in ("os.environ", "getenv", "env.str(", "env.int(", "env.float(", "env.bool(", "env.list("):
            assert reading not in text, f"{module.name} reads the environment itself ({reading})"


def test_value_knows_only_the_table_and_only_what_the_settings_read():
    with pytest.raises(KeyError):
        value("NO_SUCH_VARIABLE")
    with pytest.raises(LookupError, match=r"read by config/gunicorn\.conf\.py"):
        value("WEB_WORKER_CONNECTIONS")


def test_the_lock_backends_are_the_registrys(monkeypatch):
    """LOCKS_BACKEND accepts the names locks.backends.get_backend resolves, and no others."""
    monkeypatch.setitem(BACKENDS, "etcd", "locks.backends.etcd.EtcdBackend")
    monkeypatch.setenv("LOCKS_BACKEND", "etcd")
    assert value("LOCKS_BACKEND") == "etcd"
    monkeypatch.setenv("LOCKS_BACKEND", "consul")
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"'consul': use redis, redlock, zookeeper, mysql or etcd \("):
        value("LOCKS_BACKEND")


@pytest.mark.parametrize(("env", "message"), [
    ({"CONN_MAX_AGE": "soon"}, "CONN_MAX_AGE='soon': a whole number."),
    ({"SECURE_HSTS_SECONDS": ""}, "SECURE_HSTS_SECONDS='': a whole number."),
    ({"LOCKS_DEFAULT_TTL": "long"}, "LOCKS_DEFAULT_TTL='long': a number."),
])
def test_a_number_that_is_not_one_fails_at_start_naming_it(env, message):
    result = start(DEBUG="true", **env)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr, result.stderr


def test_server_email_defaults_to_the_sender_of_the_shops_mail():
    result = start("settings.SERVER_EMAIL", DEBUG="true", DEFAULT_FROM_EMAIL="shop@example.com")
    assert result.stdout.split() == ["shop@example.com"], result.stderr
    result = start("settings.SERVER_EMAIL", DEBUG="true", DEFAULT_FROM_EMAIL="shop@example.com",
                   SERVER_EMAIL="errors@example.com")
    assert result.stdout.split() == ["errors@example.com"], result.stderr


@pytest.mark.parametrize("key", ["$tarts-with-a-dollar-" + "x" * 40, "($%^&*-_=+)" + "y" * 40])
def test_a_secret_key_is_read_as_it_is_whatever_its_characters(key):
    """get_random_secret_key() (what production.env.example tells operators to run) draws from
    letters, digits and !@#$%^&*(-_=+): one key in 50 starts with "$", which django-environ reads as
    a reference to another variable. The key must be taken as it is."""
    result = start("settings.SECRET_KEY", DEBUG="false", SECRET_KEY=key)
    assert result.stdout.split() == [key], result.stderr
