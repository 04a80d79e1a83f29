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

FA3 mode (``--fa3-list``, ``--fa3-sample N``, ``--fa3-file NAME``): upstream's default x86-64 build also
compiles FA3 (``flash_ops``), which sm120kit's build skips. Its source list, CUDA flags (gencodes included),
definitions and include folders are read from the kernel's CMakeLists (the ``if (SGL_KERNEL_ENABLE_FA3)``
block, with ENABLE_BELOW_SM90 ON and the sparse mask OFF), the file(GLOB) patterns are counted in
``--deps-dir``'s repo-flash-attention/, and N files spread over the strata (sm80/sm90 x dtype, and the
other .cu and host files; inside a stratum over head dim and paged/split/softcap/packgqa) are compiled
``--parallel`` at once with upstream's command. The whole FA3 build's CPU time is projected from them
(stratum mean x file count), with its spread. Example, offline:
python scripts/bench_build.py --fa3-sample 16 --parallel 16 --fa3-timeout 240 --source SGLANG --deps-dir DEPS --json fa3.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import stat
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import MissingDependency, Sm120kitError, UsageError
from sm120kit.hardware import fatbin
from sm120kit.kernel import build as build_mod
from sm120kit.kernel import deps as deps_mod
from sm120kit.kernel.nvcc_launcher import filter_args  # noqa: E402
from sm120kit.kernel.source import find_kernel_source  # noqa: E402
from sm120kit.util import regularfile
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


def torch_headers(python: str) -> tuple[list[str], int]:
    """torch's two include folders and its C++ ABI (``torch._C._GLIBCXX_USE_CXX11_ABI``), from ``python``."""
    code = (
        "import os, torch; i = os.path.join(os.path.dirname(torch.__file__), 'include'); "
        "print(i); print(os.path.join(i, 'torch', 'csrc', 'api', 'include')); "
        "print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    )
    out = runner.run([python, "-c", code], what="torch include folders").stdout.split()
    return out[-3:-1], int(out[-1])


def torch_includes(python: str) -> list[str]:
    return torch_headers(python)[0]


def prepare_sources(args, needed: tuple[str, ...] = NEEDED_DEPS) -> tuple[Path, Path]:
    """(kernel folder, deps folder): the SGLang clone at ``--ref`` and the ``needed`` dependencies, in the
    cache, or ``--source`` and ``--deps-dir`` as given (then nothing is fetched)."""
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
        lacking = [name for name in needed if not (deps_dir / name).is_dir()]
        if lacking:
            raise UsageError(
                f"--deps-dir {deps_dir} lacks {', '.join(f'{n}/' for n in lacking)}.",
                hint=f"Put {', '.join(needed)} there as the kernel's CMakeLists declares them "
                "(sm120kit fetch-deps SOURCE --into DEPS), or leave --deps-dir out to fetch them.",
            )
    else:
        deps_dir = root / f"deps-{args.ref}"
        deps_mod.fetch_dependencies(source, deps_dir, names=needed)
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


def _tree_usage(root_pid: int) -> tuple[int, float]:
    """(summed RSS in bytes, CPU seconds so far) of a process tree: user + system time of its live processes
    and of the children they have reaped (a lower bound while it runs)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            ticks[int(entry)] = sum(int(f) for f in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    total, cpu, stack = 0, 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        cpu += ticks.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total, cpu / os.sysconf("SC_CLK_TCK")


def _tree_rss(root_pid: int) -> int:
    return _tree_usage(root_pid)[0]


def measure(argv: list[str], log: Path, timeout: float | None = None) -> dict:
    """Run one compile; wall and CPU seconds, peak tree RSS, exit code. With ``timeout`` the compile's process
    group is killed after that many seconds; it is then marked ``timed_out`` and its CPU time is the last
    sample of its tree's (a lower bound)."""
    start = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=bool(timeout))
    peak, cpu_seen, killed = [0], [0.0], [False]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, cpu = _tree_usage(proc.pid)
            peak[0], cpu_seen[0] = max(peak[0], rss), max(cpu_seen[0], cpu)
            if timeout and time.perf_counter() - start > timeout and not killed[0]:
                killed[0] = True
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if killed[0]:
        return {
            "wall_s": round(time.perf_counter() - start, 2),
            "cpu_s": round(max(cpu_seen[0], usage.ru_utime + usage.ru_stime), 2),
            "peak_rss_mib": round(peak[0] / 2**20, 1),
            "rc": proc.returncode,
            "timed_out": True,
        }
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


# -- FA3 (flash_ops): upstream's default source list, a stratified sample, a projection --------------------------
#
# sgl-kernel's CMakeLists builds FA3 by default on x86-64 (SGL_KERNEL_ENABLE_FA3 ON with CUDA >= 12.4,
# ENABLE_BELOW_SM90 ON), hundreds of flash-attention ``hopper/instantiations/*.cu`` files that
# ``sm120kit build-kernel`` skips. The source list, flags, definitions and include folders of ``flash_ops`` are
# read from the CMake text itself (its ``if (SGL_KERNEL_ENABLE_FA3)`` block), evaluated with those defaults.

FA3_DEPS = ("repo-cutlass", "repo-flash-attention")
FA3_BLOCK = "SGL_KERNEL_ENABLE_FA3"
FA3_TARGET = "flash_ops"
# The x86-64 defaults of the options the FA3 block tests (the CMakeLists: ENABLE_BELOW_SM90 ON except on
# aarch64; option(SGL_KERNEL_ENABLE_FA3_SPARSE_MASK ... OFF)). Any other condition there is refused.
FA3_CONDITIONS = {"ENABLE_BELOW_SM90": True, "SGL_KERNEL_ENABLE_FA3_SPARSE_MASK": False}
# Folders the CMake text names through variables set outside the block.
FA3_FOLDER_VARS = {
    "repo-flash-attention_SOURCE_DIR": "repo-flash-attention",
    "repo-cutlass_SOURCE_DIR": "repo-cutlass",
}
FA3_KERNEL_VARS = ("PROJECT_SOURCE_DIR", "CMAKE_CURRENT_SOURCE_DIR", "CMAKE_CURRENT_LIST_DIR")
# What CMake adds to every compile of the target besides its own options (Release build, torch's C++ ABI in
# CMAKE_CUDA_FLAGS/CMAKE_CXX_FLAGS, position-independent code, Python_add_library(... USE_SABI 3.10) for the
# wheel's cp310 ABI). torch's own interface flags (its USE_* definitions and diagnostics) are left out.
FA3_PY_LIMITED_API = "-DPy_LIMITED_API=0x030a0000"
MAX_CMAKE_BYTES = 2 * 2**20
_CMAKE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,100}")
_CMAKE_VAR_RE = re.compile(r"\$\{([A-Za-z0-9_.+-]{1,100})\}")
_CUDA_GENEX_RE = re.compile(r"\$<\$<COMPILE_LANGUAGE:CUDA>:([^<>]{0,2000})>")
# flash-attention's generated names: flash_fwd_hdim{D}[_{Dv}|all|diff]_{dtype}[_paged][_split][_softcap|
# _softcapall][_packgqa]_sm{arch}.cu
_FA3_NAME_RE = re.compile(
    r"flash_fwd_hdim(?P<hdim>[0-9]{1,4}(?:_[0-9]{1,4})?|all|diff)_(?P<dtype>bf16|fp16|e4m3|e5m2)"
    r"(?P<rest>(?:_[a-z0-9]{1,16}){0,8})_sm(?P<arch>[0-9]{2,3})\.cu"
)
FA3_OTHER_STRATA = ("cuda-other", "host")  # flash_prepare_scheduler.cu, flash_fwd_combine.cu; flash_api.cpp, ...


# The CMake text or the flash-attention tree is not what the FA3 mode understands: a usage error (exit 2). Not a
# class of its own: every error class of the package has an exit code of its own (tests/cli/test_cli_contract.py).
Fa3SourceError = UsageError


@dataclass(frozen=True)
class CMakeCommand:
    name: str  # lower case
    args: tuple[str, ...]
    line: int


def cmake_commands(text: str, where: str) -> list[CMakeCommand]:
    """The commands of a CMake file in order: name, arguments (quotes removed, variables not expanded), line.

    A small reader for the subset sgl-kernel's CMakeLists uses: line comments, quoted and unquoted arguments,
    nested parentheses. Anything else (an unterminated quote or call) is a :class:`Fa3SourceError`."""
    out: list[CMakeCommand] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        else:
            m = _CMAKE_NAME_RE.match(text, i)
            j = m.end() if m else i
            while j < n and text[j] in " \t":
                j += 1
            if not m or j >= n or text[j] != "(":
                raise Fa3SourceError(f"{where}:{line}: not a CMake command: {text[i : i + 40]!r}.")
            name, start_line = m.group(0).lower(), line
            args, arg, quoted, depth, j = [], None, False, 0, j + 1
            while True:
                if j >= n:
                    raise Fa3SourceError(f"{where}:{start_line}: the call of {name}() is not closed.")
                c = text[j]
                if c == '"':
                    end = j + 1
                    while end < n and text[end] != '"':
                        end += 2 if text[end] == "\\" else 1
                    if end >= n:
                        raise Fa3SourceError(f"{where}:{line}: a quoted argument is not closed.")
                    value = text[j + 1 : end]
                    line += value.count("\n")
                    arg = (arg or "") + value
                    quoted, j = True, end + 1
                    continue
                if c in " \t\r\n" or (c == ")" and depth == 0) or c == "#":
                    if arg is not None or quoted:
                        args.append(arg or "")
                    arg, quoted = None, False
                    if c == "\n":
                        line += 1
                    elif c == "#":
                        end = text.find("\n", j)
                        j = n if end < 0 else end
                        continue
                    elif c == ")":
                        j += 1
                        break
                    j += 1
                    continue
                if c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                arg = (arg or "") + c
                j += 1
            out.append(CMakeCommand(name, tuple(args), start_line))
            i = j
    return out


@dataclass(frozen=True)
class Fa3Glob:
    variable: str  # the CMake list the pattern fills (FA3_BF16_GEN_SRCS, ...)
    pattern: str  # relative to the flash-attention tree: hopper/instantiations/flash_fwd_hdim*_sm80.cu
    line: int


@dataclass(frozen=True)
class Fa3Build:
    """What the CMakeLists builds for ``flash_ops`` with the x86-64 defaults (folders still symbolic:
    ``@repo-flash-attention/...``, ``@repo-cutlass/...``, ``@kernel/...``)."""

    cmake: Path
    line: int  # of the ``if (SGL_KERNEL_ENABLE_FA3)``
    sources: tuple  # str (a file) or Fa3Glob, in FLASH_SOURCES order
    cuda_flags: tuple[str, ...]  # target_compile_options for CUDA (SGL_FLASH_KERNEL_CUDA_FLAGS)
    definitions: tuple[str, ...]  # target_compile_definitions (FLASH_OPS_COMPILE_DEFS)
    include_dirs: tuple[str, ...]  # include_directories() before the block, then the target's own

    @property
    def globs(self) -> tuple[Fa3Glob, ...]:
        return tuple(s for s in self.sources if isinstance(s, Fa3Glob))

    @property
    def gencodes(self) -> tuple[str, ...]:
        return tuple(f for f in self.cuda_flags if f.startswith("-gencode"))


def _expand(arg: str, values: dict, where: str, line: int) -> list:
    """An argument with ``${VAR}`` expanded: a list when the argument is one variable alone."""
    whole = _CMAKE_VAR_RE.fullmatch(arg)
    if whole and whole.group(1) in values:
        return list(values[whole.group(1)])

    def one(m: re.Match) -> str:
        got = values.get(m.group(1))
        if got is None:
            raise Fa3SourceError(
                f"{where}:{line}: ${{{m.group(1)}}} is not set in the FA3 block and not a folder this mode knows."
            )
        if len(got) != 1 or not isinstance(got[0], str):
            raise Fa3SourceError(f"{where}:{line}: the list ${{{m.group(1)}}} is used inside the argument {arg!r}.")
        return got[0]

    return [_CMAKE_VAR_RE.sub(one, arg)]


def _condition(args: tuple[str, ...], where: str, line: int) -> bool:
    words = list(args)
    negate = len(words) == 2 and words[0] == "NOT"
    name = words[-1] if words else ""
    if len(words) != (2 if negate else 1) or name not in FA3_CONDITIONS:
        raise Fa3SourceError(
            f"{where}:{line}: the FA3 block tests if({' '.join(args)}), which this mode does not know the default of "
            f"(it knows {', '.join(sorted(FA3_CONDITIONS))}).",
            hint="Add the option's x86-64 default to FA3_CONDITIONS in scripts/bench_build.py.",
        )
    return FA3_CONDITIONS[name] != negate


def read_fa3_build(kernel: Path) -> Fa3Build:
    """``flash_ops`` as the CMakeLists of ``kernel`` builds it by default on x86-64."""
    path = kernel / "CMakeLists.txt"
    try:
        text = regularfile.read_text(path, errors="replace", follow=False, limit=MAX_CMAKE_BYTES + 1)
    except OSError as exc:
        raise Fa3SourceError(
            f"Cannot read {path}: {exc.strerror or exc}.",
            hint="Pass --source an SGLang clone or its kernel folder (its CMakeLists.txt a regular file).",
        ) from None
    if len(text) > MAX_CMAKE_BYTES:
        raise Fa3SourceError(f"{path} is larger than {MAX_CMAKE_BYTES} bytes; not a kernel CMakeLists.")
    where = str(path)
    folders = {var: [f"@{folder}"] for var, folder in FA3_FOLDER_VARS.items()}
    folders.update({var: ["@kernel"] for var in FA3_KERNEL_VARS})
    values: dict[str, list] = dict(folders)
    dir_includes: list[str] = []
    target: dict[str, list] = {"sources": [], "cuda": [], "defs": [], "includes": []}
    outside: list[CMakeCommand] = []  # commands on flash_ops outside the block: not understood
    block_line, depth, active = 0, 0, [True]  # depth: if-nesting; active: evaluated branches in the block
    for cmd in cmake_commands(text, where):
        in_block = block_line and depth >= 1
        if cmd.name == "if":
            if not block_line and depth == 0 and cmd.args == (FA3_BLOCK,):
                block_line = cmd.line
            elif in_block:
                active.append(active[-1] and _condition(cmd.args, where, cmd.line))
            depth += 1
            continue
        if cmd.name in ("elseif", "else") and in_block and depth >= 2:
            if cmd.name == "elseif":
                raise Fa3SourceError(f"{where}:{cmd.line}: elseif() in the FA3 block is not understood.")
            active[-1] = active[-2] and not active[-1]
            continue
        if cmd.name == "endif":
            depth -= 1
            if in_block and depth >= 1:
                active.pop()
            elif block_line and depth == 0 and in_block:
                break
            continue
        if not in_block:
            if depth == 0 and not block_line and cmd.name == "include_directories":
                dir_includes += [v for a in cmd.args for v in _expand(a, folders, where, cmd.line)]
            elif cmd.args[:1] == (FA3_TARGET,):
                outside.append(cmd)
            continue
        if not active[-1]:
            continue
        args = cmd.args
        if cmd.name == "set" and args:
            if {"CACHE", "PARENT_SCOPE"} & set(args):
                raise Fa3SourceError(f"{where}:{cmd.line}: set({args[0]} ... CACHE/PARENT_SCOPE) is not understood.")
            values[args[0]] = [v for a in args[1:] for v in _expand(a, values, where, cmd.line)]
        elif cmd.name == "list" and args[:1] == ("APPEND",) and len(args) >= 2:
            values.setdefault(args[1], [])
            values[args[1]] = values[args[1]] + [v for a in args[2:] for v in _expand(a, values, where, cmd.line)]
        elif cmd.name == "file" and args[:1] == ("GLOB",) and len(args) >= 3:
            globs = []
            for a in args[2:]:
                for pattern in _expand(a, values, where, cmd.line):
                    if not isinstance(pattern, str) or not pattern.startswith("@repo-flash-attention/"):
                        raise Fa3SourceError(
                            f"{where}:{cmd.line}: file(GLOB {args[1]} {a}) is not a pattern in the "
                            "flash-attention tree."
                        )
                    globs.append(Fa3Glob(args[1], pattern.split("/", 1)[1], cmd.line))
            values[args[1]] = globs
        elif cmd.name == "python_add_library" and args[:1] == (FA3_TARGET,):
            rest, skip = [], False
            for a in args[1:]:
                if skip:
                    skip = False
                elif a == "USE_SABI":
                    skip = True
                elif a not in ("MODULE", "SHARED", "STATIC", "WITH_SOABI"):
                    rest += _expand(a, values, where, cmd.line)
            target["sources"] = rest
        elif cmd.name.startswith("target_") and args[:1] == (FA3_TARGET,):
            items = [a for a in args[1:] if a not in ("PRIVATE", "PUBLIC", "INTERFACE")]
            if cmd.name == "target_compile_options":
                for a in items:
                    genex = _CUDA_GENEX_RE.fullmatch(a)
                    if not genex:
                        raise Fa3SourceError(
                            f"{where}:{cmd.line}: target_compile_options({FA3_TARGET} {a}) is not a "
                            "$<$<COMPILE_LANGUAGE:CUDA>:...> option list."
                        )
                    for inner in genex.group(1).split():
                        target["cuda"] += _expand(inner, values, where, cmd.line)
            elif cmd.name == "target_compile_definitions":
                target["defs"] += [v for a in items for v in _expand(a, values, where, cmd.line)]
            elif cmd.name == "target_include_directories":
                target["includes"] += [v for a in items for v in _expand(a, values, where, cmd.line)]
    if not block_line:
        raise Fa3SourceError(
            f"{where} holds no top-level 'if ({FA3_BLOCK})' block: this kernel source does not build FA3 the way "
            "sgl-kernel 0.4.x does, so there is nothing to sample.",
            hint="Pass --source an SGLang clone or kernel folder of a release that builds flash_ops (e.g. v0.5.18).",
        )
    if depth != 0:
        raise Fa3SourceError(f"{where}:{block_line}: the FA3 block is not closed by endif().")
    if outside:
        raise Fa3SourceError(
            f"{where}:{outside[0].line}: {outside[0].name}({FA3_TARGET} ...) outside the FA3 block is not understood."
        )
    build = Fa3Build(
        cmake=path,
        line=block_line,
        sources=tuple(target["sources"]),
        cuda_flags=tuple(target["cuda"]),
        definitions=tuple(target["defs"]),
        include_dirs=tuple(dir_includes + target["includes"]),
    )
    missing = [
        what
        for what, ok in (
            (f"Python_add_library({FA3_TARGET} ...) with its sources", build.sources),
            ("file(GLOB ...) patterns among those sources", build.globs),
            ("-gencode flags in target_compile_options", build.gencodes),
        )
        if not ok
    ]
    if missing:
        raise Fa3SourceError(
            f"{where}:{block_line}: the FA3 block has no {'; no '.join(missing)}.",
            hint="The CMake text changed shape; read its FA3 block and extend read_fa3_build().",
        )
    for item in build.sources + build.include_dirs:
        if isinstance(item, str) and not item.startswith("@"):
            if Path(item).is_absolute() or ".." in Path(item).parts:
                raise Fa3SourceError(f"{where}: the FA3 path {item!r} leaves the kernel folder.")
    return build


@dataclass(frozen=True)
class Fa3File:
    path: Path
    name: str  # relative to its tree: hopper/instantiations/flash_fwd_hdim64_bf16_sm80.cu, csrc/flash_extension.cc
    stratum: str  # sm80-bf16, sm90-e4m3, ... ; "cuda-other" for the other .cu files; "host" for .cpp/.cc
    features: tuple[tuple[str, str], ...] = ()  # (hdim, 128), (paged, yes), ...
    patterns: tuple[str, ...] = ()  # the file(GLOB) patterns that matched it

    @property
    def language(self) -> str:
        return "CUDA" if self.path.suffix == ".cu" else "CXX"


def _stratum(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    base = Path(name).name
    m = _FA3_NAME_RE.fullmatch(base)
    if not m:
        return ("cuda-other" if base.endswith(".cu") else "host"), ()
    tokens = set(m.group("rest").strip("_").split("_")) - {""}
    softcap = "softcapall" if "softcapall" in tokens else "softcap" if "softcap" in tokens else "no"
    features = (
        ("hdim", m.group("hdim")),
        ("paged", "yes" if "paged" in tokens else "no"),
        ("split", "yes" if "split" in tokens else "no"),
        ("softcap", softcap),
        ("packgqa", "yes" if "packgqa" in tokens else "no"),
    )
    return f"sm{m.group('arch')}-{m.group('dtype')}", features


def _inside(path: Path, root: Path, where: str) -> Path:
    """``path`` (not resolved) when it is a regular file inside ``root`` with no link on the way."""
    try:
        resolved = path.resolve(strict=True)
    except OSError:
        raise Fa3SourceError(f"{where}: {path} does not exist.", hint=_DEPS_HINT) from None
    if resolved != root.resolve() / path.relative_to(root):
        raise Fa3SourceError(f"{where}: {path} is a link or leads out of {root}; it is not compiled.")
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise Fa3SourceError(f"{where}: {path} is not a regular file.")
    return path


_DEPS_HINT = (
    "--deps-dir must hold repo-cutlass/ and repo-flash-attention/ as the CMakeLists declares them "
    "(sm120kit fetch-deps, or copies of the same revisions)."
)


def fa3_files(build: Fa3Build, kernel: Path, deps: Path) -> tuple[list[Fa3File], list[dict]]:
    """Every file ``flash_ops`` compiles, in CMake order without repeats, and per file(GLOB) pattern the number
    of files it matched in the flash-attention tree."""
    where = f"{build.cmake}:{build.line}"
    tree = deps / "repo-flash-attention"
    roots = {"@kernel": kernel, "@repo-flash-attention": tree, "@repo-cutlass": deps / "repo-cutlass"}
    for name in FA3_DEPS:
        if not (deps / name).is_dir() or (deps / name).is_symlink():
            raise Fa3SourceError(f"{deps / name} is not a folder.", hint=_DEPS_HINT)
    files: dict[Path, Fa3File] = {}
    counts: list[dict] = []
    for item in build.sources:
        if isinstance(item, Fa3Glob):
            folder_rel, _, pattern = item.pattern.rpartition("/")
            if any(c in folder_rel for c in "*?[") or ".." in Path(folder_rel).parts or Path(folder_rel).is_absolute():
                raise Fa3SourceError(f"{build.cmake}:{item.line}: the pattern {item.pattern!r} is not one folder.")
            folder = tree / folder_rel
            if not folder.is_dir() or folder.is_symlink():
                raise Fa3SourceError(f"{where}: {folder} is not a folder.", hint=_DEPS_HINT)
            matched = sorted(e.name for e in os.scandir(folder) if fnmatch.fnmatchcase(e.name, pattern))
            counts.append(
                {"variable": item.variable, "pattern": item.pattern, "line": item.line, "files": len(matched)}
            )
            for base in matched:
                path = _inside(folder / base, tree, where)
                old = files.get(path)
                if old:
                    files[path] = dataclasses.replace(old, patterns=old.patterns + (item.pattern,))
                    continue
                stratum, features = _stratum(base)
                files[path] = Fa3File(path, f"{folder_rel}/{base}", stratum, features, (item.pattern,))
        else:
            root_key, _, rel = item.partition("/") if item.startswith("@") else ("@kernel", "", item)
            root = roots.get(root_key)
            if root is None or not rel:
                raise Fa3SourceError(f"{where}: the FA3 source {item!r} is not in a tree this mode knows.")
            path = _inside(root / rel, root, where)
            if path not in files:
                stratum, features = _stratum(rel)
                files[path] = Fa3File(path, rel, stratum, features)
    return list(files.values()), counts


def _pick_order(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Files to sample per stratum: one each (largest strata first when ``n`` is short), the rest in
    proportion to the strata's sizes (largest remainder), never more than a stratum holds."""
    order = sorted(sizes, key=lambda s: (-sizes[s], s))
    got = {s: 0 for s in sizes}
    for s in order[: min(n, len(order))]:
        got[s] = 1
    left = min(n, sum(sizes.values())) - sum(got.values())
    while left > 0:
        total = sum(sizes[s] for s in order if got[s] < sizes[s])
        share = {s: left * sizes[s] / total for s in order if got[s] < sizes[s]}
        add = {s: min(int(v), sizes[s] - got[s]) for s, v in share.items()}
        if not sum(add.values()):  # the remainders: largest first, one each
            for s in sorted(share, key=lambda s: (-(share[s] - int(share[s])), s))[:left]:
                add[s] = 1
        for s, k in add.items():
            got[s] += k
        left -= sum(add.values())
    return got


def stratified_sample(files: list[Fa3File], n: int) -> list[Fa3File]:
    """``n`` files spread over the strata (allocate()) and, inside each, over head dim and variants: each
    pick is the file with the most feature values not yet picked in its stratum, then not yet picked at
    all, then by a hash of its name. Deterministic: the same tree gives the same sample whatever the
    order of its listing."""
    strata: dict[str, list[Fa3File]] = {}
    for f in sorted(files, key=lambda f: f.name):
        strata.setdefault(f.stratum, []).append(f)
    quota = allocate({s: len(v) for s, v in strata.items()}, n)
    seen_all: set = set()
    picked: list[Fa3File] = []
    for stratum in sorted(strata):
        pool, seen = list(strata[stratum]), set()
        for _ in range(quota[stratum]):
            best = max(
                pool,
                key=lambda f: (
                    len(set(f.features) - seen),
                    len(set(f.features) - seen_all),
                    _pick_order(f.name),
                ),
            )
            pool.remove(best)
            seen |= set(best.features)
            seen_all |= set(best.features)
            picked.append(best)
    return picked


def fa3_command(
    build: Fa3Build,
    f: Fa3File,
    kernel: Path,
    deps: Path,
    out: Path,
    *,
    nvcc: str,
    cxx: str,
    system_includes: list[str],
    abi: int = 1,
) -> list[str]:
    """The compile command of one ``flash_ops`` source as CMake's Ninja generator writes it for the default
    x86-64 build: DEFINES, INCLUDES, then the flags (CMAKE_*_FLAGS, Release, the target's options)."""
    roots = {"@kernel": kernel, "@repo-flash-attention": deps / "repo-flash-attention"}
    roots["@repo-cutlass"] = deps / "repo-cutlass"

    def folder(item: str) -> str:
        key, _, rel = item.partition("/") if item.startswith("@") else ("@kernel", "", item)
        return str(roots[key] / rel) if rel else str(roots[key])

    defines = [*(f"-D{d}" for d in build.definitions), FA3_PY_LIMITED_API]
    includes = [*(f"-I{folder(d)}" for d in build.include_dirs)]
    for d in system_includes:
        includes += ["-isystem", d]
    if f.language == "CXX":
        flags = ["-O3", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-O3", "-DNDEBUG", "-std=gnu++17", "-fPIC"]
        return [cxx, *defines, *includes, *flags, "-c", str(f.path), "-o", str(out)]
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-O3", "-DNDEBUG", "-std=c++17", "-Xcompiler=-fPIC", *build.cuda_flags]
    return [
        nvcc,
        "-forward-unknown-to-host-compiler",
        *defines,
        *includes,
        *flags,
        "-x",
        "cu",
        "-c",
        str(f.path),
        "-o",
        str(out),
    ]


def projection(files: list[Fa3File], results: list[dict], *, seed: int = 27, rounds: int = 2000) -> dict:
    """The whole FA3 build's CPU time from the sample: per stratum its mean CPU per file times its file count,
    summed. Spread: every file at its stratum's cheapest or dearest sampled file (min/max), the
    stratified standard error (strata of one sampled file add none) and a bootstrap 90 % interval
    (resampling inside each stratum, fixed seed). A stratum with no measured file takes the mean of all
    measured instantiation files (the host and other .cu files: of all measured files) and is named in
    ``estimated``; one with nothing to go by is named in ``unprojected`` and the total is not ``complete``.
    A compile stopped by ``--fa3-timeout`` counts with the CPU time it had used (``lower_bound``)."""
    sizes: dict[str, int] = {}
    for f in files:
        sizes[f.stratum] = sizes.get(f.stratum, 0) + 1
    measured: dict[str, list[dict]] = {}
    for r in results:
        if r.get("rc") == 0 or r.get("timed_out"):
            measured.setdefault(r["stratum"], []).append(r)
    timed_out = sorted(r["file"] for r in results if r.get("timed_out"))
    every = [r for rs in measured.values() for r in rs]
    inst = [r for s, rs in measured.items() if s not in FA3_OTHER_STRATA for r in rs]
    rows, estimated, unprojected = [], [], []
    total = low = high = wall = var = 0.0
    for stratum in sorted(sizes):
        got, size = measured.get(stratum, []), sizes[stratum]
        base = got or (every if stratum in FA3_OTHER_STRATA else inst)
        if not base:
            unprojected.append(stratum)
            continue
        if not got:
            estimated.append(stratum)
        cpu = sorted(r["cpu_s"] for r in base)
        mean = statistics.fmean(cpu)
        row = {
            "stratum": stratum,
            "files": size,
            "measured": len(got),
            "mean_cpu_s": round(mean, 1),
            "min_cpu_s": min(cpu),
            "max_cpu_s": max(cpu),
            "mean_wall_s": round(statistics.fmean(r["wall_s"] for r in base), 1),
            "max_peak_rss_mib": max(r["peak_rss_mib"] for r in base),
            "projected_cpu_s": round(mean * size, 1),
            "_cpu": cpu,
        }
        if len(got) >= 2:
            row["stdev_cpu_s"] = round(statistics.stdev(cpu), 1)
            var += size**2 * statistics.variance(cpu) / len(got) * (1 - len(got) / size)
        rows.append(row)
        total += mean * size
        low += min(cpu) * size
        high += max(cpu) * size
        wall += row["mean_wall_s"] * size
    if not rows:
        return {"files": len(files), "measured": 0}
    rng = random.Random(seed)
    pools = [(row["files"], row["_cpu"]) for row in rows]
    boots = []
    for _ in range(rounds):
        boots.append(sum(size * statistics.fmean(rng.choice(cpu) for _ in cpu) for size, cpu in pools))
    boots.sort()
    for row in rows:
        del row["_cpu"]
    return {
        "files": len(files),
        "measured": len(every),
        "strata": rows,
        "estimated": estimated,
        "unprojected": unprojected,
        "complete": not unprojected,
        "timed_out": timed_out,  # their CPU time is what they had used when stopped
        "lower_bound": bool(timed_out),
        "cpu_s": round(total, 0),
        "cpu_h": round(total / 3600, 2),
        "cpu_s_if_each_stratum_min": round(low, 0),
        "cpu_s_if_each_stratum_max": round(high, 0),
        "cpu_s_standard_error": round(var**0.5, 0),
        "cpu_s_bootstrap_90": [round(boots[int(0.05 * rounds)], 0), round(boots[int(0.95 * rounds) - 1], 0)],
        "serial_wall_s": round(wall, 0),
        "max_peak_rss_mib": max(r["max_peak_rss_mib"] for r in rows),
    }


def _system_includes(python: str, nvcc: str | None, *, need_torch: bool) -> tuple[list[str], int, list[str]]:
    """-isystem folders as CMake gives them to a target linking torch (Python, torch, the CUDA toolkit), the
    torch ABI and notes on what could not be found (only tolerated when ``need_torch`` is false)."""
    notes, abi = [], 1
    found = [sysconfig.get_paths()["include"]]
    try:
        torch_inc, abi = torch_headers(python)
        found += torch_inc
    except Sm120kitError as exc:
        if need_torch:
            raise Fa3SourceError(
                f"torch is not importable by {python} ({exc.message.splitlines()[0]}); flash_api.cpp and "
                "flash_extension.cc need its headers.",
                hint="Pass --python an interpreter with torch installed.",
            ) from None
        notes.append(f"torch not importable by {python}: its include folders are left out here")
    cuda_root = build_mod.cuda_toolkit_root(nvcc) if nvcc else None
    if cuda_root:
        found.append(str(cuda_root / "include"))
    else:
        notes.append("the CUDA toolkit of nvcc was not found: its include folder is left out here")
    return found, abi, notes


def _choose_fa3(files: list[Fa3File], args) -> list[Fa3File]:
    if not args.fa3_file:
        return stratified_sample(files, args.fa3_sample or 0)
    chosen = []
    for want in args.fa3_file:
        hits = [f for f in files if want in (f.name, f.path.name)]
        if not hits:
            raise UsageError(
                f"--fa3-file {want!r} is not one of the {len(files)} files flash_ops compiles.",
                hint="Run with --fa3-list to see them by pattern; give a file name or its path in its tree.",
            )
        chosen += [f for f in hits if f not in chosen]
    return chosen


def run_fa3(args) -> int:
    """--fa3-list / --fa3-sample N / --fa3-file NAME: upstream's FA3 source list, and compiles of a sample."""
    kernel, deps_dir = prepare_sources(args, FA3_DEPS)
    build = read_fa3_build(kernel)
    files, counts = fa3_files(build, kernel, deps_dir)
    chosen = _choose_fa3(files, args)
    compiling = not args.fa3_list
    if compiling and not chosen:
        raise UsageError("--fa3-sample needs a number of files above 0 (or --fa3-file NAME).")
    nvcc = args.nvcc if args.nvcc and Path(args.nvcc).is_file() else None
    if compiling and not nvcc:
        raise MissingDependency(
            f"nvcc not found ({args.nvcc or 'not on PATH'}).", hint="Pass --nvcc PATH or put nvcc on PATH."
        )
    if compiling and any(f.language == "CXX" for f in chosen) and not args.cxx:
        raise MissingDependency("No C++ compiler (c++) on PATH.", hint="Pass --cxx PATH.")
    includes, abi, notes = _system_includes(
        args.python, nvcc, need_torch=compiling and any(f.language == "CXX" for f in chosen)
    )
    work = Path(args.cache).expanduser().resolve() / "objects" / "fa3"
    work.mkdir(parents=True, exist_ok=True)

    def cmd(f: Fa3File) -> list[str]:
        out = work / (f.path.name + ".o")
        return fa3_command(
            build,
            f,
            kernel,
            deps_dir,
            out,
            nvcc=nvcc or "nvcc",
            cxx=args.cxx or "c++",
            system_includes=includes,
            abi=abi,
        )

    sizes: dict[str, int] = {}
    for f in files:
        sizes[f.stratum] = sizes.get(f.stratum, 0) + 1
    data = {
        "mode": "fa3-list" if args.fa3_list else "fa3-sample",
        "cmake": f"{build.cmake}:{build.line}",
        "kernel": str(kernel),
        "flash_attention": str(deps_dir / "repo-flash-attention"),
        "patterns": counts,
        "other_sources": [f.name for f in files if not f.patterns],
        "files": len(files),
        "strata": sizes,
        "cuda_flags": list(build.cuda_flags),
        "gencodes": [g.split("code=")[-1] for g in build.gencodes],
        "definitions": list(build.definitions),
        "notes": notes,
        "sample": [{"file": f.name, "stratum": f.stratum, "features": dict(f.features)} for f in chosen],
    }
    example = chosen[0] if chosen else next(f for f in files if f.patterns)
    data["example_command"] = runner.quote(cmd(example))
    print(f"FA3 (flash_ops) as {build.cmake}:{build.line} builds it on x86-64 by default", flush=True)
    for row in counts:
        print(f"  {row['files']:4d} files  {row['pattern']}  ({row['variable']}, line {row['line']})")
    for name in data["other_sources"]:
        print(f"     1 file   {name}")
    print(f"  {len(files)} files in all; strata: {', '.join(f'{s} {n}' for s, n in sorted(sizes.items()))}")
    print(f"  targets: {' '.join(data['gencodes'])}; definitions: {' '.join(build.definitions)}")
    for note in notes:
        print(f"  note: {note}")
    if chosen:
        print(f"sample ({len(chosen)} files):")
        for f in chosen:
            print(f"  {f.stratum:11s} {f.name}")
    print(f"command of {example.name}:\n{data['example_command']}", flush=True)
    if args.fa3_list:
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        return 0

    nvcc_version = runner.run([nvcc, "--version"]).stdout.strip().splitlines()[-1]
    data.update(nvcc=nvcc_version, cores=os.cpu_count(), parallel=args.parallel, results=[], skipped=[])
    print(f"{nvcc_version}; {os.cpu_count()} cores; {args.parallel} at once", flush=True)
    start = time.perf_counter()
    lock = threading.Lock()

    def write() -> None:
        data["projection"] = projection(files, data["results"])
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")

    def job(f: Fa3File) -> None:
        if args.deadline and time.perf_counter() - start > args.deadline:
            with lock:
                data["skipped"].append(f.name)
            return
        argv = cmd(f)
        log = work / (f.path.name + ".log")
        stats = measure(argv, log, timeout=args.fa3_timeout or None)
        obj = Path(argv[-1])
        if stats.get("timed_out"):
            stats["error"] = f"stopped after {args.fa3_timeout} s (--fa3-timeout); cpu_s is a lower bound"
        elif stats["rc"] == 0 and obj.is_file():
            stats["object_bytes"] = obj.stat().st_size
            if f.language == "CUDA":
                stats["sass"] = list(fatbin.inspect_library(obj).sass)
        else:
            stats["error"] = log.read_text(errors="replace")[-1500:]
        row = {"file": f.name, "stratum": f.stratum, **stats}
        print(
            f"  {f.stratum:11s} {f.path.name:52s} wall {stats['wall_s']:7.1f} s  cpu {stats['cpu_s']:7.1f} s  "
            f"peak {stats['peak_rss_mib']:7.0f} MiB  obj {stats.get('object_bytes', 0) / 2**20:6.2f} MiB  "
            f"rc {stats['rc']}",
            flush=True,
        )
        with lock:
            data["results"].append(row)
            write()

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for future in [pool.submit(job, f) for f in chosen]:
            future.result()
    write()
    proj = data["projection"]
    print(json.dumps({k: v for k, v in proj.items() if k != "strata"}, indent=2))
    for row in proj.get("strata", []):
        print(
            f"  {row['stratum']:11s} {row['files']:4d} files x {row['mean_cpu_s']:7.1f} s "
            f"(measured {row['measured']}, {row['min_cpu_s']}-{row['max_cpu_s']} s) = {row['projected_cpu_s']:9.0f} s"
        )
    if proj.get("timed_out"):
        print(f"stopped at --fa3-timeout (the total is a lower bound): {', '.join(proj['timed_out'])}")
    if proj.get("unprojected"):
        print(f"NOT projected (no measured file to go by): {', '.join(proj['unprojected'])}; the total is partial")
    if data["skipped"]:
        print(f"skipped (deadline): {', '.join(data['skipped'])}")
    return 0 if proj.get("measured") else 1


def default_nvcc() -> str | None:
    found = shutil.which("nvcc")
    return found or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


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
    parser.add_argument("--nvcc", default=default_nvcc(), help="nvcc (default: from PATH, else /usr/local/cuda)")
    parser.add_argument("--cxx", default=shutil.which("c++"), help="C++ compiler of FA3's .cpp/.cc (default c++)")
    parser.add_argument("--json", help="write the results here (rewritten after every TU)")
    parser.add_argument(
        "--wheel",
        help="instead of compiling: device code per library of a published wheel "
        "and its projected size with sm_120a alone",
    )
    fa3 = parser.add_argument_group(
        "FA3",
        "upstream's flash_ops (FA3), which sm120kit's build skips: its source list as the CMakeLists builds it "
        "on x86-64 by default, and the compile cost of a stratified sample, projected to the whole list",
    )
    fa3.add_argument("--fa3-list", action="store_true", help="print the files per pattern and one command; no compile")
    fa3.add_argument("--fa3-sample", type=int, metavar="N", help="compile N files spread over the strata")
    fa3.add_argument("--fa3-file", action="append", metavar="NAME", help="compile this file (instead of a sample)")
    fa3.add_argument(
        "--fa3-timeout",
        type=float,
        default=0,
        metavar="S",
        help="stop a compile after S seconds; it counts with the CPU used so far (a lower bound)",
    )
    args = parser.parse_args(argv)
    if args.fa3_list or args.fa3_sample is not None or args.fa3_file:
        if args.fa3_sample is not None and args.fa3_sample < 0:
            parser.error("--fa3-sample N needs N >= 0")
        try:
            return run_fa3(args)
        except Sm120kitError as exc:
            print(f"error: {exc.render()}", file=sys.stderr)
            return exc.exit_code
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
