"""A private standalone ZooKeeper (Debian's `zookeeper` package) for tests: its own port,
zoo.cfg and data dir; started with java directly (no zkServer.sh, no systemd).

A restart keeps the data dir, so it is a restart of the same server: its sessions (and their
ephemeral nodes) survive if the clients reconnect within their session timeout.
"""

from __future__ import annotations

import os
import socket

from loadtest.servers.base import ServerProcess, executable

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
# The jar's manifest carries the rest of the class path; slf4j-simple gives it a logger.
CLASSPATH = f"{ZOOKEEPER_JAR}:/usr/share/java/slf4j-simple.jar"


def four_letter_word(port: int, word: str = "ruok", *, timeout: float = 0.5) -> str:
    """Send a ZooKeeper four-letter command ("ruok" -> "imok") and return the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def installed() -> bool:
    """Debian's zookeeper package (with Java): `./dev.sh setup test` installs it, `./dev.sh run` only
    when the settings choose LOCKS_BACKEND=zookeeper."""
    return os.path.exists(ZOOKEEPER_JAR)


class ZooKeeperProcess(ServerProcess):
    """`tick_ms` bounds the session timeouts the server grants: 2 to 20 ticks (500 ms: 1-10 s)."""

    def __init__(self, *, port: int | None = None, workdir: str | None = None, tick_ms: int = 500) -> None:
        super().__init__(port=port, workdir=workdir)
        if not installed():
            raise RuntimeError("ZooKeeper is not installed (./dev.sh setup test installs it)")
        self.tick_ms = tick_ms
        self.config = os.path.join(self.dir, "zoo.cfg")
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        with open(self.config, "w") as f:  # written at each start: the port may have moved
            f.write(f"tickTime={self.tick_ms}\n"
                    f"dataDir={os.path.join(self.dir, 'data')}\n"
                    f"clientPort={self.port}\n"
                    "clientPortAddress=127.0.0.1\n"
                    "maxClientCnxns=200\n"
                    "admin.enableServer=false\n"  # else Jetty binds 0.0.0.0:8080
                    "4lw.commands.whitelist=ruok,stat,srvr,mntr,envi,conf\n")
        return [executable("java"), "-Xmx128m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
                "-cp", CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain", self.config]

    def ready(self) -> bool:
        return four_letter_word(self.port) == "imok"
