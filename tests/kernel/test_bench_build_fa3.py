"""scripts/bench_build.py's FA3 mode without compiling: upstream's ``flash_ops`` source list read from the
CMake text, the stratified sample, the compile command and the projection.

The CMake reader and the sample run on small trees written here (the CMake text in this file's own words,
shaped like sgl-kernel's FA3 block; file names from flash-attention's naming scheme). The real CMakeLists
of SGLang v0.5.18 (``sglang-kernel`` 0.4.6.post1) and its flash-attention tree are read where they are on
this machine: ``SM120KIT_BENCH_SOURCE`` (an SGLang clone or its kernel folder) and ``SM120KIT_BENCH_DEPS``
(holding repo-cutlass/ and repo-flash-attention/), else the folders ``bench_build.py`` itself clones and
fetches into (``<cache>/bench-build/sglang-v0.5.18`` and ``deps-v0.5.18``); those tests skip where neither
is present (no SGLang release on PyPI carries the kernel sources).
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_build
import pytest
from repo_paths import REPO_ROOT, SCRIPTS_DIR

from sm120kit.kernel.source import find_kernel_source
from sm120kit.util.cache import cache_dir

# -- a kernel folder and flash-attention tree of our own ----------------------------------------------------
CMAKE = """
cmake_minimum_required(VERSION 3.26)
project(tiny-kernel LANGUAGES CXX CUDA)
option(ENABLE_BELOW_SM90 "older GPUs too" ON)   # x86-64 default
if (SOMETHING_ELSE)
    include_directories(${NOT_KNOWN_HERE})      # inside another block: not read
endif()
include_directories(
    ${PROJECT_SOURCE_DIR}/include   # a comment (with parentheses)
)
if (SGL_KERNEL_ENABLE_FA3)
    set(SGL_FLASH_KERNEL_CUDA_FLAGS
        "-O3"
        "-gencode=arch=compute_90a,code=sm_90a"
        "--use_fast_math"
    )
    if (ENABLE_BELOW_SM90)
        list(APPEND SGL_FLASH_KERNEL_CUDA_FLAGS "-gencode=arch=compute_80,code=sm_80")
        file(GLOB OLD_SRCS "${repo-flash-attention_SOURCE_DIR}/hopper/instantiations/flash_fwd_hdim*_sm80.cu")
    else()
        list(APPEND SGL_FLASH_KERNEL_CUDA_FLAGS "-DNEVER_ON_X86")
    endif()
    file(GLOB NEW_SRCS "${repo-flash-attention_SOURCE_DIR}/hopper/instantiations/flash_fwd_hdim[0-9]*_bf16*_sm90.cu")
    file(GLOB NEW_SRCS_ "${repo-flash-attention_SOURCE_DIR}/hopper/instantiations/flash_fwd_hdimdiff_bf16*_sm90.cu")
    list(APPEND NEW_SRCS ${NEW_SRCS_})
    set(GEN ${NEW_SRCS} ${OLD_SRCS})
    set(ALL_SOURCES
        "csrc/ext.cc"
        "${repo-flash-attention_SOURCE_DIR}/hopper/combine.cu"
        "${GEN}"
    )
    Python_add_library(flash_ops MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${ALL_SOURCES})
    target_compile_options(flash_ops PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${SGL_FLASH_KERNEL_CUDA_FLAGS}>)
    target_include_directories(flash_ops PRIVATE
        ${repo-cutlass_SOURCE_DIR}/include
        ${repo-flash-attention_SOURCE_DIR}/hopper
    )
    set(DEFS KEEP_ME)
    if(NOT ENABLE_BELOW_SM90)
        list(APPEND DEFS ONLY_WITHOUT_SM8X)
    endif()
    if(NOT SGL_KERNEL_ENABLE_FA3_SPARSE_MASK)
        list(APPEND DEFS NO_SPARSE_MASK)
    endif()
    target_compile_definitions(flash_ops PRIVATE ${DEFS})
endif()
"""

HDIMS = ("64", "96", "128", "192", "256", "64_256", "192_128")
VARIANTS = ("", "_paged", "_split", "_softcap", "_paged_split_softcapall", "_softcap_packgqa")


def _names() -> list[str]:
    names = [f"flash_fwd_hdim{h}_bf16{v}_sm90.cu" for h, v in itertools.product(HDIMS, VARIANTS)]
    names += [f"flash_fwd_hdimdiff_bf16{v}_sm90.cu" for v in VARIANTS]
    names += [f"flash_fwd_hdim{h}_{d}{v}_sm80.cu" for h in HDIMS[:5] for d in ("bf16", "fp16") for v in VARIANTS[:4]]
    names += ["flash_fwd_hdimall_bf16_sm90.cu", "flash_fwd_hdim128_fp16_sm90.cu", "flash_bwd_hdim64_bf16_sm90.cu"]
    return names  # the last three match no pattern


def _tree(root: Path, cmake: str = CMAKE, reverse: bool = False) -> tuple[Path, Path]:
    kernel, deps = root / "kernel", root / "deps"
    (kernel / "csrc").mkdir(parents=True)
    (kernel / "CMakeLists.txt").write_text(cmake)
    (kernel / "pyproject.toml").write_text('[project]\nname = "tiny-kernel"\nversion = "0.1"\n')
    (kernel / "csrc" / "ext.cc").write_text("// host\n")
    inst = deps / "repo-flash-attention" / "hopper" / "instantiations"
    inst.mkdir(parents=True)
    (inst.parent / "combine.cu").write_text("// combine\n")
    (deps / "repo-cutlass" / "include").mkdir(parents=True)
    for name in reversed(_names()) if reverse else _names():
        (inst / name).write_text("// generated\n")
    return kernel, deps


def test_the_fa3_block_is_read_with_the_x86_64_defaults(tmp_path):
    kernel, deps = _tree(tmp_path)
    build = bench_build.read_fa3_build(kernel)
    assert build.line == 11
    assert build.cuda_flags == (
        "-O3",
        "-gencode=arch=compute_90a,code=sm_90a",
        "--use_fast_math",
        "-gencode=arch=compute_80,code=sm_80",
    )
    assert build.definitions == ("KEEP_ME", "NO_SPARSE_MASK")  # NOT ENABLE_BELOW_SM90 is false on x86-64
    assert build.include_dirs == ("@kernel/include", "@repo-cutlass/include", "@repo-flash-attention/hopper")
    assert [(g.variable, g.pattern) for g in build.globs] == [
        ("NEW_SRCS", "hopper/instantiations/flash_fwd_hdim[0-9]*_bf16*_sm90.cu"),
        ("NEW_SRCS_", "hopper/instantiations/flash_fwd_hdimdiff_bf16*_sm90.cu"),
        ("OLD_SRCS", "hopper/instantiations/flash_fwd_hdim*_sm80.cu"),
    ]
    assert build.sources[:2] == ("csrc/ext.cc", "@repo-flash-attention/hopper/combine.cu")

    files, counts = bench_build.fa3_files(build, kernel, deps)
    assert [c["files"] for c in counts] == [len(HDIMS) * len(VARIANTS), len(VARIANTS), 5 * 2 * 4]
    assert len(files) == 2 + sum(c["files"] for c in counts)  # the patterns do not overlap
    strata = {f.stratum for f in files}
    assert strata == {"host", "cuda-other", "sm90-bf16", "sm80-bf16", "sm80-fp16"}
    names = {f.path.name for f in files}
    assert not names & {"flash_fwd_hdimall_bf16_sm90.cu", "flash_fwd_hdim128_fp16_sm90.cu"}
    assert dict(
        next(f for f in files if f.path.name == "flash_fwd_hdim64_256_bf16_softcap_packgqa_sm90.cu").features
    ) == {
        "hdim": "64_256",
        "paged": "no",
        "split": "no",
        "softcap": "softcap",
        "packgqa": "yes",
    }


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("if (SGL_KERNEL_ENABLE_FA3)", "if (SOME_OTHER_SWITCH)"), "holds no top-level 'if"),
        (
            lambda t: t.replace("if(NOT SGL_KERNEL_ENABLE_FA3_SPARSE_MASK)", "if(USE_MAGIC)"),
            r"CMakeLists.txt:\d+: .*if\(USE_MAGIC\)",
        ),
        (
            lambda t: t.replace(
                '"${repo-flash-attention_SOURCE_DIR}/hopper/instantiations/flash_fwd_hdim*_sm80.cu"', '"/etc/*"'
            ),
            "not a pattern in the flash-attention tree",
        ),
        (lambda t: t.replace('"csrc/ext.cc"', '"../../outside.cc"'), "leaves the kernel folder"),
        (
            lambda t: t.replace("${repo-cutlass_SOURCE_DIR}/include", "${SOMEWHERE}/include"),
            r"\$\{SOMEWHERE\} is not set",
        ),
        (lambda t: t + '\nset(UNCLOSED "value\n', "a quoted argument is not closed"),
        (lambda t: t + "\nset(UNCLOSED value\n", r"CMakeLists.txt:\d+: the call of set\(\) is not closed"),
        (
            lambda t: t.replace(
                "target_compile_options(flash_ops PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${SGL_FLASH_KERNEL_CUDA_FLAGS}>)",
                "",
            ),
            "no -gencode flags",
        ),
    ],
)
def test_a_cmake_text_of_another_shape_is_a_clear_error(tmp_path, edit, message):
    kernel, _ = _tree(tmp_path, edit(CMAKE))
    with pytest.raises(bench_build.Fa3SourceError, match=message):
        bench_build.read_fa3_build(kernel)


def test_a_file_linked_out_of_the_tree_is_refused(tmp_path):
    kernel, deps = _tree(tmp_path)
    outside = tmp_path / "elsewhere.cu"
    outside.write_text("// not upstream's\n")
    (deps / "repo-flash-attention" / "hopper" / "instantiations" / "flash_fwd_hdim999_bf16_sm90.cu").symlink_to(outside)
    build = bench_build.read_fa3_build(kernel)
    with pytest.raises(bench_build.Fa3SourceError, match="is a link or leads out of"):
        bench_build.fa3_files(build, kernel, deps)


def _fa3_list(kernel: Path, deps: Path) -> subprocess.CompletedProcess:
    """``bench_build.py --fa3-list`` run as a user runs it."""
    argv = [sys.executable, str(SCRIPTS_DIR / "bench_build.py"), "--fa3-list", "--source", str(kernel)]
    return subprocess.run(
        [*argv, "--deps-dir", str(deps)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_the_script_reports_bad_input_in_a_paragraph_with_its_exit_code(tmp_path):
    kernel, deps = _tree(tmp_path, CMAKE.replace("if (SGL_KERNEL_ENABLE_FA3)", "if (SOME_OTHER_SWITCH)"))
    proc = _fa3_list(kernel, deps)
    assert proc.returncode == 2, proc.stderr
    assert "holds no top-level 'if (SGL_KERNEL_ENABLE_FA3)' block" in proc.stderr and "Traceback" not in proc.stderr
    proc = _fa3_list(kernel, tmp_path)
    assert proc.returncode == 2 and "lacks repo-cutlass/, repo-flash-attention/" in proc.stderr, proc.stderr


# -- the sample -----------------------------------------------------------------------------------------------
def test_allocation_gives_every_stratum_one_then_shares_by_size():
    sizes = {"a": 90, "b": 60, "c": 2, "d": 2}
    assert bench_build.allocate(sizes, 10) == {"a": 5, "b": 3, "c": 1, "d": 1}  # 6 more: 3.5 and 2.3
    assert sum(bench_build.allocate(sizes, 16).values()) == 16
    assert bench_build.allocate(sizes, 2) == {"a": 1, "b": 1, "c": 0, "d": 0}  # short: the largest first
    assert bench_build.allocate(sizes, 500) == sizes  # never more than a stratum holds


def test_the_sample_is_deterministic_and_spread(tmp_path):
    kernel, deps = _tree(tmp_path / "one")
    kernel2, deps2 = _tree(tmp_path / "two", reverse=True)  # the same files, created in the other order
    build = bench_build.read_fa3_build(kernel)
    files, _ = bench_build.fa3_files(build, kernel, deps)
    files2, _ = bench_build.fa3_files(bench_build.read_fa3_build(kernel2), kernel2, deps2)
    sample = bench_build.stratified_sample(files, 12)
    assert [f.name for f in sample] == [f.name for f in bench_build.stratified_sample(list(reversed(files2)), 12)]
    assert len(sample) == len({f.name for f in sample}) == 12
    assert {f.stratum for f in sample} == {f.stratum for f in files}  # every stratum
    sm90 = [dict(f.features) for f in sample if f.stratum == "sm90-bf16"]
    assert len(sm90) >= 4
    assert len({f["hdim"] for f in sm90}) == len(sm90)  # no head dim twice while others are left
    for key in ("paged", "split", "softcap", "packgqa"):
        assert len({dict(f.features)[key] for f in sample if f.features}) >= 2, key
    assert len(bench_build.stratified_sample(files, 10_000)) == len(files)


def test_the_command_holds_upstreams_flags_targets_and_folders(tmp_path):
    kernel, deps = _tree(tmp_path)
    build = bench_build.read_fa3_build(kernel)
    files, _ = bench_build.fa3_files(build, kernel, deps)
    cu = next(f for f in files if f.stratum == "sm80-fp16")
    argv = bench_build.fa3_command(
        build, cu, kernel, deps, tmp_path / "x.o", nvcc="NVCC", cxx="CXX", system_includes=["/torch/include"], abi=1
    )
    assert argv[0] == "NVCC" and argv[-6:] == ["-x", "cu", "-c", str(cu.path), "-o", str(tmp_path / "x.o")]
    assert [a for a in argv if a.startswith("-gencode")] == [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_80,code=sm_80",
    ]
    assert argv.index("--use_fast_math") > argv.index("-D_GLIBCXX_USE_CXX11_ABI=1")  # the target's options last
    assert {"-DKEEP_ME", "-DNO_SPARSE_MASK", bench_build.FA3_PY_LIMITED_API} <= set(argv)
    assert [a for a in argv if a.startswith("-I")] == [
        f"-I{kernel}/include",
        f"-I{deps}/repo-cutlass/include",
        f"-I{deps}/repo-flash-attention/hopper",
    ]
    assert argv[argv.index("-isystem") + 1] == "/torch/include"
    host = next(f for f in files if f.stratum == "host")
    argv = bench_build.fa3_command(
        build, host, kernel, deps, tmp_path / "h.o", nvcc="NVCC", cxx="CXX", system_includes=[], abi=0
    )
    assert argv[0] == "CXX" and "-D_GLIBCXX_USE_CXX11_ABI=0" in argv and "-DKEEP_ME" in argv
    assert not [a for a in argv if "gencode" in a or a == "--use_fast_math"]  # CUDA-only options stay off


def test_the_projection_is_stratum_means_times_file_counts(tmp_path):
    kernel, deps = _tree(tmp_path)
    files, _ = bench_build.fa3_files(bench_build.read_fa3_build(kernel), kernel, deps)
    sizes = {s: sum(f.stratum == s for f in files) for s in {f.stratum for f in files}}
    cpu = {"sm90-bf16": [100.0, 140.0, 120.0], "sm80-bf16": [40.0, 60.0], "host": [30.0], "cuda-other": [10.0]}

    def row(stratum, value, rc=0):
        return {"file": "f", "stratum": stratum, "cpu_s": value, "wall_s": value + 1, "peak_rss_mib": 900, "rc": rc}

    results = [row(s, v) for s, values in cpu.items() for v in values] + [row("sm80-fp16", 9999.0, rc=1)]
    proj = bench_build.projection(files, results)
    inst_mean = statistics.fmean(cpu["sm90-bf16"] + cpu["sm80-bf16"])  # sm80-fp16 failed: estimated
    expected = sum(statistics.fmean(v) * sizes[s] for s, v in cpu.items()) + inst_mean * sizes["sm80-fp16"]
    assert proj["cpu_s"] == round(expected)
    assert proj["estimated"] == ["sm80-fp16"] and proj["measured"] == 7 and proj["files"] == len(files)
    low = sum(min(v) * sizes[s] for s, v in cpu.items()) + 40 * sizes["sm80-fp16"]
    high = sum(max(v) * sizes[s] for s, v in cpu.items()) + 140 * sizes["sm80-fp16"]
    assert (proj["cpu_s_if_each_stratum_min"], proj["cpu_s_if_each_stratum_max"]) == (round(low), round(high))
    lo, hi = proj["cpu_s_bootstrap_90"]
    assert low <= lo < proj["cpu_s"] < hi <= high
    se = (sizes["sm90-bf16"] ** 2 * statistics.variance(cpu["sm90-bf16"]) / 3 * (1 - 3 / sizes["sm90-bf16"])) + (
        sizes["sm80-bf16"] ** 2 * statistics.variance(cpu["sm80-bf16"]) / 2 * (1 - 2 / sizes["sm80-bf16"])
    )
    assert proj["cpu_s_standard_error"] == round(se**0.5)
    assert proj == bench_build.projection(files, list(reversed(results)))  # fixed seed, order-free
    assert proj["complete"] and not proj["unprojected"]
    # one host file measured: the instantiations have nothing to go by; the other small strata take its mean
    only = bench_build.projection(files, [row("host", 30.0)])
    assert only["unprojected"] == ["sm80-bf16", "sm80-fp16", "sm90-bf16"] and not only["complete"]
    assert only["estimated"] == ["cuda-other"] and only["cpu_s"] == 30 * (sizes["host"] + sizes["cuda-other"])


def test_a_compile_past_the_timeout_is_stopped_with_its_tree_and_counts_as_a_lower_bound(tmp_path):
    """A stand-in for nvcc (no compile needed): a shell whose child spins on the CPU, as cicc under nvcc."""
    pid_file, spinner = tmp_path / "child.pid", tmp_path / "spin.py"
    spinner.write_text(f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n")
    argv = ["sh", "-c", f"{sys.executable} {spinner} & wait"]
    stats = bench_build.measure(argv, tmp_path / "log", timeout=1.5)
    assert stats["timed_out"] and stats["rc"] == -9 and 1.5 <= stats["wall_s"] < 10
    assert stats["cpu_s"] > 0.2  # the child's CPU time, sampled from /proc while it ran
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    row = {"file": "slow.cu", "stratum": "sm90-bf16", **stats}
    kernel, deps = _tree(tmp_path / "t")
    files, _ = bench_build.fa3_files(bench_build.read_fa3_build(kernel), kernel, deps)
    proj = bench_build.projection(files, [row])
    assert proj["lower_bound"] and proj["timed_out"] == ["slow.cu"] and proj["measured"] == 1


# -- the real CMake text of SGLang v0.5.18 and its flash-attention tree ------------------------------------------
def _real_sources() -> tuple[Path | None, Path | None]:
    bench = cache_dir() / "bench-build"
    source = os.environ.get("SM120KIT_BENCH_SOURCE") or bench / f"sglang-{bench_build.DEFAULT_REF}"
    deps = os.environ.get("SM120KIT_BENCH_DEPS") or bench / f"deps-{bench_build.DEFAULT_REF}"
    source, deps = Path(source), Path(deps)
    return (source if source.is_dir() else None), (deps if (deps / "repo-flash-attention").is_dir() else None)


REAL_SOURCE, REAL_DEPS = _real_sources()
needs_real = pytest.mark.skipif(REAL_SOURCE is None, reason="no SGLang v0.5.18 clone (SM120KIT_BENCH_SOURCE)")
needs_real_deps = pytest.mark.skipif(
    REAL_SOURCE is None or REAL_DEPS is None, reason="no SGLang v0.5.18 clone and deps (SM120KIT_BENCH_SOURCE/_DEPS)"
)

# SGLang v0.5.18, python/sglang/kernels/aot/CMakeLists.txt: the FA3 block with the x86-64 defaults.
V0518_PATTERNS = [
    ("FA3_BF16_GEN_SRCS", "hopper/instantiations/flash_fwd_hdim[0-9]*_bf16*_sm90.cu"),
    ("FA3_BF16_GEN_SRCS_", "hopper/instantiations/flash_fwd_hdimdiff_bf16*_sm90.cu"),
    ("FA3_FP16_GEN_SRCS", "hopper/instantiations/flash_fwd_hdim[0-9]*_fp16*_sm90.cu"),
    ("FA3_FP16_GEN_SRCS_", "hopper/instantiations/flash_fwd_hdimdiff_fp16*_sm90.cu"),
    ("FA3_FP8_GEN_SRCS", "hopper/instantiations/flash_fwd_hdim[0-9]*_e4m3*_sm90.cu"),
    ("FA3_FP8_GEN_SRCS_", "hopper/instantiations/flash_fwd_hdimdiff_e4m3*_sm90.cu"),
    ("FA3_SM8X_GEN_SRCS", "hopper/instantiations/flash_fwd_hdim*_sm80.cu"),
]
V0518_FIXED = (
    "csrc/flash_extension.cc",
    "@repo-flash-attention/hopper/flash_prepare_scheduler.cu",
    "@repo-flash-attention/hopper/flash_api.cpp",
    "@repo-flash-attention/hopper/flash_fwd_combine.cu",
)
V0518_DEFS = (
    "FLASHATTENTION_DISABLE_BACKWARD",
    "FLASHATTENTION_DISABLE_DROPOUT",
    "FLASHATTENTION_DISABLE_UNEVEN_K",
    "FLASHATTENTION_VARLEN_ONLY",
    "FLASHATTENTION_DISABLE_SPARSE_MASK",
)


@needs_real
def test_the_v0518_cmake_text_gives_upstreams_fa3_list_flags_and_targets():
    source = find_kernel_source(REAL_SOURCE)
    assert source.version == "0.4.6.post1", "SM120KIT_BENCH_SOURCE is not SGLang v0.5.18"
    build = bench_build.read_fa3_build(source.path)
    assert sorted((g.variable, g.pattern) for g in build.globs) == sorted(V0518_PATTERNS)
    assert tuple(s for s in build.sources if isinstance(s, str)) == V0518_FIXED
    assert build.gencodes == (
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_86,code=sm_86",
    )
    assert {
        "-DCUTLASS_ENABLE_GDC_FOR_SM90",
        "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
        "--use_fast_math",
        "-Xcompiler=-fno-strict-aliasing",
        "--expt-relaxed-constexpr",
    } <= set(build.cuda_flags)
    assert not [f for f in build.cuda_flags if f.startswith("--threads")]  # flash_ops has no --threads
    assert build.definitions == V0518_DEFS  # ENABLE_BELOW_SM90 ON: no FLASHATTENTION_DISABLE_SM8x
    assert build.include_dirs == (
        "@kernel/include",
        "@kernel/csrc",
        "@repo-cutlass/include",
        "@repo-cutlass/tools/util/include",
        "@repo-flash-attention/hopper",
    )


@needs_real_deps
def test_the_v0518_list_counts_every_pattern_in_the_flash_attention_tree():
    source = find_kernel_source(REAL_SOURCE)
    build = bench_build.read_fa3_build(source.path)
    files, counts = bench_build.fa3_files(build, source.path, REAL_DEPS)
    assert all(c["files"] > 0 for c in counts), counts
    assert len(files) == len(V0518_FIXED) + sum(c["files"] for c in counts)
    strata = {f.stratum for f in files}
    assert strata == {"host", "cuda-other", "sm80-bf16", "sm80-fp16", "sm90-bf16", "sm90-fp16", "sm90-e4m3"}
    sample = bench_build.stratified_sample(files, 16)
    assert {f.stratum for f in sample} == strata
    assert sample == bench_build.stratified_sample(list(reversed(files)), 16)


@pytest.mark.slow
@needs_real_deps
def test_fa3_list_prints_the_counts_and_one_command_and_compiles_nothing(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS_DIR / "bench_build.py"),
            "--fa3-list",
            "--fa3-sample",
            "8",
            "--source",
            str(REAL_SOURCE),
            "--deps-dir",
            str(REAL_DEPS),
            "--cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "files  hopper/instantiations/flash_fwd_hdim*_sm80.cu  (FA3_SM8X_GEN_SRCS" in proc.stdout
    command = proc.stdout.split("command of ", 1)[1].splitlines()[1]
    assert " -gencode=arch=compute_90a,code=sm_90a " in command and " -gencode=arch=compute_86,code=sm_86 " in command
    assert "sample (8 files):" in proc.stdout
    assert not list(tmp_path.rglob("*.o"))
