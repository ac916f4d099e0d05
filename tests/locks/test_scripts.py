"""Scripts on a pipeline: one round trip, and a server that forgot them (restart, SCRIPT FLUSH)."""

from __future__ import annotations

import pytest

from loadtest.servers.base import RedisProcess
from locks.scripts import execute_pipeline, queue_script


@pytest.fixture
def private_redis():
    server = RedisProcess()
    server.start()
    yield server
    server.stop()


def test_a_flushed_script_is_loaded_and_only_its_calls_are_sent_again(private_redis):
    client = private_redis.client()
    client.script_flush()
    pipe = client.pipeline(transaction=False)
    pipe.incr("counter")  # not a script: must run once
    queue_script(pipe, "check", keys=["lock:x"], args=["token"])
    queue_script(pipe, "check", keys=["lock:y"], args=["token"])
    results = execute_pipeline(client, pipe)
    assert results[0] == 1 and len(results) == 3
    assert [int(r) for r in results[1:]] == [0, 0]  # nobody holds lock:x or lock:y
    assert int(client.get("counter")) == 1


def test_no_script_exists_round_trip_before_a_pipeline(private_redis):
    """redis-py's Script on a pipeline sends SCRIPT EXISTS before each execute; ours does not."""
    client = private_redis.client()
    pipe = client.pipeline(transaction=False)
    queue_script(pipe, "check", keys=["lock:x"], args=["token"])
    execute_pipeline(client, pipe)  # loads it (NOSCRIPT the first time)
    client.config_resetstat()
    for _ in range(3):
        pipe = client.pipeline(transaction=False)
        queue_script(pipe, "check", keys=["lock:x"], args=["token"])
        execute_pipeline(client, pipe)
    stats = client.info("commandstats")
    assert "cmdstat_script|exists" not in stats and "cmdstat_script" not in stats
    assert stats["cmdstat_evalsha"]["calls"] == 3
