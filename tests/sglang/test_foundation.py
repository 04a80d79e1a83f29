"""The foundation shared by every command: target detection, release download, the runner, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sm120kit import runner
from sm120kit.errors import MissingDependency, NotSglangTree, ToolFailed
from sm120kit.sglang.target import find_target


def test_installed_tree_is_detected_with_its_version(installed_tree):
    pkg = installed_tree("0.5.23", link=True)  # only read
    for path in (pkg, pkg.parent):
        target = find_target(path)
        assert target.kind == "installed"
        assert target.package_dir == pkg.resolve()
        assert target.version == "0.5.23"
        assert target.commit is None


def test_git_clone_is_detected_with_commit_and_dirty_files(git_clone_tree):
    repo = git_clone_tree("0.5.2")
    target = find_target(repo)
    assert target.kind == "git-clone"
    assert target.version == "0.5.2"
    assert len(target.commit) == 40
    assert target.dirty_files == ()
    (repo / "python" / "sglang" / "srt" / "utils.py").write_text("# edited\n")
    assert find_target(repo / "python").dirty_files == ("sglang/srt/utils.py",)


@pytest.mark.slow
def test_version_of_a_clone_comes_from_the_package_files(git_clone_tree):
    """From 0.5.10 the release lives in sglang/_version.py; a clone has no dist-info to fall back on."""
    assert find_target(git_clone_tree("0.5.23")).version == "0.5.23"


def test_not_sglang_says_what_was_looked_for(tmp_path):
    with pytest.raises(NotSglangTree, match="python/sglang"):
        find_target(tmp_path)
    with pytest.raises(NotSglangTree, match="does not exist"):
        find_target(tmp_path / "missing")


def test_runner_reports_missing_program_and_failure():
    with pytest.raises(MissingDependency, match="no-such-program-xyz"):
        runner.run(["no-such-program-xyz"])
    with pytest.raises(ToolFailed) as info:
        runner.run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    assert info.value.returncode == 3 and "boom" in info.value.output_tail


def test_cli_error_has_exit_code_and_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", "fetch-release", "not-a-version"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "not a release version" in proc.stderr and "Traceback" not in proc.stderr
