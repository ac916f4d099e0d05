"""ZooKeeper with digest auth (LOCKS["ZOOKEEPER_AUTH"]): lock nodes are created with an
ACL for that user only, so a client without the credentials can neither read, take, delete nor
forge them; a root created open before auth was turned on is closed by the first process."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from locks import Lock, LockUnavailable, inspect
from locks.backends import get_backend
from tests.locks.backends.contract import (  # noqa: F401 - the contract's basics, under auth
    test_contract_a_waiter_is_woken_by_the_release,
    test_contract_acquire_release_and_a_second_holder_is_refused,
    test_contract_describe_held_and_force_release,
)

AUTH = "shop:" + "-".join(("zk", "s3cret"))


def _use(settings, zookeeper, root: str, auth: str | None = AUTH):
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "zookeeper", "ZOOKEEPER_HOSTS": zookeeper.hosts,
                      "ZOOKEEPER_SESSION_TIMEOUT": 2.0, "ZOOKEEPER_ROOT": root, "ZOOKEEPER_AUTH": auth}
    return get_backend()


@pytest.fixture
def backend(settings, zookeeper):
    return _use(settings, zookeeper, "/locks-auth")


@pytest.fixture
def stranger(zookeeper):
    """Clients without our credentials: one with none, one with another password."""
    clients = [KazooClient(hosts=zookeeper.hosts),
               KazooClient(hosts=zookeeper.hosts, auth_data=[("digest", "shop:guessed")])]
    for client in clients:
        client.start(timeout=10)
    yield clients
    for client in clients:
        client.stop()
        client.close()


def test_a_client_without_the_credentials_cannot_touch_the_lock_nodes(backend, stranger, name):
    lock = Lock(name, ttl=30.0)
    lock.acquire()
    lock_dir = backend._dir(name)
    [holder] = backend._session().client.get_children(lock_dir)
    try:
        for client in stranger:
            attempts = {
                "list the root": lambda c=client: c.get_children(backend.root),
                "read the lock": lambda c=client: c.get(lock_dir),
                "forge its fence": lambda c=client: c.set(lock_dir, b"99999999999999999"),
                "delete the holder": lambda c=client: c.delete(f"{lock_dir}/{holder}"),
                "queue behind it": lambda c=client: c.create(f"{lock_dir}/x-", b"{}", ephemeral=True, sequence=True),
                "add a lock dir": lambda c=client: c.create(f"{backend.root}/forged", b""),
                "open the root": lambda c=client: c.set_acls(backend.root, OPEN_ACL_UNSAFE),
            }
            for what, attempt in attempts.items():
                with pytest.raises(NoAuthError):
                    attempt()
                    pytest.fail(f"a client without the credentials could {what}")
        # Nothing moved: we still hold it, with the fence we were given.
        lock.held.check()
        assert inspect.lock_info(name).fence == lock.held.fence
    finally:
        lock.release()
    assert Lock(name, ttl=5.0).acquire(blocking=False)


def test_every_node_carries_the_digest_acl_of_the_configured_user(backend, name):
    from kazoo.security import make_digest_acl

    user, _, password = AUTH.partition(":")
    expected = [make_digest_acl(user, password, all=True)]
    client = backend._session().client
    with Lock(name, ttl=10.0):
        lock_dir = backend._dir(name)
        [holder] = client.get_children(lock_dir)
        for path in (backend.root, lock_dir, f"{lock_dir}/{holder}", f"{backend.root}/.clock"):
            assert client.get_acls(path)[0] == expected, path


def test_a_root_created_open_is_closed_when_auth_is_turned_on(settings, zookeeper, stranger, name):
    root = f"/locks-open-{time.monotonic_ns()}"
    anyone = stranger[0]
    anyone.create(f"{root}/old-dir", b"", makepath=True)  # the root and a lock dir, world-writable
    backend = _use(settings, zookeeper, root)
    with Lock(name, ttl=10.0):
        pass
    for path in (root, f"{root}/old-dir"):
        with pytest.raises(NoAuthError):
            anyone.set_acls(path, OPEN_ACL_UNSAFE)
    with pytest.raises(NoAuthError):
        anyone.create(f"{root}/forged", b"")
    assert backend.root == root


def test_a_backend_without_the_credentials_is_refused_at_once_with_a_clear_error(settings, zookeeper, backend, name):
    with Lock(name, ttl=5.0):
        pass  # the root now belongs to the configured user
    for wrong in (None, "shop:guessed"):
        _use(settings, zookeeper, backend.root, auth=wrong)
        started = time.monotonic()
        with pytest.raises(LockUnavailable) as err:
            Lock(name, ttl=5.0, wait=10.0).acquire()
        assert time.monotonic() - started < 2.0  # not a ride-out of a "connection problem"
        assert "LOCKS_ZOOKEEPER_AUTH" in str(err.value) and "guessed" not in str(err.value)
