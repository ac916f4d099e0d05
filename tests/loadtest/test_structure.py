"""The load-test app stands above the shop and the locks: it imports them, never the other way
round (so the shop ships, and the locks app builds as a wheel, without it); and it uses the shop
only through the shop's public surface, as a user's own load test would."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.structure import imported_names, imports, modules

ROOT = Path(__file__).resolve().parents[2]

# What the shop offers beside it (docs/design.md, "The house"): the verbs and the reads, the
# models and errors, its values (the deadlines: a dotted name is that module of its package), its
# lock names and Redis keys, the invariant check, the checkout's test hook, and the database
# backend (settings name it; the MySQL 8 emulation extends it).
SHOP_PUBLIC = {"services", "reads.selectors", "models", "errors", "conf", "edge.deadlines", "plumbing.lock_names",
               "plumbing.redis_keys", "ops.invariants", "plumbing.hooks", "plumbing.mysql"}


@pytest.mark.parametrize("package", ["shop", "locks"])
def test_the_floors_below_never_import_the_load_tests(package):
    found = modules(ROOT / package)
    up = [f"{module} imports {name}" for module, path in sorted(found.items())
          for name in sorted(imported_names(module, path)) if name.split(".")[0] == "loadtest"]
    assert up == []


def test_the_load_tests_use_the_shop_only_through_its_public_surface():
    shop = modules(ROOT / "shop")
    found = modules(ROOT / "loadtest")
    private = [f"{module} imports {target}" for module, path in sorted(found.items())
               for target in sorted(imports(module, path, set(shop)))
               if target != "shop" and not any(f"{target}.".startswith(f"shop.{p}.") for p in SHOP_PUBLIC)]
    assert private == []


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree():
    """DbLock lives in the loadtest app's schema now (shop 0012 deletes it, loadtest 0001 creates it)."""
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())
