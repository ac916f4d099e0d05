"""The built-in Redis lock on Redis Cluster (3 masters + 3 replicas, private ports)."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from loadtest.servers.cluster import RedisClusterSet
from locks import Lock, LockTimeout, LockUnavailable, inspect, stats
from locks.keys import LockKeys
from locks.scripts import script
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.backends.ha import (
    acquire_after_failover,
    acquire_replicated,
    cut_replication,
    two_holders_after_a_failover,
    use_redis_url,
)
from tests.locks.conftest import FORK


@pytest.fixture(scope="session")
def redis_cluster():
    """This module's cluster, for the whole session: pytest-django runs a module's database,
    transactional and other tests apart (Django's order), and a module-scoped cluster was
    started again for each of the three (~2 s each)."""
    with RedisClusterSet() as servers:
        yield servers


@pytest.fixture
def backend(settings, redis_cluster):
    return use_redis_url(settings, redis_cluster.url)


@pytest.fixture
def own_cluster():
    """A cluster of its own for a test that kills a master (the module's cluster stays whole)."""
    with RedisClusterSet() as servers:
        yield servers


def _replicas_of(servers: RedisClusterSet, port: int) -> list:
    return [n for n in servers.nodes if n.running and n.client().info("replication").get("master_port") == port]


def _on_replicas(servers: RedisClusterSet, key: str) -> bool:
    """Does a replica of the key's master have the key? (READONLY: a replica answers, no MOVED.)"""
    port = servers.owner_port(servers.slot_of(key))
    found = []
    for node in _replicas_of(servers, port):
        client = node.client(single_connection_client=True)
        client.execute_command("READONLY")
        found.append(bool(client.exists(key)))
    assert found, "the master has no replica"
    return any(found)


def test_each_lock_lives_on_the_master_of_its_slot(backend, redis_cluster, name):
    key = LockKeys.for_name(name).lock
    with Lock(name, ttl=5.0) as held:
        master = next(n for n in redis_cluster.nodes if n.port == redis_cluster.owner_port(redis_cluster.slot_of(key)))
        assert master.client().hget(key, "token").decode() == held.token
        # Every key a script of this lock touches is in that one slot (the {name} hash tag).
        keys = LockKeys.for_name(name)
        slots = {redis_cluster.slot_of(k) for k in (*keys.all(), keys.signal(held.token))}
        assert slots == {redis_cluster.slot_of(key)}


def test_stats_events_and_held_index_flush_across_slots(backend, redis_cluster, name):
    """The recorder's flush pipeline and the event log touch keys of many slots (families, the
    held index, the event list): a cluster pipeline splits them per node; nothing is lost."""
    other = f"{name}-other"
    for n in (name, other):
        with Lock(n, ttl=5.0):
            pass
    assert Lock(name, ttl=5.0).acquire(blocking=False)
    assert not Lock(name, ttl=5.0, wait=0.05).acquire()  # a timeout: counted and logged
    stats.flush()
    assert {s.name for s in inspect.lock_stats(prefix=name)} >= {name, other}
    assert inspect.stats_for(name).counters["timeouts"] == 1
    assert any(e["name"] == name and e["kind"] == "timeout" for e in inspect.recent_events(limit=50))
    _, page = inspect.held_index_page(prefix=name)
    assert [h.name for h in page] == [name]
    inspect.force_release(name)


@pytest.mark.django_db(transaction=True)
def test_two_holders_after_a_failover_never_both_write(settings, own_cluster, name):
    servers = own_cluster
    use_redis_url(settings, servers.url)
    key = LockKeys.for_name(name).lock

    def cut() -> None:
        master = next(n for n in servers.nodes if n.port == servers.owner_port(servers.slot_of(key)))
        cut_replication(master.client())

    # Meanwhile a lock on a surviving master is taken again and again: during the failover the
    # whole cluster answers CLUSTERDOWN for a moment, which must reach callers as LockUnavailable.
    killed = servers.owner_port(servers.slot_of(key))
    other = next(n for n in (f"{name}-{i}" for i in range(100))
                 if servers.owner_port(servers.slot_of(LockKeys.for_name(n).lock)) != killed)
    errors: collections.Counter = collections.Counter()
    done = threading.Event()

    def hammer() -> None:
        while not done.is_set():
            try:
                with Lock(other, ttl=1.0):
                    errors["ok"] += 1
            except LockUnavailable:  # a release that failed leaves the lock to its 1 s lease
                errors["unavailable"] += 1
            except LockTimeout:
                errors["timeout"] += 1
            except Exception as exc:
                errors[type(exc).__name__] += 1
            time.sleep(0.005)

    thread = threading.Thread(target=hammer, daemon=True)

    def kill_master() -> None:
        # Started here, after the stale holder is forked: a fork while this thread is inside the
        # cluster client can leave the child a lock held forever (it hung, the test failed after 60 s).
        thread.start()
        servers.kill_master_of(key)

    try:
        outcome = two_holders_after_a_failover(
            name, before_acquire=cut, lock_key_on_replica=lambda: _on_replicas(servers, key),
            kill_master=kill_master,
        )
    finally:
        done.set()
        if thread.ident is not None:
            thread.join(10)
    assert set(errors) <= {"ok", "unavailable", "timeout"}, errors
    assert errors["ok"] > 0
    assert outcome.seconds < 15.0
    print(f"\ncluster failover: kill -> lock acquirable again {outcome.seconds:.2f} s")


def test_combining_serves_the_queued_requests_on_the_cluster(backend, name):
    """locks/combining.py's take and reply (a script and a pipeline on the lock's slot), and the
    waiters' BLPOP on that slot's master."""
    from tests.locks.test_combining import test_the_holder_takes_the_queued_requests_in_order_and_answers_each

    test_the_holder_takes_the_queued_requests_in_order_and_answers_each(name)


def test_guards_are_refused_on_the_cluster(backend, name):
    """Guard keys live in other slots than the lock's: one script cannot read them."""
    from locks.combining import submit

    lock = Lock(name, wait=1.0)
    assert lock.supports_combining and not lock.supports_guards
    with pytest.raises(ValueError, match="not on a cluster"):
        submit(lock, "request", guards=["shop:x:soldout:{1}"])
    assert not lock.locked()


def test_the_default_cache_and_rate_limits_work_on_the_cluster(backend, name, rf):
    """The "default" alias on the cluster too: keys of many slots in one get_many (MGET per slot),
    django-ratelimit's counter (one key: add + INCR), the sold-out markers' lookup (one MGET of
    markers of several products and an idempotency record, split per slot)."""
    from django.core.cache import caches
    from django_ratelimit.core import get_usage

    from shop.plumbing import soldout

    cache = caches["default"]
    values = {f"{name}:{i}": i for i in range(20)}
    cache.set_many(values, timeout=30)
    assert cache.get_many([*values, f"{name}:missing"]) == values
    cache.delete_many(list(values))
    request = rf.post("/api/checkout", REMOTE_ADDR="10.9.8.7")
    counts = [get_usage(request, group=name, key="ip", rate="5/h", increment=True)["count"] for _ in range(6)]
    assert counts == [1, 2, 3, 4, 5, 6]
    assert get_usage(request, group=name, key="ip", rate="5/h")["should_limit"]
    products = [10**9 + i for i in range(1, 6)]  # ids no test product has: markers of their own
    assert soldout.mark(products[1], fence=5)
    try:
        assert soldout.markers_and_record(products, record_key=f"{name}:record").marked == {products[1]}
    finally:
        soldout.refilled([products[1]], fence=None)


def test_wait_replicas_waits_on_the_master_of_the_locks_slot(settings, redis_cluster, name):
    """WAIT counts the writes of its own connection, so it must run on the lock's master, on the
    connection of the acquire (a cluster pipeline would send the keyless WAIT to any node), and
    after a hand-off on the waiter's BLPOP connection (same master)."""
    use_redis_url(settings, redis_cluster.url, WAIT_REPLICAS=1, WAIT_REPLICAS_TIMEOUT=0.25)
    key = LockKeys.for_name(name).lock
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_briefly, args=(name, ready))
    holder.start()
    try:
        assert ready.wait(30)
        with Lock(name, ttl=5.0, wait=10.0) as held:  # handed over by the holder's release
            assert held.waited > 0
            assert _on_replicas(redis_cluster, key)
    finally:
        holder.join(10)
    assert holder.exitcode == 0
    with Lock(name, ttl=5.0) as held:  # a direct acquire: script and WAIT in one master's pipeline
        assert _on_replicas(redis_cluster, key)


def _hold_briefly(name: str, ready) -> None:
    with Lock(name, ttl=10.0):
        ready.set()
        time.sleep(0.3)


def test_with_wait_replicas_the_promoted_replica_keeps_the_lock(settings, own_cluster, name):
    """The cluster twin of the Sentinel test: the lock acquired with WAIT survives its master's
    SIGKILL; B, asking through the same (stale) slot map, is told it is held, not given it."""
    # No stats flush meanwhile: its cluster pipeline would refresh the slot map for the lock.
    use_redis_url(settings, own_cluster.url, WAIT_REPLICAS=1, WAIT_REPLICAS_TIMEOUT=0.25, STATS_FLUSH_INTERVAL=3600)
    a = Lock(name, ttl=30.0)
    assert acquire_replicated(a)
    fence = a.held.fence
    assert _on_replicas(own_cluster, LockKeys.for_name(name).lock), "granted before a replica had it"
    own_cluster.kill_master_of(LockKeys.for_name(name).lock)
    # A new master has none of our scripts: A's first EVALSHA met NOSCRIPT, and the WAIT
    # pipelined behind it once ran before the write, so about half the runs lost A's lock with
    # the master (see test_sentinel's test_wait_replicas_counts_the_acquire_even_when_...).
    acquired, seconds = acquire_after_failover(Lock(name, ttl=5.0))
    assert acquired is False, "a second holder after the failover despite WAIT_REPLICAS"
    assert inspect.lock_info(name).fence == fence
    a.held.check()
    a.release()
    assert seconds < 15.0


def test_scripts_missing_on_a_master_are_loaded_again(backend, redis_cluster, name):
    """A promoted replica has none of the scripts (SCRIPT LOAD is not replicated): EVALSHA gets
    NOSCRIPT and redis-py's Script loads it on the primaries, then retries. Forced here by
    flushing every node's script cache."""
    for node in redis_cluster.nodes:
        node.client().script_flush()
    with Lock(name, ttl=5.0) as held:
        assert held.fence > 0
    master = next(n for n in redis_cluster.nodes
                  if n.port == redis_cluster.owner_port(redis_cluster.slot_of(LockKeys.for_name(name).lock)))
    assert master.client().script_exists(script("acquire").sha) == [True]
