"""The built-in Redis backend: one Redis, a Sentinel-monitored master, or a Redis Cluster.

Which Redis: the `locks` cache alias's connection (`LOCKS_REDIS_URL`: redis://,
redis+sentinel://, redis+cluster://, see locks/redis_urls.py), or the client given to
`Lock(client=...)`. Every key of one lock carries the hash tag {name} (locks/keys.py), so each
script stays in one Cluster slot. The scripts (locks/scripts/*.lua) fuse each step into one
round trip:

- acquire: SET-if-free with a TTL and a fencing token, or a place in the FIFO queue (with a
  request to be served, when combining); fences are derived from the Redis clock in
  microseconds and the last fence issued, so they keep increasing after Redis loses its data;
- release: hands the lock *directly* to the head waiter, with a short provisional lease
  (HANDOFF_LEASE) the waiter confirms when it wakes, and wakes only that waiter through a list
  it BLPOPs: nobody polls, nobody starves, and a waiter that died queued costs only that lease.
  (Of the known ways to skip a dead waiter, heartbeats cost every waiter a write per interval,
  and Redisson's fair lock still hands the lock to a dead waiter whose timeout has not passed.)
- a waiter sleeps until the lease it was told of ends, then looks again: timed here on the
  socket (Redis's own blocking timeouts fire on a 100 ms timer), so a crashed holder costs its
  lease and a few ms. If the lock passes to a shorter lease meanwhile, a push on the lock's
  wake list makes one live waiter look again at once;
- extend / check: token-checked; force release: fence-checked, wakes the next waiter.

Combining (`supports_combining`; locks/combining.py): a waiter may queue a request; the holder
takes the requests queued behind it (`take`) and answers each on its waiter's list (`reply`).

Held locks are read here too (the lock hashes, by SCAN or from the stats' held index) for the
dashboard and `manage.py locks`; locks/inspect.py dispatches to whichever backend is in use.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from redis import Redis
from redis.exceptions import AskError, MovedError, RedisError

from locks.backends.base import Also, Grant, HeldLock, LockBackend, QueuedRequest, Released, every_held
from locks.conf import locks_settings
from locks.connection import (
    UNREACHABLE,
    default_client,
    give_up_ms,
    is_cluster,
    learn_clock,
    node_client,
    pool_of,
    text,
)
from locks.exceptions import HolderChanged, LockNotOwned, LockUnavailable
from locks.hold import Cancelled, CancelToken, Guarded, Served
from locks.keys import LockKeys, held_key, name_from_key, name_from_member
from locks.scripts import (
    NOT_OURS,
    Acquire,
    Cancel,
    as_text,
    end_wait,
    execute_pipeline,
    queue_script,
    script,
    wait_connection,
)

if TYPE_CHECKING:
    from locks.hold import LockLike

# One HSCAN page (MATCH "p|*") per held lock counts its queued requests: exact up to a few
# hundred waiters (a listpack hash comes whole; a bigger one, one page of this many slots);
# beyond, a lower bound (`queued_requests_more`, shown as "N+"), so a 10 000-waiter queue costs
# one bounded read per refresh, not a walk of the whole hash.
REQUESTS_SCAN = 1000
# A reply lives this long after its waiter's deadline, then Redis drops it.
REPLY_GRACE_MS = 10_000


class ReplicasLagging(Exception):
    """WAIT_REPLICAS is set and too few replicas acknowledged the lock write in time."""


class _Signal:
    """A waiter's own hand-off list and the lock's wake list, BLPOPped on a connection the thread
    keeps for the server (`wait_connection`), else one of the pool.

    We time the wait ourselves (poll on the socket) instead of relying on BLPOP's timeout:
    Redis checks blocking timeouts from its cron, `hz` times a second, so a BLPOP oversleeps by
    up to 100 ms; and a blocking read must not run into the client's socket timeout, which
    stays short so that a frozen Redis is noticed. The BLPOP stays in flight while we look at
    the lock from another connection; we hang up on it (the server drops it with the
    connection) only when we stop waiting without its answer.
    """

    def __init__(self, client: Redis, keys: list[str], cancel: CancelToken | None,
                 wait_replicas: tuple[int, int] | None = None) -> None:
        self.client = client
        self.pool: Any = None
        self.keys = keys
        self.cancel = cancel
        self.wait_replicas = wait_replicas
        self.conn: Any = None
        self.kept = False

    def wait(self, until: float, server_deadline: float) -> str | None:
        """The next message on the list, or None once `until` (monotonic) has passed."""
        if self.conn is None:
            # Looked up now, not at __init__: on a cluster, the acquire script that just ran
            # through the cluster client has refreshed the slot map if a failover moved it.
            self.pool = pool_of(self.client, self.keys[0])
            self.conn, self.kept = wait_connection(self.pool)
            block = max(server_deadline - time.monotonic(), 0.001)
            try:
                self.conn.send_command("BLPOP", *self.keys, f"{block:.3f}")
            except BaseException:
                self.abort()
                raise
        try:
            while not self._readable(until - time.monotonic()):
                if time.monotonic() >= until:
                    return None
            reply = self.conn.read_response()
            if reply and self.wait_replicas is not None and text(reply[1]).startswith("g|"):
                # Our BLPOP came after the releaser's grant, so WAIT on this connection covers it.
                self.conn.send_command("WAIT", *as_text(self.wait_replicas))
                acked = self.conn.read_response()
                if acked < self.wait_replicas[0]:
                    raise ReplicasLagging(f"only {acked} of {self.wait_replicas[0]} replicas acknowledged the hand-off")
        except BaseException:
            self.abort()
            raise
        conn, self.conn = self.conn, None
        end_wait(self.pool, conn, self.kept, clean=True)
        return text(reply[1]) if reply else None

    def _readable(self, timeout: float) -> bool:
        """Whether the BLPOP's answer (or a hang-up, which the read then raises) is there, waiting
        up to `timeout` seconds, or until `cancel`. One poll on the socket: the connection's
        `can_read` adds a hang-up check (two polls and a peek) that the read does anyway, and a
        waiter paid them on every wait (issue 39's syscall count)."""
        timeout = max(timeout, 0.0)
        cancel = self.cancel
        if cancel is not None and cancel.cancelled:
            raise Cancelled
        sock = getattr(self.conn, "_sock", None)
        buffered = getattr(getattr(getattr(self.conn, "_parser", None), "_reader", None), "has_data", None)
        if sock is None or buffered is None:  # not a socket read through hiredis's reader
            return self._readable_in_slices(timeout)
        if buffered():
            return True
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if cancel is None:
            return bool(poller.poll(timeout * 1000))
        poller.register(cancel.fileno(), select.POLLIN)
        ready = poller.poll(timeout * 1000)
        if cancel.cancelled:
            raise Cancelled
        return any(fd == sock.fileno() for fd, _ in ready)

    def _readable_in_slices(self, timeout: float) -> bool:
        """`_readable` through the connection's own `can_read`, in short slices if cancellable."""
        cancel = self.cancel
        if cancel is None:
            return bool(self.conn.can_read(timeout=timeout))
        if self.conn.can_read(timeout=min(timeout, 0.05)):
            return True
        if cancel.cancelled:
            raise Cancelled
        return bool(self.conn.can_read(timeout=0))

    def abort(self) -> None:
        """Stop waiting: hang up on a BLPOP still in flight."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            end_wait(self.pool, conn, self.kept, clean=False)


def _wait_replicas() -> tuple[int, int] | None:
    n = int(locks_settings.WAIT_REPLICAS)
    return (n, int(locks_settings.WAIT_REPLICAS_TIMEOUT * 1000)) if n > 0 else None


def _lock_keys(keys: LockKeys) -> list[str]:
    """KEYS of acquire, release and force_release."""
    return [keys.lock, keys.fence, keys.queue, keys.waiters, keys.wake, keys.taken]


def _acquire_args(lock: LockLike, *, token: str, owner: str, wait_ms: int) -> list[Any]:
    """ARGV of acquire up to the give-up time and payload (added per send: `_run_acquire`)."""
    return [token, lock._ttl_ms, owner, max(wait_ms, 0), lock.keys.signal_prefix, lock._fence_ttl_ms(),
            lock._handoff_ms()]


class RedisBackend(LockBackend):
    name = "redis"
    supports_combining = True

    def __init__(self, client: Redis | None = None) -> None:
        self._client = client

    @property
    def client(self) -> Redis:
        """The given client, or the LOCKS cache alias's (looked up per call: django-redis keeps a
        client per thread)."""
        return self._client if self._client is not None else default_client()

    @property
    def label(self) -> str:
        client = self.client
        if is_cluster(client):
            return "redis (cluster)"
        if "sentinel" in type(client.connection_pool).__name__.lower():
            return "redis (sentinel)"
        return self.name

    # -- acquire ---------------------------------------------------------------------------
    def acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                cancel: CancelToken | None = None) -> Grant | None:
        got = self._acquire(lock, token=token, owner=owner, blocking=blocking, deadline=deadline, cancel=cancel)
        # No payload, no guards: never Served or Guarded. (An ignore, not a cast: a call here is one more
        # place for a Ctrl-C to land between the grant and its hold; tests/locks/test_failover.py.)
        return None if isinstance(got, Served) else got  # type: ignore[return-value]

    @property
    def supports_guards(self) -> bool:  # type: ignore[override]
        """Guard keys ride in the acquire script's KEYS: one server, so not on a cluster."""
        return not is_cluster(self.client)

    def submit(self, lock: LockLike, *, token: str, owner: str, payload: str, deadline: float,
               cancel: CancelToken | None = None, guards: Sequence[str] = (),
               needs: Sequence[str] = ()) -> Grant | Served | Guarded | None:
        if guards and not self.supports_guards:
            raise ValueError("guard keys need one Redis server: not on a cluster")
        return self._acquire(lock, token=token, owner=owner, blocking=True, deadline=deadline, cancel=cancel,
                             payload=payload, guards=guards, needs=",".join(needs))

    def _acquire(self, lock: LockLike, *, token: str, owner: str, blocking: bool, deadline: float,
                 cancel: CancelToken | None, payload: str = "", guards: Sequence[str] = (),
                 needs: str = "") -> Grant | Served | Guarded | None:
        started = time.monotonic()
        client = self.client
        keys = lock.keys
        lock_keys = _lock_keys(keys)
        key_list = [*lock_keys, *guards]  # the guards are read on the first send only
        signal = _Signal(client, [keys.signal(token), keys.wake], cancel, _wait_replicas())
        queued = False
        try:
            while True:
                sent = time.monotonic()
                left_ms = int((deadline - sent) * 1000) if blocking else 0
                args = _acquire_args(lock, token=token, owner=owner, wait_ms=left_ms)
                acquired, value, now_ms, since_ms, *checked = self._run_acquire(lock, client, key_list, args, payload,
                                                                                needs)
                if acquired == Acquire.GUARDED:
                    return Guarded(tuple(None if v is None else text(v) for v in checked[0]))
                key_list = lock_keys
                if acquired == Acquire.ACQUIRED:
                    signal.abort()
                    lease_start = sent + (int(since_ms) - int(now_ms)) / 1000
                    return Grant(int(value), lease_start, lock.ttl, contended=queued)
                if not blocking or left_ms <= 0:
                    break
                queued = True
                # Wait for a hand-off, and look again by ourselves when the holder's lease ends:
                # if it died, nobody will hand over. Timed here, to the millisecond.
                lease_end = sent + max(int(value), 0) / 1000 + 0.001
                message = signal.wait(until=min(deadline, lease_end), server_deadline=deadline + 0.05)
                if message is not None and message.startswith("g|"):
                    _, fence_s, granted_ms, lease_ms = message.split("|")
                    # The lease began when the releaser granted it (Redis clock). Map that to our
                    # clock conservatively through the reply of our last acquire attempt.
                    lease_start = min(sent + (int(granted_ms) - int(now_ms)) / 1000, time.monotonic())
                    return Grant(int(fence_s), lease_start, int(lease_ms) / 1000, contended=True)
                if message is not None and message.startswith("d|"):
                    return Served(message[2:], waited=time.monotonic() - started)
                if time.monotonic() >= deadline:
                    break
                # A nudge ("r": a shorter lease now) or our own timer: look again.
            signal.abort()
            if queued:
                sent = time.monotonic()
                got = self._cancel(lock, client, token)
                if isinstance(got, Served):
                    return got
                if got is not None:
                    # Handed over at the very last moment: it is ours; don't strand it.
                    fence, now_ms, since_ms = got
                    return Grant(fence, sent + (since_ms - now_ms) / 1000, lock._handoff_ms() / 1000, contended=True)
        except ReplicasLagging as exc:
            signal.abort()
            self._release(lock, client, token)
            raise LockUnavailable(str(exc), name=lock.name) from exc
        except BaseException as exc:
            # Interrupted (cancelled, Ctrl-C, a timeout around us) or failed: leave the queue,
            # and if a hand-off raced in, give the lock straight back. An interrupt can land
            # anywhere, this handler's first line included (Ctrl-C twice): so that line is a try,
            # and a second interrupt gets one more go. (A helper holding the retries would not
            # do: the interpreter looks for signals on entering a function, before its try.)
            try:
                self._leave(lock, client, token, signal, exc)
            except BaseException as again:
                try:  # noqa: SIM105 (not contextlib.suppress: entering it is a call, a place to be interrupted)
                    self._leave(lock, client, token, signal, again)
                except BaseException:
                    pass  # a third: passed over at its deadline or hand-off lease, like a crashed waiter
            if isinstance(exc, UNREACHABLE):
                raise LockUnavailable(f"Redis unreachable: {exc}", name=lock.name) from exc
            raise
        return None

    def _leave(self, lock: LockLike, client: Redis, token: str, signal: _Signal, exc: BaseException) -> None:
        """After `exc` cut a wait short: leave the queue, giving back a lock handed over meanwhile.

        Whether we are queued is not known here: an interrupt can land after Redis ran the
        acquire script and before we read its reply. The token is known before any call, and
        leaving by it does nothing if it was never queued, so we always leave. Unless Redis
        itself just failed us: a second call would only wait out another socket timeout, and a
        waiter that never confirms a hand-off is passed over after HANDOFF_LEASE anyway.

        An interrupt that can land anywhere (Ctrl-C; SystemExit from a signal handler: not an
        Exception) can cut redis-py short between sending a command and reading its reply, or
        halfway through connecting; the connection goes back to the pool like that, and the
        next command on it reads the earlier reply as its own, or fails. So this drops the
        idle connections of the pool first.
        """
        signal.abort()
        if isinstance(exc, (*UNREACHABLE, LockUnavailable)):
            return
        if not isinstance(exc, Exception):
            pool = pool_of(client, lock.keys.lock)
            if pool is not None:
                pool.disconnect(inuse_connections=False)
        with contextlib.suppress(Exception):
            if isinstance(self._cancel(lock, client, token), tuple):
                self._release(lock, client, token)

    def _run_acquire(self, lock: LockLike, client: Redis, key_list: list[str], args: list[Any],
                     payload: str, needs: str = "") -> list[Any]:
        """The acquire script; with WAIT_REPLICAS, pipelined with WAIT on the same connection.

        It carries the Redis time after which we will have given up on it (our socket timeout):
        a frozen Redis that wakes runs every command still in its socket buffers, and an acquire
        we abandoned would otherwise queue a phantom waiter that each live buyer then waits a
        hand-off lease for. The script drops a request that arrives that late. If that was ours
        and we had not given up (we stalled before sending, or our estimate of Redis's clock was
        off), the reply taught us the clock: send it once more.
        """
        pool = pool_of(client, key_list[0])
        for _ in range(2):
            reply = self._send_acquire(lock, client, key_list, [*args, give_up_ms(pool), payload, needs])
            learn_clock(pool, int(reply[2]))
            if reply[0] != Acquire.TOO_LATE:
                return reply
        raise LockUnavailable("the acquire reached Redis after its give-up time twice; clock offset relearned",
                              name=lock.name)

    def _send_acquire(self, lock: LockLike, client: Redis, key_list: list[str], args: list[Any]) -> list[Any]:
        replicas = _wait_replicas()
        if replicas is None:
            reply: list[Any] = script("acquire")(keys=key_list, args=args, client=client)
            return reply
        # WAIT counts the writes of its own connection: one server's pipeline, the lock's
        # master on a cluster (a cluster pipeline would send the keyless WAIT anywhere).
        node = node_client(client, key_list[0])
        pipe = node.pipeline(transaction=False)
        queue_script(pipe, "acquire", keys=key_list, args=args)
        pipe.execute_command("WAIT", *as_text(replicas))
        try:
            reply, acked = execute_pipeline(node, pipe)
        except (*UNREACHABLE, MovedError, AskError) as exc:
            if is_cluster(client):
                # We bypassed the cluster client, so it has not seen the failure: have it
                # re-read the slot map now, or every try would go to the dead master again.
                with contextlib.suppress(Exception):
                    client.nodes_manager.initialize()
            raise LockUnavailable(f"the lock's master is unreachable or moved: {exc}", name=lock.name) from exc
        if reply[0] == Acquire.ACQUIRED and acked < replicas[0]:
            raise ReplicasLagging(f"only {acked} of {replicas[0]} replicas acknowledged the lock")
        return reply

    def _pipelined(self) -> Redis | None:
        """The client to batch scripts on, or None where one call each is the safe way: a
        cluster (keys on several masters) and WAIT_REPLICAS (WAIT per connection)."""
        client = self.client
        return None if is_cluster(client) or _wait_replicas() is not None else client

    def try_acquire_many(self, items: Sequence[tuple[LockLike, str, str]]) -> list[Grant | None]:
        """One round trip: the acquire scripts, non-blocking, in one pipeline."""
        client = self._pipelined()
        if client is None or len(items) < 2:
            return super().try_acquire_many(items)
        pool = client.connection_pool
        pipe = client.pipeline(transaction=False)
        sent = time.monotonic()
        for lock, token, owner in items:
            queue_script(pipe, "acquire", keys=_lock_keys(lock.keys),
                         args=[*_acquire_args(lock, token=token, owner=owner, wait_ms=0), give_up_ms(pool), ""])
        try:
            replies = execute_pipeline(client, pipe)
        except UNREACHABLE as exc:
            # Those it took expire with their leases (as a single acquire lost in flight does).
            raise LockUnavailable(f"Redis unreachable: {exc}", name=items[0][0].name) from exc
        grants: list[Grant | None] = []
        # An acquire that arrived after its give-up time (TOO_LATE: we stalled, or misjudged Redis's
        # clock, now relearned) did nothing: that lock is simply not taken this time.
        for (lock, _, _), (acquired, value, now_ms, since_ms) in zip(items, replies, strict=True):
            learn_clock(pool, int(now_ms))
            grants.append(Grant(int(value), sent + (int(since_ms) - int(now_ms)) / 1000, lock.ttl)
                          if acquired == Acquire.ACQUIRED else None)
        return grants

    def release_many(self, items: Sequence[tuple[LockLike, str]]) -> list[bool]:
        """One round trip: the release scripts in one pipeline."""
        client = self._pipelined()
        if client is None or len(items) < 2:
            return super().release_many(items)
        pipe = client.pipeline(transaction=False)
        for lock, token in items:
            keys = lock.keys
            queue_script(pipe, "release", keys=_lock_keys(keys),
                          args=[token, keys.signal_prefix, lock._fence_ttl_ms(), lock._handoff_ms()])
        try:
            return [bool(released) for released in execute_pipeline(client, pipe)]
        except UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during release: {exc}", name=items[0][0].name) from exc

    @staticmethod
    def _cancel(lock: LockLike, client: Redis, token: str) -> tuple[int, int, int] | Served | None:
        """Leave the queue. The lock if it was handed over just now, a reply if a holder served
        this request just now (combining), else None."""
        keys = lock.keys
        got = script("cancel")(
            keys=[keys.lock, keys.queue, keys.waiters, keys.wake, keys.taken],
            args=[token, keys.signal_prefix],
            client=client,
        )
        if got[0] == Cancel.SERVED:
            return Served(text(got[1]), waited=0.0)
        return (int(got[1]), int(got[2]), int(got[3])) if got[0] == Cancel.HANDED else None

    # -- release / extend / check ----------------------------------------------------------
    @staticmethod
    def _release(lock: LockLike, client: Redis, token: str) -> bool:
        keys = lock.keys
        return bool(script("release")(
            keys=_lock_keys(keys),
            args=[token, keys.signal_prefix, lock._fence_ttl_ms(), lock._handoff_ms()],
            client=client,
        ))

    def release(self, lock: LockLike, *, token: str) -> bool:
        try:
            return self._release(lock, self.client, token)
        except UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during release: {exc}", name=lock.name) from exc

    def extend(self, lock: LockLike, *, token: str, ms: int, replace: bool) -> int:
        try:
            return int(script("extend")(keys=[lock.keys.lock], args=[token, ms, "1" if replace else "0"],
                                        client=self.client))
        except UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during extend: {exc}", name=lock.name) from exc

    def check(self, lock: LockLike, *, token: str) -> int:
        try:
            return int(script("check")(keys=[lock.keys.lock], args=[token], client=self.client))
        except UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable during check: {exc}", name=lock.name) from exc

    def locked(self, lock: LockLike) -> bool:
        try:
            return bool(self.client.exists(lock.keys.lock))
        except UNREACHABLE as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=lock.name) from exc

    # -- combining -------------------------------------------------------------------------
    def take(self, lock: LockLike, *, token: str, limit: int) -> list[QueuedRequest]:
        return self._take(lock, token=token, limit=limit, also_args=[])[0]

    def take_with(self, lock: LockLike, *, token: str, limit: int,
                  also: Also) -> tuple[list[QueuedRequest], dict[str, Grant]]:
        """One call: the batch and the other locks it needs (take.lua's `also`), taken as
        non-blocking acquires in the same script. Two calls (the default) on a cluster (those
        locks live in other slots), with WAIT_REPLICAS (each acquire waits for its replicas), or
        when the combiner's own request needs no lock to model the others on."""
        if self._pipelined() is None or not also.mine:
            return super().take_with(lock, token=token, limit=limit, also=also)
        model = also.lock_of(also.mine[0])
        params = (model._ttl_ms, model._fence_ttl_ms(), model._handoff_ms(), model.keys.prefix)
        also_args = [also.token, params[0], also.owner, params[1], params[2], params[3], ",".join(also.mine)]
        batch, granted, sent = self._take(lock, token=token, limit=limit, also_args=also_args)
        grants: dict[str, Grant] = {}
        strays: list[tuple[LockLike, str]] = []
        for name, fence in granted:
            other = also.lock_of(name)
            if (other._ttl_ms, other._fence_ttl_ms(), other._handoff_ms(), other.keys.prefix) != params:
                strays.append((other, also.token))  # taken on the model's terms, not its own: give it back
                continue
            grants[name] = Grant(fence, sent, other.ttl)
        if strays:
            self.release_many(strays)
        return batch, grants

    def _take(self, lock: LockLike, *, token: str, limit: int,
              also_args: list[Any]) -> tuple[list[QueuedRequest], list[tuple[str, int]], float]:
        keys = lock.keys
        sent = time.monotonic()
        try:
            got = script("take")(keys=[keys.lock, keys.queue, keys.waiters, keys.taken],
                                 args=[token, int(limit), *also_args], client=self.client)
        except UNREACHABLE as exc:
            raise LockUnavailable(f"take: Redis unreachable: {exc}", name=lock.name) from exc
        if int(got[0]) == NOT_OURS:
            raise LockNotOwned("take: the lock is no longer ours", name=lock.name)
        now_ms, flat, grants = int(got[0]), got[1], got[2]
        batch = []
        for i in range(0, len(flat), 4):
            deadline_ms, needs = int(flat[i + 1]), text(flat[i + 3])
            batch.append(QueuedRequest(token=text(flat[i]), payload=text(flat[i + 2]),
                                       deadline=sent + (deadline_ms - now_ms) / 1000, deadline_ms=deadline_ms,
                                       needs=tuple(needs.split(",")) if needs else ()))
        return batch, [(text(grants[i]), int(grants[i + 1])) for i in range(0, len(grants), 2)], sent

    def reply(self, lock: LockLike, *, replies: dict[str, str], deadlines: dict[str, int],
              release: Sequence[tuple[LockLike, str]] = ()) -> list[bool]:
        """One script call: the locks of `release` released (release.lua's work, before the
        replies), then each reply on its waiter's list, kept until its deadline (plus a grace),
        and the requests struck from the holder's `taken` (no longer orphans-to-be) and from the
        queue, where a waiter that thought us gone (a pause past our lease) queued again. On a
        cluster the releases are their own calls first (their keys live in other slots)."""
        released: list[bool] = []
        if release and is_cluster(self.client):
            released, release = self.release_many(release), ()
        keys = lock.keys
        key_list = [keys.taken, keys.queue, keys.waiters]
        args: list[Any] = [keys.signal_prefix, REPLY_GRACE_MS, len(release)]
        for other, other_token in release:
            key_list += _lock_keys(other.keys)
            args += [other_token, other.keys.signal_prefix, other._fence_ttl_ms(), other._handoff_ms()]
        for token, reply in replies.items():
            args += [token, reply, deadlines.get(token, 0)]
        try:
            got = script("reply")(keys=key_list, args=args, client=self.client)
        except UNREACHABLE as exc:
            raise LockUnavailable(f"reply: Redis unreachable: {exc}", name=lock.name) from exc
        return released or [bool(flag) for flag in got[1]]

    # -- reading held locks ----------------------------------------------------------------
    def read_held(self, keys: list[str]) -> list[HeldLock]:
        """The held locks among these lock keys (one pipeline; released ones are left out)."""
        if not keys:
            return []
        client = self.client
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
            pipe.pttl(key)
            pipe.llen(f"{key}:queue")
            pipe.hscan(f"{key}:waiters", 0, match="p|*", count=REQUESTS_SCAN)
        cluster = is_cluster(client)
        if not cluster:
            pipe.time()
        replies = pipe.execute()
        # A cluster pipeline refuses keyless commands: TIME is asked of one node after it (the
        # masters' clocks are NTP-close; held_for is a display figure).
        secs, usecs = client.time() if cluster else replies[-1]
        now = secs + usecs / 1e6
        out = []
        for i, key in enumerate(keys):
            data, pttl, waiters, (more, requests) = replies[4 * i : 4 * i + 4]
            if not data or pttl is None or pttl == -2:
                continue  # released between SCAN and read
            d = {text(k): text(v) for k, v in data.items()}
            since = int(d.get("since_us", 0)) / 1e6
            out.append(HeldLock(
                name=name_from_key(key),
                owner=d.get("owner", "?"),
                fence=int(d.get("fence", 0)),
                held_since=since,
                held_for=max(0.0, now - since),
                ttl_left=pttl / 1000 if pttl >= 0 else -1.0,
                waiters=int(waiters),
                queued_requests=len(requests),
                queued_requests_more=int(more) != 0,
            ))
        return out

    def describe(self, name: str) -> HeldLock | None:
        try:
            found = self.read_held([LockKeys.for_name(name).lock])
        except RedisError as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
        return found[0] if found else None

    def held(self, *, prefix: str = "", limit: int | None = None) -> list[HeldLock]:
        return every_held(self, prefix=prefix, limit=limit)

    def held_page(self, *, prefix: str = "", cursor: int = 0, count: int = 500) -> tuple[int, list[HeldLock]]:
        """One SCAN page (never KEYS) of the lock hashes: complete and immediate."""
        c = self.client
        match = f"{locks_settings.KEY_PREFIX}lock:{{{prefix}*}}"
        try:
            if is_cluster(c):
                # One cursor per master: a single number cannot carry them, so a cluster's "page" is
                # the whole walk, every master scanned to its end (scan_iter), and the cursor is 0.
                keys: list[str] = [text(k) for k in c.scan_iter(match=match, count=count, _type="hash")]
                return 0, self.read_held(keys)
            # SCAN's COUNT bounds the keys examined, not the matches returned: in a big keyspace a
            # call may match nothing. Keep going (boundedly) so a page is empty only at the end.
            keys = []
            for _ in range(50):
                cursor, raw = c.scan(cursor=cursor, match=match, count=count, _type="hash")
                keys.extend(text(k) for k in raw)
                if cursor == 0 or len(keys) >= count:
                    break
            return int(cursor), self.read_held(keys)
        except RedisError as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc

    def held_index_page(self, *, prefix: str = "", cursor: int = 0, count: int = 200,
                        also: Sequence[str] = ()) -> tuple[int, list[HeldLock]]:
        """From the held index the stats recorders keep (`<p>lockheld`, see locks/stats.py: one
        ZSCAN of one small key) plus the names in `also`: it knows a hold from the first stats
        flush after it began, so `also` (the busiest names) catches the short holds of hot locks
        in between. Every row is read from the lock itself: entries whose lock is gone are left
        out."""
        c = self.client
        try:
            cursor, members = cast("tuple[int, list[tuple[bytes, float]]]",
                                   c.zscan(held_key(), cursor=cursor, match=f"{prefix}*", count=count))
            names = {name_from_member(text(m)) for m, _ in members}
            names.update(n for n in also if n.startswith(prefix))
            held = self.read_held([LockKeys.for_name(n).lock for n in sorted(names)])
        except RedisError as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=prefix or "*") from exc
        return int(cursor), held

    def force_release(self, name: str, *, expected_fence: int | None = None) -> Released | None:
        keys = LockKeys.for_name(name)
        try:
            held = script("force_release")(
                keys=_lock_keys(keys),
                args=[keys.signal_prefix, int(locks_settings.FENCE_TTL * 1000),
                      max(1, int(float(locks_settings.HANDOFF_LEASE) * 1000)),
                      "0" if expected_fence is None else str(int(expected_fence))],
                client=self.client,
            )
        except RedisError as exc:
            raise LockUnavailable(f"Redis unreachable: {exc}", name=name) from exc
        if not held:
            return None
        if text(held[0]) == "changed":
            owner, fence = text(held[1]), int(held[2])
            raise HolderChanged(f"the holder changed: {owner} holds it now with fence {fence}, not fence "
                                f"{expected_fence}", name=name, owner=owner, fence=fence)
        return Released(owner=text(held[0]), fence=int(held[1]), since_us=int(held[2]))
