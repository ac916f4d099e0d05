"""`loadtest --compare-http`'s own claims, apart from a run (tests/loadtest/commands/test_loadtest.py
runs it): the servers it starts are the shipped ones, and an app server's CPU is read whole."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest import appservers, cpu

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_workers_and_threads_are_the_images():
    """--compare-http's default servers run what the image runs: its CMD's workers and threads
    defaults, and gunicorn.conf.py's own default threads."""
    cmd = (ROOT / "Dockerfile").read_text()
    assert f"--workers ${{WEB_WORKERS:-{appservers.SHIPPED_WORKERS}}}" in cmd
    assert f"--threads ${{WEB_THREADS:-{appservers.SHIPPED_THREADS}}}" in cmd
    conf = (ROOT / "config" / "gunicorn.conf.py").read_text()
    assert re.search(rf'threads = int\(os\.environ\.get\("WEB_THREADS", "{appservers.SHIPPED_THREADS}"\)\)', conf)
    server = appservers.AppServer(workers=appservers.SHIPPED_WORKERS, threads=appservers.SHIPPED_THREADS)
    command = server.command()
    assert command[command.index("-c") + 1].endswith("config/gunicorn.conf.py")


BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
# A group leader whose child burns 0.3 s of CPU and exits (reaped: its time moves to the leader's
# cutime), then another that burns and keeps running, then the leader waits.
LEADER = f"""
import subprocess, sys, time
subprocess.run([sys.executable, "-c", {BURN!r}], check=True)
live = subprocess.Popen([sys.executable, "-c", {BURN!r} + "time.sleep(30)"])
print("ready", flush=True)
time.sleep(30)
"""


def test_an_app_servers_cpu_counts_its_live_and_its_exited_workers():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20  # the live child's burn, on a busy machine
        while (used := cpu.group_cpu_ms([leader.pid]) or 0.0) < 550 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert used >= 550, used  # 2 x 300 ms, less a clock tick or two
        assert used < 2000, used  # and not counted twice
        assert cpu.server_cpu_ms([leader.pid])["cpu_app_ms"] >= used
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    assert cpu.group_cpu_ms([leader.pid]) is None  # gone: nothing to read
    assert "cpu_app_ms" not in cpu.server_cpu_ms([leader.pid])
