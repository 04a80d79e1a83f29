# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""Split-KV attention for SM120 (compute capability 12.x): tree verify and MLA decode.

Added to SGLang by sm120kit's ``sm120-mla-attention`` patch, beside ``extend_attention.py``, with its
siblings ``sm120_mla_route.py`` (which kernels run a call), ``sm120_mla_mma.py`` and ``sm120_mla_mma.cu``
(the CUDA kernels) and ``sm120_mla_nvrtc.py`` (their compile and launch).

On SM120 every MLA model runs attention through the Triton backend. Its extend kernel, which serves
speculative target-verify with a tree mask, walks the whole prefix once per (request, head, block of
queries); its decode kernel caps the KV splits per request. Both leave most of the GPU idle at long
context. The kernels here split the prefix across many programs instead:

* ``_prefix_kernel``: one program per (row block, KV split, request x KV head). A row block holds
  ``BLOCK_T`` query tokens x ``BLOCK_H`` heads of one KV head, so each KV tile is read once for every
  head and every draft token of the block. The prefix needs no mask (the tree mask only covers the
  draft tail when ``skip_prefix_custom_mask`` holds, as in SGLang's target verify). KV rows are read
  as [tokens, dims] tiles that both dots take from shared memory, so Triton copies them ahead of use.
* ``_prefix_pair_kernel``: the same pass for MLA verify, its 32 rows as two 16-row groups over one KV
  tile (see its docstring for why).
* ``sm120_mla_mma.py`` (imported as ``cuda_prefix``): the MLA prefix pass as CUDA mma.sync kernels with
  the queries in registers, bf16 or fp8 KV: 64-row programs for verify and decode with 64 query rows a
  request or more, 16-row programs (one launch: prefix splits, draft tail and merge) for decode and
  verify with fewer rows; the Triton kernels here run where they decline or cannot be compiled.
* ``_tail_kernel``: the draft tokens against each other, with SGLang's ``custom_mask`` layout.
* ``_merge_kernel``: the log-sum-exp merge of the partial results, written in the output dtype.
* ``_merge_tail_kernel``: the merge with the draft tail scored in place, for requests with few query
  rows (one pass fewer).

Which of them run a call is :func:`sm120_mla_route.choose`'s answer (its thresholds are that module's
``TABLE``); :func:`_run_split_attention` launches what it says.

Entry points take the arguments of the release's ``extend_attention_fwd`` / ``decode_attention_fwd``
and return True when they ran, False (having written nothing) for a case they do not serve, so the
caller falls back to its own kernel. The Triton backend calls :func:`install` once; on a GPU that is
not 12.x, or with ``SGLANG_SM120_MLA=0``, it changes nothing.

Every configuration picked here compiles for sm_120a and sm_121a within 101376 bytes of shared
memory (``sm120kit audit`` checks it).
"""

import importlib.util
import inspect
import os

import torch
import triton
import triton.language as tl


def _sibling(name: str):
    """The module ``name`` from its file beside this one (for a copy of the kernels loaded from its files)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    from . import sm120_mla_mma as cuda_prefix
    from . import sm120_mla_route as routes
except ImportError:  # imported from its file, not as part of a package (another revision): the sibling files
    cuda_prefix = _sibling("sm120_mla_mma")
    routes = _sibling("sm120_mla_route")

TileConfig = routes.TileConfig
head_dim_split = routes.head_dim_split
pick_tiles = routes.pick_tiles
num_splits_for = routes.num_splits_for
_pow2_at_least = routes.pow2_at_least

SMEM_LIMIT_SM120 = 101376
MAX_TAIL = 64  # longest draft tail (tokens per request) the tree-verify path serves
TAIL_BLOCK_DK = 64  # query/key dims the merge's draft-tail scores take per step ([64 tokens, 64] fp32 at most)
LOG2E = 1.4426950408889634

_CAPABILITY: dict[int, tuple[int, int]] = {}
_SM_COUNT: dict[int, int] = {}


def _env_enabled() -> bool:
    return os.environ.get("SGLANG_SM120_MLA", "1").strip().lower() not in ("0", "false", "off", "no")


def _device_index(device) -> int | None:
    """The CUDA device index of ``device`` (a tensor, torch.device, string, int or None), else None."""
    if isinstance(device, torch.Tensor):
        device = device.device
    if device is None or isinstance(device, int):
        return torch.cuda.current_device() if device is None else device
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def enabled(device=None) -> bool:
    """True on a CUDA (not ROCm) device of compute capability 12.x, unless SGLANG_SM120_MLA=0."""
    if not _env_enabled() or torch.version.hip or torch.version.cuda is None:
        return False
    if not torch.cuda.is_available():
        return False
    index = _device_index(device)
    if index is None:
        return False
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return cap[0] == 12


def _positional_names(fn) -> tuple[str, ...]:
    """The names of ``fn``'s positional parameters, in order (through torch.compiler.disable's wrapper).

    The release's launchers take their arguments in orders that changed over releases (``k_scale`` and
    ``v_scale`` came before ``sm_scale`` from 0.5.10 on), so calls are forwarded by name."""
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _by_name(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict:
    named = dict(zip(names, args))
    named.update(kwargs)
    return named


def verify_first(extend_attention_fwd):
    """``extend_attention_fwd`` that first offers the call to :func:`sm120_tree_verify_fwd`."""
    names = _positional_names(extend_attention_fwd)

    def extend_attention_fwd_sm120(*args, **kwargs):
        if len(args) <= len(names) and sm120_tree_verify_fwd(**_by_name(names, args, kwargs)):
            return None
        return extend_attention_fwd(*args, **kwargs)

    extend_attention_fwd_sm120.__wrapped__ = extend_attention_fwd
    return torch.compiler.disable(extend_attention_fwd_sm120)


def decode_first(decode_attention_fwd):
    """``decode_attention_fwd`` that first offers the call to :func:`sm120_mla_decode_fwd`."""
    names = _positional_names(decode_attention_fwd)

    def decode_attention_fwd_sm120(*args, **kwargs):
        if len(args) <= len(names) and sm120_mla_decode_fwd(**_by_name(names, args, kwargs)):
            return None
        return decode_attention_fwd(*args, **kwargs)

    decode_attention_fwd_sm120.__wrapped__ = decode_attention_fwd
    return torch.compiler.disable(decode_attention_fwd_sm120)


def install(backend, device) -> bool:
    """Route a Triton attention backend's extend and decode launchers through this module when
    ``device`` is a 12.x CUDA GPU (and SGLANG_SM120_MLA is not 0). Returns whether it did; on any
    other device the backend is left exactly as it was."""
    if not enabled(device):
        return False
    backend.extend_attention_fwd = verify_first(backend.extend_attention_fwd)
    backend.decode_attention_fwd = decode_first(backend.decode_attention_fwd)
    return True


def _sm_count(t: torch.Tensor) -> int:
    """SMs of the tensor's GPU (of the current GPU for a meta tensor, as in an ahead-of-time audit)."""
    if t.device.type == "cuda":
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    elif torch.cuda.is_available():
        index = torch.cuda.current_device()
    else:
        return 8
    count = _SM_COUNT.get(index)
    if count is None:
        count = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


@triton.jit
def _program(n_kv_heads, n_head_blocks):
    """(KV split, request, KV head, head block, token block) of this program of a prefix pass."""
    pid_r = tl.program_id(0)
    pid_bk = tl.program_id(2)
    return tl.program_id(1), pid_bk // n_kv_heads, pid_bk % n_kv_heads, pid_r % n_head_blocks, pid_r // n_head_blocks


@triton.jit
def _split_range(kv_len, split, num_splits, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """The split's share of the prefix: at least MIN_SPLIT tokens, a whole number of KV tiles."""
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, MIN_SPLIT)
    start = split * chunk
    return start, tl.minimum(kv_len, start + chunk)


@triton.jit
def _row_block(
    tb, hb, g, q_start, n_tok, kv_group, kvh, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Token, head and validity of the rows of row group ``g`` (BLOCK_M rows) of a program's row block."""
    offs_m = g * BLOCK_M + tl.arange(0, BLOCK_M)
    t_loc = tb * BLOCK_T + offs_m // BLOCK_H
    h_grp = hb * BLOCK_H + offs_m % BLOCK_H
    row_ok = (t_loc < n_tok) & (h_grp < kv_group)
    return q_start + t_loc, kvh * kv_group + h_grp, row_ok


@triton.jit
def _prefix_kernel(
    Q,
    K_Buf,
    V_Buf,
    q_indptr,
    kv_indptr,
    kv_indices,
    O_part,
    L_part,
    qk_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    n_kv_heads,
    kv_group,
    n_head_blocks,
    num_splits,
    Lk: tl.constexpr,
    Lv: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    IS_DECODE: tl.constexpr,
    V_FROM_K: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_T * BLOCK_H
    split, b, kvh, hb, tb = _program(n_kv_heads, n_head_blocks)

    if IS_DECODE:
        q_start = b
        n_tok = 1
    else:
        q_start = tl.load(q_indptr + b)
        n_tok = tl.load(q_indptr + b + 1) - q_start
    if tb * BLOCK_T >= n_tok:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start

    t_glob, head, row_ok = _row_block(tb, hb, 0, q_start, n_tok, kv_group, kvh, BLOCK_T, BLOCK_H, BLOCK_M)
    start, end = _split_range(kv_len, split, num_splits, BLOCK_N, MIN_SPLIT)

    offs_l = t_glob * stride_lt + head * stride_lh + split
    if start >= end:
        tl.store(L_part + offs_l, float("-inf"), mask=row_ok)
        return

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + t_glob[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & (offs_d[None, :] < Lk),
        other=0.0,
    )
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_D + tl.arange(0, BLOCK_DPE)
        qpe = tl.load(
            Q + t_glob[:, None] * stride_qt + head[:, None] * stride_qh + offs_dpe[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < end
        loc = tl.load(kv_indices + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
        # KV rows as [BLOCK_N, D]: both dots take the tile from shared memory (QK through a transposed
        # view), so Triton copies it asynchronously ahead of use instead of loading it into registers.
        kt = tl.load(
            K_Buf + loc[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
            mask=col_ok[:, None] & (offs_d[None, :] < Lk),
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(kt).to(q.dtype))
        if BLOCK_DPE > 0:
            kpe = tl.load(
                K_Buf + loc[:, None] * stride_kt + kvh * stride_kh + offs_dpe[None, :],
                mask=col_ok[:, None],
                other=0.0,
            )
            qk += tl.dot(qpe, tl.trans(kpe).to(q.dtype))
        qk = tl.where(col_ok[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_FROM_K:
            v = kt.to(q.dtype)
        else:
            v = tl.load(
                V_Buf + loc[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
                mask=col_ok[:, None] & (offs_dv[None, :] < Lv),
                other=0.0,
            ).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m_i = m_new

    acc = acc * (v_scale / l_i[:, None])
    tl.store(
        O_part + t_glob[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_os + offs_dv[None, :],
        acc,
        mask=row_ok[:, None] & (offs_dv[None, :] < Lv),
    )
    tl.store(L_part + offs_l, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _prefix_pair_kernel(
    Q,
    K_Buf,
    q_indptr,
    kv_indptr,
    kv_indices,
    O_part,
    L_part,
    qk_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    n_kv_heads,
    kv_group,
    n_head_blocks,
    num_splits,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
):
    """The verify prefix pass for MLA-shaped KV (values are the first BLOCK_D dims of each key row, plus
    a rope part of BLOCK_DPE dims): the program's BLOCK_T x BLOCK_H rows as two groups of 16, each its
    own pair of dots over the same KV tile in shared memory.

    One 32-row dot would be laid out by Triton with its four warps along the rows (each holding 16 rows
    x 512 fp32 values, twice over); two 16-row dots put the warps along the value dims, as in decode, so
    the accumulators fit in registers and the tile is copied asynchronously ahead of use."""
    BLOCK_M: tl.constexpr = BLOCK_T * BLOCK_H // 2
    split, b, kvh, hb, tb = _program(n_kv_heads, n_head_blocks)

    q_start = tl.load(q_indptr + b)
    n_tok = tl.load(q_indptr + b + 1) - q_start
    if tb * BLOCK_T >= n_tok:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    t0, h0, ok0 = _row_block(tb, hb, 0, q_start, n_tok, kv_group, kvh, BLOCK_T, BLOCK_H, BLOCK_M)
    t1, h1, ok1 = _row_block(tb, hb, 1, q_start, n_tok, kv_group, kvh, BLOCK_T, BLOCK_H, BLOCK_M)

    start, end = _split_range(kv_len, split, num_splits, BLOCK_N, MIN_SPLIT)
    if start >= end:
        tl.store(L_part + t0 * stride_lt + h0 * stride_lh + split, float("-inf"), mask=ok0)
        tl.store(L_part + t1 * stride_lt + h1 * stride_lh + split, float("-inf"), mask=ok1)
        return

    offs_d = tl.arange(0, BLOCK_D)
    offs_dpe = BLOCK_D + tl.arange(0, BLOCK_DPE)
    q_rows0 = Q + t0[:, None] * stride_qt + h0[:, None] * stride_qh
    q_rows1 = Q + t1[:, None] * stride_qt + h1[:, None] * stride_qh
    q0 = tl.load(q_rows0 + offs_d[None, :], mask=ok0[:, None], other=0.0)
    q1 = tl.load(q_rows1 + offs_d[None, :], mask=ok1[:, None], other=0.0)
    qpe0 = tl.load(q_rows0 + offs_dpe[None, :], mask=ok0[:, None], other=0.0)
    qpe1 = tl.load(q_rows1 + offs_dpe[None, :], mask=ok1[:, None], other=0.0)

    m0 = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    m1 = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < end
        loc = tl.load(kv_indices + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
        kv_rows = K_Buf + loc[:, None] * stride_kt + kvh * stride_kh
        kv = tl.load(kv_rows + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        kpe = tl.load(kv_rows + offs_dpe[None, :], mask=col_ok[:, None], other=0.0)
        k_t = tl.trans(kv).to(q0.dtype)
        kpe_t = tl.trans(kpe).to(q0.dtype)
        qk0 = tl.dot(q0, k_t) + tl.dot(qpe0, kpe_t)
        qk1 = tl.dot(q1, k_t) + tl.dot(qpe1, kpe_t)
        qk0 = tl.where(col_ok[None, :], qk0 * qk_scale, float("-inf"))
        qk1 = tl.where(col_ok[None, :], qk1 * qk_scale, float("-inf"))
        m0_new = tl.maximum(m0, tl.max(qk0, 1))
        m1_new = tl.maximum(m1, tl.max(qk1, 1))
        alpha0 = tl.exp2(m0 - m0_new)
        alpha1 = tl.exp2(m1 - m1_new)
        p0 = tl.exp2(qk0 - m0_new[:, None])
        p1 = tl.exp2(qk1 - m1_new[:, None])
        l0 = l0 * alpha0 + tl.sum(p0, 1)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        v = kv.to(q0.dtype)
        acc0 = acc0 * alpha0[:, None] + tl.dot(p0.to(q0.dtype), v)
        acc1 = acc1 * alpha1[:, None] + tl.dot(p1.to(q0.dtype), v)
        m0 = m0_new
        m1 = m1_new

    o_cols = split * stride_os + offs_d[None, :]
    tl.store(
        O_part + t0[:, None] * stride_ot + h0[:, None] * stride_oh + o_cols,
        acc0 * (v_scale / l0[:, None]),
        mask=ok0[:, None],
    )
    tl.store(
        O_part + t1[:, None] * stride_ot + h1[:, None] * stride_oh + o_cols,
        acc1 * (v_scale / l1[:, None]),
        mask=ok1[:, None],
    )
    tl.store(L_part + t0 * stride_lt + h0 * stride_lh + split, m0 + tl.log2(l0), mask=ok0)
    tl.store(L_part + t1 * stride_lt + h1 * stride_lh + split, m1 + tl.log2(l1), mask=ok1)


@triton.jit
def _tail_kernel(
    Q,
    K_Ext,
    V_Ext,
    q_indptr,
    kv_indptr,
    mask_ptr,
    mask_indptr,
    O_part,
    L_part,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    n_kv_heads,
    kv_group,
    n_head_blocks,
    slot,
    Lk: tl.constexpr,
    Lv: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_T * BLOCK_H
    pid_r = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // n_kv_heads
    kvh = pid_bk % n_kv_heads
    hb = pid_r % n_head_blocks
    tb = pid_r // n_head_blocks

    q_start = tl.load(q_indptr + b)
    n_tok = tl.load(q_indptr + b + 1) - q_start
    if tb * BLOCK_T >= n_tok:
        return
    kv_len = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    m_start = tl.load(mask_indptr + b)
    row_len = kv_len + n_tok

    offs_m = tl.arange(0, BLOCK_M)
    t_loc = tb * BLOCK_T + offs_m // BLOCK_H
    h_grp = hb * BLOCK_H + offs_m % BLOCK_H
    head = kvh * kv_group + h_grp
    row_ok = (t_loc < n_tok) & (h_grp < kv_group)
    t_glob = q_start + t_loc

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    col_ok = offs_n < n_tok
    q = tl.load(
        Q + t_glob[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & (offs_d[None, :] < Lk),
        other=0.0,
    )
    k = tl.load(
        K_Ext + (q_start + offs_n)[None, :] * stride_kt + kvh * stride_kh + offs_d[:, None],
        mask=col_ok[None, :] & (offs_d[:, None] < Lk),
        other=0.0,
    ).to(q.dtype)
    qk = tl.dot(q, k)
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_D + tl.arange(0, BLOCK_DPE)
        qpe = tl.load(
            Q + t_glob[:, None] * stride_qt + head[:, None] * stride_qh + offs_dpe[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        kpe = tl.load(
            K_Ext + (q_start + offs_n)[None, :] * stride_kt + kvh * stride_kh + offs_dpe[:, None],
            mask=col_ok[None, :],
            other=0.0,
        ).to(q.dtype)
        qk += tl.dot(qpe, kpe)
    allowed = tl.load(
        mask_ptr + m_start + t_loc[:, None] * row_len + kv_len + offs_n[None, :],
        mask=row_ok[:, None] & col_ok[None, :],
        other=0,
    )
    keep = (allowed != 0) & row_ok[:, None] & col_ok[None, :]
    qk = tl.where(keep, qk * qk_scale, float("-inf"))
    m_i = tl.max(qk, 1)
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = tl.sum(p, 1)
    v = tl.load(
        V_Ext + (q_start + offs_n)[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
        mask=col_ok[:, None] & (offs_dv[None, :] < Lv),
        other=0.0,
    ).to(q.dtype)
    acc = tl.dot(p.to(q.dtype), v)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    acc = acc / l_safe[:, None]
    tl.store(
        O_part + t_glob[:, None] * stride_ot + head[:, None] * stride_oh + slot * stride_os + offs_dv[None, :],
        acc,
        mask=row_ok[:, None] & (offs_dv[None, :] < Lv),
    )
    lse = tl.where(l_i > 0, m_safe + tl.log2(l_safe), float("-inf"))
    tl.store(L_part + t_glob * stride_lt + head * stride_lh + slot, lse, mask=row_ok)


@triton.jit
def _slot_lse(L_part, row_l, n_slots, s0, CHUNK_S: tl.constexpr):
    """The log-sum-exps of CHUNK_S slots from slot s0 on (-inf past the last)."""
    s = s0 + tl.arange(0, CHUNK_S)
    return tl.load(L_part + row_l + s, mask=s < n_slots, other=float("-inf"))


@triton.jit
def _slot_parts(O_part, row_o, offs_dv, dv_ok, stride_os, s0, lse, CHUNK_S: tl.constexpr):
    """The partial results of the same slots; a slot with no tokens (lse -inf) is neither written by the
    prefix pass nor read here."""
    s = s0 + tl.arange(0, CHUNK_S)
    return tl.load(
        O_part + row_o + s[:, None] * stride_os + offs_dv[None, :],
        mask=(lse > float("-inf"))[:, None] & dv_ok[None, :],
        other=0.0,
    )


@triton.jit
def _merge_slots(
    O_part, L_part, row_o, row_l, offs_dv, dv_ok, n_slots, stride_os, m_safe, lse0, parts0, CHUNK_S: tl.constexpr
):
    """Sum over every slot of its partial result weighted by exp2(lse - m_safe), and the sum of the
    weights: the first chunk as the caller loaded it (so its loads overlap the caller's), the rest here."""
    w = tl.where(lse0 > float("-inf"), tl.exp2(lse0 - m_safe), 0.0)
    acc = tl.sum(parts0 * w[:, None], 0)
    denom = tl.sum(w, 0)
    for s0 in range(CHUNK_S, n_slots, CHUNK_S):
        lse = _slot_lse(L_part, row_l, n_slots, s0, CHUNK_S)
        parts = _slot_parts(O_part, row_o, offs_dv, dv_ok, stride_os, s0, lse, CHUNK_S)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - m_safe), 0.0)
        acc += tl.sum(parts * w[:, None], 0)
        denom += tl.sum(w, 0)
    return acc, denom


@triton.jit
def _merge_kernel(
    O_part,
    L_part,
    O,
    LSE,
    n_slots,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_out_t,
    stride_out_h,
    stride_lse_t,
    stride_lse_h,
    Lv: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    """One program per (token, head, slice of the value dims): the partial results of every slot
    (KV split, draft tail) weighted by exp2(lse - max), walked CHUNK_S slots at a time."""
    LN2: tl.constexpr = 0.6931471805599453
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < Lv
    row_o = t * stride_ot + h * stride_oh
    row_l = t * stride_lt + h * stride_lh
    offs_s = tl.arange(0, BLOCK_S)
    lse_all = tl.load(L_part + row_l + offs_s, mask=offs_s < n_slots, other=float("-inf"))
    lse0 = _slot_lse(L_part, row_l, n_slots, 0, CHUNK_S)
    parts0 = _slot_parts(O_part, row_o, offs_dv, dv_ok, stride_os, 0, lse0, CHUNK_S)
    m = tl.max(lse_all, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc, denom = _merge_slots(
        O_part, L_part, row_o, row_l, offs_dv, dv_ok, n_slots, stride_os, m_safe, lse0, parts0, CHUNK_S
    )
    out = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(O + t * stride_out_t + h * stride_out_h + offs_dv, out.to(O.dtype.element_ty), mask=dv_ok)
    if STORE_LSE:
        if tl.program_id(2) == 0:
            total = tl.where(denom > 0, (m_safe + tl.log2(denom)) * LN2, float("-inf"))
            tl.store(LSE + t * stride_lse_t + h * stride_lse_h, total)


@triton.jit
def _merge_tail_kernel(
    O_part,
    L_part,
    O,
    Q,
    K_Ext,
    V_Ext,
    q_indptr,
    kv_indptr,
    mask_ptr,
    mask_indptr,
    n_slots,
    batch,
    kv_group,
    tail_scale,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_out_t,
    stride_out_h,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    Lk: tl.constexpr,
    Lv: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The merge of the prefix splits with the draft tail computed in place: one program per (token, head,
    slice of the value dims) scores the token's query against its request's draft tokens under the tree
    mask (fp32, BLOCK_DK dims at a time), then weighs that result and every split's by exp2(lse - max).
    Saves the separate tail pass and its round trip through O_part.

    The program is a chain of memory latencies, so the loads come in two rounds: first all that depend on
    nothing (the splits' log-sum-exps, the request pointers of the whole batch, from which the token's
    request is picked in registers), then the splits' first chunk of partial results and the tail's keys,
    values and mask."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < Lv
    row_o = t * stride_ot + h * stride_oh
    row_l = t * stride_lt + h * stride_lh
    offs_s = tl.arange(0, BLOCK_S)
    lse_all = tl.load(L_part + row_l + offs_s, mask=offs_s < n_slots, other=float("-inf"))
    lse0 = _slot_lse(L_part, row_l, n_slots, 0, CHUNK_S)
    # The request of token t (the number of requests that end at or before it) and its pointers.
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < batch
    q_lo = tl.load(q_indptr + offs_b, mask=b_ok, other=0)
    q_hi = tl.load(q_indptr + 1 + offs_b, mask=b_ok, other=2147483647)
    kv_lo = tl.load(kv_indptr + offs_b, mask=b_ok, other=0)
    kv_hi = tl.load(kv_indptr + 1 + offs_b, mask=b_ok, other=0)
    m_lo = tl.load(mask_indptr + offs_b, mask=b_ok, other=0)
    offs_k = tl.arange(0, BLOCK_DK)
    q_row = Q + t * stride_qt + h * stride_qh
    b = tl.sum((q_hi <= t).to(tl.int32), 0)
    mine = offs_b == b
    q_start = tl.sum(tl.where(mine, q_lo, 0), 0)
    n_tok = tl.sum(tl.where(mine, q_hi, 0), 0) - q_start
    kv_len = tl.sum(tl.where(mine, kv_hi - kv_lo, 0), 0)
    m_start = tl.sum(tl.where(mine, m_lo, 0), 0)
    t_loc = t - q_start
    kvh = h // kv_group
    offs_n = tl.arange(0, BLOCK_N)
    col_ok = offs_n < n_tok
    k_rows = K_Ext + (q_start + offs_n)[:, None] * stride_kt + kvh * stride_kh
    parts0 = _slot_parts(O_part, row_o, offs_dv, dv_ok, stride_os, 0, lse0, CHUNK_S)
    allowed = tl.load(mask_ptr + m_start + t_loc * (kv_len + n_tok) + kv_len + offs_n, mask=col_ok, other=0)
    v = tl.load(
        V_Ext + (q_start + offs_n)[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
        mask=col_ok[:, None] & dv_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    scores = tl.zeros([BLOCK_N], dtype=tl.float32)
    for d0 in tl.static_range(0, Lk, BLOCK_DK):
        offs_d = d0 + offs_k
        d_ok = offs_d < Lk
        q = tl.load(q_row + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        k = tl.load(k_rows + offs_d[None, :], mask=col_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        scores += tl.sum(k * q[None, :], 1)
    scores = tl.where((allowed != 0) & col_ok, scores * tail_scale, float("-inf"))
    m_tail = tl.max(scores, 0)
    m_tail_safe = tl.where(m_tail == float("-inf"), 0.0, m_tail)
    p = tl.exp2(scores - m_tail_safe)
    l_tail = tl.sum(p, 0)
    o_tail = tl.sum(p[:, None] * v, 0)  # not yet divided by l_tail
    lse_tail = tl.where(l_tail > 0, m_tail_safe + tl.log2(tl.where(l_tail > 0, l_tail, 1.0)), float("-inf"))

    m = tl.maximum(tl.max(lse_all, 0), lse_tail)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w_tail = tl.where(lse_tail > float("-inf"), tl.exp2(lse_tail - m_safe), 0.0)
    acc, denom = _merge_slots(
        O_part, L_part, row_o, row_l, offs_dv, dv_ok, n_slots, stride_os, m_safe, lse0, parts0, CHUNK_S
    )
    acc += o_tail * (w_tail / tl.where(l_tail > 0, l_tail, 1.0))
    denom += w_tail
    out = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(O + t * stride_out_t + h * stride_out_h + offs_dv, out.to(O.dtype.element_ty), mask=dv_ok)


def _shared_args(q, k, v, o_part, l_part, n_kv, group, n_head_blocks, splits) -> tuple:
    """The strides and counts the prefix and tail kernels take in the same order."""
    return (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        o_part.stride(0),
        o_part.stride(1),
        o_part.stride(2),
        l_part.stride(0),
        l_part.stride(1),
        n_kv,
        group,
        n_head_blocks,
        splits,
    )


def _v_shares_k(k_buffer: torch.Tensor, v_buffer: torch.Tensor, block_d: int, lv: int) -> bool:
    return (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.dtype == k_buffer.dtype
        and v_buffer.stride()[:2] == k_buffer.stride()[:2]
        and lv == block_d
    )


def call_of(
    q, k_buffer, v_buffer, o, q_indptr, kv_indptr, kv_indices, batch, max_tokens, tail=None, lse_out=None
) -> "routes.Call":
    """What the route needs to know of a call of :func:`_run_split_attention` (same arguments): its shape and
    dtypes, the GPU's SM count, and what the CUDA kernels offer it (compiled at first use where they take it)."""
    lk, lv = q.shape[-1], v_buffer.shape[-1]
    n_kv = k_buffer.shape[-2]
    decode = q_indptr is None
    v_from_k = _v_shares_k(k_buffer, v_buffer, head_dim_split(lk)[0], lv)
    cuda = None
    # decode has no query pointers yet: kv_indptr stands in for their dtype and layout checks
    if (
        v_from_k
        and cuda_prefix.serves(q, k_buffer, kv_indptr if decode else q_indptr, kv_indptr, kv_indices, n_kv)
        and cuda_prefix.kernel(q.device) is not None
    ):
        one_launch = cuda_prefix.output_fits(o, lse_out) and (tail is None or cuda_prefix.fused_fits(q, o, *tail))
        cuda = routes.Cuda(
            cuda_prefix.ROWS,
            cuda_prefix.ROWS16,
            cuda_prefix.FUSED_MAX_SLOTS,
            cuda_prefix.fused_capacity(q, k_buffer, kv_indices, cuda_prefix.ROWS),
            cuda_prefix.fused_capacity(q, k_buffer, kv_indices, cuda_prefix.ROWS16),
            one_launch,
        )
    return routes.Call(
        decode,
        batch,
        max_tokens,
        q.shape[1],
        n_kv,
        lk,
        lv,
        str(k_buffer.dtype).replace("torch.", ""),
        tail is not None,
        _sm_count(q),
        v_from_k,
        cuda,
        cuda_prefix.fp8_mma_setting(),
    )


def _run_split_attention(
    q,
    k_buffer,
    v_buffer,
    o,
    q_indptr,
    kv_indptr,
    kv_indices,
    batch,
    max_tokens,
    sm_scale,
    k_scale,
    v_scale,
    tail=None,
    lse_out=None,
    route=None,
):
    """Attention of ``q`` over each request's prefix (and, for verify, its draft ``tail`` = (k_ext, v_ext, mask,
    mask_indptr)) into ``o`` (and each row's log-sum-exp into ``lse_out`` where given), by ``route``: by default
    the route :func:`sm120_mla_route.choose` picks for the call (:func:`call_of`)."""
    if route is None:
        route = routes.choose(
            call_of(q, k_buffer, v_buffer, o, q_indptr, kv_indptr, kv_indices, batch, max_tokens, tail, lse_out)
        )
    decode = q_indptr is None
    if decode and route.path != routes.TRITON:  # the CUDA kernel takes a request's query rows from q_indptr
        q_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    qk_scale = float(sm_scale) * float(k_scale) * LOG2E
    if route.path in (routes.CUDA16_ONE_LAUNCH, routes.CUDA64_ONE_LAUNCH):
        rows = cuda_prefix.ROWS16 if route.path == routes.CUDA16_ONE_LAUNCH else cuda_prefix.ROWS
        shape = (q.shape[0], q.shape[1], route.splits + (tail is not None))
        o_part = torch.empty(shape + (o.shape[-1],), dtype=torch.bfloat16, device=q.device)
        l_part = torch.empty(shape, dtype=torch.float32, device=q.device)
        if not cuda_prefix.fused_pass(
            q,
            k_buffer,
            q_indptr,
            kv_indptr,
            kv_indices,
            tail,
            o_part,
            l_part,
            o,
            qk_scale,
            float(v_scale),
            float(sm_scale) * LOG2E,
            batch,
            max_tokens,
            route.splits,
            route.min_chunk,
            rows,
            lse_out,
            route.fp8_mma,
        ):
            raise RuntimeError(f"the CUDA kernel declined the route it was given: {route}")
        return
    slots = route.splits + (route.tail == "own pass")
    o_part = torch.empty((q.shape[0], q.shape[1], slots, v_buffer.shape[-1]), dtype=torch.float32, device=q.device)
    l_part = torch.empty((q.shape[0], q.shape[1], slots), dtype=torch.float32, device=q.device)
    if route.path == routes.CUDA64:
        cuda_prefix.prefix_pass(
            q,
            k_buffer,
            q_indptr,
            kv_indptr,
            kv_indices,
            o_part,
            l_part,
            qk_scale,
            float(v_scale),
            batch,
            max_tokens,
            route.splits,
            route.min_chunk,
            route.fp8_mma,
        )
    else:
        _triton_prefix(
            route,
            q,
            k_buffer,
            v_buffer,
            q_indptr if not decode else kv_indptr,
            kv_indptr,
            kv_indices,
            o_part,
            l_part,
            batch,
            max_tokens,
            qk_scale,
            float(v_scale),
            decode,
        )
    if route.tail == "own pass":
        _triton_tail(route, q, k_buffer, tail, q_indptr, kv_indptr, o_part, l_part, batch, max_tokens, sm_scale)
    _triton_merge(
        route, q, k_buffer, tail, q_indptr, kv_indptr, o_part, l_part, o, lse_out, batch, max_tokens, sm_scale
    )


def _blocks(route, q, k_buffer, max_tokens) -> tuple[int, int, int]:
    """(KV heads, head blocks, row blocks) of a Triton prefix or tail pass."""
    n_kv = k_buffer.shape[-2]
    n_head_blocks = -(-(q.shape[1] // n_kv) // route.tiles.block_h)
    return n_kv, n_head_blocks, n_head_blocks * -(-max_tokens // route.tiles.block_t)


def _triton_prefix(
    route,
    q,
    k_buffer,
    v_buffer,
    q_indptr,
    kv_indptr,
    kv_indices,
    o_part,
    l_part,
    batch,
    max_tokens,
    qk_scale,
    v_scale,
    decode,
):
    """The Triton prefix pass: every split's partial result into o_part/l_part."""
    cfg, lk, lv = route.tiles, q.shape[-1], v_buffer.shape[-1]
    n_kv, n_head_blocks, rows_blocks = _blocks(route, q, k_buffer, max_tokens)
    block_d, block_dpe = head_dim_split(lk)
    grid = (rows_blocks, route.splits, batch * n_kv)
    if route.pair:
        _prefix_pair_kernel[grid](
            q,
            k_buffer,
            q_indptr,
            kv_indptr,
            kv_indices,
            o_part,
            l_part,
            qk_scale,
            v_scale,
            q.stride(0),
            q.stride(1),
            k_buffer.stride(0),
            k_buffer.stride(1),
            o_part.stride(0),
            o_part.stride(1),
            o_part.stride(2),
            l_part.stride(0),
            l_part.stride(1),
            n_kv,
            q.shape[1] // n_kv,
            n_head_blocks,
            route.splits,
            BLOCK_D=block_d,
            BLOCK_DPE=block_dpe,
            BLOCK_T=cfg.block_t,
            BLOCK_H=cfg.block_h,
            BLOCK_N=cfg.block_n,
            MIN_SPLIT=route.min_chunk,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        return
    _prefix_kernel[grid](
        q,
        k_buffer,
        v_buffer,
        q_indptr,
        kv_indptr,
        kv_indices,
        o_part,
        l_part,
        qk_scale,
        v_scale,
        *_shared_args(q, k_buffer, v_buffer, o_part, l_part, n_kv, q.shape[1] // n_kv, n_head_blocks, route.splits),
        Lk=lk,
        Lv=lv,
        BLOCK_D=block_d,
        BLOCK_DPE=block_dpe,
        BLOCK_DV=_pow2_at_least(lv),
        BLOCK_T=cfg.block_t,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        MIN_SPLIT=route.min_chunk,
        IS_DECODE=decode,
        V_FROM_K=route.v_from_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def _triton_tail(route, q, k_buffer, tail, q_indptr, kv_indptr, o_part, l_part, batch, max_tokens, sm_scale):
    """The draft tail's own pass: its partial result into the last slot."""
    k_ext, v_ext, custom_mask, mask_indptr = tail
    cfg, lk, lv = route.tiles, q.shape[-1], o_part.shape[-1]
    n_kv, n_head_blocks, _ = _blocks(route, q, k_buffer, max_tokens)
    block_d, block_dpe = head_dim_split(lk)
    tail_n = max(16, _pow2_at_least(max_tokens))
    tail_t = max(1, min(cfg.block_t, 16 // min(cfg.block_h, 16)))
    tail_t = max(tail_t, -(-16 // cfg.block_h))
    _tail_kernel[(n_head_blocks * -(-max_tokens // tail_t), batch * n_kv)](
        q,
        k_ext,
        v_ext,
        q_indptr,
        kv_indptr,
        custom_mask,
        mask_indptr,
        o_part,
        l_part,
        float(sm_scale) * LOG2E,
        *_shared_args(q, k_ext, v_ext, o_part, l_part, n_kv, q.shape[1] // n_kv, n_head_blocks, route.splits),
        Lk=lk,
        Lv=lv,
        BLOCK_D=block_d,
        BLOCK_DPE=block_dpe,
        BLOCK_DV=_pow2_at_least(lv),
        BLOCK_T=tail_t,
        BLOCK_H=cfg.block_h,
        BLOCK_N=tail_n,
        num_warps=4,
        num_stages=1,
    )


def _triton_merge(
    route, q, k_buffer, tail, q_indptr, kv_indptr, o_part, l_part, o, lse_out, batch, max_tokens, sm_scale
):
    """The merge of the slots into ``o`` (the draft tail scored in place where the route says so)."""
    total_tokens, heads, n_slots, lv = o_part.shape
    merge_dv, merge_chunk, merge_warps = route.merge
    if route.tail == "merge":
        k_ext, v_ext, custom_mask, mask_indptr = tail
        _merge_tail_kernel[(total_tokens, heads, -(-lv // merge_dv))](
            o_part,
            l_part,
            o,
            q,
            k_ext,
            v_ext,
            q_indptr,
            kv_indptr,
            custom_mask,
            mask_indptr,
            n_slots,
            batch,
            heads // k_buffer.shape[-2],
            float(sm_scale) * LOG2E,
            o_part.stride(0),
            o_part.stride(1),
            o_part.stride(2),
            l_part.stride(0),
            l_part.stride(1),
            o.stride(0),
            o.stride(1),
            q.stride(0),
            q.stride(1),
            k_ext.stride(0),
            k_ext.stride(1),
            v_ext.stride(0),
            v_ext.stride(1),
            Lk=q.shape[-1],
            Lv=lv,
            BLOCK_DK=TAIL_BLOCK_DK,
            BLOCK_DV=merge_dv,
            BLOCK_S=_pow2_at_least(n_slots),
            CHUNK_S=merge_chunk,
            BLOCK_B=max(2, _pow2_at_least(batch)),
            BLOCK_N=max(16, _pow2_at_least(max_tokens)),
            num_warps=merge_warps,
        )
        return
    store_lse = lse_out is not None
    lse_t = lse_out if store_lse else l_part
    _merge_kernel[(total_tokens, heads, -(-lv // merge_dv))](
        o_part,
        l_part,
        o,
        lse_t,
        n_slots,
        o_part.stride(0),
        o_part.stride(1),
        o_part.stride(2),
        l_part.stride(0),
        l_part.stride(1),
        o.stride(0),
        o.stride(1),
        lse_t.stride(0),
        lse_t.stride(1),
        Lv=lv,
        BLOCK_DV=merge_dv,
        BLOCK_S=_pow2_at_least(n_slots),
        CHUNK_S=merge_chunk,
        STORE_LSE=store_lse,
        num_warps=merge_warps,
    )


_QDTYPES = (torch.bfloat16, torch.float16, torch.float32)
_KVDTYPES = _QDTYPES + tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def _scale(value) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.item())
    return 1.0 if value is None else float(value)


def _unset(value) -> bool:
    """An argument this module does not know is harmless only when it holds its "off" value."""
    return value is None or (isinstance(value, (bool, int, float)) and value in (False, 0, -1))


def _shapes_ok(q, k_buffer, v_buffer, o) -> bool:
    if q.dim() != 3 or k_buffer.dim() != 3 or v_buffer.dim() != 3 or o.dim() != 3:
        return False
    if q.dtype not in _QDTYPES or k_buffer.dtype not in _KVDTYPES or v_buffer.dtype not in _KVDTYPES:
        return False
    lk, lv = q.shape[-1], v_buffer.shape[-1]
    n_kv = k_buffer.shape[-2]
    if k_buffer.shape[-1] != lk or n_kv == 0 or q.shape[1] % n_kv or v_buffer.shape[-2] != n_kv:
        return False
    if head_dim_split(lk) is None or lv > 512 or o.shape[-1] != lv or q.stride(-1) != 1:
        return False
    return k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1 and o.stride(-1) == 1


def sm120_tree_verify_fwd(
    q_extend,
    k_extend,
    v_extend,
    o_extend,
    k_buffer,
    v_buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    custom_mask,
    is_causal,
    mask_indptr,
    max_len_extend,
    k_scale=1.0,
    v_scale=1.0,
    sm_scale=None,
    logit_cap=0.0,
    skip_prefix_custom_mask=True,
    sliding_window_size=-1,
    sinks=None,
    window_kv_offsets=None,
    xai_temperature_len=-1,
    lse_extend=None,
    skip_prefix=False,
    skip_extend=False,
    page_size=1,
    score_mod=None,
    aux_tensors=None,
    extend_seq_lens_cpu=None,
    identity_kv_indices=False,
    **unknown,
) -> bool:
    """Speculative verify against a long shared prefix, any tree mask: the prefix split across many
    programs, the draft tail under ``custom_mask``, then a log-sum-exp merge. Arguments are those of
    the release's ``extend_attention_fwd``. Returns False, having written nothing, when the call is
    not one it serves (no custom mask, a masked prefix, sliding window, sinks, soft cap, score_mod,
    LSE output, a tail over MAX_TAIL tokens, an unknown argument with a value)."""
    if custom_mask is None or mask_indptr is None or not skip_prefix_custom_mask:
        return False
    if any(not _unset(v) for v in unknown.values()):
        return False
    if (
        (sliding_window_size is not None and sliding_window_size > 0)
        or sinks is not None
        or window_kv_offsets is not None
        or (xai_temperature_len is not None and xai_temperature_len > 0)
        or (logit_cap is not None and logit_cap > 0)
        or lse_extend is not None
        or skip_prefix
        or skip_extend
        or score_mod is not None
        or aux_tensors is not None
        or identity_kv_indices
    ):
        return False
    max_len = int(max_len_extend)
    if max_len < 1 or max_len > MAX_TAIL:
        return False
    if not _shapes_ok(q_extend, k_buffer, v_buffer, o_extend):
        return False
    if k_extend.dim() != 3 or v_extend.dim() != 3 or k_extend.shape[-1] != q_extend.shape[-1]:
        return False
    if k_extend.shape[-2] != k_buffer.shape[-2] or v_extend.shape[-1] != v_buffer.shape[-1]:
        return False
    if custom_mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        return False
    lk = q_extend.shape[-1]
    batch = qo_indptr.shape[0] - 1
    if batch < 1:
        return False
    scale = float(sm_scale) if sm_scale else 1.0 / (lk**0.5)
    mask = custom_mask.view(torch.int8) if custom_mask.dtype == torch.bool else custom_mask
    _run_split_attention(
        q_extend,
        k_buffer,
        v_buffer,
        o_extend,
        qo_indptr,
        kv_indptr,
        kv_indices,
        batch,
        max_len,
        scale,
        _scale(k_scale),
        _scale(v_scale),
        tail=(k_extend, v_extend, mask, mask_indptr),
    )
    return True


def sm120_mla_decode_fwd(
    q,
    k_buffer,
    v_buffer,
    o,
    kv_indptr,
    kv_indices,
    attn_logits=None,
    attn_lse=None,
    num_kv_splits=None,
    max_kv_splits=None,
    sm_scale=None,
    k_scale=1.0,
    v_scale=1.0,
    logit_cap=0.0,
    sinks=None,
    xai_temperature_len=-1,
    has_mla=None,
    use_pdl=False,
    page_size=1,
    score_mod=None,
    aux_tensors=None,
    enable_lean=None,
    **unknown,
) -> bool:
    """MLA decode (one latent KV head, head dim 576/512 or any qk dim > v dim) with KV splits sized
    from the GPU's SM count and each request's length, no fixed cap. Arguments are those of the
    release's ``decode_attention_fwd``; returns False, having written nothing, for a case it does
    not serve (not MLA-shaped, soft cap, sinks, score_mod, temperature scaling)."""
    if any(
        v is not None and not isinstance(v, (bool, int, float))
        for k, v in unknown.items()
        if not k.startswith("lean_") and k != "uneven_batch"
    ):
        return False
    if (
        (logit_cap is not None and logit_cap > 0)
        or sinks is not None
        or (xai_temperature_len is not None and xai_temperature_len > 0)
        or score_mod is not None
        or aux_tensors is not None
    ):
        return False
    # enable_lean and the lean_* buffers select a ROCm-only kernel; SGLang's CUDA path ignores them (its
    # capture policy sets enable_lean for MLA batches of 8 and more on every GPU), and so does this one.
    if not _shapes_ok(q, k_buffer, v_buffer, o):
        return False
    lk, lv = q.shape[-1], v_buffer.shape[-1]
    if k_buffer.shape[-2] != 1 or lk <= lv or has_mla is False:
        return False
    batch = q.shape[0]
    if batch < 1 or kv_indptr.shape[0] - 1 < batch:
        return False
    scale = float(sm_scale) if sm_scale else 1.0 / (lk**0.5)
    lse_out = None
    if attn_lse is not None and attn_lse.dim() == 3 and attn_lse.shape[0] >= batch:
        lse_out = attn_lse[:batch, :, 0]
    _run_split_attention(
        q,
        k_buffer,
        v_buffer,
        o,
        None,
        kv_indptr,
        kv_indices,
        batch,
        1,
        scale,
        _scale(k_scale),
        _scale(v_scale),
        lse_out=lse_out,
    )
    return True
