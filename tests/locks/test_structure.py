"""The house of locks/ keeps its floors (the `locks` package docstring; docs/design.md, "The
house"): every module imports only from the floors below it (lazy and TYPE_CHECKING imports too),
so there is no import circle, and lock.py stays the front door only."""

from __future__ import annotations

import ast
from pathlib import Path

import locks

ROOT = Path(locks.__file__).parent

# Floor of each module (dotted names below `locks`); a package's modules default to the package's.
FLOORS = {
    1: ["conf", "exceptions", "keys", "histogram", "scripts", "redis_urls", "cluster", "checks", "models"],
    2: ["hold", "connection"],
    3: ["backends.base", "backends", "metrics", "renewal", "events"],
    4: ["backends.redis", "backends.redlock", "backends.zookeeper", "backends.mysql", "stats"],
    5: ["lock", "inspect"],
    6: ["combining", "jobs", "services", "views", "admin", "management", "apps", ""],
}
FLOOR = {f"locks.{m}".rstrip("."): floor for floor, names in FLOORS.items() for m in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _floor(module: str) -> int:
    while module not in FLOOR:
        module = module.rpartition(".")[0]
    return FLOOR[module]


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports, wherever the import statement stands."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def test_every_module_imports_only_from_the_floors_below_it():
    modules = _modules()
    known = set(modules)
    up = [f"{m} (floor {_floor(m)}) imports {t} (floor {_floor(t)})"
          for m, path in sorted(modules.items()) for t in sorted(_imports(m, path, known))
          if _floor(t) > _floor(m) or (_floor(t) == _floor(m) and m in _imports(t, modules[t], known))]
    assert up == []


def test_the_front_door_is_small_and_reaches_redis_only_through_a_backend():
    source = (ROOT / "lock.py").read_text()
    assert len(source.splitlines()) < 500
    assert "locks.scripts" not in source and "native" not in source
