"""The nvcc launcher's rewriting of target flags (pure functions; the real builds are in test_build_kernel)."""

from __future__ import annotations

import pytest

from sm120kit.kernel.nvcc_launcher import filter_args, gencode_for

SGL_KERNEL_FLAGS = [  # the shape of sgl-kernel's common_ops compile line on x86-64 with CUDA 13
    "-DNDEBUG",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-gencode=arch=compute_90,code=sm_90",
    "-std=c++17",
    "--threads=32",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_100f,code=sm_100f",
    "-gencode=arch=compute_120a,code=sm_120a",
    "--compress-mode=size",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-x",
    "cu",
    "-c",
    "csrc/gemm/fp8_gemm_kernel.cu",
    "-o",
    "x.o",
]


def _targets(args):
    return [a for a in args if a.startswith(("-gencode", "--generate-code", "-arch", "--gpu-", "-code"))]


def test_sgl_kernel_line_keeps_only_the_requested_targets():
    out, decision = filter_args(SGL_KERNEL_FLAGS, ["sm_120a"])
    assert _targets(out) == ["-gencode=arch=compute_120a,code=sm_120a"]
    assert decision.action == "replaced"
    assert set(decision.original) == {"sm_90", "sm_80", "sm_89", "sm_100f", "sm_120a", "sm_90a"}
    # everything else is untouched and in order
    rest = [a for a in out if not a.startswith("-gencode")]
    assert rest == [a for a in SGL_KERNEL_FLAGS if not a.startswith("-gencode")]
    assert out.index("-gencode=arch=compute_120a,code=sm_120a") < out.index("-c")


def test_two_requested_targets_and_a_target_upstream_lacks():
    """12.1a is added although the x86 line never names sm_121a."""
    out, _ = filter_args(SGL_KERNEL_FLAGS, ["sm_120a", "sm_121a"])
    assert _targets(out) == ["-gencode=arch=compute_120a,code=sm_120a", "-gencode=arch=compute_121a,code=sm_121a"]


@pytest.mark.parametrize(
    "flags",
    [
        ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120a,code=sm_120a"],
        ["--generate-code=arch=compute_75,code=[compute_75,sm_75]"],  # CMake's own form; PTX runs on 12.x
        ["-arch=sm_90", "-gencode=arch=compute_120,code=sm_120"],
        ["-arch", "native"],
        ["--gpu-architecture=compute_80", "--gpu-code=sm_80,compute_80"],
    ],
)
def test_every_spelling_of_a_target_is_replaced(flags):
    out, decision = filter_args(["-O2", *flags, "-c", "k.cu", "-o", "k.o"], ["sm_120a"])
    assert _targets(out) == ["-gencode=arch=compute_120a,code=sm_120a"], out
    assert decision.action == "replaced"
    assert out[0] == "-O2" and out[-3:] == ["k.cu", "-o", "k.o"]


def test_no_target_gets_the_requested_ones():
    out, decision = filter_args(["-c", "k.cu"], ["sm_120a"])
    assert decision.action == "added" and out[0] == "-gencode=arch=compute_120a,code=sm_120a"


def test_code_meant_only_for_other_gpus_becomes_ptx_of_its_first_target():
    """FlashMLA/FA3-like objects (sm_90a, sm_100f only): PTX for compute_90a, no SASS, no sm_120a."""
    flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100f,code=sm_100f", "-c", "m.cu"]
    out, decision = filter_args(flags, ["sm_120a"])
    assert decision.action == "foreign-ptx"
    assert _targets(out) == ["-gencode=arch=compute_90a,code=compute_90a"]
    # arch-specific PTX (compute_90a) cannot run on 12.x either, so it is foreign as well
    _, decision = filter_args(["-gencode=arch=compute_90a,code=compute_90a", "-c", "m.cu"], ["sm_120a"])
    assert decision.action == "foreign-ptx"


def test_gencode_for_rejects_non_sass():
    assert gencode_for("sm_121a") == "-gencode=arch=compute_121a,code=sm_121a"
    with pytest.raises(ValueError):
        gencode_for("compute_120a")
