"""The ways a paused holder's MySQL transaction is ended, their checks and their failure modes."""

from __future__ import annotations

import math
import os
import signal
import time

import MySQLdb
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core import checks
from django.db import InterfaceError, OperationalError, connection, connections, transaction

from config.settings import redis_cache
from shop.models import Product
from shop.plumbing import hooks, stale_transactions
from shop.plumbing.lock_names import product_lock
from tests.helpers import make_users, run_processes
from tests.locks.conftest import FORK
from tests.shop.services.test_combining import _run_behind_combiner
from tests.shop.services.test_long_pause import _timed_buy

pytestmark = pytest.mark.django_db(transaction=True)


def _check_ids(settings, value) -> list[str]:
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": value}
    return [m.id for m in checks.run_checks(tags=["database"], databases=["default"]) if m.id.startswith("shop.")]


def test_auto_on_mariadb_uses_the_server_timeout_and_check_is_quiet(settings):
    assert connection.mysql_is_mariadb
    assert _check_ids(settings, "auto") == []
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "auto"}
    with stale_transactions.service_transaction() as mode, connection.cursor() as cursor:
        assert mode == "timeout"
        cursor.execute("SELECT @@SESSION.idle_transaction_timeout")
        assert cursor.fetchone()[0] == stale_transactions.timeout_seconds()


def test_in_mysql8_mode_auto_is_kill_and_check_names_the_privileges(settings, mysql8):
    assert _check_ids(settings, "auto") == ["shop.W002"]
    assert _check_ids(settings, "timeout") == ["shop.E002"]
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "auto"}
    message = next(m.msg for m in checks.run_checks(tags=["database"], databases=["default"]) if m.id == "shop.W002")
    assert "PROCESS" in message and "CONNECTION_ADMIN" in message
    assert stale_transactions.mode() == "kill"


def test_check_names_a_bad_value_the_off_switch_and_kill_mode(settings):
    assert _check_ids(settings, "sometimes") == ["shop.E001"]
    assert _check_ids(settings, "off") == ["shop.W001"]
    assert _check_ids(settings, "kill") == ["shop.W002"]


@pytest.fixture
def limited_user():
    """A second MySQL user without CONNECTION_ADMIN: it may kill only its own connections."""
    with connection.cursor() as cursor:
        cursor.execute("DROP USER IF EXISTS 'shop_limited'@'127.0.0.1'")
        cursor.execute("CREATE USER 'shop_limited'@'127.0.0.1' IDENTIFIED BY 'pw'")
    yield "shop_limited"
    with connection.cursor() as cursor:
        cursor.execute("DROP USER IF EXISTS 'shop_limited'@'127.0.0.1'")


def test_a_refused_kill_is_logged_and_leaves_the_old_behaviour(limited_user, caplog):
    """KILL of another user's connection without the privilege: error 1095, logged, not raised."""
    connection.ensure_connection()
    victim = connection.connection.thread_id()  # root's connection, taken for a stale holder
    db = connection.settings_dict
    limited = MySQLdb.connect(host="127.0.0.1", port=int(db["PORT"] or 3306), user=limited_user, passwd="pw")
    try:
        suspect = stale_transactions.Candidate(thread_id=victim, fence=5, lock="product:stale-test")
        watcher = stale_transactions._Watcher(params={}, waiter=0, holds={}, suspects={victim: suspect}, until=0)
        watcher._kill(limited, suspect)
        assert watcher.killed is None
        assert "refused (error 1095)" in caplog.text
        with connection.cursor() as cursor:  # the root connection is alive
            cursor.execute("SELECT 1")
    finally:
        limited.close()


# --- the session bounds are the services' only -----------------------------------------------
def _buy_once(user, product) -> None:
    from shop.services import place_order

    place_order(user=user, lines=[(product.pk, 1)])


def test_a_transaction_outside_the_services_may_sit_idle_past_the_timeout(settings, user, make_product):
    """A job or an admin form on a connection that served a checkout is not dropped after 2 s idle."""
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "timeout"}
    p = make_product(stock=5)
    _buy_once(user, p)
    with transaction.atomic():
        Product.objects.filter(pk=p.pk).update(name="renamed by a slow job")
        time.sleep(stale_transactions.timeout_seconds() + 1.0)
        assert Product.objects.get(pk=p.pk).name == "renamed by a slow job"  # the connection is alive


def test_outside_the_services_a_row_wait_has_the_servers_default(settings, user, make_product):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "STALE_TRANSACTIONS": "kill"}
    p = make_product(stock=5)
    seen = {}

    def hook(stage: str, holds: dict) -> None:
        if stage == "before_update":
            with connection.cursor() as cursor:
                cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
                seen["service"] = cursor.fetchone()[0]

    hooks.checkout_hook = hook
    try:
        _buy_once(user, p)
    finally:
        hooks.checkout_hook = None
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_lock_wait_timeout")
        session, server = cursor.fetchone()
    assert seen["service"] == math.ceil(float(django_settings.SHOP.get("LOCK_TTL", 1.0)))
    assert session == server


# --- kill mode kills only the stale holder that blocks the row -------------------------------
def _holder_records(product) -> list[str]:
    client = stale_transactions._client()
    return [e.decode() for e in client.lrange(stale_transactions._key(product_lock(product.pk)), 0, -1)]


@pytest.mark.parametrize("combining", [True, False], ids=["combining", "batch-of-1"])
def test_a_hold_that_ended_leaves_no_holder_record(settings, user, make_product, mysql8, combining):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": combining}
    assert stale_transactions.mode() == "kill"
    p = make_product(stock=5)
    during = {}

    def hook(stage: str, holds: dict) -> None:
        if stage == "before_commit":
            [entry] = _holder_records(p)
            during["lock"] = stale_transactions.hold_lock_name(entry.split()[3])
            with connection.cursor() as cursor:
                cursor.execute("SELECT IS_USED_LOCK(%s), CONNECTION_ID()", [during["lock"]])
                during["used_by"], during["us"] = cursor.fetchone()

    hooks.checkout_hook = hook
    try:
        _buy_once(user, p)
    finally:
        hooks.checkout_hook = None
    assert _holder_records(p) == []
    # The record's hold lock: kept by the holder's connection during the hold, released after it.
    assert during["used_by"] == during["us"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [during["lock"]])
        assert cursor.fetchone()[0] is None


def _earlier_holder(user_id: int, product_id: int, go, queue) -> None:
    """Buys once (its hold records its connection), then keeps that pooled connection, idle,
    until `go`; then says whether it is still alive."""
    from shop.services import place_order

    user = get_user_model().objects.get(pk=user_id)
    place_order(user=user, lines=[(product_id, 1)])
    queue.put(("bought", connection.connection.thread_id()))
    go.wait(60)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        queue.put(("alive", None))
    except OperationalError as exc:
        queue.put(("killed", exc.args[0]))


@pytest.mark.slow
def test_kill_mode_kills_only_the_stale_holder_that_blocks_the_row(settings, make_product, mysql8):
    """An earlier holder's pooled connection (its hold long over) and a session named by a forged
    record both live; the paused holder that blocks the row is the one killed, and buyers behind
    it wait at most their wait + 1 s."""
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True}
    assert stale_transactions.mode() == "kill"
    wait = float(django_settings.SHOP.get("LOCK_WAIT", 3.0))
    p, other = make_product(stock=100), make_product(stock=100)
    buyer = make_users(1, prefix="early")[0]
    connections.close_all()  # (after the last query: the child must not share our connection)
    go, earlier_q = FORK.Event(), FORK.Queue()
    earlier = FORK.Process(target=_earlier_holder, args=(buyer.pk, p.pk, go, earlier_q))
    earlier.start()
    assert earlier_q.get(timeout=30)[0] == "bought"

    # A bystander in a transaction of its own (another product's row), named by a forged record.
    db = connection.settings_dict
    bystander = MySQLdb.connect(host="127.0.0.1", port=int(db["PORT"] or 3306), user=db["USER"],
                                passwd=db["PASSWORD"], database=db["NAME"])
    bystander.autocommit(False)
    bystander.cursor().execute("SELECT id FROM shop_product WHERE id = %s FOR UPDATE", [other.pk])
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@hostname, @@port, UNIX_TIMESTAMP()")
        host, port, now = cursor.fetchone()
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        boot = int(now) - int(cursor.fetchone()[1])
    stale_transactions._client().lpush(stale_transactions._key(product_lock(p.pk)),
                                       f"1 {bystander.thread_id()} {host}:{port}:{boot} {'0' * 32}")

    combiner, others, queue = _run_behind_combiner(p, stage="before_commit", action="pause", buyers=1)
    try:
        late = run_processes(_timed_buy, [(u.pk, p.pk) for u in make_users(3, prefix="late")], timeout=60)
        assert [code for code, _, _ in late] == ["placed"] * 3, late
        slowest = max(seconds for _, _, seconds in late)
        assert slowest <= wait + 1.0, f"a buyer waited {slowest:.2f} s behind a paused holder"
        go.set()
        assert earlier_q.get(timeout=30) == ("alive", None), "an earlier holder's idle connection was killed"
        with bystander.cursor() as cursor:
            cursor.execute("SELECT 1")  # raises if it was killed
    finally:
        bystander.close()
        if combiner.is_alive():
            os.kill(combiner.pid, signal.SIGCONT)
        combiner.join(20)
        for proc in [earlier, *others]:
            proc.join(10)
    kind, _ = queue.get(timeout=20)
    assert kind in {"placed", "database_unavailable", "lock_timeout"}, kind


def _holder_then_other_work(user_id: int, product_id: int, committed, sick, go, queue) -> None:
    """Buys once, but Redis refuses writes just after its COMMIT, so its holder record outlives
    the hold; then its pooled connection runs an unrelated transaction on the product's row (an
    operator renaming it) until `go`, and says whether that transaction committed."""
    from shop.services import place_order

    def hook(stage: str, holds: dict) -> None:
        if stage == "after_commit" and hooks.checkout_hook is not None:
            hooks.checkout_hook = None
            committed.set()
            sick.wait(30)

    hooks.checkout_hook = hook
    user = get_user_model().objects.get(pk=user_id)
    place_order(user=user, lines=[(product_id, 1)])
    try:
        with transaction.atomic():
            Product.objects.filter(pk=product_id).update(name="renamed by an operator")
            queue.put(("working", connection.connection.thread_id()))
            go.wait(60)
            Product.objects.filter(pk=product_id).update(name="renamed by an operator, twice")
        queue.put(("committed", None))
    except (OperationalError, InterfaceError) as exc:
        queue.put(("killed", exc.args[0] if exc.args else None))


def _later_buyer(user_id: int, product_id: int, queue) -> None:
    queue.put(_timed_buy(user_id, product_id))
    connections.close_all()


def _waits_for_the_row(database: str, other_than: int) -> bool:
    """Whether a connection (not `other_than`) runs the writer's locking read of the product rows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE db = %s AND id <> %s "
                       "AND info LIKE %s", [database, other_than, "SELECT%FROM `shop_product`%FOR UPDATE"])
        return cursor.fetchone()[0] > 0


@pytest.mark.slow
def test_a_record_that_outlived_its_hold_never_kills_the_connections_next_transaction(settings, make_product, mysql8,
                                                                                      redis_server):
    """Its removal is best effort (Redis may refuse it): a record whose hold ended names a pooled
    connection that now works for someone else. That work, even when it blocks a buyer's row, is
    waited for, never killed."""
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True, "LOCK_WAIT": 8.0}
    settings.CACHES = {**settings.CACHES, "default": redis_cache(redis_server.url)}  # records, markers: a sick Redis
    assert stale_transactions.mode() == "kill"
    p = make_product(stock=100)
    earlier_buyer, buyer = make_users(1, prefix="earlier")[0], make_users(1, prefix="later")[0]
    database = connection.settings_dict["NAME"]
    connections.close_all()
    committed, sick, go, queue, told = FORK.Event(), FORK.Event(), FORK.Event(), FORK.Queue(), FORK.Queue()
    earlier = FORK.Process(target=_holder_then_other_work, args=(earlier_buyer.pk, p.pk, committed, sick, go, queue))
    earlier.start()
    later = None
    try:
        assert committed.wait(30), "the earlier buyer never committed"
        redis_server.client().config_set("min-replicas-to-write", 1)  # writes refused: NOREPLICAS
        sick.set()
        kind, earlier_connection = queue.get(timeout=30)
        assert kind == "working"
        redis_server.client().config_set("min-replicas-to-write", 0)
        records = _holder_records(p)
        assert any(entry.split()[1] == str(earlier_connection) for entry in records), records  # left behind

        later = FORK.Process(target=_later_buyer, args=(buyer.pk, p.pk, told))
        later.start()
        deadline = time.monotonic() + 20
        while not _waits_for_the_row(database, earlier_connection):
            assert time.monotonic() < deadline, "the later buyer never reached the product's row"
            time.sleep(0.01)
        # Its row wait (1 s in kill mode) runs out and its next attempt is watched; the operator's
        # transaction goes on meanwhile, then commits.
        time.sleep(2.5)
        go.set()
        assert queue.get(timeout=30) == ("committed", None), "the connection's next transaction was killed"
        code, _, seconds = told.get(timeout=30)
        assert code == "placed" and seconds >= 2.5, (code, seconds)
    finally:
        go.set()
        earlier.join(20)
        if later is not None:
            later.join(20)
    p.refresh_from_db()
    assert p.name == "renamed by an operator, twice" and p.stock == 98


def test_only_records_of_older_holders_on_this_server_are_suspects():
    class Hold:
        name, fence = "product:suspects", 100

    key = stale_transactions._key(Hold.name)
    client = stale_transactions._client()
    client.delete(key)
    here = "db1:3306:1700000000"
    client.rpush(key, "90 11 db1:3306:1700000001 t11",  # older, this server (boot time read a second apart)
                 "95 12 db1:3306:1690000000 t12",  # older, but the server restarted since: ids start again
                 "99 13 db2:3306:1700000000 t13",  # older, another server
                 "120 14 db1:3306:1700000000 t14",  # newer than our hold
                 "98 15",  # an old-style record without a server
                 "97 16 db1:3306:1700000000",  # an old-style record without a hold lock: cannot be checked
                 "80 77 db1:3306:1700000000 t77")  # ourselves
    try:
        found = stale_transactions.candidates({Hold.name: Hold}, own=77, server=here)
    finally:
        client.delete(key)
    assert set(found) == {11}
    assert found[11].token == "t11"
