"""Compile the tl.dot Triton kernels of an SGLang release for sm_120 and report their shared memory.

Each entry below names one kernel (file:function, as in docs/audit.md's "Kernel survey" table), the
model shape it is compiled for, and how: SGLang's own launcher called with ``meta`` tensors under a
faked 12.x device (every launch becomes a real Triton compile for the target, nothing runs), or, where a
launcher cannot be driven that way, the kernel launched directly with the constexprs its launcher picks
on 12.x. The result is JSON: for each entry the kernels Triton compiled, their constexprs, warps, stages
and ``metadata.shared``, and a verdict against the 101376-byte limit.

    python scripts/survey_kernels.py [--release 0.5.23] [--arch 12.0|12.1] [--only SUBSTRING ...] [--list]
                                     [--triton-dir DIR]

Autotuned kernels are compiled for every config (the autotuner's caches are cleared first; one fitting config
is enough, as Triton drops configs that raise OutOfResources). Kernels whose tiles come from a plan table are
compiled for every distinct tile set of the table 12.x reads. ``NOT_LAUNCHED`` lists the surveyed kernels no
CUDA launch reaches, with the code that decides it. Triton 3.9 removed ``tl.make_block_ptr``: the FLA entries
compile only with an older Triton given by ``--triton-dir`` (3.8.0 was used for docs/audit.md).

The release comes from ``sm120kit.sglang.releases.fetch_release`` (``SM120KIT_CACHE_DIR`` picks the cache).
Runs on a CPU-only machine (about 3 minutes for all entries with an empty Triton cache, 2 cores): Triton's
compiler and ptxas are the real ones, the device is not. Exit code 1
when any entry is over the limit, 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from types import SimpleNamespace

LIMIT = {"12.0": 101376, "12.1": 101376}

ENTRIES: list[dict] = []


def entry(
    kernel: str, shape: str, kernels: tuple[str, ...] | None = None, how: str = "launcher", autotuned: bool = False
):
    """Register a survey entry. ``kernel`` is "file.py:function" relative to ``sglang/``; ``kernels`` the
    compiled function names that belong to it (default: the function named in ``kernel``)."""

    def wrap(fn):
        ENTRIES.append(
            {
                "kernel": kernel,
                "shape": shape,
                "how": how,
                "run": fn,
                "autotuned": autotuned,
                "names": kernels or (kernel.rsplit(":", 1)[1],),
            }
        )
        return fn

    return wrap


def mod(path: str):
    return importlib.import_module("sglang." + path.removesuffix(".py").replace("/", "."))


def meta(*shape, dtype=None):
    import torch

    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device="meta")


def i32(*shape):
    import torch

    return meta(*shape, dtype=torch.int32)


def i64(*shape):
    import torch

    return meta(*shape, dtype=torch.int64)


def f32(*shape):
    import torch

    return meta(*shape, dtype=torch.float32)


def untuned(kernel):
    """Make a Triton autotuner benchmark (here: compile) every config again: no in-memory or on-disk result."""
    from triton.runtime.autotuner import Autotuner

    node = kernel
    while node is not None and not isinstance(node, Autotuner):
        node = getattr(node, "fn", None)
    if node is not None:
        node.cache = {}
        node.cache_results = False
    return kernel


class meta_is_device_0:
    """Launchers that ask ``torch.cuda.get_device_properties(x.device)`` of their input get the faked
    device's answer for a ``meta`` tensor (the faked device only knows CUDA indices)."""

    def __enter__(self):
        import torch

        self.torch, self.original = torch, torch.cuda.get_device_properties

        def props(device=None):
            if isinstance(device, torch.device) and device.type == "meta":
                device = 0
            return self.original(device)

        torch.cuda.get_device_properties = props
        return self

    def __exit__(self, *exc):
        self.torch.cuda.get_device_properties = self.original
        return False


# ---------------------------------------------------------------------------------------------------------
# LoRA (dense): Llama-3-8B (hidden 4096, q 4096, kv 1024, intermediate 14336), rank 64, 4 adapters,
# 4 sequences of 256 tokens (a prefill batch; the tiles do not depend on the token count).
S_TOK, N_SEQ, N_LORA, RANK = 1024, 4, 4, 64


def lora_batch(sorted_: bool = False):
    return SimpleNamespace(
        use_cuda_graph=False,
        bs=N_SEQ,
        num_segments=N_SEQ,
        seg_indptr=i32(N_SEQ + 1),
        weight_indices=i32(N_SEQ),
        lora_ranks=i32(N_LORA),
        scalings=f32(N_LORA),
        max_len=256,
        seg_lens=i32(N_SEQ),
        permutation=i64(S_TOK) if sorted_ else None,
        expected_tokens=S_TOK,
        has_active_lora=True,
        is_prefill=True,
    )


LLAMA8B_LORA = "Llama-3-8B LoRA rank 64, 4 adapters, 1024 tokens, bf16"

for _pkg in ("dense", "dense/trtllm_lora_temp"):

    def _register(pkg=_pkg):
        @entry(f"kernels/ops/lora/{pkg}/sgemm_lora_a.py:_sgemm_lora_a_kernel", LLAMA8B_LORA + ", qkv stack 3, K 4096")
        def _():
            mod(f"kernels/ops/lora/{pkg}/sgemm_lora_a.py").sgemm_lora_a_fwd(
                meta(S_TOK, 4096), meta(N_LORA, 3 * RANK, 4096), lora_batch(), stack_num=3
            )

        @entry(f"kernels/ops/lora/{pkg}/sgemm_lora_b.py:_sgemm_lora_b_kernel", LLAMA8B_LORA + ", o_proj N 4096")
        def _():
            mod(f"kernels/ops/lora/{pkg}/sgemm_lora_b.py").sgemm_lora_b_fwd(
                meta(S_TOK, RANK), meta(N_LORA, 4096, RANK), lora_batch()
            )

        @entry(f"kernels/ops/lora/{pkg}/qkv_lora_b.py:_qkv_lora_b_kernel", LLAMA8B_LORA + ", q 4096 kv 1024")
        def _():
            mod(f"kernels/ops/lora/{pkg}/qkv_lora_b.py").qkv_lora_b_fwd(
                meta(S_TOK, 3 * RANK), meta(N_LORA, 4096 + 2 * 1024, RANK), lora_batch(), i32(4), 4096
            )

        @entry(
            f"kernels/ops/lora/{pkg}/gate_up_lora_b.py:_gate_up_lora_b_kernel", LLAMA8B_LORA + ", intermediate 14336"
        )
        def _():
            mod(f"kernels/ops/lora/{pkg}/gate_up_lora_b.py").gate_up_lora_b_fwd(
                meta(S_TOK, 2 * RANK), meta(N_LORA, 2 * 14336, RANK), lora_batch(), 14336
            )

    _register()


# Absorbed-MLA kv_b_proj LoRA: DeepSeek-V3 / Kimi-K2.5 at TP 8 (16 heads), qk_nope 128, v_head 128,
# kv_lora_rank 512, LoRA rank 32.
MLA_LORA = "DeepSeek-V3 kv_b LoRA rank 32, 16 heads, qk_nope 128, v 128, kv_lora_rank 512, 1024 tokens, bf16"
MLA_H, MLA_R = 16, 32

for _pkg in ("dense", "dense/trtllm_lora_temp"):

    def _register(pkg=_pkg):
        path = f"kernels/ops/lora/{pkg}/kv_b_lora_absorbed.py"

        @entry(path + ":_step_a_q_kernel", MLA_LORA)
        def _():
            mod(path).step_a_q_fwd(meta(S_TOK, MLA_H, 128), meta(N_LORA, MLA_H * 256, MLA_R), lora_batch(), 256)

        @entry(path + ":_step_b_q_kernel", MLA_LORA)
        def _():
            mod(path).step_b_q_fwd(
                meta(S_TOK, MLA_H, MLA_R), meta(N_LORA, MLA_R, 512), lora_batch(), meta(S_TOK, MLA_H, 512)
            )

        @entry(path + ":_step_a_v_kernel", MLA_LORA)
        def _():
            mod(path).step_a_v_fwd(meta(S_TOK, MLA_H, 512), meta(N_LORA, MLA_R, 512), lora_batch())

        @entry(path + ":_step_b_v_kernel", MLA_LORA)
        def _():
            mod(path).step_b_v_fwd(
                meta(S_TOK, MLA_H, MLA_R),
                meta(N_LORA, MLA_H * 256, MLA_R),
                lora_batch(),
                meta(S_TOK, MLA_H, 128),
                128,
                128,
            )

    _register()


# Chunked SGMV (csgmv LoRA backend): BLOCK_M is the chunk size (16 up to 128); no tuned config files for
# 12.x devices ship, so the defaults apply (shrink BLOCK_N 16 / BLOCK_K 256, expand BLOCK_N 64 / BLOCK_K 16).
def chunk_batch(chunk: int):
    b = lora_batch()
    b.max_len = chunk
    b.num_segments = S_TOK // chunk
    b.seg_indptr = i32(b.num_segments + 1)
    b.weight_indices = i32(b.num_segments)
    b.permutation = i64(S_TOK)
    return b


for _chunk in (16, 128):

    def _register(chunk=_chunk):
        shape = f"Llama-3-8B LoRA rank 64, 4 adapters, chunk {chunk}, bf16"

        @entry("kernels/ops/lora/dense/chunked_sgmv_shrink.py:_chunked_lora_shrink_kernel", shape + ", qkv K 4096")
        def _():
            mod("kernels/ops/lora/dense/chunked_sgmv_shrink.py").chunked_sgmv_lora_shrink_forward(
                meta(S_TOK, 4096), meta(N_LORA, 3 * RANK, 4096), chunk_batch(chunk), 3
            )

        @entry(
            "kernels/ops/lora/dense/chunked_sgmv_expand.py:_chunked_lora_expand_kernel", shape + ", qkv 4096/1024/1024"
        )
        def _():
            import torch

            mod("kernels/ops/lora/dense/chunked_sgmv_expand.py").chunked_sgmv_lora_expand_forward(
                meta(S_TOK, 3 * RANK),
                meta(N_LORA, 6144, RANK),
                chunk_batch(chunk),
                i32(4),
                4096,
                None,
                slice_offsets_cpu=torch.tensor([0, 4096, 5120, 6144]),
            )

    _register()


@entry(
    "kernels/ops/lora/dense/chunked_sgmv_shrink.py:_chunked_lora_shrink_split_k_kernel",
    "Llama-3-8B LoRA rank 32 (the split-K policy's shape), chunk 16, qkv K 4096, split_k 8, bf16",
)
def _():
    mod("kernels/ops/lora/dense/chunked_sgmv_shrink.py").chunked_sgmv_lora_shrink_forward(
        meta(S_TOK, 4096), meta(N_LORA, 3 * 32, 4096), chunk_batch(16), 3, split_k=8
    )


# Chunked GDN / KDA (FLA): Qwen3-Next (16 q/k heads, 32 v heads, head dim 128) and Kimi-Linear
# (32 heads, head dim 128), one sequence of 4096 tokens, chunk 64, bf16.
FLA_T = 4096


@entry(
    "kernels/ops/attention/fla/chunk_o.py:chunk_fwd_kernel_o",
    "Qwen3-Next GDN: q/k 16 heads, v 32 heads, head dim 128, 4096 tokens, chunk 64, bf16",
)
def _():
    mod("kernels/ops/attention/fla/chunk_o.py").chunk_fwd_o(
        meta(1, FLA_T, 16, 128),
        meta(1, FLA_T, 16, 128),
        meta(1, FLA_T, 32, 128),
        meta(1, FLA_T // 64, 32, 128, 128),
        g=f32(1, FLA_T, 32),
    )


@entry(
    "kernels/ops/attention/fla/wy_fast.py:recompute_w_u_fwd_kernel",
    "Qwen3-Next GDN: k 16 heads, v 32 heads, head dim 128, 4096 tokens, chunk 64, bf16",
)
def _():
    mod("kernels/ops/attention/fla/wy_fast.py").recompute_w_u_fwd(
        meta(1, FLA_T, 16, 128),
        meta(1, FLA_T, 32, 128),
        meta(1, FLA_T, 32),
        f32(1, FLA_T, 32),
        meta(1, FLA_T, 32, 64),
        None,
    )


@entry(
    "kernels/ops/attention/fla/kda.py:_recompute_w_u_fwd_kernel",
    "Kimi-Linear KDA: 32 heads, head dim 128, 4096 tokens, chunk 64, bf16 (autotuned on 12.x: every config compiled)",
    autotuned=True,
)
def _():
    untuned(mod("kernels/ops/attention/fla/kda.py").recompute_w_u_fwd_kernel)
    mod("kernels/ops/attention/fla/kda.py").recompute_w_u_fwd(
        meta(1, FLA_T, 32, 128),
        meta(1, FLA_T, 32, 128),
        meta(1, FLA_T, 32),
        meta(1, FLA_T, 32, 64),
        gk=f32(1, FLA_T, 32, 128),
    )


# GEMMs.
def fp8(*shape):
    import torch

    return meta(*shape, dtype=torch.float8_e4m3fn)


def i8(*shape):
    import torch

    return meta(*shape, dtype=torch.int8)


for _m in (16, 4096):

    def _register(m=_m):
        @entry(
            "kernels/ops/gemm/fp8_kernel.py:_w8a8_block_fp8_matmul",
            f"DeepSeek-V3 block FP8 [128, 128], N 4096 K 7168, M {m} (no tuned file for 12.x devices: default config)",
        )
        def _():
            import torch

            mod("kernels/ops/gemm/fp8_kernel.py").w8a8_block_fp8_matmul_triton(
                fp8(m, 7168), fp8(4096, 7168), f32(m, 56), f32(32, 56), [128, 128], torch.bfloat16
            )

        @entry(
            "kernels/ops/gemm/int8_kernel.py:_w8a8_block_int8_matmul",
            f"block INT8 [128, 128], N 4096 K 7168, M {m} (no tuned file for 12.x devices: default config)",
        )
        def _():
            import torch

            mod("kernels/ops/gemm/int8_kernel.py").w8a8_block_int8_matmul(
                i8(m, 7168), i8(4096, 7168), f32(m, 56), f32(32, 56), [128, 128], torch.bfloat16
            )

    _register()

for _m, _dt in ((16, "fp8"), (4096, "fp8"), (16, "int8"), (4096, "int8")):

    def _register(m=_m, dt=_dt):
        @entry(
            "kernels/ops/gemm/fp8_kernel.py:scaled_mm_kernel",
            f"per-token/per-channel {dt} W8A8, N 14336 K 4096, M {m} (launcher's heuristic tiles)",
        )
        def _():
            import torch

            make = fp8 if dt == "fp8" else i8
            mod("kernels/ops/gemm/fp8_kernel.py").triton_scaled_mm(
                make(m, 4096), make(4096, 14336).t().contiguous().t(), f32(m, 1), f32(14336, 1), torch.bfloat16
            )

    _register()


@entry(
    "kernels/ops/gemm/router_gemv.py:_router_gemv_kernel",
    "fp32 router gate (the CUDA configs), 256 experts, hidden 7168, M 8",
)
def _():
    mod("kernels/ops/gemm/router_gemv.py").router_gemv(meta(8, 7168), f32(256, 7168))


@entry(
    "kernels/ops/moe/router.py:fused_moe_router_cudacore_kernel",
    "Grok-1 router: hidden 6144, 8 experts, top 2, bs 64, bf16",
)
def _():
    mod("kernels/ops/moe/router.py").fused_moe_router_cudacore(meta(64, 6144), meta(8, 6144), 2, 30.0)


@entry(
    "kernels/ops/moe/router.py:fused_moe_router_tensorcore_kernel",
    "Grok-1 router via fused_moe_router_shim: hidden 6144, 8 experts, top 2, bs 1024, bf16 (BLOCK 32x16x256)",
)
def _():
    mod("kernels/ops/moe/router.py").fused_moe_router_shim(30.0, meta(1024, 6144), meta(8, 6144), 2, False)


for _g in (1024, 2048, 4096, 8192):

    def _register(g=_g):
        @entry(
            "srt/layers/multi_gate.py:multi_gate_kernel",
            f"Bailing/Ling MoE multi-gate: hidden 4096, 256 experts, {g} grouped tokens, bf16",
        )
        def _():
            import os

            bias = f32(256)
            w = meta(256, 4096)
            # The kernel reads module globals that are not tl.constexpr (VISION_MODALITY ...); this
            # Triton refuses that unless TRITON_ALLOW_NON_CONSTEXPR_GLOBALS=1 (see the entry's note).
            previous = os.environ.get("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS")
            os.environ["TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"] = "1"
            try:
                mod("srt/layers/multi_gate.py").multi_gate_triton_kernel(
                    meta(g, 4096), (i64(g), i64(g)), w, w, w, bias, bias, bias
                )
            finally:
                if previous is None:
                    os.environ.pop("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", None)
                else:
                    os.environ["TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"] = previous

    _register()


@entry(
    "kernels/ops/attention/mla_qk_prep.py:absorbed_bmm_concat_cast_q_fp8_kernel",
    "DeepSeek-V3.2 DSA born-fp8 q: 16 heads (TP 8), qk_nope 128, kv_lora_rank 512, rope 64, 256 tokens",
)
def _():
    mod("kernels/ops/attention/mla_qk_prep.py").absorbed_bmm_concat_cast_q_fp8(
        fp8(256, 16, 576), meta(256, 16, 128), meta(16, 128, 512), meta(256, 16, 64), 16
    )


# Segmented linear attention (Bailing linear models): 16 heads, head dim 128, bf16; state fp32.
def seg_la_meta(bs: int, mask=None):
    return mod("kernels/ops/attention/linear/seg_la.py").SegLaMeta(
        batch_size=bs,
        max_q_length=0,
        q_offsets=i32(bs + 1),
        s_offsets=i32(bs),
        q_lengths=i32(bs),
        s_scales=i32(bs),
        mask=mask,
    )


for _bs, _len in ((1, 4096), (4, 4096)):

    def _register(bs=_bs, length=_len):
        @entry(
            "kernels/ops/attention/linear/seg_la.py:seg_la_p_kernel",
            f"Bailing linear: 16 heads, head dim 128, prefill of {bs} sequence(s), {length} tokens, bf16",
        )
        def _():
            mod("kernels/ops/attention/linear/seg_la.py").seg_la_fwd(
                meta(length, 16, 128),
                meta(length, 16, 128),
                meta(length, 16, 128),
                f32(8, 16, 128, 128),
                f32(16),
                seg_la_meta(bs),
            )

    _register()

for _drafts in (4, 16):

    def _register(drafts=_drafts):
        @entry(
            "kernels/ops/attention/linear/seg_la.py:seg_la_s_kernel",
            f"Bailing linear speculative verify: 16 heads, head dim 128, 4 requests x {drafts} draft tokens, bf16",
        )
        def _():
            import torch

            length = 4 * drafts
            mod("kernels/ops/attention/linear/seg_la.py").seg_la_fwd(
                meta(length, 16, 128),
                meta(length, 16, 128),
                meta(length, 16, 128),
                f32(8, 16, 128, 128),
                f32(16),
                seg_la_meta(4, mask=meta(4, drafts, drafts, dtype=torch.bool)),
            )

    _register()


# Attention: Llama-3-8B (head dim 128, 32/8 heads), Qwen3-Next full attention (head dim 256, 16/2 heads),
# DeepSeek-V3 MLA at TP 8 (576/512, 16 heads, one latent KV head); bf16.
ATTN_SHAPES = {
    "llama3-8b": (32, 8, 128, 128),
    "qwen3-next-hd256": (16, 2, 256, 256),
    "deepseek-v3-mla": (16, 1, 576, 512),
}

for _name, (_hq, _hkv, _dk, _dv) in ATTN_SHAPES.items():

    def _register(name=_name, hq=_hq, hkv=_hkv, dk=_dk, dv=_dv):
        @entry(
            "kernels/ops/attention/extend_attention.py:_fwd_kernel_unified",
            f"{name}: hd {dk}/{dv}, heads {hq}/{hkv}, 2 sequences x 64 new tokens, 192 cached, bf16",
        )
        def _():
            n_tok, slots = 128, 4096
            mod("kernels/ops/attention/extend_attention.py").extend_attention_fwd_unified(
                meta(n_tok, hq, dk),
                meta(n_tok, hq, dv),
                meta(slots, hkv, dk),
                meta(slots, hkv, dv),
                1.0,
                1.0,
                i32(3),
                i32(3),
                i64(512),
                i32(2),
                64,
            )

    _register()

for _name, (_hq, _hkv, _dk, _dv), _lext in (
    ("deepseek-v3-mla", ATTN_SHAPES["deepseek-v3-mla"], 4),
    ("deepseek-v3-mla", ATTN_SHAPES["deepseek-v3-mla"], 8),
    ("qwen3.5 hd256 GQA (16/2 heads)", (16, 2, 256, 256), 4),
):

    def _register(name=_name, hq=_hq, hkv=_hkv, dk=_dk, dv=_dv, lext=_lext):
        @entry(
            "kernels/ops/attention/verify_mla.py:_verify_mla_prefix_stage1",
            f"{name}: hd {dk}/{dv}, heads {hq}/{hkv}, target verify of {lext} draft tokens, bs 8, bf16",
        )
        def _():
            m = mod("kernels/ops/attention/verify_mla.py")
            vk = m._get_vmla(8, hq, dk, dv, lext, "meta", kv_group_num=hq // hkv)
            vk._run_prefix_kernel(
                8,
                vk._num_splits(8),
                meta(8 * lext, hq, dk),
                meta(4096, hkv, dk),
                meta(4096, hkv, dv),
                i32(9),
                i32(9),
                i64(8192),
                0.1,
                1.0,
                1.0,
            )

    _register()

for _name, (_hq, _hkv, _dk, _dv) in (
    ("llama3-8b", ATTN_SHAPES["llama3-8b"]),
    ("qwen3-next-hd256", ATTN_SHAPES["qwen3-next-hd256"]),
):

    def _register(name=_name, hq=_hq, hkv=_hkv, dk=_dk, dv=_dv):
        @entry(
            "kernels/ops/attention/verify_splitkv.py:_verify_prefix_stage1",
            f"{name}: hd {dk}/{dv}, heads {hq}/{hkv}, target verify of 4 draft tokens, bs 8, bf16",
        )
        def _():
            m = mod("kernels/ops/attention/verify_splitkv.py")
            vk = m._get_vk(8, hq, hkv, dk, dv, 4, "meta")
            vk._run_prefix_kernel(
                8, meta(32, hq, dk), meta(4096, hkv, dk), meta(4096, hkv, dv), i32(9), i32(9), i64(8192), 0.1, 1.0, 1.0
            )

    _register()


# DeepSeek-V4 fp4 indexer: 64 index heads, index head dim 128, page size 64 (68 bytes per token), 8 requests,
# 4096 compressed positions. `_fp4_index_logits_tile` is a helper inlined into these two kernels.
def u8(*shape):
    import torch

    return meta(*shape, dtype=torch.uint8)


@entry(
    "kernels/ops/attention/dsv4/fp4_indexer.py:_fp4_index_logits_tile",
    "DeepSeek-V4 indexer decode: 64 heads, head dim 128, page 64, bs 8, 4096 positions",
    kernels=("_fp4_index_logits_kernel",),
)
def _():
    mod("kernels/ops/attention/dsv4/fp4_indexer.py").fp4_index_logits_decode(
        meta(8, 64, 128), meta(8, 64), i64(8, 4096), i64(8), u8(1024, 64 * 68), 64
    )


@entry(
    "kernels/ops/attention/dsv4/fp4_indexer.py:_fp4_index_logits_tile",
    "DeepSeek-V4 indexer paged decode: 64 heads, head dim 128, page 64, bs 8, 4096 positions, ratio 1",
    kernels=("_fp4_index_logits_paged_kernel",),
)
def _():
    with meta_is_device_0():
        mod("kernels/ops/attention/dsv4/fp4_indexer.py").fp4_index_logits_paged(
            meta(8, 64, 128), meta(8, 64), i32(8), i32(16, 8192), i32(8), u8(1024, 64 * 68), 64, 4096, 1
        )


# MiniMax sparse attention decode (MiniMax-M2 shape: 48 q heads, 8 KV heads, head dim 128), sparse block 64.
@entry(
    "kernels/ops/attention/minimax_sparse/decode/topk_sparse.py:_gqa_share_sparse_decode_kernel_impl",
    "MiniMax sparse decode: 48/8 heads, head dim 128, sparse block 64, top-16 blocks, bs 8, bf16 "
    "(autotuned on 12.x: every config compiled)",
    autotuned=True,
)
def _():
    untuned(mod("kernels/ops/attention/minimax_sparse/decode/topk_sparse.py")._gqa_share_sparse_decode_kernel)
    mod("kernels/ops/attention/minimax_sparse/decode/topk_sparse.py").flash_decode_with_gqa_share_sparse(
        meta(8, 48, 128),
        None,
        meta(65536, 8, 128),
        meta(65536, 8, 128),
        i32(8, 32768),
        i32(8),
        i32(8),
        64,
        i32(8, 8, 16),
    )


for _packed, _name in ((1, "_score_shard"), (2, "_score_shard_packed")):

    def _register(packed=_packed, name=_name):
        @entry(
            f"kernels/ops/attention/minimax_sparse/decode/indexer_cp.py:{name}",
            f"MiniMax sparse indexer, context parallel over 4 ranks: index head dim 128, bs 8, "
            f"32768 tokens, packed_queries {packed}, bf16",
        )
        def _():
            mod("kernels/ops/attention/minimax_sparse/decode/indexer_cp.py").score_local_blocks(
                meta(4, 8, 128),
                meta(65536, 1, 128),
                i32(8, 32768),
                i32(8),
                i32(8),
                32768,
                0,
                1,
                4,
                0.088,
                1.0,
                packed_queries=packed,
            )

    _register()


# DeepSeek-V4 WO-A (TP 4): x [m, 2, 4096], weight [2, 1024, 4096], m 2..8, bf16. The launchers assert
# x.is_cuda, so the kernel is launched here exactly as `wo_a_bf16_small_batch` launches it.
@entry(
    "kernels/ops/gemm/dsv4_wo_a.py:_wo_a_partial",
    "DeepSeek-V4 WO-A at TP 4: x [8, 2, 4096], weight [2, 1024, 4096], bf16 (grid, warps and stages as "
    "wo_a_bf16_small_batch / wo_a_bf16_small_batch_mxfp8 pass them)",
    how="kernel",
)
def _():
    m = mod("kernels/ops/gemm/dsv4_wo_a.py")
    x = meta(8, 2, 4096)
    m._wo_a_partial[(16, 2, 8)](x, meta(2, 1024, 4096), f32(8, 8, 2, 1024), 8, x.stride(0), num_warps=4, num_stages=3)


@entry(
    "kernels/ops/gemm/hc_mix.py:_hc_mix_persistent_kernel",
    "hyper-connection mix (Qwen4-exp style): hidden 4096, 4 streams, low rank 16, 8 rows, bf16",
)
def _():
    with meta_is_device_0():
        mod("kernels/ops/gemm/hc_mix.py").fused_hc_mix(
            meta(8, 4 * 4096), meta(16, 4 * 4096), meta(4 * 4096, 16), 4, 4096
        )


for _m in (16, 4096):

    def _register(m=_m):
        @entry(
            "kernels/ops/layernorm/mhc.py:_hc_mix_stats_partial_kernel",
            f"DeepSeek-V4 mHC: hidden 7168, hc_mult 4 (K 28672, mix 24), {m} tokens",
        )
        def _():
            mod("kernels/ops/layernorm/mhc.py").hc_mix_stats(meta(m, 4 * 7168), f32(24, 4 * 7168), 1e-6)

    _register()


@entry(
    "kernels/ops/layernorm/mhc.py:_hc_mix_stats_bf16x3_kernel",
    "DeepSeek-V4 mHC: hidden 7168, hc_mult 4 (K 28672, mix 24), 4096 tokens, bf16x3 weights",
)
def _():
    w = meta(24, 4 * 7168)
    mod("kernels/ops/layernorm/mhc.py").hc_mix_stats_sinkhorn_bf16x3(
        meta(4096, 4 * 7168), (w, w, w), f32(3), f32(24), 20, 1e-6, 1e-6
    )


# GPTQ/AWQ MoE (moe_wna16): Qwen3-30B-A3B GPTQ-Int4 (128 experts, top 8, hidden 2048, intermediate 768, group
# 128) and int8 weight-only; config from SGLang's own chooser (no tuned int4/int8_w8a16 file ships for 12.x).
def moe_config_defaults():
    """The MoE config module reads server arguments; answer with SGLang's defaults (no server runs)."""
    from sm120kit.audit.kernel_probe import _ServingDefaults

    cfg = mod("srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py")
    for reader in ("get_global_server_args", "get_exec"):
        if hasattr(cfg, reader):
            setattr(cfg, reader, _ServingDefaults())
    return cfg


for _m, _bits in ((16, 4), (4096, 4), (16, 8), (4096, 8)):

    def _register(m=_m, bits=_bits):
        @entry(
            "kernels/ops/moe/fused_moe_triton_kernels.py:fused_moe_kernel_gptq_awq",
            f"Qwen3-30B-A3B int{bits} weight-only (E 128, top 8, H 2048, I 768, group 128), M {m}, bf16 "
            "activations; up and down projections",
        )
        def _():
            import torch
            import triton.language as tl

            cfg = moe_config_defaults()
            kern = mod("kernels/ops/moe/fused_moe_triton_kernels.py")
            E, topk, H, inter, group = 128, 8, 2048, 768, 128
            pack = 2 if bits == 4 else 1
            w1, w2 = u8(E, 2 * inter, H // pack), u8(E, H, inter // pack)
            dtype = cfg.get_config_dtype_str(torch.bfloat16, use_int8_w8a16=bits == 8, use_int4_w4a16=bits == 4)
            config, (down, _) = cfg.try_get_optimal_moe_config(
                w1.shape, w2.shape, topk, dtype, m, block_shape=[0, group], return_down_config=True
            )
            for proj, (A, B, C, k, mul, tk, conf) in {
                "up": (meta(m, H), w1, meta(m, topk, 2 * inter), H, False, topk, config),
                "down": (meta(m * topk, inter), w2, meta(m, topk, H), inter, True, 1, down or config),
            }.items():
                conf = dict(conf)
                conf.pop("USE_TMA", None)
                padded = m * topk + E * (conf["BLOCK_SIZE_M"] - 1)
                kern.invoke_fused_moe_kernel(
                    A,
                    B,
                    None,
                    C,
                    None,
                    meta(E, B.shape[1], k // group),
                    None,
                    f32(m, topk),
                    i32(m, topk),
                    i32(padded),
                    i32(-(-padded // conf["BLOCK_SIZE_M"])),
                    i32(1),
                    mul,
                    tk,
                    conf,
                    tl.bfloat16,
                    False,
                    False,
                    bits == 8,
                    bits == 4,
                    False,
                    block_shape=[0, group],
                )

    _register()


# QSA sparse GQA (Qwen sparse attention): 16 q / 2 KV heads, head dim 128 and 256, top-2048 KV indices, bf16.
# The tile table is picked by total query rows (device name not H20: the L20 table): 8 rows -> BLOCK_N 32,
# 64 rows -> BLOCK_N 64 (8 warps, 2 stages), 4096 rows -> BLOCK_N 16.
for _hd in (128, 256):
    for _tq in (8, 64, 4096):

        def _register(hd=_hd, tq=_tq):
            @entry(
                "srt/layers/attention/qsa/sparse_attn.py:_sparse_gqa_prefill",
                f"QSA sparse GQA prefill: 16/2 heads, head dim {hd}, {tq} query rows, top-2048, bf16",
            )
            def _():
                mod("srt/layers/attention/qsa/sparse_attn.py").sparse_gqa_fwd_interface_triton(
                    meta(tq, 16, hd), meta(65536, 2, hd), meta(65536, 2, hd), 4096, i32(tq, 2, 2048), i32(2), hd**-0.5
                )

            @entry(
                "srt/layers/attention/qsa/sparse_attn.py:_sparse_gqa_chunk_prefill",
                f"QSA sparse GQA chunked prefill: 16/2 heads, head dim {hd}, {tq} query rows, top-2048, bf16",
            )
            def _():
                mod("srt/layers/attention/qsa/sparse_attn.py").sparse_gqa_fwd_interface_triton_ck(
                    meta(tq, 16, hd),
                    meta(65536, 2, hd),
                    meta(65536, 2, hd),
                    i32(tq, 2, 2048),
                    i32(2),
                    i32(2),
                    i32(1),
                    hd**-0.5,
                    max_q=tq,
                )

        _register()


# SANA-WM camera-branch GDN scan (`cam_scan_bidi_chunkwise`, fp32 q/k/v): 20 heads, linear head dim 112,
# 11 frames of 920 tokens. Tiles come from the chunkwise table keyed by capability and the device's shared
# memory per SM (12.x with 100 KB: the "blackwell_spark" bucket).
SANA = dict(B=1, H=20, D=112, F=11, S=920)


def sana_cam_scan():
    B, H, D, F, S = SANA["B"], SANA["H"], SANA["D"], SANA["F"], SANA["S"]
    mod("kernels/ops/diffusion/attention/sana_wm_gdn_chunkwise_triton.py").cam_scan_bidi_chunkwise(
        f32(B, H, D, F * S), f32(B, H, D, F * S), f32(B, H, D, F * S), f32(B, H, F, S), f32(B, H, F)
    )


for _name, _note in (
    ("_phase_a_kv_kernel", ""),
    ("_phase_c_kernel", ""),
    ("_phase_b_dtile_kernel", " (12.0 only: _pick_phase_b_d_splits gives 12.1 the baseline kernel)"),
    ("_phase_b_kernel", " (12.1 only: _pick_phase_b_d_splits gives 12.0 the D-tile kernel)"),
):

    def _register(name=_name, note=_note):
        @entry(
            f"kernels/ops/diffusion/attention/sana_wm_gdn_chunkwise_triton.py:{name}",
            "SANA-WM camera GDN (cam_scan_bidi_chunkwise): 20 heads, head dim 112, 11 frames x 920 tokens, "
            "fp32, dot precision 0" + note,
        )
        def _():
            sana_cam_scan()

    _register()


@entry(
    "kernels/ops/diffusion/attention/sana_wm_gdn_chunkwise_triton.py:_phase_a_z_kernel",
    "SANA-WM GDN phase A with the denominator (skip_z=False): 20 heads, head dim 112, 11 frames x 920 tokens, fp32",
)
def _():
    m = mod("kernels/ops/diffusion/attention/sana_wm_gdn_chunkwise_triton.py")
    B, H, D, F, S = SANA["B"], SANA["H"], SANA["D"], SANA["F"], SANA["S"]
    import torch

    inv, nw, cos, sin = m._cam_identity_tables(B=B, N=F * S, H=H, D=D, device=torch.device("meta"))
    m.phase_a(f32(B, F * S, 3, H, D), f32(B, H, F, S), inv, inv, nw, nw, cos, sin, F=F, S=S)


# Sparse-linear attention (diffusion, Wan-style video DiT): head dim 64 and 128, BLOCK_M 64 / 128 (the two
# values the launcher allows), BLOCK_N 64, 3 stages; 12 heads, 32760 tokens, top-k 20% of KV blocks, bf16.
# The launcher (`_attention.forward` in multimodal_gen's sparse_linear_attn backend) imports the whole
# diffusion runtime, so the kernel is launched here with exactly its arguments, grid, warps and stages.
for _d in (64, 128):
    for _bm in (64, 128):

        def _register(d=_d, bm=_bm):
            @entry(
                "kernels/ops/diffusion/attention/sparse_linear_attn_triton.py:_attn_fwd",
                f"sparse-linear attention: 12 heads, head dim {d}, 32760 tokens, BLOCK_M {bm}, BLOCK_N 64, bf16",
                how="kernel",
            )
            def _():
                kern = mod("kernels/ops/diffusion/attention/sparse_linear_attn_triton.py")
                L, H = 32760, 12
                m_blocks, n_blocks = -(-L // bm), -(-L // 64)
                topk = n_blocks // 5
                q = meta(1, H, L, d)
                kern._attn_fwd[(m_blocks, H)](
                    q,
                    meta(1, H, L, d),
                    meta(1, H, L, d),
                    d**-0.5,
                    topk,
                    i32(1, H, m_blocks, topk),
                    f32(1, H, L),
                    meta(1, H, L, d),
                    L,
                    m_blocks,
                    d,
                    bm,
                    64,
                    num_warps=4 if d == 64 else 8,
                    num_stages=3,
                )

        _register()


# ReplaySSM (--enable-linear-replayssm): Qwen3-Next GDN (16 k heads, 32 v heads, head dim 128) and Kimi-Linear
# KDA (32 heads, head dim 128), ring length 16 (the default linear_replayssm_cache_len), bs 8, bf16; fp32 state.
RS_L, RS_B, RS_SLOTS = 16, 8, 64


@entry(
    "kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py:fused_recurrent_linear_replayssm_decode_kernel",
    "Kimi-Linear KDA decode (as kda_triton calls it): 32 heads, head dim 128, ring 16, bs 8, bf16",
)
def _():
    H = HV = 32
    K = V = 128
    mod("kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py").fused_recurrent_linear_replayssm_decode(
        meta(RS_B, 2 * H * K + HV * V),
        f32(RS_B, HV, K),
        meta(RS_B, HV),
        f32(HV),
        f32(HV, K),
        K**-0.5,
        f32(RS_SLOTS, HV, V, K),
        meta(RS_SLOTS, HV, RS_L, V),
        meta(RS_SLOTS, H, RS_L, K),
        f32(RS_SLOTS, HV, RS_L, K),
        meta(RS_B, 1, HV, V),
        i32(RS_B),
        i32(RS_B),
        use_qk_l2norm_in_kernel=True,
        is_kda=True,
    )


@entry(
    "kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py:fused_recurrent_linear_replayssm_decode_kernel",
    "Qwen3-Next GDN decode: 16/32 heads, head dim 128, ring 16, bs 8, bf16",
)
def _():
    H, HV, K, V = 16, 32, 128, 128
    mod("kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py").fused_recurrent_linear_replayssm_decode(
        meta(RS_B, 2 * H * K + HV * V),
        meta(RS_B, HV),
        meta(RS_B, HV),
        f32(HV),
        f32(HV),
        K**-0.5,
        f32(RS_SLOTS, HV, V, K),
        meta(RS_SLOTS, HV, RS_L, V),
        meta(RS_SLOTS, H, RS_L, K),
        f32(RS_SLOTS, HV, RS_L),
        meta(RS_B, 1, HV, V),
        i32(RS_B),
        i32(RS_B),
        use_qk_l2norm_in_kernel=True,
    )


def _gdn_replayssm_spec_decode(spec: int, **launch) -> None:
    """gdn_replayssm_spec_decode on 16/32 heads, head dim 128, ring 16, ``spec`` draft tokens, bs 8."""
    H, HV, K, V = 16, 32, 128, 128
    T = RS_B * spec
    mod("kernels/ops/attention/linear/gdn_replayssm_spec_decode.py").gdn_replayssm_spec_decode(
        meta(T, H, K),
        meta(T, H, K),
        meta(T, HV, V),
        meta(T, HV),
        meta(T, HV),
        f32(HV),
        f32(HV),
        f32(RS_SLOTS, HV, V, K),
        meta(RS_SLOTS, HV, RS_L, V),
        meta(RS_SLOTS, H, RS_L, K),
        f32(RS_SLOTS, HV, RS_L),
        meta(RS_SLOTS, HV, RS_L, V),
        meta(RS_SLOTS, H, RS_L, K),
        f32(RS_SLOTS, HV, RS_L),
        meta(T, HV, V),
        i32(RS_B + 1),
        i32(RS_B),
        i32(RS_B),
        i32(RS_B),
        i32(RS_B),
        i32(RS_B),
        RS_L,
        spec,
        **launch,
    )


for _spec in (4, 8):

    def _register(spec=_spec):
        @entry(
            "kernels/ops/attention/linear/gdn_replayssm_spec_decode.py:gdn_replayssm_spec_circular_kernel",
            f"Qwen3-Next GDN speculative verify: 16/32 heads, head dim 128, ring 16, {spec} draft tokens, bs 8",
            kernels=("gdn_replayssm_spec_circular_kernel", "gdn_replayssm_exact_fold_kernel"),
        )
        def _():
            _gdn_replayssm_spec_decode(spec)

    _register()


@entry(
    "kernels/ops/attention/linear/gdn_replayssm_spec_decode.py:gdn_replayssm_exact_fold_kernel",
    "Qwen3-Next GDN flush fold: 16/32 heads, head dim 128, ring 16, bs 8 (launched by gdn_replayssm_spec_decode)",
)
def _():
    _gdn_replayssm_spec_decode(4, launch_mode="flush")


@entry(
    "kernels/ops/attention/linear/gdn_replayssm_spec_decode.py:gdn_replayssm_compact_commit_kernel",
    "Qwen3-Next GDN commit after verify: 48 layers, 16/32 heads, head dim 128, ring 16, bs 8",
)
def _():
    H, HV, K, V, layers = 16, 32, 128, 128, 48
    mod("kernels/ops/attention/linear/gdn_replayssm_spec_decode.py").commit_gdn_replayssm_circular(
        checkpoint_state=f32(layers, RS_SLOTS, HV, V, K),
        d_cache=meta(layers, RS_SLOTS, HV, RS_L, V),
        k_cache=meta(layers, RS_SLOTS, H, RS_L, K),
        g_cache=f32(layers, RS_SLOTS, HV, RS_L),
        d_residual_cache=meta(layers, RS_SLOTS, HV, RS_L, V),
        k_residual_cache=meta(layers, RS_SLOTS, H, RS_L, K),
        state_batch_indices=i32(RS_B),
        replay_indices=i32(RS_B),
        write_pos=i32(RS_B),
        cache_base=i32(RS_B),
        is_flush=i32(RS_B),
        accept_lens=i32(RS_B),
        null_block_id=-1,
    )


# Grouped LoRA shrink/expand (srt/lora/dense runner and MLA correction): tiles come from the plan table that
# `architecture_for_capability` picks, "sm100" for every major >= 10, so 12.x runs the sm100 plans. Every
# distinct grouped a_tiles / b_tiles entry of srt/lora/dense/configs/sm100.plans.json is compiled:
# Llama-3-8B qkv (K 4096, rank 64, stack 3), 4 adapters, 1024 routed tokens, bf16.
def dense_plan_tiles(family_key: str, tiles_key: str):
    import json
    import os

    path = os.path.join(os.path.dirname(mod("srt/lora/utils.py").__file__), "dense", "configs", "sm100.plans.json")
    seen = {}
    for row in json.load(open(path))["rows"]:
        spec = row["spec"]
        if spec.get(family_key) == "grouped" and tiles_key in spec:
            key = json.dumps([spec.get("block_size"), spec[tiles_key]], sort_keys=True)
            seen[key] = (spec.get("block_size"), spec[tiles_key])
    return list(seen.values())


def _aligned_route_view(block: int, token_slots, group_ids, groups_per_slot: int, padded: int):
    """An ALIGNED RouteView over ``padded`` sorted pairs in blocks of ``block``, for N_LORA adapters."""
    rv = mod("kernels/ops/lora/common/route_view.py")
    return rv.RouteView(
        view=rv.RouteViewKind.ALIGNED,
        block_size=block,
        token_slots=token_slots,
        group_ids=group_ids,
        groups_per_slot=groups_per_slot,
        max_loras=N_LORA,
        maybe_sorted_pair_ids=i32(padded),
        maybe_block_bucket_ids=i32(-(-padded // block)),
        maybe_num_pairs_post_padded=i32(1),
    )


def route_view(block: int, rows: int = S_TOK):
    return _aligned_route_view(block, i32(rows), None, 1, rows + N_LORA * (block - 1))


@entry(
    "kernels/ops/lora/common/lora_a.py:_grouped_lora_a_kernel",
    "every grouped a_tiles plan of the sm100 dense table (used on 12.x): Llama-3-8B qkv shrink, K 4096, "
    "rank 64 x 3, 4 adapters, 1024 tokens, bf16",
)
def _():
    la = mod("kernels/ops/lora/common/lora_a.py")
    for block, tiles in dense_plan_tiles("a_family", "a_tiles"):
        split = int(tiles.get("SPLIT_K", 1))
        la.grouped_lora_a(
            meta(S_TOK, 4096),
            meta(N_LORA, 3 * RANK, 4096),
            meta(S_TOK, 3 * RANK),
            route_view(block),
            config=tiles,
            stack=3,
            partial=f32(split, S_TOK, 3 * RANK) if split > 1 else None,
            counters=i32(4096) if split > 1 else None,
        )


@entry(
    "kernels/ops/lora/common/lora_b.py:_grouped_lora_b_kernel",
    "every grouped b_tiles plan of the sm100 dense table (used on 12.x): Llama-3-8B qkv expand, q 4096 kv 1024, "
    "rank 64, 4 adapters, 1024 tokens, bf16",
)
def _():
    lb = mod("kernels/ops/lora/common/lora_b.py")
    for block, tiles in dense_plan_tiles("b_family", "b_tiles"):
        bn = int(tiles["BLOCK_SIZE_N"])
        geometry = lb.SliceGeometry(
            slice_offsets=i32(4),
            out_offsets=i32(3),
            num_slices=3,
            num_column_tiles=6144 // bn,
            uniform_width=0,
            out_stride=0,
            full_tiles=True,
            block_size_n=bn,
        )
        lb.grouped_lora_b(
            meta(S_TOK, 3 * RANK),
            meta(N_LORA, 6144, RANK),
            meta(S_TOK, 6144),
            route_view(block),
            geometry=geometry,
            config=tiles,
            add_inplace=True,
            zero_sentinel=False,
        )


# MoE LoRA (the non-virtual-experts path of srt/lora/lora_moe_runners.py): Qwen3-30B-A3B (128 experts, top 8,
# hidden 2048, intermediate 768), LoRA rank 64 and 128, 4 adapters, 1024 tokens, bf16; block sizes as that
# caller passes them (shrink 64 x min(64, rank) x 64, expand 64 x 64 x min(64, rank), 2 stages).
for _r in (64, 128):

    def _register(r=_r):
        @entry(
            "kernels/ops/lora/moe/fused_moe_lora_kernel.py:_fused_moe_lora_kernel",
            f"Qwen3-30B-A3B MoE LoRA gate_up: E 128, top 8, hidden 2048, intermediate 768, rank {r}, "
            "4 adapters, 1024 tokens, bf16 (shrink and expand)",
        )
        def _():

            m = mod("kernels/ops/lora/moe/fused_moe_lora_kernel.py")
            E, topk, H, inter, M = 128, 8, 2048, 768, S_TOK
            blk = mod("srt/lora/lora_moe_runners.py")._get_moe_lora_block_config(r)
            EM = M * topk + E * 63
            a = [meta(N_LORA, E, r, H), meta(N_LORA, E, r, H)]
            b = [meta(N_LORA, E, inter, r), meta(N_LORA, E, inter, r)]
            m._fused_moe_lora(
                meta(M, topk, 2 * inter),
                meta(M, H),
                a,
                b,
                f32(M, topk),
                i32(N_LORA, EM),
                i32(N_LORA, -(-EM // 64)),
                i32(N_LORA),
                r,
                topk,
                i32(N_LORA),
                i32(N_LORA + 1),
                64,
                blk["shrink_block_size_n"],
                64,
                8,
                4,
                2,
                1,
                64,
                64,
                blk["expand_block_size_k"],
                8,
                4,
                2,
                1,
            )

    _register()


# MoE LoRA with virtual experts (lora_use_virtual_experts), Qwen3-30B-A3B (128 experts, top 8, hidden 2048),
# 4 adapters, 16 and 1024 tokens, bf16.
# * kernels/ops/lora/moe: the shrink config is SGLang's MoE config chooser's answer for the merged
#   [adapters x experts, rank, hidden] weight (no tuned file ships: default config); rank 64.
# * kernels/ops/lora/moe/trtllm_lora_temp (the experimental LoRA path, SGLANG_EXPERIMENTAL_LORA_OPTI): BLOCK_K 256,
#   BLOCK_N min(128, next_pow2(rank)), BLOCK_M / warps / stages from `_get_shrink_stage_config` (16 / 3 stages
#   below 512 tokens, 32 / 2 stages from 512); ranks 64 and 128.
for _m in (16, 1024):

    def _register(m=_m):
        @entry(
            "kernels/ops/lora/moe/virtual_experts.py:_moe_lora_shrink_splitk_kernel",
            f"Qwen3-30B-A3B MoE LoRA shrink, virtual experts: 4 adapters x 128 experts, rank 64, hidden 2048, "
            f"top 8, {m} tokens, bf16",
        )
        def _():
            cfg_mod = moe_config_defaults()
            ve = mod("kernels/ops/lora/moe/virtual_experts.py")
            E, topk, H, r = N_LORA * 128, 8, 2048, RANK
            w = meta(E, r, H)
            config = dict(cfg_mod.try_get_optimal_moe_config(w.shape, w.shape, topk, None, m))
            bm = config["BLOCK_SIZE_M"]
            padded = m * topk + min(m * topk, E) * (bm - 1)
            ve._invoke_moe_lora_shrink_splitk(
                meta(m, H), w, meta(m * topk, r), i32(m, topk), i32(padded), i32(-(-padded // bm)), i32(1), topk, config
            )

    _register()

for _m in (16, 1024):
    for _r in (64, 128):

        def _register(m=_m, r=_r):
            @entry(
                "kernels/ops/lora/moe/trtllm_lora_temp/virtual_experts.py:_moe_lora_shrink_splitk_kernel",
                f"Qwen3-30B-A3B MoE LoRA shrink, virtual experts (experimental path): 4 adapters x 128 experts, "
                f"rank {r}, hidden 2048, top 8, {m} tokens, bf16",
            )
            def _():
                ve = mod("kernels/ops/lora/moe/trtllm_lora_temp/virtual_experts.py")
                E, topk, H = N_LORA * 128, 8, 2048
                w = meta(E, r, H)
                config = ve._get_shrink_stage_config(w.shape, m)
                bm = config["BLOCK_SIZE_M"]
                padded = m * topk + min(m * topk, E) * (bm - 1)
                ve._invoke_moe_lora_shrink_splitk(
                    meta(m, H),
                    w,
                    meta(m * topk, r),
                    i32(m, topk),
                    i32(padded),
                    i32(-(-padded // bm)),
                    i32(1),
                    topk,
                    config,
                )

        _register()


# MoE LoRA (srt/lora/moe runner): tiles come from the MoE plan table `architecture_for_capability` picks
# ("sm100" for 12.x) plus the plan defaults. Every distinct b_activation tile set (fused LoRA-B + SiLU:
# `_b_act_kernel`, which inlines `_delta_slice`) and down_b tile set (`_down_b_into_base_kernel`) of
# srt/lora/moe/configs/sm100.plans.json is compiled, with routing blocks of 16 and 32 rows (the table's
# routing_block_size values) unless the tile set names BLOCK_SIZE_M. Qwen3-30B-A3B (128 experts, top 8, hidden
# 2048, intermediate 768), rank 64, 4 adapters, 1024 tokens, bf16.
def moe_plan_sites(site: str, default: dict):
    import json
    import os

    path = os.path.join(os.path.dirname(mod("srt/lora/utils.py").__file__), "moe", "configs", "sm100.plans.json")
    found = {json.dumps(default, sort_keys=True): default}

    def walk(node):
        if isinstance(node, dict):
            tiles = node.get("sites", {}).get(site) if isinstance(node.get("sites"), dict) else None
            if tiles is not None:
                found[json.dumps(tiles, sort_keys=True)] = tiles
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.load(open(path)))
    return list(found.values())


def moe_route_view(block: int, tokens: int = S_TOK, top_k: int = 8, buckets: int = N_LORA * 128):
    padded = tokens * top_k + min(tokens * top_k, buckets) * (block - 1)
    return _aligned_route_view(block, i32(tokens), i32(tokens, top_k), 128, padded)


@entry(
    "kernels/ops/lora/moe/fused_act.py:_delta_slice",
    "every b_activation tile set of the sm100 MoE LoRA plans (used on 12.x) and the default: Qwen3-30B-A3B "
    "gate_up LoRA-B + SiLU, rank 64, 4 adapters, 1024 tokens, routing blocks 16 and 32, bf16",
    kernels=("_b_act_kernel",),
)
def _():
    plan = mod("srt/lora/moe/plan.py")
    fa = mod("kernels/ops/lora/moe/fused_act.py")
    pairs, inter, r = S_TOK * 8, 768, RANK
    for tiles in moe_plan_sites("b_activation", plan._b_act_default()):
        for block in (16, 32):
            fa.fused_b_act(
                activation="silu",
                base_gateup=meta(pairs, 2 * inter),
                act_rows=meta(pairs, inter),
                act_pairs=None,
                pair_to_row=i32(pairs),
                routing=moe_route_view(block),
                num_local_experts=128,
                gate_first=True,
                interleaved=False,
                config=tiles,
                bridge_gateup=meta(pairs, 2 * r),
                b_gate_up=meta(N_LORA * 128, 2 * inter, r),
            )


@entry(
    "kernels/ops/lora/moe/lora_b.py:_down_b_into_base_kernel",
    "every down_b tile set of the sm100 MoE LoRA plans (used on 12.x) and the default: Qwen3-30B-A3B down "
    "LoRA-B into the base rows, hidden 2048, rank 64, 4 adapters, 1024 tokens, bf16",
)
def _():
    plan = mod("srt/lora/moe/plan.py")
    lb = mod("kernels/ops/lora/moe/lora_b.py")
    pairs, H, r = S_TOK * 8, 2048, RANK
    for tiles in moe_plan_sites("down_b", plan._b_default()):
        for block in (tiles["BLOCK_SIZE_M"],) if "BLOCK_SIZE_M" in tiles else (16, 32):
            lb.invoke_down_b_into_base(
                down_rows=meta(pairs, H),
                pair_to_row=i32(pairs),
                bridge=meta(pairs, r),
                b_down=meta(N_LORA * 128, H, r),
                routing=moe_route_view(block),
                config=tiles,
            )


# The experimental LoRA path (SGLANG_EXPERIMENTAL_LORA_OPTI, kernels/ops/lora/dense/trtllm_lora_temp) sizes
# BLOCK_R from the rank: qkv shrink BLOCK_R = next_pow2(3 x rank), expand BLOCK_R = max(16, next_pow2(rank)).
for _r in (8, 16, 32):

    def _register(r=_r):
        @entry(
            "kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_a.py:_sgemm_lora_a_kernel",
            f"Llama-3-8B LoRA rank {r}, 4 adapters, 1024 tokens, bf16, qkv stack 3, K 4096",
        )
        def _():
            mod("kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_a.py").sgemm_lora_a_fwd(
                meta(S_TOK, 4096), meta(N_LORA, 3 * r, 4096), lora_batch(), stack_num=3
            )

    _register()


@entry(
    "kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_b.py:_sgemm_lora_b_kernel",
    "Llama-3-8B LoRA rank 128, 4 adapters, 1024 tokens, bf16, o_proj N 4096",
)
def _():
    mod("kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_b.py").sgemm_lora_b_fwd(
        meta(S_TOK, 128), meta(N_LORA, 4096, 128), lora_batch()
    )


@entry(
    "kernels/ops/lora/dense/chunked_sgmv_shrink.py:_chunked_lora_shrink_kernel",
    "Llama-3-8B LoRA rank 64, 4 adapters, chunk 64 (--max-lora-chunk-size 64), bf16, qkv K 4096",
)
def _():
    mod("kernels/ops/lora/dense/chunked_sgmv_shrink.py").chunked_sgmv_lora_shrink_forward(
        meta(S_TOK, 4096), meta(N_LORA, 3 * RANK, 4096), chunk_batch(64), 3
    )


# Kernels of the survey that no launch on a CUDA 12.x device reaches, with the code that decides it; listed in
# the JSON output (``not_launched``) so the table's rows can be re-derived from one run.
NOT_LAUNCHED = {
    "kernels/ops/attention/decode_attention.py:_lean_attention_decode_kernel": "decode_attention_fwd calls _decode_lean_attention_fwd only under _is_hip",
    "kernels/ops/attention/dsv4/triton_sparse_decode/triton_mla_kernels_decode_fused.py:_process_kv_block_aggressive": "reached only through triton_fp8_attention_fwd, called by srt/layers/attention/hip_flash_mla.py "
    "(DeepseekV4HipRadixBackend, built by attention_registry only under _is_hip)",
    "kernels/ops/attention/dsv4/unified_kv_kernels/paged_decode.py:_paged_decode_fused_kernel": "unified_kv_kernels.runtime decode/prefill are called only by deepseek_v4_backend_hip_radix.py (built only "
    "under _is_hip); deepseek_v4.py calls only runtime.flydsl_decode_supported",
    "kernels/ops/attention/dsv4/unified_kv_kernels/paged_decode.py:_paged_decode_split_kernel": "as _paged_decode_fused_kernel",
    "kernels/ops/attention/dsv4/unified_kv_kernels/paged_prefill.py:_sparse_attn_v4_paged_prefill_kernel": "as _paged_decode_fused_kernel",
    "kernels/ops/attention/minimax_sparse/decode/flash_with_topk_idx.py:_decode_score_paged_kernel": "flash_decode_with_topk_idx launches it only when get_platform().is_sm90 (12.x runs _decode_score_kernel)",
    "kernels/ops/attention/unified_attention_3d_mtp.py:unified_attention_3d_mtp_kernel": "the module imports aiter (ROCm) at import time; only srt/layers/attention/aiter_backend.py uses it",
    "kernels/ops/attention/verify_mla.py:_verify_mla_prefix_stage1": "TritonAttnBackend enables verify_shared_kv_fwd only when is_gfx95_supported() (compiled here anyway)",
    "kernels/ops/attention/verify_splitkv.py:_verify_prefix_stage1": "TritonAttnBackend sets use_verify_splitkv only when is_gfx95_supported() (compiled here anyway)",
    "kernels/ops/gemm/fp8_kernel.py:_w8a8_block_fp8_matmul_hopper": "w8a8_block_fp8_matmul_triton picks it only when get_platform().is_sm90 and the tuned config sets SWAP_AB "
    "or SPLIT_K > 1",
    "kernels/ops/gemm/fp8_kernel.py:_w8a8_block_fp8_matmul_unrolledx4": "select_w8a8_block_fp8_matmul_kernel returns it only in its _is_hip definition",
}


# ---------------------------------------------------------------------------------------------------------


def _setup(release: str, arch: str):
    import os

    from sm120kit.sglang import releases

    root = releases.fetch_release(release)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    os.environ.setdefault("SGLANG_IS_IN_CI", "false")
    return root


def _server_defaults():
    """SGLang modules read server arguments at call time; answer with the defaults (no server runs)."""
    from sm120kit.audit.kernel_probe import _ServingDefaults

    try:
        sa = importlib.import_module("sglang.srt.server_args")
    except Exception:  # noqa: BLE001
        return
    sa.get_global_server_args = _ServingDefaults()


def run(release: str, arch: str, only: list[str]) -> dict:
    from sm120kit.hardware import fake_device as fd

    _setup(release, arch)
    limit = LIMIT[arch]
    import triton

    out = {
        "release": release,
        "arch": arch,
        "limit": limit,
        "triton": triton.__version__,
        "not_launched": {k: v for k, v in NOT_LAUNCHED.items() if not only or any(s in k for s in only)},
        "entries": [],
    }
    with fd.faked_device(fd.preset(arch)) as rec, fd.stand_in_packages():
        _server_defaults()
        for e in ENTRIES:
            if only and not any(s in e["kernel"] for s in only):
                continue
            t0 = time.time()
            rec.take()
            error = None
            try:
                e["run"]()
            except Exception as exc:  # noqa: BLE001
                lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
                # Triton's CompilationError puts the cause on its last line.
                error = (lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}")[:400]
                if "--trace" in sys.argv:
                    traceback.print_exc()
            got = [k for k in rec.take() if k.name in e["names"]]
            kernels = [
                {
                    "name": k.name,
                    "constexprs": k.constexprs,
                    "num_warps": k.num_warps,
                    "num_stages": k.num_stages,
                    "shared": k.shared,
                }
                for k in got
            ]
            if kernels and e["autotuned"]:
                # Triton's autotuner drops configs that raise OutOfResources: one fitting config suffices.
                worst = min(k["shared"] for k in kernels)
                verdict = "fits" if worst <= limit else "over"
            elif kernels:
                worst = max(k["shared"] for k in kernels)
                verdict = "fits" if worst <= limit else "over"
            else:
                worst, verdict = None, "not compiled"
            out["entries"].append(
                {
                    "kernel": e["kernel"],
                    "shape": e["shape"],
                    "how": e["how"],
                    "verdict": verdict,
                    "max_shared": worst,
                    "kernels": kernels,
                    "configs_fitting": sum(k["shared"] <= limit for k in kernels),
                    "error": error,
                    "seconds": round(time.time() - t0, 1),
                }
            )
            print(
                f"# {verdict:12} {worst!s:>7} {len(kernels):>2} {e['kernel']}" + (f"  [{error}]" if error else ""),
                file=sys.stderr,
                flush=True,
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--release", default="0.5.23")
    p.add_argument("--arch", default="12.0", choices=sorted(LIMIT))
    p.add_argument("--only", action="append", default=[], help="substring of the kernel column")
    p.add_argument("--list", action="store_true")
    p.add_argument("--trace", action="store_true")
    p.add_argument(
        "--triton-dir",
        help="a folder holding another Triton build, put first on sys.path "
        "(Triton 3.9 removed tl.make_block_ptr, which the FLA kernels use; 3.8 compiles them)",
    )
    a = p.parse_args(argv)
    if a.triton_dir:
        sys.path.insert(0, a.triton_dir)
    if a.list:
        for e in ENTRIES:
            print(e["kernel"], "|", e["shape"])
        return 0
    res = run(a.release, a.arch, a.only)
    print(json.dumps(res, indent=1))
    return 1 if any(e["verdict"] == "over" for e in res["entries"]) else 0


if __name__ == "__main__":
    sys.exit(main())
