"""Checks of SGLang's own kernels: the Triton extend, decode and prefill attention, the fused-MoE Triton
kernel, the torch_native attention backend, and the split-KV tree-verify and MLA-decode kernels the
series' sm120-mla-attention patch adds, each against a float32 torch reference.

The kernels are called through SGLang's launchers (the functions SGLang's attention backends and MoE
runner call), so the block sizes, warps and stages are the ones SGLang picks on this GPU: a kernel whose
tiles do not fit the GPU's shared memory fails here exactly as it would while serving. Shapes are small
but cover the cases that differ on SM120: head dims 64-256, grouped-query heads, and the MLA head layout
(576 = 512 latent + 64 rope dims, one KV head).

Module paths moved between releases (``sglang.srt.layers.attention.triton_ops`` up to 0.5.15,
``sglang.kernels.ops.attention`` from 0.5.16); the checks find either.
"""

from __future__ import annotations

import math

from sm120kit.verify.check import (
    ABS,
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
    import_sglang_module,
    ref_attention,
    run_case,
)

ATTENTION_PACKAGES = ("sglang.kernels.ops.attention", "sglang.srt.layers.attention.triton_ops")


def _attention_module(leaf: str):
    return import_sglang_module(*(f"{pkg}.{leaf}" for pkg in ATTENTION_PACKAGES))


# -- prefill (context_attention_fwd: vision encoders' Triton attention) ---------------------------------------

PREFILL_CASES = (  # (label, q heads, kv heads, head dim)
    ("bf16 8/2 heads, head dim 64", 8, 2, 64),
    ("bf16 8/2 heads, head dim 128", 8, 2, 128),
    ("bf16 8/8 heads, head dim 256", 8, 8, 256),
)


def prefill(ctx: CheckContext) -> list[CaseResult]:
    mod = _attention_module("prefill_attention")
    fn = mod.context_attention_fwd
    torch, dev = ctx.torch, ctx.device
    seq_lens = [37, 100]
    results: list[CaseResult] = []
    for label, hq, hkv, dim in PREFILL_CASES:

        def case(hq=hq, hkv=hkv, dim=dim, label=label):
            total = sum(seq_lens)
            q = torch.randn(total, hq, dim, device=dev, dtype=torch.bfloat16)
            k = torch.randn(total, hkv, dim, device=dev, dtype=torch.bfloat16)
            v = torch.randn(total, hkv, dim, device=dev, dtype=torch.bfloat16)
            o = torch.empty_like(q)
            starts = torch.tensor([0] + seq_lens[:-1], device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            lens = torch.tensor(seq_lens, device=dev, dtype=torch.int32)
            call_with_known_params(
                fn,
                "context_attention_fwd",
                dict(
                    q=q, k=k, v=v, o=o, b_start_loc=starts, b_seq_len=lens, max_input_len=max(seq_lens), is_causal=True
                ),
            )
            scale = 1.0 / math.sqrt(dim)
            refs, begin = [], 0
            for n in seq_lens:
                refs.append(
                    ref_attention(
                        torch, q[begin : begin + n], k[begin : begin + n], v[begin : begin + n], scale, causal_offset=0
                    )
                )
                begin += n
            return compare(label, o, torch.cat(refs), tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


# -- extend (prefill with a cached prefix; SGLang's Triton attention backend) ---------------------------------

EXTEND_CASES = (  # (label, q heads, kv heads, qk dim, v dim, prefix lens, extend lens)
    ("bf16 GQA 8/2 heads, head dim 128", 8, 2, 128, 128, (0, 33, 64), (17, 50, 128)),
    ("bf16 MHA 4/4 heads, head dim 256", 4, 4, 256, 256, (20, 0), (45, 31)),
    ("bf16 MLA 16/1 heads, 576/512 dims", 16, 1, 576, 512, (20, 70), (30, 64)),
)


def _prefix_slots(torch, dev, prefix_lens, pool):
    """Random distinct KV-pool slots for every prefix token, as SGLang's allocator hands them out."""
    total = sum(prefix_lens)
    slots = torch.randperm(pool, device=dev)[:total].to(torch.int64)
    indptr = torch.tensor([0, *prefix_lens], device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return slots, indptr


def _extend_args(torch, dev, hq, hkv, dqk, dv, prefixes, extends, latent_v=False) -> dict:
    """Random bf16 keyword arguments of an extend launcher (``extend_attention_fwd``, ``sm120_tree_verify_fwd``):
    a KV pool with each request's prefix in random slots and each request's new tokens, causal with no custom
    mask. With ``latent_v`` the values are the first ``dv`` dims of the keys (views, the MLA layout)."""
    bf16 = torch.bfloat16
    pool = sum(prefixes) + 64
    k_buffer = torch.randn(pool, hkv, dqk, device=dev, dtype=bf16)
    v_buffer = k_buffer[..., :dv] if latent_v else torch.randn(pool, hkv, dv, device=dev, dtype=bf16)
    kv_indices, kv_indptr = _prefix_slots(torch, dev, prefixes, pool)
    total = sum(extends)
    q = torch.randn(total, hq, dqk, device=dev, dtype=bf16)
    k = torch.randn(total, hkv, dqk, device=dev, dtype=bf16)
    v = k[..., :dv] if latent_v else torch.randn(total, hkv, dv, device=dev, dtype=bf16)
    return dict(
        q_extend=q,
        k_extend=k,
        v_extend=v,
        o_extend=torch.empty(total, hq, dv, device=dev, dtype=bf16),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        qo_indptr=torch.tensor([0, *extends], device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        custom_mask=None,
        is_causal=True,
        mask_indptr=None,
        max_len_extend=max(extends),
        k_scale=1.0,
        v_scale=1.0,
        sm_scale=1.0 / math.sqrt(dqk),
    )


def _extend_reference(torch, args: dict, prefixes, extends, masks=None):
    """float32 attention of each request's new tokens over its prefix and its new tokens, for the arguments of
    :func:`_extend_args`: causal, or as ``masks[r]`` (a [new, prefix + new] boolean per request) allows."""
    q, k, v, kv_indices = args["q_extend"], args["k_extend"], args["v_extend"], args["kv_indices"]
    refs, q_begin, p_begin = [], 0, 0
    for r, (p, e) in enumerate(zip(prefixes, extends)):
        slots = kv_indices[p_begin : p_begin + p]
        keys = torch.cat([args["k_buffer"][slots], k[q_begin : q_begin + e]])
        values = torch.cat([args["v_buffer"][slots], v[q_begin : q_begin + e]])
        shown = dict(causal_offset=p) if masks is None else dict(mask=masks[r].to(q.device))
        refs.append(ref_attention(torch, q[q_begin : q_begin + e], keys, values, args["sm_scale"], **shown))
        q_begin += e
        p_begin += p
    return torch.cat(refs)


def extend(ctx: CheckContext) -> list[CaseResult]:
    mod = _attention_module("extend_attention")
    fn = mod.extend_attention_fwd
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, hq, hkv, dqk, dv, prefixes, extends in EXTEND_CASES:

        def case(label=label, hq=hq, hkv=hkv, dqk=dqk, dv=dv, prefixes=prefixes, extends=extends):
            args = _extend_args(torch, dev, hq, hkv, dqk, dv, prefixes, extends)
            call_with_known_params(fn, "extend_attention_fwd", args)
            ref = _extend_reference(torch, args, prefixes, extends)
            return compare(label, args["o_extend"], ref, tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


# -- decode (one new token per request against the KV pool) ---------------------------------------------------

DECODE_CASES = (  # (label, q heads, kv heads, k dim, v dim, MLA layout)
    ("bf16 MHA 8/8 heads, head dim 128", 8, 8, 128, 128, False),
    ("bf16 GQA 32/8 heads, head dim 128", 32, 8, 128, 128, False),
    ("bf16 MLA 16/1 heads, 576/512 dims", 16, 1, 576, 512, True),
)
DECODE_SEQ_LENS = (1, 77, 300, 1030)
MAX_KV_SPLITS = 8


def decode(ctx: CheckContext) -> list[CaseResult]:
    mod = _attention_module("decode_attention")
    fn = mod.decode_attention_fwd
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, hq, hkv, dk, dv, mla in DECODE_CASES:

        def case(label=label, hq=hq, hkv=hkv, dk=dk, dv=dv, mla=mla):
            bf16 = torch.bfloat16
            seq_lens = list(DECODE_SEQ_LENS)
            bs = len(seq_lens)
            pool = sum(seq_lens) + 128
            k_buffer = torch.randn(pool, hkv, dk, device=dev, dtype=bf16)
            # MLA keeps one latent per token: the value is the first 512 dims of the key (a view, as SGLang
            # passes it); otherwise keys and values are separate buffers.
            v_buffer = k_buffer[..., :dv] if mla else torch.randn(pool, hkv, dv, device=dev, dtype=bf16)
            kv_indices, kv_indptr = _prefix_slots(torch, dev, seq_lens, pool)
            q = torch.randn(bs, hq, dk, device=dev, dtype=bf16)
            o = torch.empty(bs, hq, dv, device=dev, dtype=bf16)
            attn_logits = torch.empty(bs, hq, MAX_KV_SPLITS, dv, device=dev, dtype=torch.float32)
            attn_lse = torch.empty(bs, hq, MAX_KV_SPLITS, device=dev, dtype=torch.float32)
            num_kv_splits = torch.tensor([min(MAX_KV_SPLITS, n) for n in seq_lens], device=dev, dtype=torch.int32)
            scale = 1.0 / math.sqrt(dk)
            call_with_known_params(
                fn,
                "decode_attention_fwd",
                dict(
                    q=q,
                    k_buffer=k_buffer,
                    v_buffer=v_buffer,
                    o=o,
                    kv_indptr=kv_indptr,
                    kv_indices=kv_indices,
                    attn_logits=attn_logits,
                    attn_lse=attn_lse,
                    num_kv_splits=num_kv_splits,
                    max_kv_splits=MAX_KV_SPLITS,
                    sm_scale=scale,
                    k_scale=1.0,
                    v_scale=1.0,
                ),
            )
            refs, begin = [], 0
            for b, n in enumerate(seq_lens):
                slots = kv_indices[begin : begin + n]
                refs.append(ref_attention(torch, q[b : b + 1], k_buffer[slots], v_buffer[slots], scale))
                begin += n
            return compare(label, o, torch.cat(refs), tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


# -- split-KV tree verify and MLA decode (added by the series' sm120-mla-attention patch) ---------------------

SM120_MLA_MODULES = tuple(f"{pkg}.sm120_mla" for pkg in ATTENTION_PACKAGES)
TREE_VERIFY_CASES = (  # (label, q heads, kv heads, qk dim, v dim, prefix lengths, draft tokens per request)
    ("bf16 MLA 16/1 heads, 576/512 dims, trees of 8 and 5 drafts", 16, 1, 576, 512, (300, 1030), (8, 5)),
    ("bf16 GQA 32/8 heads, head dim 128, trees of 8 and 5 drafts", 32, 8, 128, 128, (300, 1030), (8, 5)),
)


def _sm120_mla():
    try:
        return import_sglang_module(*SM120_MLA_MODULES)
    except Skip as exc:
        if exc.cause != ABSENT:
            raise  # the module may well be there: SGLang is missing, or its import needs a missing package
        raise Skip(
            f"this SGLang has no sm120_mla module beside its Triton attention kernels (the series' "
            f"sm120-mla-attention patch adds it): {exc}"
        ) from None


def tree_mask(torch, n: int):
    """A binary draft tree of ``n`` tokens (token i's parent is (i - 1) // 2): row i sees itself and its
    ancestors only, so siblings and cousins do not see each other."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = (j - 1) // 2 if j > 0 else -1
    return mask


def tree_verify(ctx: CheckContext) -> list[CaseResult]:
    fn = _sm120_mla().sm120_tree_verify_fwd
    torch, dev = ctx.torch, ctx.device
    results: list[CaseResult] = []
    for label, hq, hkv, dqk, dv, prefixes, drafts in TREE_VERIFY_CASES:

        def case(label=label, hq=hq, hkv=hkv, dqk=dqk, dv=dv, prefixes=prefixes, drafts=drafts):
            args = _extend_args(torch, dev, hq, hkv, dqk, dv, prefixes, drafts, latent_v=dqk > dv and hkv == 1)
            # SGLang's layout: per request a row-major [drafts, prefix + drafts] mask, prefix columns all set.
            rows = [
                torch.cat([torch.ones(n, p, dtype=torch.bool), tree_mask(torch, n)], 1)
                for p, n in zip(prefixes, drafts)
            ]
            args.update(
                custom_mask=torch.cat([r.flatten() for r in rows]).to(dev),
                is_causal=False,
                mask_indptr=torch.tensor([0, *(r.numel() for r in rows)], device=dev).cumsum(0),
            )
            if not call_with_known_params(fn, "sm120_tree_verify_fwd", args):
                return CaseResult(label, False, error="sm120_tree_verify_fwd declined a call it should serve")
            ref = _extend_reference(torch, args, prefixes, drafts, masks=rows)
            return compare(label, args["o_extend"], ref, tol=ATTN_TOL_BF16)

        results += run_case(label, case)
    return results


def mla_decode(ctx: CheckContext) -> list[CaseResult]:
    fn = _sm120_mla().sm120_mla_decode_fwd
    torch, dev = ctx.torch, ctx.device
    label = "bf16 MLA 16/1 heads, 576/512 dims, KV splits from the SM count"

    def case():
        bf16 = torch.bfloat16
        seq_lens = list(DECODE_SEQ_LENS)
        pool = sum(seq_lens) + 128
        k_buffer = torch.randn(pool, 1, 576, device=dev, dtype=bf16)
        v_buffer = k_buffer[..., :512]
        kv_indices, kv_indptr = _prefix_slots(torch, dev, seq_lens, pool)
        q = torch.randn(len(seq_lens), 16, 576, device=dev, dtype=bf16)
        o = torch.empty(len(seq_lens), 16, 512, device=dev, dtype=bf16)
        scale = 1.0 / math.sqrt(576)
        ran = call_with_known_params(
            fn,
            "sm120_mla_decode_fwd",
            dict(
                q=q,
                k_buffer=k_buffer,
                v_buffer=v_buffer,
                o=o,
                kv_indptr=kv_indptr,
                kv_indices=kv_indices,
                sm_scale=scale,
                k_scale=1.0,
                v_scale=1.0,
                has_mla=True,
            ),
        )
        if not ran:
            return CaseResult(label, False, error="sm120_mla_decode_fwd declined a call it should serve")
        refs, begin = [], 0
        for b, n in enumerate(seq_lens):
            slots = kv_indices[begin : begin + n]
            refs.append(ref_attention(torch, q[b : b + 1], k_buffer[slots], v_buffer[slots], scale))
            begin += n
        return compare(label, o, torch.cat(refs), tol=ATTN_TOL_BF16)

    return run_case(label, case)


# -- fused MoE (the Triton grouped GEMM of SGLang's MoE runner) -----------------------------------------------

MOE_MODULES = (
    "sglang.kernels.ops.moe.fused_moe_triton_kernels",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_kernels",
    "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels",
)
MOE_CONFIG_MODULES = (
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
    "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config",
)
MOE_FIXED_CONFIGS = {
    # SGLang's unquantized default for every release 0.5.2-0.5.23.
    None: {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8},
    # A conservative FP8 tile: 3 stages compile to 49152 B of shared memory for sm_120 (Triton 3.9), well
    # within SM120's opt-in shared memory per block (sm120kit.hardware.arch).
    "fp8_w8a8": {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    },
}
MOE_TOL = {None: 2e-2, "fp8_w8a8": 8e-2}
"""‖Δ‖/‖ref‖ against the unquantized float32 MoE: bf16 rounding stays near 1e-2; FP8 (e4m3: 3 mantissa
bits, up to 6.25% per value) on activations and weights adds a few percent."""


def moe_align(torch, topk_ids, block_m: int, num_experts: int):
    """Reference of ``moe_align_block_size``: token slots grouped by expert, each group padded to a multiple
    of ``block_m`` with the sentinel ``topk_ids.numel()``; one expert id per block."""
    flat = topk_ids.flatten().to(torch.int64)
    sentinel = flat.numel()
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        idx = (flat == e).nonzero().flatten()
        if idx.numel() == 0:
            continue
        pad = (-idx.numel()) % block_m
        sorted_ids.append(torch.cat([idx, torch.full((pad,), sentinel, device=flat.device, dtype=torch.int64)]))
        expert_ids += [e] * ((idx.numel() + pad) // block_m)
    sorted_t = torch.cat(sorted_ids).to(torch.int32)
    return (
        sorted_t,
        torch.tensor(expert_ids, device=flat.device, dtype=torch.int32),
        torch.tensor([sorted_t.numel()], device=flat.device, dtype=torch.int32),
    )


def _moe_config(m: int, e: int, n: int, k: int, topk: int, dtype: str | None) -> tuple[dict, str]:
    """SGLang's default config for the shape when it can be read without a server context, else a fixed one."""
    try:
        mod = import_sglang_module(*MOE_CONFIG_MODULES)
        config = dict(mod.get_default_config(m, e, n, k, topk, dtype, False, None))
        return config, "SGLang's default config"
    except Exception:
        return dict(MOE_FIXED_CONFIGS[dtype]), "fixed config (SGLang's default needs a server context)"


def fused_moe(ctx: CheckContext) -> list[CaseResult]:
    mod = import_sglang_module(*MOE_MODULES)
    invoke = mod.invoke_fused_moe_kernel
    torch, dev = ctx.torch, ctx.device
    import triton.language as tl

    m, e, topk, hidden, inter = 33, 8, 2, 256, 128
    cases: list[tuple[str, str | None]] = [("bf16, 8 experts top-2", None)]
    if ctx.capability >= (8, 9):
        cases.append(("fp8 w8a8 per-tensor, 8 experts top-2", "fp8_w8a8"))
    results: list[CaseResult] = []
    for label, dtype in cases:

        def case(label=label, dtype=dtype):
            bf16 = torch.bfloat16
            x = torch.randn(m, hidden, device=dev, dtype=bf16)
            w1 = torch.randn(e, 2 * inter, hidden, device=dev, dtype=torch.float32) / math.sqrt(hidden)
            w2 = torch.randn(e, hidden, inter, device=dev, dtype=torch.float32) / math.sqrt(inter)
            logits = torch.randn(m, e, device=dev, dtype=torch.float32)
            weights, ids = torch.softmax(logits, -1).topk(topk, dim=-1)
            weights = (weights / weights.sum(-1, keepdim=True)).contiguous()
            ids = ids.to(torch.int32).contiguous()
            if dtype == "fp8_w8a8":
                fp8 = torch.float8_e4m3fn
                s1 = w1.abs().amax(dim=(1, 2)) / 448.0
                s2 = w2.abs().amax(dim=(1, 2)) / 448.0
                b1 = (w1 / s1[:, None, None]).to(fp8)
                b2 = (w2 / s2[:, None, None]).to(fp8)
                w1_ref, w2_ref = b1.float() * s1[:, None, None], b2.float() * s2[:, None, None]
                scales1, scales2 = s1.contiguous(), s2.contiguous()
            else:
                b1, b2 = w1.to(bf16), w2.to(bf16)
                w1_ref, w2_ref = b1.float(), b2.float()
                scales1 = scales2 = None
            config, config_note = _moe_config(m, e, inter, hidden, topk, dtype)
            sorted_ids, expert_ids, padded = moe_align(torch, ids, config["BLOCK_SIZE_M"], e)
            common = dict(
                bias=None,
                A_scale=None,
                B_zp=None,
                topk_weights=weights,
                topk_ids=ids,
                sorted_token_ids=sorted_ids,
                expert_ids=expert_ids,
                num_tokens_post_padded=padded,
                config=config,
                compute_type=tl.bfloat16,
                use_fp8_w8a8=dtype == "fp8_w8a8",
                use_int8_w8a8=False,
                use_int8_w8a16=False,
                use_int4_w4a16=False,
                per_channel_quant=False,
                block_shape=None,
            )
            inter1 = torch.empty(m, topk, 2 * inter, device=dev, dtype=bf16)
            call_with_known_params(
                invoke,
                "invoke_fused_moe_kernel",
                dict(common, A=x, B=b1, C=inter1, B_scale=scales1, mul_routed_weight=False, top_k=topk),
            )
            act = (torch.nn.functional.silu(inter1[..., :inter].float()) * inter1[..., inter:].float()).to(bf16)
            act = act.view(m * topk, inter)
            inter3 = torch.empty(m, topk, hidden, device=dev, dtype=bf16)
            call_with_known_params(
                invoke,
                "invoke_fused_moe_kernel",
                dict(common, A=act, B=b2, C=inter3, B_scale=scales2, mul_routed_weight=True, top_k=1),
            )
            out = inter3.float().sum(dim=1)
            xf = x.float()
            ref = torch.zeros(m, hidden, device=dev, dtype=torch.float32)
            for slot in range(topk):
                we1 = w1_ref[ids[:, slot].long()]  # [m, 2I, H]
                we2 = w2_ref[ids[:, slot].long()]  # [m, H, I]
                h = torch.einsum("mh,mih->mi", xf, we1)
                a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
                ref += weights[:, slot : slot + 1] * torch.einsum("mi,mhi->mh", a, we2)
            block = "x".join(str(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
            return compare(label, out, ref, tol=MOE_TOL[dtype], metric=REL_FRO, note=f"{config_note} {block}")

        results += run_case(label, case)
    return results


# -- torch_native attention backend -------------------------------------------------------------------------------

TORCH_NATIVE_MODULES = ("sglang.srt.layers.attention.torch_native_backend",)


def torch_native(ctx: CheckContext) -> list[CaseResult]:
    mod = import_sglang_module(*TORCH_NATIVE_MODULES)
    backend_cls = mod.TorchNativeAttnBackend
    # Its SDPA methods use no state of the backend; a bare instance avoids building a model runner.
    backend = backend_cls.__new__(backend_cls)
    torch, dev = ctx.torch, ctx.device
    bf16 = torch.bfloat16
    hq, hkv, dim = 8, 2, 128
    prefixes, extends = (0, 40), (25, 60)
    seq_lens = [p + e for p, e in zip(prefixes, extends)]
    scale = 1.0 / math.sqrt(dim)

    def setup():
        pool = sum(seq_lens) + 32
        k_cache = torch.randn(pool, hkv, dim, device=dev, dtype=bf16)
        v_cache = torch.randn(pool, hkv, dim, device=dev, dtype=bf16)
        req_to_token = torch.zeros(len(seq_lens), max(seq_lens), device=dev, dtype=torch.int64)
        perm = torch.randperm(pool, device=dev)
        begin = 0
        for r, n in enumerate(seq_lens):
            req_to_token[r, :n] = perm[begin : begin + n]
            begin += n
        return k_cache, v_cache, req_to_token

    def extend_case():
        k_cache, v_cache, req_to_token = setup()
        q = torch.randn(sum(extends), hq, dim, device=dev, dtype=bf16)
        out = torch.empty_like(q)
        call_with_known_params(
            backend._run_sdpa_forward_extend,
            "TorchNativeAttnBackend._run_sdpa_forward_extend",
            dict(
                query=q,
                output=out,
                k_cache=k_cache,
                v_cache=v_cache,
                req_to_token=req_to_token,
                req_pool_indices=torch.arange(len(seq_lens), device=dev),
                seq_lens=torch.tensor(seq_lens, device=dev),
                extend_prefix_lens=torch.tensor(prefixes, device=dev),
                extend_seq_lens=torch.tensor(extends, device=dev),
                scaling=scale,
                enable_gqa=True,
                causal=True,
            ),
        )
        refs, begin = [], 0
        for r, (p, e) in enumerate(zip(prefixes, extends)):
            slots = req_to_token[r, : p + e]
            refs.append(
                ref_attention(torch, q[begin : begin + e], k_cache[slots], v_cache[slots], scale, causal_offset=p)
            )
            begin += e
        return compare("extend, bf16 GQA 8/2 heads, head dim 128", out, torch.cat(refs), tol=ATTN_TOL_BF16)

    def decode_case():
        k_cache, v_cache, req_to_token = setup()
        q = torch.randn(len(seq_lens), hq, dim, device=dev, dtype=bf16)
        out = torch.empty_like(q)
        call_with_known_params(
            backend._run_sdpa_forward_decode,
            "TorchNativeAttnBackend._run_sdpa_forward_decode",
            dict(
                query=q,
                output=out,
                k_cache=k_cache,
                v_cache=v_cache,
                req_to_token=req_to_token,
                req_pool_indices=torch.arange(len(seq_lens), device=dev),
                seq_lens=torch.tensor(seq_lens, device=dev),
                scaling=scale,
                enable_gqa=True,
                causal=False,
            ),
        )
        refs = [
            ref_attention(torch, q[r : r + 1], k_cache[req_to_token[r, :n]], v_cache[req_to_token[r, :n]], scale)
            for r, n in enumerate(seq_lens)
        ]
        return compare("decode, bf16 GQA 8/2 heads, head dim 128", out, torch.cat(refs), tol=ATTN_TOL_BF16)

    return run_case("extend", extend_case) + run_case("decode", decode_case)


def _skip_without(ctx: CheckContext, minimum: tuple[int, int], feature: str) -> None:
    if ctx.capability < minimum:
        raise Skip(f"the GPU ({ctx.capability[0]}.{ctx.capability[1]}) lacks {feature}", cause=GPU_LACKS_FEATURE)


CHECKS = (
    Check("triton-extend", "triton", "SGLang Triton extend attention", extend),
    Check("triton-decode", "triton", "SGLang Triton decode attention", decode),
    Check("triton-prefill", "triton", "SGLang Triton prefill attention (context_attention_fwd)", prefill),
    Check("triton-fused-moe", "triton", "SGLang fused-MoE Triton kernel (bf16, fp8 w8a8)", fused_moe),
    Check("triton-tree-verify", "triton", "Split-KV tree verify (sm120-mla-attention): MLA and GQA", tree_verify),
    Check("triton-mla-decode", "triton", "Split-KV MLA decode (sm120-mla-attention)", mla_decode),
    Check("torch-native", "torch_native", "SGLang torch_native attention backend (SDPA)", torch_native),
)

__all__ = ["CHECKS", "ref_attention", "moe_align", "ABS"]
