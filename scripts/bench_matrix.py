#!/usr/bin/env python3
"""Time ``sm120kit matrix`` over SGLang releases: cold cache, warm cache, and one check per release.

Usage: scripts/bench_matrix.py [--releases 0.5.2..0.5.23] [--series DIR] [--jobs 4] [--no-alternative]

Measured in one process run, each through ``python -m sm120kit`` (interpreter start included):
- cold: ``matrix`` with an empty cache folder (``SM120KIT_CACHE_DIR``) and pip's own cache off, so every
  wheel is downloaded from PyPI and unpacked;
- warm: the same command again on the now-filled cache (the goal: under 60 s for 0.5.2..0.5.23);
- one by one (the alternative): ``check-upstream --release X --json`` once per release on the warm cache,
  one process each, as a script looping over releases would do it.
Prints each time, the matrix's own split (downloads / checks) and the ratios. The cold cache is deleted
afterwards unless --keep-cache is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_WARM_SECONDS = 60.0


def _run(args: list[str], env: dict) -> tuple[float, dict, int]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sm120kit", *args, "--json"], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"sm120kit {' '.join(args)} printed no JSON (exit {proc.returncode})")
    return seconds, data, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default="0.5.2..0.5.23")
    parser.add_argument("--series", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--no-alternative", action="store_true", help="Skip the one-by-one measurement.")
    parser.add_argument("--keep-cache", action="store_true")
    args = parser.parse_args()

    extra = ["--series", str(args.series)] if args.series else []
    cache = Path(tempfile.mkdtemp(prefix="sm120kit-bench-matrix-"))
    env = dict(os.environ, SM120KIT_CACHE_DIR=str(cache), PIP_NO_CACHE_DIR="1", NO_COLOR="1")
    matrix_args = ["matrix", "--releases", args.releases, "--jobs", str(args.jobs), *extra]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"releases {args.releases}, cache {cache} (empty)")
    try:
        cold, cold_data, code = _run(matrix_args, env)
        targets = [r["target"]["label"] for r in cold_data["rows"]]
        print(
            f"cold:  {cold:7.1f} s  (downloads {cold_data['fetch_seconds']:.1f} s, checks "
            f"{cold_data['check_seconds']:.1f} s; {len(targets)} releases, exit {code})"
        )
        warm, warm_data, code = _run(matrix_args, env)
        print(
            f"warm:  {warm:7.1f} s  (downloads {warm_data['fetch_seconds']:.1f} s, checks "
            f"{warm_data['check_seconds']:.1f} s; exit {code})"
        )
        same = [r["statuses"] for r in cold_data["rows"]] == [r["statuses"] for r in warm_data["rows"]]
        print(f"cold / warm: {cold / warm:.1f}x; same statuses both times: {same}")
        print(f"goal: warm under {GOAL_WARM_SECONDS:.0f} s: {'met' if warm < GOAL_WARM_SECONDS else 'MISSED'}")
        if not args.no_alternative:
            start = time.perf_counter()
            agree = True
            for version, row in zip(targets, warm_data["rows"]):
                _, data, _ = _run(["check-upstream", "--release", version, *extra], env)
                agree &= {p["id"]: p["status"] for p in data["patches"]} == row["statuses"]
            one_by_one = time.perf_counter() - start
            print(
                f"one by one (check-upstream per release, warm): {one_by_one:7.1f} s; "
                f"one by one / matrix: {one_by_one / warm:.1f}x; same statuses: {agree}"
            )
    finally:
        if args.keep_cache:
            print(f"cache kept: {cache}")
        else:
            shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
