"""A private Redis Sentinel set: a master, a replica and three sentinels, each on a free port.

Fast failover for tests (down-after 1000 ms, failover-timeout 3000 ms, diskless sync at once):
a SIGKILLed master is replaced in about 2.3 s (docs/scaleout.md).
Sentinels rewrite their config files, so each start writes fresh ones. The master's name is
unique per set (`shop<master port>`): django-redis caches Sentinel pools by that name, so two
sets in one process must not share it.

    with SentinelSet() as s:            # or s.start() / s.stop()
        s.url                           # redis+sentinel://127.0.0.1:p1,.../shop<port>/0
        started = s.kill_master()       # SIGKILL of whichever process is the master now
        s.wait_for_failover()           # seconds from the kill until a replica is master
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

from loadtest.servers.base import RedisProcess, ServerProcess, executable, free_port, wait_for

DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class SentinelProcess(ServerProcess):
    """`redis-server <conf> --sentinel` (there is no redis-sentinel binary on our machines)."""

    def __init__(self, *, service: str, master_port: int, workdir: str) -> None:
        super().__init__(workdir=workdir)
        self.service = service
        self.master_port = master_port

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, f"sentinel-{self.port}.conf")

    def command(self) -> list[str]:
        with open(self.conf, "w") as f:  # fresh every start: a sentinel rewrites its file
            f.write(f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {self.service} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {self.service} 1\n")
        return [executable("redis-server"), self.conf, "--sentinel"]

    def client(self, **kwargs):
        return RedisProcess.client(self, **kwargs)  # same knobs: short timeout, no retry

    def ready(self) -> bool:
        return bool(self.client(socket_timeout=0.2).ping())


class SentinelSet:
    """Master + replica + 3 sentinels. `redis` lists the two data nodes (either may be master)."""

    def __init__(self, *, replicas: int = 1) -> None:
        self.dir = tempfile.mkdtemp(prefix="sentinel-")
        # A port of its own that never moves: the replicas and sentinels are told it now.
        self.master = RedisProcess(port=free_port(), workdir=self.dir)
        self.service = f"shop{self.master.port}"
        self.replicas = [RedisProcess(workdir=self.dir, args=["--replicaof", "127.0.0.1", str(self.master.port)])
                         for _ in range(replicas)]
        self.redis = [self.master, *self.replicas]
        self.sentinels = [SentinelProcess(service=self.service, master_port=self.master.port, workdir=self.dir)
                          for _ in range(3)]
        self.killed_at: float | None = None
        self.killed_port: int | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, *, timeout: float = 20.0) -> float:
        """Start everything and wait until the replica is in sync and every sentinel knows the
        replica and the other sentinels (failover needs all of that); the seconds it took."""
        started = time.monotonic()
        os.makedirs(self.dir, exist_ok=True)
        for server in (*self.redis, *self.sentinels):
            server.start(timeout=timeout)
        for replica in self.replicas:
            wait_for(lambda r=replica: r.client().info("replication")["master_link_status"] == "up",
                     timeout=timeout, what="replica link")

        def sentinels_ready() -> bool:
            for s in self.sentinels:
                info = s.client().execute_command("SENTINEL", "MASTER", self.service)
                info = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(info, list) else info
                info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
                if int(info["num-other-sentinels"]) < 2 or int(info["num-slaves"]) < len(self.replicas):
                    return False
            return True

        wait_for(sentinels_ready, timeout=timeout, what="sentinels")
        return time.monotonic() - started

    def stop(self) -> None:
        for server in (*self.sentinels, *self.redis):
            server.stop()
        _empty(self.dir)

    def __enter__(self) -> SentinelSet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def master_port(self) -> int:
        """The port the sentinels name as master now."""
        for s in self.sentinels:
            try:
                _host, port = s.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return int(port)
            except Exception:  # ask the next sentinel
                continue
        raise RuntimeError("no sentinel answers")

    def current_master(self) -> RedisProcess:
        port = self.master_port()
        return next(r for r in self.redis if r.port == port)

    def kill_master(self, sig: int = signal.SIGKILL) -> RedisProcess:
        """SIGKILL the current master (nothing flushed); returns it (restart it with .start())."""
        master = self.current_master()
        self.killed_port = master.port
        master.stop(sig)
        self.killed_at = time.monotonic()
        return master

    def wait_for_failover(self, *, timeout: float = 20.0) -> float:
        """Wait until the sentinels name another master and it answers as one; seconds since the kill."""
        assert self.killed_at is not None, "kill_master() first"

        def promoted() -> bool:
            port = self.master_port()
            if port == self.killed_port:
                return False
            node = next(r for r in self.redis if r.port == port)
            return node.client().info("replication")["role"] == "master"

        wait_for(promoted, timeout=timeout, what="sentinel failover", interval=0.02)
        return time.monotonic() - self.killed_at


def _empty(directory: str) -> None:
    """Remove what the servers left (logs, config files, dumps); start() makes the directory again."""
    shutil.rmtree(directory, ignore_errors=True)
