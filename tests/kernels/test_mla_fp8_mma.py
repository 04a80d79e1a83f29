"""The query quantization of the MLA kernels' fp8-mma path, as ``sm120_attention.reference`` states it (the CUDA
kernel's ``quantize_queries`` does the same on the GPU; scripts/bench_mla.py compares the two there): each row's
half of the 576 query dims to e4m3 at amax / 448, the scale folded into the scores after the dot. CPU torch
only; the kernel itself needs an SM120 card or the H200 of the benchmarks, which this machine lacks."""

from __future__ import annotations

import math

import pytest
import torch

from sm120_attention import reference as ref


def queries(seed=0, tokens=3, heads=4, dims=576, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dims, generator=gen) * spread
    q[0, 0, 5] = 40.0  # an outlier dim: its half row's scale is set by it
    return q.to(torch.bfloat16)


def test_each_half_row_is_quantized_at_its_own_scale():
    q = queries()
    q8, scale = ref.quantize_queries_e4m3(q)
    assert q8.shape == (3, 4, 2, 288) and scale.shape == (3, 4, 2)
    halves = q.float().reshape(3, 4, 2, 288)
    assert torch.equal(scale, halves.abs().amax(-1) / 448)
    # The largest magnitude of each half lands on +-448 (e4m3's largest finite value), none beyond it.
    assert torch.equal(q8.abs().amax(-1), torch.full((3, 4, 2), 448.0))
    # Every value is an e4m3 value.
    assert torch.equal(q8, q8.to(torch.float8_e4m3fn).float())
    # Rounding to nearest: within half a step of e4m3 (3 mantissa bits: 2^-4 relative; below 2^-6, the
    # subnormal step 2^-9, half of it absolute), at the half row's scale.
    x = halves / scale[..., None]
    bound = torch.maximum(x.abs() * 2**-4, torch.full_like(x, 2**-10))
    assert bool(((q8 - x).abs() <= bound * (1 + 1e-6)).all())
    # The outlier's half row has a coarser scale than its other half.
    assert scale[0, 0, 0] > 5 * scale[0, 0, 1]


def test_a_row_of_zeros_has_scale_zero_and_zeros():
    q = torch.zeros(1, 2, 576, dtype=torch.bfloat16)
    q[0, 1, 300] = 1.0
    q8, scale = ref.quantize_queries_e4m3(q)
    assert scale[0, 0].tolist() == [0.0, 0.0] and not bool(q8[0, 0].any())
    assert scale[0, 1, 0] == 0 and scale[0, 1, 1] == pytest.approx(1 / 448)
    assert q8[0, 1, 1, 12] == 448.0


def test_the_scale_folded_into_the_scores_equals_the_scale_folded_into_the_queries():
    """The kernel multiplies each half's e4m3 dot by the half's scale (with the softmax and KV scales after the
    exchange of the halves); the same scores as dequantized queries against the keys, to float32 rounding."""
    q = queries(seed=1)
    gen = torch.Generator().manual_seed(2)
    keys = (torch.randn(50, 1, 576, generator=gen) * 0.5).to(torch.float8_e4m3fn).float().expand(-1, 4, -1)
    folded = ref.scores_e4m3(q, keys)
    q8, scale = ref.quantize_queries_e4m3(q)
    dequantized = (q8 * scale[..., None]).reshape(q.shape)
    assert torch.allclose(folded, torch.einsum("thd,khd->htk", dequantized, keys), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spread", [0.5, 4.0])
def test_decode_with_e4m3_queries_stays_within_its_score_bound_of_the_float32_reference(spread):
    """MLA decode with fp8 KV: the output with the queries quantized differs from the float32 reference by no
    more than a shift delta of every score allows (each probability moves by a factor within e^(+-2 delta),
    so the output by at most (e^(2 delta) - 1) max |v|), where delta is the largest score error the
    quantization makes on these inputs; and it does differ (the quantization is not a no-op)."""
    case = ref.make_decode_case([300, 17, 1], heads=4, dtype=torch.bfloat16, seed=3)
    case["q"] = (case["q"].float() * spread).to(torch.bfloat16)
    k_scale = 0.5
    case["k_pool"] = (case["k_pool"].float() / k_scale).to(torch.float8_e4m3fn)
    case["v_pool"] = case["k_pool"][:, :, :512]
    exact = ref.reference_decode(case, k_scale=k_scale, v_scale=k_scale)
    quantized = ref.reference_decode(case, k_scale=k_scale, v_scale=k_scale, q_e4m3=True)
    sm_scale = 1 / math.sqrt(576)
    delta, vmax = 0.0, 0.0
    for b in range(3):
        lo, hi = int(case["kv_indptr"][b]), int(case["kv_indptr"][b + 1])
        keys = case["k_pool"][case["kv_indices"][lo:hi].long()].float().expand(-1, 4, -1) * k_scale
        q = case["q"][b : b + 1]
        true = torch.einsum("thd,khd->htk", q.float(), keys)
        delta = max(delta, ((ref.scores_e4m3(q, keys) - true).abs().max() * sm_scale).item())
        vmax = max(vmax, keys[:, :, :512].abs().max().item())
    diff = (quantized - exact).abs().max().item()
    assert 0 < diff <= (math.exp(2 * delta) - 1) * vmax
    assert delta < 0.1 * spread  # e4m3's 2^-4 relative rounding, mostly averaged away over 576 dims


def test_verify_scores_the_draft_tail_with_the_queries_as_given():
    """The kernel's draft-tail programs score the bf16 tail with the bf16 queries: only the prefix sees the
    quantized ones, so a request with no prefix token gets the exact output."""
    case = ref.make_verify_case([0, 40], [3, 2], heads=4, dtype=torch.bfloat16, seed=4)
    exact = ref.reference_verify(case)
    quantized = ref.reference_verify(case, q_e4m3=True)
    assert torch.equal(quantized[:3], exact[:3])  # request 0: the draft tail alone
    assert not torch.equal(quantized[3:], exact[3:])
