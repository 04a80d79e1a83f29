"""The faked CUDA device and Triton target (sm120kit.hardware.fake_device).

This machine has no GPU: FakeDevice stands in for the SM120 / Hopper / HIP hardware it lacks, and these
tests check that the stand-in answers like the real device would and is fully undone afterwards. The
Triton compiles here are real (Triton's bundled ptxas, target sm_120 / sm_90); only the device is faked.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK  # noqa: E402
from sm120kit.hardware.fake_device import (  # noqa: E402
    PRESETS,
    FakeDevice,
    faked_cuda,
    faked_device,
    faked_triton_target,
    preset,
)


@triton.jit
def _tile_matmul(
    a, b, c, K, stride_am, stride_bk, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(a + rm[:, None] * stride_am + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * stride_bk + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * stride_cm + rn[None, :], acc.to(c.dtype.element_ty))


def _launch(num_stages: int) -> None:
    a = torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")
    _tile_matmul[(8, 8)](
        a, a, a, 1024, 1024, 1024, 1024, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=num_stages
    )


def test_presets_cover_the_families():
    assert preset("12.0").capability == (12, 0)
    assert preset("12.0").shared_memory_per_block == SM120_SHARED_MEMORY_PER_BLOCK == 101376
    assert preset("12.1").name == "NVIDIA GB10" and preset("12.1").sm == 121
    assert preset("9.0").shared_memory_per_block == 232448
    assert preset("10.0").name == "NVIDIA B200"
    assert preset("8.9").capability == (8, 9)
    hip = preset("hip-12")
    assert hip.capability[0] == 12 and hip.cuda_version is None and hip.hip_version
    with pytest.raises(KeyError, match="known: 12.0"):
        preset("7.5")
    with pytest.raises(TypeError):  # the figures after the versions are keyword-only
        FakeDevice((12, 0), "x", "13.0", None, 101376, 1, 1)  # type: ignore[misc]


def test_faked_cuda_answers_like_an_rtx_pro_6000_and_restores_torch():
    """Stands in for an RTX PRO 6000 (12.0) this machine lacks."""
    before = (torch.version.cuda, torch.version.hip, torch.cuda.is_available(), torch.cuda.device_count())
    getter = torch.cuda.get_device_capability
    with faked_cuda(PRESETS["12.0"]) as dev:
        assert dev is PRESETS["12.0"]
        assert torch.version.cuda == "13.0" and torch.version.hip is None
        assert torch.cuda.is_available() and torch.cuda.is_initialized()
        assert torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
        assert torch.cuda.get_device_capability() == (12, 0)
        assert torch.cuda.get_device_capability(torch.device("cuda:0")) == (12, 0)
        assert torch.cuda.get_device_properties("cuda").major == 12  # SGLang 0.5.3 passes a string
        assert torch.cuda.get_device_name("cuda:0").startswith("NVIDIA RTX PRO 6000")
        with pytest.raises(ValueError, match="cuda device"):
            torch.cuda.get_device_capability("cpu")
        assert torch.cuda.get_device_name(0) == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor) == (12, 0)
        assert props.shared_memory_per_block_optin == 101376
        assert props.multi_processor_count == 188
        free, total = torch.cuda.mem_get_info()
        assert free == total == props.total_memory
        torch.cuda.set_device(0)
        torch.cuda.synchronize()
        with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
            torch.cuda.get_device_capability(1)
    assert (torch.version.cuda, torch.version.hip, torch.cuda.is_available(), torch.cuda.device_count()) == before
    assert torch.cuda.get_device_capability is getter


def test_faked_cuda_restores_after_an_exception():
    before = torch.version.cuda
    with pytest.raises(ZeroDivisionError):
        with faked_cuda(PRESETS["9.0"]):
            assert torch.cuda.get_device_capability() == (9, 0)
            1 / 0
    assert torch.version.cuda == before and not torch.cuda.is_available()


def test_hip_preset_reports_major_12_without_cuda():
    """Stands in for an AMD RDNA4 (gfx1201) card: major 12 through HIP, torch.version.cuda None."""
    with faked_cuda(PRESETS["hip-12"]):
        assert torch.cuda.get_device_capability()[0] == 12
        assert torch.version.cuda is None and torch.version.hip is not None
        assert torch.cuda.get_device_properties(0).gcnArchName == "gfx1201"


def test_triton_compiles_for_sm120_and_records_the_kernel():
    """Stands in for an SM120 GPU this machine lacks; the sm_120 compile itself is real."""
    from triton.runtime.driver import driver

    active_before = driver._active
    with faked_device(PRESETS["12.0"]) as recorder:
        assert driver.active.get_current_target().arch == 120
        assert driver.active.get_active_torch_device() == torch.device("meta")
        _launch(num_stages=4)
        (record,) = recorder.take()
    assert driver._active is active_before
    assert record.name == "_tile_matmul" and record.module == __name__
    assert record.constexprs == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    assert (record.num_warps, record.num_stages) == (4, 4)
    assert record.target == "cuda:120"
    # 4 stages minus one in flight x (128x64 + 64x128) bf16 tiles = 3 x 32 KB
    assert record.shared == 98304 <= SM120_SHARED_MEMORY_PER_BLOCK
    assert record.cubin[:4] == b"\x7fELF"
    assert recorder.take() == []


def test_shared_memory_differs_between_sm120_and_sm90():
    """sm_90 gets Hopper's deeper pipelining (one more buffer) where sm_120 does not; both compiles are
    real, the two devices are faked. Kernels compiled for one faked target are not reused for the other."""
    shared = {}
    for key in ("12.0", "9.0", "12.0"):
        with faked_triton_target(PRESETS[key]) as recorder:
            _launch(num_stages=4)
            (record,) = recorder.take()
        assert record.target == f"cuda:{PRESETS[key].sm}"
        shared.setdefault(key, set()).add(record.shared)
    assert shared["12.0"] == {98304}
    assert shared["9.0"] == {131072}
    assert 131072 > SM120_SHARED_MEMORY_PER_BLOCK  # what would fail on SM120 passes on Hopper


def test_faked_target_compiles_instead_of_launching():
    """No GPU here: a launch inside the faked target returns the compiled kernel and runs nothing; the
    faked driver refuses to load a binary."""
    from triton.runtime.driver import driver

    with faked_triton_target(PRESETS["12.1"]) as recorder:
        _launch(num_stages=2)
        assert recorder.kernels[0].target == "cuda:121"
        with pytest.raises(RuntimeError, match="cannot load or launch"):
            driver.active.utils.load_binary("k", b"", 0, 0)
        assert driver.active.utils.get_device_properties(0)["max_shared_mem"] == 101376


def test_stand_in_packages_import_but_refuse_to_run():
    """sgl_kernel has no CPU build and PyPI's torchvision needs CUDA libraries: both are stood in for,
    can be imported and subclassed, refuse to run, and are removed again afterwards."""
    import importlib
    import sys

    from sm120kit.hardware.fake_device import StandInCalled, stand_in_packages

    with stand_in_packages(("sgl_kernel",)) as stood_in:
        assert stood_in == ("sgl_kernel",)
        sgl_kernel = importlib.import_module("sgl_kernel")
        from sgl_kernel import silu_and_mul  # noqa: F401 - import of a name works

        elementwise = importlib.import_module("sgl_kernel.elementwise")
        assert elementwise.__name__ == "sgl_kernel.elementwise"

        class Sub(sgl_kernel.SomeBase):  # subclassing a stood-in class works
            pass

        assert isinstance(Sub(), Sub)
        with pytest.raises(StandInCalled, match="sgl_kernel.silu_and_mul"):
            sgl_kernel.silu_and_mul(1, 2)
        # SGLang registers meta implementations for sgl_kernel ops; with the op absent that is skipped
        torch.library.register_fake("sgl_kernel::not_a_real_op")(lambda x: x)
    assert "sgl_kernel" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel")


def test_stand_in_leaves_importable_packages_alone():
    from sm120kit.hardware.fake_device import stand_in_packages

    with stand_in_packages(("json",)) as stood_in:
        import json

        assert stood_in == () and json.dumps([1]) == "[1]"
