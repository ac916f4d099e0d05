"""The README and docs/ link to what exists: every relative Markdown link (`[text](docs/api.md)`,
`[text](operations.md#sizing-the-line)`, `[text](#commands)`) names a file or folder of the
repository, and its anchor, if any, is a heading of the Markdown file it points to (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens, a repeated heading's `-1`, `-2`).
Links to other sites are not followed. The README stays a front door (at most ~250 lines).

No database or Redis: plain file reads.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.test_design import _line, _without_fences

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), target without spaces; the title part ("...") aside.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (code blocks aside)."""
    seen: Counter[str] = Counter()
    out = set()
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _without_fences(markdown), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return out


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """The links of one Markdown file that lead nowhere, as `path:line: what`."""
    text = _without_fences(path.read_text(encoding="utf-8"))
    rel = path.relative_to(root).as_posix()
    problems = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:: another site
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        where = f"{rel}:{_line(text, match.start())}"
        if not linked.exists():
            problems.append(f"{where}: ({target}) leads to no file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked.read_text(encoding="utf-8"))):
            problems.append(f"{where}: ({target}): no heading #{anchor} in {linked.relative_to(root).as_posix()}")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_leads_to_a_file_and_heading(path):
    assert link_problems(path) == []


def test_the_readme_is_a_front_door():
    """At most ~250 lines: the details live in docs/, which it links."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in ("design", "operations", "benchmarks", "api", "configuration", "loadtest"):
        assert f"](docs/{page}.md" in readme, f"the README does not link docs/{page}.md"


def test_the_link_check_finds_what_it_is_for(tmp_path):
    """Planted broken links are found, with their line; right ones (and other sites) pass."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Step one: `./x.sh`\n\n## Step one: `./x.sh`\n")
    (tmp_path / "README.md").write_text(
        "# Read me\n\n"
        "[ok](docs/a.md#step-one-xsh), [again](docs/a.md#step-one-xsh-1), [self](#read-me), "
        "[web](https://example.com/#x)\n"
        "```\n[in code](nowhere.md)\n```\n"
        "[gone](docs/b.md) and [no heading](docs/a.md#step-two) and [here](#nothing)\n")
    assert link_problems(tmp_path / "README.md", tmp_path) == [
        "README.md:7: (docs/b.md) leads to no file",
        "README.md:7: (docs/a.md#step-two): no heading #step-two in docs/a.md",
        "README.md:7: (#nothing): no heading #nothing in README.md",
    ]
