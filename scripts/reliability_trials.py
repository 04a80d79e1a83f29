"""Trials of the patch manager against interruptions, for docs/reliability.md.

Usage: python scripts/reliability_trials.py [--seed N] [--kills N] [--signals N] [--timed N] [--probe N]
                                           [--cleanup N] [--hostile] [--release X]

Each trial runs the real CLI (``python -m sm120kit``) on a tree and checks every byte and mode after it:

- kills: SIGKILL at a random journaled write (right after a replace, or inside a write after the temporary
  file is written), during apply or revert, sometimes again during the repair; after each, every file
  must be wholly original or wholly patched, and the next run must repair. At the end: no temporary file,
  and revert gives the original bytes.
- signals: SIGINT or SIGTERM at a random journaled write (same hooks, SM120KIT_FAULT_SIGNAL); the run
  must exit 130 and leave the tree exactly as before.
- timed: SIGINT at a random wall-clock moment of a whole apply; the tree must be wholly original or
  wholly patched, with no temporary file.
- probe: SIGINT, SIGTERM or SIGKILL while apply's writability probe file exists (SM120KIT_FAULT_IN_PROBE);
  INT/TERM must exit 130 with the tree as before and no probe file; after KILL the next apply must remove
  the probe file it left, and revert give the original bytes.
- cleanup: SIGINT, SIGTERM or SIGKILL at a random step of a revert's final removal of the state folder
  (SM120KIT_FAULT_IN_CLEANUP); INT/TERM must finish the removal (exit 130, tree byte-identical); after KILL
  the folder left must keep its .gitignore, status must name it (exit 6) and the next revert remove it.
- hostile (``--hostile``): the hostile-input cases of docs/reliability.md, which are tests: runs them with
  pytest (tests/patching/test_apply_hostile.py, test_release_cache_hostile.py, test_fetch_deps_untrusted.py,
  test_diskfull_hostile.py) and prints pytest's summary.

The tree is a copy of the cached SGLang release (``--release``, default 0.5.2), and the series the test
series in tests/data/demo-series plus one that changes nine small files, so there is a write phase to
hit. Prints one line per kind with counts and the wall time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = "sglang/.sm120kit/"


def hashes(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.stat().st_mode & 0o7777,
            )
    return out


def files(h: dict) -> dict:
    return {k: v for k, v in h.items() if not k.startswith(STATE)}


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, NO_COLOR="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=600
    )


def make_series(root: Path, folder: Path) -> Path:
    """Nine files of the tree changed by one patch (eight edits and a new file)."""
    import difflib

    diff = ""
    for i in range(8):
        rel = f"sglang/srt/sm120kit_trial_{i}.py"
        text = "".join(f"VALUE_{j} = {j}\n" for j in range(30))
        (root / rel).write_text(text)
        new = text.replace("VALUE_7 = 7\n", f"VALUE_7 = 7  # trial {i}\n")
        diff += "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))
    diff += (
        "diff --git a/sglang/srt/sm120kit_trial_new.py b/sglang/srt/sm120kit_trial_new.py\n"
        "new file mode 100644\n--- /dev/null\n+++ b/sglang/srt/sm120kit_trial_new.py\n@@ -0,0 +1 @@\n"
        "+ADDED = True\n"
    )
    patch = folder / "trial"
    patch.mkdir(parents=True)
    (patch / "a.diff").write_text(diff)
    (patch / "patch.toml").write_text(
        'id = "trial"\ntitle = "trial"\ndescription = "trial edits"\nproblem = "none"\n\n[upstream]\n'
        'forwarded = false\nreason = "trials"\n\n[[variants]]\ndiff = "a.diff"\nreleases = ">=0.5"\n'
        'base = "0.5.2"\n\n[[markers]]\nfile = "sglang/srt/never.py"\npattern = \'never\'\n'
    )
    (folder / "series.toml").write_text('patches = ["trial"]\n')
    return folder


def fresh_tree(base: Path, release_dir: Path, n: int) -> tuple[Path, Path]:
    site = base / f"site{n}"
    shutil.copytree(release_dir, site)
    series = make_series(site, base / f"series{n}")
    return site / "sglang", series


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--signals", type=int, default=40)
    parser.add_argument("--timed", type=int, default=20)
    parser.add_argument("--probe", type=int, default=20)
    parser.add_argument("--cleanup", type=int, default=20)
    parser.add_argument("--hostile", action="store_true", help="also run the hostile-input tests")
    parser.add_argument("--release", default="0.5.2")
    args = parser.parse_args()
    from sm120kit.sglang import releases

    release_dir = releases.fetch_release(args.release)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="sm120kit-trials-"))
    hooks = ("SM120KIT_FAULT_AFTER_WRITES", "SM120KIT_FAULT_IN_WRITE")
    try:
        # What a complete apply leaves.
        package, series = fresh_tree(work, release_dir, 0)
        pristine = hashes(package.parent)
        assert cli("apply", str(package), "--series", str(series)).returncode == 0
        done = files(hashes(package.parent))
        assert cli("revert", str(package)).returncode == 0 and hashes(package.parent) == pristine

        start = time.monotonic()
        stats = {"runs": 0, "killed": 0, "half_files": 0, "temp_left_after_repair": 0, "repairs": 0}
        for _ in range(args.kills):
            hook = rng.choice(hooks)
            command = rng.choice(["apply", "revert"])
            extra = ["--series", str(series)] if command == "apply" else []
            proc = cli(command, str(package), *extra, env={hook: str(rng.randint(1, 9))})
            stats["runs"] += 1
            stats["killed"] += proc.returncode == -9
            if rng.random() < 0.25:
                proc = cli("apply", str(package), "--series", str(series), env={hook: "1"})
                stats["runs"] += 1
                stats["killed"] += proc.returncode == -9
            now = {k: v for k, v in files(hashes(package.parent)).items() if not k.endswith(".tmp")}
            stats["half_files"] += sum(
                now.get(k) not in (pristine.get(k), done.get(k)) for k in now.keys() | done.keys()
            )
            fixed = cli("status", str(package), "--series", str(series))
            if fixed.returncode == 6:
                repaired = cli("apply", str(package), "--series", str(series))
                stats["repairs"] += repaired.returncode == 0
                stats["temp_left_after_repair"] += sum(k.endswith(".tmp") for k in hashes(package.parent))
        assert cli("apply", str(package), "--series", str(series)).returncode == 0
        final_revert = cli("revert", str(package)).returncode == 0 and hashes(package.parent) == pristine
        print(
            f"kills: {stats['runs']} runs, {stats['killed']} killed by SIGKILL, {stats['repairs']} repaired by "
            f"the next apply, {stats['half_files']} half-written files, {stats['temp_left_after_repair']} "
            f"temporary files left after a repair; final revert byte-identical: {final_revert}; "
            f"{time.monotonic() - start:.0f} s"
        )

        start = time.monotonic()
        rolled = exact = 0
        for _ in range(args.signals):
            hook = rng.choice(hooks)
            sig = rng.choice(["INT", "TERM"])
            proc = cli(
                "apply",
                str(package),
                "--series",
                str(series),
                env={hook: str(rng.randint(1, 9)), "SM120KIT_FAULT_SIGNAL": sig},
            )
            rolled += proc.returncode == 130 and "were put back" in proc.stderr
            exact += hashes(package.parent) == pristine
        print(
            f"signals: {args.signals} applies stopped by SIGINT/SIGTERM at a random write, {rolled} exited "
            f"130 saying the files were put back, {exact} left the tree byte-identical to the original; "
            f"{time.monotonic() - start:.0f} s"
        )

        start = time.monotonic()
        outcome = {"rolled back or not started": 0, "finished": 0, "half": 0, "temp": 0}
        for n in range(args.timed):
            package, series = fresh_tree(work, release_dir, n + 1)
            before = hashes(package.parent)
            child = subprocess.Popen(
                [sys.executable, "-m", "sm120kit", "apply", str(package), "--series", str(series)],
                cwd=REPO,
                env=dict(os.environ, NO_COLOR="1"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(rng.uniform(0.2, 2.5))
            child.send_signal(signal.SIGINT)
            child.wait(timeout=600)
            now = hashes(package.parent)
            outcome["temp"] += sum(k.endswith(".tmp") for k in now)
            if now == before:
                outcome["rolled back or not started"] += 1
            elif files(now) == done:
                outcome["finished"] += 1
            else:
                outcome["half"] += 1
            shutil.rmtree(package.parent)
        print(
            f"timed: {args.timed} applies sent SIGINT at a random moment: "
            + ", ".join(f"{v} {k}" for k, v in outcome.items())
            + f"; {time.monotonic() - start:.0f} s"
        )

        package, series = fresh_tree(work, release_dir, args.timed + 1)
        pristine = hashes(package.parent)
        probe_trials(rng, package, series, pristine, args.probe)
        cleanup_trials(rng, package, series, pristine, args.cleanup)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.hostile:
        tests = [
            "tests/patching/test_apply_hostile.py",
            "tests/sglang/test_release_cache_hostile.py",
            "tests/kernel/test_fetch_deps_untrusted.py",
            "tests/patching/test_diskfull_hostile.py",
        ]
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        print("hostile: " + (proc.stdout.strip().splitlines() or ["pytest printed nothing"])[-1])


def probes(root: Path) -> list[Path]:
    return sorted(root.rglob(".sm120kit-probe-*"))


def probe_trials(rng: random.Random, package: Path, series: Path, pristine: dict, count: int) -> None:
    start = time.monotonic()
    seen = {
        "held back (130, unchanged, no probe file)": 0,
        "killed, probe file removed by the next apply": 0,
        "wrong": 0,
    }
    for _ in range(count):
        sig = rng.choice(["INT", "TERM", "KILL"])
        proc = cli(
            "apply",
            str(package),
            "--series",
            str(series),
            env={"SM120KIT_FAULT_IN_PROBE": "1", "SM120KIT_FAULT_SIGNAL": sig},
        )
        if sig != "KILL":
            ok = proc.returncode == 130 and hashes(package.parent) == pristine and not probes(package)
            seen["held back (130, unchanged, no probe file)" if ok else "wrong"] += 1
            continue
        left = probes(package)
        again = cli("apply", str(package), "--series", str(series))
        back = cli("revert", str(package))
        ok = (
            proc.returncode == -9
            and len(left) == 1
            and again.returncode == 0
            and not probes(package)
            and back.returncode == 0
            and hashes(package.parent) == pristine
        )
        seen["killed, probe file removed by the next apply" if ok else "wrong"] += 1
    print(
        f"probe: {count} applies signalled inside the writability probe: "
        + ", ".join(f"{v} {k}" for k, v in seen.items())
        + f"; {time.monotonic() - start:.0f} s"
    )


def cleanup_trials(rng: random.Random, package: Path, series: Path, pristine: dict, count: int) -> None:
    start = time.monotonic()
    seen = {"finished first (130, byte-identical)": 0, "killed, folder ignored, named and removed": 0, "wrong": 0}
    for _ in range(count):
        assert cli("apply", str(package), "--series", str(series)).returncode == 0
        steps = len(list((package / ".sm120kit").rglob("*")))  # entries the removal goes through
        sig = rng.choice(["INT", "TERM", "KILL"])
        proc = cli(
            "revert",
            str(package),
            env={"SM120KIT_FAULT_IN_CLEANUP": str(rng.randint(1, steps)), "SM120KIT_FAULT_SIGNAL": sig},
        )
        if sig != "KILL":
            ok = proc.returncode == 130 and hashes(package.parent) == pristine
            seen["finished first (130, byte-identical)" if ok else "wrong"] += 1
            continue
        left = package / ".sm120kit"
        ignored = (left / ".gitignore").is_file()
        status = cli("status", str(package), "--series", str(series))
        back = cli("revert", str(package))
        ok = (
            proc.returncode == -9
            and ignored
            and status.returncode == 6
            and back.returncode == 0
            and hashes(package.parent) == pristine
        )
        seen["killed, folder ignored, named and removed" if ok else "wrong"] += 1
    print(
        f"cleanup: {count} reverts signalled in the final clean-up: "
        + ", ".join(f"{v} {k}" for k, v in seen.items())
        + f"; {time.monotonic() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
