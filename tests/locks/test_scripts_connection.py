"""`locks.scripts.run_command` and `wait_connection`: the lock scripts' connection and the
waits' connection, kept per thread and server, on real Redis servers. Each is the connection
of this thread only, of this process only; a call that did not end cleanly never leaves its
reply for the next; a call made inside another (a signal handler's) does not touch it; a
restarted server is reached again."""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from locks import scripts
from locks.scripts import end_wait, run_command, wait_connection

FORK = multiprocessing.get_context("fork")


def _id(client: redis.Redis) -> int:
    return int(run_command(client, "CLIENT", "ID"))


def test_a_thread_keeps_one_connection_per_server_and_threads_do_not_share_it(redis_server):
    client = redis_server.client()
    other = redis.Redis(port=redis_server.port)  # a second pool: a second kept connection
    mine = _id(client)
    assert [_id(client) for _ in range(5)] == [mine] * 5
    assert _id(other) not in (mine, None) and _id(client) == mine  # one per pool, both kept
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(_id(client)))
    thread.start()
    thread.join(10)
    assert theirs and theirs[0] != mine
    # Not taken from the pool: the pool's own connections stay free for everything else.
    assert client.connection_pool._in_use_connections == set()


def _child_id(client, queue) -> None:
    queue.put(_id(client))


def test_a_forked_child_makes_its_own_connection(redis_server):
    client = redis_server.client()
    mine = _id(client)
    queue = FORK.Queue()
    child = FORK.Process(target=_child_id, args=(client, queue))
    child.start()
    theirs = queue.get(timeout=10)
    child.join(10)
    assert theirs != mine
    assert _id(client) == mine  # the parent's still works: the child closed only its copy


def test_a_call_cut_between_its_send_and_its_reply_leaves_no_reply_for_the_next(redis_server, monkeypatch):
    client = redis_server.client()
    client.rpush("list", "stale")
    before = _id(client)

    def send_then_interrupted(conn, args):
        conn.send_command(*args)
        raise KeyboardInterrupt  # as a Ctrl-C landing after the send, before the reply is read

    with monkeypatch.context() as patched:
        patched.setattr(scripts, "_send_and_read", send_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_command(client, "LPOP", "list")
    assert client.llen("list") == 0  # the command ran; its reply was never read
    after = _id(client)  # without the drop this would read b"stale"
    assert isinstance(after, int) and after != before  # a new connection
    assert _id(client) == after


def test_a_call_from_a_signal_handler_inside_a_call_takes_its_own_connection(redis_server):
    client = redis.Redis(port=redis_server.port, retry=Retry(NoBackoff(), 0))  # no retry hides a cut call
    kept = _id(client)
    pushed = []

    def handler(signum, frame):
        pushed.append(run_command(client, "RPUSH", "wake", "from-handler"))

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = time.monotonic()
        reply = run_command(client, "BLPOP", "wake", "3")  # the handler's RPUSH wakes it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert pushed == [1]
    assert reply == [b"wake", b"from-handler"] and time.monotonic() - started < 2
    assert _id(client) == kept  # the handler's call did not touch the kept connection


def test_a_restarted_server_is_reached_again(redis_server):
    client = redis.Redis(port=redis_server.port, retry=Retry(NoBackoff(), 0))  # fail at once, as our pools do
    assert run_command(client, "SET", "k", "1")
    redis_server.stop()
    with pytest.raises(RedisConnectionError):
        run_command(client, "GET", "k")
    redis_server.start()
    assert run_command(client, "SET", "k", "2") and run_command(client, "GET", "k") == b"2"


def test_a_cluster_pipeline_or_single_connection_client_goes_through_redis_py(redis_server):
    single = redis.Redis(port=redis_server.port, single_connection_client=True)
    assert run_command(single, "CLIENT", "ID") == single.client_id()
    pipe = redis_server.client().pipeline()
    run_command(pipe, "SET", "p", "1")  # queued, as pipe.execute_command does
    assert pipe.execute() == [True]


def _wait_id(pool) -> tuple[int, bool]:
    conn, kept = wait_connection(pool)
    conn.send_command("CLIENT", "ID")
    got = int(conn.read_response())
    end_wait(pool, conn, kept, clean=True)
    return got, kept


def test_a_thread_keeps_one_wait_connection_per_server_beside_the_scripts_one(redis_server):
    client = redis_server.client()
    pool = client.connection_pool
    mine, kept = _wait_id(pool)
    assert kept and [_wait_id(pool) for _ in range(3)] == [(mine, True)] * 3
    assert _id(client) != mine  # the scripts' own: a wait's BLPOP stays in flight while they run
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(_wait_id(pool)))
    thread.start()
    thread.join(10)
    assert theirs and theirs[0][0] != mine
    assert pool._in_use_connections == set() and len(pool._available_connections) == 0  # none from the pool


def test_a_wait_inside_a_wait_takes_a_connection_of_the_pool(redis_server):
    pool = redis_server.client().connection_pool
    outer, kept = wait_connection(pool)
    inner, inner_kept = wait_connection(pool)  # a signal handler's, while the outer BLPOP is in flight
    assert kept and not inner_kept and inner is not outer and pool._in_use_connections == {inner}
    end_wait(pool, inner, inner_kept, clean=True)
    end_wait(pool, outer, kept, clean=True)
    assert pool._in_use_connections == set() and wait_connection(pool) == (outer, True)


def test_a_wait_given_up_hangs_up_its_blpop_and_the_next_wait_starts_clean(redis_server):
    client = redis_server.client()
    pool = client.connection_pool
    conn, kept = wait_connection(pool)
    conn.send_command("BLPOP", "signal", "30")
    end_wait(pool, conn, kept, clean=False)  # stopped waiting without its answer
    deadline = time.monotonic() + 5
    while client.client_list(_type="normal") and any(c["cmd"] == "blpop" for c in client.client_list()):
        assert time.monotonic() < deadline, "the abandoned BLPOP is still blocked on the server"
        time.sleep(0.01)
    client.rpush("signal", "for someone else")
    assert client.lrange("signal", 0, -1) == [b"for someone else"]  # nobody popped it
    assert _wait_id(pool)[1]


def test_a_kept_wait_connection_with_unread_data_or_a_dead_server_is_made_again(redis_server):
    pool = redis.Redis(port=redis_server.port, retry=Retry(NoBackoff(), 0)).connection_pool
    first, _ = _wait_id(pool)
    conn, kept = wait_connection(pool)
    conn.send_command("PING")  # a reply left unread, as a buggy caller would leave it
    time.sleep(0.05)
    end_wait(pool, conn, kept, clean=True)
    second, kept = _wait_id(pool)  # without the check this would read b"PONG" as the id
    assert kept and second != first
    redis_server.stop()
    redis_server.start()
    third, kept = _wait_id(pool)  # the hang-up is seen before the send, as the pool sees it
    assert kept and third != second


def test_a_wait_connection_its_pool_no_longer_owns_is_made_again(redis_server, monkeypatch):
    """Sentinel's pool owns only connections to its current master: after a failover the kept
    connection must not BLPOP on the old one, where no hand-off will ever come."""
    pool = redis_server.client().connection_pool
    first, _ = _wait_id(pool)
    monkeypatch.setattr(pool, "owns_connection", lambda conn: False)
    second, kept = _wait_id(pool)
    assert kept and second != first


def _child_wait_id(pool, queue) -> None:
    queue.put(_wait_id(pool))


def test_a_forked_child_makes_its_own_wait_connection(redis_server):
    pool = redis_server.client().connection_pool
    mine, _ = _wait_id(pool)
    queue = FORK.Queue()
    child = FORK.Process(target=_child_wait_id, args=(pool, queue))
    child.start()
    theirs = queue.get(timeout=10)
    child.join(10)
    assert theirs[1] and theirs[0] != mine
    assert _wait_id(pool) == (mine, True)  # the parent's still works: the child closed only its copy
