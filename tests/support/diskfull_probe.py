"""Run inside a private mount namespace with a small tmpfs at ARGV[1] (see test_apply_diskfull.py).

Builds a small tree on the tmpfs, leaves just enough room for sm120kit to save the originals and write
the first patched file but not the second, runs the real CLI, and prints one JSON document with what it
saw: exit codes, messages, and the tree's hashes before and after. The tmpfs vanishes with the namespace,
so everything is checked here and reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from apply_support import make_diff, small_tree, tree_hashes, write_series  # beside this file (run as a script)
from repo_paths import REPO_ROOT

BIG = 400 * 1024


def cli(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, NO_COLOR="1"),
    )
    return {"rc": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout}


def fill(folder: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free on the file system of ``folder``."""
    filler = folder / "filler"
    vfs = os.statvfs(folder)
    size = max(vfs.f_bavail * vfs.f_frsize - leave, 0)
    with open(filler, "wb") as handle:
        handle.write(b"\0" * size)
    return filler


def fill_up(folder: Path) -> Path:
    """Fill the file system completely."""
    filler = folder / "filler-all"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def main() -> None:
    mount = Path(sys.argv[1])
    series_dir = Path(sys.argv[2])
    package = small_tree(mount / "site")
    root = package.parent
    (package / "srt" / "zz_big.py").write_text("".join(f"BIG_{i} = {i:0>40}\n" for i in range(BIG // 52)))
    diff = make_diff(root, "sglang/srt/utils.py", lambda t: t.replace("return 3\n", "return 3  # sm120\n"))
    diff += make_diff(root, "sglang/srt/zz_big.py", lambda t: t.replace("BIG_5 = ", "BIG_5 = -"))
    series = write_series(
        series_dir, [{"id": "two-files", "diffs": {"a.diff": diff}, "variants": [("a.diff", ">=0.5", "0.5.2")]}]
    )
    before = tree_hashes(root)
    out: dict = {"big_bytes": (package / "srt" / "zz_big.py").stat().st_size}

    # 1. Room for the saved originals, the journal and the small file, not for the big one.
    filler = fill(mount, leave=BIG + BIG // 2)
    out["free_before"] = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    out["apply_full"] = cli("apply", str(package), "--series", str(series))
    out["same_after_full"] = tree_hashes(root) == before
    out["temp_files"] = sorted(str(p) for p in root.rglob("*.tmp"))
    out["state_dir_left"] = (package / ".sm120kit").exists()
    filler.unlink()

    # 2. With room, the same apply goes through; then no room at all while taking the lock.
    out["apply_room"] = cli("apply", str(package), "--series", str(series))
    (package / ".sm120kit" / "lock").unlink()
    patched = tree_hashes(root)
    filler = fill_up(mount)
    out["revert_no_room"] = cli("revert", str(package))
    out["same_after_lock"] = {k: v for k, v in tree_hashes(root).items() if not k.endswith("/lock")} == patched
    filler.unlink()
    out["revert_room"] = cli("revert", str(package))
    out["pristine_at_end"] = tree_hashes(root) == before
    print(json.dumps(out))


if __name__ == "__main__":
    main()
