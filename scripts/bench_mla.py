#!/usr/bin/env python3
"""Benchmark of the SM120 split-KV MLA kernels against SGLang's own, same inputs, one run.

    PYTHONPATH=<sglang release> python scripts/bench_mla.py [--cases all|verify|decode|fp8|quick]
                                                             [--sweep] [--json FILE]

Needs a CUDA GPU, an SGLang release on the path (its pure-Python files are enough) and the kernels' package
``sm120_attention`` (installed with sm120kit, ``pip install -e .`` or ``pip install .``, or ``kernels/`` on
PYTHONPATH). Variants of a call (another path, split count, tiles, merge) are routes: the launcher's route
table changed (``sm120_mla_route.TABLE._replace``, ``force``), never arguments of the launcher. On a GPU that is
not SM120 it runs in *SM120 mode* and says so: ``DISABLE_MMA_V3=1`` (Triton emits mma.sync, as on
sm_120, instead of wgmma), SGLang's extend launcher is given the block sizes it picks on 12.0, and the
new kernels run only tiles that compile for sm_120 within 101376 bytes. ``--native`` skips SM120 mode.

For each case it prints the time per call of SGLang's kernel and of the new one, the ratio, the
effective KV bandwidth (bytes that must be read at least once / time), and the share of the larger of
two rooflines measured in the same run: read bandwidth (``torch.sum`` over 512 MiB) and mma.sync bf16
throughput (a Triton matmul of 8192^3 under the same settings), and the share of the peak of each mma.sync form
the kernels use (bf16 and f16 m16n8k16, e4m3 m16n8k32; register-only loops compiled by NVRTC, ``mma_peaks``),
also measured in the same run. ``--compare DIR`` times another revision of the kernels on the same inputs.
Rows say where they were measured (an H200 in SM120 mode is not an SM120 card). Outputs are compared with each other
(max abs difference) so a fast wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import torch

SM120_MODE = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 12 and "--native" not in sys.argv
if SM120_MODE:
    os.environ["DISABLE_MMA_V3"] = "1"  # before the first Triton compile: it is part of Triton's cache key

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sm120_attention import reference as ref  # noqa: E402
from sm120_attention import sm120_mla  # noqa: E402
from sm120_attention import sm120_mla_route as routes  # noqa: E402

LK, LV = 576, 512


def sglang_kernels():
    from sglang.kernels.ops.attention import decode_attention as dec
    from sglang.kernels.ops.attention import extend_attention as ext

    if SM120_MODE and hasattr(ext, "CUDA_CAPABILITY"):
        ext.CUDA_CAPABILITY = (12, 0)  # the launcher's own capability value: the 12.0 block sizes
    return ext, dec


@triton.jit
def _mm_kernel(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(A + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(B + (k0 + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


# The instruction peaks: each warp runs four independent chains of one mma.sync shape on register operands
# only (no memory in the loop), so the time is the tensor cores' alone. KIND 0: bf16 m16n8k16, 1: f16
# m16n8k16, 2: e4m3 m16n8k32, 3: f16 m16n8k8; every form accumulates in fp32.
MMA_PEAK_SOURCE = r"""
typedef unsigned int u32;
template <int KIND>
__device__ __forceinline__ void step(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if (KIND == 0)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else if (KIND == 1)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else if (KIND == 2)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                     "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(b0));
}
template <int KIND> __device__ void loop(float* out, int iters) {
    const u32 x = threadIdx.x * 2654435761u;
    float d[4][4] = {};
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < 4; ++c) step<KIND>(d[c], x, x ^ 1u, x ^ 2u, x ^ 3u, x ^ 5u, x ^ 7u);
    }
    float t = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) t += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    if (t == 12345.f) out[blockIdx.x] = t;  // keeps the loop; never true for these operands in practice
}
extern "C" __global__ void mma_peak_bf16(float* out, int iters) { loop<0>(out, iters); }
extern "C" __global__ void mma_peak_f16(float* out, int iters) { loop<1>(out, iters); }
extern "C" __global__ void mma_peak_e4m3(float* out, int iters) { loop<2>(out, iters); }
extern "C" __global__ void mma_peak_f16k8(float* out, int iters) { loop<3>(out, iters); }
"""
# multiply-adds an mma; f16k8: m16n8k8, the value pass of the 16-row programs (8 tokens a warp pair)
MMA_PEAK_SHAPES = {"bf16": 16 * 8 * 16, "f16": 16 * 8 * 16, "e4m3": 16 * 8 * 32, "f16k8": 16 * 8 * 8}


# GPUs whose mma.sync e4m3 is a tensor-core instruction of its own (QMMA.16832 in the SASS): Ada (8.9) and
# SM120/121. For sm_90 ptxas lowers it to unpacks to f16 (F2FP.F16.E4M3.UNPACK_B) and HMMA.16816, and in the
# register-only loop, whose operands never change, it computes each product once and adds it with FADD: a
# figure timed there is neither an instruction's rate nor the kernels' (docs/benchmarks.md, the fp8-mma path).
E4M3_NATIVE = {(8, 9), (12, 0), (12, 1)}


# The rate of each way the 16-row fp8 programs turn fp8 e4m3 into f16 in registers (FP8_UNPACK16 in the kernels):
# each thread turns 8 independent words (4 fp8 values each) into two f16 pairs per step, by the conversion
# instruction (KIND 0: cvt.rn.f16x2.e4m3x2, the F2FP unit), by integer operations (1: the kernels' f8s_even and
# f8s_odd), or half of the words each way (2: whether the two run side by side); the conversion of bytes 2-3 reads
# the register's upper half in place, as the kernels' f8_hi does. KIND 3 makes the two registers with movmatrix.trans
# instead, the second from the first (the transposed body's VALUES_FROM_KEYS: a movmatrix for each f16 pair of the
# values in place of a conversion). One three-input xor a word feeds each result back into its word, so no step can
# be hoisted; it is the same in every form.
UNPACK_RATE_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
__device__ __forceinline__ u32 cvt2(u16 v) { u32 r; asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v)); return r; }
__device__ __forceinline__ u32 cvt2_hi(u32 w) {  // the upper half in place, as the kernels' f8_hi
    u32 r; asm volatile("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(w)); return r;
}
__device__ __forceinline__ u32 odd(u32 w) { return (w & 0x80008000u) | ((w >> 1) & 0x3f803f80u); }
__device__ __forceinline__ u32 even(u32 w) { return odd(w << 8); }
__device__ __forceinline__ u32 movm(u32 a) { u32 d; asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a)); return d; }
template <int KIND> __device__ void loop(u32* out, int iters) {
    u32 w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = (threadIdx.x + 977u * k) * 2654435761u;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const bool conv = KIND == 0 || (KIND == 2 && k % 2 == 0);
            const u32 a = KIND == 3 ? movm(w[k]) : conv ? cvt2((u16)(w[k] & 0xffffu)) : even(w[k]);
            const u32 b = KIND == 3 ? movm(a) : conv ? cvt2_hi(w[k]) : odd(w[k]);
            w[k] ^= a ^ b;
        }
    }
    u32 t = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) t ^= w[k];
    if (t == 0x12345u) out[blockIdx.x] = t;  // keeps the loop
}
extern "C" __global__ void unpack_cvt(u32* out, int iters) { loop<0>(out, iters); }
extern "C" __global__ void unpack_int(u32* out, int iters) { loop<1>(out, iters); }
extern "C" __global__ void unpack_both(u32* out, int iters) { loop<2>(out, iters); }
extern "C" __global__ void unpack_movm(u32* out, int iters) { loop<3>(out, iters); }
"""


def _register_loop_rates(source, file_name, kernels, iters=4096):
    """Thread steps a second (one step: one pass of the loop body, per thread) of each register-only loop of
    ``source`` (entry points ``kernels``, each taking ``(out, iters)``), compiled by NVRTC for this GPU: best of
    4/8/16 warps (4 programs an SM) and 5 runs each. Returns ({name: steps/s}, SMs), or ({"error": ...}, SMs)."""
    from sm120_attention import sm120_mla_nvrtc as nvrtc

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        module = nvrtc.Module(nvrtc.compile_cubin(source, file_name, arch, ("--std=c++17",)))
    except nvrtc.CompileError as exc:
        return {"error": str(exc)[:200]}, sms
    import ctypes

    out = torch.zeros(4096, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def args(n):
        return ctypes.c_uint64(out.data_ptr()), ctypes.c_int(n)

    rates = {}
    for name in kernels:
        function = module.function(name, 0)
        best = 0.0
        for warps in (4, 8, 16):
            blocks = 4 * sms
            module.launch(function, (blocks, 1, 1), 32 * warps, 0, stream, args(16))
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                module.launch(function, (blocks, 1, 1), 32 * warps, 0, stream, args(iters))
                b.record()
                b.synchronize()
                best = max(best, blocks * 32 * warps * iters / (a.elapsed_time(b) * 1e-3))
        rates[name] = best
    return rates, sms


def unpack_rates():
    """Words (4 fp8 values to 2 f16 pairs; for movm, 2 registers through movmatrix) a second per SM, in G/s, of each
    way of UNPACK_RATE_SOURCE (8 words a thread step)."""
    kinds = ("cvt", "int", "both", "movm")
    rates, sms = _register_loop_rates(UNPACK_RATE_SOURCE, "unpack_rate.cu", [f"unpack_{k}" for k in kinds])
    if "error" in rates:
        return rates
    return {k: round(rates[f"unpack_{k}"] * 8 / sms / 1e9, 2) for k in kinds}


def mma_peaks():
    """TFLOP/s of each mma.sync form the kernels use (bf16 and f16 m16n8k16, e4m3 m16n8k32, f16 m16n8k8), from the
    register-only loops of MMA_PEAK_SOURCE (four mma a warp step, so 4 / 32 a thread step)."""
    names = {kind: f"mma_peak_{kind}" for kind in MMA_PEAK_SHAPES}
    rates, _ = _register_loop_rates(MMA_PEAK_SOURCE, "mma_peak.cu", list(names.values()))
    if "error" in rates:
        return rates
    peaks = {kind: round(2 * macs * rates[names[kind]] * 4 / 32 / 1e12, 1) for kind, macs in MMA_PEAK_SHAPES.items()}
    if torch.cuda.get_device_capability() not in E4M3_NATIVE:
        peaks["e4m3_emulated"] = True  # no share of it is reported (instruction_shares)
    return peaks


def rooflines():
    """(read GB/s, bf16 TFLOP/s) measured now, under the same Triton settings as the kernels."""
    buf = torch.empty(512 * 2**20 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    t = triton.testing.do_bench(lambda: buf.sum(), warmup=10, rep=100)
    read_gbs = buf.numel() * 2 / (t * 1e-3) / 1e9
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    best = 0.0
    for bm, bn, bk, w, s in ((128, 128, 32, 4, 3), (128, 128, 64, 8, 3), (128, 256, 32, 8, 3)):
        try:
            run = lambda: _mm_kernel[(n // bm, n // bn)](
                a, b, c, n, n, n, BM=bm, BN=bn, BK=bk, num_warps=w, num_stages=s
            )  # noqa: E731
            t = triton.testing.do_bench(run, warmup=5, rep=100)
            best = max(best, 2 * n**3 / (t * 1e-3) / 1e12)
        except Exception:  # a tile that does not fit this GPU: try the next
            continue
    del buf, a, b, c
    return read_gbs, best


@triton.jit
def _gather_read_kernel(KV, IDX, OUT, n, stride_w, ROW_W: tl.constexpr, BLOCK_W: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = r < n
    slot = tl.load(IDX + r, mask=ok, other=0)
    w = tl.arange(0, BLOCK_W)
    x = tl.load(KV + slot[:, None] * stride_w + w[None, :], mask=ok[:, None] & (w[None, :] < ROW_W), other=0)
    tl.store(OUT + tl.program_id(0), tl.sum(tl.sum(x, 1), 0))


def gather_gbs(c):
    """Read bandwidth of the case's own KV rows in the order of its slots (GB/s, counted in the rows' bytes): a
    Triton kernel that only loads the rows the slots name (32 a program) and sums them. Beside the streaming read
    roofline (``torch.sum``), it is the roofline of the access pattern: scattered 576- or 1152-byte rows."""
    pool = c["k_pool"].view(c["k_pool"].shape[0], -1).view(torch.int32)
    idx = c["kv_indices"]
    n, row_w = idx.numel(), LK * c["k_pool"].element_size() // 4
    out = torch.empty(triton.cdiv(n, 32), dtype=torch.int32, device="cuda")
    block_w = triton.next_power_of_2(row_w)
    run = lambda: _gather_read_kernel[(triton.cdiv(n, 32),)](  # noqa: E731
        pool, idx, out, n, pool.stride(0), ROW_W=row_w, BLOCK_W=block_w, BR=32, num_warps=4
    )
    run()
    t = triton.testing.do_bench_cudagraph(run, rep=100)
    return n * row_w * 4 / (t * 1e-3) / 1e9


TIMING = {"method": "cuda graph", "plain": 0}
LAST = {"method": "cuda graph"}


def bench(fn, slow=False):
    """Time per call in ms. Calls are replayed from a CUDA graph, as SGLang runs decode and target verify,
    so the time is the GPU's and not Python's launch cost (two Triton launches take longer to issue than
    a decode step at short context takes to run). A call that cannot be captured is timed with plain
    launches; the row says so (``timing``) and the run counts them."""
    fn()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(fn, rep=60 if slow else 200)
        LAST["method"] = "cuda graph"
        return ms
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        LAST["method"] = f"plain launches (capture failed: {str(e)[:60]})"
        TIMING["plain"] += 1
    return triton.testing.do_bench(fn, warmup=3 if slow else 20, rep=60 if slow else 200)


KV_SLOTS = {"layout": "scattered"}
"""How page-1 KV slots lie in the pool (``--kv-slots``): ``scattered``, every token at a random slot (the cases'
own, the default); ``runs64``, runs of 64 consecutive slots in random order (a page-1 pool after requests came
and went); ``ordered``, each request's slots consecutive (what SGLang's allocator hands a fresh single stream: its
free list starts as ``arange`` and an allocation takes the front)."""


def to_device(case, page_size):
    """Move a case to the GPU; with page_size > 1, KV slots are whole pages in scattered order; with page size 1,
    the slots follow ``KV_SLOTS``. Only the indices change: the pool keeps its random contents."""
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    layout = KV_SLOTS["layout"] if page_size == 1 else "pages"
    total = case["kv_indices"].numel()
    if layout in ("pages", "runs64"):
        run = page_size if layout == "pages" else 64
        pages = -(-total // run)
        order = torch.randperm(case["k_pool"].shape[0] // run, device="cuda")[:pages]
        slots = (order[:, None] * run + torch.arange(run, device="cuda")[None, :]).flatten()[:total]
        case["kv_indices"] = slots.to(torch.int64)
    elif layout == "ordered":
        case["kv_indices"] = torch.arange(total, device="cuda", dtype=torch.int64)
    case["v_pool"] = case["k_pool"][:, :, :LV]
    case["v_ext"] = case["k_ext"][:, :, :LV]
    return case


def verify_case(prefix, drafts, heads, kv_dtype, tree, page_size, batch=1):
    pool_extra = 64 * page_size + 64
    c = ref.make_verify_case(
        [prefix] * batch,
        [drafts] * batch,
        heads=heads,
        lk=LK,
        lv=LV,
        dtype=torch.bfloat16,
        tree=tree,
        seed=prefix + drafts,
        pool_extra=pool_extra,
        device="cpu",
    )
    c = to_device(c, page_size)
    if kv_dtype == "fp8":
        c["k_pool"] = (c["k_pool"].float() / 2).to(torch.float8_e4m3fn)
        c["v_pool"] = c["k_pool"][:, :, :LV]
    return c


def run_verify(mla, ext, c, heads, page_size, kv_scale):
    o_new = torch.empty(c["q"].shape[0], heads, LV, dtype=torch.bfloat16, device="cuda")
    o_old = torch.empty_like(o_new)
    args_new = ref.verify_args(c, o_new, kv_scale, kv_scale)
    args_old = ref.verify_args(c, o_old, kv_scale, kv_scale)

    def new():
        assert mla.sm120_tree_verify_fwd(*args_new, page_size=page_size)

    def old():
        ext.extend_attention_fwd(*args_old, page_size=page_size)

    return new, old, o_new, o_old


def decode_case(prefix, batch, heads, kv_dtype, page_size):
    c = ref.make_decode_case([prefix] * batch, heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, seed=prefix + batch)
    c = to_device(c, page_size)
    if kv_dtype == "fp8":
        c["k_pool"] = (c["k_pool"].float() / 2).to(torch.float8_e4m3fn)
        c["v_pool"] = c["k_pool"][:, :, :LV]
    return c


def run_decode(mla, dec, c, heads, splits_old, kv_scale, page_size):
    batch = c["q"].shape[0]
    o_new = torch.empty(batch, heads, LV, dtype=torch.bfloat16, device="cuda")
    o_old = torch.empty_like(o_new)
    logits = torch.empty(batch, heads, splits_old, LV, dtype=torch.float32, device="cuda")
    lse = torch.empty(batch, heads, splits_old, dtype=torch.float32, device="cuda")
    nsplit = torch.full((batch,), splits_old, dtype=torch.int32, device="cuda")
    scale = 1.0 / LK**0.5

    def new():
        assert mla.sm120_mla_decode_fwd(
            c["q"],
            c["k_pool"],
            c["v_pool"],
            o_new,
            c["kv_indptr"],
            c["kv_indices"],
            logits,
            lse,
            nsplit,
            splits_old,
            scale,
            kv_scale,
            kv_scale,
        )

    def old():
        dec.decode_attention_fwd(
            c["q"],
            c["k_pool"],
            c["v_pool"],
            o_old,
            c["kv_indptr"],
            c["kv_indices"],
            logits,
            lse,
            nsplit,
            splits_old,
            scale,
            kv_scale,
            kv_scale,
            has_mla=True,
            page_size=page_size,
        )

    return new, old, o_new, o_old


def kv_bytes(c):
    return c["kv_indices"].numel() * LK * c["k_pool"].element_size()


def flops(c, heads):
    total = 0
    for b in range(len(c["prefix_lens"])):
        total += 2 * c["draft_lens"][b] * heads * c["prefix_lens"][b] * (LK + LV)
    return total


def path_label(route) -> str:
    """The route's path, with " fp8-mma" where fp8 KV takes the fp8-mma entry points."""
    return route.path + (" fp8-mma" if route.fp8_mma else "")


def route_fields(mla, c, new) -> dict:
    """The route the launcher took for the call ``new`` makes: its path, its splits a request and the prefix tokens
    a split of the longest request walks (the CUDA kernels' decode body depends on that length)."""
    route = route_of(new)
    block_n = route.tiles.block_n if route.path == routes.TRITON else mla.cuda_prefix.BLOCK_N
    tokens = routes.split_length(max(c["prefix_lens"]), route.splits, route.min_chunk, block_n)
    return {"path": path_label(route), "splits": route.splits, "split_tokens": tokens}


def proxy_label(device_name: str) -> str:
    """Where a row in SM120 mode was measured: "H200 in SM120 mode, not an SM120 card" (the model, H100 or H200, from
    the device's name; the whole name for another GPU)."""
    model = re.search(r"\bH\d{3}\b", device_name)
    return f"{model.group(0) if model else device_name} in SM120 mode, not an SM120 card"


PROXY = proxy_label(torch.cuda.get_device_name()) if SM120_MODE else ""
PEAKS = {}  # the instruction peaks measured in this run (mma_peaks), for the rows' shares


def row(kind, label, c, heads, t_old, t_new, roof, diff, extra=""):
    read_gbs, tflops = roof
    byts = kv_bytes(c)
    t_read = byts / (read_gbs * 1e9) * 1e3
    t_comp = flops(c, heads) / (tflops * 1e12) * 1e3
    bound = max(t_read, t_comp)
    return {
        "kind": kind,
        "case": label,
        "old_ms": round(t_old, 4) if t_old is not None else None,
        "new_ms": round(t_new, 4),
        "speedup": round(t_old / t_new, 2) if t_old else None,
        "new_gbs": round(byts / (t_new * 1e-3) / 1e9, 1),
        "old_gbs": round(byts / (t_old * 1e-3) / 1e9, 1) if t_old else None,
        "bound": "compute" if t_comp > t_read else "read",
        "pct_roofline_new": round(100 * bound / t_new, 1),
        "pct_roofline_old": round(100 * bound / t_old, 2) if t_old else None,
        "max_abs_diff": diff,
        "note": extra,
        **instruction_shares(c, heads, t_new),
        **gather_share(c, t_new, t_read),
        "measured_on": PROXY if SM120_MODE else torch.cuda.get_device_name(),
    }


GATHER = {}


def gather_share(c, t_new, t_read):
    """The call's time against the gather roofline of its slots (measured once a case, ``gather_gbs``)."""
    if not KV_SLOTS.get("gather"):
        return {}
    key = id(c["kv_indices"])
    if key not in GATHER:
        GATHER.clear()
        GATHER[key] = gather_gbs(c)
    t_gather = kv_bytes(c) / (GATHER[key] * 1e9) * 1e3
    return {
        "kv_slots": KV_SLOTS["layout"],
        "gather_gbs": round(GATHER[key]),
        "pct_gather_new": round(100 * t_gather / t_new, 1),
        "gather_vs_read": round(t_read / t_gather, 3),
    }


def instruction_shares(c, heads, t_new):
    """The kernel's FLOP/s as a share of each mma.sync instruction's peak measured in this run: the bf16 form
    (bf16 KV, and fp8 KV converted to f16, which runs at the same rate) and the e4m3 form (an fp8-mma path)."""
    achieved = flops(c, heads) / (t_new * 1e-3) / 1e12
    out = {"tflops_new": round(achieved, 1)}
    for kind in ("bf16", "e4m3"):
        if PEAKS.get(kind) and not (kind == "e4m3" and PEAKS.get("e4m3_emulated")):
            out[f"pct_{kind}_mma_peak"] = round(100 * achieved / PEAKS[kind], 1)
    return out


FP8_PATHS = {  # the two paths of fp8 KV on the CUDA kernels, chosen through the route's table
    "exact": lambda: routes.TABLE._replace(fp8_mma=False),
    "fp8_mma": lambda: routes.TABLE._replace(fp8_mma=True),
}


def time_fp8_paths(r, c, heads, make_new, o_new):
    """For an fp8 KV case: each path of FP8_PATHS timed on the same inputs (``make_new()`` -> (call, output)),
    its largest difference from the row's own output, and the fp8-mma path's shares of the instruction peaks."""
    for name, table in FP8_PATHS.items():
        with routes.using(table()):
            fn, o = make_new()
            fn()
            r[f"{name}_ms"] = round(bench(fn), 4)
            r[f"{name}_vs_row_max_abs_diff"] = (o.float() - o_new.float()).abs().max().item()
    r["exact_over_fp8_mma"] = round(r["exact_ms"] / r["fp8_mma_ms"], 3)
    r["fp8_mma_shares"] = instruction_shares(c, heads, r["fp8_mma_ms"])


def verify_cases(which):
    cases = []
    if which in ("all", "verify"):
        for prefix in (8192, 32768, 131072, 185000):
            for drafts in (1, 8, 16, 32):
                for tree in ("chain",) if drafts == 1 else ("chain", "tree"):
                    cases.append((prefix, drafts, 16, "bf16", tree, 1))
        for heads in (8, 32, 128):
            for prefix in (32768, 185000):
                cases.append((prefix, 8, heads, "bf16", "tree", 1))
        for prefix in (32768, 185000):
            cases.append((prefix, 8, 16, "fp8", "tree", 1))
            cases.append((prefix, 8, 16, "bf16", "tree", 64))
    if which in ("all", "verify", "fp8"):  # the fp8 / 8-head cases (8 drafts x 8 heads, both KV dtypes)
        for prefix in (32768, 131072, 185000):
            for kvd in ("bf16", "fp8"):
                case = (prefix, 8, 8, kvd, "tree", 1)
                if case not in cases:
                    cases.append(case)
            if (prefix, 8, 16, "fp8", "tree", 1) not in cases:
                cases.append((prefix, 8, 16, "fp8", "tree", 1))
    if which == "quick":
        cases = [
            (32768, 8, 16, "bf16", "tree", 1),
            (185000, 8, 16, "bf16", "tree", 1),
            (185000, 16, 16, "bf16", "tree", 1),
        ]
    return cases


def batched_verify_cases(which):
    """Target verify of several requests with fewer than 64 query rows each (4 drafts x 8 heads, 2 x 16): the
    cases of "Route: several requests" in docs/benchmarks.md, as (prefix, drafts, heads, kv dtype, tree, page
    size, batch). Only ``--cases verify-batch`` runs them."""
    if which != "verify-batch":
        return []
    return [
        (prefix, drafts, heads, kvd, "tree", 1, batch)
        for kvd in ("fp8", "bf16")
        for drafts, heads in ((4, 8), (2, 16))
        for batch in (4, 8)
        for prefix in (32768, 131072)
    ]


def decode_cases(which):
    cases = []
    if which in ("all", "decode"):
        for prefix in (8192, 32768, 131072, 185000):
            for batch in (1, 4, 32):
                cases.append((prefix, batch, 16, "bf16", 1))
        for prefix in (131072, 185000):
            cases.append((prefix, 1, 128, "bf16", 1))
            cases.append((prefix, 1, 16, "fp8", 1))
            cases.append((prefix, 1, 16, "bf16", 64))
    if which in (
        "all",
        "decode",
        "fp8",
        "fp8-decode",
    ):  # fp8 at every length (batch 1 and 4), 8 heads in both KV dtypes
        for prefix in (8192, 32768, 131072, 185000):
            for case in ((prefix, 1, 16, "fp8", 1), (prefix, 4, 16, "fp8", 1)):
                if case not in cases:
                    cases.append(case)
        for prefix in (32768, 131072, 185000):
            for kvd in ("bf16", "fp8"):
                cases.append((prefix, 1, 8, kvd, 1))
    if which == "quick":
        cases = [(131072, 1, 16, "bf16", 1), (185000, 1, 16, "bf16", 1)]
    return cases


SWEEP_TILES = {
    # (block_t, block_h, block_n, num_warps, num_stages): each compiles for sm_120 within 101376 B with
    # V read from K or separately (sm120kit audit; docs/benchmarks.md lists the bytes).
    "decode": [(1, 16, bn, w, st) for bn in (16, 32) for w in (4, 8) for st in (2, 3)],
    "verify": [(bt, 16, 32, w, st) for bt in (1, 2) for w in (4, 8) for st in (2, 3)],
}


SWEEP_SPLITS = {  # (case, tiles, split counts) for the finer sweep around the defaults
    "decode": ([(1, 16, 32, 4, 3), (1, 16, 32, 4, 2), (1, 16, 16, 4, 6)], (128, 256, 384, 512)),
    "verify": ([(2, 16, 32, 4, 3), (2, 16, 32, 4, 2), (1, 16, 32, 4, 3)], (33, 66, 132, 264)),
}


def sweep_splits(mla, roof):
    """Split counts beyond the default cap, and the largest tiles that fit, at prefix 185k."""
    out = []
    for kind, c in (
        ("decode", decode_case(185000, 1, 16, "bf16", 1)),
        ("verify", verify_case(185000, 8, 16, "bf16", "tree", 1)),
    ):
        is_dec = kind == "decode"
        max_tok = 1 if is_dec else c["max_len"]
        o = torch.empty(c["q"].shape[0], 16, LV, dtype=torch.bfloat16, device="cuda")
        tail = None if is_dec else (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])
        tiles, split_counts = SWEEP_SPLITS[kind]
        for cfg in tiles:
            for splits in split_counts:
                table = routes.TABLE._replace(tiles=routes.TileConfig(*cfg), splits=splits)
                fn = lambda: split_attention(mla, c, o, tail, 1, max_tok, table=table, v_from_k=True)  # noqa: E731
                try:
                    t = bench(fn)
                except Exception as e:  # noqa: BLE001
                    out.append({"kind": kind, "cfg": list(cfg), "splits": splits, "error": str(e)[:100]})
                    continue
                r = row(kind, f"{kind} p185000 n{max_tok} b1", c, 16, None, t, roof, None)
                out.append(
                    {
                        "kind": kind,
                        "case": r["case"],
                        "cfg": list(cfg),
                        "splits": splits,
                        "ms": round(t, 4),
                        "pct": r["pct_roofline_new"],
                    }
                )
                print(json.dumps(out[-1]), flush=True)
        del c
    return out


def sweep(mla, roof):
    """Time tile sets, V-from-K and split counts (waves of the SM count) on a few cases."""
    out = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for kind, c, heads in (
        ("decode", decode_case(185000, 1, 16, "bf16", 1), 16),
        ("verify", verify_case(185000, 8, 16, "bf16", "tree", 1), 16),
        ("decode", decode_case(32768, 32, 16, "bf16", 1), 16),
        ("verify", verify_case(32768, 16, 16, "bf16", "tree", 1), 16),
    ):
        is_dec = kind == "decode"
        max_tok = 1 if is_dec else c["max_len"]
        batch = len(c["prefix_lens"])
        o = torch.empty(c["q"].shape[0], heads, LV, dtype=torch.bfloat16, device="cuda")
        tail = None if is_dec else (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])
        ref_out = None
        for bt, bh, bn, w, st in SWEEP_TILES[kind]:
            for vfk in (True, False):
                for waves in (2, 4, 8):
                    cfg = routes.TileConfig(bt, bh, bn, w, st)
                    nblk = -(-max_tok // bt)
                    splits = routes.num_splits_for(nblk * batch, sms, waves)
                    table = routes.TABLE._replace(tiles=cfg, splits=splits)
                    fn = lambda: split_attention(
                        mla,
                        c,
                        o,
                        tail,
                        batch,
                        max_tok,
                        table=table,  # noqa: E731
                        v_from_k=vfk,
                    )
                    try:
                        fn()
                        if ref_out is None:
                            ref_out = o.clone()
                        diff = (o.float() - ref_out.float()).abs().max().item()
                        t = bench(fn)
                    except Exception as e:  # noqa: BLE001
                        out.append({"kind": kind, "cfg": [bt, bh, bn, w, st, vfk, waves], "error": str(e)[:100]})
                        print(json.dumps(out[-1]), flush=True)
                        continue
                    r = row(kind, f"{kind} p{c['prefix_lens'][0]} n{max_tok} b{batch}", c, heads, None, t, roof, None)
                    out.append(
                        {
                            "kind": kind,
                            "case": r["case"],
                            "cfg": [bt, bh, bn, w, st, vfk, waves],
                            "splits": splits,
                            "ms": round(t, 4),
                            "pct": r["pct_roofline_new"],
                            "diff": round(diff, 5),
                        }
                    )
                    print(json.dumps(out[-1]), flush=True)
        del c
    return out


# Variants timed by --sweep-tiles against the launchers' own pick, on the cases that decide the defaults:
# (tiles (block_t, block_h, block_n, num_warps, num_stages) or None for the pick, waves of programs or None
# for the pick's split count, merge (value dims, slots per step, warps) or None for the default). Every tile set
# compiles for sm_120 within 101376 B (tests/kernels/test_mla_kernels.py).
SWEEP_VARIANTS = {
    "decode": [
        (None, None, (128, 16, 4)),
        (None, None, (32, 64, 4)),
        (None, None, (128, 64, 4)),
        ((1, 16, 32, 4, 4), None, None),
        ((1, 16, 32, 4, 5), None, None),
        ((1, 16, 32, 4, 3), 4, None),
    ],
    "verify": [
        (None, None, (128, 16, 4)),
        (None, 1, None),
        (None, 4, None),
        ((2, 16, 32, 4, 4), None, None),
        ((1, 16, 32, 4, 3), None, None),
    ],
}
SWEEP_TILE_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype)
    ("verify", 185000, 8, 16, "bf16"),
    ("verify", 185000, 32, 16, "bf16"),
    ("verify", 32768, 32, 16, "bf16"),
    ("decode", 185000, 1, 16, "bf16"),
    ("decode", 131072, 1, 16, "bf16"),
    ("decode", 32768, 4, 16, "bf16"),
]


def split_attention(mla, c, o, tail, batch, max_tok, scale=1.0, table=None, v_from_k=None, lse=None):
    """The split attention of module ``mla`` on case ``c`` into ``o`` (verify with ``tail``, decode without), by
    the route its launcher picks, or, with ``table`` (the route's thresholds) or ``v_from_k`` (V read from K's
    rows or apart) given, by the route chosen for the call with them."""
    q_indptr = None if tail is None else c["qo_indptr"]
    args = (c["q"], c["k_pool"], c["v_pool"], o, q_indptr, c["kv_indptr"], c["kv_indices"], batch, max_tok)
    route = None
    if table is not None or v_from_k is not None:
        call = mla.call_of(*args, tail, lse)
        route = mla.routes.choose(call if v_from_k is None else call._replace(v_from_k=v_from_k), table)
    mla._run_split_attention(
        *args, 1 / LK**0.5, scale, scale, tail=tail, lse_out=lse, **({} if route is None else {"route": route})
    )


def _sweep_case(mla, kind, prefix, n, heads, kvd):
    """One sweep case on the GPU and a call of the split attention on it, by the launcher's route or one
    chosen with another route table (None: the launcher's own)."""
    is_dec = kind == "decode"
    c = decode_case(prefix, n, heads, kvd, 1) if is_dec else verify_case(prefix, n, heads, kvd, "tree", 1)
    max_tok = 1 if is_dec else c["max_len"]
    batch = len(c["prefix_lens"])
    scale = 0.5 if kvd == "fp8" else 1.0
    o = torch.empty(c["q"].shape[0], heads, LV, dtype=torch.bfloat16, device="cuda")
    tail = None if is_dec else (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])

    def call(table=None):
        split_attention(mla, c, o, tail, batch, max_tok, scale, table)

    return c, o, call, max_tok, batch


def sweep_tiles(mla, roof):
    """Each variant of SWEEP_VARIANTS on each case of SWEEP_TILE_CASES; outputs compared with the pick's."""
    out = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for kind, prefix, n, heads, kvd in SWEEP_TILE_CASES:
        c, o, call, max_tok, batch = _sweep_case(mla, kind, prefix, n, heads, kvd)
        label = f"{kind} p{prefix} n{n} h{heads} {kvd}"
        pick = routes.pick_tiles(LK, LV, heads, max_tok)
        ref_out, t_pick = _timed_base(out, label, "pick", c, heads, call, o, roof, tiles=list(pick))
        for tiles, waves, merge in SWEEP_VARIANTS[kind]:
            cfg = routes.TileConfig(*tiles) if tiles else pick
            splits = None
            if waves:
                rows_blocks = -(-heads // cfg.block_h) * -(-max_tok // cfg.block_t)
                splits = routes.num_splits_for(rows_blocks * batch, sms, waves)
            variant = {"tiles": list(cfg), "waves": waves, "splits": splits, "merge": merge}
            table = routes.TABLE._replace(tiles=cfg, splits=splits, merge=merge or routes.TABLE.merge)
            _timed_variant(out, label, variant, c, heads, lambda: call(table), ref_out, o, t_pick, roof)
        del c
    return out


SWEEP_PREFIX_CASES = [  # (prefix, drafts, heads, kv dtype): MLA verify cases that decide the prefix defaults
    (185000, 8, 16, "bf16"),
    (32768, 8, 16, "bf16"),
    (32768, 8, 8, "bf16"),
    (32768, 32, 16, "bf16"),
    (185000, 8, 16, "fp8"),
    (32768, 8, 16, "fp8"),
    (32768, 1, 16, "bf16"),
]
# (label, rescale slack): the CUDA prefix kernel's choices, each timed against the Triton prefix kernel on
# the same inputs; -inf rescales the output at every step, as a textbook online softmax does.
SWEEP_PREFIX_VARIANTS = [("mma, rescale every step", float("-inf")), ("mma, rescale past 8", 8.0)]
SWEEP_MERGE_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype)
    ("verify", 32768, 8, 16, "bf16"),
    ("verify", 32768, 8, 8, "bf16"),
    ("verify", 32768, 1, 16, "bf16"),
    ("verify", 185000, 8, 16, "bf16"),
    ("decode", 32768, 1, 16, "bf16"),
    ("decode", 185000, 1, 16, "bf16"),
    ("decode", 32768, 4, 16, "bf16"),
]
SWEEP_MERGES = [
    (64, 64, 4),
    (64, 128, 4),
    (32, 128, 4),
    (128, 64, 4),
    (128, 64, 8),
    (128, 128, 8),
    (256, 32, 4),
    (256, 64, 8),
]  # (value dims, slots per step, warps) of a merge program


def _timed_base(out, label, name, c, heads, fn, o, roof, **fields):
    """Run and time the call every variant of a sweep case is compared with; append its record (with
    ``fields``) and return (its output, its time)."""
    fn()
    ref_out = o.clone()
    t = bench(fn)
    out.append(
        {
            "case": label,
            "variant": name,
            "ms": round(t, 4),
            "pct": row(label.split()[0], label, c, heads, None, t, roof, None)["pct_roofline_new"],
            **fields,
        }
    )
    print(json.dumps(out[-1]), flush=True)
    return ref_out, t


def _timed_variant(out, label, name, c, heads, fn, ref_out, o, t_base, roof):
    """Run ``fn`` once (its output compared with ``ref_out``), time it, and append one sweep record."""
    try:
        fn()
        diff = (o.float() - ref_out.float()).abs().max().item()
        t = bench(fn)
    except Exception as e:  # noqa: BLE001
        out.append({"case": label, "variant": name, "error": str(e)[:200]})
    else:
        kind = label.split()[0]
        out.append(
            {
                "case": label,
                "variant": name,
                "ms": round(t, 4),
                "pct": row(kind, label, c, heads, None, t, roof, None)["pct_roofline_new"],
                "base_over_variant": round(t_base / t, 3),
                "diff": round(diff, 5),
            }
        )
    print(json.dumps(out[-1]), flush=True)


def sweep_prefix(mla, roof):
    """On the same inputs: the Triton prefix kernel, and the CUDA mma.sync prefix kernel with each variant
    of SWEEP_PREFIX_VARIANTS (one wave of programs, the launcher's tail placement). Outputs compared with
    the Triton kernel's."""
    out = []
    slack = mla.cuda_prefix.RESCALE_SLACK
    for prefix, n, heads, kvd in SWEEP_PREFIX_CASES:
        c, o, call, max_tok, batch = _sweep_case(mla, "verify", prefix, n, heads, kvd)
        label = f"verify p{prefix} n{n} h{heads} {kvd}"
        ref_out, t_tri = _timed_base(
            out, label, "triton prefix kernel", c, heads, lambda: call(routes.force(routes.TRITON)), o, roof
        )
        # the 64-row CUDA programs, in one launch where the launcher would take it
        mma64 = routes.TABLE._replace(mma_min_rows=0)
        for name, variant_slack in SWEEP_PREFIX_VARIANTS:
            mla.cuda_prefix.RESCALE_SLACK = variant_slack
            try:
                _timed_variant(out, label, name, c, heads, lambda: call(mma64), ref_out, o, t_tri, roof)
            finally:
                mla.cuda_prefix.RESCALE_SLACK = slack
        del c
    return out


def sweep_merge(mla, roof):
    """The merge's program shape (SWEEP_MERGES) on SWEEP_MERGE_CASES, against the launchers' default."""
    out = []
    for kind, prefix, n, heads, kvd in SWEEP_MERGE_CASES:
        c, o, call, _, _ = _sweep_case(mla, kind, prefix, n, heads, kvd)
        label = f"{kind} p{prefix} n{n} h{heads} {kvd}"
        default = list(routes.TABLE.merge)
        ref_out, t_pick = _timed_base(out, label, f"merge {default} (default)", c, heads, call, o, roof)
        for merge in SWEEP_MERGES:
            _timed_variant(
                out,
                label,
                f"merge {list(merge)}",
                c,
                heads,
                lambda: call(routes.TABLE._replace(merge=merge)),
                ref_out,
                o,
                t_pick,
                roof,
            )
        del c
    return out


SWEEP_FUSED_CASES = [  # (prefix, drafts, heads, kv dtype): MLA verify through the CUDA kernel
    (32768, 8, 16, "bf16"),
    (32768, 8, 8, "bf16"),
    (32768, 16, 16, "bf16"),
    (32768, 32, 16, "bf16"),
    (32768, 8, 32, "bf16"),
    (32768, 8, 16, "fp8"),
    (185000, 8, 16, "bf16"),
    (185000, 16, 16, "bf16"),
    (185000, 32, 16, "bf16"),
    (185000, 8, 8, "bf16"),
    (185000, 8, 16, "fp8"),
    (8192, 8, 16, "bf16"),
]
SWEEP_CHUNK_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype): where the fewest tokens a split
    ("verify", 32768, 1, 16, "bf16"),
    ("verify", 8192, 1, 16, "bf16"),
    ("decode", 32768, 1, 16, "bf16"),  # walks
    ("decode", 8192, 1, 16, "bf16"),
    ("decode", 32768, 4, 16, "bf16"),
    ("decode", 131072, 1, 16, "bf16"),
    ("verify", 131072, 1, 16, "bf16"),
]
SWEEP_CHUNKS = (64, 128, 256)


def sweep_fused(mla, roof):
    """MLA verify in one cooperative launch (prefix splits, draft tail, merge) against the three kernels
    of the unfused path, on SWEEP_FUSED_CASES; then the fewest prefix tokens a split walks
    (SWEEP_CHUNKS against the launcher's choice) on SWEEP_CHUNK_CASES."""
    out = []
    for prefix, n, heads, kvd in SWEEP_FUSED_CASES:
        c, o, call, _, _ = _sweep_case(mla, "verify", prefix, n, heads, kvd)
        label = f"verify p{prefix} n{n} h{heads} {kvd}"
        ref_out, t_base = _timed_base(
            out,
            label,
            "three kernels",
            c,
            heads,
            lambda: call(routes.TABLE._replace(one_launch_max_programs=0)),
            o,
            roof,
        )
        _timed_variant(
            out,
            label,
            "one cooperative launch",
            c,
            heads,
            lambda: call(routes.TABLE._replace(one_launch_max_programs=routes.NEVER)),
            ref_out,
            o,
            t_base,
            roof,
        )
        del c
    for kind, prefix, n, heads, kvd in SWEEP_CHUNK_CASES:
        c, o, call, _, _ = _sweep_case(mla, kind, prefix, n, heads, kvd)
        label = f"{kind} p{prefix} n{n} h{heads} {kvd}"
        ref_out, t_base = _timed_base(out, label, "min chunk: the launcher's", c, heads, call, o, roof)
        for chunk in SWEEP_CHUNKS:
            table = routes.TABLE._replace(min_chunk=chunk, min_chunk_one=chunk)
            _timed_variant(out, label, f"min chunk {chunk}", c, heads, lambda: call(table), ref_out, o, t_base, roof)
        del c
    return out


def _eager_and_replay(run, outputs, replays=1):
    """Run ``run`` once, then capture it in a CUDA graph and replay it ``replays`` times into zeroed
    ``outputs``: (copies of the outputs of the eager run, max abs difference of the replay's first output)."""
    run()
    torch.cuda.synchronize()
    eager = [t.clone() for t in outputs]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for t in outputs:
        t.zero_()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    return eager, (outputs[0].float() - eager[0].float()).abs().max().item()


def fused_numerics(mla):
    """The cooperative-launch verify against the float32 reference and the unfused path on the same
    inputs: bf16/fp8 KV, int32/int64 slots, V of the tail as SGLang passes it (its own tensor), uneven
    batches, a mask row with no draft column, and a replay from a CUDA graph."""
    out = []
    for kvd, idx64, own_v, heads in (
        ("bf16", False, True, 16),
        ("fp8", False, True, 16),
        ("bf16", True, False, 8),
        ("fp8", True, True, 4),
    ):
        scale = 0.5 if kvd == "fp8" else 1.0
        c = ref.make_verify_case(
            [3000, 517, 40, 9000],
            [8, 3, 16, 8],
            heads=heads,
            lk=LK,
            lv=LV,
            dtype=torch.bfloat16,
            tree="tree",
            seed=heads + idx64,
            device="cuda",
        )
        if kvd == "fp8":
            c["k_pool"] = (c["k_pool"].float() / scale).to(torch.float8_e4m3fn)
            c["v_pool"] = c["k_pool"][:, :, :LV]
        if idx64:
            c["kv_indices"] = c["kv_indices"].to(torch.int64)
        if own_v:
            c["v_ext"] = c["k_ext"][:, :, :LV].contiguous()
        # Request 1's first draft token sees none of the draft tail (the prefix only).
        kv1 = int(c["kv_indptr"][2] - c["kv_indptr"][1])
        m1 = int(c["mask_indptr"][1])
        c["custom_mask"][m1 + kv1 : m1 + kv1 + 3] = False
        tail = (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])
        outs = {}
        for fused in (True, False):
            o = torch.zeros(c["q"].shape[0], heads, LV, dtype=torch.bfloat16, device="cuda")
            table = routes.TABLE._replace(one_launch_max_programs=routes.NEVER if fused else 0)

            def run():
                split_attention(mla, c, o, tail, 4, c["max_len"], scale, table)

            (eager,), replay_diff = _eager_and_replay(run, [o], replays=2)  # twice: the barrier words are reused
            outs[fused] = (eager, replay_diff)
        ref_o = ref.reference_verify(c, k_scale=scale, v_scale=scale)
        out.append(
            {
                "check": "verify-fused",
                "kv": kvd,
                "kv_indices": "int64" if idx64 else "int32",
                "v_ext": "own tensor" if own_v else "view of k_ext",
                "heads": heads,
                "max_abs_diff_fused": round((outs[True][0].float() - ref_o).abs().max().item(), 5),
                "max_abs_diff_unfused": round((outs[False][0].float() - ref_o).abs().max().item(), 5),
                "fused_vs_unfused": round((outs[True][0].float() - outs[False][0].float()).abs().max().item(), 5),
                "graph_replay_vs_eager": round(max(outs[True][1], outs[False][1]), 6),
            }
        )
        print(json.dumps(out[-1]), flush=True)
        del c
    return out


SWEEP_ROWS16_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype): few query rows a request
    ("verify", 32768, 1, 16, "bf16"),
    ("verify", 8192, 1, 16, "bf16"),
    ("verify", 131072, 1, 16, "bf16"),
    ("verify", 185000, 1, 16, "bf16"),
    ("verify", 32768, 1, 16, "fp8"),
    ("verify", 32768, 2, 16, "bf16"),
    ("verify", 32768, 8, 4, "bf16"),
    ("decode", 8192, 1, 16, "bf16"),
    ("decode", 32768, 1, 16, "bf16"),
    ("decode", 131072, 1, 16, "bf16"),
    ("decode", 185000, 1, 16, "bf16"),
    ("decode", 185000, 1, 16, "fp8"),
    ("decode", 32768, 4, 16, "bf16"),
    ("decode", 185000, 4, 16, "bf16"),
    ("decode", 185000, 1, 128, "bf16"),
    ("decode", 32768, 1, 128, "bf16"),
    ("decode", 8192, 1, 8, "bf16"),
    ("decode", 32768, 1, 8, "bf16"),
    ("decode", 131072, 1, 8, "bf16"),
    ("decode", 185000, 1, 8, "bf16"),
    ("decode", 32768, 4, 8, "bf16"),
    ("decode", 185000, 4, 8, "bf16"),
]


def sweep_rows16(mla, roof, heads_only=None):
    """The CUDA kernel where a request has few query rows (16-row programs in one launch; 64-row ones for
    decode with 128 heads) against the Triton prefix kernel and merge, on SWEEP_ROWS16_CASES (those of
    ``heads_only`` heads where given); for the 16-row cases also the fewest tokens a split walks (the route's
    min_chunk against its own choice)."""
    out = []
    for kind, prefix, n, heads, kvd in SWEEP_ROWS16_CASES:
        if heads_only is not None and heads != heads_only:
            continue
        c, o, call, _, _ = _sweep_case(mla, kind, prefix, n, heads, kvd)
        label = f"{kind} p{prefix} n{n} h{heads} {kvd}"
        ref_out, t_base = _timed_base(
            out, label, "triton prefix kernel and merge", c, heads, lambda: call(routes.force(routes.TRITON)), o, roof
        )
        _timed_variant(out, label, "cuda kernel (the launcher's pick)", c, heads, call, ref_out, o, t_base, roof)
        if heads * (1 if kind == "decode" else n) < routes.TABLE.mma_min_rows:
            rows16 = routes.force(routes.CUDA16_ONE_LAUNCH)
            chunk = routes.TABLE.min_chunk
            _timed_variant(
                out,
                label,
                f"cuda 16 rows, min chunk {chunk}",
                c,
                heads,
                lambda: call(rows16._replace(min_chunk_one=chunk)),
                ref_out,
                o,
                t_base,
                roof,
            )
            _timed_variant(
                out,
                label,
                "cuda 16 rows, the launcher's min chunk",
                c,
                heads,
                lambda: call(rows16),
                ref_out,
                o,
                t_base,
                roof,
            )
        del c
    return out


def rows16_numerics(mla):
    """The 16-row CUDA programs against the float32 reference and the Triton path on the same inputs:
    decode with the log-sum-exp SGLang keeps (bf16/fp8 KV, int32/int64 slots, 16 and 4 heads, uneven
    lengths), verify with one or two draft tokens a request (a mask row with no draft column), and a
    replay from a CUDA graph."""
    out = []
    for kvd, idx64, heads in (
        ("bf16", False, 16),
        ("fp8", True, 16),
        ("bf16", True, 4),
        ("fp8", False, 4),
        ("fp8", True, 8),
    ):
        scale = 0.5 if kvd == "fp8" else 1.0
        d = ref.make_decode_case(
            [3000, 517, 40, 1], heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, device="cuda", seed=heads + idx64
        )
        if kvd == "fp8":
            d["k_pool"] = (d["k_pool"].float() / scale).to(torch.float8_e4m3fn)
        d["v_pool"] = d["k_pool"][:, :, :LV]
        if idx64:
            d["kv_indices"] = d["kv_indices"].to(torch.int64)
        res = {}
        for prefix, table in (
            ("auto", None),
            ("cuda16", routes.force(routes.CUDA16_ONE_LAUNCH)),
            ("triton", routes.force(routes.TRITON)),
        ):
            o = torch.zeros(4, heads, LV, dtype=torch.bfloat16, device="cuda")
            lse = torch.zeros(4, heads, 8, dtype=torch.float32, device="cuda")

            def run():
                split_attention(mla, d, o, None, 4, 1, scale, table, lse=lse[:, :, 0])

            (eager, eager_lse), replay_diff = _eager_and_replay(run, [o, lse[:, :, 0]])
            res[prefix] = (eager, eager_lse, replay_diff)
        ref_o = ref.reference_decode(d, k_scale=scale, v_scale=scale)
        out.append(
            {
                "check": "decode-cuda16",
                "kv": kvd,
                "kv_indices": "int64" if idx64 else "int32",
                "heads": heads,
                "max_abs_diff_cuda": round((res["auto"][0].float() - ref_o).abs().max().item(), 5),
                "max_abs_diff_cuda16": round((res["cuda16"][0].float() - ref_o).abs().max().item(), 5),
                "max_abs_diff_triton": round((res["triton"][0].float() - ref_o).abs().max().item(), 5),
                "lse_cuda_vs_triton": round((res["auto"][1] - res["triton"][1]).abs().max().item(), 6),
                "lse_cuda16_vs_triton": round((res["cuda16"][1] - res["triton"][1]).abs().max().item(), 6),
                "graph_replay_vs_eager_cuda16": round(res["cuda16"][2], 6),
                "graph_replay_vs_eager": round(res["auto"][2], 6),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    for kvd, drafts in (("bf16", [1, 2]), ("fp8", [2, 1])):
        scale = 0.5 if kvd == "fp8" else 1.0
        c = ref.make_verify_case(
            [3000, 517], drafts, heads=16, lk=LK, lv=LV, dtype=torch.bfloat16, tree="tree", seed=7, device="cuda"
        )
        if kvd == "fp8":
            c["k_pool"] = (c["k_pool"].float() / scale).to(torch.float8_e4m3fn)
            c["v_pool"] = c["k_pool"][:, :, :LV]
        kv0 = int(c["kv_indptr"][1] - c["kv_indptr"][0])
        m0 = int(c["mask_indptr"][0])
        c["custom_mask"][m0 + kv0 : m0 + kv0 + drafts[0]] = False  # request 0's first token: the prefix only
        tail = (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])
        res = {}
        for prefix, table in (("auto", None), ("triton", routes.force(routes.TRITON))):
            o = torch.zeros(c["q"].shape[0], 16, LV, dtype=torch.bfloat16, device="cuda")
            split_attention(mla, c, o, tail, 2, c["max_len"], scale, table)
            res[prefix] = o
        ref_o = ref.reference_verify(c, k_scale=scale, v_scale=scale)
        out.append(
            {
                "check": "verify-cuda16",
                "kv": kvd,
                "drafts": drafts,
                "max_abs_diff_cuda": round((res["auto"].float() - ref_o).abs().max().item(), 5),
                "max_abs_diff_triton": round((res["triton"].float() - ref_o).abs().max().item(), 5),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


TIMELINE_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype, one launch): where a CUDA call's time goes
    ("verify", 8192, 8, 16, "bf16", True),
    ("verify", 32768, 8, 16, "bf16", True),
    ("verify", 32768, 8, 8, "bf16", True),
    ("verify", 32768, 8, 16, "bf16", False),
    ("verify", 185000, 8, 16, "bf16", True),
    ("verify", 32768, 1, 16, "bf16", True),
    ("decode", 8192, 1, 16, "bf16", True),
    ("decode", 32768, 1, 16, "bf16", True),
    ("verify", 32768, 8, 16, "fp8", True),
    ("decode", 32768, 1, 8, "fp8", True),
    ("decode", 185000, 1, 8, "fp8", True),
    ("decode", 185000, 1, 16, "fp8", True),
    ("decode", 185000, 4, 16, "fp8", True),
]  # fewer rows a request than the route's mma_min_rows: the 16-row programs, whether or not the route picks them
# Phases between the clock reads of the SM120_TIMELINE build (thread 0 of each program; sm120_mla_mma.py).
TIMELINE_PHASES = [
    "queries and KV slots of tiles 0-1",
    "queries to registers and tile 0",
    "KV loop after tile 0",
    "store",
    "grid barrier",
    "merge: loads",
    "merge: sum and store",
]


def barrier_arrivals(rows, mhz):
    """When the programs of a one launch reached the grid barrier, from timeline rows (global timer at entry in slot
    0, SM clock at the body's start in slot 1 and at the barrier in slot 5; ``mhz``: SM clocks a microsecond): each
    arrival as its program's entry time plus its clocks since, in microseconds from the median arrival to the last
    and from the first to the last. The median program waits the first figure for the slowest, which balancing the
    programs' work could save; the rest of its barrier phase is the barrier's own latency."""
    import statistics

    times = [r[0] + (r[5] - r[1]) / mhz * 1e3 for r in rows if r[5] and r[1]]
    if not times:
        return None
    last = max(times)
    return [round((last - statistics.median(times)) / 1e3, 2), round((last - min(times)) / 1e3, 2)]


def timeline(mla, roof, defines=(), keep=lambda case: True):
    """Each TIMELINE_CASES call once through a build of the CUDA kernels that records, per program, the global
    timer at entry and exit and its SM clock between phases: the median phase times over the programs, the
    spread of their starts, and first start to last exit against the call's time (CUDA events). ``defines``:
    more -D flags for that build (``STAGES16_FP8=3``: another stage count of the 16-row fp8 programs;
    ``SM120_PROBE_NO_KV_LOADS``: the 16-row fp8 loop asks for no tile after the first three, so it times the math
    alone; ``SM120_PROBE_NO_MATH``: that loop only waits for its tiles and asks for the next, so it times the
    copies alone). ``keep``: which TIMELINE_CASES to run."""
    import ctypes
    import statistics

    mma = mla.cuda_prefix
    dev = torch.cuda.current_device()
    normal = mma.kernel(torch.device("cuda", dev))
    major, minor = torch.cuda.get_device_capability()
    tl_kernel = mma._Kernel(
        mma.compile_cubin(f"sm_{major}{minor}" + ("a" if major >= 9 else ""), defines=("SM120_TIMELINE", *defines))
    )
    address, nbytes = tl_kernel.module.global_address("sm120_timeline")
    ptr, size = ctypes.c_uint64(address), ctypes.c_size_t(nbytes)
    drv = tl_kernel.module.driver
    host = (ctypes.c_uint64 * (size.value // 8))()
    out = []
    mma._KERNELS[dev] = tl_kernel
    try:
        for kind, prefix, n, heads, kvd, fused in filter(keep, TIMELINE_CASES):
            c, o, call, _, _ = _sweep_case(mla, kind, prefix, n, heads, kvd)
            rows16 = heads * (1 if kind == "decode" else n) < routes.TABLE.mma_min_rows
            table = (
                routes.force(routes.CUDA16_ONE_LAUNCH)
                if rows16
                else routes.TABLE._replace(one_launch_max_programs=routes.NEVER if fused else 0)
            )
            fn = lambda: call(table)  # noqa: E731
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            drv.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), size)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            drv.cuMemcpyDtoH_v2(host, ptr, size)
            rows = [host[i * 10 : (i + 1) * 10] for i in range(size.value // 80)]
            rows = [r for r in rows if r[0] and r[9]]
            if not rows:
                out.append({"case": f"{kind} p{prefix} n{n} h{heads} {kvd}", "error": "no CUDA program ran"})
                continue
            last = 8 if fused or rows16 else 5
            mhz = statistics.median((r[last] - r[1]) / max(1, r[9] - r[0]) * 1e3 for r in rows)
            phases = {}
            for i, name in enumerate(TIMELINE_PHASES[: last - 1]):
                vals = [(r[i + 2] - r[i + 1]) / mhz for r in rows if r[i + 2] and r[i + 1]]
                if vals:
                    phases[name] = [round(statistics.median(vals), 2), round(max(vals), 2)]
            merged = [(r[8] - r[6]) / mhz for r in rows if last == 8 and r[7] and r[6]]
            if merged:  # the programs that merge (with few rows, not all of them)
                phases["merge (programs that merge)"] = [
                    round(statistics.median(merged), 2),
                    round(max(merged), 2),
                    len(merged),
                ]
            first, final = min(r[0] for r in rows), max(r[9] for r in rows)
            arrivals = barrier_arrivals(rows, mhz) if last == 8 else None
            out.append(
                {
                    "case": f"{kind} p{prefix} n{n} h{heads} {kvd}",
                    "defines": list(defines),
                    "one launch": fused,
                    "programs": len(rows),
                    "call_us (events)": round(start.elapsed_time(end) * 1e3, 2),
                    "first start to last exit us": round((final - first) / 1e3, 2),
                    "start spread us": round((max(r[0] for r in rows) - first) / 1e3, 2),
                    "exit spread us": round((final - min(r[9] for r in rows)) / 1e3, 2),
                    "sm clock MHz": round(mhz),
                    "phases us [median, max]": phases,
                }
            )
            if arrivals:
                out[-1]["barrier arrivals us [median to last, first to last]"] = arrivals
            print(json.dumps(out[-1]), flush=True)
            del c
    finally:
        mma._KERNELS[dev] = normal
    return out


PROFILE_CASES = [  # (kind, prefix, drafts or batch, heads, kv dtype): where the time of a call goes
    ("verify", 32768, 8, 16, "bf16"),
    ("verify", 32768, 8, 8, "bf16"),
    ("verify", 32768, 1, 16, "bf16"),
    ("verify", 185000, 8, 16, "bf16"),
    ("decode", 32768, 1, 16, "bf16"),
    ("verify", 32768, 8, 16, "fp8"),
    ("verify", 32768, 2, 16, "bf16"),
]


def profile(modules, roof, calls=50):
    """GPU time per call of each kernel the launchers of each module run (torch.profiler over plain
    launches), beside the whole call timed by CUDA graph replay; ``modules`` maps a label to a module."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    out = []
    for kind, prefix, n, heads, kvd in PROFILE_CASES:
        label = f"{kind} p{prefix} n{n} h{heads} {kvd}"
        for name, mla in modules.items():
            c, o, call, _, _ = _sweep_case(mla, kind, prefix, n, heads, kvd)
            t_graph = bench(call)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / calls
            out.append(
                {
                    "case": label,
                    "module": name,
                    "graph_us": round(t_graph * 1e3, 2),
                    "pct": row(kind, label, c, heads, None, t_graph, roof, None)["pct_roofline_new"],
                    "kernels_us": {k[:60]: round(v, 2) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])},
                }
            )
            print(json.dumps(out[-1]), flush=True)
            del c
    return out


def numerics(mla):
    """bf16 and fp8 on the GPU against the float32 reference: GQA and MLA, batches of uneven requests."""
    out = []
    for kvh, lk, lv, heads, kvd in (
        (1, 576, 512, 16, "bf16"),
        (1, 576, 512, 128, "bf16"),
        (1, 576, 512, 4, "bf16"),
        (1, 576, 512, 16, "fp8"),
        (8, 128, 128, 64, "bf16"),
        (4, 128, 128, 32, "fp8"),
        (2, 256, 256, 16, "bf16"),
    ):
        kv_dtype = torch.float8_e4m3fn if kvd == "fp8" else torch.bfloat16
        scale = 0.5 if kvd == "fp8" else 1.0
        c = ref.make_verify_case(
            [3000, 517, 40],
            [8, 3, 16],
            heads=heads,
            kv_heads=kvh,
            lk=lk,
            lv=lv,
            dtype=torch.bfloat16,
            tree="tree",
            seed=kvh + lk,
            device="cuda",
        )
        if kvd == "fp8":
            c["k_pool"] = (c["k_pool"].float() / scale).to(kv_dtype)
            c["v_pool"] = c["k_pool"][:, :, :lv] if lk > lv else (c["v_pool"].float() / scale).to(kv_dtype)
        o = torch.zeros(c["q"].shape[0], heads, lv, dtype=torch.bfloat16, device="cuda")
        ran = mla.sm120_tree_verify_fwd(*ref.verify_args(c, o, scale, scale))
        diff = (o.float() - ref.reference_verify(c, k_scale=scale, v_scale=scale)).abs().max().item()
        uses_mma = (
            mla.cuda_prefix.kernel(o.device) is not None and lk == 576 and heads * 16 >= routes.TABLE.mma_min_rows
        )
        out.append(
            {
                "check": "verify",
                "kv_heads": kvh,
                "lk": lk,
                "lv": lv,
                "heads": heads,
                "kv": kvd,
                "ran": ran,
                "prefix_kernel": "mma" if uses_mma else "triton",
                "mma_error": mla.cuda_prefix.error(o.device),
                "max_abs_diff": round(diff, 5),
            }
        )
        print(json.dumps(out[-1]), flush=True)
        if kvh == 1:
            d = ref.make_decode_case([3000, 517, 40, 1], heads=heads, lk=lk, lv=lv, dtype=torch.bfloat16, device="cuda")
            if kvd == "fp8":
                d["k_pool"] = (d["k_pool"].float() / scale).to(kv_dtype)
                d["v_pool"] = d["k_pool"][:, :, :lv]
            o = torch.zeros(4, heads, lv, dtype=torch.bfloat16, device="cuda")
            ran = mla.sm120_mla_decode_fwd(
                d["q"],
                d["k_pool"],
                d["v_pool"],
                o,
                d["kv_indptr"],
                d["kv_indices"],
                None,
                None,
                None,
                None,
                None,
                scale,
                scale,
            )
            diff = (o.float() - ref.reference_decode(d, k_scale=scale, v_scale=scale)).abs().max().item()
            out.append(
                {"check": "decode", "lk": lk, "heads": heads, "kv": kvd, "ran": ran, "max_abs_diff": round(diff, 5)}
            )
            print(json.dumps(out[-1]), flush=True)
    return out


FP8_MMA_NUMERICS = [  # (kind, prefix lengths, drafts, heads, int64 slots, query scale): fp8 KV, kv scale 0.5
    ("decode", [3000, 517, 40, 1], None, 16, False, 1.0),
    ("decode", [3000, 517, 40, 1], None, 4, True, 1.0),
    ("decode", [3000, 517, 40, 1], None, 8, False, 1.0),
    ("decode", [32768, 3000], None, 16, False, 1.0),
    ("decode", [3000, 517, 40, 1], None, 16, False, 8.0),  # sharp attention: queries 8x larger
    ("verify", [3000, 517, 40], [8, 3, 16], 16, False, 1.0),
    ("verify", [3000, 517, 40, 9000], [8, 3, 16, 8], 4, True, 1.0),
    ("verify", [3000, 517], [2, 1], 16, False, 1.0),
    ("verify", [32768], [8], 8, False, 1.0),
    ("verify", [3000, 517, 40], [8, 3, 16], 16, False, 8.0),
]


def route_of(fn):
    """The route the launcher took for the last call ``fn`` made (its answer from ``routes.choose``, seen by
    wrapping that function for the call)."""
    seen, choose = [], routes.choose

    def spy(call, table=None):
        seen.append(choose(call, table))
        return seen[-1]

    routes.choose = spy
    try:
        fn()
    finally:
        routes.choose = choose
    return seen[-1]


def fp8_mma_numerics(mla, ext, dec):
    """fp8 KV: the error of the fp8-mma path against the float32 reference beside the exact path's and SGLang's
    own fp8 kernels' (``decode_attention_fwd`` at 64 splits, ``extend_attention_fwd``) on the same inputs, over
    FP8_MMA_NUMERICS (decode through the 16-row programs, verify through the 16- and 64-row ones); the fp8-mma
    path against the float32 reference with the queries quantized as it does (``q_e4m3``: what is left is the
    kernel's own rounding); and the fp8-mma path captured in a CUDA graph and replayed against its eager runs."""
    out = []
    for kind, prefix, drafts, heads, idx64, q_mul in FP8_MMA_NUMERICS:
        scale = 0.5
        seed = sum(prefix) + heads
        if kind == "decode":
            c = ref.make_decode_case(prefix, heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, device="cuda", seed=seed)
        else:
            c = ref.make_verify_case(
                prefix, drafts, heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, tree="tree", seed=seed, device="cuda"
            )
        c["q"] = (c["q"].float() * q_mul).to(torch.bfloat16)
        c["k_pool"] = (c["k_pool"].float() / scale).to(torch.float8_e4m3fn)
        c["v_pool"] = c["k_pool"][:, :, :LV]
        c["v_ext"] = c["k_ext"][:, :, :LV]
        if idx64:
            c["kv_indices"] = c["kv_indices"].to(torch.int64)
        reference = ref.reference_decode if kind == "decode" else ref.reference_verify
        ref_o = reference(c, k_scale=scale, v_scale=scale)
        ref_q8 = reference(c, k_scale=scale, v_scale=scale, q_e4m3=True)  # the queries quantized as the kernel does
        res = {"check": "fp8-mma", "kind": kind, "prefix": prefix, "drafts": drafts, "heads": heads}
        res.update({"kv_indices": "int64" if idx64 else "int32", "query_scale": q_mul})
        for name, table in FP8_PATHS.items():
            with routes.using(table()):
                if kind == "decode":
                    new, old, o_new, o_old = run_decode(mla, dec, c, heads, 64, scale, 1)
                else:
                    new, old, o_new, o_old = run_verify(mla, ext, c, heads, 1, scale)
                route = route_of(new)
                res[f"path_{name}"] = path_label(route)
                (eager,), replay = _eager_and_replay(new, [o_new], replays=2)
                res[f"max_abs_diff_{name}"] = round((eager.float() - ref_o).abs().max().item(), 6)
                res[f"graph_replay_vs_eager_{name}"] = round(replay, 6)
                if name == "fp8_mma":
                    res["fp8_mma_vs_e4m3_query_reference"] = round((eager.float() - ref_q8).abs().max().item(), 6)
        try:
            old()
            torch.cuda.synchronize()
            res["max_abs_diff_sglang"] = round((o_old.float() - ref_o).abs().max().item(), 6)
        except Exception as e:  # noqa: BLE001
            res["max_abs_diff_sglang"] = f"SGLang kernel failed: {str(e)[:80]}"
        out.append(res)
        print(json.dumps(res), flush=True)
        del c
    # A graph captured at one set of lengths, replayed at others (the same buffers, lengths changed in place).
    out.append(fp8_mma_replay_lengths(mla))
    print(json.dumps(out[-1]), flush=True)
    return out


def fp8_mma_replay_lengths(mla):
    """The fp8-mma decode captured in a CUDA graph at prefix lengths (3000, 517) and replayed after the lengths
    change in place to (1200, 2317) (same slots, same total): the replay against an eager run at the new
    lengths, which must be exact."""
    scale = 0.5
    c = ref.make_decode_case([3000, 517], heads=16, lk=LK, lv=LV, dtype=torch.bfloat16, device="cuda", seed=11)
    c["k_pool"] = (c["k_pool"].float() / scale).to(torch.float8_e4m3fn)
    c["v_pool"] = c["k_pool"][:, :, :LV]
    with routes.using(FP8_PATHS["fp8_mma"]()):
        new, _, o_new, _ = run_decode(mla, None, c, 16, 64, scale, 1)
        new()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            new()
        c["kv_indptr"][1] = 1200
        o_new.zero_()
        g.replay()
        torch.cuda.synchronize()
        replayed = o_new.clone()
        new()
        torch.cuda.synchronize()
        ref_o = ref.reference_decode(c, k_scale=scale, v_scale=scale)
    return {
        "check": "fp8-mma graph replay, lengths changed",
        "replay_vs_eager": (replayed.float() - o_new.float()).abs().max().item(),
        "max_abs_diff_vs_reference": round((o_new.float() - ref_o).abs().max().item(), 6),
    }


def load_revision(path: Path):
    """Another revision of the kernels' sm120_mla.py, loaded from its file (its sibling files beside it)."""
    spec = importlib.util.spec_from_file_location("sm120_mla_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        default="all",
        choices=("all", "verify", "decode", "fp8", "fp8-decode", "verify-batch", "quick", "none"),
        help="fp8: the fp8 KV and 8-head cases only (decode and verify); fp8-decode: their decode cases; "
        "verify-batch: verify of 4 and 8 requests with 32 query rows each",
    )
    ap.add_argument("--sweep", action="store_true", help="time every SM120-legal tile set and split count first")
    ap.add_argument("--sweep-splits", action="store_true", help="time split counts past the cap at 185k")
    ap.add_argument("--sweep-tiles", action="store_true", help="time the variants of SWEEP_VARIANTS first")
    ap.add_argument("--sweep-prefix", action="store_true", help="time the CUDA prefix kernel against Triton's first")
    ap.add_argument("--sweep-merge", action="store_true", help="time the merge's program shapes first")
    ap.add_argument(
        "--sweep-fused",
        action="store_true",
        help="time verify in one cooperative launch against three kernels, and the splits' fewest tokens",
    )
    ap.add_argument(
        "--sweep-rows16",
        action="store_true",
        help="time the CUDA kernel's 16-row programs (and 128-head decode) against Triton's first",
    )
    ap.add_argument("--sweep-heads", type=int, default=None, help="--sweep-rows16 on the cases of this many heads only")
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="phase times inside the CUDA kernels (a build that reads the clocks), on TIMELINE_CASES",
    )
    ap.add_argument(
        "--timeline-also",
        metavar="DEFINES",
        action="append",
        default=[],
        help="with --timeline: also time TIMELINE_CASES through a build with these comma-separated -D flags",
    )
    ap.add_argument(
        "--defines",
        default="",
        help="comma-separated -D flags of the CUDA kernels' build for the whole run (numerics, times, the timeline, "
        "under --timeline-also's flags); --compare's revision keeps its own build",
    )
    ap.add_argument("--numerics16-only", action="store_true", help="of the numerics checks, run the 16-row ones only")
    ap.add_argument("--profile", action="store_true", help="GPU time of each kernel of a call, on PROFILE_CASES")
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="with --profile: also profile the sm120_mla.py in DIR (another revision of the module)",
    )
    ap.add_argument("--baseline-first", action="store_true", help="with --baseline: time the baseline first")
    ap.add_argument("--no-numerics", action="store_true", help="skip the float32-reference checks")
    ap.add_argument(
        "--fp8-mma-numerics",
        action="store_true",
        help="run the fp8-mma error checks (exact path, fp8-mma path, SGLang's fp8 kernels) even with --no-numerics",
    )
    ap.add_argument("--heads", type=int, action="append", help="only the cases with this many heads (repeatable)")
    ap.add_argument("--native", action="store_true", help="on a non-SM120 GPU, do not emulate SM120's limits")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument(
        "--compare",
        metavar="DIR",
        help="also time the sm120_mla.py in DIR (another revision of the kernels) on every case",
    )
    ap.add_argument(
        "--decode-splits",
        default="8,64,256",
        help="SGLang's decode split counts to time (comma-separated; default 8,64,256)",
    )
    ap.add_argument(
        "--kv-slots",
        choices=("scattered", "runs64", "ordered"),
        default="scattered",
        help="where page-1 KV slots lie: every token at a random slot (default), 64-slot runs in random order, or "
        "each request's slots consecutive (a fresh single stream)",
    )
    ap.add_argument(
        "--gather-roofline",
        action="store_true",
        help="also measure the read bandwidth of each case's own KV rows in its slot order and give each call's "
        "share of it",
    )
    args = ap.parse_args()
    KV_SLOTS.update(layout=args.kv_slots, gather=args.gather_roofline)
    if not torch.cuda.is_available():
        sys.exit("bench_mla.py needs a CUDA GPU")
    ext, dec = sglang_kernels()
    mla = sm120_mla
    base_defines = sm120_mla.cuda_prefix.merge_defines(args.defines)
    if base_defines:
        try:
            mla.cuda_prefix.install(torch.device("cuda", torch.cuda.current_device()), base_defines)
        except mla.cuda_prefix.CompileError as exc:
            sys.exit(f"bench_mla.py: the CUDA kernels do not compile with --defines {args.defines}: {exc}")
    other = load_revision(Path(args.compare) / "sm120_mla.py") if args.compare else None
    name = torch.cuda.get_device_name()
    cap = torch.cuda.get_device_capability()
    mode = "SM120 mode (mma.sync, 12.0 block choices, sm_120-legal tiles)" if SM120_MODE else "native"
    import sglang

    print(
        f"# {name} (sm_{cap[0]}{cap[1]}), {mode}; SGLang {getattr(sglang, '__version__', '?')}, "
        f"torch {torch.__version__}, triton {triton.__version__}",
        flush=True,
    )
    if base_defines:
        print(f"# the CUDA kernels of this run are built with -D{' -D'.join(base_defines)}", flush=True)
    roof = rooflines()
    print(f"# rooflines measured in this run: read {roof[0]:.0f} GB/s, mma bf16 {roof[1]:.0f} TFLOP/s", flush=True)
    PEAKS.update(mma_peaks())
    print(
        f"# mma.sync instruction peaks measured in this run (register-only loops, TFLOP/s): {json.dumps(PEAKS)}"
        + (f"; {PROXY}" if SM120_MODE else ""),
        flush=True,
    )
    unpack = unpack_rates()
    print(
        f"# fp8 -> f16 in registers, G words (4 values) a second per SM, register-only loops: {json.dumps(unpack)}"
        + (f"; {PROXY}" if SM120_MODE else ""),
        flush=True,
    )
    result = {
        "gpu": name,
        "capability": list(cap),
        "mode": mode,
        "roofline_read_gbs": round(roof[0]),
        "roofline_tflops": round(roof[1]),
        "mma_peaks_tflops": dict(PEAKS),
        "unpack_gwords_per_sm": unpack,
        "rows": [],
        "sweep": [],
        "timing": TIMING,
        "defines": list(base_defines),
    }
    if args.numerics16_only:
        result["numerics"] = rows16_numerics(mla)
    else:
        result["numerics"] = [] if args.no_numerics else numerics(mla) + fused_numerics(mla) + rows16_numerics(mla)
    if args.fp8_mma_numerics or (not args.no_numerics and not args.numerics16_only):
        result["fp8_mma_numerics"] = fp8_mma_numerics(mla, ext, dec)
    if args.timeline:
        keep = lambda case: (  # noqa: E731  (--cases fp8 / fp8-decode and --heads narrow the timeline too)
            (args.cases not in ("fp8", "fp8-decode") or case[4] == "fp8")
            and (args.cases != "fp8-decode" or case[0] == "decode")
            and (not args.heads or case[3] in args.heads)
        )
        result["timeline"] = timeline(mla, roof, base_defines, keep=keep)
        for defines in args.timeline_also:
            result["timeline"] += timeline(
                mla, roof, sm120_mla.cuda_prefix.merge_defines(args.defines, defines), keep=keep
            )
    if args.sweep_rows16:
        result["sweep_rows16"] = sweep_rows16(mla, roof, args.sweep_heads)
    if args.sweep_fused:
        result["sweep_fused"] = sweep_fused(mla, roof)
    if args.sweep_prefix:
        result["sweep_prefix"] = sweep_prefix(mla, roof)
    if args.profile:
        modules = {"this": mla}
        if args.baseline:
            modules["baseline"] = load_revision(Path(args.baseline) / "sm120_mla.py")
            if args.baseline_first:  # the order of the two within a case (the first timed tends to gain a little)
                modules = {"baseline": modules["baseline"], "this": mla}
        result["profile"] = profile(modules, roof)
    if args.sweep_merge:
        result["sweep_merge"] = sweep_merge(mla, roof)
    if args.sweep_tiles:
        result["sweep_tiles"] = sweep_tiles(mla, roof)
    if args.sweep:
        result["sweep"] = sweep(mla, roof)
    if args.sweep_splits:
        result["sweep_splits"] = sweep_splits(mla, roof)
    cases = [(*case, 1) for case in verify_cases(args.cases)] + batched_verify_cases(args.cases)
    for prefix, drafts, heads, kvd, tree, page, batch in cases:
        if args.heads and heads not in args.heads:
            continue
        c = verify_case(prefix, drafts, heads, kvd, tree, page, batch)
        scale = 0.5 if kvd == "fp8" else 1.0
        new, old, o_new, o_old = run_verify(mla, ext, c, heads, page, scale)
        new()
        t_new = bench(new)
        how_new = LAST["method"]
        try:
            old()
            t_old = bench(old, slow=True)
            diff = (o_new.float() - o_old.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001  (SGLang's kernel may not run this case in this mode)
            t_old, diff = None, f"SGLang kernel failed: {str(e)[:80]}"
        label = f"verify prefix {prefix}, {drafts} {tree}, {heads} heads, {kvd}, page {page}" + (
            f", {batch} requests" if batch > 1 else ""
        )
        r = row("verify", label, c, heads, t_old, t_new, roof, diff)
        r["timing"] = {"new": how_new, "old": LAST["method"]}
        r.update(route_fields(mla, c, new))
        if kvd == "fp8":
            time_fp8_paths(r, c, heads, lambda: run_verify(mla, ext, c, heads, page, scale)[::2], o_new)
        if other is not None:
            new_b, _, o_b, _ = run_verify(other, ext, c, heads, page, scale)
            new_b()
            r["compare_ms"] = round(bench(new_b), 4)
            r["compare_speedup"] = round(r["compare_ms"] / t_new, 3)
            r["compare_max_abs_diff"] = (o_b.float() - o_new.float()).abs().max().item()
        result["rows"].append(r)
        print(json.dumps(r), flush=True)
        del c
    for prefix, batch, heads, kvd, page in decode_cases(args.cases):
        if args.heads and heads not in args.heads:
            continue
        c = decode_case(prefix, batch, heads, kvd, page)
        scale = 0.5 if kvd == "fp8" else 1.0
        for n_split, splits_old in enumerate(int(x) for x in args.decode_splits.split(",")):
            new, old, o_new, o_old = run_decode(mla, dec, c, heads, splits_old, scale, page)
            new()
            t_new = bench(new)
            how_new = LAST["method"]
            try:
                old()
                t_old = bench(old)
                diff = (o_new.float() - o_old.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001
                t_old, diff = None, f"SGLang kernel failed: {str(e)[:80]}"
            label = f"decode prefix {prefix}, batch {batch}, {heads} heads, {kvd}, page {page}; SGLang at {splits_old} splits"
            r = row("decode", label, c, heads, t_old, t_new, roof, diff)
            r["timing"] = {"new": how_new, "old": LAST["method"]}
            r.update(route_fields(mla, c, new))
            if kvd == "fp8" and n_split == 0:
                time_fp8_paths(r, c, heads, lambda: run_decode(mla, dec, c, heads, splits_old, scale, page)[::2], o_new)
            if other is not None and n_split == 0:
                new_b, _, o_b, _ = run_decode(other, dec, c, heads, splits_old, scale, page)
                new_b()
                r["compare_ms"] = round(bench(new_b), 4)
                r["compare_speedup"] = round(r["compare_ms"] / t_new, 3)
                r["compare_max_abs_diff"] = (o_b.float() - o_new.float()).abs().max().item()
            result["rows"].append(r)
            print(json.dumps(r), flush=True)
        del c
    print(f"# timing: CUDA graph replay, {TIMING['plain']} timings with plain launches (capture failed)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
