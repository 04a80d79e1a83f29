"""Run inside a private mount namespace with a small tmpfs at ARGV[1] (see test_diskfull_hostile.py).

The disk-full cases of the hostile trials, each on the tmpfs with the real CLI:

- ``rollback``: an apply that modifies a file, creates a big one, then runs out of space on a third; the
  roll-back must delete the created file first (freeing its space) and then put the modified one back;
- ``refused``: an apply with 0 and with 4 KiB free must leave no ``.sm120kit/`` behind;
- ``unpack``: ``fetch-release`` unpacking a real wheel (linked from outside the tmpfs) into a cache there;
- ``workcopy``: ``apply --release`` copying a real release (linked from outside) into a work copy there.

Prints one JSON document with what it saw; the tmpfs vanishes with the namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from apply_support import DEMO_SERIES, make_diff, small_tree, tree_hashes, write_series
from diskfull_probe import fill, fill_up
from repo_paths import REPO_ROOT

K = 1024


def cli(*args: str, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, NO_COLOR="1", **(env or {})),
    )
    return {"rc": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout}


def lines(prefix: str, size: int) -> str:
    """About ``size`` bytes of valid Python: ``PREFIX_i = "000...i"`` lines."""
    return "".join(f'{prefix}_{i} = "{i:0>40}"\n' for i in range(size // (len(prefix) + 48)))


def rollback(mount: Path, series_dir: Path) -> dict:
    package = small_tree(mount / "rollback")
    root = package.parent
    (package / "srt" / "a_mod.py").write_text(lines("A", 100 * K))
    (package / "srt" / "c_big.py").write_text(lines("C", 400 * K))
    diff = make_diff(root, "sglang/srt/a_mod.py", lambda t: t.replace('A_5 = "', 'A_5 = "-'))
    new = "".join(f"+{line}" for line in lines("B", 300 * K).splitlines(True))
    diff += (
        f"diff --git a/sglang/srt/b_new.py b/sglang/srt/b_new.py\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/sglang/srt/b_new.py\n@@ -0,0 +1,{new.count(chr(10))} @@\n{new}"
    )
    diff += make_diff(root, "sglang/srt/c_big.py", lambda t: t.replace('C_5 = "', 'C_5 = "-'))
    series = write_series(
        series_dir, [{"id": "three-files", "diffs": {"a.diff": diff}, "variants": [("a.diff", ">=0.5", "0.5.2")]}]
    )
    before = tree_hashes(root)
    # Room for the saved originals (a and c, 500 KiB), the journal and lock, a and b; not for c.
    filler = fill(mount, leave=500 * K + 16 * K + 350 * K)
    out = {"apply": cli("apply", str(package), "--series", str(series))}
    out["same"] = tree_hashes(root) == before
    out["temp_files"] = sorted(str(p) for p in root.rglob("*.tmp"))
    out["state_dir_left"] = (package / ".sm120kit").exists()
    filler.unlink()
    return out


def refused(mount: Path, series_dir: Path) -> dict:
    out = {}
    for leave in (0, 4 * K):
        package = small_tree(mount / f"refused-{leave}")
        root = package.parent
        diff = make_diff(root, "sglang/srt/utils.py", lambda t: t.replace("return 3\n", "return 3  # sm120\n"))
        series = write_series(
            series_dir / str(leave),
            [{"id": "one", "diffs": {"a.diff": diff}, "variants": [("a.diff", ">=0.5", "0.5.2")]}],
        )
        before = tree_hashes(root)
        filler = fill_up(mount) if leave == 0 else fill(mount, leave=leave)
        out[str(leave)] = {
            **cli("apply", str(package), "--series", str(series)),
            "same": tree_hashes(root) == before,
            "state_dir_left": (package / ".sm120kit").exists(),
        }
        filler.unlink()
    return out


def unpack(mount: Path, wheel: Path) -> dict:
    cache = mount / "cache-unpack"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / wheel.name).symlink_to(wheel)
    out = cli("fetch-release", "0.5.2", "--json", env={"SM120KIT_CACHE_DIR": str(cache)})
    out["left"] = (
        sorted(str(p.relative_to(cache)) for p in (cache / "releases").iterdir())
        if (cache / "releases").is_dir()
        else []
    )
    return out


def workcopy(mount: Path, release: Path) -> dict:
    cache = mount / "cache-work"
    (cache / "releases").mkdir(parents=True)
    (cache / "releases" / "0.5.2").symlink_to(release, target_is_directory=True)
    out = cli("apply", "--release", "0.5.2", "--series", str(DEMO_SERIES), env={"SM120KIT_CACHE_DIR": str(cache)})
    out["left"] = sorted(p.name for p in (cache / "work").iterdir()) if (cache / "work").is_dir() else []
    return out


def main() -> None:
    mount, series_dir, wheel, release = (Path(a) for a in sys.argv[1:5])
    print(
        json.dumps(
            {
                "rollback": rollback(mount, series_dir / "rollback"),
                "refused": refused(mount, series_dir / "refused"),
                "unpack": unpack(mount, wheel),
                "workcopy": workcopy(mount, release),
            }
        )
    )


if __name__ == "__main__":
    main()
