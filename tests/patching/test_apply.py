"""The patch manager on real SGLang releases (PyPI wheels), as installed packages and as git clones.

For every core release: apply, apply again (no-op), status, revert to a byte-identical tree; a planted
conflict writes nothing and names the hunk; a dirty git file is refused and its edit survives.
"""

from __future__ import annotations

import git
import pytest
from apply_support import DEMO_EXPECTED, DEMO_FILES, DEMO_SERIES, tree_hashes
from conftest import CORE_RELEASES, quick_on_one

from sm120kit.errors import DirtyTreeError
from sm120kit.patching.engine import apply_series, release_of, revert_series, series_status
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.patching.state import STATE_DIR
from sm120kit.sglang.target import find_target


@pytest.fixture(scope="module")
def series():
    return load_series(DEMO_SERIES)


def _tree(layout: str, version: str, installed_tree, git_clone_tree):
    """(path to hand to sm120kit, folder to hash)"""
    if layout == "installed":
        package = installed_tree(version, link=True)  # only the patch manager writes to it
        return package, package.parent
    clone = git_clone_tree(version)
    return clone, clone


def _changed(before: dict, after: dict) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def _prefix(layout: str) -> str:
    return "" if layout == "installed" else "python/"


@pytest.mark.parametrize("layout", ["installed", pytest.param("git-clone", marks=pytest.mark.slow)])
@pytest.mark.parametrize("version", quick_on_one(CORE_RELEASES))
def test_apply_again_status_and_revert_byte_identical(version, layout, series, installed_tree, git_clone_tree):
    path, top = _tree(layout, version, installed_tree, git_clone_tree)
    pristine = tree_hashes(top)
    target = find_target(path)
    release, exact = release_of(target)
    assert (release, exact) == (version, True)

    plan = plan_series(target.root, series, version=release)
    assert {p.patch_id: p.status for p in plan.patches} == DEMO_EXPECTED[version]
    assert {c.path for c in plan.changes} == DEMO_FILES[version]
    assert tree_hashes(top) == pristine, "planning wrote to the tree"

    result = apply_series(target, series)
    assert result.exit_code == 0, result.message
    assert result.statuses == {k: ("applied" if v == "applies" else v) for k, v in DEMO_EXPECTED[version].items()}
    patched = tree_hashes(top)
    prefix = _prefix(layout)
    state_files = {p for p in _changed(pristine, patched) if f"/{STATE_DIR}/" in p}
    assert {p for p in _changed(pristine, patched) if p not in state_files} == {prefix + f for f in DEMO_FILES[version]}
    assert any(p.endswith(f"{STATE_DIR}/state.json") for p in state_files)
    demo = target.root / "sglang/srt/sm120kit_demo.py"
    compile(demo.read_text(), str(demo), "exec")
    assert "SM120KIT_DEMO_MODULE = True" in demo.read_text()
    for rel in DEMO_FILES[version]:  # file modes are kept (new file: 0644)
        assert patched[prefix + rel][1] == pristine.get(prefix + rel, ("", 0o644))[1]
    if layout == "git-clone":
        status_lines = git.Repo(top).git.status("--porcelain").splitlines()
        assert sorted(line[3:] for line in status_lines) == sorted(prefix + f for f in DEMO_FILES[version])

    again = apply_series(find_target(path), series)
    assert again.exit_code == 0 and not again.written
    assert set(again.statuses.values()) <= {"already-applied", "present-upstream"}
    assert tree_hashes(top) == patched

    status = series_status(find_target(path), series)
    assert status.problems == () and status.exit_code == 0
    assert {f.path: f.condition for f in status.files} == {f: "patched" for f in DEMO_FILES[version]}
    want = {k: ("applied" if v == "applies" else v) for k, v in DEMO_EXPECTED[version].items()}
    assert {r["id"]: r["status"] for r in status.rows()} == want

    reverted = revert_series(find_target(path))
    assert reverted.exit_code == 0
    assert tree_hashes(top) == pristine, "revert is not byte-identical"
    if layout == "git-clone":
        assert git.Repo(top).git.status("--porcelain", "--ignored") == ""


def test_offsets_are_reported_on_other_releases(series, release_dir):
    """The 0.5.6-based variant lands 170 lines earlier in 0.5.2 and 10 lines later in 0.5.10."""
    for version, offsets in (("0.5.2", [0, -170]), ("0.5.10", [0, 10]), ("0.5.17", [-1, -252])):
        plan = plan_series(release_dir(version), series, version=version)
        note = next(p for p in plan.patches if p.patch_id == "demo-extend-attention-note")
        assert [h.offset for h in note.hunks] == offsets
        assert "at offset" in note.reason


def _plant_conflict(package_dir, version: str) -> str:
    rel = next(f for f in DEMO_FILES[version] if f.endswith("extend_attention.py"))
    path = package_dir.parent / rel
    text = path.read_text()
    assert text.count("\n_is_hip = is_hip()\n") == 1
    path.write_text(text.replace("\n_is_hip = is_hip()\n", "\n_is_hip = is_hip()  # local change\n"))
    return rel


@pytest.mark.parametrize("version", quick_on_one(CORE_RELEASES))
def test_planted_conflict_writes_nothing_and_reports_the_hunk(version, series, installed_tree):
    package = installed_tree(version, link=True, copy=DEMO_FILES[version])  # _plant_conflict edits one of them
    rel = _plant_conflict(package, version)
    before = tree_hashes(package.parent)
    result = apply_series(find_target(package), series)
    assert result.exit_code == 4 and "Nothing was written" in result.message
    assert result.statuses["demo-extend-attention-note"] == "conflict"
    assert result.statuses["demo-new-module"] == "applies"  # would apply, but nothing is written
    assert tree_hashes(package.parent) == before
    assert not (package / STATE_DIR).exists()
    conflict = next(p for p in result.plan.patches if p.status == "conflict")
    hunk = next(h for h in conflict.hunks if h.status == "conflict")
    assert (hunk.file, hunk.index) == (rel, 1)
    assert "_is_hip = is_hip()" in hunk.expected
    assert "_is_hip = is_hip()  # local change" in hunk.found
    lines = (package.parent / rel).read_text().splitlines()
    assert hunk.closest_line == lines.index("_is_cuda = is_cuda()") + 1  # where the hunk nearly matches
    assert conflict.hunks[1].status == "applies"  # the other hunk fits; the patch as a whole does not


@pytest.mark.parametrize("version", quick_on_one(CORE_RELEASES, quick="0.5.2"))  # the smallest clone
def test_dirty_git_file_is_refused_and_the_edit_survives(version, series, git_clone_tree):
    clone = git_clone_tree(version)
    rel = next(f for f in DEMO_FILES[version] if f.endswith("extend_attention.py"))
    path = clone / "python" / rel
    edited = path.read_text() + "# an uncommitted local edit\n"
    path.write_text(edited)
    before = tree_hashes(clone)
    with pytest.raises(DirtyTreeError) as info:
        apply_series(find_target(clone), series)
    assert f"python/{rel}" in info.value.message and "--allow-dirty" in info.value.render()
    assert tree_hashes(clone) == before
    result = apply_series(find_target(clone), series, allow_dirty=True)
    assert result.exit_code == 0 and result.statuses["demo-extend-attention-note"] == "applied"
    assert path.read_text().endswith("# an uncommitted local edit\n")
    revert_series(find_target(clone))
    assert path.read_text() == edited  # revert brings back the user's version, not the committed one
    assert tree_hashes(clone) == before
