#!/usr/bin/env python3
"""Time ``sm120kit apply`` of a series on a cached SGLang release against ``git apply`` of the same diffs.

Usage: scripts/bench_apply.py [--release 0.5.23] [--series DIR] [--repeat 5]

Each run gets a fresh copy of the cached release (copying is not timed). Measured in one process run:
- sm120kit in-process: load the series, find the target, plan, write files, journal and state record;
- sm120kit CLI: ``python -m sm120kit apply PATH`` end to end (interpreter start and imports included);
- sm120kit no-op: the same apply again on the patched tree (everything already applied);
- git apply: one ``git apply`` of the variants sm120kit selected (no state, no checks beyond the hunks).
Prints the median of each and the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sm120kit import runner
from sm120kit.patching.engine import apply_series
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import default_series_dir, load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target


def _fresh(pristine: Path, scratch: Path, name: str) -> Path:
    dest = scratch / name
    shutil.copytree(pristine, dest, symlinks=True)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default=releases.DEFAULT_RELEASE)
    parser.add_argument("--series", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    series_dir = args.series or default_series_dir()
    series = load_series(series_dir)
    if not series.patches:
        print(f"the series at {series_dir} is empty; pass --series DIR", file=sys.stderr)
        return 2
    pristine = releases.fetch_release(args.release)
    plan = plan_series(pristine, series, version=args.release)
    diffs = [str(p.variant.diff) for p in plan.patches if p.status == "applies"]
    print(
        f"release {args.release}, series {series.path}: " + ", ".join(f"{p.patch_id}={p.status}" for p in plan.patches)
    )
    print(f"{len(diffs)} diffs to apply, {len(plan.changes)} files change")

    inproc, cli, noop, gitapply = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="sm120kit-bench-") as tmp:
        scratch = Path(tmp)
        for i in range(args.repeat):
            tree = _fresh(pristine, scratch, f"a{i}")
            start = time.perf_counter()
            result = apply_series(find_target(tree / "sglang"), load_series(series_dir))
            inproc.append(time.perf_counter() - start)
            assert result.exit_code == 0 and result.written, result.message

            start = time.perf_counter()
            again = apply_series(find_target(tree / "sglang"), load_series(series_dir))
            noop.append(time.perf_counter() - start)
            assert again.exit_code == 0 and not again.written

            tree = _fresh(pristine, scratch, f"c{i}")
            start = time.perf_counter()
            runner.run(
                runner.python_argv("-m", "sm120kit", "-q", "apply", str(tree / "sglang"), "--series", str(series_dir))
            )
            cli.append(time.perf_counter() - start)

            tree = _fresh(pristine, scratch, f"g{i}")
            start = time.perf_counter()
            runner.run(["git", "apply", "-p1", *diffs], cwd=tree)
            gitapply.append(time.perf_counter() - start)

    med = {
        name: statistics.median(values)
        for name, values in (
            ("sm120kit in-process", inproc),
            ("sm120kit CLI", cli),
            ("sm120kit no-op", noop),
            ("git apply", gitapply),
        )
    }
    base = med["git apply"]
    print(f"\nmedian of {args.repeat} runs:")
    for name, value in med.items():
        print(f"  {name:<20} {value * 1000:8.1f} ms   {value / base:6.2f} x git apply")
    return 0


if __name__ == "__main__":
    sys.exit(main())
