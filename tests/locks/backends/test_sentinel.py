"""The built-in Redis lock on Redis Sentinel (master + replica + 3 sentinels, private ports)."""

from __future__ import annotations

import pytest

from loadtest.servers.base import wait_for
from loadtest.servers.sentinel import SentinelSet
from locks import Lock, LockUnavailable, inspect
from locks.keys import LockKeys
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here
from tests.locks.backends.ha import (
    acquire_after_failover,
    acquire_replicated,
    cut_replication,
    two_holders_after_a_failover,
    use_redis_url,
)


@pytest.fixture(scope="session")
def sentinel_set():
    """This module's set, for the whole session: pytest-django runs a module's database,
    transactional and other tests apart (Django's order), and a module-scoped set was started
    again for each of the three (~2 s each)."""
    with SentinelSet() as servers:
        yield servers


@pytest.fixture
def backend(settings, sentinel_set):
    return use_redis_url(settings, sentinel_set.url)


@pytest.fixture
def own_sentinel_set():
    """A set of its own for a test that kills the master (the module's set stays whole)."""
    with SentinelSet() as servers:
        yield servers


def test_the_lock_lives_on_the_master_the_sentinels_name(backend, sentinel_set, name):
    with Lock(name, ttl=5.0) as held:
        key = LockKeys.for_name(name).lock
        assert sentinel_set.current_master().client().hget(key, "token").decode() == held.token


@pytest.mark.django_db(transaction=True)
def test_two_holders_after_a_failover_never_both_write(settings, own_sentinel_set, name):
    servers = own_sentinel_set
    use_redis_url(settings, servers.url)
    key = LockKeys.for_name(name).lock
    outcome = two_holders_after_a_failover(
        name,
        before_acquire=lambda: cut_replication(servers.current_master().client()),
        lock_key_on_replica=lambda: bool(servers.replicas[0].client().exists(key)),
        kill_master=servers.kill_master,
    )
    # The lock was acquirable again once the sentinels had promoted the replica (~2.3 s with
    # down-after 1000 ms); a generous liveness bound, not a timing assertion.
    assert outcome.seconds < 15.0
    print(f"\nsentinel failover: kill -> lock acquirable again {outcome.seconds:.2f} s")


def test_wait_replicas_counts_the_acquire_even_when_the_script_had_to_be_loaded(settings, sentinel_set, name):
    """A master without our scripts (new, restarted, or a just-promoted replica: SCRIPT LOAD is
    not replicated) answers the pipelined EVALSHA with NOSCRIPT and runs the WAIT behind it at
    once, before any write. The script is loaded and sent again; its WAIT must be sent again after
    it, or a lock nobody has replicated is granted. Seen as a flaky cluster failover test: the
    killed master's replica had never had the lock. Here the replica is frozen (connected, so it
    still counts for offsets it acknowledged before) to make the loss certain."""
    use_redis_url(settings, sentinel_set.url, WAIT_REPLICAS=1, WAIT_REPLICAS_TIMEOUT=0.25, STATS_FLUSH_INTERVAL=3600)
    master = sentinel_set.current_master()
    replica = next(r for r in sentinel_set.redis if r is not master)
    # WAIT counts the replicas that acknowledged the connection's last write. So the pool's
    # connection writes (a first lock) and the replica acknowledges it before it freezes: then a
    # WAIT sent before the acquire's write is satisfied, one sent after it is not.
    with Lock(f"{name}-first", ttl=5.0):
        pass
    client = master.client()
    client.script_flush()
    offset = client.info("replication")["master_repl_offset"]
    wait_for(lambda: client.info("replication")["slave0"]["offset"] >= offset, timeout=10, what="replica acked")
    replica.freeze()
    try:
        with pytest.raises(LockUnavailable, match="replicas acknowledged"):
            Lock(name, ttl=5.0).acquire(blocking=False)
    finally:
        replica.resume()
    assert not Lock(name).locked(), "the unreplicated lock was not given back"
    with Lock(name, ttl=5.0) as held:  # the replica is back: granted, and on the replica
        assert held.fence > 0
        wait_for(lambda: bool(replica.client().exists(LockKeys.for_name(name).lock)), timeout=5, what="replicated")


def test_with_wait_replicas_the_promoted_replica_keeps_the_lock(settings, own_sentinel_set, name):
    """WAIT_REPLICAS=1: an acquire returns only once a replica has the lock, so the failover keeps
    it: B finds it held (and waits) instead of becoming a second holder; A still holds it."""
    servers = own_sentinel_set
    use_redis_url(settings, servers.url, WAIT_REPLICAS=1, WAIT_REPLICAS_TIMEOUT=0.25)
    a = Lock(name, ttl=30.0)
    assert acquire_replicated(a)
    fence = a.held.fence
    old = servers.kill_master()  # at once: no time for replication other than what WAIT waited for
    acquired, seconds = acquire_after_failover(Lock(name, ttl=5.0))
    assert servers.current_master() is not old
    assert acquired is False, "a second holder after the failover despite WAIT_REPLICAS"
    assert inspect.lock_info(name).fence == fence
    a.held.check()  # A's hold is intact on the new master
    a.release()
    assert seconds < 15.0
    # The price: the new master has no replica left (the old master is dead), so until one comes
    # back every acquire is refused, and given back at once, rather than granted unreplicated.
    with pytest.raises(LockUnavailable, match="replicas"):
        Lock(name, ttl=5.0).acquire(blocking=False)
    assert not Lock(name).locked()
    settings.LOCKS = {**settings.LOCKS, "WAIT_REPLICAS": 0}
    with Lock(name, ttl=5.0) as b:
        assert b.fence > fence
