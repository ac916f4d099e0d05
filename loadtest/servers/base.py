"""One server process: started on a free port, stopped by pid (and waited for), frozen, resumed."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable

LOWEST_PORT = 20000
_handed_out: set[int] = set()


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections (Linux; IANA's elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_port() -> int:
    """A port nobody listens on, below the ephemeral range and never handed out twice by this
    process. Any outgoing connection may be given an ephemeral port as its own end, and then a
    server cannot bind it: between this call and the server's start, or while a server we killed
    is down for its restart on the same port."""
    low, high = ephemeral_ports()
    below = (LOWEST_PORT, low - 1) if low - 1 - LOWEST_PORT >= 1000 else None
    above = (high + 1, 65535) if 65535 - high >= 1000 else None
    ranges = [r for r in (below, above) if r]
    for _ in range(500 if ranges else 0):
        port = random.randint(*random.choice(ranges))
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # no room outside the ephemeral range on this machine
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    """The server process ended before it answered (its log's tail is in the message)."""


def wait_for(ready: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll `ready` until true; the seconds it took. RuntimeError naming `what` on timeout.
    `ready` may raise ServerExited to stop the wait at once."""
    started = time.monotonic()
    while True:
        try:
            if ready():
                return time.monotonic() - started
        except ServerExited:
            raise
        except Exception:  # not up yet
            pass
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
        # A port we chose may move if something took it before the first start; a given one never.
        self.movable = port is None
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
        """Start and wait until it answers; the seconds that took. ServerExited, with the log's
        tail, when the process ends first; a port we chose that was taken meanwhile moves."""
        for attempt in range(3):
            try:
                return self._start_once(timeout=timeout)
            except ServerExited as exited:
                if not (self.movable and "in use" in str(exited)) or attempt == 2:
                    raise
                self.choose_ports()
        raise AssertionError("unreachable")

    def choose_ports(self) -> None:
        """Pick new free ports (subclasses with more than one port pick them all)."""
        self.port = free_port()

    def _start_once(self, *, timeout: float) -> float:
        path = os.path.join(self.dir, f"server-{self.port}.log")
        log = open(path, "ab")  # noqa: SIM115 - the child keeps it
        proc = self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                            start_new_session=True)
        log.close()

        def ready() -> bool:
            if proc.poll() is not None:
                self.proc = None
                with open(path, "rb") as f:
                    tail = f.read()[-600:].decode(errors="replace").strip()
                raise ServerExited(f"{type(self).__name__} on port {self.port} exited ({proc.returncode}): {tail}")
            return self.ready()

        waited = wait_for(ready, timeout=timeout, what=f"{type(self).__name__} on port {self.port}")
        self.movable = False  # restarts keep the port: clients know it now
        return waited

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
