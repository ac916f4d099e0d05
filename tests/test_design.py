"""docs/design.md is the project's design, whatever cites it cites what it defines, and the code
the documents name in backticks exists.

- every invariant cited in code, tests, templates and docs (`I7`, `(I9)`, `I1-I6`, `I1-6`, with
  a hyphen or an en dash, in *.py, *.html, *.md and *.sh files; migrations and the virtualenv
  aside) is one that the design's "Invariants" section defines;
- the design is cited as `docs/design.md` (or, from a Markdown file, by a link that resolves to
  it), never under another name or path;
- a section cited by name (`docs/design.md, "The path of one checkout"`) or by anchor
  (`docs/design.md#invariants`) exists;
- every test the design names as a proof (`tests/...py::test_name`) exists;
- every backticked dotted reference in the README and the pages of docs/ that describe the code
  as it is (DOCUMENTS) resolves, so the prose cannot drift from the code. The rule, for a whole
  code span `a.b.c` outside code blocks (call parentheses dropped: `writer.write(requests,
  holds=)` is `writer.write`):
  - a file name (`writer.py`, `take.lua`, `gunicorn.conf.py`: its last part a file suffix) is a
    file of the repository, by that name or path;
  - `shop.`, `locks.`, `loadtest.` (the project's packages): the longest prefix that is a module
    is imported and the rest looked up on it (`shop.services.place_order`); a name the project
    registers instead of defining is also found: a job (`shop.send_mail`, in the jobs registry)
    or a system check id (`shop.W003`, quoted in the package's source);
  - a bare name whose first part is the last part of a project module (`writer.write`,
    `combining.submit`: `shop.checkout.combining` or `locks.combining`) or a class defined at
    the top of one (`Product.row_on_sale`, `Hold.check`) resolves on at least one of them;
  - a first part that is the standard library's or an installed package's module, and no
    project module or class (`time.monotonic()`, MySQL's `sys.innodb_lock_waits`, `gunicorn.ctl`),
    is not the project's and is left alone, as are the NOT_PYTHON names (SQL columns, another
    library's classes) and the API's JSON (`details.status`); `ctx.fence` is looked up on the
    classes a `ctx` parameter may be (VARIABLES);
  - anything else fails: a first part that names nothing of the project is a module that was
    renamed or removed (`batch.from_json`, once `protocol.from_json`).
  A backticked path whose first part is a top-level file or folder of the repository
  (`shop/checkout/writer.py`, `locks/scripts/`, `tests/locks/test_wheel.py::test_x`) must exist
  too; `application/json` and `ttl/3` are not paths of it. The failure names the file, line and
  reference, and what did not resolve.

No database or Redis: plain file reads, and imports of the project's modules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.structure import modules

ROOT = Path(__file__).resolve().parent.parent
CITED_AS = "docs/design.md"
DESIGN = ROOT / CITED_AS
# This file plants mistakes on purpose (its last test, in a temporary tree): not read as a citation.
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Directories never read: the virtualenv, VCS and tool caches (every dot-directory), build output.
SKIP_DIRS = {"__pycache__", "node_modules", "staticfiles", "test-artifacts"}
# Files whose invariant citations are checked.
CITING = {".py", ".html", ".md", ".sh"}

NOT_YET_RENAMED: set[str] = set()  # files still citing the design's old name (none left)

# I7, I1-I6, I1-6 (a hyphen or an en dash): a citation of one invariant, or of a range.
INVARIANT = re.compile(r"\bI(\d+)(?:\s*[-\u2013]\s*I?(\d+))?\b")
# Anything naming a file design.md, with the path before it and an anchor after it.
DESIGN_NAME = re.compile(r"[\w./-]*\b(?i:design)\.md(#[\w-]+)?")
# A section cited by name: docs/design.md, "Section" (also across a line break).
SECTION = re.compile(r'docs/design\.md,\s*"([^"]+)"')
# A test named in the design: `tests/path/test_x.py::test_name`.
NAMED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")

# The pages whose backticked `module.name` references must resolve: the README and every page of
# docs/ that describes the code as it is; docs/benchmarks.md is a record of past runs, naming
# what was measured then (`Turn.finish`, tried and dropped).
DOCUMENTS = ("README.md", "docs/design.md", "docs/api.md", "docs/configuration.md", "docs/loadtest.md",
             "docs/locks.md", "docs/shop.md", "docs/operations.md", "docs/reliability.md", "docs/scaleout.md",
             "docs/metrics.md")
# The project's packages: a reference starting with one of these is imported.
PACKAGES = ("config", "shop", "locks", "loadtest")
# A whole inline code span that is a dotted name, perhaps called: `a.b`, `a.b.c(x, y=)`.
REFERENCE = re.compile(r"(?<!`)`([A-Za-z_]\w*(?:\.\w+)+)(?:\([^`]*\))?`(?!`)")
# Last parts that make a dotted name a file name.
FILE_SUFFIXES = {"py", "lua", "md", "sh", "html", "yml", "yaml", "toml", "txt", "json", "example", "png", "cfg"}
# A whole code span that is a relative path, perhaps with a test after it: `shop/x.py`, `tests/a.py::t`.
PATH = re.compile(r"(?<!`)`((?:[\w.-]+/)+[\w.-]*)(?:::\w+)?`(?!`)")
# A system check id: `shop.W003`.
CHECK_ID = re.compile(r"^(\w+)\.[CEWID]\d{3}$")
# Dotted names in the documents that are not the project's Python: SQL tables' columns, another
# library's names cited without their module.
NOT_PYTHON = {
    "products.fence", "coupons.fence",  # the fence columns
    "cache.lock",  # django-redis's cache.lock(), the usual lock
    "Unreader.unread",  # gunicorn's request parser
    "AppConfig.ready",  # Django's
    "multiprocess.mark_process_dead",  # prometheus_client's
}
# Parameter names the documents use for an object, with the classes it may be: `ctx.fence`.
VARIABLES = {"ctx": ("locks.jobs.JobContext", "loadtest.httpfaults.Context", "loadtest.inprocess_harness.Context")}
# The roots of JSON the API answers: `details.status` is a key of an error's details.
JSON_ROOTS = {"details"}


def _walk(root: Path, *, skip_migrations: bool, exempt: frozenset[str] = frozenset()) -> Iterator[tuple[str, Path]]:
    """(path relative to root, path) of every file to read."""
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                         and not (skip_migrations and d == "migrations"))
        for name in sorted(files):
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            if rel not in exempt:
                yield rel, path


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (an image), or unreadable: cites nothing


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def headings(design: str) -> dict[str, str]:
    """Every heading of the design: its text -> its GitHub anchor."""
    out = {}
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*$", design, re.MULTILINE):
        title = match.group(1)
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out[title] = anchor
    return out


def defined_invariants(design: str) -> dict[int, str]:
    """The invariants of the design's "Invariants" section: number -> the entry's first line."""
    section = re.search(r"^## Invariants\s*$(.*?)(?=^## |\Z)", design, re.MULTILINE | re.DOTALL)
    if section is None:
        return {}
    return {int(n): line for n, line in re.findall(r"^- \*\*I(\d+)\*\*\s*(.*)$", section.group(1), re.MULTILINE)}


def invariant_problems(root: Path, defined: set[int], *, exempt: frozenset[str] = frozenset()) -> list[str]:
    """Citations of invariants the design does not define, as `path:line: what`."""
    problems = []
    for rel, path in _walk(root, skip_migrations=True, exempt=exempt):
        if path.suffix not in CITING or (text := _text(path)) is None:
            continue
        for match in INVARIANT.finditer(text):
            first = int(match.group(1))
            last = int(match.group(2) or first)
            cited = set(range(first, last + 1)) if first <= last else {first, last}
            if missing := sorted(cited - defined):
                where = f"{rel}:{_line(text, match.start())}"
                problems.append(f"{where}: {match.group(0)!r} cites {', '.join(f'I{n}' for n in missing)}, "
                                f"which docs/design.md does not define")
    return problems


def name_problems(root: Path, *, exempt: frozenset[str] = frozenset()) -> list[str]:
    """Citations of the design under another name or path than docs/design.md."""
    design = root / CITED_AS
    problems = []
    for rel, path in _walk(root, skip_migrations=False, exempt=exempt | {CITED_AS}):
        if (text := _text(path)) is None:
            continue
        for match in DESIGN_NAME.finditer(text):
            name = match.group(0).removesuffix(match.group(1) or "")
            if name == CITED_AS:
                continue
            linked = text[max(0, match.start() - 2):match.start()] == "]("
            if linked and path.suffix == ".md" and (path.parent / name).resolve() == design.resolve():
                continue  # a Markdown link that resolves to docs/design.md
            problems.append(f"{rel}:{_line(text, match.start())}: cites {match.group(0)!r}; cite it as {CITED_AS}")
    return problems


def reference_problems(root: Path, anchors: dict[str, str], *, exempt: frozenset[str] = frozenset()) -> list[str]:
    """Sections cited by name or anchor that the design does not have."""
    problems = []
    for rel, path in _walk(root, skip_migrations=False, exempt=exempt):
        if path.suffix not in CITING or (text := _text(path)) is None:
            continue
        for match in SECTION.finditer(text):
            title = " ".join(match.group(1).split())
            if title not in anchors:
                problems.append(f"{rel}:{_line(text, match.start())}: no section {title!r} in {CITED_AS}")
        for match in DESIGN_NAME.finditer(text):
            anchor = (match.group(1) or "").lstrip("#")
            if anchor and anchor not in anchors.values():
                problems.append(f"{rel}:{_line(text, match.start())}: no anchor #{anchor} in {CITED_AS}")
    return problems


def _without_fences(text: str) -> str:
    """The text with its fenced code blocks blanked (line numbers kept): code, not references."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.MULTILINE | re.DOTALL)


@cache
def _project_files(root: Path) -> dict[str, Path]:
    """Every module of the project's packages: dotted name -> file (migrations aside)."""
    return dict(sorted(item for package in PACKAGES for item in modules(root / package).items()))


@cache
def _project_modules(root: Path) -> dict[str, list[str]]:
    """The project's modules by their own last name: `writer` -> `shop.checkout.writer`."""
    out: dict[str, list[str]] = {}
    for dotted in _project_files(root):
        out.setdefault(dotted.rpartition(".")[2], []).append(dotted)
    return out


@cache
def _project_classes(root: Path) -> dict[str, list[str]]:
    """Every class defined at the top of a project module: its name -> the modules defining it."""
    out: dict[str, list[str]] = {}
    for dotted, path in _project_files(root).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(dotted)
    return out


@cache
def _files(root: Path) -> set[str]:
    """The repository's files, by name and by path (dot-directories and the skipped ones aside)."""
    out = set()
    for rel, path in _walk(root, skip_migrations=False):
        out.update({rel, path.name})
    return out


def _lookup(obj: object, attrs: list[str]) -> str | None:
    """None if obj.a.b... exists, else the first part that does not. A class's declared fields
    count (a dataclass field without a default is only an annotation)."""
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            declared = {name for klass in getattr(obj, "__mro__", ()) for name in getattr(klass, "__annotations__", {})}
            if attr not in declared:
                return attr
            return None
    return None


def _resolve_dotted(dotted: str) -> str | None:
    """None if `dotted` imports (the longest importable prefix, then attributes), else why not."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is not None and not dotted.startswith(error.name):
                raise  # the module exists but imports something missing: not a stale reference
            continue
        missing = _lookup(module, parts[cut:])
        return None if missing is None else f"{module.__name__} has no {missing!r}"
    return f"no module {parts[0]!r}"


def _registered(root: Path, dotted: str) -> bool:
    """A name a package registers rather than defines: a job, or a system check id."""
    from locks.jobs import registry

    if dotted in {job.name for job in registry.all()}:
        return True
    if (match := CHECK_ID.match(dotted)) and (root / match.group(1)).is_dir():
        quoted = (f'"{dotted}"', f"'{dotted}'")
        return any(q in path.read_text() for path in (root / match.group(1)).rglob("*.py") for q in quoted)
    return False


def _outside(name: str) -> bool:
    """A top-level module that is not the project's: the standard library's or an installed one."""
    return name in sys.stdlib_module_names or (name not in PACKAGES and importlib.util.find_spec(name) is not None)


def resolve(root: Path, reference: str) -> str | None:
    """None if a backticked reference resolves by the rule of this module's docstring, else why not."""
    parts = reference.split(".")
    first, rest = parts[0], parts[1:]
    if parts[-1] in FILE_SUFFIXES:
        return None if reference in _files(root) else f"no file named {reference!r} in the repository"
    if first in PACKAGES:
        why = _resolve_dotted(reference)
        return None if why is None or _registered(root, reference) else why
    if reference in NOT_PYTHON or first in JSON_ROOTS:
        return None
    if first in VARIABLES:
        kinds = [_resolve_dotted(".".join([kind, *rest])) for kind in VARIABLES[first]]
        return None if None in kinds else f"no {'.'.join(rest)!r} on {', '.join(VARIABLES[first])}"
    modules = _project_modules(root).get(first, [])
    classes = _project_classes(root).get(first, [])
    for module in modules:
        if _resolve_dotted(".".join([module, *rest])) is None:
            return None
    for module in classes:
        if _lookup(importlib.import_module(module), parts) is None:
            return None
    if _outside(first) and ((not modules and not classes) or _resolve_dotted(reference) is None):
        return None  # not the project's (`time.monotonic()`, MySQL's `sys.innodb_lock_waits`)
    if not modules and not classes:
        return f"{first!r} is no module or class of {', '.join(PACKAGES)} (renamed or removed?)"
    where = ", ".join([*modules, *(f"{m}.{first}" for m in classes)])
    return f"no {'.'.join(rest)!r} in {where}"


def unresolved_references(rel: str, text: str, root: Path) -> list[str]:
    """The backticked dotted references of one document that do not resolve, as `rel:line: what`."""
    text = _without_fences(text)
    problems = [(match.start(), f"`{match.group(1)}` does not resolve: {why}")
                for match in REFERENCE.finditer(text) if (why := resolve(root, match.group(1))) is not None]
    problems += [(match.start(), f"`{match.group(1)}`: no such file or folder")
                 for match in PATH.finditer(text)
                 if (root / match.group(1).split("/")[0]).exists() and not (root / match.group(1)).exists()]
    return [f"{rel}:{_line(text, start)}: {what}" for start, what in sorted(problems)]


def reference_resolution_problems(root: Path, documents: tuple[str, ...] = DOCUMENTS) -> list[str]:
    """Backticked dotted references of the documents that do not resolve, as `path:line: what`."""
    return [problem for rel in documents
            for problem in unresolved_references(rel, (root / rel).read_text(encoding="utf-8"), root)]


# --- the project --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def design() -> str:
    return DESIGN.read_text(encoding="utf-8")


def test_the_design_defines_i1_to_i10_each_with_its_proof(design):
    defined = defined_invariants(design)
    assert sorted(defined) == list(range(1, 11)), sorted(defined)
    section = design.split("\n## Invariants", 1)[1].split("\n## ", 1)[0]
    entries = re.split(r"^- \*\*I\d+\*\*", section, flags=re.MULTILINE)[1:]
    for n, entry in enumerate(entries, start=1):
        assert "Proved by" in entry, f"I{n} names no test or check that proves it"


def test_every_invariant_cited_is_one_the_design_defines(design):
    assert invariant_problems(ROOT, set(defined_invariants(design)), exempt=frozenset({SELF})) == []


def test_the_design_is_cited_as_docs_design_md():
    assert name_problems(ROOT, exempt=frozenset({SELF, *NOT_YET_RENAMED})) == []


def test_no_stale_exemptions():
    """An exempt file that is gone, or no longer cites the old name, leaves the list."""
    problems = name_problems(ROOT, exempt=frozenset({SELF}))
    stale = [rel for rel in sorted(NOT_YET_RENAMED) if not any(p.startswith(f"{rel}:") for p in problems)]
    assert stale == [], f"remove from NOT_YET_RENAMED: {stale}"


def test_sections_cited_by_name_or_anchor_exist(design):
    assert reference_problems(ROOT, headings(design), exempt=frozenset({SELF})) == []


def test_the_tests_the_design_names_exist(design):
    missing = []
    for path, name in NAMED_TEST.findall(design):
        source = ROOT / path
        if not source.exists() or not re.search(rf"^def {name}\(", source.read_text(), re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert missing == []


def test_the_documents_backticked_references_resolve():
    """`shop.services.place_order`, `writer.write`, `Product.row_on_sale`: each names what exists."""
    assert reference_resolution_problems(ROOT) == []


# --- the checks themselves ------------------------------------------------------------------
def test_the_checks_find_what_they_are_for(tmp_path):
    """Planted mistakes, one of each kind, are found; right citations are not flagged."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n\n## Invariants\n\n- **I1** one\n- **I2** two\n")
    old_name = "DESIGN" + ".md"
    (tmp_path / "docs" / "ops.md").write_text(
        "See [docs/design.md](design.md#invariants) and I1-I2.\n"
        "Not [this](../" + old_name + ").\n")
    (tmp_path / "a.py").write_text(
        f'"""I1 and (I2) of docs/design.md, "Invariants"; I{3} of {old_name}."""\n'
        f'# I1-I{4}, I1\u2013I{2}, docs/design.md, "Nowhere"\n')
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001.py").write_text(f"# I{9}: migrations are not read for invariants\n")
    design = (tmp_path / "docs" / "design.md").read_text()
    assert defined_invariants(design) == {1: "one", 2: "two"}

    assert invariant_problems(tmp_path, {1, 2}) == [
        "a.py:1: 'I3' cites I3, which docs/design.md does not define",
        "a.py:2: 'I1-I4' cites I3, I4, which docs/design.md does not define",
    ]
    assert name_problems(tmp_path) == [
        f"a.py:1: cites {old_name!r}; cite it as docs/design.md",
        f"docs/ops.md:2: cites '../{old_name}'; cite it as docs/design.md",
    ]
    assert name_problems(tmp_path, exempt=frozenset({"a.py", "docs/ops.md"})) == []
    assert reference_problems(tmp_path, headings(design)) == [
        "a.py:2: no section 'Nowhere' in docs/design.md",
    ]


def test_the_reference_check_finds_what_it_is_for():
    """Planted references, against this project: stale ones are named with why; right ones pass."""
    assert resolve(ROOT, "protocol.from_json") is None
    stale = "'batch' is no module or class of config, shop, locks, loadtest (renamed or removed?)"
    assert resolve(ROOT, "batch.from_json") == stale
    assert resolve(ROOT, "writer.nothing").startswith("no 'nothing' in shop.checkout.writer")
    assert resolve(ROOT, "shop.services.nothing") == "shop.services has no 'nothing'"
    assert resolve(ROOT, "Hold.check") is None and resolve(ROOT, "combining.submit") is None  # locks.combining
    assert resolve(ROOT, "Product.row_on_sale") is None and resolve(ROOT, "Product.nothing") == (
        "no 'nothing' in shop.models.Product")
    assert resolve(ROOT, "shop.send_mail") is None and resolve(ROOT, "shop.W003") is None  # a job, a check id
    assert resolve(ROOT, "shop.W999") == "shop has no 'W999'"
    assert resolve(ROOT, "ctx.fence") is None and resolve(ROOT, "ctx.nothing") is not None
    assert resolve(ROOT, "time.monotonic") is None and resolve(ROOT, "details.status") is None
    assert resolve(ROOT, "writer.py") is None
    assert resolve(ROOT, "batch.py") == "no file named 'batch.py' in the repository"
    text = ("# A page\n\n```python\nbatch.Alone  # code, not a reference\n```\nSee `batch.Alone(x)`, `writer.write`,\n"
            "`shop/batch.py`, `shop/models.py`, `locks/scripts/` and `application/json`.\n")
    assert unresolved_references("docs/page.md", text, ROOT) == [
        f"docs/page.md:6: `batch.Alone` does not resolve: {stale}",
        "docs/page.md:7: `shop/batch.py`: no such file or folder",
    ]
