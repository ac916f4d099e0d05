"""The benchmark extras (requirements-bench.txt) and the one message when one is missing.

`./dev.sh run` installs the runtime only (requirements.txt): the extras are python-redis-lock and
pottery (peer locks we measure ourselves against) and matplotlib (plots, with numpy), about 175 MB
and 10 s more for a server that needs none of them. `./dev.sh test` and the Docker image install
them. A command that needs one checks before it starts anything and names the command to run.
"""

from __future__ import annotations

import importlib
import os
import sys

from django.conf import settings
from django.core.management.base import CommandError


def install_command() -> str:
    """The pip line for the Python running now, shown relative to the current directory when inside it."""
    def shown(path: str) -> str:
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative

    return f"{shown(sys.executable)} -m pip install -r {shown(str(settings.BASE_DIR / 'requirements-bench.txt'))}"


def require(module: str, *, package: str, needed_by: str, instead: str = "") -> None:
    """CommandError unless `module` imports: `needed_by` needs `package`, and how to install it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise CommandError(
            f"{needed_by} needs {package}, a benchmark extra that `./dev.sh run` does not install: "
            f"{install_command()}" + (f" (or {instead})" if instead else "")) from None
