"""Inputs and a float32 torch reference for the SM120 split-KV attention kernels (tree verify, MLA decode).

Shared by the CPU tests (Triton interpreter), the GPU checks and scripts/bench_mla.py; not shipped into SGLang.
"""

from __future__ import annotations

import math

import torch


def tree_mask(n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """A draft-tree mask over n tokens (row i may see column j): 'chain' is causal, 'tree' gives each
    token a random earlier parent, so siblings do not see each other."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    parent = [-1] * n
    for i in range(n):
        if kind == "chain":
            parent[i] = i - 1
        else:
            parent[i] = -1 if i == 0 else int(torch.randint(0, i, (1,), generator=gen))
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


def make_verify_case(
    prefix_lens,
    draft_lens,
    heads=16,
    kv_heads=1,
    lk=576,
    lv=512,
    dtype=torch.float16,
    kv_dtype=None,
    tree="tree",
    device="cpu",
    seed=0,
    pool_extra=64,
):
    """Tensors in the layout of SGLang's Triton backend at target verify: q/k/v of the draft tokens,
    a KV pool with scattered slots, kv_indptr/kv_indices over each request's prefix, and the
    custom mask (prefix columns all ones, the tree over the draft tail) with mask_indptr."""
    gen = torch.Generator().manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    batch = len(prefix_lens)
    total_prefix = sum(prefix_lens)
    total_tok = sum(draft_lens)
    pool = total_prefix + pool_extra
    k_pool = torch.randn(pool, kv_heads, lk, generator=gen) * 0.5
    if lk > lv and kv_heads == 1:  # MLA: V is the first lv dims of the latent K
        v_pool = k_pool[:, :, :lv]
    else:
        v_pool = torch.randn(pool, kv_heads, lv, generator=gen) * 0.5
    slots = torch.randperm(pool, generator=gen)[:total_prefix]
    q = torch.randn(total_tok, heads, lk, generator=gen) * 0.5
    k_ext = torch.randn(total_tok, kv_heads, lk, generator=gen) * 0.5
    v_ext = (
        k_ext[:, :, :lv] if (lk > lv and kv_heads == 1) else torch.randn(total_tok, kv_heads, lv, generator=gen) * 0.5
    )
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    mask_indptr = torch.zeros(batch + 1, dtype=torch.int64)
    masks = []
    for b in range(batch):
        qo_indptr[b + 1] = qo_indptr[b] + draft_lens[b]
        kv_indptr[b + 1] = kv_indptr[b] + prefix_lens[b]
        n = draft_lens[b]
        full = torch.ones(n, prefix_lens[b] + n, dtype=torch.bool)
        full[:, prefix_lens[b] :] = tree_mask(n, tree, gen)
        masks.append(full.flatten())
        mask_indptr[b + 1] = mask_indptr[b] + full.numel()
    custom_mask = torch.cat(masks)
    case = dict(
        q=q.to(dtype),
        k_ext=k_ext.to(dtype),
        v_ext=v_ext.to(dtype),
        k_pool=k_pool.to(kv_dtype),
        v_pool=(k_pool.to(kv_dtype)[:, :, :lv] if (lk > lv and kv_heads == 1) else v_pool.to(kv_dtype)),
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=slots.to(torch.int64),
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
        prefix_lens=list(prefix_lens),
        draft_lens=list(draft_lens),
        max_len=max(draft_lens),
        lk=lk,
        lv=lv,
    )
    if device != "cpu":
        case = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
        if lk > lv and kv_heads == 1:
            case["v_pool"] = case["k_pool"][:, :, :lv]
            case["v_ext"] = case["k_ext"][:, :, :lv]
    return case


# The names of the positional parameters of sm120_tree_verify_fwd (those of SGLang's extend_attention_fwd), in the
# order of verify_args.
VERIFY_ARG_NAMES = (
    "q_extend",
    "k_extend",
    "v_extend",
    "o_extend",
    "k_buffer",
    "v_buffer",
    "qo_indptr",
    "kv_indptr",
    "kv_indices",
    "custom_mask",
    "is_causal",
    "mask_indptr",
    "max_len_extend",
    "k_scale",
    "v_scale",
)


def verify_args(case, o, k_scale=1.0, v_scale=1.0) -> tuple:
    """The positional arguments of ``sm120_tree_verify_fwd`` and of SGLang's ``extend_attention_fwd`` for a case of
    :func:`make_verify_case`: the output written into ``o``, the case's custom mask (not causal), the KV pool
    scaled by ``k_scale`` / ``v_scale``. :func:`verify_kwargs` gives them by name."""
    return (
        case["q"],
        case["k_ext"],
        case["v_ext"],
        o,
        case["k_pool"],
        case["v_pool"],
        case["qo_indptr"],
        case["kv_indptr"],
        case["kv_indices"],
        case["custom_mask"],
        False,
        case["mask_indptr"],
        case["max_len"],
        k_scale,
        v_scale,
    )


def verify_kwargs(case, o, k_scale=1.0, v_scale=1.0) -> dict:
    """:func:`verify_args` by name (:data:`VERIFY_ARG_NAMES`), for a call that changes or drops some of them."""
    return dict(zip(VERIFY_ARG_NAMES, verify_args(case, o, k_scale, v_scale)))


E4M3_MAX = 448.0  # the largest finite fp8 e4m3 value


def quantize_queries_e4m3(q: torch.Tensor, parts: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries as the fp8-mma path of the CUDA kernel takes them: each row (token x head) in ``parts`` equal
    runs of dims (the kernel's two warps of a pair hold one half each), each run quantized to e4m3 at its own
    scale amax / 448 (round to nearest even, saturated). Returns (the e4m3 values as float32, unscaled,
    [tokens, heads, parts, dims / parts]; the scales, [tokens, heads, parts]); a run of zeros has scale 0."""
    t, h, d = q.shape
    x = q.float().reshape(t, h, parts, d // parts)
    amax = x.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, E4M3_MAX / amax, torch.zeros_like(amax))
    q8 = (x * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    return q8, (amax / E4M3_MAX)[..., 0]


def scores_e4m3(q: torch.Tensor, keys: torch.Tensor, parts: int = 2) -> torch.Tensor:
    """q [tokens, heads, dims] against keys [n, heads, dims] as the fp8-mma path scores them: the e4m3 queries
    of each run of dims against the keys, each run's dot multiplied by its scale afterwards (the scale folded
    into the scores, not into the queries), summed: [heads, tokens, n] before the softmax scale."""
    q8, scale = quantize_queries_e4m3(q, parts)
    t, h, d = q.shape
    k = keys.float().reshape(keys.shape[0], keys.shape[1], parts, d // parts)
    return torch.einsum("thpd,khpd,thp->htk", q8, k, scale)


def _queries(case, q_e4m3: bool) -> torch.Tensor:
    """The case's queries in float32; with q_e4m3, as the fp8-mma path sees them (quantized, scale applied)."""
    q = case["q"].float()
    if not q_e4m3:
        return q
    q8, scale = quantize_queries_e4m3(q)
    return (q8 * scale[..., None]).reshape(q.shape)


def reference_verify(case, sm_scale=None, k_scale=1.0, v_scale=1.0, q_e4m3=False) -> torch.Tensor:
    """float32 attention of every draft token over its prefix (unmasked) and the draft tail (masked); with
    ``q_e4m3`` the queries as the fp8-mma path quantizes them (:func:`quantize_queries_e4m3`) against the prefix,
    the draft tail scored with the queries as given (as the kernel's tail programs do), the rest float32."""
    q = case["q"].float()
    q_prefix = _queries(case, q_e4m3)
    heads = q.shape[1]
    lk = case["lk"]
    scale = sm_scale or 1.0 / math.sqrt(lk)
    kp = case["k_pool"].float() * k_scale
    vp = case["v_pool"].float() * v_scale
    out = torch.empty(q.shape[0], heads, case["lv"], dtype=torch.float32, device=q.device)
    mask_all = case["custom_mask"]
    for b in range(len(case["prefix_lens"])):
        qs, qe = int(case["qo_indptr"][b]), int(case["qo_indptr"][b + 1])
        ks, ke = int(case["kv_indptr"][b]), int(case["kv_indptr"][b + 1])
        idx = case["kv_indices"][ks:ke].long()
        n, p = qe - qs, ke - ks
        keys = torch.cat([kp[idx], case["k_ext"][qs:qe].float()], 0)  # [p+n, kvh, lk]
        vals = torch.cat([vp[idx], case["v_ext"][qs:qe].float()], 0)
        group = heads // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1)
        vals = vals.repeat_interleave(group, dim=1)
        ms, me = int(case["mask_indptr"][b]), int(case["mask_indptr"][b + 1])
        mask = mask_all[ms:me].view(n, p + n).bool()
        s = torch.cat(
            [
                torch.einsum("thd,khd->htk", q_prefix[qs:qe], keys[:p]),
                torch.einsum("thd,khd->htk", q[qs:qe], keys[p:]),
            ],
            -1,
        )
        s = s * scale
        s = s.masked_fill(~mask[None], float("-inf"))
        out[qs:qe] = torch.einsum("htk,khd->thd", torch.softmax(s, -1), vals)
    return out


def make_decode_case(prefix_lens, heads=16, lk=576, lv=512, dtype=torch.float16, kv_dtype=None, device="cpu", seed=0):
    """A decode step in the Triton backend's layout: one query token per request, its KV (itself
    included) already in the pool, one latent KV head (MLA)."""
    case = make_verify_case(
        prefix_lens,
        [1] * len(prefix_lens),
        heads=heads,
        kv_heads=1,
        lk=lk,
        lv=lv,
        dtype=dtype,
        kv_dtype=kv_dtype,
        tree="chain",
        device=device,
        seed=seed,
    )
    return case


def reference_decode(case, sm_scale=None, k_scale=1.0, v_scale=1.0, q_e4m3=False) -> torch.Tensor:
    """float32 MLA decode of each request's query token over its KV; ``q_e4m3`` as in :func:`reference_verify`."""
    q = _queries(case, q_e4m3)
    scale = sm_scale or 1.0 / math.sqrt(case["lk"])
    kp = case["k_pool"].float() * k_scale
    vp = case["v_pool"].float() * v_scale
    out = torch.empty(q.shape[0], q.shape[1], case["lv"], dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        ks, ke = int(case["kv_indptr"][b]), int(case["kv_indptr"][b + 1])
        idx = case["kv_indices"][ks:ke].long()
        s = torch.einsum("hd,khd->hk", q[b], kp[idx].expand(-1, q.shape[1], -1)) * scale
        out[b] = torch.einsum("hk,khd->hd", torch.softmax(s, -1), vp[idx].expand(-1, q.shape[1], -1))
    return out
