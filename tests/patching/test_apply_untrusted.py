"""What the patch manager never trusts: paths and modes read back from the state record and the journal,
symbolic links in the state folder or in the tree, file modes and paths from diffs, and the cost of
upstream markers. Each case runs the real CLI on real files and checks that nothing outside the tree,
and nothing inside it, was changed."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
from apply_support import DEMO_SERIES, run_cli, small_tree, tree_hashes, utils_series
from conftest import quick_first

from sm120kit.patching.state import STATE_DIR

UTILS = "sglang/srt/utils.py"


@pytest.fixture
def applied(tmp_path):
    """A small tree with a one-patch series applied; returns (package, series folder, hashes before)."""
    package = small_tree(tmp_path / "site")
    before = tree_hashes(package.parent)
    series = utils_series(tmp_path / "series", package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 0, proc.stderr
    return package, series, before


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("not sm120kit's to touch\n")
    victim.chmod(0o644)
    return victim


def _journal_for(package: Path, entries: list[dict]) -> None:
    (package / STATE_DIR / "journal.json").write_text(
        json.dumps(
            {"operation": "apply", "started": "", "pid": 1, "host": "h", "state_before": None, "entries": entries}
        )
    )


# -- 1: paths and modes in state.json and the journal ------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    quick_first(
        ["ABSOLUTE", "sglang/../../outside/victim.txt", "sglang/.sm120kit/state.json", 5, "sglang/srt/\x00utils.py"]
    ),
)
def test_state_record_path_outside_the_tree_is_refused(tmp_path, applied, bad):
    package, _, _ = applied
    victim = _victim(tmp_path)
    bad = str(victim) if bad == "ABSOLUTE" else bad
    state = package / STATE_DIR / "state.json"
    _edit_json(state, lambda d: d["files"][0].update(path=bad))
    after_apply = tree_hashes(package.parent)
    for command in (["revert"], ["revert", "--force"], ["status", "--series", str(DEMO_SERIES)]):
        proc = run_cli(*command[:1], str(package), *command[1:])
        assert proc.returncode == 6, (command, proc.stderr)
        assert "files[0].path" in proc.stderr and "Traceback" not in proc.stderr
    assert victim.read_text() == "not sm120kit's to touch\n"
    assert tree_hashes(package.parent) == after_apply


@pytest.mark.parametrize("mode", quick_first(["0o4777", "0o2755", "0o1644", 0o104777, "rwx", True]))
def test_state_record_mode_that_is_not_plain_permission_bits_is_refused(applied, mode):
    package, _, _ = applied
    state = package / STATE_DIR / "state.json"
    _edit_json(state, lambda d: d["files"][0].update(mode=mode))
    after_apply = tree_hashes(package.parent)
    proc = run_cli("revert", str(package))
    assert proc.returncode == 6, proc.stderr
    assert "files[0].mode" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_hashes(package.parent) == after_apply
    assert stat.S_IMODE((package / "srt/utils.py").stat().st_mode) == 0o644


def test_state_record_mode_making_a_file_world_writable_is_refused(applied):
    package, _, _ = applied
    _edit_json(package / STATE_DIR / "state.json", lambda d: d["files"][0].update(mode="0o777"))
    proc = run_cli("revert", str(package))
    assert proc.returncode == 6 and "writable by everyone" in proc.stderr, proc.stderr
    assert stat.S_IMODE((package / "srt/utils.py").stat().st_mode) == 0o644


def test_journal_path_outside_the_tree_is_not_repaired(tmp_path, applied):
    """A journal entry whose 'from' content is in the blobs: repair would write it over the victim."""
    package, _, _ = applied
    victim = _victim(tmp_path)
    blobs = sorted((package / STATE_DIR / "blobs").iterdir())
    original = blobs[0].name
    import hashlib

    victim_hash = hashlib.sha256(victim.read_bytes()).hexdigest()
    for path in (str(victim), "sglang/../../outside/victim.txt"):
        _journal_for(package, [{"path": path, "from": original, "to": victim_hash, "mode": "0o644"}])
        for command in ("apply", "revert"):
            args = ["--series", str(tmp_path / "series")] if command == "apply" else []
            proc = run_cli(command, str(package), *args)
            assert proc.returncode == 6, proc.stderr
            assert "entries[0].path" in proc.stderr and "journal" in proc.stderr
        assert victim.read_text() == "not sm120kit's to touch\n"


def test_journal_mode_with_setuid_is_not_restored(tmp_path, applied):
    package, _, _ = applied
    import hashlib

    utils = package / "srt/utils.py"
    [blob] = [b for b in (package / STATE_DIR / "blobs").iterdir()]
    current = hashlib.sha256(utils.read_bytes()).hexdigest()
    _journal_for(package, [{"path": UTILS, "from": blob.name, "to": current, "mode": "0o4755"}])
    proc = run_cli("revert", str(package))
    assert proc.returncode == 6 and "entries[0].mode" in proc.stderr, proc.stderr
    assert stat.S_IMODE(utils.stat().st_mode) == 0o644
    assert hashlib.sha256(utils.read_bytes()).hexdigest() == current


# -- 2: symbolic links ---------------------------------------------------------------------------------


def _tree_and_series(tmp_path):
    package = small_tree(tmp_path / "site")
    return package, utils_series(tmp_path / "series", package.parent)


def test_symlinked_state_folder_is_refused(tmp_path):
    package, series = _tree_and_series(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep\n")
    (package / STATE_DIR).symlink_to(elsewhere, target_is_directory=True)
    before = tree_hashes(package.parent)
    for command in ("apply", "revert", "status"):
        args = [] if command == "revert" else ["--series", str(series)]
        proc = run_cli(command, str(package), *args)
        assert proc.returncode == 6, (command, proc.stderr)
        assert "symbolic link" in proc.stderr and str(package / STATE_DIR) in proc.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert tree_hashes(package.parent) == before


@pytest.mark.parametrize("name", quick_first(["blobs", "kept", "lock", "state.json", "journal.json"]))
def test_symlink_inside_the_state_folder_is_refused(tmp_path, applied, name):
    package, series, _ = applied
    victim_dir = tmp_path / "victims"
    victim_dir.mkdir()
    for i in range(3):
        (victim_dir / f"file{i}").write_text(f"victim {i}\n")
    link = package / STATE_DIR / name
    if link.is_dir():
        import shutil

        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.symlink_to(victim_dir if name in ("blobs", "kept") else victim_dir / "file0")
    for command in ("apply", "revert"):
        args = ["--series", str(series)] if command == "apply" else []
        proc = run_cli(command, str(package), *args)
        assert proc.returncode == 6, (command, name, proc.stderr)
        assert "symbolic link" in proc.stderr
    assert {p.name: p.read_text() for p in victim_dir.iterdir()} == {f"file{i}": f"victim {i}\n" for i in range(3)}


def test_patched_file_that_is_a_symlink_is_a_conflict(tmp_path):
    package, series = _tree_and_series(tmp_path)
    outside = tmp_path / "outside-utils.py"
    utils = package / "srt/utils.py"
    outside.write_bytes(utils.read_bytes())
    utils.unlink()
    utils.symlink_to(outside)
    before = outside.read_bytes()
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 4, proc.stderr
    assert "symbolic link" in proc.stdout
    assert utils.is_symlink() and outside.read_bytes() == before
    assert not (package / STATE_DIR).exists()


def test_folder_linked_out_of_the_tree_is_never_written_through(tmp_path):
    package, series = _tree_and_series(tmp_path)
    outside = tmp_path / "outside-srt"
    (package / "srt").rename(outside)
    (package / "srt").symlink_to(outside, target_is_directory=True)
    before = tree_hashes(outside)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 4, proc.stderr
    assert "leads out of the tree" in proc.stdout
    assert tree_hashes(outside) == before


def test_recorded_file_replaced_by_a_symlink_is_not_reverted_through_it(tmp_path, applied):
    package, _, _ = applied
    victim = _victim(tmp_path)
    utils = package / "srt/utils.py"
    utils.unlink()
    utils.symlink_to(victim)
    proc = run_cli("revert", str(package), "--force")
    assert proc.returncode == 6 and "symbolic link" in proc.stderr, proc.stderr
    assert utils.is_symlink() and victim.read_text() == "not sm120kit's to touch\n"


# -- 3, 4: modes and paths in diffs ----------------------------------------------------------------------


def _new_file_diff(path: str, mode: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\nindex 0000000..1111111\n--- /dev/null\n"
        f"+++ b/{path}\n@@ -0,0 +1 @@\n+X = 1\n"
    )


@pytest.mark.parametrize("mode", ["104777", "120000", "100777", "160000"])
def test_new_file_mode_other_than_regular_is_a_series_error(tmp_path, mode):
    package, _ = _tree_and_series(tmp_path)
    series = utils_series(tmp_path / "s2", package.parent, extra_diff=_new_file_diff("sglang/srt/new.py", mode))
    diff = series / "edit-utils" / "a.diff"
    line = diff.read_text().splitlines().index(f"new file mode {mode}") + 1
    before = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 8, proc.stderr
    assert f"{diff}:{line}:" in proc.stderr and mode in proc.stderr
    assert tree_hashes(package.parent) == before


def test_new_file_mode_100755_is_kept(tmp_path):
    package, _ = _tree_and_series(tmp_path)
    series = utils_series(tmp_path / "s2", package.parent, extra_diff=_new_file_diff("sglang/srt/tool.py", "100755"))
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    assert stat.S_IMODE((package / "srt/tool.py").stat().st_mode) == 0o755


@pytest.mark.parametrize("path", ["sglang/.sm120kit/state.json", "sglang/.sm120kit/blobs/x"])
def test_diff_into_the_state_folder_is_a_series_error(tmp_path, path):
    package, _ = _tree_and_series(tmp_path)
    series = utils_series(tmp_path / "s2", package.parent, extra_diff=_new_file_diff(path, "100644"))
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 8, proc.stderr
    assert "state folder" in proc.stderr and "a.diff:" in proc.stderr
    assert not (package / STATE_DIR).exists()


# -- 5: marker cost ---------------------------------------------------------------------------------------


def test_catastrophic_marker_does_not_hang(tmp_path):
    """'^(x+x+)+y' takes exponential time with a backtracking engine on a line of x's."""
    package = small_tree(
        tmp_path / "site",
        utils="x" * 5000 + "\n" + "".join(f"def helper_{i}():\n    return {i}\n\n\n" for i in range(40)),
    )
    series = utils_series(tmp_path / "series", package.parent, markers=[(UTILS, "^(x+x+)+y")])
    start = time.monotonic()
    proc = run_cli("apply", str(package), "--series", str(series), "--dry-run")
    assert time.monotonic() - start < 30
    assert proc.returncode == 0, proc.stderr
    assert "applies" in proc.stdout


@pytest.mark.parametrize("pattern", ["(a)\\1", "foo(?=bar)", "(?<!x)y"])
def test_marker_needing_backtracking_is_a_series_error(tmp_path, pattern):
    package = small_tree(tmp_path / "site")
    series = utils_series(tmp_path / "series", package.parent, markers=[(UTILS, pattern)])
    proc = run_cli("apply", str(package), "--series", str(series), "--dry-run")
    assert proc.returncode == 8, proc.stderr
    toml = series / "edit-utils" / "patch.toml"
    assert f"{toml}:" in proc.stderr and "not a valid regular expression" in proc.stderr


def test_markers_still_report_present_upstream(tmp_path):
    package = small_tree(tmp_path / "site")
    series = utils_series(tmp_path / "series", package.parent, markers=[(UTILS, r"(?i)^DEF HELPER_7\(\)")])
    proc = run_cli("apply", str(package), "--series", str(series), "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["patches"]
    assert row["status"] == "present-upstream" and "sglang/srt/utils.py:29" in row["reason"]
