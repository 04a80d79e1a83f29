"""scripts/test.sh refuses to start on a disk too full for the run, before it creates or installs anything.

A CI run once failed 500 tests after 463 s with "No space left on device": old pytest folders filled the disk. The
script now checks the free space of the temporary folder, and of the virtual environment's and the release cache's
folders where they are still to be made, against what a clean-clone run took; ``SM120KIT_TEST_FREE_MB`` stands in
for those figures here, as this machine's disk is not full.
"""

from __future__ import annotations

import os
import subprocess

from conftest import REPO_ROOT


def _run(tmp_path, free_mb: int) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path / "tmp"),
        "SM120KIT_VENV": str(tmp_path / "venv"),
        "SM120KIT_CACHE_DIR": str(tmp_path / "cache"),
        "SM120KIT_TEST_FREE_MB": str(free_mb),
    }
    (tmp_path / "tmp").mkdir()
    return subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "test.sh"), "--co", "-q", "tests/project/test_test_script.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_disk_without_room_stops_the_run_before_anything_is_made(tmp_path):
    proc = _run(tmp_path, 1 << 40)
    assert proc.returncode == 28, proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'tmp'} has ") and "MB free" in proc.stderr
    assert "each test's copy of an SGLang release" in proc.stderr and "TMPDIR" in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "venv").exists() and not (tmp_path / "cache").exists()
