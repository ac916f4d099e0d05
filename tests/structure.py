"""Reading a package's import graph from its source, for the floor tests of locks/ and shop/ and
the load-test app's test that it uses the shop only through its public surface."""

from __future__ import annotations

import ast
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root` (migrations aside)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports (`from a import b` gives `a.b`), wherever the import
    statement stands: lazy and TYPE_CHECKING imports count too."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules (of `known`) that `module` imports."""
    found = set()
    for name in imported_names(module, path):
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def floor_violations(root: Path, floors: dict[int, list[str]]) -> list[str]:
    """Imports that go up a floor, or sideways into a module that imports back. `floors` names
    modules below the package; a package's modules default to the package's floor."""
    package = root.name
    floor_of = {f"{package}.{m}".rstrip("."): n for n, names in floors.items() for m in names}

    def floor(module: str) -> int:
        while module not in floor_of:
            if "." not in module:
                raise AssertionError(f"{module} has no floor: add it to the floor test")
            module = module.rpartition(".")[0]
        return floor_of[module]

    found = modules(root)
    known = set(found)
    graph = {m: imports(m, path, known) for m, path in found.items()}
    return [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
            for m in sorted(graph) for t in sorted(graph[m])
            if floor(t) > floor(m) or (floor(t) == floor(m) and m in graph[t])]
