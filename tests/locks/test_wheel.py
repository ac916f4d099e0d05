"""The locks app installs on its own: a wheel built from this repository holds the `locks` package
and nothing else (its Lua scripts, templates, static files and migrations included), and the
backend contract's tests for the plain Redis backend pass against that wheel installed into a
fresh virtualenv, in a minimal Django project outside the repository, with neither the shop nor
the load tests importable and the repository off sys.path.

pip reaches PyPI for the build backend (setuptools) and the pinned Django, django-redis, redis,
prometheus-client and pytest; its cache makes later runs quick.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import redis

from tests.locks.backends import contract

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "tests" / "locks" / "backends" / "contract.py"
# The contract's tests that need more than the locks app: the shop's checkout, or the admin with a database.
NEEDS_THE_PROJECT = ("test_contract_the_checkout_never_oversells_on_this_backend",
                     "test_contract_the_dashboard_and_the_locks_command_show_the_holder")
# What the wheel's venv gets besides the wheel: the locks app's dependencies and the test runner, as pinned here.
PINNED = {"requirements.txt": ("django", "django-redis", "redis", "prometheus-client"),
          "requirements-dev.txt": ("pytest",)}
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".env*",
                                     "test-artifacts", "staticfiles", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                                     ".hypothesis")

SETTINGS = '''\
import os

SECRET_KEY = "wheel-test-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "locks"]
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": os.environ["WHEEL_TEST_REDIS_URL"]}}
LOCKS = {"KEY_PREFIX": os.environ["WHEEL_TEST_PREFIX"], "CACHE_ALIAS": "default"}
'''

CONFTEST = '''\
import uuid

import django
import pytest

django.setup()


@pytest.fixture
def name():
    return f"t:x{uuid.uuid4().hex[:12]}"
'''

TESTS = f'''\
import importlib.util
import os
import sys

import pytest

import contract
import locks
from locks.backends import get_backend

NEEDS_THE_PROJECT = {NEEDS_THE_PROJECT!r}
globals().update({{n: getattr(contract, n) for n in contract.__all__ if n not in NEEDS_THE_PROJECT}})


@pytest.fixture
def backend():
    backend = get_backend()
    assert backend.name == "redis" and backend.supports_combining
    return backend


def test_locks_comes_from_the_wheel_and_the_project_is_not_there():
    assert locks.__file__.startswith(sys.prefix), locks.__file__
    assert sys.prefix != sys.base_prefix  # the fresh virtualenv
    for package in ("shop", "loadtest", "tests"):
        assert importlib.util.find_spec(package) is None, package
    repo = os.environ["WHEEL_TEST_REPO"]
    assert not [p for p in sys.path if p and os.path.realpath(p).startswith(repo)], sys.path
'''


def _pins() -> list[str]:
    pins = []
    for filename, names in PINNED.items():
        for line in (ROOT / filename).read_text().splitlines():
            match = re.match(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?==(\S+)", line.strip())
            if match and match.group(1).lower() in names:
                pins.append(f"{match.group(1)}=={match.group(3)}")  # extras (hiredis) left out
    assert len(pins) == sum(len(n) for n in PINNED.values()), pins
    return pins


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
    return result


def _build_wheel(tmp_path: Path) -> Path:
    """`pip wheel --no-deps .` on a copy of the repository (an in-tree build leaves build/ and
    *.egg-info behind, and two runs would share them)."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
          "-w", str(tmp_path / "dist"), str(source)])
    [wheel] = (tmp_path / "dist").glob("*.whl")
    return wheel


def _assert_holds_locks_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"locks"}, tops
    data = [p for p in (ROOT / "locks").rglob("*") if p.is_file() and p.suffix in {".lua", ".html", ".js", ".css"}]
    assert any(p.suffix == ".lua" for p in data)
    migrations = list((ROOT / "locks" / "migrations").glob("*.py"))
    wanted = {p.relative_to(ROOT).as_posix() for p in data + migrations}
    assert wanted - names == set(), f"missing from the wheel: {sorted(wanted - names)}"


@pytest.mark.services  # the contract runs against Redis, in a subprocess
def test_the_wheel_holds_the_locks_app_alone_and_passes_the_redis_contract_installed(tmp_path):
    wheel = _build_wheel(tmp_path)
    _assert_holds_locks_only(wheel)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check", "-q",
          str(wheel), *_pins()])

    project = tmp_path / "project"  # a Django project of its own, outside the repository
    project.mkdir()
    shutil.copy(CONTRACT, project / "contract.py")
    (project / "wheel_settings.py").write_text(SETTINGS)
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_redis_contract.py").write_text(TESTS)
    (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n"
                                        "markers =\n    django_db: the project's tests, not collected here\n")

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"wheeltest{uuid.uuid4().hex[:8]}:"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "PYTHONPATH": str(project),
           "DJANGO_SETTINGS_MODULE": "wheel_settings", "WHEEL_TEST_PREFIX": prefix,
           "WHEEL_TEST_REDIS_URL": redis_url, "WHEEL_TEST_REPO": os.path.realpath(ROOT)}
    try:
        result = subprocess.run([str(python), "-m", "pytest", "-q"], cwd=project, env=env,
                                capture_output=True, text=True, timeout=300)
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-3000:]
    # Every contract test but the project's two, and the check that the project was not there.
    assert set(NEEDS_THE_PROJECT) <= set(contract.__all__)
    ran = len(contract.__all__) - len(NEEDS_THE_PROJECT) + 1
    assert re.search(rf"^{ran} passed in [0-9.]+s", result.stdout, re.M), result.stdout[-3000:]
