"""One server process: started on a free port, stopped by pid (and waited for), frozen, resumed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(ready: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll `ready` until true; the seconds it took. RuntimeError naming `what` on timeout."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if ready():
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{what} not ready after {timeout:g}s")
        time.sleep(interval)


def executable(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (./dev.sh setup test installs it)")
    return path


class ServerProcess:
    """A child process we own. `stop()` kills it by pid and waits until it has exited, so the
    port is free for a restart ("Address already in use" otherwise)."""

    def __init__(self, *, port: int | None = None, workdir: str | None = None) -> None:
        self.port = port or free_port()
        self.dir = workdir or tempfile.mkdtemp(prefix="lockserver-")
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, *, timeout: float = 20.0) -> float:
        """Start and wait until it answers; the seconds that took."""
        log = open(os.path.join(self.dir, f"server-{self.port}.log"), "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        log.close()
        return wait_for(self.ready, timeout=timeout, what=f"{type(self).__name__} on port {self.port}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Kill by pid and wait for the exit (SIGKILL by default: a crash, nothing flushed)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        self.proc = None

    kill = stop

    def freeze(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, but nothing answers."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, *, timeout: float = 20.0) -> float:
        self.stop()
        return self.start(timeout=timeout)


class RedisProcess(ServerProcess):
    """A redis-server without persistence (it restarts empty). `args`: extra config flags."""

    def __init__(self, *, port: int | None = None, workdir: str | None = None, args: list[str] = ()) -> None:
        super().__init__(port=port, workdir=workdir)
        self.args = list(args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [executable("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--dbfilename", f"r{self.port}.rdb",
                "--repl-diskless-sync-delay", "0", *self.args]

    def client(self, **kwargs):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs.setdefault("socket_timeout", 0.5)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def ready(self) -> bool:
        return bool(self.client(socket_timeout=0.2).ping())
