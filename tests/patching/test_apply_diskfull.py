"""Disk full mid-write, on a real 2 MiB tmpfs mounted in a private user and mount namespace (unshare).
Skipped, with the reason, where the machine does not allow it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUPPORT_DIR

PROBE = SUPPORT_DIR / "diskfull_probe.py"
SIZE = "2m"


def _namespace_argv(mount: Path) -> list[str]:
    """``unshare`` arguments that give a private mount namespace where a tmpfs may be mounted, or skip."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: no way to mount a small tmpfs as this user")
    errors = []
    for flags in (["--user", "--map-root-user", "--mount"], ["--mount"]):
        argv = [unshare, *flags, "sh", "-c", f"mount -t tmpfs -o size={SIZE} tmpfs '{mount}'"]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            return [unshare, *flags]
        errors.append(f"unshare {' '.join(flags)}: {proc.stderr.strip() or proc.returncode}")
    pytest.skip("this machine allows no tmpfs in a user or mount namespace (" + "; ".join(errors) + ")")


def test_disk_full_mid_write_rolls_back_and_says_so(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    ns = _namespace_argv(mount)
    script = f'mount -t tmpfs -o size={SIZE} tmpfs "$1" && exec "$2" "$3" "$1" "$4"'
    proc = subprocess.run(
        [*ns, "sh", "-c", script, "sh", str(mount), sys.executable, str(PROBE), str(tmp_path / "series")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)

    full = seen["apply_full"]
    assert full["rc"] == 7, full
    assert "No space left on device" in full["stderr"] and "zz_big.py" in full["stderr"]
    assert "the 1 file(s) it had written were put back" in full["stderr"]
    assert "exactly as it was before this 'apply'" in full["stderr"] and "Traceback" not in full["stderr"]
    assert seen["same_after_full"] and seen["temp_files"] == [] and not seen["state_dir_left"]

    assert seen["apply_room"]["rc"] == 0, seen["apply_room"]
    lock = seen["revert_no_room"]
    assert lock["rc"] == 7, lock
    assert "lock file" in lock["stderr"] and "No space left on device" in lock["stderr"]
    assert "internal error" not in lock["stderr"] and "Traceback" not in lock["stderr"]
    assert seen["same_after_lock"]
    assert seen["revert_room"]["rc"] == 0 and seen["pristine_at_end"]
