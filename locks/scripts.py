"""The Lua scripts (common.lua is prepended to each), loaded once per process, and how they are
sent: EVALSHA on a connection each thread keeps per server (`run_command`), or on a pipeline;
and the connection each thread keeps per server for a waiter's BLPOP (`wait_connection`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from locks.conf import pid

_DIR = Path(__file__).parent / "scripts"


class Acquire(IntEnum):
    """The first value of acquire.lua's reply (see its header)."""

    HELD = 0  # someone else holds it (and a blocking caller is queued)
    ACQUIRED = 1
    BATCHED = 2  # this request is in the holder's batch, or its reply waits: wait on
    GUARDED = 3  # a guard key exists: nothing was done
    TOO_LATE = -1  # the call reached Redis after its give-up time: nothing was done


class Cancel(IntEnum):
    """The first value of cancel.lua's reply."""

    LEFT = 0  # out of the queue, nothing was handed to us
    HANDED = 1  # the lock was handed to us just now: it is ours
    SERVED = 2  # a holder served this request just now: its reply


NOT_OURS = -1  # take.lua's reply when the lock's token is not the caller's
NAMES = ("acquire", "release", "extend", "cancel", "force_release", "check", "take", "reply")


@cache
def source(name: str) -> str:
    if name not in NAMES:
        raise KeyError(name)
    common = (_DIR / "common.lua").read_text()
    return common + "\n" + (_DIR / f"{name}.lua").read_text()


def as_text(args: Iterable[Any]) -> list[Any]:
    """The arguments with every int as text, for hiredis to pack.

    hiredis-py's pack_command formats an int with repr() and does not check the result. CPython
    runs pending signal handlers while it formats an int, so a Ctrl-C landing there makes repr()
    fail, and the process dies of a segmentation fault instead of raising KeyboardInterrupt. A
    waiter that dies like that leaves its queue entry behind. Formatted here, in Python, the
    interrupt is an ordinary exception.
    """
    return [str(arg) if isinstance(arg, int) else arg for arg in args]


class _Script(Script):
    """redis-py's Script (EVALSHA, loading the script on NOSCRIPT), with numkeys and every int
    argument sent as text (see `as_text`)."""

    def __call__(self, keys: Sequence[Any] | None = None, args: Iterable[Any] | None = None,
                 client: Any = None) -> Any:
        numkeys, keys_and_args = str(len(keys or ())), [*(keys or ()), *as_text(args or ())]
        # as redis-py's: the pipeline loads it before it runs (type first: isinstance walks a Protocol)
        if type(client) is not Redis and isinstance(client, Pipeline):
            client.scripts.add(self)
        try:  # not evalsha: its argument-deprecation wrapper cost ~3 us a call; run_command: see there
            return run_command(client, "EVALSHA", self.sha, numkeys, *keys_and_args)
        except NoScriptError:
            self.sha = client.script_load(self.script)
            return run_command(client, "EVALSHA", self.sha, numkeys, *keys_and_args)


@cache
def script(name: str) -> Script:
    """A redis-py Script (EVALSHA, reloading on NOSCRIPT); pass `client=` on each call."""
    return _Script(None, source(name).encode())  # type: ignore[arg-type]  # the client comes with each call


def queue_script(pipe: Any, name: str, *, keys: list[str], args: list[Any]) -> None:
    """Queue script `name` on a pipeline as a bare EVALSHA; run the pipeline with `execute_pipeline`.
    (redis-py's Script on a pipeline asks SCRIPT EXISTS before every execute: a round trip more.)"""
    pipe.evalsha(script(name).sha, str(len(keys)), *keys, *as_text(args))


def execute_pipeline(client: Any, pipe: Any) -> list[Any]:
    """`pipe.execute()`; scripts the server did not know (restarted empty, SCRIPT FLUSH, a
    promoted replica) are loaded and those calls sent again, in their order. A WAIT after a
    missing script is sent again after it too: the first one ran before the script wrote anything,
    so its count says nothing of the write. Raises the first error, as execute does."""
    stack = [(args, options) for args, options in pipe.command_stack]
    results: list[Any] = pipe.execute(raise_on_error=False)
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        by_sha = {script(name).sha: source(name) for name in NAMES}
        for sha in {stack[i][0][1] for i in missing}:
            client.script_load(by_sha[sha])
        again = [i for i, (args, _) in enumerate(stack)
                 if i in missing or (i > missing[0] and str(args[0]).upper() == "WAIT")]
        resend = client.pipeline(transaction=False)
        for i in again:
            args, options = stack[i]
            resend.execute_command(*args, **options)
        for i, result in zip(again, resend.execute(raise_on_error=False), strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


# --- connections kept per thread and server: one for the lock scripts, one for a waiter's BLPOP ---
class _Kept(threading.local):
    def __init__(self) -> None:
        self.pid = pid()
        self.by_pool: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()  # pool -> [conn, dirty]
        self.waits: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()  # [conn, busy, dirty]
        self.active = False

    def own(self) -> None:
        """In a forked child, drop the parent's connections: their sockets are not ours to talk on."""
        if self.pid != pid():
            for conn, *_ in [*self.by_pool.values(), *self.waits.values()]:
                conn.disconnect()  # (in a child, redis-py closes its copy without shutting the socket down)
            self.pid, self.by_pool, self.waits = pid(), weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()


def _new_connection(pool: Any) -> Any:
    """A connection made as pool makes its own, but not one of its connections."""
    return pool.connection_class(**pool.connection_kwargs)


_kept = _Kept()


def run_command(client: Redis, *args: Any) -> Any:
    """`client.execute_command(*args)` for a command whose reply redis-py does not parse further
    (EVALSHA), sent on a connection this thread keeps for client's server.

    A lock's scripts are most of its calls, and redis-py's per-command layers around the socket
    (taking a connection from the pool and checking it with a poll, giving it back, two fork
    checks, an argument-deprecation check, observability hooks) cost about as much CPU as the
    send and the reply themselves (issue 39's profile). The kept connection is made like the
    pool's (Sentinel's finds its master), retried by the connection's own Retry as redis-py
    retries, and dropped and made again after a call that did not end cleanly: an interrupt
    between a send and its reply leaves that reply for the next call to read as its own. A call
    made while this thread is inside one (a signal handler's) takes redis-py's way, as does a
    cluster client, a pipeline, a single-connection client or a client-side cache.
    """
    kept = _kept
    pool = client.connection_pool if type(client) is Redis and client.connection is None else None
    if kept.active or pool is None or getattr(pool, "cache", None) is not None:
        return client.execute_command(*args)
    try:  # (set inside the try: an interrupt before it must not leave this thread marked as inside a call)
        kept.active = True
        kept.own()
        held = kept.by_pool.get(pool)
        if held is None:
            held = kept.by_pool[pool] = [_new_connection(pool), False]
        conn = held[0]
        if held[1]:
            conn.disconnect()
        held[1] = True
        reply = conn.retry.call_with_retry(lambda: _send_and_read(conn, args), lambda _error: conn.disconnect())
        held[1] = False
        return reply
    finally:
        kept.active = False


def _send_and_read(conn: Any, args: tuple[Any, ...]) -> Any:
    conn.connect()  # as the pool does before handing a connection out: Sentinel's finds the master here
    conn.send_command(*args)
    return conn.read_response()


def wait_connection(pool: Any) -> tuple[Any, bool]:
    """A connection of pool's server to send a BLPOP on and read at leisure, and whether it is
    this thread's kept one; give it back with `end_wait`.

    A waiter's BLPOP took a connection from the pool and gave it back for every order, and the
    pool's get and release were a third of the wait's CPU (issue 39's profile). The kept one is
    made ready as the pool makes its own: connected, without unread data or a hang-up, and of
    the pool's server still (Sentinel's pool owns only connections to its current master). A
    wait inside a wait (a signal handler's) or a client-side cache takes one from the pool."""
    kept = _kept
    if getattr(pool, "cache", None) is not None:
        return pool.get_connection(), False
    kept.own()
    held = kept.waits.get(pool)
    if held is None:
        held = kept.waits[pool] = [_new_connection(pool), False, False]
    if held[1]:
        return pool.get_connection(), False
    conn = held[0]
    held[1] = True  # busy until end_wait (an interrupt between here and the try: on the pool's from then on)
    try:
        owns = getattr(pool, "owns_connection", None)
        if held[2] or (owns is not None and not owns(conn)):
            conn.disconnect()  # dirty: a wait or a connect that was cut short, in whatever state it left
        held[2] = True
        conn.connect()
        try:
            if conn.can_read():
                raise RedisConnectionError("Connection has data")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise RedisConnectionError("Connection not ready") from None
    except BaseException:
        held[1] = False
        raise
    return conn, True


def end_wait(pool: Any, conn: Any, kept: bool, *, clean: bool) -> None:
    """Give back a `wait_connection`: hung up first unless its last reply was read (`clean`)."""
    held = _kept.waits.get(pool) if kept else None
    try:
        if not clean:
            conn.disconnect()
        elif held is not None and held[0] is conn:
            held[2] = False  # its last reply was read: nothing to drop before the next wait
    finally:  # even if interrupted: a connection never given back is lost to its pool
        if not kept:
            pool.release(conn)
        elif held is not None and held[0] is conn:
            held[1] = False
