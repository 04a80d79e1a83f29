#!/usr/bin/env python3
"""Benchmark: compile real sgl-kernel translation units with upstream's arch list and with sm_120a only.

For each translation unit (TU) the same nvcc command is run twice in one process:

* ``upstream``: the flags of sgl-kernel's ``common_ops`` as its CMakeLists builds them on x86-64 with
  CUDA >= 12.9 and the default options (SGLang 0.5.14 to 0.5.18): sm_90, sm_80, sm_89 (ENABLE_BELOW_SM90),
  sm_100f, sm_120a, sm_90a (FA3 on), ``--compress-mode=size`` and ``--threads=32``;
* ``sm120a``: that command passed through sm120kit's launcher filter for ``--arch 12.0a`` (one target) and
  ``--threads=1``, as ``sm120kit build-kernel`` runs it.

Per compile it records wall time, CPU time (the nvcc process tree, from wait4), peak memory (the summed
RSS of the process tree, sampled every 50 ms; nvcc runs one compiler per target in parallel with
``--threads``) and the object size, then prints the ratios. Sources are fetched at run time into a
cache folder (never into the repository): the SGLang repository at ``--ref`` (``git clone``) and the
FetchContent dependencies the chosen TUs need (CUTLASS, FlashInfer) through ``sm120kit.kernel.deps``, or from
``--deps-dir``. Torch headers come from the torch that ``--python`` imports.

Example: python scripts/bench_build.py --tu activation --tu fused_add_rms_norm_kernel --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from sm120kit import runner
from sm120kit.hardware import fatbin
from sm120kit.kernel import deps as deps_mod
from sm120kit.kernel.nvcc_launcher import filter_args  # noqa: E402
from sm120kit.kernel.source import find_kernel_source  # noqa: E402
from sm120kit.util.cache import cache_dir  # noqa: E402

DEFAULT_REPO = "https://github.com/bytedance-iaas/sglang.git"  # mirrors upstream with release tags
DEFAULT_REF = "v0.5.18"

# TUs of common_ops that need only CUTLASS, FlashInfer, torch and CUDA headers; heaviest first.
TUS = {
    "fp8_gemm_kernel": "csrc/gemm/fp8_gemm_kernel.cu",
    "int8_gemm_kernel": "csrc/gemm/int8_gemm_kernel.cu",
    "moe_topk_softmax_kernels": "csrc/moe/moe_topk_softmax_kernels.cu",
    "topk": "csrc/elementwise/topk.cu",
    "activation": "csrc/elementwise/activation.cu",
    "per_token_group_quant_8bit": "csrc/gemm/per_token_group_quant_8bit.cu",
    "per_token_quant_fp8": "csrc/gemm/per_token_quant_fp8.cu",
    "moe_align_kernel": "csrc/moe/moe_align_kernel.cu",
    "fused_add_rms_norm_kernel": "csrc/elementwise/fused_add_rms_norm_kernel.cu",
}
NEEDED_DEPS = ("repo-cutlass", "repo-flashinfer")

# sgl-kernel's SGL_KERNEL_CUDA_FLAGS (CMakeLists.txt, SGLang 0.5.14-0.5.18) on x86-64, CUDA >= 13, defaults.
UPSTREAM_TARGETS = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_100f,code=sm_100f",
    "-gencode=arch=compute_120a,code=sm_120a",
    "-gencode=arch=compute_90a,code=sm_90a",
]
UPSTREAM_FLAGS = [
    "-DNDEBUG",
    "-DOPERATOR_NAMESPACE=sgl-kernel",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-std=c++17",
    "-DFLASHINFER_ENABLE_F16",
    "-DCUTE_USE_PACKED_TUPLE=1",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
    "-DCUTLASS_VERSIONS_GENERATED",
    "-DCUTLASS_TEST_LEVEL=0",
    "-DCUTLASS_TEST_ENABLE_CACHED_RESULTS=1",
    "-DCUTLASS_DEBUG_TRACE_LEVEL=0",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-Xcompiler=-Wno-conversion",
    "-Xcompiler=-Wno-deprecated-declarations",
    "-Xcompiler=-Wno-terminate",
    "-Xcudafe=--diag_suppress=177",
    "-Xcudafe=--diag_suppress=2361",
    "-DFLASHINFER_ENABLE_BF16",
    "-DFLASHINFER_ENABLE_FP8",
    "-DFLASHINFER_ENABLE_FP8_E4M3",
    "-DFLASHINFER_ENABLE_FP8_E5M2",
    "--compress-mode=size",
    "-DENABLE_NVFP4=1",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-DTORCH_EXTENSION_NAME=common_ops",
]


def torch_includes(python: str) -> list[str]:
    code = (
        "import os, torch; i = os.path.join(os.path.dirname(torch.__file__), 'include'); "
        "print(i); print(os.path.join(i, 'torch', 'csrc', 'api', 'include'))"
    )
    out = runner.run([python, "-c", code], what="torch include folders").stdout.split()
    return out[-2:]


def prepare_sources(args) -> tuple[Path, Path]:
    """(kernel folder, deps folder): the SGLang clone at ``--ref`` and CUTLASS/FlashInfer, in the cache."""
    root = Path(args.cache).expanduser().resolve()
    clone = root / f"sglang-{args.ref}"
    if args.source:  # an existing clone or kernel folder
        clone = Path(args.source).expanduser().resolve()
    elif not (clone / ".git").exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".sglang-{args.ref}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"cloning {args.sglang_repo} at {args.ref} into {clone}", flush=True)
        runner.run(
            ["git", "clone", "-q", "--depth", "1", "--branch", args.ref, args.sglang_repo, str(tmp)],
            what="git clone of SGLang",
            timeout=3600,
        )
        os.replace(tmp, clone)
    source = find_kernel_source(clone)
    if args.deps_dir:
        deps_dir = Path(args.deps_dir).expanduser().resolve()
    else:
        deps_dir = root / f"deps-{args.ref}"
        deps_mod.fetch_dependencies(source, deps_dir, names=NEEDED_DEPS)
    return source.path, deps_dir


def command(kernel: Path, deps: Path, tu: str, includes: list[str], nvcc: str, out: Path) -> list[str]:
    inc = [
        kernel / "include",
        kernel / "csrc",
        deps / "repo-cutlass" / "include",
        deps / "repo-cutlass" / "tools" / "util" / "include",
        deps / "repo-flashinfer" / "include",
        deps / "repo-flashinfer" / "csrc",
        *map(Path, includes),
        Path(sysconfig.get_paths()["include"]),
    ]
    return [
        nvcc,
        *UPSTREAM_FLAGS,
        *UPSTREAM_TARGETS,
        "--threads=32",
        *(f"-I{p}" for p in inc),
        "-x",
        "cu",
        "-c",
        str(kernel / tu),
        "-o",
        str(out),
    ]


def sm120a_command(upstream: list[str]) -> list[str]:
    args, _ = filter_args(upstream[1:], ["sm_120a"])
    return [upstream[0], *("--threads=1" if a.startswith("--threads") else a for a in args)]


def _tree_rss(root_pid: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(argv: list[str], log: Path) -> dict:
    """Run one compile; wall and CPU seconds, peak tree RSS, exit code."""
    start = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(max(peak[0], usage.ru_maxrss * 1024) / 2**20, 1),
        "rc": proc.returncode,
    }


def bench_tu(name: str, rel: str, kernel: Path, deps: Path, includes: list[str], nvcc: str, work: Path) -> dict:
    result = {"tu": name, "path": rel}
    upstream = command(kernel, deps, rel, includes, nvcc, work / f"{name}.upstream.o")
    variants = {"upstream": upstream, "sm120a": sm120a_command(upstream)}
    variants["sm120a"][-1] = str(work / f"{name}.sm120a.o")
    for label, argv in variants.items():
        stats = measure(argv, work / f"{name}.{label}.log")
        obj = Path(argv[-1])
        if stats["rc"] == 0 and obj.is_file():
            lib = fatbin.inspect_library(obj)
            stats.update(object_bytes=obj.stat().st_size, sass=list(lib.sass), ptx=list(lib.ptx))
        else:
            stats["error"] = (work / f"{name}.{label}.log").read_text(errors="replace")[-1500:]
        result[label] = stats
        print(
            f"  {name:28s} {label:8s} wall {stats['wall_s']:7.1f} s  cpu {stats['cpu_s']:7.1f} s  "
            f"peak {stats['peak_rss_mib']:7.0f} MiB  obj {stats.get('object_bytes', 0) / 2**20:6.2f} MiB  "
            f"rc {stats['rc']}",
            flush=True,
        )
    return result


def ratios(results: list[dict]) -> dict:
    ok = [r for r in results if r["upstream"].get("object_bytes") and r["sm120a"].get("object_bytes")]

    def total(key: str, label: str) -> float:
        return sum(r[label][key] for r in ok)

    if not ok:
        return {"tus": 0}
    return {
        "tus": len(ok),
        "cpu_time_ratio": round(total("cpu_s", "upstream") / total("cpu_s", "sm120a"), 2),
        "wall_time_ratio": round(total("wall_s", "upstream") / total("wall_s", "sm120a"), 2),
        "object_size_ratio": round(total("object_bytes", "upstream") / total("object_bytes", "sm120a"), 2),
        "peak_memory_ratio": round(
            max(r["upstream"]["peak_rss_mib"] for r in ok) / max(r["sm120a"]["peak_rss_mib"] for r in ok), 2
        ),
        "upstream_cpu_s": round(total("cpu_s", "upstream"), 1),
        "sm120a_cpu_s": round(total("cpu_s", "sm120a"), 1),
        "upstream_object_mib": round(total("object_bytes", "upstream") / 2**20, 2),
        "sm120a_object_mib": round(total("object_bytes", "sm120a") / 2**20, 2),
        "upstream_peak_mib": max(r["upstream"]["peak_rss_mib"] for r in ok),
        "sm120a_peak_mib": max(r["sm120a"]["peak_rss_mib"] for r in ok),
    }


def wheel_projection(wheel: Path, arch: str = "sm_120a") -> dict:
    """Device code per library of a published wheel, and the size each library would have with ``arch``
    alone: host part (library minus .nv_fatbin) plus that arch's cubins. flash_ops is not built at all
    (SGL_KERNEL_ENABLE_FA3=OFF); flashmla_ops, whose objects become PTX of one target, is kept at its
    published size (an upper bound)."""
    rows, total, projected_total = [], 0, 0
    for lib in fatbin.inspect_wheel(wheel):
        sass = dict(lib.sass_bytes)
        host = lib.size - lib.fatbin_bytes
        if lib.name == "flash_ops":
            projected, note = 0, "not built (SGL_KERNEL_ENABLE_FA3=OFF)"
        elif lib.name == "flashmla_ops":
            projected, note = lib.size, "kept at published size (upper bound)"
        else:
            projected, note = host + sass.get(arch, 0), f"host + {arch} cubins"
        total += lib.size
        projected_total += projected
        rows.append(
            {
                "library": lib.label,
                "size": lib.size,
                "fatbin_bytes": lib.fatbin_bytes,
                "host_bytes": host,
                "sass_bytes": sass,
                "device_code_ratio": round(lib.fatbin_bytes / sass[arch], 2) if sass.get(arch) else None,
                "projected": projected,
                "note": note,
            }
        )
    return {
        "wheel": wheel.name,
        "arch": arch,
        "libraries": rows,
        "total": total,
        "projected_total": projected_total,
        "size_ratio": round(total / projected_total, 1) if projected_total else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-repo", default=DEFAULT_REPO, help="SGLang repository to clone (URL or path)")
    parser.add_argument("--source", help="an existing SGLang clone or kernel folder (no clone then)")
    parser.add_argument("--ref", default=DEFAULT_REF, help="tag to benchmark (default %(default)s)")
    parser.add_argument("--cache", default=str(cache_dir() / "bench-build"), help="folder for fetched sources")
    parser.add_argument("--deps-dir", help="pre-fetched CUTLASS/FlashInfer (repo-cutlass/, repo-flashinfer/)")
    parser.add_argument("--tu", action="append", choices=sorted(TUS), help="translation unit(s); default all")
    parser.add_argument("--parallel", type=int, default=1, help="TUs benchmarked at once (default 1)")
    parser.add_argument("--deadline", type=float, default=0, help="start no TU after this many seconds")
    parser.add_argument("--python", default=sys.executable, help="interpreter whose torch headers are used")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"), help="nvcc (default: from PATH)")
    parser.add_argument("--json", help="write the results here (rewritten after every TU)")
    parser.add_argument(
        "--wheel",
        help="instead of compiling: device code per library of a published wheel "
        "and its projected size with sm_120a alone",
    )
    args = parser.parse_args(argv)
    if args.wheel:
        data = wheel_projection(Path(args.wheel))
        mib = 2**20
        for row in data["libraries"]:
            sass = " ".join(f"{a}={b / mib:.2f}" for a, b in row["sass_bytes"].items())
            print(
                f"{row['library']:55s} {row['size'] / mib:9.2f} MiB  fatbin {row['fatbin_bytes'] / mib:9.2f}  "
                f"host {row['host_bytes'] / mib:6.2f}  -> {row['projected'] / mib:7.2f} MiB ({row['note']})  "
                f"SASS MiB: {sass}"
            )
        print(
            f"total {data['total'] / mib:.1f} MiB -> {data['projected_total'] / mib:.1f} MiB "
            f"({data['size_ratio']}x smaller)"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        return 0
    if not args.nvcc:
        print("nvcc not found; pass --nvcc", file=sys.stderr)
        return 2
    kernel, deps_dir = prepare_sources(args)
    includes = torch_includes(args.python)
    work = Path(args.cache).expanduser().resolve() / "objects"
    work.mkdir(parents=True, exist_ok=True)
    names = args.tu or list(TUS)
    nvcc_version = runner.run([args.nvcc, "--version"]).stdout.strip().splitlines()[-1]
    print(
        f"kernel source {kernel} ({args.ref}); {nvcc_version}; {os.cpu_count()} cores; TUs: {', '.join(names)}",
        flush=True,
    )
    start = time.perf_counter()
    results: list[dict] = []
    skipped: list[str] = []

    def write() -> dict:
        data = {
            "ref": args.ref,
            "nvcc": nvcc_version,
            "cores": os.cpu_count(),
            "parallel": args.parallel,
            "upstream_targets": [t.split("code=")[1] for t in UPSTREAM_TARGETS],
            "results": results,
            "skipped": skipped,
            "summary": ratios(results),
        }
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        return data

    def job(name: str) -> dict | None:
        if args.deadline and time.perf_counter() - start > args.deadline:
            skipped.append(name)
            return None
        return bench_tu(name, TUS[name], kernel, deps_dir, includes, args.nvcc, work)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = [pool.submit(job, name) for name in names]
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            if result:
                results.append(result)
                write()
    data = write()
    summary = data["summary"]
    print(json.dumps(summary, indent=2))
    if skipped:
        print(f"skipped (deadline): {', '.join(skipped)}")
    return 0 if summary.get("tus") else 1


if __name__ == "__main__":
    sys.exit(main())
