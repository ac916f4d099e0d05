"""The set-up a newcomer follows: after `./dev.sh run`, the manage.py commands of the README and
docs/ work from any other shell (the development env file dev.sh writes), and dev.sh checks its
port first."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
# What a new shell lacks: none of the settings dev.sh or the test run put in the environment.
UNSET = {"DEBUG", "SECRET_KEY", "DEV_ENV_FILE", "DJANGO_SETTINGS_MODULE"}


def fresh_shell(**env: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in UNSET}, **env}


def dev_env_file(tmp_path: Path, text: str = "DEBUG=true\nSECRET_KEY=from-the-dev-file-" + "k" * 40 + "\n") -> Path:
    path = tmp_path / ".env.dev"
    path.write_text("# written by ./dev.sh\n" + text)
    return path


def settings_in(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"}, capture_output=True, text=True, timeout=60,
    )


def test_settings_read_the_development_env_file(tmp_path):
    result = settings_in(fresh_shell(DEV_ENV_FILE=str(dev_env_file(tmp_path))))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "from-the-dev-file-" + "k" * 40]


def test_the_environment_wins_over_the_development_env_file(tmp_path):
    result = settings_in(fresh_shell(DEV_ENV_FILE=str(dev_env_file(tmp_path)), DEBUG="false", SECRET_KEY="s" * 50))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "s" * 50]


def test_without_the_file_debug_stays_off_and_a_key_is_required(tmp_path):
    result = settings_in(fresh_shell(DEV_ENV_FILE=str(tmp_path / "absent")))
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY" in result.stderr


def test_the_file_dev_sh_writes_is_the_one_settings_read_and_it_is_never_shipped():
    from django.conf import settings

    written = re.search(r"^dev_env_file=(\S+)$", (ROOT / "dev.sh").read_text(), re.M)
    assert written, "dev.sh names its env file in dev_env_file="
    name = written.group(1)
    assert str(ROOT / name) == settings.DEFAULT_DEV_ENV_FILE
    for ignore in (".gitignore", ".dockerignore"):
        assert name in (ROOT / ignore).read_text().split(), f"{name} is not in {ignore}"


def test_manage_py_help_lists_the_project_commands_from_a_fresh_shell(tmp_path):
    env = fresh_shell(DEV_ENV_FILE=str(dev_env_file(tmp_path)))
    result = subprocess.run([sys.executable, "manage.py", "help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "only Django core commands are listed" not in result.stdout + result.stderr
    listed = set(result.stdout.split())
    for command in ("apitoken", "coupon_storm", "loadtest", "backendbench", "seed_demo", "locks", "run_jobs", "shop"):
        assert command in listed, result.stdout


# The documents whose shell blocks a reader copies: the README and every page of docs/.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[list[str]]:
    """Every `manage.py ...` line in the shell blocks of the README and docs/, as the arguments
    after manage.py; an optional argument written `[--profile]` is parsed as given."""
    text = "\n".join(path.read_text() for path in DOCUMENTS)
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            for match in re.finditer(r"manage\.py\s+([^)#\n]*)", line):
                commands.append([re.sub(r"^\[(-.*)\]$", r"\1", arg) for arg in shlex.split(match.group(1))])
    return commands


def test_the_documents_show_manage_py_commands():
    names = {args[0] for args in documented_commands()}
    assert {"apitoken", "locks", "loadtest", "coupon_storm", "backendbench"} <= names, names


@pytest.mark.parametrize("args", documented_commands(), ids=shlex.join)
def test_every_manage_py_command_in_the_documents_parses(args):
    """The documents' commands exist and take the arguments shown (the parser of each command)."""
    name, *rest = args
    app = get_commands().get(name)
    assert app is not None, f"the README or docs/ show `manage.py {name}`, which does not exist"
    parser = load_command_class(app, name).create_parser("manage.py", name)
    parser.parse_args(rest)  # CommandError on an unknown or malformed argument


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def dev_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["./dev.sh", *args], cwd=ROOT, env=fresh_shell(**env), capture_output=True, text=True,
                          timeout=60)


def test_dev_sh_run_refuses_a_busy_port_before_setting_up_or_serving(busy_port):
    result = dev_sh("run", PORT=str(busy_port))
    assert result.returncode == 1
    assert f"port {busy_port}" in result.stderr and "PORT=" in result.stderr, result.stderr
    assert "serving on" not in result.stderr + result.stdout
    assert "==>" not in result.stderr, "it set things up before checking the port"


@pytest.mark.parametrize("port", ["abc", "0", "70000"])
def test_dev_sh_run_refuses_a_port_that_is_not_one(port):
    result = dev_sh("run", PORT=port)
    assert result.returncode == 2
    assert "PORT=" in result.stderr and "serving on" not in result.stderr, result.stderr


# --- issue 37: two checkouts on one machine shared the database `shop` and Redis db 0, silently ---
def _checkout(parent: Path) -> Path:
    """A copy of dev.sh where a clone would have it (a fresh clone: no .env.dev)."""
    parent.mkdir(parents=True)
    (parent / "dev.sh").write_bytes((ROOT / "dev.sh").read_bytes())
    (parent / "dev.sh").chmod(0o755)
    return parent


def _where(checkout: Path, **env: str) -> subprocess.CompletedProcess:
    shell = {k: v for k, v in fresh_shell(**env).items() if k not in {"DATABASE_URL", "REDIS_URL"} or k in env}
    return subprocess.run(["./dev.sh", "where"], cwd=checkout, env=shell, capture_output=True, text=True, timeout=60)


def test_each_checkout_gets_its_own_database_and_redis_db_and_dev_sh_says_which(tmp_path):
    one, two = _checkout(tmp_path / "a" / "shop"), _checkout(tmp_path / "b" / "shop")
    said = {}
    for checkout in (one, two):
        first = _where(checkout)
        assert first.returncode == 0, first.stderr
        written = (checkout / ".env.dev").read_text()
        db = re.search(r"^DATABASE_URL=mysql://root@127\.0\.0\.1:3306/(shop_shop_[0-9a-f]{6})$", written, re.M)
        redis = re.search(r"^REDIS_URL=redis://127\.0\.0\.1:6379/(\d+)$", written, re.M)
        assert db and redis and 1 <= int(redis.group(1)) <= 15, written
        assert f"the database {db.group(1)} and Redis redis://127.0.0.1:6379/{redis.group(1)}" in first.stderr
        again = _where(checkout)  # idempotent: the same file, the same answer
        assert (checkout / ".env.dev").read_text() == written and again.stderr.splitlines()[-1] == \
            first.stderr.splitlines()[-1]
        said[checkout] = (db.group(1), redis.group(1))
    assert said[one][0] != said[two][0]  # same folder name, two checkouts: two databases

    # A file from before (no DATABASE_URL): kept as it is, and dev.sh says it is the shared default.
    old = _checkout(tmp_path / "c" / "shop")
    (old / ".env.dev").write_text("DEBUG=true\nSECRET_KEY=" + "k" * 50 + "\n")
    shared = _where(old)
    assert "the database shop and Redis redis://127.0.0.1:6379/0" in shared.stderr
    assert "shared by every checkout" in shared.stderr and "DATABASE_URL=mysql://" in shared.stderr
    assert "DATABASE_URL" not in (old / ".env.dev").read_text()
    # The environment wins, as in the settings.
    mine = _where(one, DATABASE_URL="mysql://root@127.0.0.1:3306/elsewhere")
    assert "the database elsewhere and Redis" in mine.stderr
