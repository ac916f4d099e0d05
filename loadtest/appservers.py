"""Several gunicorn app servers sharing one database and one coordination service.

The servers run what production runs (`gunicorn -c config/gunicorn.conf.py -w W --threads T config.wsgi`: the
shop's worker, which answers what it cannot serve in time `busy`; DEBUG off, rate
limits off as in docs/bench_http_combining.sh), each on a free port, each started with the
environment of *this* process's settings: the same database (in a test: the test database),
the same Redis aliases, the same lock key prefix and lock backend. So the harness that starts
them reads and cleans the very rows and keys the servers write. `env` overrides any of it (a
scenario runs the servers on a private lock service: LOCKS_BACKEND, LOCKS_REDIS_URL, ...).

Stopping is by pid: `stop()` is SIGTERM to the master (it stops its workers) and a wait;
`kill()` is SIGKILL of the whole process group, master and workers at once, mid-request: a
crashed machine as far as the clients and the lock service can tell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from loadtest.servers.base import ServerProcess

# The shipped server's workers and threads: the image's defaults (Dockerfile: `--workers
# ${WEB_WORKERS:-4} --threads ${WEB_THREADS:-16}`; gunicorn.conf.py's threads default too).
SHIPPED_WORKERS = 4
SHIPPED_THREADS = 16


def database_url() -> str:
    """This process's database as a DATABASE_URL (inside a test: the test database)."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "root", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"mysql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}/{db['NAME']}"


def server_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an app server: ours, pinned to the settings this process runs with."""
    locks_conf = settings.LOCKS
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.CACHES["default"]["LOCATION"],
        "LOCKS_REDIS_URL": settings.CACHES[locks_conf.get("CACHE_ALIAS", "locks")]["LOCATION"],
        "LOCKS_KEY_PREFIX": locks_conf.get("KEY_PREFIX", ""),
        "LOCKS_BACKEND": locks_conf.get("BACKEND", "redis"),
        "LOCKS_ZOOKEEPER_HOSTS": locks_conf.get("ZOOKEEPER_HOSTS", "127.0.0.1:2181"),
        "SECRET_KEY": settings.SECRET_KEY,
        "SHOP_COMBINING": "true" if getattr(settings, "SHOP", {}).get("COMBINING", True) else "false",
        "DEBUG": "false",
        "RATELIMIT_ENABLE": "false",
        "SHOP_MAX_UNPAID_ORDERS": "off",  # load-test buyers never pay: no hoarding limit for them
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(settings.BASE_DIR),
    }
    if locks_conf.get("ZOOKEEPER_AUTH"):
        env["LOCKS_ZOOKEEPER_AUTH"] = locks_conf["ZOOKEEPER_AUTH"]
    if locks_conf.get("REDLOCK_URLS"):
        env["LOCKS_REDLOCK_URLS"] = ",".join(locks_conf["REDLOCK_URLS"])
    for key in ("ZOOKEEPER_SESSION_TIMEOUT", "DEFAULT_TTL", "DEFAULT_WAIT"):
        if locks_conf.get(key) is not None:
            env[f"LOCKS_{key}"] = str(locks_conf[key])
    env.update(overrides or {})
    return env


class AppServer(ServerProcess):
    """One gunicorn (master + W workers x T threads) on a free port of 127.0.0.1."""

    def __init__(self, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None,
                 port: int | None = None, workdir: str | None = None) -> None:
        super().__init__(port=port, workdir=workdir or tempfile.mkdtemp(prefix="appserver-"))
        self.workers, self.threads = workers, threads
        self.killed_at: float | None = None  # time.monotonic() of the last kill()
        self.env = server_env(env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, f"server-{self.port}.log")

    def command(self) -> list[str]:
        # `python -m gunicorn`: the venv's gunicorn script may point into another checkout.
        # The shipped configuration (config/gunicorn.conf.py: the shop's worker, metrics), as the image runs it.
        return [sys.executable, "-m", "gunicorn", "-c", str(settings.BASE_DIR / "config/gunicorn.conf.py"),
                "-w", str(self.workers), "--threads", str(self.threads),
                "-b", f"127.0.0.1:{self.port}", "--chdir", str(settings.BASE_DIR), "--log-level", "warning",
                "--graceful-timeout", "10", "config.wsgi"]

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/api/products/", timeout=2) as response:
            return response.status == 200

    def start(self, *, timeout: float = 60.0) -> float:
        """Start in a session of its own (its process group: `kill()` reaches the workers too) and
        wait until it answers; the seconds that took."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     env=self.env, start_new_session=True)
        log.close()
        try:
            return self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float) -> float:
        """Poll until it answers; a server that exits meanwhile (a settings error) fails at once."""
        started = time.monotonic()
        while True:
            if not self.running:
                raise RuntimeError(f"gunicorn on port {self.port} exited at start; see {self.log_path}")
            with contextlib.suppress(OSError):
                if self.ready():
                    return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"gunicorn on port {self.port} not ready after {timeout:g}s; see {self.log_path}")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, *, timeout: float = 30.0) -> None:
        """SIGTERM the master (it finishes its workers' requests and stops them), wait for it; a
        server that outlives `timeout` is killed."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the master and every worker (its process group), wait until all are gone."""
        if self.proc is None:
            return
        group = self.proc.pid  # start_new_session: the master leads the group its workers inherit
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self.killed_at = time.monotonic()
        self.proc.wait(timeout=30)
        self.proc = None
        # The workers were the master's children: orphans now, reaped by init (here about once a
        # second). Wait until none of the group still runs: a zombie holds no socket, no lock.
        deadline = time.monotonic() + 10
        while _group_running(group) and time.monotonic() < deadline:
            time.sleep(0.01)

    def restart(self, *, timeout: float = 60.0) -> float:
        self.stop()
        return self.start(timeout=timeout)


def _group_running(group: int) -> bool:
    """Whether a process of this process group is still alive (not a zombie); Linux /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


class AppServers:
    """N app servers started together (in parallel: each takes a second or two to import Django)."""

    def __init__(self, count: int, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None) -> None:
        if count < 1:
            raise ValueError("at least one app server")
        self.servers = [AppServer(workers=workers, threads=threads, env=env) for _ in range(count)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def groups(self) -> list[int]:
        """The running servers' process groups (each master's pid: it leads its workers' group)."""
        return [s.proc.pid for s in self.servers if s.proc is not None]

    def __getitem__(self, index: int) -> AppServer:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)

    def start(self, *, timeout: float = 60.0) -> None:
        for server in self.servers:
            log = open(server.log_path, "ab")  # noqa: SIM115 - the child keeps it
            server.proc = subprocess.Popen(server.command(), stdout=log, stderr=subprocess.STDOUT, cwd=server.dir,
                                           env=server.env, start_new_session=True)
            log.close()
        try:
            for server in self.servers:
                server.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        """SIGTERM every master at once, then wait for each (a graceful shutdown of all)."""
        for server in self.servers:
            if server.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.proc.pid, signal.SIGTERM)
        for server in self.servers:
            server.stop()

    def kill(self) -> None:
        for server in self.servers:
            server.kill()

    def logs(self, tail: int = 20) -> str:
        """The last lines of every server's log (for a failure message)."""
        out = []
        for server in self.servers:
            with contextlib.suppress(OSError), open(server.log_path, errors="replace") as f:
                lines = f.read().splitlines()[-tail:]
                out.append(f"--- {server.url} ({server.log_path})\n" + "\n".join(lines))
        return "\n".join(out)


@contextlib.contextmanager
def running(count: int, *, workers: int = 2, threads: int = 4,
            env: dict[str, str] | None = None) -> Iterator[AppServers]:
    """`with running(3) as servers:` N servers answering; stopped (SIGTERM, then SIGKILL) after."""
    servers = AppServers(count, workers=workers, threads=threads, env=env)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()
