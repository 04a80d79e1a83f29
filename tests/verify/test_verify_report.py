"""The environment report of ``sm120kit verify``: parsing of tool output, arch lists and environment, and the
decision logic on faked 12.0, 12.1 and 9.0 devices.

The faked devices (:mod:`sm120kit.hardware.fake_device`) stand in for GPUs this machine lacks: torch answers
questions about the device with the preset's figures; nothing runs on it. The sgl_kernel libraries the
decision logic judges are real fat binaries, compiled here with nvcc for the archs each test names.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from sm120kit.hardware.fake_device import PRESETS, faked_cuda
from sm120kit.sglang import mla_kernels
from sm120kit.verify import report
from sm120kit.verify.report import (
    ERROR,
    INFO,
    WARNING,
    ArchEntry,
    DriverInfo,
    FlashInferInfo,
    PackageInfo,
    SglangInfo,
    SglKernelInfo,
    ToolInfo,
    TorchInfo,
    assess,
    parse_arch_list,
    parse_cuda_tool_version,
    runs_on,
)

NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
PTXAS_128 = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:22:20_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""


# -- parsing ------------------------------------------------------------------------------------------------


def test_tool_versions_parse_from_nvcc_and_ptxas_output():
    assert parse_cuda_tool_version(NVCC_13) == ((13, 0), "13.0.88")
    assert parse_cuda_tool_version(PTXAS_128) == ((12, 8), "12.8.93")
    assert parse_cuda_tool_version("Cuda compilation tools, release 12.4") == ((12, 4), "12.4")
    assert parse_cuda_tool_version("command not found") == (None, None)
    assert parse_cuda_tool_version("") == (None, None)


def test_arch_lists_in_every_spelling():
    torch_list = parse_arch_list(["sm_75", "sm_90", "sm_120", "compute_120"])
    assert [e.name for e in torch_list] == ["sm_75", "sm_90", "sm_120", "compute_120"]
    env = parse_arch_list("8.0;9.0+PTX 12.0a,12.1f")
    assert [(e.capability, e.suffix, e.kind) for e in env] == [
        ((8, 0), "", "sass"),
        ((9, 0), "", "sass"),
        ((9, 0), "", "ptx"),
        ((12, 0), "a", "sass"),
        ((12, 1), "f", "sass"),
    ]
    # The fat-binary reader names PTX entries sm_XY, as cuobjdump does; the caller says which kind they are.
    assert parse_arch_list(["sm_80"], kind="ptx")[0].name == "compute_80"
    for bad in ("sm_", "gfx1201", "sm_12x", "9"):
        with pytest.raises(ValueError):
            parse_arch_list([bad])


@pytest.mark.parametrize(
    "name, kind, capability, expected",
    [
        ("sm_120a", "sass", (12, 0), True),
        ("sm_120a", "sass", (12, 1), False),  # arch-specific code runs on exactly that GPU
        ("sm_121a", "sass", (12, 0), False),
        ("sm_120", "sass", (12, 1), True),  # plain SASS runs on later minors of the same major
        ("sm_120f", "sass", (12, 1), True),  # family code: the whole 12.x family from 12.0 on
        ("sm_120f", "sass", (10, 0), False),
        ("sm_90a", "sass", (9, 0), True),
        ("sm_90", "sass", (12, 0), False),  # SASS never crosses a major version
        ("sm_100a", "sass", (12, 0), False),
        ("compute_90", "ptx", (12, 0), True),  # PTX is compiled by the driver for any newer GPU
        ("compute_120", "ptx", (9, 0), False),
        ("compute_90a", "ptx", (12, 0), False),
    ],
)
def test_which_code_runs_on_which_gpu(name, kind, capability, expected):
    (entry,) = parse_arch_list([name], kind=kind)
    assert runs_on(entry, capability) is expected


def test_relevant_environment_variables():
    env = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
        "NCCL_PROTO": "LL",
        "TORCH_CUDA_ARCH_LIST": "12.0a",
        "FLASHINFER_CUDA_ARCH_LIST": "12.0f",
        "TRITON_PTXAS_PATH": "/x",
        "SGL_KERNEL_COMPILE_THREADS": "8",
        "CUDA_VISIBLE_DEVICES": "0",
        "LD_LIBRARY_PATH": "/lib",
    }
    assert list(report.relevant_env(env)) == sorted(
        [
            "SGLANG_ENABLE_JIT_DEEPGEMM",
            "NCCL_PROTO",
            "TORCH_CUDA_ARCH_LIST",
            "FLASHINFER_CUDA_ARCH_LIST",
            "TRITON_PTXAS_PATH",
            "SGL_KERNEL_COMPILE_THREADS",
            "CUDA_VISIBLE_DEVICES",
        ]
    )


def test_driver_version_from_proc_file():
    text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(dvs-builder@U16-I3-C07-1-1)  Thu Oct  9 19:49:13 UTC 2025\nGCC version:  gcc version 12.3.0\n"
    )
    assert report.parse_driver_version_file(text) == "580.159.04"
    assert (
        report.parse_driver_version_file("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 2025")
        == "570.86.15"
    )
    assert report.parse_driver_version_file("") is None


def test_release_pins_and_mismatches():
    meta = (
        "Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.23\nRequires-Dist: torch==2.14.1\n"
        "Requires-Dist: sglang-kernel==0.4.10\nRequires-Dist: flashinfer_python[cu13]==0.7.2\n"
        'Requires-Dist: numpy\nRequires-Dist: torch==2.9.1; extra == "cpu"\n'
    )
    pins = report.parse_pins(meta)
    assert pins == {"torch": "==2.14.1", "sglang-kernel": "==0.4.10", "flashinfer-python": "==0.7.2"}
    found = report.pin_mismatches(pins, {"torch": "2.14.1+cu130", "sglang-kernel": "0.4.5", "flashinfer-python": None})
    assert found == [("sglang-kernel", "==0.4.10", "0.4.5")]  # the local tag (+cu130) does not count


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_real_nvcc_and_ptxas_are_probed_through_the_runner():
    nvcc = report.probe_tool("nvcc")
    assert nvcc.found and nvcc.release >= (12, 0) and nvcc.path == shutil.which("nvcc")
    missing = report.probe_tool("nvcc-that-does-not-exist")
    assert not missing.found and "not on PATH" in missing.error


def test_triton_ptxas_choice(tmp_path):
    triton_dir = tmp_path / "triton"
    bin_dir = triton_dir / "backends" / "nvidia" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("ptxas", "ptxas-blackwell"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    own = tmp_path / "my-ptxas"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    # Triton >= 3.6 assembles sm_90 and later with ptxas-blackwell, earlier targets with ptxas.
    assert report.triton_ptxas_choice(triton_dir, 120, {}, True)[:2] == (
        str(bin_dir / "ptxas-blackwell"),
        "bundled with triton",
    )
    assert report.triton_ptxas_choice(triton_dir, 80, {}, True)[0] == str(bin_dir / "ptxas")
    assert report.triton_ptxas_choice(triton_dir, 120, {}, False)[0] == str(bin_dir / "ptxas")
    env = {"TRITON_PTXAS_BLACKWELL_PATH": str(own)}
    assert report.triton_ptxas_choice(triton_dir, 120, env, True)[:2] == (str(own), "TRITON_PTXAS_BLACKWELL_PATH")
    path, source, _ = report.triton_ptxas_choice(triton_dir, 120, {"TRITON_PTXAS_BLACKWELL_PATH": "/nope"}, True)
    assert path == str(bin_dir / "ptxas-blackwell") and "names no runnable file" in source


# -- sgl_kernel libraries compiled for real -------------------------------------------------------------------

KERNEL = "__global__ void k(float* y) { y[threadIdx.x] *= 2.0f; }\n"


def _library(folder: Path, name: str, archs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{name}.cu"
    src.write_text(KERNEL)
    out = folder / f"{name}.abi3.so"
    gencodes = [f"-gencode=arch=compute_{a.removeprefix('sm_')},code={a}" for a in archs]
    subprocess.run(
        ["nvcc", "-shared", "-Xcompiler", "-fPIC", *gencodes, str(src), "-o", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    src.unlink()
    return out


@pytest.fixture(scope="module")
def kernel_packages(tmp_path_factory):
    """Two sgl_kernel-shaped packages whose ``common_ops`` libraries are real nvcc output (about 5 s):
    ``good`` has sm_120a in ``sm100/`` like the published wheels; ``no120`` lacks it."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    made = {}
    for label, sm100_archs in (("good", ["sm_100a", "sm_120a"]), ("no120", ["sm_100a"])):
        site = tmp_path_factory.mktemp(f"site-{label}")
        pkg = site / "sgl_kernel"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        _library(pkg / "sm90", "common_ops", ["sm_90a"])
        _library(pkg / "sm100", "common_ops", sm100_archs)
        dist = site / "sglang_kernel-0.4.10.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.10\n")
        made[label] = site
    return made


def _use_site(monkeypatch, site: Path) -> None:
    import importlib

    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, variant, error",
    [
        ("12.0", "sm100", False),  # the loader takes sm100/ for every capability but 9.0; it holds sm_120a
        ("12.1", "sm100", True),  # sm_120a code does not run on 12.1
        ("9.0", "sm90", False),
    ],
)
def test_sgl_kernel_loader_variant_and_its_archs(kernel_packages, monkeypatch, preset, variant, error):
    """Faked devices stand in for the GPUs; the libraries are real fat binaries."""
    _use_site(monkeypatch, kernel_packages["good"])
    device = PRESETS[preset]
    info = report.probe_sgl_kernel(device.capability)
    assert info.version == "0.4.10" and info.variant == variant
    assert info.variant_library == f"{variant}/common_ops.abi3.so"
    loaded = [lib for lib in info.libraries if lib.loaded_by_loader]
    assert [lib.path for lib in loaded] == [f"{variant}/common_ops.abi3.so"]
    flags = [f for f in report._assess_sgl_kernel(info, device.capability, device.label) if f.severity == ERROR]
    assert bool(flags) is error
    if error:
        assert "sm100/common_ops.abi3.so" in flags[0].message and "12.1" in flags[0].message


@pytest.mark.slow
def test_sgl_kernel_without_sm120a_is_an_error_on_12_0(kernel_packages, monkeypatch):
    _use_site(monkeypatch, kernel_packages["no120"])
    info = report.probe_sgl_kernel((12, 0))
    (flag,) = report._assess_sgl_kernel(info, (12, 0), "12.0")
    assert flag.severity == ERROR and "holds sm_100a" in flag.message
    assert not report._assess_sgl_kernel(report.probe_sgl_kernel((9, 0)), (9, 0), "9.0")


def test_sgl_kernel_falls_back_to_a_top_level_library(tmp_path):
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "common_ops.abi3.so").write_bytes(b"\x7fELF")
    assert report.sgl_kernel_variant(pkg, (12, 0))[:2] == ("", "common_ops.abi3.so")
    (pkg / "common_ops.abi3.so").unlink()
    variant, library, why = report.sgl_kernel_variant(pkg, (12, 0))
    assert library is None and "neither sm100/common_ops.* nor common_ops.* exists" in why


# -- the GPU and torch as the faked devices report them ------------------------------------------------------


@pytest.mark.parametrize("preset", ["12.0", "12.1", "9.0"])
def test_gpu_probe_on_faked_devices(preset):
    """The faked device stands in for hardware this machine lacks; only torch's answers are faked."""
    import torch

    device = PRESETS[preset]
    with faked_cuda(device):
        gpu, note = report.probe_gpu(torch)
        torch_info, _ = report.probe_torch()
    assert note == ""
    assert gpu.capability == device.capability and gpu.platform == "cuda" and gpu.name == device.name
    assert gpu.shared_memory_per_block_optin == device.shared_memory_per_block
    assert gpu.known_shared_memory_per_block == device.shared_memory_per_block
    assert gpu.sm_count == device.multi_processor_count
    assert torch_info.cuda == "13.0" and torch_info.arch_list == (f"sm_{device.sm}",)
    assert report.judged_capability(gpu, None) == (device.capability, f"the GPU present ({device.name})")
    assert report.judged_capability(gpu, (12, 0))[0] == (12, 0)


def test_hip_gpu_is_not_sm120():
    """AMD RDNA4 reports major 12 through HIP (faked: no such GPU here); it must not be judged as SM120."""
    import torch

    with faked_cuda(PRESETS["hip-12"]):
        gpu, _ = report.probe_gpu(torch)
    assert gpu.platform == "hip" and gpu.family is None
    judged, why = report.judged_capability(gpu, None)
    assert judged == (12, 0) and "no NVIDIA GPU present" in why
    flags = _assess(gpu=gpu)
    assert any(f.component == "gpu" and "AMD" in f.message for f in flags)


def test_no_gpu_is_judged_for_sm120():
    import torch

    gpu, note = report.probe_gpu(torch)
    if gpu is not None:  # pragma: no cover - only on a machine with a GPU
        pytest.skip("this machine has a GPU")
    assert "no GPU" in note
    assert report.judged_capability(None, None) == (
        (12, 0),
        "no NVIDIA GPU present: judged for SM120 (12.0), the GPU family sm120kit targets",
    )


# -- the decision logic ---------------------------------------------------------------------------------------

GOOD = dict(
    judged=(12, 0),
    gpu=None,
    driver=DriverInfo("580.159.04", (13, 0)),
    nvcc=ToolInfo("nvcc", "/usr/local/cuda/bin/nvcc", (13, 0), "13.0.88"),
    triton_ptxas=ToolInfo("ptxas (Triton)", "/t/ptxas-blackwell", (12, 9), "12.9.86", "bundled with triton"),
    torch=TorchInfo("2.9.1+cu130", "13.0", None, ("sm_80", "sm_90", "sm_100", "sm_120")),
    triton=PackageInfo("triton", "3.5.1", "/t"),
    sglang=SglangInfo("0.5.23", "/s/sglang", "installed"),
    sgl_kernel=SglKernelInfo(
        "0.4.10",
        "/s/sgl_kernel",
        "sm100",
        "sm100/common_ops.abi3.so",
        "why",
        (report.LibraryInfo("sm100/common_ops.abi3.so", ("sm_100a", "sm_120a"), (), True),),
    ),
    flashinfer=FlashInferInfo("0.6.8", "/s/flashinfer", ("12.0f",), "from the visible GPUs"),
    env={},
)


def _assess(**changes):
    # Judged on aarch64 unless a test says otherwise: 12.1 is the DGX Spark, whose minimum CUDA is 12.9 there
    # (13.0 on x86-64); nothing else depends on the machine.
    return assess(**{**GOOD, "machine": "aarch64", **changes})


def _errors(flags):
    return [f for f in flags if f.severity == ERROR]


def test_a_good_sm120_environment_has_no_findings():
    assert _assess() == ()


def test_cpu_only_torch_is_an_error():
    (flag,) = _errors(_assess(torch=TorchInfo("2.13.0+cpu", None, None, ())))
    assert flag.component == "torch" and "CPU-only" in flag.message


def test_cuda_older_than_12_8_cannot_target_sm120():
    """torch built with CUDA 12.6 on a faked 12.0 device (no SM120 GPU here)."""

    old = dataclasses.replace(PRESETS["12.0"], cuda_version="12.6")
    with faked_cuda(old):
        torch_info, _ = report.probe_torch()
    flags = _errors(_assess(torch=dataclasses.replace(torch_info, arch_list=("sm_90", "sm_100"))))
    messages = " ".join(f.message for f in flags)
    assert "built with CUDA 12.6; 12.0 (sm_120a) needs CUDA 12.8" in messages
    assert "has no code that runs on 12.0" in messages


def _torch_errors(flags):
    return [f for f in _errors(flags) if f.component == "torch"]


def test_torch_arch_list_coverage_differs_between_12_0_and_12_1():
    only_a = TorchInfo("2.9.1", "12.9", None, ("sm_90", "sm_120a"))
    assert not _torch_errors(_assess(torch=only_a))
    assert _torch_errors(_assess(torch=only_a, judged=(12, 1)))
    plain = TorchInfo("2.9.1", "12.9", None, ("sm_90", "sm_120"))
    assert not _torch_errors(_assess(torch=plain, judged=(12, 1)))


@pytest.mark.parametrize(
    "release, judged, bad, machine",
    [
        ((12, 4), (12, 0), True, "x86_64"),
        ((12, 8), (12, 0), False, "x86_64"),
        ((12, 8), (12, 1), True, "aarch64"),
        ((12, 9), (12, 1), False, "aarch64"),
        ((12, 9), (12, 1), True, "x86_64"),
        ((13, 0), (12, 1), False, "x86_64"),
        ((12, 4), (9, 0), False, "x86_64"),
    ],
)
def test_triton_ptxas_too_old_for_the_target(release, judged, bad, machine):
    tool = ToolInfo("ptxas (Triton)", "/t/ptxas", release, f"{release[0]}.{release[1]}.0", "bundled with triton")
    kernel = dataclasses.replace(GOOD["sgl_kernel"], libraries=())
    flags = [
        f
        for f in _assess(
            triton_ptxas=tool,
            judged=judged,
            sgl_kernel=kernel,
            machine=machine,
            torch=TorchInfo("2.9.1", "13.0", None, ("sm_90", "sm_120", "sm_121")),
        )
        if f.component == "triton"
    ]
    assert bool(flags) is bad
    if bad:
        assert flags[0].severity == ERROR and "needs ptxas" in flags[0].message


def test_flashinfer_jit_archs_must_cover_the_gpu():
    assert not _errors(
        _assess(
            judged=(12, 1), torch=TorchInfo("2.9.1", "13.0", None, ("sm_120",)), sgl_kernel=SglKernelInfo(None, None)
        )
    )  # 12.0f runs on 12.1
    a_only = dataclasses.replace(GOOD["flashinfer"], jit_archs=("12.0a",))
    flags = _errors(
        _assess(
            judged=(12, 1),
            flashinfer=a_only,
            torch=TorchInfo("2.9.1", "13.0", None, ("sm_120",)),
            sgl_kernel=SglKernelInfo(None, None),
        )
    )
    assert [f.component for f in flags] == ["flashinfer"]
    hopper = dataclasses.replace(GOOD["flashinfer"], jit_archs=("9.0a",))
    assert [f.component for f in _errors(_assess(flashinfer=hopper))] == ["flashinfer"]


def test_flashinfer_jit_needs_cuda_12_9_on_sm12x():
    nvcc = ToolInfo("nvcc", "/c/nvcc", (12, 8), "12.8.93")
    flags = _errors(_assess(nvcc=nvcc))
    assert [f.component for f in flags] == ["flashinfer"] and "12.9" in flags[0].message
    assert not _errors(_assess(nvcc=nvcc, flashinfer=FlashInferInfo(None, None)))


def test_environment_findings():
    flags = _assess(
        env={
            "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
            "SGLANG_ENABLE_JIT_DEEPGEMM": "1",
            "TRITON_PTXAS_PATH": "/does/not/exist",
        }
    )
    found = {(f.severity, f.component) for f in flags}
    assert found == {(WARNING, "env"), (WARNING, "triton")}
    assert len([f for f in flags if f.component == "env"]) == 2


def test_mla_kernel_flags_the_kernels_cannot_take_are_a_warning():
    """SGLANG_SM120_MLA_DEFINES is checked by the kernels' own parser: a value they would ignore is a warning
    that names the item; a value they take, or an empty one, is no finding."""
    (flag,) = _assess(env={"SGLANG_SM120_MLA_DEFINES": "DECODE16_MAX_SPLIT=2k"})
    assert (flag.severity, flag.component) == (WARNING, "env")
    assert "'DECODE16_MAX_SPLIT=2k': DECODE16_MAX_SPLIT takes a whole number" in flag.message
    assert "builds the MLA kernels as shipped" in flag.message and "tune-mla" in flag.fix
    assert not _assess(env={"SGLANG_SM120_MLA_DEFINES": "DECODE16_MAX_SPLIT=2048"})
    assert not _assess(env={"SGLANG_SM120_MLA_DEFINES": " "})
    assert mla_kernels.DEFINES_ENV == "SGLANG_SM120_MLA_DEFINES"


def test_missing_sgl_kernel_and_version_pins_are_warnings():
    sglang = dataclasses.replace(GOOD["sglang"], pins={"torch": "==2.14.1", "sglang-kernel": "==0.4.10"})
    flags = _assess(sglang=sglang, sgl_kernel=SglKernelInfo(None, None))
    assert [(f.severity, f.component) for f in flags] == [(WARNING, "sgl_kernel"), (WARNING, "versions")]
    assert "pins torch==2.14.1; 2.9.1+cu130 is installed" in flags[1].message


def test_driver_older_than_torch_cuda_is_an_error():
    flags = _errors(_assess(driver=DriverInfo("550.54", (12, 4))))
    assert [f.component for f in flags] == ["driver"]


def test_other_kernel_libraries_without_the_gpu_are_only_noted():
    libs = (
        report.LibraryInfo("sm100/common_ops.abi3.so", ("sm_100a", "sm_120a"), (), True),
        report.LibraryInfo("flash_ops.abi3.so", ("sm_80", "sm_90a"), (), False),
    )
    flags = _assess(sgl_kernel=dataclasses.replace(GOOD["sgl_kernel"], libraries=libs))
    assert [(f.severity, f.component) for f in flags] == [(INFO, "sgl_kernel")]
    assert "flash_ops.abi3.so holds sm_80 sm_90a" in flags[0].message


def test_report_on_this_machine_is_complete_and_serializable():
    """The real probes on this machine (no GPU in CI): every part is filled in and JSON-ready."""
    import json

    r = report.collect_report()
    data = json.loads(json.dumps(r.to_json()))
    assert set(data) >= {
        "judged_for",
        "gpu",
        "driver",
        "nvcc",
        "ptxas",
        "triton_ptxas",
        "torch",
        "triton",
        "sglang",
        "sgl_kernel",
        "flashinfer",
        "env",
        "flags",
    }
    assert data["torch"]["version"] and data["triton"]["version"]
    assert isinstance(r.flags, tuple) and all(isinstance(e, ArchEntry) for e in parse_arch_list(["sm_90"]))
