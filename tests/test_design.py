"""docs/design.md is the project's design, and whatever cites it cites what it defines.

- every invariant cited in code, tests, templates and docs (`I7`, `(I9)`, `I1-I6`, `I1-6`, with
  a hyphen or an en dash, in *.py, *.html, *.md and *.sh files; migrations and the virtualenv
  aside) is one that the design's "Invariants" section defines;
- the design is cited as `docs/design.md` (or, from a Markdown file, by a link that resolves to
  it), never under another name or path;
- a section cited by name (`docs/design.md, "The path of one checkout"`) or by anchor
  (`docs/design.md#invariants`) exists;
- every test the design names as a proof (`tests/...py::test_name`) exists.

No database or Redis: plain file reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

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
