"""The house of locks/ keeps its floors (the `locks` package docstring; docs/design.md, "The
house"): every module imports only from the floors below it (lazy and TYPE_CHECKING imports too),
so there is no import circle, and lock.py stays the front door only."""

from __future__ import annotations

from pathlib import Path

import locks
from tests.structure import floor_violations

ROOT = Path(locks.__file__).parent

# Floor of each module (dotted names below `locks`); a package's modules default to the package's.
FLOORS = {
    1: ["conf", "exceptions", "keys", "histogram", "scripts", "redis_urls", "django_redis_cluster", "checks", "models",
        "formats", "admin_base"],
    2: ["hold", "connection"],
    3: ["backends.base", "backends", "metrics", "renewal", "events"],
    4: ["backends.redis", "backends.redlock", "backends.zookeeper", "backends.mysql", "stats"],
    5: ["lock", "inspect"],
    6: ["combining", "jobs", "services", "views", "admin", "templatetags", "management", "apps", ""],
}


def test_every_module_imports_only_from_the_floors_below_it():
    assert floor_violations(ROOT, FLOORS) == []


def test_the_front_door_is_small_and_reaches_redis_only_through_a_backend():
    source = (ROOT / "lock.py").read_text()
    assert len(source.splitlines()) < 520  # 500 until the give-back of an interrupted grant (_abandon)
    assert "locks.scripts" not in source and "native" not in source
