"""The private servers the fault tests start: ports nobody else can take, failures that say why."""

from __future__ import annotations

import socket
import time

import pytest

from loadtest.servers.base import RedisProcess, ephemeral_ports, free_port


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    """A client's own end of a connection gets an ephemeral port; a server port inside that range
    can be taken by any connection between `free_port()` and the bind, or while a killed server
    is down for its restart (CI lost a cluster node that way: 'not ready after 30s')."""
    low, high = ephemeral_ports()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]


def test_a_server_that_cannot_bind_fails_at_once_and_says_why():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = RedisProcess(port=taken.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="exited") as raised:
            server.start(timeout=20)
        assert time.monotonic() - started < 5
        assert "in use" in str(raised.value)  # the tail of its log


def test_a_server_on_a_chosen_port_that_is_taken_moves_to_another():
    server = RedisProcess()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        server.start(timeout=20)
        try:
            assert server.port != taken.getsockname()[1]
            assert server.client().ping()
        finally:
            server.stop()
