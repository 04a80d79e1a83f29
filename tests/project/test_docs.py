"""The documents hold together: the README keeps the two set-up commands CI and the tests depend on and stays
short, docs/index.md lists every document, and every relative link in the README and docs/ leads to a file that
exists and, with an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT

REPO = REPO_ROOT
DOCS = REPO / "docs"

# The two set-up commands, verbatim: the main job on the default release, and the tests (.ci/run runs it).
MAIN_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/sm120kit apply --release 0.5.23"
TEST_COMMAND = "scripts/test.sh"
README_MAX_LINES = 200

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """The anchors of a file's headings (outside code blocks), with GitHub's -1, -2 ... for repeats."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose, flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _broken_links(path: Path, root: Path = REPO) -> list[str]:
    text = path.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    problems = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return problems


def test_readme_keeps_the_two_setup_commands_verbatim():
    blocks = [block.strip() for block in _code_blocks((REPO / "README.md").read_text(encoding="utf-8"))]
    assert MAIN_COMMAND in blocks, "README.md lost the main command as its own code block"
    assert TEST_COMMAND in blocks, "README.md lost the test command as its own code block"
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_stays_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (docs/index.md lists them)"


def test_index_lists_every_document():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = {target.partition("#")[0] for target in LINK.findall(index)}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md" and p.name not in listed)
    assert missing == [], f"docs/index.md has no line for {missing}"


def test_every_relative_link_leads_somewhere():
    paths = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    problems = [problem for path in paths for problem in _broken_links(path)]
    assert problems == []


def test_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title: one (`x`)\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#title-one-x) [ok](a.md#twice-1) [ok](https://example.org/x#y)\n"
        "[gone](c.md) [bad](a.md#twice-2) [self](#nowhere)\n"
        "```\n[in code](d.md)\n```\n",
        encoding="utf-8",
    )
    assert _broken_links(doc, tmp_path) == [
        "b.md: c.md (no such file)",
        "b.md: a.md#twice-2 (no such heading)",
        "b.md: #nowhere (no such heading)",
    ]
