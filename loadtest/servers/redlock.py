"""N independent Redis masters for the Redlock backend (tests, `manage.py lockbench --redlock-servers`).

Each is a `RedisProcess` on a free port without persistence: `restart(i)` brings master i back
EMPTY, the case the Redlock fence must survive.
"""

from __future__ import annotations

import contextlib
import shutil

from loadtest.servers.base import RedisProcess


class RedlockServers:
    def __init__(self, n: int = 5) -> None:
        if n < 1:
            raise ValueError("Redlock needs at least one master")
        self.masters = [RedisProcess() for _ in range(n)]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.masters]

    def start(self) -> RedlockServers:
        try:
            for master in self.masters:
                master.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every master and remove its scratch directory."""
        for master in self.masters:
            with contextlib.suppress(Exception):
                master.stop()
            shutil.rmtree(master.dir, ignore_errors=True)

    def kill(self, i: int) -> None:
        """SIGKILL master i (and wait until it has exited)."""
        self.masters[i].kill()

    def restart(self, i: int) -> None:
        """Kill master i if it runs, and start it again, empty, on the same port."""
        self.masters[i].restart()

    def restore(self) -> None:
        """Start every master that is not running (after a fault test); resume frozen ones."""
        for master in self.masters:
            if master.running:
                master.resume()
            else:
                master.start()

    def __enter__(self) -> RedlockServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
