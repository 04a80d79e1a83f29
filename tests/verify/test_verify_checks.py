"""The numeric backend checks of ``sm120kit verify``: comparison rules, references, selection, the CLI on a
machine without a GPU, and the checks' calls into a real SGLang release compiled for a faked SM120 GPU.

No GPU exists in CI. Where a test needs one, a faked device (:mod:`sm120kit.hardware.fake_device`) stands in
for it and Triton compiles instead of launching; the GPU-marked test at the end runs the checks for real
and is skipped without a GPU (the H200 run in docs/verify.md is that run).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from build_support import run_cli
from conftest import SUPPORT_DIR

from sm120kit.errors import UsageError
from sm120kit.verify import check, check_sglang, checks
from sm120kit.verify.check import ABS, FAIL, OK, REL_FRO, REL_MAX, SKIPPED, CaseResult, Check, Skip

# -- comparison -------------------------------------------------------------------------------------------------


def test_compare_within_and_over_tolerance():
    ref = torch.linspace(-2, 2, 64)
    ok = check.compare("close", ref + 0.001, ref, tol=0.01)
    assert ok.ok and ok.metric == ABS and math.isclose(ok.max_error, 0.001, rel_tol=1e-3)
    bad = check.compare("far", ref + 0.05, ref, tol=0.01)
    assert not bad.ok and "max|Δ| 0.0500 > 0.0100" in bad.describe()
    rel = check.compare("rel", ref * 1.001, ref, tol=0.01, metric=REL_MAX)
    assert rel.ok and rel.max_error == pytest.approx(0.001, rel=1e-2)
    fro = check.compare("fro", ref * 1.5, ref, tol=0.3, metric=REL_FRO)
    assert not fro.ok and fro.max_error == pytest.approx(0.5, rel=1e-3)


def test_compare_fails_all_zeros_nan_and_wrong_shapes():
    ref = torch.randn(8, 8)
    zeros = check.compare("zeros", torch.zeros(8, 8), ref, tol=10.0)  # within a loose tolerance, still a failure
    assert not zeros.ok and "all zeros" in zeros.note
    nan = ref.clone()
    nan[0, 0] = float("nan")
    bad = check.compare("nan", nan, ref, tol=1.0)
    assert not bad.ok and "1 non-finite" in bad.note
    shape = check.compare("shape", torch.zeros(4), ref, tol=1.0)
    assert not shape.ok and "output shape" in shape.error


def test_reference_attention_matches_torch_sdpa():
    """The float32 reference the attention checks compare with, against torch's own SDPA (CPU)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(37, 8, 64), torch.randn(37, 2, 64), torch.randn(37, 2, 32)
    ours = check.ref_attention(torch, q, k, v, 0.125, causal_offset=0)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(4, 1).transpose(0, 1),
        v.repeat_interleave(4, 1).transpose(0, 1),
        is_causal=True,
        scale=0.125,
    ).transpose(0, 1)
    assert torch.allclose(ours, sdpa, atol=1e-5)
    # a prefix of 5 cached tokens: query i sees keys 0 .. 5 + i
    q2 = torch.randn(3, 8, 64)
    shifted = check.ref_attention(torch, q2, k[:8], v[:8], 0.125, causal_offset=5)
    for i in range(3):
        alone = check.ref_attention(torch, q2[i : i + 1], k[: 6 + i], v[: 6 + i], 0.125)
        assert torch.allclose(shifted[i : i + 1], alone, atol=1e-5)


def test_moe_align_reference():
    ids = torch.tensor([[0, 2], [2, 1], [0, 2]], dtype=torch.int32)
    sorted_ids, expert_ids, padded = check_sglang.moe_align(torch, ids, 4, 4)
    sentinel = ids.numel()
    assert sorted_ids.tolist() == [0, 4, sentinel, sentinel, 3, sentinel, sentinel, sentinel, 1, 2, 5, sentinel]
    assert expert_ids.tolist() == [0, 1, 2] and padded.tolist() == [12]


# -- status rules, selection --------------------------------------------------------------------------------------

DUMMY = Check("dummy", "triton", "a dummy", lambda ctx: [])


def test_status_from_cases():
    good = CaseResult("a", True, 0.001, 0.01, ABS)
    bad = CaseResult("b", False, 0.5, 0.01, ABS)
    raised = CaseResult(
        "c", False, error="RuntimeError: out of resource: shared memory, Required: 163840, Hardware limit: 101376"
    )
    skipped = CaseResult("d", False, skipped="needs the Python package 'dill', which is not installed")
    assert checks.summarize(DUMMY, [good], 1.0, (12, 0)).status == OK
    result = checks.summarize(DUMMY, [good, raised], 1.0, (12, 0))
    assert result.status == FAIL and "out of resource" in result.detail and "patch series" in result.hint
    assert result.worst is raised and result.to_json()["max_error"] is None
    assert checks.summarize(DUMMY, [good, bad], 1.0, (12, 0)).worst is bad
    only_skipped = checks.summarize(DUMMY, [skipped], 1.0, (12, 0))
    assert only_skipped.status == SKIPPED and "dill" in only_skipped.detail
    mixed = checks.summarize(DUMMY, [good, skipped], 1.0, (12, 0))
    assert mixed.status == OK and "skipped" in mixed.detail
    assert checks.summarize(DUMMY, [], 1.0, (12, 0)).status == FAIL


def test_run_case_turns_errors_into_failed_cases():
    def boom():
        raise RuntimeError("no kernel image is available for execution on the device")

    (case,) = check.run_case("x", boom)
    assert not case.ok and case.error.startswith("RuntimeError: no kernel image")

    def missing():
        raise ModuleNotFoundError("No module named 'tvm_ffi'", name="tvm_ffi")

    (case,) = check.run_case("y", missing)
    assert case.skipped and "tvm_ffi" in case.skipped

    def skip():
        raise Skip("not installed")

    with pytest.raises(Skip):
        check.run_case("z", skip)


def test_select_checks_by_name_and_backend():
    everything = checks.all_checks()
    assert len({c.name for c in everything}) == len(everything) >= 16
    assert [c.name for c in checks.select_checks(["triton-extend"])] == ["triton-extend"]
    assert {c.backend for c in checks.select_checks(["sgl-kernel"])} == {"sgl_kernel"}
    assert {c.name for c in checks.select_checks(["flashinfer", "flashinfer-mla"])} == {
        "flashinfer-prefill",
        "flashinfer-decode",
        "flashinfer-mla",
        "flashinfer-fp4-gemm",
    }
    with pytest.raises(UsageError, match="names no check"):
        checks.select_checks(["fa3"])


def test_call_with_known_params_passes_what_the_release_takes():
    def old(q, k, sm_scale=None):
        return ("old", sm_scale)

    def new(q, k, k_scale, v_scale, sm_scale=None):
        return ("new", k_scale, v_scale)

    values = dict(q=1, k=2, k_scale=1.0, v_scale=1.0, sm_scale=0.5)
    assert check.call_with_known_params(old, "old", values) == ("old", 0.5)
    assert check.call_with_known_params(new, "new", values) == ("new", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="wants parameters .*: k"):
        check.call_with_known_params(new, "new", dict(q=1))


def test_import_sglang_module_without_sglang():
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:  # pragma: no cover - SGLang installed in this venv
        pytest.skip("SGLang is importable here")
    with pytest.raises(Skip, match="SGLang is not installed"):
        check.import_sglang_module("sglang.kernels.ops.attention.extend_attention")
    with pytest.raises(Skip, match="FlashInfer .* is not installed"):
        check.import_installed("flashinfer_that_is_not_there", "FlashInfer (flashinfer-python)")


def test_no_gpu_skips_every_check_and_says_no_kernel_ran():
    ctx, reason = checks.gpu_context(torch)
    if ctx is not None:  # pragma: no cover - a machine with a GPU
        pytest.skip("this machine has a GPU")
    results = checks.run_checks(checks.all_checks(), ctx, reason)
    assert {r.status for r in results} == {SKIPPED}
    assert all(r.detail.endswith(": no kernel ran") for r in results)


# -- the CLI without a GPU ----------------------------------------------------------------------------------------


def test_cli_without_gpu_reports_cleanly_as_json():
    proc = run_cli("verify", "--json", "--no-audits")
    data = json.loads(proc.stdout)
    assert "Traceback" not in proc.stderr
    assert data["kernels_ran"] is False and "no GPU" in data["no_kernel_reason"]
    assert data["summary"]["ok"] == 0 and data["summary"]["skipped"] == len(data["checks"])
    assert data["report"]["judged_for"] == "12.0"
    # This machine's torch is the CPU build, which the report must call an error for any GPU.
    cpu_torch = "+cpu" in torch.__version__ or torch.version.cuda is None
    if cpu_torch:
        assert any(f["component"] == "torch" and f["severity"] == "error" for f in data["report"]["flags"])
        assert proc.returncode == 13 and data["exit_code"] == 13
    assert any("No kernel ran" in n for n in data["notes"])


def test_cli_human_output_and_usage_errors():
    proc = run_cli("verify", "--backend", "triton", "--no-audits")
    assert "Environment (judged for 12.0" in proc.stdout and "Backend checks (NOT run" in proc.stdout
    assert "triton-extend" in proc.stdout and "flashinfer-prefill" not in proc.stdout
    bad = run_cli("verify", "--backend", "fa3")
    assert bad.returncode == 2 and "names no check" in bad.stderr and "Traceback" not in bad.stderr
    arch = run_cli("verify", "--arch", "twelve")
    assert arch.returncode == 2 and "not a compute capability" in arch.stderr
    listed = run_cli("verify", "--list", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["checks"]) >= 16


# -- the checks' calls into real SGLang, compiled for a faked SM120 GPU ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "version, extend_mla, extend_hd256",
    [
        ("0.5.23", 71680, 73728),  # SM120 block sizes (sglang PR #14311, from 0.5.9): both fit 101376
        ("0.5.2", 106496, 114688),  # Hopper block sizes taken on SM120: both over 101376
    ],
)
def test_sglang_checks_compile_against_real_release_for_faked_sm120(release_dir, version, extend_mla, extend_hd256):
    """A real SGLang release from PyPI, imported for a faked 12.0 device (a stand-in for the SM120 GPU this
    machine lacks) with ``sgl_kernel``/``torchvision`` stood in for: every case of the Triton checks reaches
    SGLang's launcher (``sglang.kernels.ops`` in 0.5.23, ``srt.layers.attention.triton_ops`` in 0.5.2) with
    arguments it accepts, and Triton really compiles each kernel for sm_120. The shared memory of the
    compiled kernels is what these checks meet on a real SM120 GPU (30-60 s per release)."""
    root = release_dir(version)
    proc = subprocess.run(
        [sys.executable, str(SUPPORT_DIR / "verify_plumbing.py"), str(root), "12.0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert set(data["checks"]) == {"triton-extend", "triton-decode", "triton-prefill", "triton-fused-moe"}
    # A release from PyPI has no sm120_mla module: those checks skip, naming the patch that adds it.
    assert set(data["skipped"]) == {"triton-tree-verify", "triton-mla-decode"}
    assert all("sm120-mla-attention" in reason for reason in data["skipped"].values())
    for name, cases in data["checks"].items():
        for case in cases:
            # Only an op of the stood-in sgl_kernel may refuse (0.5.2 quantizes FP8 MoE inputs with it).
            assert case["ok"] or case["error"].startswith("StandInCalled: sgl_kernel."), (name, case)
        assert any(c["ok"] for c in cases), name
    shared = {
        (k["module"].rsplit(".", 1)[-1], k["constexprs"].get("BLOCK_DMODEL")): k["shared"]
        for k in data["kernels"]
        if k["name"] == "_fwd_kernel"
    }
    assert shared[("extend_attention", 512)] == extend_mla  # MLA 576/512
    assert shared[("extend_attention", 256)] == extend_hd256
    # prefill attention, head dim 256: BLOCK 128 needs 163840 B in both releases (sglang PR #27962 is open)
    assert shared[("prefill_attention", 256)] == 163840
    assert any(k["name"] == "fused_moe_kernel" for k in data["kernels"])


# -- a real GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_checks_on_a_real_gpu():
    """On a machine with an NVIDIA GPU: every installed backend runs and none fails."""
    ctx, reason = checks.gpu_context(torch)
    if ctx is None:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
    results = checks.run_checks(checks.all_checks(), ctx, reason)
    assert not [r for r in results if r.status == FAIL], [r.detail for r in results if r.status == FAIL]
    assert [r for r in results if r.status == OK]
