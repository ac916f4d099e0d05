"""Where the CPU of a run goes: the client processes, the local mysqld and Redis, per order.

A 2-core machine runs the buyers, MySQL and Redis on the same CPUs, so a strategy's orders/s is
bounded by the CPU one order costs across all of them. Clients measure their own process time
(every thread); the servers are read from /proc when they run on this machine (a remote server,
or one whose /proc we may not read, is left out and reported as unknown). App servers this
process started (loadtest/appservers.py) are read by their process group: the gunicorn master,
its workers, and the workers that already exited (in the master's reaped children's time).
`--cpu-profile DIR` adds each worker's cProfile on the CPU clock, merged by the parent.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time
from pathlib import Path

from django.db import connection

from locks.connection import default_client

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SERVER_NAMES = {"mysqld": ("mariadbd", "mysqld"), "redis": ("redis-server",)}
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


def process_cpu() -> float:
    """CPU seconds (user + system, all threads) this process used so far."""
    return time.process_time()


def _proc_cpu_ms(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS  # utime, stime (all threads)


def group_cpu_ms(groups: list[int]) -> float | None:
    """CPU ms used so far by the process groups `groups` (each led by a gunicorn master started in
    a session of its own), every thread: each live member's own time, and the leader's reaped
    children's (a worker that exited and was waited for); None if no leader can be read."""
    wanted, total, leaders = set(groups), 0.0, 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) not in wanted:  # pgrp
            continue
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        if int(entry) in wanted:
            ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: its exited workers
            leaders += 1
        total += ticks * 1000 / TICKS
    return total if leaders else None


def _pids(names: tuple[str, ...], *, port: int | None = None) -> list[int]:
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            if comm not in names:
                continue
            if port is not None:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                if f":{port}" not in cmdline and f"--port {port}" not in cmdline:
                    continue
        except OSError:
            continue
        out.append(int(entry))
    return out


def _redis_port() -> int | None:
    try:
        kwargs = default_client().connection_pool.connection_kwargs
    except Exception:  # a cluster or sentinel client: no single server to read
        return None
    host = str(kwargs.get("host", ""))
    return int(kwargs.get("port", 6379)) if host in LOCAL_HOSTS else None


def server_cpu_ms(app_groups: list[int] | None = None) -> dict[str, float]:
    """CPU ms used so far by the local MySQL server and the lock service's Redis (absent if not
    local), and by the app servers of `app_groups` (process groups, `group_cpu_ms`)."""
    out: dict[str, float] = {}
    if app_groups and (app := group_cpu_ms(app_groups)) is not None:
        out["cpu_app_ms"] = app
    if str(connection.settings_dict.get("HOST") or "") in LOCAL_HOSTS:
        times = [t for pid in _pids(SERVER_NAMES["mysqld"]) if (t := _proc_cpu_ms(pid)) is not None]
        if times:
            out["cpu_mysqld_ms"] = sum(times)
    port = _redis_port()
    if port is not None:
        times = [t for pid in _pids(SERVER_NAMES["redis"], port=port) if (t := _proc_cpu_ms(pid)) is not None]
        if times:
            out["cpu_redis_ms"] = sum(times)
    return out


def per_order(*, client_cpu_s: float, server: dict[str, float], placed: int) -> dict[str, float]:
    """CPU ms per placed order (or per any count given as `placed`): clients, and each server
    that could be read (app servers, mysqld, redis)."""
    if not placed:
        return {}
    out = {"clients": client_cpu_s * 1000 / placed}
    for key, name in (("cpu_app_ms", "app"), ("cpu_mysqld_ms", "mysqld"), ("cpu_redis_ms", "redis")):
        if key in server:
            out[name] = server[key] / placed
    out["total"] = sum(out.values())
    return out


def describe(cost: dict[str, float]) -> str:
    parts = [f"{name} {cost[name]:.2f}" for name in ("clients", "app", "mysqld", "redis") if name in cost]
    missing = [name for name in ("mysqld", "redis") if name not in cost]
    text = "CPU per placed order (ms): " + ", ".join(parts) + f"; total {cost['total']:.2f}"
    return text + (f" ({' and '.join(missing)} not local: not counted)" if missing else "")


# --- cProfile in the workers ------------------------------------------------------------------
def prepare_profile_dir(directory: str) -> None:
    """Create it, and remove the profiles of an earlier run (they would be merged in)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("worker-*.prof"):
        old.unlink()


def start_profile() -> cProfile.Profile:
    profiler = cProfile.Profile(time.process_time)  # the CPU clock: waits cost nothing
    profiler.enable()
    return profiler


def save_profile(profiler: cProfile.Profile, directory: str, index: int) -> None:
    profiler.disable()
    profiler.dump_stats(str(Path(directory) / f"worker-{index}.prof"))


def merged_profile(directory: str, *, top: int = 40) -> str:
    """Every worker's profile added up, by cumulative CPU time."""
    files = sorted(Path(directory).glob("worker-*.prof"))
    if not files:
        return "(no worker profiles)"
    out = io.StringIO()
    stats = pstats.Stats(str(files[0]), stream=out)
    for f in files[1:]:
        stats.add(str(f))
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    return out.getvalue()
