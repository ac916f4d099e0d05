"""Fixtures shared by the backend test modules."""

from __future__ import annotations

import shutil

import pytest

from loadtest.servers.zookeeper import ZooKeeperProcess
from locks.backends import reset


@pytest.fixture(scope="module")
def zookeeper():
    """A private standalone ZooKeeper for one test module (stopped by pid at its end)."""
    server = ZooKeeperProcess()
    server.start()
    yield server
    reset()
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)
