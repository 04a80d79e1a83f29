"""The status words are written once, as enums, and the documents and JSON keep the plain strings.

- every member formats as its value (``str``, ``format``, f-strings, ``json.dumps``) on every Python;
- the status table of docs/patching.md and docs/json-schema.md list exactly the members, no more, no fewer;
- ``to_json`` of plans, checks and refresh results holds plain ``str``, never an enum member;
- no module of sm120kit spells a patch, hunk or tree status as a bare string outside the enums.
"""

from __future__ import annotations

import ast
import enum
import json
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from sm120kit.patching.hunks import HunkResult
from sm120kit.patching.plan import STATUSES, PatchPlan, SeriesPlan
from sm120kit.patching.status import HunkStatus, PatchStatus, TreeStatus, Word, tree_status
from sm120kit.upstream.check import STATUS_ORDER, PatchCheck
from sm120kit.upstream.refresh import FileMerge, RefreshedFile, RefreshOutcome

REPO = REPO_ROOT
ENUMS = (PatchStatus, HunkStatus, TreeStatus, RefreshOutcome, FileMerge)
MEMBERS = [m for e in ENUMS for m in e]


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_a_member_reads_as_its_value(member: Word) -> None:
    value = member.value
    assert isinstance(member, str) and member == value
    assert str(member) == value and f"{member}" == value and f"{member}" == value
    assert f"{member:>20}" == f"{value:>20}" and format(member, "<3") == format(value, "<3")
    assert "%s" % member == value
    assert json.dumps(member) == json.dumps(value)
    assert json.dumps({member: [member]}) == json.dumps({value: [value]})
    assert type(member)(value) is member


def test_the_sets_fit_together() -> None:
    assert STATUSES == tuple(PatchStatus)
    assert sorted(STATUS_ORDER) == sorted(PatchStatus)
    assert {h.value for h in HunkStatus} <= {p.value for p in PatchStatus}
    assert {tree_status(p) for p in PatchStatus} | {TreeStatus.FILE_MISSING} == set(TreeStatus)


def _ticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z-]+)`", text))


def _bullet(text: str, start: str, index: int) -> str:
    """The ``index``-th bullet that begins with ``start``, up to where the next field begins (``; `x```)."""
    bullets = re.findall(rf"^{re.escape(start)}.*?(?=^- |^$|\Z)", text, flags=re.M | re.S)
    return bullets[index].removeprefix(start).split("; `")[0]


def test_patching_doc_status_table_lists_what_apply_reports() -> None:
    doc = (REPO / "docs" / "patching.md").read_text(encoding="utf-8")
    table = doc.split("| status | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    first = {re.match(r"\| `([a-z-]+)` \|", row).group(1) for row in rows}
    reported = {TreeStatus.APPLIED.value} | {p.value for p in PatchStatus if p is not PatchStatus.APPLIES}
    assert first == reported
    assert f"`{PatchStatus.APPLIES}` in a dry run" in table


def test_json_schema_lists_every_status_set() -> None:
    schema = (REPO / "docs" / "json-schema.md").read_text(encoding="utf-8")
    apply_bullet = _bullet(schema, "- patch `status`:", 0)
    status_bullet = _bullet(schema, "- patch `status`:", 1)
    assert _ticked(apply_bullet) == {TreeStatus.APPLIED.value} | {p.value for p in PatchStatus}
    assert _ticked(status_bullet) == {t.value for t in TreeStatus}
    hunk = re.search(r'- \*\*hunk\*\*: .*?"status": ((?:"[a-z-]+"(?: \| )?)+)', schema).group(1)
    assert set(re.findall(r'"([a-z-]+)"', hunk)) == {h.value for h in HunkStatus}
    outcome = re.search(r'"outcome" \(([^)]*)\)', schema).group(1)
    assert {w.strip() for w in outcome.split(",")} == {o.value for o in RefreshOutcome}
    merge = re.search(r"merge \(([^)]*)\)", schema).group(1)
    assert {w.strip() for w in merge.split(",")} == {m.value for m in FileMerge}


def _plain(value: object, where: str = "$") -> None:
    """No enum member anywhere in a JSON document, keys included."""
    assert not isinstance(value, enum.Enum), f"{where} is {value!r}"
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, f"{where} key {key!r}"
            _plain(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]")


def test_json_documents_hold_plain_strings() -> None:
    hunk = HunkResult(file="sglang/x.py", index=1, status=HunkStatus.CONFLICT, line=3)
    plans = tuple(
        PatchPlan(patch_id=f"p{i}", status=s, variant=None, reason="r", hunks=(hunk,))
        for i, s in enumerate(PatchStatus)
    )
    plan = SeriesPlan(root=Path("/t"), version="0.5.23", exact_release=True, fuzz=0, patches=plans)
    data = plan.to_json()
    _plain(data)
    assert [p["status"] for p in data["patches"]] == [s.value for s in PatchStatus]
    assert data["counts"] == {s.value: 1 for s in PatchStatus}
    assert json.loads(json.dumps(data)) == data
    assert data["patches"][0]["hunks"][0]["status"] == "conflict"

    check = PatchCheck(
        patch_id="p",
        title="t",
        status=PatchStatus.PRESENT_UPSTREAM,
        variant=None,
        variant_releases=None,
        detail="d",
        offsets=(hunk,),
    )
    _plain(check.to_json())
    assert check.to_json()["status"] == "present-upstream"
    refreshed = RefreshedFile(path="a.py", old_path="a.py", action="modify", merge=FileMerge.GONE)
    _plain(refreshed.to_json())
    assert refreshed.to_json()["merge"] == "gone"


def test_plain_strings_still_build_results() -> None:
    """Callers (and older tests) that pass the string get the member; a word outside the set is refused."""
    plan = PatchPlan(patch_id="p", status="conflict", variant=None, reason="r")
    assert plan.status is PatchStatus.CONFLICT
    assert HunkResult(file="f", index=1, status="applies").status is HunkStatus.APPLIES
    with pytest.raises(ValueError):
        PatchPlan(patch_id="p", status="applied", variant=None, reason="r")
    with pytest.raises(ValueError):
        HunkResult(file="f", index=1, status="not-applicable")


# The status words that must not be spelled out in sm120kit outside the enums.
WORDS = {m.value for e in (PatchStatus, HunkStatus, TreeStatus) for m in e}
# (module, word): why the bare string stays.
ALLOWED = {
    ("sm120kit/errors.py", "conflict"): "ConflictError.kind, an error kind of the CLI contract, not a status",
    ("sm120kit/cli/upstream.py", "applies"): "STATUS_WORDS: the word the Markdown table prints for APPLIES",
    ("sm120kit/audit/smem.py", "not-applicable"): "an audit case's status (a shape SGLang's loader refuses), not a "
    "patch status; the audit may not import sm120kit.patching (the engines are independent)",
}


def _enum_bodies(tree: ast.AST) -> set[int]:
    """ids of the nodes inside class bodies that define an enum (``(str, Enum)``, ``Word`` subclasses)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            (isinstance(b, ast.Name) and b.id in {"Word", "Enum"})
            or (isinstance(b, ast.Attribute) and b.attr == "Enum")
            for b in node.bases
        ):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def test_no_status_is_a_bare_string() -> None:
    found: set[tuple[str, str]] = set()
    lines: list[str] = []
    for path in sorted((REPO / "sm120kit").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        skip = _enum_bodies(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in WORDS and id(node) not in skip:
                found.add((rel, node.value))
                if (rel, node.value) not in ALLOWED:
                    lines.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not lines, "use the members of sm120kit.patching.status:\n" + "\n".join(lines)
    assert set(ALLOWED) <= found, f"allow-list entries no longer needed: {set(ALLOWED) - found}"
