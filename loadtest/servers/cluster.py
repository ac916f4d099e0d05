"""A private Redis Cluster: 6 nodes (3 masters, 3 replicas) on free ports.

cluster-node-timeout 1000 ms: a SIGKILLed master's replica takes over in about 2-3 s. Each node
gets its cluster bus port explicitly (`--cluster-port`, a free port too) instead of the default
port + 10000, which may be taken. `stop()` removes the nodes-*.conf files: a node that finds
one refuses to join a new cluster ("Node is not empty").

    with RedisClusterSet() as c:
        c.url                             # redis+cluster://127.0.0.1:p1,.../0
        c.kill_master_of("lock:{x}")      # SIGKILL of the master owning that key's slot
        c.wait_for_failover()             # seconds from the kill until the slot is served again
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from loadtest.servers.base import RedisProcess, executable, free_port, wait_for

NODE_TIMEOUT_MS = 1000


class ClusterNodeProcess(RedisProcess):
    def __init__(self, *, workdir: str) -> None:
        super().__init__(workdir=workdir)
        self.bus_port = free_port()

    def choose_ports(self) -> None:
        super().choose_ports()
        self.bus_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--cluster-enabled", "yes",
                "--cluster-config-file", os.path.join(self.dir, f"nodes-{self.port}.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--cluster-port", str(self.bus_port)]


class RedisClusterSet:
    def __init__(self, *, masters: int = 3, replicas_per_master: int = 1) -> None:
        self.dir = tempfile.mkdtemp(prefix="cluster-")
        self.replicas_per_master = replicas_per_master
        self.nodes = [ClusterNodeProcess(workdir=self.dir) for _ in range(masters * (1 + replicas_per_master))]
        self.killed_at: float | None = None
        self.killed_slot: int | None = None
        self.killed_port: int | None = None

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def start(self, *, timeout: float = 30.0) -> float:
        """Start the nodes, create the cluster, wait until every node says cluster_state:ok."""
        started = time.monotonic()
        os.makedirs(self.dir, exist_ok=True)
        for node in self.nodes:
            node.start(timeout=timeout)
        subprocess.run([executable("redis-cli"), "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in self.nodes),
                        "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
                       check=True, capture_output=True, timeout=timeout)
        for node in self.nodes:
            wait_for(lambda n=node: b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO"),
                     timeout=timeout, what="cluster_state:ok", interval=0.05)
        # cluster_state:ok comes before the replicas have their first copy: until then a WAIT
        # for them times out, and a master killed meanwhile has no replica fit to promote.
        wait_for(self._replicas_synced, timeout=timeout, what="replicas in sync", interval=0.05)
        return time.monotonic() - started

    def _replicas_synced(self) -> bool:
        masters = replicas = 0
        for node in self.nodes:
            info = node.client().info("replication")
            if info.get("role") == "master":
                masters += 1
                online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]
                if len(online) < self.replicas_per_master:
                    return False
            else:
                replicas += 1
                if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                    return False
        return masters * self.replicas_per_master == replicas

    def stop(self) -> None:
        """Stop every node; remove the nodes-*.conf files (and the logs and dumps with them)."""
        for node in self.nodes:
            node.stop()
        _empty(self.dir)

    def __enter__(self) -> RedisClusterSet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _live(self) -> list[ClusterNodeProcess]:
        return [n for n in self.nodes if n.running]

    def owner_port(self, slot: int) -> int | None:
        """The port of the master serving `slot`, as a live node sees it (None: nobody)."""
        for node in self._live():
            try:
                for start, end, master, *_ in node.client().execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return int(master[1])
            except Exception:  # ask the next node
                continue
        return None

    def slot_of(self, key: str) -> int:
        return int(self._live()[0].client().execute_command("CLUSTER", "KEYSLOT", key))

    def kill_master_of(self, key: str, sig: int = signal.SIGKILL) -> ClusterNodeProcess:
        """SIGKILL the master that owns `key`'s slot; returns it."""
        self.killed_slot = self.slot_of(key)
        self.killed_port = self.owner_port(self.killed_slot)
        node = next(n for n in self.nodes if n.port == self.killed_port)
        node.stop(sig)
        self.killed_at = time.monotonic()
        return node

    def wait_for_failover(self, *, timeout: float = 20.0) -> float:
        """Wait until a replica serves the killed master's slot and the cluster is ok again;
        the seconds since the kill."""
        assert self.killed_at is not None and self.killed_slot is not None, "kill_master_of() first"

        def promoted() -> bool:
            port = self.owner_port(self.killed_slot)
            if port is None or port == self.killed_port:
                return False
            node = next(n for n in self.nodes if n.port == port)
            return (b"cluster_state:ok" in node.client().execute_command("CLUSTER", "INFO")
                    and node.client().info("replication")["role"] == "master")

        wait_for(promoted, timeout=timeout, what="cluster failover", interval=0.02)
        return time.monotonic() - self.killed_at


def _empty(directory: str) -> None:
    """Remove what the servers left (logs, config files, dumps); start() makes the directory again."""
    shutil.rmtree(directory, ignore_errors=True)
