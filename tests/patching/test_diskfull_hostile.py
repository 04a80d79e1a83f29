"""The disk-full cases of the hostile trials (docs/reliability.md), on a real 2 MiB tmpfs mounted in a private
user and mount namespace (as tests/patching/test_apply_diskfull.py does); the cases run in
tests/support/diskfull_hostile_probe.py with the real CLI, real trees and a real wheel and release from the cache.
Skipped, with the reason, where the machine does not allow the namespace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SUPPORT_DIR
from test_apply_diskfull import SIZE, _namespace_argv

from sm120kit.util.cache import cache_dir

PROBE = SUPPORT_DIR / "diskfull_hostile_probe.py"


@pytest.fixture(scope="module")
def seen(tmp_path_factory, release_dir):
    tmp = tmp_path_factory.mktemp("diskfull-hostile")
    mount = tmp / "small-disk"
    mount.mkdir()
    ns = _namespace_argv(mount)
    release = release_dir("0.5.2")
    [wheel] = (cache_dir() / "wheels").glob("sglang-0.5.2-*.whl")
    script = "mount -t tmpfs -o size=" + SIZE + ' tmpfs "$1" && exec "$2" "$3" "$1" "$4" "$5" "$6"'
    proc = subprocess.run(
        [
            *ns,
            "sh",
            "-c",
            script,
            "sh",
            str(mount),
            sys.executable,
            str(PROBE),
            str(tmp / "series"),
            str(wheel),
            str(release),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_roll_back_deletes_created_files_first_and_leaves_the_tree_whole(seen):
    """Modified a_mod.py, created b_new.py (300 KiB), then no room for c_big.py: putting a_mod.py back needs
    room that only deleting b_new.py gives."""
    out = seen["rollback"]
    assert out["apply"]["rc"] == 7, out["apply"]
    assert "c_big.py" in out["apply"]["stderr"] and "No space left on device" in out["apply"]["stderr"]
    assert "the 2 file(s) it had written were put back" in out["apply"]["stderr"]
    assert "failed too" not in out["apply"]["stderr"]
    assert out["same"] and out["temp_files"] == [] and not out["state_dir_left"]


@pytest.mark.parametrize("free", ["0", "4096"])
def test_an_apply_refused_for_want_of_space_leaves_no_state_folder(seen, free):
    out = seen["refused"][free]
    assert out["rc"] == 7, out
    assert "No space left on device" in out["stderr"] and "Traceback" not in out["stderr"]
    assert out["same"] and not out["state_dir_left"]


def test_unpacking_a_release_on_a_full_disk_is_exit_7_and_leaves_nothing(seen):
    out = seen["unpack"]
    assert out["rc"] == 7, out
    assert "No space left on device" in out["stderr"] and "Traceback" not in out["stderr"]
    assert json.loads(out["stdout"])["error"] == "io"
    # No partial release is left; the empty per-release lock file fetch_release takes may stay (it holds nothing).
    assert [p for p in out["left"] if not (p.startswith("releases/.") and p.endswith(".lock"))] == []


def test_a_work_copy_on_a_full_disk_is_one_short_paragraph(seen):
    out = seen["workcopy"]
    assert out["rc"] == 7, out
    assert "file(s) of" in out["stderr"] and "could not be copied (No space left on device)" in out["stderr"]
    assert len(out["stderr"]) < 3000, len(out["stderr"])
    assert out["left"] == []
