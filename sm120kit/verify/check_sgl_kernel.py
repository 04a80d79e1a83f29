"""Checks of the sgl_kernel ops SGLang calls on every forward pass: RMSNorm, fused add-RMSNorm, SiLU-and-mul,
rotary embedding, FP8 quantization, and the FP8/FP4 GEMMs where the GPU has them.

Importing sgl_kernel loads the ``common_ops`` library its loader picks for this GPU (``sm90/`` on 9.0,
``sm100/`` elsewhere); a library without code for the GPU fails at the first kernel launch ("no kernel
image is available"), which these checks report as a failure. Ops that an sgl_kernel release no longer
ships (they moved into SGLang or FlashInfer) are skipped with that reason.
"""

from __future__ import annotations

import math

from sm120kit.hardware.arch import has_block_scaled_fp4
from sm120kit.verify.check import (
    GPU_LACKS_FEATURE,
    REL_FRO,
    REL_MAX,
    CaseResult,
    Check,
    CheckContext,
    Skip,
    compare,
    import_installed,
    run_case,
)

NORM_TOL = 1e-2
"""max|Δ|/max|ref| for bf16/fp16 elementwise ops: one rounding of the output (2^-8 relative) plus the
float32 reduction, measured against the largest output."""

FP8_E4M3_MAX = 448.0
FP8_QUANT_TOL = 0.0625 + 1e-3
"""e4m3 keeps 3 mantissa bits: rounding moves a value by at most 2^-4 of itself, so at most 1/16 of the
row's (or group's) largest magnitude."""


def _sgl_kernel():
    return import_installed("sgl_kernel", "sgl_kernel (sglang-kernel)")


def _op(module, *names: str):
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            return name, fn
    version = getattr(module, "__version__", "?")
    raise Skip(f"this sgl_kernel ({version}) has no {' / '.join(names)} (later releases moved it out)")


def _rms_ref(torch, x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


NORM_CASES = (("bf16, 33 tokens x 4096", "bfloat16", 4096), ("fp16, 7 tokens x 5120", "float16", 5120))


def _rmsnorm_cases(ctx: CheckContext, op: str, fused: bool) -> list[CaseResult]:
    """sgl_kernel's RMSNorm ``op`` on each of NORM_CASES; ``fused``: the op first adds x into a residual, in place."""
    sk = _sgl_kernel()
    _, fn = _op(sk, op)
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, dtype_name, hidden in NORM_CASES:

        def case(label=label, dtype_name=dtype_name, hidden=hidden):
            dtype = getattr(torch, dtype_name)
            tokens = int(label.split(",")[1].split()[0])
            x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
            residual = torch.randn(tokens, hidden, device=dev, dtype=dtype) if fused else None
            w = (1.0 + 0.1 * torch.randn(hidden, device=dev)).to(dtype)
            if not fused:
                out = fn(x, w, 1e-6)
                return compare(label, out, _rms_ref(torch, x, w, 1e-6), tol=NORM_TOL, metric=REL_MAX)
            summed = (x.float() + residual.float()).to(dtype)
            ref_out = _rms_ref(torch, summed, w, 1e-6)
            fn(x, residual, w, 1e-6)  # in place: residual += x; x = rmsnorm(residual)
            return [
                compare(f"{label}, normalized", x, ref_out, tol=NORM_TOL, metric=REL_MAX),
                compare(f"{label}, residual sum", residual, summed.float(), tol=NORM_TOL, metric=REL_MAX),
            ]

        results += run_case(label, case)
    return results


def rmsnorm(ctx: CheckContext) -> list[CaseResult]:
    return _rmsnorm_cases(ctx, "rmsnorm", fused=False)


def fused_add_rmsnorm(ctx: CheckContext) -> list[CaseResult]:
    return _rmsnorm_cases(ctx, "fused_add_rmsnorm", fused=True)


def silu_and_mul(ctx: CheckContext) -> list[CaseResult]:
    sk = _sgl_kernel()
    _, fn = _op(sk, "silu_and_mul")
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, dtype_name, inter in (
        ("bf16, 33 tokens x 2x11008", "bfloat16", 11008),
        ("fp16, 5 tokens x 2x1024", "float16", 1024),
    ):

        def case(label=label, dtype_name=dtype_name, inter=inter):
            dtype = getattr(torch, dtype_name)
            tokens = int(label.split(",")[1].split()[0])
            x = torch.randn(tokens, 2 * inter, device=dev, dtype=dtype)
            out = fn(x)
            xf = x.float()
            ref = torch.nn.functional.silu(xf[:, :inter]) * xf[:, inter:]
            return compare(label, out, ref, tol=NORM_TOL, metric=REL_MAX)

        results += run_case(label, case)
    return results


def _rope_ref(torch, x, cos, sin, neox: bool):
    """Rotate ``x`` [T, H, D] by ``cos``/``sin`` [T, D/2]: NeoX halves, or GPT-J interleaved pairs."""
    xf = x.float()
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)


def rotary(ctx: CheckContext) -> list[CaseResult]:
    sk = _sgl_kernel()
    name, fn = _op(sk, "rotary_embedding", "apply_rope_with_cos_sin_cache_inplace")
    torch, dev = ctx.torch, ctx.device
    tokens, hq, hk, dim, max_pos = 29, 8, 2, 128, 4096
    results: list[CaseResult] = []
    for neox in (True, False):
        label = f"bf16 {hq}/{hk} heads, head dim {dim}, {'NeoX' if neox else 'GPT-J'} style"

        def case(neox=neox, label=label):
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=dev, dtype=torch.float32) / dim))
            freqs = torch.outer(torch.arange(max_pos, device=dev, dtype=torch.float32), inv_freq)
            # rotary_embedding (vLLM layout) takes the cache in the query's dtype; the FlashInfer-style
            # apply_rope_with_cos_sin_cache_inplace takes it in float32.
            cache_dtype = torch.bfloat16 if name == "rotary_embedding" else torch.float32
            cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(cache_dtype)
            positions = torch.randint(0, max_pos, (tokens,), device=dev, dtype=torch.int64)
            q = torch.randn(tokens, hq * dim, device=dev, dtype=torch.bfloat16)
            k = torch.randn(tokens, hk * dim, device=dev, dtype=torch.bfloat16)
            cos = cache[positions, : dim // 2].float()
            sin = cache[positions, dim // 2 :].float()
            q_ref = _rope_ref(torch, q.view(tokens, hq, dim), cos, sin, neox)
            k_ref = _rope_ref(torch, k.view(tokens, hk, dim), cos, sin, neox)
            fn(positions, q, k, dim, cache, neox)  # in place
            return [
                compare(f"{label}, query", q.view(tokens, hq, dim), q_ref, tol=NORM_TOL, metric=REL_MAX),
                compare(f"{label}, key", k.view(tokens, hk, dim), k_ref, tol=NORM_TOL, metric=REL_MAX),
            ]

        results += run_case(label, case)
    return results


def _quant_case(label: str, x, q, scales, group: int) -> CaseResult:
    """Dequantize ``q`` with ``scales`` (one per row, or per ``group`` columns) and compare with ``x``."""
    rows, cols = x.shape
    s = scales.float().reshape(rows, -1)
    s_full = s.repeat_interleave(group, dim=1)[:, :cols] if s.shape[1] > 1 else s
    deq = q.float() * s_full
    xf = x.float()
    groups = xf.abs().reshape(rows, -1, group if s.shape[1] > 1 else cols).amax(-1)
    expected_scale = groups / FP8_E4M3_MAX
    scale_err = float(((s - expected_scale).abs() / expected_scale.clamp_min(1e-12)).max())
    denom = groups.repeat_interleave(group if s.shape[1] > 1 else cols, dim=1)[:, :cols].clamp_min(1e-12)
    err = float(((deq - xf).abs() / denom).max())
    ok = err <= FP8_QUANT_TOL and scale_err <= 1e-2
    note = f"scale = amax/448 within {scale_err:.1e}"
    if scale_err > 1e-2:
        note = f"scales differ from amax/448 by up to {scale_err:.1e} (over 1e-2)"
    return CaseResult(label, ok, err, FP8_QUANT_TOL, "max|Δ|/amax of its row or group", note=note)


def fp8_quant(ctx: CheckContext) -> list[CaseResult]:
    if ctx.capability < (8, 9):
        raise Skip(
            f"the GPU ({ctx.capability[0]}.{ctx.capability[1]}) has no FP8 (needs 8.9 or newer)",
            cause=GPU_LACKS_FEATURE,
        )
    sk = _sgl_kernel()
    torch, dev = ctx.torch, ctx.device
    fp8 = torch.float8_e4m3fn
    results: list[CaseResult] = []
    per_token = getattr(sk, "sgl_per_token_quant_fp8", None)
    group_quant = getattr(sk, "sgl_per_token_group_quant_fp8", None) or getattr(
        sk, "sgl_per_token_group_quant_8bit", None
    )
    per_tensor = getattr(sk, "sgl_per_tensor_quant_fp8", None)
    if per_token is None and group_quant is None and per_tensor is None:
        raise Skip(f"this sgl_kernel ({getattr(sk, '__version__', '?')}) has no FP8 quantization op")
    x = torch.randn(33, 4096, device=dev, dtype=torch.bfloat16) * 3

    if per_token is not None:

        def token_case():
            q = torch.empty(x.shape, device=dev, dtype=fp8)
            s = torch.empty(x.shape[0], 1, device=dev, dtype=torch.float32)
            per_token(x, q, s)
            return _quant_case("per-token, bf16 33 x 4096", x, q, s, x.shape[1])

        results += run_case("per-token", token_case)
    if group_quant is not None:

        def group_case():
            group = 128
            q = torch.empty(x.shape, device=dev, dtype=fp8)
            s = torch.empty(x.shape[0], x.shape[1] // group, device=dev, dtype=torch.float32)
            group_quant(x, q, s, group, 1e-10, -FP8_E4M3_MAX, FP8_E4M3_MAX)
            return _quant_case("per-token-group (128), bf16 33 x 4096", x, q, s, group)

        results += run_case("per-token-group", group_case)
    if per_tensor is not None:

        def tensor_case():
            q = torch.empty(x.shape, device=dev, dtype=fp8)
            s = torch.zeros(1, device=dev, dtype=torch.float32)
            per_tensor(x, q, s, False)
            return _quant_case(
                "per-tensor dynamic, bf16 33 x 4096", x.reshape(1, -1), q.reshape(1, -1), s.reshape(1, 1), x.numel()
            )

        results += run_case("per-tensor", tensor_case)
    return results


FP8_GEMM_TOL = 1e-2
"""max|Δ|/max|ref| against the product of the dequantized operands: only the accumulation order and
the bf16 output rounding differ."""


def fp8_gemm(ctx: CheckContext) -> list[CaseResult]:
    if ctx.capability < (8, 9):
        raise Skip(
            f"the GPU ({ctx.capability[0]}.{ctx.capability[1]}) has no FP8 tensor cores (needs 8.9+)",
            cause=GPU_LACKS_FEATURE,
        )
    sk = _sgl_kernel()
    _, fn = _op(sk, "fp8_scaled_mm")
    torch, dev = ctx.torch, ctx.device
    fp8 = torch.float8_e4m3fn
    results: list[CaseResult] = []
    for m, n, k in ((64, 256, 512), (7, 4096, 1024)):
        label = f"per-token x per-channel scales, M={m} N={n} K={k}, bf16 out"

        def case(m=m, n=n, k=k, label=label):
            a = torch.randn(m, k, device=dev) * 2
            w = torch.randn(n, k, device=dev) / math.sqrt(k)
            sa = a.abs().amax(dim=1, keepdim=True) / FP8_E4M3_MAX
            sb = w.abs().amax(dim=1, keepdim=True) / FP8_E4M3_MAX
            a_q = (a / sa).to(fp8)
            w_q = (w / sb).to(fp8)
            out = fn(a_q, w_q.t(), sa.contiguous(), sb.contiguous(), torch.bfloat16, None)
            ref = (a_q.float() * sa) @ (w_q.float() * sb).t()
            return compare(label, out, ref, tol=FP8_GEMM_TOL, metric=REL_MAX)

        results += run_case(label, case)
    return results


FP4_GEMM_TOL = 0.3
"""‖Δ‖/‖ref‖ against the bf16 product of the unquantized operands. NVFP4 (e2m1 values with an e4m3 scale
per 16) keeps about one mantissa bit: a product of two quantized operands lands within ~15% of the exact
one; an all-zero or garbage output (FlashInfer issue #2577) is at 1.0 or above."""


def fp4_gemm(ctx: CheckContext) -> list[CaseResult]:
    if not has_block_scaled_fp4(ctx.capability):
        raise Skip(
            f"the GPU ({ctx.capability[0]}.{ctx.capability[1]}) has no block-scaled FP4 MMA (10.x and 12.x have it)",
            cause=GPU_LACKS_FEATURE,
        )
    sk = _sgl_kernel()
    _, quant = _op(sk, "scaled_fp4_quant")
    _, mm = _op(sk, "cutlass_scaled_fp4_mm")
    torch, dev = ctx.torch, ctx.device
    m, n, k = 128, 256, 512
    label = f"NVFP4 x NVFP4, M={m} N={n} K={k}, bf16 out"

    def case():
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        gs_a = (FP8_E4M3_MAX * 6.0 / a.float().abs().amax()).to(torch.float32)
        gs_w = (FP8_E4M3_MAX * 6.0 / w.float().abs().amax()).to(torch.float32)
        a_fp4, a_sf = quant(a, gs_a)
        w_fp4, w_sf = quant(w, gs_w)
        alpha = (1.0 / (gs_a * gs_w)).to(torch.float32)
        out = mm(a_fp4, w_fp4, a_sf, w_sf, alpha, torch.bfloat16)
        ref = a.float() @ w.float().t()
        return compare(label, out, ref, tol=FP4_GEMM_TOL, metric=REL_FRO)

    return run_case(label, case)


CHECKS = (
    Check("sgl-kernel-rmsnorm", "sgl_kernel", "sgl_kernel RMSNorm", rmsnorm),
    Check("sgl-kernel-fused-add-rmsnorm", "sgl_kernel", "sgl_kernel fused add + RMSNorm", fused_add_rmsnorm),
    Check("sgl-kernel-silu-and-mul", "sgl_kernel", "sgl_kernel SiLU-and-mul", silu_and_mul),
    Check("sgl-kernel-rotary", "sgl_kernel", "sgl_kernel rotary embedding", rotary),
    Check("sgl-kernel-fp8-quant", "sgl_kernel", "sgl_kernel FP8 quantization", fp8_quant),
    Check("sgl-kernel-fp8-gemm", "sgl_kernel", "sgl_kernel FP8 scaled GEMM", fp8_gemm),
    Check("sgl-kernel-fp4-gemm", "sgl_kernel", "sgl_kernel NVFP4 GEMM", fp4_gemm),
)
