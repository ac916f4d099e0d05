"""The ZooKeeper backend (kazoo): a FIFO queue of ephemeral sequential nodes per lock name.

Layout under LOCKS["ZOOKEEPER_ROOT"] (default /locks):

    /locks/<escaped KEY_PREFIX + name>          data: the last fence issued for the name
    /locks/<escaped ...>/<token>-0000000042     one per holder or waiter (ephemeral, sequential)
    /locks/.clock                               a scratch node: written to learn the server's time

The lowest sequence number holds the lock; every other node waits for its predecessor's
deletion only (a watch, no herd, no polling). A crashed or frozen holder's node disappears when
its session expires. A holder that is alive but overruns its lease is cut off by its successor:
the holder keeps `lease` (ms) in its node's data, and the node's mtime (set by the server on
every write) is when that lease began, so lease end = mtime + lease on the *server's* clock.
The successor waits until then and deletes the stale node (with its version: an extend that
came first wins); the stale holder's check/extend/release then find their node gone.

Server time. Every write we make returns a Stat whose ctime/mtime is the server's clock (ms) at
that moment, which lies between our send and our reply. So each write is a clock sample: the
server clock at a local monotonic time t is within [t + lo, t + hi] (see `_Clock`). We use the
writes an acquire makes anyway, plus a write to a scratch node when a process has no recent
sample (an inspection process): no extra round trip on the hot path, and the error is one
round trip, never a guess about clock skew between machines.

Fences: the new holder, once it is the head, sets the lock node's data to
max(stored + 1, server now in µs) by compare-and-set (set_data with the version it read, retry
on BadVersion). Holders are serialized (a node is the head only once its predecessor is gone,
which is after that predecessor's fence write), so each fence exceeds the last one. The lock
node is deleted (cleanup) only when it has had no children and no fence write for IDLE_DELETE
seconds of server time; the next fence is then max(1, now_us), and now_us is more than
IDLE_DELETE later than the lost value (which exceeds its own write time by at most the number of
fences issued in the same ms): still strictly increasing.

Cleanup: a process remembers the lock nodes it emptied (release, a waiter leaving) and, at most
every SWEEP_EVERY seconds during an acquire, deletes those that have stayed empty and unfenced
for IDLE_DELETE; `held()` (the dashboard) deletes any such node it reads, which covers the
nodes of processes that exited first. Nodes we could not delete because ZooKeeper was away are
deleted once it is back.

Auth (LOCKS["ZOOKEEPER_AUTH"] = "user:password", env LOCKS_ZOOKEEPER_AUTH): every session
authenticates with ZooKeeper's digest scheme, and every node we create (the root, the lock dirs,
the holders' nodes, .clock) carries one ACL: that user may do everything, nobody else anything.
Once per session the root is checked: created with that ACL if missing; if it was created open
(before auth was turned on) it and its lock dirs get the ACL. The `.clock` child keeps the root
from ever being empty, so nobody can delete it (which `/` would allow) and create it open again.
A client without the credentials (or with others) is refused every read and write (NoAuth);
our own refusal is a LockUnavailable that says so, at once (no waiting for a connection).

Sessions: one KazooClient per process (a forked child starts its own). A call waits for a
connection and a reply for at most a session timeout, then LockUnavailable. A holder that has
been disconnected for a whole session timeout treats its lock as lost (the server has, or will
have, expired the session): check raises LockLost, release LockNotOwned.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_digest_acl

from locks.backends.base import Grant, HeldLock, LockBackend, Released
from locks.conf import locks_settings
from locks.exceptions import HolderChanged, LockUnavailable
from locks.hold import Cancelled

if TYPE_CHECKING:
    from kazoo.protocol.states import ZnodeStat

    from locks.hold import CancelToken, LockLike

_DOWN = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError, KazooTimeoutError)
# What the callers handle: a node that is gone, or changed, or there, or not empty.
_EXPECTED = (NoNodeError, BadVersionError, NodeExistsError, NotEmptyError)
# An empty lock node is deleted once it has been idle this long (server time): names used once
# (idempotency keys) do not pile up, and the fence it kept is far below any later clock reading.
IDLE_DELETE = 60.0
# How often (at most) a process looks at the lock nodes it emptied.
SWEEP_EVERY = 10.0
# How long a holder's check/extend/release waits for a dropped connection to come back (the
# reconnect after a freeze takes milliseconds; a server restart about a second).
HOLDER_RIDE_OUT = 1.0
# How long a connection attempt waits for the server's handshake (see _short_connect).
CONNECT_TIMEOUT = 1.0
# A waiter checks a cancel request this often (asyncio cancellation).
CANCEL_CHECK = 0.1


_T = TypeVar("_T")


class _Down(Exception):
    """ZooKeeper did not answer in time (turned into LockUnavailable with the lock's name)."""


class _Refused(_Down):
    """ZooKeeper answered NoAuth: waiting will not help (turned into LockUnavailable at once)."""


def digest_acl(auth: str | None) -> list[ACL] | None:
    """The ACL of every node we create with auth "user:password": all rights to that user only."""
    if not auth:
        return None
    user, sep, password = auth.partition(":")
    if not (user and sep and password):
        raise ValueError("LOCKS['ZOOKEEPER_AUTH'] must be user:password (the value is not shown)")
    return [make_digest_acl(user, password, all=True)]


def _escape(name: str) -> str:
    """One znode name per lock name: '/' and '.' escaped (no '..' or '.clock' collisions)."""
    return quote(name, safe="").replace(".", "%2E")


def _seq(node: str) -> int:
    return int(node.rsplit("-", 1)[1])


def _short_connect(hosts: str, session_timeout: float) -> str:
    """`hosts`, repeated so that kazoo waits at most CONNECT_TIMEOUT for a server's handshake.

    kazoo waits session_timeout / len(hosts) for it. ZooKeeper 3.8.0 (Debian's) accepts
    connections before it has loaded its database during a restart, and a connection that
    arrives in that window is never answered (a NullPointerException in the server's log). A
    client that hits it would sit out a whole session timeout and lose its session; with the
    list repeated it tries again after CONNECT_TIMEOUT.
    """
    listed = [h.strip() for h in hosts.split(",") if h.strip()]
    repeat = max(1, math.ceil(session_timeout / (len(listed) * CONNECT_TIMEOUT)))
    return ",".join(listed * repeat)


class _Clock:
    """The server's clock as bounds around the local monotonic clock (both in ms)."""

    def __init__(self) -> None:
        self.lo = self.hi = 0.0
        self.at: float | None = None  # monotonic seconds of the last sample

    def sample(self, server_ms: int, sent: float, answered: float) -> None:
        # The server stamped server_ms (truncated to the ms) between `sent` and `answered`.
        self.lo, self.hi, self.at = server_ms - answered * 1000, server_ms + 1 - sent * 1000, answered

    def now_lo(self) -> float:
        """The server's time now is at least this (ms): use it to decide a lease is over."""
        return time.monotonic() * 1000 + self.lo

    def now_hi(self) -> float:
        """...and at most this: use it for how much of our own lease is left."""
        return time.monotonic() * 1000 + self.hi

    def local_when(self, server_ms: float) -> float:
        """The monotonic time by which the server's clock has surely reached server_ms."""
        return (server_ms - self.lo) / 1000


@dataclass
class _Node:
    """A node this process created for one acquire (by token)."""

    name: str
    path: str
    session: int
    version: int = 0
    lease_ms: int = 0
    end_ms: float = 0.0  # server ms when the lease ends (0: waiting)
    fence: int = 0
    payload: dict[str, Any] = field(default_factory=dict)  # our node's data once we hold the lock


class _Session:
    """This process's KazooClient (a forked child builds its own), and who to wake on a state change."""

    def __init__(self, hosts: str, timeout: float, on_connected: Callable[[KazooClient], None],
                 auth: str | None = None) -> None:
        self.on_connected = on_connected
        self.connected = threading.Event()
        self.suspended_since: float | None = time.monotonic()
        self.wakes: set[threading.Event] = set()
        self.root_guarded = False  # with auth: the root's ACL was checked (see the module doc)
        self.client = KazooClient(
            hosts=_short_connect(hosts, timeout), timeout=timeout,
            # Reconnect quickly and forever in the background: a restarted server is found again
            # within ~0.25 s, and a caller decides itself how long it waits (LockUnavailable).
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=0.25),
            # Sent again on every reconnection; nodes are created with default_acl.
            auth_data=[("digest", auth)] if auth else None, default_acl=digest_acl(auth),
        )
        self.client.add_listener(self._changed)
        self.client.start_async()

    def _changed(self, state: str) -> None:
        # kazoo's thread: must not block. Waiters look again (their watches may be gone).
        if state == KazooState.CONNECTED:
            self.suspended_since = None
            self.connected.set()
            self.on_connected(self.client)
        else:
            if self.suspended_since is None:
                self.suspended_since = time.monotonic()
            self.connected.clear()
        for wake in list(self.wakes):
            wake.set()

    @property
    def id(self) -> int | None:
        client_id = self.client.client_id if self.connected.is_set() else None
        return client_id[0] if client_id else None


class ZooKeeperBackend(LockBackend):
    name = "zookeeper"
    supports_combining = False

    def __init__(self, zookeeper_hosts: str = "127.0.0.1:2181", zookeeper_session_timeout: float = 4.0,
                 zookeeper_root: str = "/locks", zookeeper_auth: str | None = None) -> None:
        self.hosts = zookeeper_hosts
        self.auth = zookeeper_auth or None
        self.acl = digest_acl(self.auth)
        self.session_timeout = float(zookeeper_session_timeout)
        if not zookeeper_root.strip("/"):
            raise ValueError("LOCKS['ZOOKEEPER_ROOT'] must be a znode below /, e.g. /locks")
        self.root = "/" + zookeeper_root.strip("/")
        # How long one call may wait for a connection, then for its reply: a request unanswered
        # for a session timeout means the session is likely gone anyway.
        self.op_timeout = max(1.0, self.session_timeout)
        self.clock = _Clock()
        self._sessions: dict[int, _Session] = {}
        self._nodes: dict[str, _Node] = {}  # token -> node
        self._orphans: list[tuple[str, str]] = []  # (lock dir, token) whose node may linger
        self._emptied: dict[str, float] = {}  # lock dir -> monotonic time we emptied it
        # Nodes of holds we declared lost while disconnected: if the session survived after all,
        # they still exist, and would block the lock until their lease ends. Deleted on reconnect.
        self._given_up: set[str] = set()
        self._swept = time.monotonic()
        self._guard = threading.Lock()
        self._tidying = threading.Lock()

    # -- plumbing --------------------------------------------------------------------------
    def _session(self) -> _Session:
        pid = os.getpid()
        session = self._sessions.get(pid)
        if session is None:
            with self._guard:
                session = self._sessions.get(pid)
                if session is None:
                    if self._sessions:  # forked: the parent's nodes and clients are not ours
                        self._sessions, self._nodes, self._orphans, self._emptied = {}, {}, [], {}
                        self._given_up = set()
                    session = self._sessions[pid] = _Session(self.hosts, self.session_timeout, self._reconnected,
                                                             self.auth)
        return session

    def _dir(self, name: str, prefix: str | None = None) -> str:
        prefix = locks_settings.KEY_PREFIX if prefix is None else prefix
        return f"{self.root}/{_escape(prefix + name)}"

    def _call(self, method: str, *args: Any, budget: float | None = None, **kwargs: Any) -> Any:
        """One kazoo call, bounded: wait for a connection, then for the reply (_Down otherwise).

        A request is only queued while connected, so one we gave up on is not sent later by a
        reconnecting client (a create that arrived late would be a phantom waiter).
        """
        return self._run(lambda client: getattr(client, f"{method}_async")(*args, **kwargs), budget)

    def _run(self, send: Callable[[KazooClient], Any], budget: float | None = None) -> Any:
        session = self._session()
        if not session.connected.wait(self.op_timeout if budget is None else max(budget, 0.0)):
            raise _Down(f"not connected to ZooKeeper at {self.hosts}")
        if self.acl is not None and not session.root_guarded:
            self._guard_root(session)
        return self._answer(send(session.client))

    def _answer(self, pending: Any) -> Any:
        try:
            return pending.get(timeout=self.op_timeout)
        except _EXPECTED:
            raise
        except (NoAuthError, AuthFailedError) as exc:
            raise _Refused(f"ZooKeeper at {self.hosts} refused access under {self.root} ({type(exc).__name__}): "
                           "LOCKS_ZOOKEEPER_AUTH is missing or is not the user its lock nodes belong to") from exc
        except (*_DOWN, KazooException) as exc:  # never a raw driver error to the caller
            raise _Down(f"{type(exc).__name__} from ZooKeeper at {self.hosts}") from exc

    def _guard_root(self, session: _Session) -> None:
        """With auth, once per session: the root exists with our ACL, and never empty (module doc)."""
        client = session.client
        self._answer(client.ensure_path_async(self.root))  # created with default_acl if missing
        acl, _ = self._answer(client.get_acls_async(self.root))
        if list(acl) != self.acl:  # created open, before auth was turned on: close it and its dirs
            self._answer(client.set_acls_async(self.root, self.acl))
            for child in self._answer(client.get_children_async(self.root)):
                with contextlib.suppress(NoNodeError):
                    self._answer(client.set_acls_async(f"{self.root}/{child}", self.acl))
        with contextlib.suppress(NodeExistsError):
            self._answer(client.create_async(f"{self.root}/.clock", b""))
        session.root_guarded = True

    def _write(self, method: str, *args: Any, **kwargs: Any) -> ZnodeStat:
        """A write that returns a Stat: also a sample of the server's clock."""
        sent = time.monotonic()
        result = self._call(method, *args, **kwargs)
        stat = result[1] if method == "create" else result  # create: (path, stat)
        self.clock.sample(stat.ctime if method == "create" else stat.mtime, sent, time.monotonic())
        return result

    def _fresh_clock(self) -> _Clock:
        """A process that only inspects has no recent write: write the scratch node."""
        if self.clock.at is None or time.monotonic() - self.clock.at > 30.0:
            try:
                self._write("set", f"{self.root}/.clock", b"")
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._write("create", f"{self.root}/.clock", b"", makepath=True, include_data=True)
        return self.clock

    def _unavailable(self, name: str, exc: Exception) -> LockUnavailable:
        return LockUnavailable(str(exc) if isinstance(exc, _Refused) else f"ZooKeeper unreachable: {exc}", name=name)

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._call("get_children", path), key=_seq)
        except NoNodeError:
            return []

    def _head(self, path: str) -> tuple[str, dict[str, Any], ZnodeStat] | None:
        """The first node of a lock dir, its data and Stat; None if there is none."""
        while True:
            children = self._children(path)
            if not children:
                return None
            head = f"{path}/{children[0]}"
            try:
                data, stat = self._call("get", head)
            except NoNodeError:
                continue
            return head, json.loads(data or b"{}"), stat

    def _lease_end(self, data: dict[str, Any], stat: ZnodeStat) -> float | None:
        """Server ms when a head's lease ends; None if it has not taken the lock yet."""
        return stat.mtime + data["lease"] if data.get("fence") else None

    def _delete(self, path: str, version: int = -1) -> bool:
        try:
            self._call("delete", path, version=version)
            return True
        except (NoNodeError, BadVersionError):
            return False

    def _drop(self, node: _Node) -> None:
        """Delete our node (best effort: if ZooKeeper is away, later, see _tidy)."""
        self._nodes.pop(node.path.rsplit("/", 1)[1].split("-")[0], None)
        parent = node.path.rsplit("/", 1)[0]
        try:
            self._delete(node.path)
        except _Down:
            self._orphans.append((parent, node.path.rsplit("/", 1)[1].split("-")[0]))
        self._emptied.setdefault(parent, time.monotonic())

    def _reconnected(self, client: KazooClient) -> None:
        """kazoo's thread, on every (re)connection: only asynchronous calls here."""
        for path in list(self._given_up):
            self._given_up.discard(path)
            client.delete_async(path).rawlink(
                lambda result, path=path: isinstance(result.exception, _DOWN) and self._given_up.add(path))  # type: ignore[func-returns-value]

    def _tidy(self) -> None:
        """Delete nodes we could not delete earlier, and lock dirs that stayed empty (rarely)."""
        if not self._session().connected.is_set() or not self._tidying.acquire(blocking=False):
            return  # later (never wait for ZooKeeper for this), or another thread is at it
        try:
            self._tidy_now()
        finally:
            self._tidying.release()

    def _tidy_now(self) -> None:
        while self._orphans:
            parent, token = self._orphans[0]
            for child in self._children(parent):
                if child.startswith(f"{token}-"):
                    self._delete(f"{parent}/{child}")
            self._orphans.pop(0)
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        for parent, since in list(self._emptied.items()):
            if now - since >= IDLE_DELETE and self._delete_if_idle(parent) is not None:
                del self._emptied[parent]

    def _delete_if_idle(self, parent: str) -> bool | None:
        """Delete an empty lock dir idle for IDLE_DELETE; None: keep watching it (too young)."""
        try:
            children, stat = self._call("get_children", parent, include_data=True)
        except NoNodeError:
            return True
        if children:
            return False  # in use: whoever empties it next watches it
        if self._fresh_clock().now_lo() - stat.mtime < IDLE_DELETE * 1000:
            return None
        try:
            self._call("delete", parent, version=stat.version)  # a fence written since: keep it
            return True
        except (NoNodeError, NotEmptyError, BadVersionError):
            return False

    # -- acquire ---------------------------------------------------------------------------
    def acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        parent = self._dir(lock.name, lock.keys.prefix)
        node: _Node | None = None
        down_since: float | None = None
        try:
            with contextlib.suppress(_Down):
                self._tidy()
            contended = False
            while True:
                if cancel is not None and cancel.cancelled:
                    raise Cancelled()
                attempt = time.monotonic()
                try:
                    if node is None or node.session != self._session().id:
                        node = self._enqueue(lock.name, parent, token, owner, retried=down_since is not None)
                    result = self._take_turn(lock, node, token, owner, blocking, deadline, cancel)
                except _Down as exc:
                    # Ride out a short outage (a server restart) while the caller would wait anyway.
                    now = time.monotonic()
                    down_since = attempt if down_since is None else down_since
                    if (isinstance(exc, _Refused) or not blocking or now >= deadline
                            or now - down_since >= self.op_timeout):
                        raise
                    self._session().connected.wait(min(deadline - now, 0.5))
                    continue
                down_since = None
                if result is None:
                    self._drop(node)
                    return None
                if isinstance(result, Grant):
                    return Grant(result.fence, result.lease_start, result.lease, contended or result.contended)
                contended = True  # result is False: our node vanished (session lost); queue again
                node = None
        except _Down as exc:
            if node is not None:
                self._drop(node)
            else:
                self._orphans.append((parent, token))  # the create may have gone through
            raise self._unavailable(lock.name, exc) from exc
        except BaseException:
            if node is not None:
                with contextlib.suppress(Exception):
                    self._drop(node)
            raise

    def _enqueue(self, name: str, parent: str, token: str, owner: str, *, retried: bool) -> _Node:
        """Our node at the tail of the queue (found again if a create before an outage made it)."""
        session = self._session()
        if retried:
            for child in self._children(parent):
                if child.startswith(f"{token}-"):
                    return _Node(name, f"{parent}/{child}", session.id or 0)
        data = json.dumps({"owner": owner}).encode()
        path, _ = self._write("create", f"{parent}/{token}-", data, ephemeral=True, sequence=True,
                              makepath=True, include_data=True)
        node = _Node(name, path, session.id or 0)
        self._nodes[token] = node
        return node

    def _take_turn(self, lock: LockLike, node: _Node, token: str, owner: str, blocking: bool, deadline: float,
                   cancel: CancelToken | None) -> Grant | bool | None:
        """Wait for our turn: a Grant, None (timed out) or False (our node is gone)."""
        parent, mine = node.path.rsplit("/", 1)
        session = self._session()
        contended = False
        wake = threading.Event()
        session.wakes.add(wake)
        unfenced: dict[str, float] = {}
        try:
            while True:
                children = self._children(parent)
                if mine not in children:
                    return False
                at = children.index(mine)
                if at == 0:
                    grant = self._become_holder(lock, node, token, owner)
                    if grant is None:
                        return False
                    return Grant(grant.fence, grant.lease_start, grant.lease, contended)
                if not blocking or time.monotonic() >= deadline:
                    return None
                contended = True
                wake.clear()
                before = f"{parent}/{children[at - 1]}"
                until = deadline
                if at == 1:
                    # The head's successor also keeps the head's lease: it cuts off an overrun.
                    try:
                        data, stat = self._call("get", before, watch=lambda _event: wake.set())
                    except NoNodeError:
                        continue
                    data = json.loads(data or b"{}")
                    end = self._lease_end(data, stat)
                    if end is None:
                        # Not fenced yet: it is taking the lock now. One that stays so for a
                        # session timeout is a leftover of an abandoned create: pass it over.
                        first = unfenced.setdefault(before, time.monotonic())
                        if time.monotonic() - first >= self.session_timeout:
                            self._delete(before, version=stat.version)
                            continue
                        until = min(until, first + self.session_timeout)
                    elif self._fresh_clock().now_lo() >= end:
                        self._delete(before, version=stat.version)  # an extend that came first wins
                        continue
                    else:
                        until = min(until, self.clock.local_when(end) + 0.001)
                elif self._call("exists", before, watch=lambda _event: wake.set()) is None:
                    continue
                self._wait(wake, until, cancel)
        finally:
            session.wakes.discard(wake)

    def _wait(self, wake: threading.Event, until: float, cancel: CancelToken | None) -> None:
        while (left := until - time.monotonic()) > 0:
            if wake.wait(left if cancel is None else min(left, CANCEL_CHECK)):
                return
            if cancel is not None and cancel.cancelled:
                raise Cancelled()

    def _become_holder(self, lock: LockLike, node: _Node, token: str, owner: str) -> Grant | None:
        """We are the head: issue the fence and start our lease, in one transaction (None: our
        node is gone, and then the fence was not issued either)."""
        parent = node.path.rsplit("/", 1)[0]
        ttl_ms = lock._ttl_ms
        while True:
            data, stat = self._call("get", parent)
            clock = self._fresh_clock()
            fence = max(int(data or 0) + 1, int(clock.now_lo() * 1000))
            payload = {"owner": owner, "fence": fence, "lease": ttl_ms, "since": int(clock.now_lo())}

            def send(client: KazooClient, version: int = stat.version, fence: int = fence,
                     payload: dict[str, Any] = payload) -> Any:
                tx = client.transaction()
                tx.set_data(parent, str(fence).encode(), version=version)  # compare-and-set
                tx.set_data(node.path, json.dumps(payload).encode())
                return tx.commit_async()

            sent = time.monotonic()
            fenced, started = self._run(send)
            if isinstance(fenced, BadVersionError):
                continue  # another fence was issued since we read it (a stale head): read again
            if not isinstance(started, Exception):
                break
            if isinstance(started, NoNodeError):
                return None
            raise _Down(f"transaction failed: {fenced!r}, {started!r}")
        # Both writes carry the transaction's time: the lease began at started.mtime.
        self.clock.sample(started.mtime, sent, time.monotonic())
        node.version, node.lease_ms, node.end_ms, node.fence = started.version, ttl_ms, started.mtime + ttl_ms, fence
        node.payload = payload
        self._nodes[token] = node
        return Grant(fence=fence, lease_start=sent, lease=lock.ttl)

    # -- the holder ------------------------------------------------------------------------
    def _mine(self, token: str) -> _Node | None:
        node = self._nodes.get(token)
        return node if node is not None and node.end_ms else None

    def _as_holder(self, name: str, node: _Node, step: Callable[[], _T]) -> _T | None:
        """Run `step` for our hold; None if the hold is lost (our session is not the node's).

        A dropped connection is ridden out for HOLDER_RIDE_OUT: after a freeze (SIGSTOP) the client
        first sends on its dead socket, then reconnects with a new session, and only then do we
        know the old one (and our node) is gone. Disconnected for a whole session timeout: the
        server has expired the session by now, whatever the client has heard.
        """
        session = self._session()
        give_up = time.monotonic() + min(self.op_timeout, HOLDER_RIDE_OUT)
        while True:
            since = session.suspended_since
            if since is not None and time.monotonic() - since >= self.session_timeout:
                self._given_up.add(node.path)
                return None
            try:
                if not session.connected.wait(max(0.0, give_up - time.monotonic())):
                    raise _Down(f"not connected to ZooKeeper at {self.hosts}")
                if session.id != node.session:
                    return None
                return step()
            except _Down as exc:
                since = session.suspended_since
                if since is not None and time.monotonic() - since >= self.session_timeout:
                    self._given_up.add(node.path)
                    return None
                if time.monotonic() >= give_up:
                    raise self._unavailable(name, exc) from exc
                session.connected.wait(0.05)  # kazoo marks the drop, then reconnects

    def release(self, lock: LockLike, *, token: str) -> bool:
        node = self._mine(token)
        if node is None:
            return False
        self._nodes.pop(token, None)
        parent = node.path.rsplit("/", 1)[0]
        try:
            deleted = self._as_holder(lock.name, node, lambda: self._delete(node.path))
        except LockUnavailable:
            self._orphans.append((parent, token))
            raise
        self._emptied.setdefault(parent, time.monotonic())
        return bool(deleted)

    def extend(self, lock: LockLike, *, token: str, ms: int, replace: bool) -> int:
        node = self._mine(token)
        if node is None:
            return 0

        def step() -> int:
            left = node.end_ms - self.clock.now_hi()
            if left <= 0:
                self._drop(node)  # our lease is over: let the next waiter in now
                return 0
            lease = int(ms if replace else ms + left)
            payload = {**node.payload, "lease": lease}
            try:
                stat = self._write("set", node.path, json.dumps(payload).encode(), version=node.version)
            except (NoNodeError, BadVersionError):
                return 0
            node.version, node.lease_ms, node.end_ms, node.payload = stat.version, lease, stat.mtime + lease, payload
            return max(1, int(node.end_ms - self.clock.now_hi()))

        left = self._as_holder(lock.name, node, step)
        if not left:
            self._nodes.pop(token, None)
        return left or 0

    def check(self, lock: LockLike, *, token: str) -> int:
        node = self._mine(token)
        if node is None:
            return 0
        stat = self._as_holder(lock.name, node, lambda: self._call("exists", node.path))
        if stat is None:
            self._nodes.pop(token, None)
            return 0
        return int(stat.mtime + node.lease_ms - self.clock.now_hi())

    # -- anyone ----------------------------------------------------------------------------
    def locked(self, lock: LockLike) -> bool:
        try:
            head = self._head(self._dir(lock.name, lock.keys.prefix))
            if head is None:
                return False
            _, data, stat = head
            end = self._lease_end(data, stat)
            return end is None or self._fresh_clock().now_lo() < end
        except _Down as exc:
            raise self._unavailable(lock.name, exc) from exc

    def _describe(self, name: str, path: str) -> HeldLock | None:
        head = self._head(path)
        if head is None:
            return None
        _, data, stat = head
        end = self._lease_end(data, stat)
        clock = self._fresh_clock()
        if end is None or clock.now_lo() >= end:
            return None  # not taken yet, or its lease is over
        children = self._children(path)
        since_ms = data.get("since", stat.mtime)
        return HeldLock(name=name, owner=data.get("owner", ""), fence=int(data["fence"]),
                        held_since=since_ms / 1000, held_for=max(0.0, (clock.now_lo() - since_ms) / 1000),
                        ttl_left=max(0.0, (end - clock.now_hi()) / 1000), waiters=max(len(children) - 1, 0))

    def describe(self, name: str) -> HeldLock | None:
        try:
            return self._describe(name, self._dir(name))
        except _Down as exc:
            raise self._unavailable(name, exc) from exc

    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        """Every lock dir under the root is read (one round trip each); empty idle ones are
        deleted on the way (the cleanup of dirs whose last user exited before its own sweep)."""
        key_prefix = locks_settings.KEY_PREFIX
        try:
            names = []
            for child in self._children_plain(self.root):
                full = unquote(child)
                if not child.startswith(".") and full.startswith(key_prefix + prefix):
                    names.append((full[len(key_prefix):], f"{self.root}/{child}"))
            out = []
            for name, path in sorted(names):
                info = self._describe(name, path)
                if info is not None:
                    out.append(info)
                    if limit is not None and len(out) >= limit:
                        break
                else:
                    self._delete_if_idle(path)
            return out
        except _Down as exc:
            raise self._unavailable(prefix or "*", exc) from exc

    def _children_plain(self, path: str) -> list[str]:
        try:
            return list(self._call("get_children", path))
        except NoNodeError:
            return []

    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        path = self._dir(name)
        try:
            while True:
                head = self._head(path)
                if head is None:
                    return None
                node, data, stat = head
                end = self._lease_end(data, stat)
                if end is None:
                    return None  # being taken right now: nobody holds it yet
                if self._fresh_clock().now_lo() >= end:
                    self._delete(node, version=stat.version)  # its lease is over: it was free
                    return None
                fence, owner = int(data["fence"]), data.get("owner", "")
                if expected_fence is not None and fence != int(expected_fence):
                    raise HolderChanged(f"the holder changed: {owner} holds it now with fence {fence}, not fence "
                                        f"{expected_fence}", name=name, owner=owner, fence=fence)
                if self._delete(node, version=stat.version):
                    return Released(owner=owner, fence=fence, since_us=int(data.get("since", stat.mtime)) * 1000)
        except _Down as exc:
            raise self._unavailable(name, exc) from exc

    def close(self) -> None:
        session = self._sessions.pop(os.getpid(), None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.client.stop()
                session.client.close()
