#!/usr/bin/env python3
"""Benchmark the shared-memory audit: cold and warm time for the full shape matrix on one release.

Cold: an empty audit cache and an empty Triton cache (every kernel compiled). Warm: the same audit again
(every result from the audit cache). Prints both times, the warm/cold ratio and the findings, and, with
--markdown, a table row for docs/benchmarks.md. Nothing here is a timed test.

    .venv/bin/python scripts/bench_audit.py [--release 0.5.23] [--arch 12.0 --arch 12.1] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from sm120kit.audit import smem as smem_audit
from sm120kit.audit.cache import AuditCache
from sm120kit.audit.shapes import expand, load_matrix
from sm120kit.sglang import releases
from sm120kit.ui import Console


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--arch", dest="archs", action="append", default=None)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()
    archs = tuple(args.archs or smem_audit.DEFAULT_ARCHS)
    root = releases.fetch_release(args.release)
    matrix = load_matrix()
    console = Console(quiet=args.quiet)
    with tempfile.TemporaryDirectory(prefix="sm120kit-bench-audit-") as tmp:
        cache = AuditCache(Path(tmp))
        load_before = os.getloadavg()[0]
        cpu_before = _children_cpu()
        start = time.perf_counter()
        cold = smem_audit.audit_tree(
            root, archs=archs, matrix=matrix, cache=cache, jobs=args.jobs, console=console, version=args.release
        )
        cold_s = time.perf_counter() - start
        cold_cpu = _children_cpu() - cpu_before
        load_after = os.getloadavg()[0]
        start = time.perf_counter()
        warm = smem_audit.audit_tree(
            root, archs=archs, matrix=matrix, cache=cache, jobs=args.jobs, console=console, version=args.release
        )
        warm_s = time.perf_counter() - start
    calls = len(expand(matrix)) * len(archs)
    cpu = f"{os.cpu_count()} CPU(s), {platform.processor() or platform.machine()}"
    print()
    print(f"machine: {cpu}, Python {platform.python_version()}")
    print(
        f"sglang {args.release}, archs {', '.join(archs)}: {calls} launcher calls, "
        f"{cold.kernel_count()} kernels compiled"
    )
    print(
        f"cold: {cold_s:.1f} s wall, {cold_cpu:.1f} s CPU in the probes ({cold.compiled} compiled); "
        f"load average {load_before:.1f} before, {load_after:.1f} after (other work on the machine "
        f"slows the wall time; CPU / cores = {cold_cpu / (os.cpu_count() or 1):.1f} s)"
    )
    print(f"warm: {warm_s:.2f} s ({warm.cached} from cache)")
    print(f"warm/cold: {warm_s / cold_s:.4f} (cold is {cold_s / warm_s:.0f}x the warm run)")
    print(
        f"goals: cold < 180 s: {'met' if cold_s < 180 else 'MISSED'}; warm < 10 s: {'met' if warm_s < 10 else 'MISSED'}"
    )
    for case, kernel in cold.over_limit:
        print(f"over the limit: {case.arch} {case.case.id} {kernel.name} {kernel.shared} B > {kernel.limit} B")
    print(
        f"| {args.release} | {', '.join(archs)} | {calls} | {cold.kernel_count()} | {cold_s:.1f} s | "
        f"{cold_cpu:.1f} s | {warm_s:.2f} s | {warm_s / cold_s:.4f} | {cpu}, load {load_before:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
