"""What the Sentinel and Cluster backend tests share: switching both Redis aliases to a URL, and
the failover scenario "two holders after a failover never both write".

Losing the lock write on failover, deterministically. Replication on localhost is so fast that
"kill the master right after the acquire" almost never loses the write, and a replica that is
paused (SIGSTOP, DEBUG SLEEP) still finds the write in its socket buffer when it wakes. So the
test cuts replication at the master first: the master's default user loses PSYNC/SYNC (ACL) and
its replica links are killed (CLIENT KILL TYPE replica). The replica keeps retrying and is
refused, so whatever the master accepts from then on exists on the master only, which the test
checks on the replica before it kills the master. The replica stays a healthy candidate for
promotion (its link has been down for milliseconds, far below the limits of Sentinel and of
cluster-replica-validity-factor).
"""

from __future__ import annotations

import contextlib
import faulthandler
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from loadtest.servers.base import wait_for
from locks import Lock, LockUnavailable, redis_urls
from locks.backends import get_backend
from tests.locks.conftest import FORK


def use_redis_url(settings, url: str, **locks):
    """CACHES "locks" and "default" (sold-out markers, rate limits) on `url`, configured exactly as
    config/settings/redis_locks.py configures LOCKS_REDIS_URL/REDIS_URL; LOCKS BACKEND stays "redis"."""
    cache = redis_urls.cache_config(url, setting="LOCKS_REDIS_URL", socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
                                    pool_kwargs={"max_connections": 200, "health_check_interval": 30})
    settings.CACHES = {**settings.CACHES, "locks": cache, "default": cache}
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "redis", **locks}
    backend = get_backend()
    assert backend.name == "redis" and backend.supports_combining
    return backend


def cut_replication(master) -> None:
    """From now on, writes to `master` reach no replica (see the module docstring)."""
    master.execute_command("ACL", "SETUSER", "default", "-psync", "-sync")
    master.execute_command("CLIENT", "KILL", "TYPE", "replica")
    wait_for(lambda: master.info("replication")["connected_slaves"] == 0, timeout=5, what="replica links cut")


# One failed try while the master is dead: a few socket timeouts (0.5 s) at most, because the
# Sentinel and Cluster configs retry at once and only once or twice (locks/redis_urls.py), not
# redis-py's default 10 tries with backoff (~7 s). A liveness bound with slack, not a timing.
SLOWEST_TRY = 3.0


def acquire_after_failover(lock: Lock, *, timeout: float = 20.0) -> tuple[bool, float]:
    """Try `lock` (non-blocking) every 20 ms while the failover runs; (acquired, seconds).

    LockUnavailable (the master is dead, or not yet replaced) means "try again"; the first answer
    that is not an error ends the loop, whether the lock was free (True) or held (False). Each
    failed try must fail fast (SLOWEST_TRY)."""
    started = time.monotonic()
    while True:
        tried = time.monotonic()
        try:
            return lock.acquire(blocking=False), time.monotonic() - started
        except LockUnavailable:
            assert time.monotonic() - tried < SLOWEST_TRY, "a try on a dead master hung (retries with backoff?)"
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.02)


def acquire_replicated(lock: Lock, *, tries: int = 5) -> bool:
    """`lock.acquire(blocking=False)` with WAIT_REPLICAS, tried again while the replica is slower to
    acknowledge than WAIT_REPLICAS_TIMEOUT (0.25 s, under the 0.5 s socket timeout): a replica of
    a machine loaded by three test workers once took longer. The lock is given back each time it
    was refused (that is the contract), so a try again starts clean."""
    for attempt in range(tries):
        try:
            return lock.acquire(blocking=False)
        except LockUnavailable as exc:
            if "replicas" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def _stale_holder(name: str, product_id: int, go, queue) -> None:
    """Process A: take the lock, report its fence, and on `go` write the product row with it."""
    from locks.exceptions import LockError
    from shop.plumbing.locking import StaleFence
    from shop.plumbing.transactions import durable_transaction
    from shop.services.inventory import return_stock

    # CI once saw this child never report "held" within 30 s, not reproduced since (issue 39's
    # closing note): should it hang again, its stacks go to the captured stderr before it exits.
    faulthandler.dump_traceback_later(25, exit=True)
    lock = Lock(name, ttl=30.0)
    assert lock.acquire(blocking=False)
    faulthandler.cancel_dump_traceback_later()
    queue.put(("held", lock.held.fence, lock.held.token))
    go.wait(60)
    try:
        with durable_transaction():
            return_stock(product_id=product_id, quantity=7, hold=lock.held, reason="admin", actor="A")
        queue.put(("wrote", None, None))
    except StaleFence:
        queue.put(("refused", None, None))
    with contextlib.suppress(LockError):
        lock.release()


@dataclass
class FailoverOutcome:
    stale_fence: int
    new_fence: int
    seconds: float  # kill -> the lock acquirable again


def two_holders_after_a_failover(name: str, *, before_acquire: Callable[[], None],
                                 lock_key_on_replica: Callable[[], bool],
                                 kill_master: Callable[[], object]) -> FailoverOutcome:
    """A holds `name` on a master whose write never reached the replica; the master dies; after
    the promotion B gets the same lock (a second holder), writes the product row fenced; A's
    late fenced write of the same row is refused. Runs in a django_db(transaction=True) test."""
    from decimal import Decimal

    from shop.models import Product, StockLedger
    from shop.plumbing.transactions import durable_transaction
    from shop.services.inventory import return_stock

    product = Product.objects.create(sku=f"HA-{time.monotonic_ns()}", name="Failover", price=Decimal("1.00"), stock=10)
    before_acquire()
    connections.close_all()
    go, queue = FORK.Event(), FORK.Queue()
    a = FORK.Process(target=_stale_holder, args=(name, product.pk, go, queue))
    a.start()
    try:
        state, stale_fence, _token = queue.get(timeout=30)
        assert state == "held"
        assert not lock_key_on_replica(), "the replica has the lock: the scenario needs it lost"
        kill_master()
        b = Lock(name, ttl=30.0)
        acquired, seconds = acquire_after_failover(b)
        assert acquired, "the promoted replica did not lose the lock: no second holder"
        new_fence = b.held.fence
        assert new_fence > stale_fence  # fences from the new master's clock (us): still increasing
        with durable_transaction():
            return_stock(product_id=product.pk, quantity=5, hold=b.held, reason="admin", actor="B")
        go.set()  # A, which still believes it holds the lock, writes now
        assert queue.get(timeout=30)[0] == "refused", "the stale holder's fenced write was accepted"
        b.release()
    finally:
        go.set()
        a.join(30)
    product.refresh_from_db()
    assert (product.stock, product.fence) == (15, new_fence)  # B's write only
    assert list(StockLedger.objects.filter(product=product).values_list("actor", "fence")) == [("B", new_fence)]
    return FailoverOutcome(stale_fence=stale_fence, new_fence=new_fence, seconds=seconds)
