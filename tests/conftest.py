"""Shared fixtures. Everything runs against the real MariaDB and Redis, but for the fast tier.

Each test session gets its own lock key prefix, so parallel runs on one machine never see each
other's locks, and the prefix's keys are deleted at the end.

The fast tier (`./dev.sh fast`, that is `pytest -m fast` with MariaDB and Redis pointed at closed
ports): every test that asks for no database, Redis, server or browser, and is not marked `slow`,
`browser`, `alone`, `liveness` or `services`, is marked `fast` at collection. Pure rules, parsing,
formatting, the worker's triage, settings: the edit-test loop, in seconds, without the services.
A test that needs a service without asking for a fixture that says so fails there (closed ports):
it is marked `services`.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.test import TransactionTestCase
from django_redis import get_redis_connection

from tests.helpers import RedisServer


@contextmanager
def _turn(folder: str, alone: bool) -> Iterator[None]:
    """Under pytest-xdist (./dev.sh test runs three workers), a test marked `alone` runs while the
    others wait: a writer-preferring lock on two files of this run. Other tests share it;
    an `alone` test first shuts the gate (no test starts beside it), then waits for the test
    running beside it to end. Unlocked explicitly: a forked child keeps the file open, not the lock."""
    with open(Path(folder) / "gate", "a") as gate, open(Path(folder) / "lock", "a") as lock:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


# Fixtures that reach a service (MariaDB through pytest-django's, Redis, a server of the test's own,
# a browser): a test that asks for one, directly or through another fixture, is not fast.
SERVICE_FIXTURES = frozenset({
    "django_db_setup", "live_server",  # every database fixture of pytest-django asks for the first
    "redis_client", "redis_server", "private_redis", "held_elsewhere", "idle_redis",
    "name", "one_shot_name", "fresh_prefix", "family", "_room_for_families",  # tests/locks: locks on Redis
    "backend", "masters", "redis_cluster", "own_cluster", "sentinel_set", "own_sentinel_set", "zookeeper",
    "server", "tight_server", "browser",
})
NOT_FAST_MARKERS = ("django_db", "slow", "browser", "alone", "liveness", "services")


def is_fast(item: pytest.Item) -> bool:
    """Whether the test runs without MariaDB, Redis, a server or a browser (see the module's docstring)."""
    if item.get_closest_marker("fast"):
        return True
    if any(item.get_closest_marker(name) for name in NOT_FAST_MARKERS):
        return False
    callspec = getattr(item, "callspec", None)
    fixtures = set(getattr(item, "fixturenames", ())) - set(callspec.params if callspec else ())  # not @parametrize's
    return SERVICE_FIXTURES.isdisjoint(fixtures)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the fast tier before `-m` selects (pytest's own deselection runs after this hook)."""
    for item in items:
        if is_fast(item):
            item.add_marker(pytest.mark.fast)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None) \
            and not hasattr(config, "workerinput"):
        config.alone_folder = tempfile.mkdtemp(prefix="pytest-alone-")


def pytest_unconfigure(config):
    if getattr(config, "alone_folder", None):
        shutil.rmtree(config.alone_folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller hands each xdist worker the folder of the `alone` lock's files."""
    node.workerinput["alone_folder"] = node.config.alone_folder


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of a test marked `alone` with nothing beside it (see `_turn`)."""
    folder = getattr(item.config, "workerinput", {}).get("alone_folder")
    if folder is None:
        return (yield)
    with _turn(folder, item.get_closest_marker("alone") is not None):
        return (yield)


def _delete_matching(client, pattern: str) -> None:
    """Delete the keys matching `pattern` (SCAN, never KEYS), 500 at a time."""
    keys = list(client.scan_iter(match=pattern, count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


@pytest.fixture(scope="session", autouse=True)
def _lock_key_prefix(request):
    prefix = f"test{os.getpid()}:"
    settings.LOCKS = {**settings.LOCKS, "KEY_PREFIX": prefix}
    if all(item.get_closest_marker("fast") for item in request.session.items):
        yield prefix  # the fast tier: no Redis to clean up
        return
    client = get_redis_connection(settings.LOCKS["CACHE_ALIAS"])

    # At exit, and registered before the lock statistics' own exit flush, so it runs after it
    # (atexit is last in, first out): that flush would write this run's stats keys again.
    atexit.register(_delete_matching, client, f"{prefix}*")
    yield prefix


@pytest.fixture(autouse=True)
def _fresh_rate_limit_counters(settings, _lock_key_prefix):
    """Every test counts its rate limits from zero: the counters live in Redis, and a test that
    signs up or checks out must not be throttled by the tests that ran in the same minute."""
    settings.RATELIMIT_CACHE_PREFIX = f"rl:{_lock_key_prefix}{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client():
    return get_redis_connection(settings.LOCKS["CACHE_ALIAS"])


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server (no persistence) a test may stop, restart or wipe."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


_after_flush: dict[str, list[tuple[str, list[str], list[tuple]]]] = {}


def _rows_after_flush(connection) -> list[tuple[str, list[str], list[tuple]]]:
    """The rows a flush leaves (the content types and permissions its post_migrate made), table by table."""
    taken = []
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT * FROM {quoted}")
            rows = cursor.fetchall()
            if rows:
                taken.append((quoted, [connection.ops.quote_name(c[0]) for c in cursor.description], rows))
    return taken


def _fixture_teardown(self) -> None:
    """A transactional test's teardown without post_migrate's hundred queries each time: the first
    flush is Django's own (post_migrate remakes the content types and permissions) and what it
    leaves is kept; every later one empties the tables and writes those rows back as they were
    (ids included). The same state for the next test, in ~10 ms instead of ~70 (x ~1,400 tests)."""
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command
    from django.db import connections

    if self.available_apps is not None or self.serialized_rollback:
        return _django_fixture_teardown(self)
    for alias in self._databases_names(include_mirrors=False):
        if alias not in _after_flush:
            call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False,
                         allow_cascade=False, inhibit_post_migrate=False)
            _after_flush[alias] = _rows_after_flush(connections[alias])
            continue
        call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False,
                     allow_cascade=False, inhibit_post_migrate=True)
        connection = connections[alias]
        with connection.constraint_checks_disabled(), connection.cursor() as cursor:
            for table, columns, rows in _after_flush[alias]:
                marks = ", ".join(["%s"] * len(columns))
                cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
    ContentType.objects.clear_cache()  # as post_migrate's create_contenttypes does


_django_fixture_teardown = TransactionTestCase._fixture_teardown
TransactionTestCase._fixture_teardown = _fixture_teardown


@pytest.fixture(autouse=True)
def _services_clean(request):
    """Every test but the fast tier's starts with the test database's stale Redis keys deleted
    (once a session): a fast test reaches neither."""
    if not request.node.get_closest_marker("fast"):
        request.getfixturevalue("_no_stale_shop_keys")


@pytest.fixture(scope="session")
def _no_stale_shop_keys(django_db_setup, django_db_blocker):
    """The test database starts its ids at 1 again: its sold-out markers, idempotency records
    and fence refusals from an earlier run must not apply. They are deleted again at the end,
    so a run leaves nothing in the shared Redis (a run writes ~28k idempotency records, kept a
    day: a few runs' worth made the test of paging through held locks outlast its leases)."""
    from shop.plumbing import redis_keys

    with django_db_blocker.unblock():
        namespace = redis_keys.namespace()
    client = get_redis_connection("default")

    _delete_matching(client, f"{namespace}:*")  # the test database's own
    yield
    _delete_matching(client, f"{namespace}:*")


@pytest.fixture
def private_redis(settings) -> Iterator[RedisServer]:
    """Both Redis aliases (markers and locks) on a private redis-server, configured exactly as
    config/settings/redis_locks.py configures them from REDIS_URL: a test may stop, freeze or wipe it."""
    from config.settings import redis_cache

    server = RedisServer()
    server.start()
    settings.CACHES = {**settings.CACHES, "default": redis_cache(server.url), "locks": redis_cache(server.url)}
    try:
        yield server
    finally:
        server.resume()
        server.stop()


@pytest.fixture(scope="module")
def _module_chromium():
    from tests.browser import module_browser

    with module_browser() as browser:
        yield browser


@pytest.fixture
def browser(_module_chromium):
    """Debian's Chromium, one per test module (tests/browser.py says why); a context a failed
    test left open is closed after it."""
    yield _module_chromium
    for context in _module_chromium.contexts:
        context.close()
