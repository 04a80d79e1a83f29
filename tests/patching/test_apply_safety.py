"""Safety of the patch manager on real SGLang trees: interrupted writes, locks, read-only trees, edits
made after apply, damaged state, syntax errors, and variants picked for commits between releases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import git
import pytest
from apply_support import (
    DEMO_FILES,
    DEMO_SERIES,
    make_diff,
    run_cli,
    small_tree,
    tree_hashes,
    utils_series,
    write_series,
)
from conftest import CORE_RELEASES

from sm120kit.errors import IOFailure, StateDamagedError
from sm120kit.patching.engine import apply_series, release_and_source, release_of, revert_series, series_status
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.patching.state import STATE_DIR, StateStore, sha256
from sm120kit.sglang.target import find_target
from sm120kit.util.lock import TreeLock


@pytest.fixture(scope="module")
def series():
    return load_series(DEMO_SERIES)


def _file_hashes(root: Path, rels) -> dict[str, str | None]:
    return {rel: (sha256((root / rel).read_bytes()) if (root / rel).exists() else None) for rel in rels}


@pytest.mark.slow
@pytest.mark.parametrize("version", CORE_RELEASES)
def test_killed_mid_write_leaves_whole_files_and_next_run_repairs(version, series, installed_tree):
    """The writer SIGKILLs itself right after its first file replace (SM120KIT_FAULT_AFTER_WRITES=1)."""
    package = installed_tree(version)
    root = package.parent
    pristine = tree_hashes(root)
    plan = plan_series(root, series, version=version)
    old = _file_hashes(root, DEMO_FILES[version])
    new = {c.path: (sha256(c.after) if c.after is not None else None) for c in plan.changes}

    proc = run_cli("apply", str(package), "--series", str(DEMO_SERIES), env={"SM120KIT_FAULT_AFTER_WRITES": "1"})
    assert proc.returncode == -9, proc.stderr
    now = _file_hashes(root, DEMO_FILES[version])
    assert all(now[f] in (old[f], new[f]) for f in now), "a file is neither wholly old nor wholly new"
    assert sum(now[f] == new[f] for f in now) == 1
    assert not [p for p in root.rglob("*.tmp") if STATE_DIR not in p.parts]

    status = run_cli("status", str(package), "--series", str(DEMO_SERIES))
    assert status.returncode == 6
    assert "interrupted 'apply'" in status.stderr and "wrote 1 of" in status.stderr

    fixed = run_cli("apply", str(package), "--series", str(DEMO_SERIES))
    assert fixed.returncode == 0, fixed.stderr
    assert "repaired an interrupted run" in fixed.stderr
    assert _file_hashes(root, DEMO_FILES[version]) == new
    assert series_status(find_target(package), series).problems == ()

    # An interrupted revert is repaired by the next revert.
    proc = run_cli("revert", str(package), env={"SM120KIT_FAULT_AFTER_WRITES": "1"})
    assert proc.returncode == -9
    assert run_cli("status", str(package), "--series", str(DEMO_SERIES)).returncode == 6
    done = run_cli("revert", str(package))
    assert done.returncode == 0, done.stderr
    assert tree_hashes(root) == pristine


@pytest.mark.slow
def test_killed_mid_write_in_a_git_clone(series, git_clone_tree):
    clone = git_clone_tree("0.5.23")
    pristine = tree_hashes(clone)
    proc = run_cli("apply", str(clone), "--series", str(DEMO_SERIES), env={"SM120KIT_FAULT_AFTER_WRITES": "1"})
    assert proc.returncode == -9
    # The next apply repairs first; the half-written file does not count as a dirty git file.
    fixed = run_cli("apply", str(clone), "--series", str(DEMO_SERIES))
    assert fixed.returncode == 0, fixed.stderr
    assert run_cli("revert", str(clone)).returncode == 0
    assert tree_hashes(clone) == pristine
    assert git.Repo(clone).git.status("--porcelain", "--ignored") == ""


def test_second_run_waits_then_names_the_lock_holder(series, installed_tree):
    package = installed_tree("0.5.2", link=True)  # only the patch manager writes to it
    store = StateStore(package.parent)
    store.ensure()
    with TreeLock(store.lock_path, command="apply (held by the test)"):
        start = time.monotonic()
        proc = run_cli("apply", str(package), "--series", str(DEMO_SERIES), env={"SM120KIT_LOCK_WAIT": "1"})
        waited = time.monotonic() - start
    assert proc.returncode == 7
    assert f"pid {os.getpid()}" in proc.stderr and "apply (held by the test)" in proc.stderr
    assert waited >= 1.0
    assert not (package / "sglang/srt/sm120kit_demo.py").exists()
    # Once released, the next run goes through.
    assert run_cli("apply", str(package), "--series", str(DEMO_SERIES)).returncode == 0


def _make_read_only(folder: Path) -> callable:
    """Make ``folder`` unwritable even for root (immutable flag) or by permissions for other users."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        return lambda: folder.chmod(mode)
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: no way to make a folder read-only for root here")
    proc = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"running as root and chattr +i is refused here ({proc.stderr.strip()})")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_read_only_tree_is_an_io_failure_naming_the_path(series, installed_tree):
    package = installed_tree("0.5.2")
    before = tree_hashes(package.parent)
    restore = _make_read_only(package)
    try:
        with pytest.raises(IOFailure) as info:
            apply_series(find_target(package), series)
        assert str(package / STATE_DIR) in info.value.message
    finally:
        restore()
    # A read-only sub-folder is found before the first write.
    folder = package / "srt/layers/attention/triton_ops"
    restore = _make_read_only(folder)
    try:
        proc = run_cli("apply", str(package), "--series", str(DEMO_SERIES))
        assert proc.returncode == 7
        assert str(folder) in proc.stderr and "Nothing was changed" in proc.stderr
    finally:
        restore()
    # A refused run leaves nothing behind, not even an empty state folder.
    assert tree_hashes(package.parent) == before
    assert not (package / STATE_DIR).exists()


def test_edit_after_apply_is_refused_then_kept_on_force(series, installed_tree):
    package = installed_tree("0.5.10", link=True)  # the test edits only the module apply creates
    root = package.parent
    pristine = tree_hashes(root)
    apply_series(find_target(package), series)
    demo = package / "srt/sm120kit_demo.py"
    demo.write_text(demo.read_text() + "LOCAL_EDIT = 1\n")

    status = series_status(find_target(package), series)
    assert {f.path: f.condition for f in status.files}["sglang/srt/sm120kit_demo.py"] == "edited"
    assert status.exit_code == 6

    refused = run_cli("revert", str(package))
    assert refused.returncode == 6 and "sglang/srt/sm120kit_demo.py" in refused.stderr
    assert "LOCAL_EDIT" in demo.read_text()

    forced = run_cli("revert", str(package), "--force", "--json")
    assert forced.returncode == 0
    data = json.loads(forced.stdout)
    [copy] = data["kept_copies"]
    assert Path(copy).read_text().endswith("LOCAL_EDIT = 1\n")
    assert copy in forced.stdout
    assert not demo.exists()
    after = tree_hashes(root)
    assert {k: v for k, v in after.items() if STATE_DIR not in k} == pristine
    assert all(
        f"{STATE_DIR}/kept/" in k or k.endswith(f"{STATE_DIR}/.gitignore") for k in after.keys() - pristine.keys()
    )


def test_patched_file_deleted_after_apply_is_named_not_kept(tmp_path):
    """status names the deleted file (not 'not-applicable'); revert --force claims no copy it did not make."""
    package = small_tree(tmp_path / "site")
    root = package.parent
    pristine = tree_hashes(root)
    series = utils_series(tmp_path / "series", root)
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    utils = package / "srt/utils.py"
    utils.unlink()

    status = run_cli("status", str(package), "--series", str(series), "--json")
    assert status.returncode == 6
    data = json.loads(status.stdout)
    [row] = data["patches"]
    assert row["status"] == "file-missing" and "sglang/srt/utils.py" in row["reason"], row
    assert "deleted after apply" in row["reason"]
    assert data["files"] == [{"path": "sglang/srt/utils.py", "condition": "missing"}]
    assert any("sglang/srt/utils.py" in p and "deleted" in p for p in data["problems"]), data["problems"]
    assert not any("keeps a copy" in p for p in data["problems"]), data["problems"]

    refused = run_cli("revert", str(package))
    assert refused.returncode == 6 and "deleted after sm120kit patched them: sglang/srt/utils.py" in refused.stderr
    assert not utils.exists()

    forced = run_cli("revert", str(package), "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    data = json.loads(forced.stdout)
    assert data["kept_copies"] == [] and data["files"][0]["kept_copy"] is None
    assert not any("a copy is kept" in w for w in data["warnings"]), data["warnings"]
    assert any("deleted after apply" in w and "sglang/srt/utils.py" in w for w in data["warnings"])
    assert tree_hashes(root) == pristine  # the original is back; no kept/ folder, no state folder


def test_damaged_state_record_is_reported_not_trusted(series, installed_tree):
    package = installed_tree("0.5.6", link=True)  # the test edits only the state record apply creates
    apply_series(find_target(package), series)
    state = package / STATE_DIR / "state.json"
    state.write_text(state.read_text()[:40])
    with pytest.raises(StateDamagedError, match="cannot be read"):
        revert_series(find_target(package))
    proc = run_cli("apply", str(package), "--series", str(DEMO_SERIES))
    assert proc.returncode == 6 and str(state) in proc.stderr and "Traceback" not in proc.stderr
    status = run_cli("status", str(package), "--series", str(DEMO_SERIES), "--json")
    assert status.returncode == 6
    assert any("cannot be read" in p for p in json.loads(status.stdout)["problems"])


def test_already_applied_is_found_without_a_state_record(series, installed_tree):
    """Reverse-apply detection: the patched files alone tell which patches are in."""
    package = installed_tree("0.5.23", link=True)  # only the patch manager writes to it
    apply_series(find_target(package), series)
    shutil.rmtree(package / STATE_DIR)
    plan = plan_series(package.parent, series, version="0.5.23")
    assert {p.patch_id: p.status for p in plan.patches} == {
        "demo-capability-helper": "present-upstream",
        "demo-extend-attention-note": "already-applied",
        "demo-new-module": "already-applied",
    }
    assert all("no state record" in p.reason for p in plan.patches if p.status == "already-applied")


def test_patch_leaving_a_syntax_error_is_a_conflict(tmp_path, installed_tree):
    package = installed_tree("0.5.2", link=True)  # only the patch manager writes to it
    rel = "sglang/srt/utils.py"
    diff = make_diff(package.parent, rel, lambda t: t.replace("def is_sm90_supported(", "def is_sm90_supported(("))
    folder = write_series(
        tmp_path / "series",
        [{"id": "broken", "diffs": {"0.5.2.diff": diff}, "variants": [("0.5.2.diff", ">=0.5.2", "0.5.2")]}],
    )
    before = tree_hashes(package.parent)
    result = apply_series(find_target(package), load_series(folder))
    [plan] = result.plan.patches
    assert plan.status == "conflict" and "syntax error" in plan.reason and "sglang/srt/utils.py line" in plan.reason
    assert result.exit_code == 4
    assert tree_hashes(package.parent) == before


def test_patches_touching_one_file_in_sequence(tmp_path, installed_tree):
    """The second patch's diff is made on top of the first; both apply, revert undoes both exactly."""
    rel = "sglang/srt/utils/common.py"
    package = installed_tree("0.5.6", link=True, copy=[rel])  # the test edits rel itself
    root = package.parent
    first = make_diff(root, rel, lambda t: t.replace("def is_sm90_supported(", "def is_sm90_supported(  # one\n    "))
    original = (root / rel).read_text()
    (root / rel).write_text(original.replace("def is_sm90_supported(", "def is_sm90_supported(  # one\n    "))
    second = make_diff(root, rel, lambda t: t.replace("# one\n", "# one\n# two\n"))
    (root / rel).write_text(original)
    folder = write_series(
        tmp_path / "series",
        [
            {"id": "one", "diffs": {"a.diff": first}, "variants": [("a.diff", ">=0.5.2", "0.5.6")]},
            {"id": "two", "diffs": {"b.diff": second}, "variants": [("b.diff", ">=0.5.2", "0.5.6")]},
        ],
    )
    pristine = tree_hashes(root)
    result = apply_series(find_target(package), load_series(folder))
    assert result.statuses == {"one": "applied", "two": "applied"}
    assert "# one\n# two\n" in (root / rel).read_text()
    assert [c.patches for c in result.written] == [("one", "two")]
    again = apply_series(find_target(package), load_series(folder))
    assert again.statuses == {"one": "already-applied", "two": "already-applied"} and not again.written
    revert_series(find_target(package))
    assert tree_hashes(root) == pristine


@pytest.mark.slow
def test_commit_between_releases_tries_variants_newest_first(series, git_clone_tree):
    """A clone one commit past v0.5.17 (untagged) has no exact release; the 0.5.23 variant is found."""
    clone = git_clone_tree("0.5.17")
    repo = git.Repo(clone)
    (clone / "NOTES.md").write_text("a later commit\n")
    repo.git.add("NOTES.md")
    repo.git.commit("-q", "-m", "after the release")
    target = find_target(clone)
    release, exact = release_of(target)
    assert (release, exact) == ("0.5.17", False)  # the nearest release tag before HEAD
    plan = plan_series(target.root, series, version=release, exact=exact)
    note = next(p for p in plan.patches if p.patch_id == "demo-extend-attention-note")
    assert note.status == "applies" and note.variant.name == "0.5.23.diff"
    # The same, with no version at all.
    plan = plan_series(target.root, series, version=None)
    assert next(p for p in plan.patches if p.patch_id == "demo-extend-attention-note").variant.name == "0.5.23.diff"


def _small_clone(folder: Path) -> git.Repo:
    """A git clone layout (``python/sglang``) of ``small_tree`` whose package states no version (as SGLang's
    main from 0.5.10 on: ``version.py`` computes it, ``_version.py`` is written at build time), with the
    release tag v0.5.2 on its first commit and one commit after it."""
    package = small_tree(folder / "python")
    (package / "version.py").write_text(
        'try:\n    from sglang._version import __version__\nexcept ImportError:\n    __version__ = "0.0.0.dev0"\n'
    )
    repo = git.Repo.init(folder)
    repo.git.config("user.email", "t@example.com")
    repo.git.config("user.name", "t")
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "release")
    repo.git.tag("v0.5.2")
    (folder / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\ndynamic = ["version"]\n')
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "later")
    return repo


def test_release_label_prefers_the_version_the_tree_states_and_names_its_source(tmp_path):
    """A clone whose history has no newer release tag is labelled from the tree's own version files first
    (here a static pyproject.toml version), and the label says where it came from."""
    clone = tmp_path / "clone"
    repo = _small_clone(clone)
    # No version in the tree: the nearest tag, said to be that.
    release, exact, source = release_and_source(find_target(clone))
    assert (release, exact) == ("0.5.2", False)
    assert "v0.5.2" in source and "git describe" in source and "states none" in source
    # The tree states its release in python/pyproject.toml (SGLang up to 0.5.9): that wins over the tag, and
    # with no v0.5.9 tag in the clone for HEAD to be after, the tree is that release.
    (clone / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.9"\n')
    repo.git.commit("-q", "-am", "0.5.9 in pyproject")
    target = find_target(clone)
    assert target.version == "0.5.9" and target.version_source == "python/pyproject.toml"
    stated = "stated by python/pyproject.toml (the clone has no v0.5.9 tag that HEAD could be after)"
    assert release_and_source(target) == ("0.5.9", True, stated)
    assert release_of(target) == ("0.5.9", True)
    series = utils_series(tmp_path / "series", clone / "python")
    proc = run_cli("status", str(clone), "--series", str(series))
    assert proc.returncode == 0, proc.stderr
    assert "0.5.9 @ " in proc.stdout and "release stated by python/pyproject.toml" in proc.stdout, proc.stdout
    data = json.loads(run_cli("apply", str(clone), "--series", str(series), "--dry-run", "--json").stdout)
    assert data["release"] == "0.5.9" and data["release_source"] == stated
    assert data["target"]["version_source"] == "python/pyproject.toml"
    # A _version.py (written by an editable install) is read before pyproject.toml.
    (clone / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.5.10.dev3'\n")
    assert release_and_source(find_target(clone))[::2] == ("0.5.10.dev3", "stated by python/sglang/_version.py")


@pytest.mark.slow
def test_plan_on_a_git_worktree_python_folder(series, git_clone_tree, tmp_path):
    """plan_series works on any folder holding sglang/, e.g. a temporary worktree's python/."""
    clone = git_clone_tree("0.5.10")
    worktree = tmp_path / "wt"
    git.Repo(clone).git.worktree("add", "--detach", str(worktree), "v0.5.10")
    before = tree_hashes(worktree)
    plan = plan_series(worktree / "python", series, version="0.5.10")
    assert plan.ok and {c.path for c in plan.changes} == DEMO_FILES["0.5.10"]
    assert tree_hashes(worktree) == before


def test_recorded_patch_whose_lines_were_edited_is_a_conflict_not_upstream(series, installed_tree):
    """Its own marker still matches, but the state record says sm120kit put those lines there."""
    package = installed_tree("0.5.23", link=True, copy=DEMO_FILES["0.5.23"])  # the test edits one of them
    apply_series(find_target(package), series)
    path = package / "kernels/ops/attention/extend_attention.py"
    path.write_text(path.read_text().replace("# sm120kit demo note: the block sizes", "# edited note: the block"))
    status = series_status(find_target(package), series)
    row = next(r for r in status.rows() if r["id"] == "demo-extend-attention-note")
    assert row["status"] == "conflict" and "state record lists it as applied" in row["reason"]
    assert {f.path: f.condition for f in status.files}["sglang/kernels/ops/attention/extend_attention.py"] == "edited"


def test_apply_refuses_to_rewrite_a_file_edited_after_apply(tmp_path, installed_tree):
    """A new patch on a file the user edited after apply would hide the edit from a later revert."""
    rel = "sglang/srt/utils.py"
    package = installed_tree("0.5.2", link=True, copy=[rel])  # the test edits rel itself
    root = package.parent
    one = make_diff(root, rel, lambda t: t.replace("def is_sm90_supported(", "def is_sm90_supported(  # one\n    "))
    folder = write_series(
        tmp_path / "s1", [{"id": "one", "diffs": {"a.diff": one}, "variants": [("a.diff", ">=0.5.2", "0.5.2")]}]
    )
    assert apply_series(find_target(package), load_series(folder)).exit_code == 0
    (root / rel).write_text((root / rel).read_text() + "# my edit\n")
    two = make_diff(root, rel, lambda t: t.replace("def is_blackwell():", "def is_blackwell():  # two"))
    (folder / "series.toml").write_text('patches = ["one", "two"]\n')
    write_series(
        tmp_path / "s2", [{"id": "two", "diffs": {"b.diff": two}, "variants": [("b.diff", ">=0.5.2", "0.5.2")]}]
    )
    shutil.move(str(tmp_path / "s2" / "two"), folder / "two")
    before = tree_hashes(root)
    with pytest.raises(StateDamagedError, match="changed after sm120kit patched it"):
        apply_series(find_target(package), load_series(folder))
    assert tree_hashes(root) == before
