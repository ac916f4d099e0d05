"""The load-test app stands above the shop and the locks: it imports them, never the other way
round (so the shop ships, and the locks app builds as a wheel, without it)."""

from __future__ import annotations

import ast
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", ["shop", "locks"])
def test_the_floors_below_never_import_the_load_tests(package):
    up = [f"{path.relative_to(ROOT)} imports {module}"
          for path in sorted((ROOT / package).rglob("*.py"))
          for module in sorted(_imported_modules(path)) if module == "loadtest" or module.startswith("loadtest.")]
    assert up == []


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree():
    """DbLock lives in the loadtest app's schema now (shop 0012 deletes it, loadtest 0001 creates it)."""
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())
