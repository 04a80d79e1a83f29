"""Checks of FlashInfer, SGLang's default attention backend on SM120 for MHA models: batch prefill and
decode over a paged KV cache (page size 1, as SGLang uses it), the MLA paged attention, and the NVFP4 GEMM
on GPUs that have FP4 (FlashInfer issue #2577: on SM120 its NVFP4 GEMM returned all zeros without an
error, so only a numeric comparison catches it).

FlashInfer compiles its kernels on first use (JIT, with nvcc) for the archs of its compilation context,
unless prebuilt kernels are installed; the first run of each check includes that compile time.
"""

from __future__ import annotations

import math

from sm120kit.hardware.arch import has_block_scaled_fp4
from sm120kit.verify.check import (
    ABSENT,
    ATTN_TOL_BF16,
    GPU_LACKS_FEATURE,
    REL_FRO,
    CaseResult,
    Check,
    CheckContext,
    Skip,
    call_with_known_params,
    compare,
    import_installed,
    ref_attention,
    run_case,
)

WORKSPACE_BYTES = 128 * 1024 * 1024


def _flashinfer():
    return import_installed("flashinfer", "FlashInfer (flashinfer-python)")


def _paged(torch, dev, seq_lens, pool_extra=16):
    """A page-size-1 KV pool: random distinct pages per token; ``(indptr, indices, last_page_len, pool)``."""
    total = sum(seq_lens)
    pool = total + pool_extra
    indices = torch.randperm(pool, device=dev)[:total].to(torch.int32)
    indptr = torch.tensor([0, *seq_lens], device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    last = torch.ones(len(seq_lens), device=dev, dtype=torch.int32)
    return indptr, indices, last, pool


def _paged_kv(torch, dev, seq_lens, hkv, dim):
    """Random bf16 keys and values [pool, 1, hkv, dim] in the pool of :func:`_paged`;
    ``(indptr, indices, last_page_len, k_cache, v_cache)``."""
    indptr, indices, last, pool = _paged(torch, dev, seq_lens)
    k_cache = torch.randn(pool, 1, hkv, dim, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn(pool, 1, hkv, dim, device=dev, dtype=torch.bfloat16)
    return indptr, indices, last, k_cache, v_cache


def _paged_reference(torch, q, kv_indptr, kv_indices, k_cache, v_cache, scale, q_lens, prefixes=None):
    """float32 attention of each request's ``q_lens[r]`` queries (one after another in ``q``) over its pages:
    causal after its ``prefixes[r]`` cached tokens when ``prefixes`` is given, over all of them otherwise."""
    refs, q_begin = [], 0
    for r, n in enumerate(q_lens):
        pages = kv_indices[kv_indptr[r] : kv_indptr[r + 1]].long()
        causal_offset = None if prefixes is None else prefixes[r]
        keys, values = k_cache[pages, 0], v_cache[pages, 0]
        refs.append(ref_attention(torch, q[q_begin : q_begin + n], keys, values, scale, causal_offset=causal_offset))
        q_begin += n
    return torch.cat(refs)


def _workspace(torch, dev):
    return torch.empty(WORKSPACE_BYTES, device=dev, dtype=torch.uint8)


def prefill(ctx: CheckContext) -> list[CaseResult]:
    fi = _flashinfer()
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, hq, hkv, dim, prefixes, extends in (
        ("bf16 GQA 8/2 heads, head dim 128, paged with prefix", 8, 2, 128, (0, 40), (25, 60)),
        ("bf16 MHA 4/4 heads, head dim 64, paged with prefix", 4, 4, 64, (17, 0), (33, 8)),
    ):

        def case(label=label, hq=hq, hkv=hkv, dim=dim, prefixes=prefixes, extends=extends):
            bf16 = torch.bfloat16
            kv_lens = [p + e for p, e in zip(prefixes, extends)]
            kv_indptr, kv_indices, last, k_cache, v_cache = _paged_kv(torch, dev, kv_lens, hkv, dim)
            q = torch.randn(sum(extends), hq, dim, device=dev, dtype=bf16)
            qo_indptr = torch.tensor([0, *extends], device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            scale = 1.0 / math.sqrt(dim)
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(_workspace(torch, dev), "NHD")
            call_with_known_params(
                wrapper.plan,
                "BatchPrefillWithPagedKVCacheWrapper.plan",
                dict(
                    qo_indptr=qo_indptr,
                    paged_kv_indptr=kv_indptr,
                    paged_kv_indices=kv_indices,
                    paged_kv_last_page_len=last,
                    num_qo_heads=hq,
                    num_kv_heads=hkv,
                    head_dim_qk=dim,
                    head_dim=dim,
                    page_size=1,
                    causal=True,
                    sm_scale=scale,
                    q_data_type=bf16,
                    kv_data_type=bf16,
                ),
            )
            out = wrapper.run(q, (k_cache, v_cache))
            ref = _paged_reference(torch, q, kv_indptr, kv_indices, k_cache, v_cache, scale, extends, prefixes)
            return compare(label, out, ref, tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


def decode(ctx: CheckContext) -> list[CaseResult]:
    fi = _flashinfer()
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, hq, hkv, dim, tensor_cores in (
        ("bf16 MHA 8/8 heads, head dim 128", 8, 8, 128, False),
        ("bf16 GQA 32/8 heads, head dim 128, tensor-core decode", 32, 8, 128, True),
    ):

        def case(label=label, hq=hq, hkv=hkv, dim=dim, tensor_cores=tensor_cores):
            bf16 = torch.bfloat16
            seq_lens = [1, 77, 300, 1030]
            kv_indptr, kv_indices, last, k_cache, v_cache = _paged_kv(torch, dev, seq_lens, hkv, dim)
            q = torch.randn(len(seq_lens), hq, dim, device=dev, dtype=bf16)
            scale = 1.0 / math.sqrt(dim)
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(torch, dev), "NHD", use_tensor_cores=tensor_cores
            )
            call_with_known_params(
                wrapper.plan,
                "BatchDecodeWithPagedKVCacheWrapper.plan",
                dict(
                    indptr=kv_indptr,
                    indices=kv_indices,
                    last_page_len=last,
                    num_qo_heads=hq,
                    num_kv_heads=hkv,
                    head_dim=dim,
                    page_size=1,
                    sm_scale=scale,
                    q_data_type=bf16,
                    kv_data_type=bf16,
                ),
            )
            out = wrapper.run(q, (k_cache, v_cache))
            ones = [1] * len(seq_lens)
            ref = _paged_reference(torch, q, kv_indptr, kv_indices, k_cache, v_cache, scale, ones)
            return compare(label, out, ref, tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


def mla(ctx: CheckContext) -> list[CaseResult]:
    fi = _flashinfer()
    wrapper_cls = getattr(fi, "BatchMLAPagedAttentionWrapper", None)
    if wrapper_cls is None:
        raise Skip(
            f"this FlashInfer ({getattr(fi, '__version__', '?')}) has no BatchMLAPagedAttentionWrapper", cause=ABSENT
        )
    torch, dev = ctx.torch, ctx.device
    heads, ckv_dim, kpe_dim = 16, 512, 64
    label = f"bf16 decode, {heads} heads, latent {ckv_dim} + rope {kpe_dim}"

    def case():
        bf16 = torch.bfloat16
        seq_lens = [1, 65, 300]
        kv_indptr, kv_indices, _last, pool = _paged(torch, dev, seq_lens)
        ckv = torch.randn(pool, 1, ckv_dim, device=dev, dtype=bf16)
        kpe = torch.randn(pool, 1, kpe_dim, device=dev, dtype=bf16)
        bs = len(seq_lens)
        q_nope = torch.randn(bs, heads, ckv_dim, device=dev, dtype=bf16)
        q_pe = torch.randn(bs, heads, kpe_dim, device=dev, dtype=bf16)
        qo_indptr = torch.arange(bs + 1, device=dev, dtype=torch.int32)
        kv_lens = torch.tensor(seq_lens, device=dev, dtype=torch.int32)
        scale = 1.0 / math.sqrt(ckv_dim + kpe_dim)
        wrapper = wrapper_cls(_workspace(torch, dev))
        call_with_known_params(
            wrapper.plan,
            "BatchMLAPagedAttentionWrapper.plan",
            dict(
                qo_indptr=qo_indptr,
                kv_indptr=kv_indptr,
                kv_indices=kv_indices,
                kv_len_arr=kv_lens,
                num_heads=heads,
                head_dim_ckv=ckv_dim,
                head_dim_kpe=kpe_dim,
                page_size=1,
                causal=False,
                sm_scale=scale,
                q_data_type=bf16,
                kv_data_type=bf16,
            ),
        )
        out = wrapper.run(q_nope, q_pe, ckv, kpe)
        refs = []
        for r in range(bs):
            pages = kv_indices[kv_indptr[r] : kv_indptr[r + 1]].long()
            keys = torch.cat([ckv[pages], kpe[pages]], dim=-1)  # [L, 1, 576]
            query = torch.cat([q_nope[r : r + 1], q_pe[r : r + 1]], dim=-1)  # [1, H, 576]
            refs.append(ref_attention(torch, query, keys, ckv[pages], scale))
        return compare(label, out, torch.cat(refs), tol=ATTN_TOL_BF16)

    return run_case(label, case)


FP4_GEMM_TOL = 0.3
"""‖Δ‖/‖ref‖ against the product of the unquantized bf16 operands (see check_sgl_kernel.FP4_GEMM_TOL)."""


def fp4_gemm(ctx: CheckContext) -> list[CaseResult]:
    if not has_block_scaled_fp4(ctx.capability):
        raise Skip(
            f"the GPU ({ctx.capability[0]}.{ctx.capability[1]}) has no block-scaled FP4 MMA (10.x and 12.x have it)",
            cause=GPU_LACKS_FEATURE,
        )
    fi = _flashinfer()
    quant = getattr(fi, "fp4_quantize", None)
    mm = getattr(fi, "mm_fp4", None)
    if quant is None or mm is None:
        raise Skip(f"this FlashInfer ({getattr(fi, '__version__', '?')}) has no fp4_quantize/mm_fp4", cause=ABSENT)
    torch, dev = ctx.torch, ctx.device
    m, n, k = 128, 256, 512
    results: list[CaseResult] = []
    for backend in ("cutlass", "auto"):
        label = f"NVFP4 mm_fp4 backend={backend}, M={m} N={n} K={k}, bf16 out"

        def case(backend=backend, label=label):
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            gs_a = (448.0 * 6.0 / a.float().abs().amax()).reshape(1).to(torch.float32)
            gs_w = (448.0 * 6.0 / w.float().abs().amax()).reshape(1).to(torch.float32)
            a_fp4, a_sf = quant(a, gs_a)
            w_fp4, w_sf = quant(w, gs_w)
            alpha = (1.0 / (gs_a * gs_w)).to(torch.float32)
            out = mm(a_fp4, w_fp4.T, a_sf, w_sf.T, alpha, torch.bfloat16, backend=backend)
            ref = a.float() @ w.float().t()
            return compare(label, out, ref, tol=FP4_GEMM_TOL, metric=REL_FRO)

        results += run_case(label, case)
    return results


CHECKS = (
    Check("flashinfer-prefill", "flashinfer", "FlashInfer batch prefill (paged KV)", prefill),
    Check("flashinfer-decode", "flashinfer", "FlashInfer batch decode (paged KV)", decode),
    Check("flashinfer-mla", "flashinfer", "FlashInfer MLA paged attention", mla),
    Check("flashinfer-fp4-gemm", "flashinfer", "FlashInfer NVFP4 GEMM (mm_fp4)", fp4_gemm),
)
