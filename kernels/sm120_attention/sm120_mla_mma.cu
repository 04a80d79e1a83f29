// Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
//
// MLA attention (576 query/key dims, the first 512 of them the values, one latent KV head; bf16 queries,
// bf16 or fp8 e4m3 KV) as mma.sync kernels for SM120, compiled at first use by NVRTC from this file
// (sm120_mla_mma.py beside it launches them; sm120_mla_nvrtc.py compiles and loads them).
//
// Why CUDA: in the Triton kernel every warp of a 16-row dot reads the whole 16 x 576 query block from
// shared memory at each KV step, so verify is bound by shared-memory reads at about a third of the
// mma.sync roofline. Here a program holds 64 query rows (draft tokens x heads) in eight warps: warp w
// keeps rows 16 * (w % 4) onward and query dims 288 * (w / 4) onward in registers for the whole split
// (72 registers), multiplies them with its half of each 32-token KV tile, and adds its partner's half of
// the scores through shared memory (one 2 KB exchange per warp and step). The same warp then owns 256 of
// the 512 value dims of the output (128 fp32 registers). Per 32-token step the program reads 278 KB of
// shared memory for 4.5 MFLOP, twice the ratio of the Triton kernel.
//
// Shared memory: two stages of a 32 x 576 bf16 KV tile (rows padded by 16 bytes, so the eight rows an
// ldmatrix reads fall in distinct banks) copied with cp.async, three slots of KV indices and the score
// exchange, 91904 bytes; for fp8 KV two stages of the fp8 tile as copied and one f16 tile converted from
// it, 92416 bytes (the 16-row programs, which convert in registers, lay four fp8 stages end to end over the f16
// tile's, the two fp8 stages' and the KV slots' space, and keep the slots in registers). Both are within SM120's
// 101376. The partial results are those of the Triton prefix
// kernel (fp32 output normalised by its own sum, base-2 log-sum-exp per split), so the merge is shared.
//
// The fused entry points run the whole verify or decode call in one cooperative launch: for verify one
// more program a row block scores the draft tail under the tree mask with the same loop, every program
// writes its partial result in bf16 straight from registers (the four lanes of a quad trade values so
// that each store is 16 contiguous bytes), and after a grid barrier every program merges a share of the
// rows from L2 into the output (and, for decode, each row's log-sum-exp); it saves the merge's launch and
// half the partial results' bytes.
//
// The fused16 entry points (16 query rows a program) serve requests with few query rows (decode, one
// draft token): there the warp pair w % 4 scores its own 8 tokens of each tile (m16n8k8 for the values),
// so a tile is read from shared memory once rather than padded to 64 rows, and the four pairs' results
// are summed at one max through shared memory before the store. Their queries come through shared memory
// (cp.async, then ldmatrix) while the KV slots load; the 64-row programs load theirs into registers, 16
// bytes a load asked for before the KV slots, and trade them within each quad into the mma fragments once
// tile 0 is asked for. Tile 0 is asked for with slots each thread reads itself, without a block barrier.
// The grid barrier is one word that every program adds to with release semantics and polls with acquire,
// its top bit flipping once all have arrived.
//
// Their programs with fp8 KV on the exact path that hold 8 query rows or fewer (decode with 8 heads, as Kimi-K2 at
// TP8 runs) take a transposed body instead (transposed_body): KV tokens as the 16 rows of each mma and the query rows
// as its 8 columns, so no product is spent on rows the program does not hold, and the values are m16n8k16.
//
// The fp8-mma entry points (names ending fp8q; Q8 below) score fp8 KV with e4m3 m16n8k32 mma.sync: each warp
// quantizes its half of each query row to e4m3 at amax / 448 once, the keys' B fragments come straight from the
// fp8 tile (ldmatrix gives a lane 4 consecutive fp8 dims of one token, a B register of m16n8k32), and each
// half's partial scores are multiplied by its scale before the two halves are added. P x V stays f16.
// sm_120a has the instruction (QMMA); for sm_90a ptxas emulates it (unpack to f16, HMMA).
//
// The figures come from the launcher's table (sm120_mla_mma.FIGURES) as -D flags, none is written here:
// ROWS, ROWS16 (query rows a program), BLOCK_N (KV tokens a step), HEAD_DIM, V_DIM, THREADS, SROW and
// SROW8 (bytes a row of a 16-bit and of an fp8 KV tile takes in shared memory), TILE_BYTES, TILE8_BYTES,
// IDX_BYTES, XCH_BYTES, STAGES8, XCH8_BYTES (the regions of shared memory), SMEM_BYTES_BF16 and SMEM_BYTES_FP8 (the
// dynamic shared memory the launcher asks for) and SMEM_LIMIT (SM120's per-block limit). The checks below refuse to
// compile where the layout and the figures disagree.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// The fragment loops are written for these figures (18 k16 steps a half of the query dims, 32 fp32 value
// registers a row pair, four 16-row groups or one, eight warps).
static_assert(HEAD_DIM == 576 && V_DIM == 512 && ROWS == 64 && ROWS16 == 16 && BLOCK_N == 32 && THREADS == 256,
              "the kernels are written for MLA 576/512, 64 or 16 rows, 32-token tiles and eight warps");
#define DHALF 288    // query dims a warp of a pair takes: HEAD_DIM / 2
#define DV_WARP 256  // value dims a warp owns: V_DIM / 2
static_assert(DHALF * 2 == HEAD_DIM && DV_WARP * 2 == V_DIM, "the warp pair splits the dims in halves");

// The shared-memory layout, against the launcher's figures and SM120's limit. 16-bit tiles: rows of SROW
// bytes, 16 bytes past a multiple of 128 so the eight rows an ldmatrix reads fall in distinct banks.
static_assert(SROW >= 2 * HEAD_DIM && SROW % 128 == 16 && SROW8 >= HEAD_DIM && SROW8 % 16 == 0,
              "shared memory layout: a KV row does not fit its row, or breaks the bank spread");
static_assert(TILE_BYTES == BLOCK_N * SROW && TILE8_BYTES == BLOCK_N * SROW8,
              "shared memory layout: the tiles differ from BLOCK_N rows");
static_assert(IDX_BYTES == 3 * BLOCK_N * 8, "shared memory layout: three slots of BLOCK_N 8-byte KV indices");
static_assert(XCH_BYTES == THREADS * 16 * 4, "shared memory layout: the score exchange is 16 floats a thread");
static_assert(2 * TILE_BYTES + IDX_BYTES + XCH_BYTES == SMEM_BYTES_BF16,
              "shared memory layout differs from the launcher's (bf16 KV)");
static_assert(XCH8_BYTES == THREADS * 16 && STAGES8 >= 4, "shared memory layout: the 8-row programs' figures");
#define FP8_LAYOUT_BYTES (TILE_BYTES + 2 * TILE8_BYTES + IDX_BYTES + XCH_BYTES)  // the 64- and 16-row programs'
static_assert((FP8_LAYOUT_BYTES > STAGES8 * TILE8_BYTES + XCH8_BYTES
                   ? FP8_LAYOUT_BYTES
                   : STAGES8 * TILE8_BYTES + XCH8_BYTES) == SMEM_BYTES_FP8,
              "shared memory layout differs from the launcher's (fp8 KV)");
static_assert(SMEM_BYTES_BF16 <= SMEM_LIMIT && SMEM_BYTES_FP8 <= SMEM_LIMIT,
              "shared memory layout: over SM120's 101376 bytes a block");

// SM120_TIMELINE (benchmarks only: scripts/bench_mla.py --timeline): thread 0 of each program records the
// global timer at entry and exit (slots 0 and 9) and its SM's clock at the phases in between.
#ifdef SM120_TIMELINE
__device__ unsigned long long sm120_timeline[4096][10];
#define TL(k)                                                                                   \
    do {                                                                                        \
        if (threadIdx.x == 0) {                                                                 \
            const unsigned c_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); \
            unsigned long long t_;                                                              \
            if ((k) == 0 || (k) == 9)                                                           \
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                          \
            else                                                                                \
                t_ = clock64();                                                                 \
            if (c_ < 4096) sm120_timeline[c_][k] = t_;                                          \
        }                                                                                       \
    } while (0)
#else
#define TL(k) \
    do {      \
    } while (0)
#endif

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_idx(u32 dst, const int* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_idx(u32 dst, const long long* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}

__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::);
}

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// c += a @ b on one m16n8k16 tile: bf16 operands (F16 false) or f16 (F16 true), fp32 accumulator.
template <bool F16>
__device__ __forceinline__ void mma16(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// c += a @ b on one m16n8k8 tile (the value pass of a 16-row program, 8 tokens a warp).
template <bool F16>
__device__ __forceinline__ void mma8(float* c, u32 a0, u32 a1, u32 b0) {
    if constexpr (F16) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
    } else {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
    }
}

// c += a @ b on one m16n8k32 tile of fp8 e4m3 operands, fp32 accumulator (the fp8-mma path's scores; sm_89 on).
// A register holds 4 consecutive k: a0/a2 row g, a1/a3 row g + 8 (k 4 c4 .. and 16 + 4 c4 ..); b0/b1 token g.
__device__ __forceinline__ void mma_e4m3(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four bf16 query values (two pairs, the first value in the low half of w.x) times inv as four e4m3 bytes,
// the first in byte 0 (round to nearest, saturated to +-448).
__device__ __forceinline__ u32 q_e4m3x4(uint2 w, float inv) {
    u16 lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
        : "=h"(lo)
        : "f"(__uint_as_float(w.x & 0xffff0000u) * inv), "f"(__uint_as_float(w.x << 16) * inv));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
        : "=h"(hi)
        : "f"(__uint_as_float(w.y & 0xffff0000u) * inv), "f"(__uint_as_float(w.y << 16) * inv));
    return (u32)lo | ((u32)hi << 16);
}

// The largest magnitude of four bf16 values.
__device__ __forceinline__ float amax4(uint2 w) {
    return fmaxf(fmaxf(fabsf(__uint_as_float(w.x << 16)), fabsf(__uint_as_float(w.x & 0xffff0000u))),
                 fmaxf(fabsf(__uint_as_float(w.y << 16)), fabsf(__uint_as_float(w.y & 0xffff0000u))));
}

// The fp8-mma path's queries: a warp's half row (rows g and g + 8, 288 dims; its quad holds the whole half,
// 72 dims a lane in x[row][step][lo 16 / hi 16]) quantized to e4m3 at amax / 448, into the nine m16n8k32 A
// fragments; qs: the scale each row's partial scores are multiplied by (the folded query scale).
__device__ __forceinline__ void quantize_queries(const uint2 (*x)[9][2], u32 (*qa)[4], float& qs0, float& qs1) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        a0 = fmaxf(a0, fmaxf(amax4(x[0][j][0]), amax4(x[0][j][1])));
        a1 = fmaxf(a1, fmaxf(amax4(x[1][j][0]), amax4(x[1][j][1])));
    }
    a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, 1));
    a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, 2));
    a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, 1));
    a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, 2));
    // A row of zeros (or past the request's end) quantizes to zeros at scale 0.
    const float inv0 = a0 > 0.f ? 448.f / a0 : 0.f, inv1 = a1 > 0.f ? 448.f / a1 : 0.f;
    qs0 = a0 * (1.f / 448.f);
    qs1 = a1 * (1.f / 448.f);
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        qa[j][0] = q_e4m3x4(x[0][j][0], inv0);
        qa[j][1] = q_e4m3x4(x[1][j][0], inv1);
        qa[j][2] = q_e4m3x4(x[0][j][1], inv0);
        qa[j][3] = q_e4m3x4(x[1][j][1], inv1);
    }
}

// Two floats as a pair of 16-bit values, the first in the low half.
template <bool F16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (F16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// A pair of bf16 query values as the operand type: unchanged, or as f16 (clamped to its range).
template <bool F16>
__device__ __forceinline__ u32 q_pair(u32 w) {
    if constexpr (F16) {
        const float lo = fminf(fmaxf(__uint_as_float(w << 16), -65504.f), 65504.f);
        const float hi = fminf(fmaxf(__uint_as_float(w & 0xffff0000u), -65504.f), 65504.f);
        return pack2<true>(lo, hi);
    } else {
        return w;
    }
}

__device__ __forceinline__ u32 e4m3x2_to_f16x2(u16 v) {
    u32 r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(v));
    return r;
}

// The f16 pair of bytes 0-1 (lo) or 2-3 (hi) of four fp8 e4m3 values, byte 0 in the low half. The high half is
// taken as the register's upper 16 bits (mov.b32 {lo, hi}), not shifted down: for sm_120a ptxas reads it in place
// either way, and for sm_90a (the H200 the benchmarks run on) a shift took one instruction per conversion.
__device__ __forceinline__ u32 f8_lo(u32 w) {
    return e4m3x2_to_f16x2((u16)(w & 0xffffu));
}
__device__ __forceinline__ u32 f8_hi(u32 w) {
    u32 r;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(w));
    return r;
}

// e4m3 to f16 by integer operations, scaled by 2^-8: an e4m3 byte s.eeee.mmm placed as the f16 bits s.0eeee.mmm0000000
// is its value times 2^-8 for every finite value, normal (2^(e-15) against 2^(e-7)) and subnormal (2^-14 m / 8
// against 2^-6 m / 8) alike, so the products are exact and the 2^8 goes into the scale of the sum (the e4m3 NaN
// byte, which SGLang's caches do not hold, becomes 480). Bytes 1 and 3 of w (odd) or 0 and 2 (even) as an f16 pair,
// the lower byte in the low half, in three or four integer operations. On the H200 they are slower than the
// conversion instruction and do not run beside it (docs/benchmarks.md, 2026-12-05), so they are off by default; the
// flag below lets an SM120 card, whose rates were not measured, time them.
__device__ __forceinline__ u32 f8s_odd(u32 w) {
    return (w & 0x80008000u) | ((w >> 1) & 0x3f803f80u);
}
__device__ __forceinline__ u32 f8s_even(u32 w) {
    return f8s_odd(w << 8);
}

// 16-row programs with fp8 KV: how the keys (scores) and the values (P x V) become f16 in registers. 0: the
// conversion instruction for both; 1: the integer operations above for both; 2: integer keys, converted values;
// 3: converted keys, integer values. A -D flag may set it (benchmarks compare them).
#ifndef FP8_UNPACK16
#define FP8_UNPACK16 0
#endif
static_assert(FP8_UNPACK16 >= 0 && FP8_UNPACK16 <= 3, "FP8_UNPACK16 is 0, 1, 2 or 3");
constexpr bool KEYS16_INT = FP8_UNPACK16 == 1 || FP8_UNPACK16 == 2;
constexpr bool VALUES16_INT = FP8_UNPACK16 == 1 || FP8_UNPACK16 == 3;

// A register of ldmatrix.trans over an fp8 tile (16-bit elements = fp8 pairs) holds tokens t, t + 1 of dims
// d, d + 1 as bytes (t, d), (t, d + 1), (t + 1, d), (t + 1, d + 1); regrouped by dim: bytes 0-1 dim d's two
// tokens, bytes 2-3 dim d + 1's.
__device__ __forceinline__ u32 by_dim(u32 w) {
    u32 r;
    asm("prmt.b32 %0, %1, 0, 0x3120;\n" : "=r"(r) : "r"(w));
    return r;
}

// fp8 KV leaves each 16-dim block of a warp's values with lane c4 holding dims 4 c4 .. 4 c4 + 3 (the even
// n8 tile dims 4 c4 and 4 c4 + 2, the odd one 4 c4 + 1 and 4 c4 + 3); the stores expect the bf16 layout, lane
// c4 holding 2 c4, 2 c4 + 1 (tile 2 c) and 8 + 2 c4, 9 + 2 c4 (tile 2 c + 1). Four exchanges a block and row:
// in each a lane reads one lane of its quad and every lane is read by one.
__device__ __forceinline__ void fp8_to_bf16_layout(float* e, float* d, int j, int c4) {
    const int lane = threadIdx.x & 31;
    const bool hi_s = c4 >= 2, odd = (c4 & 1) != 0;
    const int src_a = (lane & ~3) | ((c4 & 1) << 1) | (c4 >> 1), src_c = src_a ^ 2;
    const float v0 = e[j], v1 = d[j], v2 = e[j + 1], v3 = d[j + 1];  // dims 4 c4 .. 4 c4 + 3
    const float a = __shfl_sync(0xffffffffu, hi_s ? v2 : v0, src_a);
    const float b = __shfl_sync(0xffffffffu, hi_s ? v3 : v1, src_a);
    const float c = __shfl_sync(0xffffffffu, hi_s ? v0 : v2, src_c);
    const float f = __shfl_sync(0xffffffffu, hi_s ? v1 : v3, src_c);
    e[j] = odd ? c : a;
    e[j + 1] = odd ? f : b;
    d[j] = odd ? a : c;
    d[j + 1] = odd ? b : f;
}

// The 4 x 4 transpose of 32-bit values across the four lanes of a quad (lane c4 = lane & 3): lane c4's
// v[j] becomes lane j's v[c4], in two exchanges (lanes 0-1 and 2-3 trade their off-diagonal halves, then
// each 2 x 2 block is transposed between lane pairs).
__device__ __forceinline__ void quad_transpose(u32& v0, u32& v1, u32& v2, u32& v3, int c4) {
    const bool lo2 = (c4 & 2) == 0, lo1 = (c4 & 1) == 0;
    u32 x0 = __shfl_xor_sync(0xffffffffu, lo2 ? v2 : v0, 2);
    u32 x1 = __shfl_xor_sync(0xffffffffu, lo2 ? v3 : v1, 2);
    if (lo2) {
        v2 = x0;
        v3 = x1;
    } else {
        v0 = x0;
        v1 = x1;
    }
    x0 = __shfl_xor_sync(0xffffffffu, lo1 ? v1 : v0, 1);
    x1 = __shfl_xor_sync(0xffffffffu, lo1 ? v3 : v2, 1);
    if (lo1) {
        v1 = x0;
        v3 = x1;
    } else {
        v0 = x0;
        v2 = x1;
    }
}

__device__ __forceinline__ void pair_sync(int id) {
    asm volatile("bar.sync %0, 64;\n" ::"r"(id));
}

// 16-row programs with fp8 KV: stages of the fp8 tile (4: three tiles in flight while one is scored, the four
// stages laid end to end from offset 0 over the f16 tile's space, the first two fp8 stages' and the KV slots',
// which these programs keep in registers; 3: the third where the queries were copied, once they are in
// registers; 2: as the bf16 programs). A -D flag may set it (benchmarks compare the counts).
#ifndef STAGES16_FP8
#define STAGES16_FP8 4
#endif
static_assert(STAGES16_FP8 >= 2 && STAGES16_FP8 <= 4, "16-row fp8 programs keep 2, 3 or 4 stages");
// 16-row fp8 programs with four stages: each warp pair copies the 8 tokens of a tile it scores itself, so after
// tile 0 a pair waits at its own barrier for its tiles instead of the block's (1), or every warp at the block's (0).
#ifndef PAIRS16_FP8
#define PAIRS16_FP8 1
#endif
// fp8-mma 64-row programs: the block barrier between the f16 values' conversion and their use comes after the
// scores (true: the scores read the fp8 stage, so they need not wait for it) or before them (false).
constexpr bool Q8_SYNC_AFTER_SCORES = true;

// Timeline probes (the SM120_TIMELINE build only): the 16-row fp8 loop without its scores' loads and products, or
// without its values'.
#if defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_SCORES)
constexpr bool PROBE_NO_SCORES = true;
#else
constexpr bool PROBE_NO_SCORES = false;
#endif
#if defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_VALUES)
constexpr bool PROBE_NO_VALUES = true;
#else
constexpr bool PROBE_NO_VALUES = false;
#endif

// 16-row programs: the end's sums skip rows 8-15 where the program holds none of them (1) or not (0). A -D flag
// may set it (benchmarks compare both).
#ifndef STORE16_LIVE
#define STORE16_LIVE 1
#endif

#define OB_STRIDE 520  // floats a row of a 16-row sum in shared memory: a warp's 8 rows 2-way in banks
static_assert((2 * 16 * OB_STRIDE + 2 * 64) * 4 <= SMEM_BYTES_BF16 &&
                  (2 * 16 * OB_STRIDE + 2 * 64) * 4 <= SMEM_BYTES_FP8,
              "shared memory layout: the 16-row sums do not fit");

// The end of a 16-row program: the four warp pairs' results (each over its own tokens, under its own max)
// summed at one max through shared memory: pairs 2 and 3 into 0 and 1, whose two sums all threads then add
// as they write the bf16 partial results (16-row programs run only in the one launch). m/l are the pair's
// running max and sum of its rows g and g + 8.
__device__ __forceinline__ void store16(float (*o)[4], float m0, float m1, float l0, float l1, float v_scale,
                                        float* __restrict__ O_part, float* __restrict__ L_part, int q_start, int n_rows,
                                        int heads, int row0, int split, long long stride_ot, long long stride_oh,
                                        long long stride_os, long long stride_lt, long long stride_lh) {
    extern __shared__ __align__(16) unsigned char smem[];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rg = warp & 3, hf = warp >> 2, g = lane >> 2, c4 = lane & 3;
    float* ob = (float*)smem;             // [2][16][OB_STRIDE] sums of two pairs
    float* mx = ob + 2 * 16 * OB_STRIDE;  // [4 pairs][16 rows] running max
    float* ls = mx + 64;                  // [4 pairs][16 rows] sum of probabilities
    cp_wait_all();
    __syncthreads();  // every warp is done with the KV tiles
    if (hf == 0 && c4 == 0) {
        mx[rg * 16 + g] = m0;
        mx[rg * 16 + g + 8] = m1;
        ls[rg * 16 + g] = l0;
        ls[rg * 16 + g + 8] = l1;
    }
    __syncthreads();
    // The row's max and sum over the pairs; a pair with no token (-inf) weighs 0.
    auto row_total = [&](int row, float& M, float& L) {
        M = NEG_INF;
#pragma unroll
        for (int p = 0; p < 4; ++p) M = fmaxf(M, mx[p * 16 + row]);
        L = 0.f;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const float m = mx[p * 16 + row];
            L += m == NEG_INF ? 0.f : ls[p * 16 + row] * exp2f(m - M);
        }
    };
    float M0, L0, M1, L1;
    row_total(g, M0, L0);
    row_total(g + 8, M1, L1);
    const float f0 = (m0 == NEG_INF || L0 <= 0.f) ? 0.f : exp2f(m0 - M0) * v_scale / L0;
    const float f1 = (m1 == NEG_INF || L1 <= 0.f) ? 0.f : exp2f(m1 - M1) * v_scale / L1;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        o[i][0] *= f0;
        o[i][1] *= f0;
        o[i][2] *= f1;
        o[i][3] *= f1;
    }
    const int at0 = g * OB_STRIDE + hf * DV_WARP + c4 * 2, at1 = at0 + 8 * OB_STRIDE;
    // Rows 8-15 are summed only where the program has one of them (STORE16_LIVE; 8 heads of one token have none).
    const bool upper = !STORE16_LIVE || n_rows - row0 > 8;
    auto put = [&](float* buf) {
#pragma unroll
        for (int i = 0; i < 32; ++i) *(float2*)(buf + at0 + i * 8) = make_float2(o[i][0], o[i][1]);
        if (upper) {
#pragma unroll
            for (int i = 0; i < 32; ++i) *(float2*)(buf + at1 + i * 8) = make_float2(o[i][2], o[i][3]);
        }
    };
    auto add = [&](const float* buf) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const float2 a = *(const float2*)(buf + at0 + i * 8);
            o[i][0] += a.x;
            o[i][1] += a.y;
        }
        if (upper) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const float2 c = *(const float2*)(buf + at1 + i * 8);
                o[i][2] += c.x;
                o[i][3] += c.y;
            }
        }
    };
    float* const ob1 = ob + 16 * OB_STRIDE;
    if (rg >= 2) put(rg == 2 ? ob : ob1);
    __syncthreads();
    if (rg < 2) add(rg == 0 ? ob : ob1);
    __syncthreads();
    if (rg < 2) put(rg == 0 ? ob : ob1);  // pairs 0 + 2 and 1 + 3, summed as they are stored below
    __syncthreads();
    const int row = tid >> 4, part = tid & 15;
    // bf16: 16 bytes a lane, a warp's 32 lanes on half a row
    for (int k = tid; k < 16 * 64; k += THREADS) {
        const int rw = k >> 6, chunk = k & 63, r = row0 + rw;
        if (r >= n_rows) continue;
        const long long t = q_start + r / heads, h = r % heads;
        const int at = rw * OB_STRIDE + chunk * 8;
        float4 a = *(const float4*)(ob + at), c = *(const float4*)(ob + at + 4);
        const float4 a1 = *(const float4*)(ob1 + at), c1 = *(const float4*)(ob1 + at + 4);
        a.x += a1.x;
        a.y += a1.y;
        a.z += a1.z;
        a.w += a1.w;
        c.x += c1.x;
        c.y += c1.y;
        c.z += c1.z;
        c.w += c1.w;
        *(uint4*)((u16*)O_part + t * stride_ot + h * stride_oh + split * stride_os + chunk * 8) =
            make_uint4(pack2<false>(a.x, a.y), pack2<false>(a.z, a.w), pack2<false>(c.x, c.y), pack2<false>(c.z, c.w));
    }
    const int r = row0 + row;
    if (part == 0 && r < n_rows) {
        const long long t = q_start + r / heads, h = r % heads;
        float M, L;
        row_total(row, M, L);
        L_part[t * stride_lt + h * stride_lh + split] = L > 0.f ? M + log2f(L) : NEG_INF;
    }
}

// A request's row pointers (its query tokens and its KV slots), the four asked for at once: one round trip before
// the KV slots.
struct RowPtrs {
    int q_start, q_end, kv_start, kv_end;
};
__device__ __forceinline__ RowPtrs row_ptrs(const int* __restrict__ q_indptr, const int* __restrict__ kv_indptr,
                                            int b) {
    return {q_indptr[b], q_indptr[b + 1], kv_indptr[b], kv_indptr[b + 1]};
}

// The prefix tokens each split of a request walks (the last one may walk fewer): whole tiles, min_split at least.
__device__ __forceinline__ int split_chunk(int kv_len, int num_splits, int min_split) {
    const int chunk = ((kv_len + num_splits - 1) / num_splits + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
    return chunk > min_split ? chunk : min_split;
}

// The KV tokens start .. end - 1 of a prefix of kv_len that split `split` of num_splits takes: equal chunks, whole
// tiles, at least min_split tokens (splits past the prefix are empty).
__device__ __forceinline__ void split_range(int kv_len, int split, int num_splits, int min_split, int& start,
                                            int& end) {
    const int chunk = split_chunk(kv_len, num_splits, min_split);
    start = split * chunk;
    end = kv_len < start + chunk ? kv_len : start + chunk;
}

// One program: ROWS query rows of one request against one split of its prefix.
// Grid (row blocks, splits, requests), 256 threads. KV8: the KV rows are fp8 e4m3 (576 bytes), copied as
// they are, and both dots run on f16 operands: 64-row programs convert each tile to f16 in shared memory once
// (their four row groups share it); 16-row programs take the fp8 tile with ldmatrix and convert in registers
// (no second barrier a tile), the query dims of each k16 step in the order the fp8 keys arrive in. TAIL: the program
// scores the request's own draft tokens instead (KV_ holds their keys in token order, V_ext their values,
// both bf16), under the tree mask (mask/mask_indptr in SGLang's custom_mask layout), and writes its result
// in slot num_splits. R16: the program holds 16 query rows, and the warp pair w % 4 scores tokens
// 8 (w % 4) .. 8 (w % 4) + 7 of each tile (each KV tile read from shared memory once, for rows that are
// too few to fill four 16-row groups); the four pairs' results meet in shared memory at the end.
template <typename IdxT, bool KV8, bool TAIL, bool P16 = false, bool R16 = false, bool Q8 = false>
__device__ __forceinline__ void prefix_body(const u16* __restrict__ Q, const void* __restrict__ KV_,
                                            const int* __restrict__ q_indptr, const int* __restrict__ kv_indptr,
                                            const IdxT* __restrict__ kv_indices, float* __restrict__ O_part,
                                            float* __restrict__ L_part, float qk_scale, float v_scale,
                                            float rescale_slack, long long stride_qt, long long stride_qh,
                                            long long stride_kt, long long stride_ot, long long stride_oh,
                                            long long stride_os, long long stride_lt, long long stride_lh, int heads,
                                            int num_splits, int min_split, const u8* __restrict__ mask,
                                            const long long* __restrict__ mask_indptr, const u16* __restrict__ V_ext,
                                            long long stride_vt, const RowPtrs* pre = nullptr) {
    constexpr int STAGE_BYTES = KV8 ? TILE8_BYTES : TILE_BYTES;  // what one cp.async stage holds
    constexpr int STAGE_OFF = KV8 ? TILE_BYTES : 0;              // where the stages start
    constexpr int IDX_OFF = STAGE_OFF + 2 * STAGE_BYTES;
    constexpr int XCH_OFF = IDX_OFF + IDX_BYTES;
    static_assert(XCH_OFF + XCH_BYTES == (KV8 ? FP8_LAYOUT_BYTES : SMEM_BYTES_BF16),
                  "shared memory layout differs from the launcher's");
    static_assert(!Q8 || (KV8 && !TAIL), "the fp8-mma path scores fp8 KV");
    // 16-row fp8 programs: a third stage at offset 0, where the queries were copied (free once they are in
    // registers, before the first tile's barrier); tile t in stage t % 3, its slots copied three steps ahead.
    constexpr bool S3 = KV8 && R16 && STAGES16_FP8 == 3;
    static_assert(!S3 || STAGE_BYTES <= TILE_BYTES, "the third fp8 stage overlaps the first two");
    // 16-row fp8 programs with four stages: stage s at s * STAGE_BYTES (stage 0 holds the queries until they are
    // in registers), tile t in stage (t + 1) % 4; the KV slots of each row a thread copies come from global
    // memory into a register one tile ahead (no slot in shared memory, no cp.async group for them), so the
    // stages may cover the slots' region.
    constexpr bool S4 = KV8 && R16 && STAGES16_FP8 == 4;
    static_assert(!S4 || 4 * STAGE_BYTES <= IDX_OFF + IDX_BYTES, "the fourth fp8 stage overlaps the exchange");
    auto stage_off = [](int s) -> u32 {
        return S4 ? (u32)(s * STAGE_BYTES) : S3 && s == 2 ? 0u : (u32)(STAGE_OFF + s * STAGE_BYTES);
    };
    const u8* KV = (const u8*)KV_;
    constexpr int ELEM = KV8 ? 1 : 2;

    extern __shared__ __align__(16) unsigned char smem[];
    if (pre == nullptr) {  // else the caller has read the row pointers (and the clock)
        TL(0);
        TL(1);
    }
    constexpr int RB = R16 ? ROWS16 : ROWS;  // query rows a program holds
    constexpr int NT = R16 ? 1 : 4;          // 8-token score tiles a warp takes per step
    const int rb = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const RowPtrs rp = pre != nullptr ? *pre : row_ptrs(q_indptr, kv_indptr, b);
    const int q_start = rp.q_start, q_end = rp.q_end, kv_start = rp.kv_start, kv_end = rp.kv_end;
    const int n_rows = (q_end - q_start) * heads;
    if (rb * RB >= n_rows) return;
    const int kv_len = kv_end - kv_start;
    const int n_tok = q_end - q_start;
    int start = 0, end = n_tok;
    if constexpr (!TAIL) {
        split_range(kv_len, split, num_splits, min_split, start, end);
    }
    // Scores a program drops: -inf past the end of a split (every tile of a split has a token of it);
    // in the tail, where the mask may drop a row's every token of a tile, a finite stand-in, so the
    // running max stays finite (such a row's result and log-sum-exp are outweighed in the merge).
    const float DROPPED = TAIL ? -1e30f : -__int_as_float(0x7f800000);
    // The scores' scale; the 16-row programs' integer unpack of the keys leaves them 2^-8 of their value.
    const float qk = KV8 && R16 && !Q8 && KEYS16_INT ? qk_scale * 256.f : qk_scale;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rg = warp & 3, hf = warp >> 2;
    const int g = lane >> 2, c4 = lane & 3;
    const int r0 = rb * RB + (R16 ? 0 : rg * 16) + g, r1 = r0 + 8;
    const bool ok0 = r0 < n_rows, ok1 = r1 < n_rows;

    if (start >= end) {
        const long long t0 = q_start + (ok0 ? r0 / heads : 0), h0 = ok0 ? r0 % heads : 0;
        const long long t1 = q_start + (ok1 ? r1 / heads : 0), h1 = ok1 ? r1 % heads : 0;
        if ((R16 ? warp == 0 : hf == 0) && c4 == 0) {
            if (ok0) L_part[t0 * stride_lt + h0 * stride_lh + split] = -__int_as_float(0x7f800000);
            if (ok1) L_part[t1 * stride_lt + h1 * stride_lh + split] = -__int_as_float(0x7f800000);
        }
        return;
    }
    const int n_tiles = (end - start + BLOCK_N - 1) / BLOCK_N;
    IdxT* idx = (IdxT*)(smem + IDX_OFF);
    const u32 kv_base = smem_addr(smem);
    const u32 idx_base = smem_addr(idx);

    // The program's query rows (draft tokens x heads) as this warp's 18 k16 A fragments: rows 16 rg ..
    // 16 rg + 15 (R16: 0 .. 15), dims hf*288 .. hf*288+287 (rows past the request's end are zeros). They
    // are asked for before the KV slots, so their loads overlap the slots' and tile 0's.
    // 64 rows: read into registers, 16 bytes a load (18 a thread, in flight until tile 0 is asked for).
    // 16 rows: copied into shared memory in 16-byte pieces, 16 threads a row, where tile 0 does not go
    // (stage 1; for fp8 the f16 tile), then taken with ldmatrix (rows of SROW bytes, so the eight rows
    // an ldmatrix reads fall in distinct banks) while tile 0 is copied.
    // Q8 (the fp8-mma path): the nine m16n8k32 e4m3 fragments instead, each warp's half row quantized at its
    // own scale (qs0, qs1: rows g and g + 8), which multiplies the warp's partial scores before the exchange.
    u32 qa[Q8 ? 9 : 18][4];
    uint4 qv[2][9];      // 64 rows: the loads as they arrive (rows g and g + 8), in flight until tile 0 is asked for
    uint2 qv8[2][9][2];  // Q8, 64 rows: dims 32 b + 4 c4 .. + 3 and 32 b + 16 + 4 c4 .. + 3 of rows g and g + 8
    float qs0 = 1.f, qs1 = 1.f;
    constexpr int Q_OFF = KV8 ? 0 : TILE_BYTES;
    if constexpr (R16) {
        static_assert(
            Q_OFF + ROWS16 * SROW <= (KV8 ? TILE_BYTES : IDX_OFF) && (KV8 || Q_OFF >= STAGE_OFF + STAGE_BYTES),
            "the queries overlap tile 0 or the KV slots");
        const int row = tid >> 4, r = rb * RB + row;
        const bool ok = r < n_rows;
        const u16* src = Q + (q_start + (ok ? r / heads : 0)) * stride_qt + (ok ? r % heads : 0) * stride_qh;
        for (int c = tid & 15; c < HEAD_DIM / 8; c += 16)
            cp_async16(kv_base + Q_OFF + row * SROW + c * 16, src + c * 8, ok ? 16 : 0);
        cp_commit();
    } else {
        const long long t0 = q_start + (ok0 ? r0 / heads : 0), h0 = ok0 ? r0 % heads : 0;
        const long long t1 = q_start + (ok1 ? r1 / heads : 0), h1 = ok1 ? r1 % heads : 0;
        // 16 bytes a load: lane c4 takes dims 32 b + 8 c4 .. + 7 of block b (pairs 4 c4 .. 4 c4 + 3), and
        // the four lanes of a row trade them (quad_transpose) so that each holds pairs c4, c4 + 4, c4 + 8,
        // c4 + 12: the a0 and a2 pairs of k steps 2 b and 2 b + 1.
        if constexpr (Q8) {  // 8 bytes a load, in the e4m3 A fragments' order (no trade)
            const u16* q0p = Q + t0 * stride_qt + h0 * stride_qh + hf * DHALF + c4 * 4;
            const u16* q1p = Q + t1 * stride_qt + h1 * stride_qh + hf * DHALF + c4 * 4;
#pragma unroll
            for (int b = 0; b < 9; ++b) {
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    qv8[0][b][u] = ok0 ? *(const uint2*)(q0p + b * 32 + u * 16) : make_uint2(0u, 0u);
                    qv8[1][b][u] = ok1 ? *(const uint2*)(q1p + b * 32 + u * 16) : make_uint2(0u, 0u);
                }
            }
        } else {
            const u16* q0p = Q + t0 * stride_qt + h0 * stride_qh + hf * DHALF + c4 * 8;
            const u16* q1p = Q + t1 * stride_qt + h1 * stride_qh + hf * DHALF + c4 * 8;
#pragma unroll
            for (int b = 0; b < 9; ++b) {
                qv[0][b] = ok0 ? *(const uint4*)(q0p + b * 32) : make_uint4(0u, 0u, 0u, 0u);
                qv[1][b] = ok1 ? *(const uint4*)(q1p + b * 32) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }

    // KV slots of tiles 0 and 1 into shared memory (later tiles are copied two steps ahead); each thread also
    // reads the slot of the tile-0 row it copies straight into a register, so tile 0 is asked for without
    // waiting for the block.
    // Each KV row is copied by 8 threads (below); in the four-stage 16-row fp8 programs (PAIRS16_FP8) by 8 lanes
    // of the warp pair that scores it (pair rg, warps rg and rg + 4: tokens 8 rg .. 8 rg + 7).
    const int ld_row = S4 && PAIRS16_FP8 ? (warp & 3) * 8 + (warp >> 2) * 4 + (lane >> 3) : tid >> 3;
    if (!S4 && tid < (S3 ? 3 : 2) * BLOCK_N) {
        int col = start + tid;
        idx[tid] = col < end ? (TAIL ? (IdxT)(q_start + col) : kv_indices[kv_start + col]) : (IdxT)0;
    }
    IdxT slot0;
    {
        const int col = start + ld_row;
        slot0 = col < end ? (TAIL ? (IdxT)(q_start + col) : kv_indices[kv_start + col]) : (IdxT)0;
    }
    // S4: the slots of this thread's rows of tiles 1, 2 and 3 (asked for with tile 0's).
    auto slot_of = [&](int tile) -> IdxT {
        const int col = start + tile * BLOCK_N + ld_row;
        return col < end ? kv_indices[kv_start + col] : (IdxT)0;
    };
    IdxT slot1 = 0, slot2 = 0, slot_next = 0;
    if constexpr (S4) {
        slot1 = slot_of(1);
        slot2 = slot_of(2);
        slot_next = slot_of(3);
    }
    TL(2);
    // Each KV row is copied by 8 threads, in 16-byte chunks 128 bytes apart: 9 chunks a thread (bf16),
    // 4 or 5 (fp8: 36 chunks a row).
    const u32 ld_dst = kv_base + ld_row * (KV8 ? SROW8 : SROW) + (tid & 7) * 16;
    auto load_tile_at = [&](int tile, int stage, IdxT slot) {
        const bool valid = start + tile * BLOCK_N + ld_row < end;
        const u8* src = KV + ((long long)slot * stride_kt + (tid & 7) * (16 / ELEM)) * ELEM;
        constexpr int CHUNKS = KV8 ? 5 : 9;  // per thread; an fp8 row has 36 chunks, so 4 threads copy a fifth
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i)
            if (!KV8 || i < 4 || (tid & 7) < 4)
                cp_async16(ld_dst + stage_off(stage) + i * 128, src + i * 128, valid ? 16 : 0);
    };
    auto load_tile = [&](int tile, int stage) {
        load_tile_at(tile, stage, tile == 0 ? slot0 : idx[(tile % 3) * BLOCK_N + ld_row]);
    };
    auto load_idx = [&](int tile) {
        if (tid < BLOCK_N) {
            const int col = start + tile * BLOCK_N + tid;
            const bool valid = col < end;
            if constexpr (TAIL) {
                idx[(tile % 3) * BLOCK_N + tid] = valid ? (IdxT)(q_start + col) : (IdxT)0;
                return;
            }
            cp_async_idx(idx_base + ((tile % 3) * BLOCK_N + tid) * (u32)sizeof(IdxT),
                         kv_indices + kv_start + (valid ? col : 0), valid);
        }
    };
    if constexpr (S4) {  // tiles 0, 1 and 2 into stages 1, 2 and 3, a group each (stage 0 holds the queries)
        load_tile_at(0, 1, slot0);
        cp_commit();
        if (n_tiles > 1) load_tile_at(1, 2, slot1);
        cp_commit();
        if (n_tiles > 2) load_tile_at(2, 3, slot2);
        cp_commit();
    } else {
        load_tile(0, 0);
        cp_commit();
    }
    if constexpr (!R16 && Q8) {
        quantize_queries(qv8, qa, qs0, qs1);
    } else if constexpr (!R16) {  // the 64-row queries into their k16 fragments, once tile 0 is asked for
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int b = 0; b < 9; ++b) {
                u32 v0 = qv[h][b].x, v1 = qv[h][b].y, v2 = qv[h][b].z, v3 = qv[h][b].w;
                quad_transpose(v0, v1, v2, v3, c4);  // now pairs c4, c4 + 4, c4 + 8, c4 + 12 of block b
                qa[2 * b][h] = q_pair<KV8>(v0);
                qa[2 * b][2 + h] = q_pair<KV8>(v1);
                qa[2 * b + 1][h] = q_pair<KV8>(v2);
                qa[2 * b + 1][2 + h] = q_pair<KV8>(v3);
            }
        }
    } else {
        // The queries' copies (the group before tile 0's; S4: before tiles 0-2's) are in, everyone's.
        if constexpr (S4)
            asm volatile("cp.async.wait_group 3;\n" ::);
        else
            asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
        if constexpr (Q8) {
            // Rows g and g + 8, dims 32 j + 4 c4 .. + 3 and 32 j + 16 + 4 c4 .. + 3 of this warp's half.
            const unsigned char* q_row = smem + Q_OFF + g * SROW + (hf * DHALF + c4 * 4) * 2;
            uint2 x[2][9][2];
#pragma unroll
            for (int j = 0; j < 9; ++j) {
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    x[0][j][u] = *(const uint2*)(q_row + j * 64 + u * 32);
                    x[1][j][u] = *(const uint2*)(q_row + 8 * SROW + j * 64 + u * 32);
                }
            }
            quantize_queries(x, qa, qs0, qs1);
        } else if constexpr (KV8) {
            // fp8 KV: the dims of each k16 step taken in the order the fp8 keys arrive in (below), lane c4
            // holding dims 4 c4 .. 4 c4 + 3 of the step's 16 for a0/a1 (the first two) and a2/a3.
            const unsigned char* q_row = smem + Q_OFF + g * SROW + (hf * DHALF + c4 * 4) * 2;
#pragma unroll
            for (int s = 0; s < 18; ++s) {
                uint2 x = *(const uint2*)(q_row + s * 32), y = *(const uint2*)(q_row + 8 * SROW + s * 32);
                if constexpr (R16 && KEYS16_INT) {  // the integer unpack pairs dims 0 and 2, 1 and 3 of four
                    x = make_uint2(__byte_perm(x.x, x.y, 0x5410), __byte_perm(x.x, x.y, 0x7632));
                    y = make_uint2(__byte_perm(y.x, y.y, 0x5410), __byte_perm(y.x, y.y, 0x7632));
                }
                qa[s][0] = q_pair<true>(x.x);
                qa[s][1] = q_pair<true>(y.x);
                qa[s][2] = q_pair<true>(x.y);
                qa[s][3] = q_pair<true>(y.y);
            }
        } else {
            const u32 q_lane = kv_base + Q_OFF + (lane & 15) * SROW + (hf * DHALF + (lane >> 4) * 8) * 2;
#pragma unroll
            for (int s = 0; s < 18; ++s) ldsm_x4(q_lane + s * 32, qa[s][0], qa[s][1], qa[s][2], qa[s][3]);
        }
    }

    float o[32][4];
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const float NEG_INF = -__int_as_float(0x7f800000);
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    float4* xch_mine = (float4*)(smem + XCH_OFF) + warp * 128 + lane;
    const float4* xch_partner = (const float4*)(smem + XCH_OFF) + (warp ^ 4) * 128 + lane;
    // The tail's mask rows of this thread's two query rows (their draft columns).
    const u8* mask0 = nullptr;
    const u8* mask1 = nullptr;
    if constexpr (TAIL) {
        const long long m_start = mask_indptr[b], m_cols = kv_len + n_tok;
        mask0 = mask + m_start + (ok0 ? r0 / heads : 0) * m_cols + kv_len;
        mask1 = mask + m_start + (ok1 ? r1 / heads : 0) * m_cols + kv_len;
    }

    // ldmatrix row addresses (bytes within a 16-bit tile) of this lane.
    const int mi = lane >> 3, mr = lane & 7;
    // R16: matrix mi of a load is this pair's 8 tokens and 8 dims, mi * 8 onward.
    const u32 k_lane = R16 ? (rg * 8 + mr) * SROW + (hf * DHALF + mi * 8) * 2
                           : ((mi >> 1) * 8 + mr) * SROW + (hf * DHALF + (mi & 1) * 8) * 2;
    const u32 v_lane = R16 ? (rg * 8 + mr) * SROW + (hf * DV_WARP + mi * 8) * 2
                           : ((mi & 1) * 8 + mr) * SROW + (hf * DV_WARP + (mi >> 1) * 8) * 2;
    // 16-row programs, fp8 tiles (rows of SROW8 bytes): a matrix is this pair's 8 tokens x 16 dims; keys: of
    // k16 step mi of four; values (ldmatrix.trans): dims 16 mi onward of 64.
    const u32 k8_lane = (rg * 8 + mr) * SROW8 + hf * DHALF + mi * 16;
    const u32 k8_last = (rg * 8 + mr) * SROW8 + hf * DHALF + 256 + (mi & 1) * 16;  // steps 16 and 17
    const u32 v8_lane = (rg * 8 + mr) * SROW8 + hf * DV_WARP + mi * 16;
    // Q8, 64 rows: the fp8 stage's keys straight into the e4m3 B fragments, matrix mi tokens 8 (mi >> 1) onward
    // and 16 fp8 dims (mi & 1) * 16 onward of a k32 step (lane c4 gets 4 consecutive dims of its token).
    const u32 k8q_lane = ((mi >> 1) * 8 + mr) * SROW8 + hf * DHALF + (mi & 1) * 16;

    if constexpr (S3) {  // tile 1 now that the slots are in (the queries' barrier); tile 2 at tile 0's barrier
        if (n_tiles > 1) load_tile(1, 1);
        cp_commit();
    }

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int stage = S4 ? (tile + 1) & 3 : S3 ? tile % 3 : tile & 1;
        if constexpr (S4)  // tile t (tiles t + 1 and t + 2, a group each after it, may be in flight)
            asm volatile("cp.async.wait_group 2;\n" ::);
        else if constexpr (S3)  // all but the last group: tile t and the slots of tile t + 2 (t + 1 may be in flight)
            asm volatile("cp.async.wait_group 1;\n" ::);
        else
            cp_wait_all();
        if (S4 && PAIRS16_FP8 && tile > 0)  // the pair's own rows (tile 0: the block, done with the queries)
            pair_sync(1 + rg);
        else
            __syncthreads();
        if (tile == 0) TL(3);
        if constexpr (KV8 && !R16) {
            // fp8 stage -> the f16 tile: each thread converts 9 groups of 8 values of one row (64-row
            // programs: the four row groups share each tile, so it is converted once, not in each warp).
            const u8* src = smem + STAGE_OFF + stage * STAGE_BYTES + ld_row * SROW8 + (tid & 7) * 8;
            unsigned char* dst = smem + ld_row * SROW + (tid & 7) * 16;
#pragma unroll
            for (int i = 0; i < (Q8 ? 8 : 9); ++i) {  // Q8: the 512 value dims only (the keys are read as fp8)
                const uint2 v = *(const uint2*)(src + i * 64);
                uint4 h;
                h.x = f8_lo(v.x);
                h.y = f8_hi(v.x);
                h.z = f8_lo(v.y);
                h.w = f8_hi(v.y);
                *(uint4*)(dst + i * 128) = h;
            }
        }
        if constexpr (S4) {  // tile t + 3 into the stage of tile t - 1 (read by its readers: the barrier above)
#if !(defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_KV_LOADS))
            if (tile + 3 < n_tiles) load_tile_at(tile + 3, (tile + 4) & 3, slot_next);
#endif
            cp_commit();
            slot_next = slot_of(tile + 4);
#if defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_MATH)
            continue;
#endif
        } else if constexpr (S3) {  // two groups: the slots of tile t + 3, then tile t + 2 (stage of tile t - 1)
            if (tile + 3 < n_tiles) load_idx(tile + 3);
            cp_commit();
            if (tile + 2 < n_tiles) load_tile(tile + 2, (tile + 2) % 3);
            cp_commit();
        } else {
            if (tile + 1 < n_tiles) {
                if (tile + 2 < n_tiles) load_idx(tile + 2);
                load_tile(tile + 1, stage ^ 1);
            }
            cp_commit();
        }
        if constexpr (KV8 && !R16 && !(Q8 && Q8_SYNC_AFTER_SCORES)) __syncthreads();
        // 16-row programs with fp8 KV: the stage as copied; its values go to f16 in registers after each
        // ldmatrix (each warp pair reads its own tokens, so nothing is converted twice).
        const u32 st = kv_base + (KV8 ? (R16 ? stage_off(stage) : 0) : stage * TILE_BYTES);
        const u32 st8 = kv_base + stage_off(stage);  // the fp8 stage as copied

        // Partial scores over this warp's half of the dims: 16 rows x 32 tokens (R16: x 8 tokens).
        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        if constexpr (PROBE_NO_SCORES && KV8 && R16) {
        } else if constexpr (Q8 && R16) {
            // e4m3 m16n8k32: two k32 steps a load (the last one); even and odd steps in two accumulators.
            float s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k4 = 0; k4 < 5; ++k4) {
                u32 r[4];
                ldsm_x4(st + (k4 < 4 ? k8_lane + k4 * 64 : k8_last), r[0], r[1], r[2], r[3]);
                mma_e4m3(s[0], qa[2 * k4], r[0], r[1]);
                if (k4 < 4) mma_e4m3(s2, qa[2 * k4 + 1], r[2], r[3]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) s[0][j] += s2[j];
        } else if constexpr (Q8) {
            // e4m3 m16n8k32 from the fp8 stage: 9 k32 steps x 2 token halves, two n8 tiles a load.
#pragma unroll
            for (int j = 0; j < 9; ++j) {
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4(st8 + k8q_lane + np * 16 * SROW8 + j * 32, b0, b1, b2, b3);
                    mma_e4m3(s[2 * np], qa[j], b0, b1);
                    mma_e4m3(s[2 * np + 1], qa[j], b2, b3);
                }
            }
        } else if constexpr (KV8 && R16) {
            // Four k16 steps a load (the last two); even and odd steps in two accumulators.
            float s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k4 = 0; k4 < 5; ++k4) {
                u32 r[4];
                ldsm_x4(st + (k4 < 4 ? k8_lane + k4 * 64 : k8_last), r[0], r[1], r[2], r[3]);
#pragma unroll
                for (int m = 0; m < (k4 < 4 ? 4 : 2); ++m)
                    if constexpr (KEYS16_INT)
                        mma16<true>(m % 2 == 0 ? s[0] : s2, qa[4 * k4 + m], f8s_even(r[m]), f8s_odd(r[m]));
                    else
                        mma16<true>(m % 2 == 0 ? s[0] : s2, qa[4 * k4 + m], f8_lo(r[m]), f8_hi(r[m]));
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) s[0][j] += s2[j];
        } else if constexpr (R16) {
            // Two k16 steps a load; even and odd steps in two accumulators (two chains of 9 mma, not 18).
            float s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k2 = 0; k2 < 9; ++k2) {
                u32 b0, b1, b2, b3;
                ldsm_x4(st + k_lane + k2 * 64, b0, b1, b2, b3);
                mma16<KV8>(s[0], qa[2 * k2], b0, b1);
                mma16<KV8>(s2, qa[2 * k2 + 1], b2, b3);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) s[0][j] += s2[j];
        } else {
#pragma unroll
            for (int ks = 0; ks < 18; ++ks) {
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4(st + k_lane + np * 16 * SROW + ks * 32, b0, b1, b2, b3);
                    mma16<KV8>(s[2 * np], qa[ks], b0, b1);
                    mma16<KV8>(s[2 * np + 1], qa[ks], b2, b3);
                }
            }
        }
        if constexpr (Q8) {  // the folded query scale of each row's half
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                s[i][0] *= qs0;
                s[i][1] *= qs0;
                s[i][2] *= qs1;
                s[i][3] *= qs1;
            }
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) xch_mine[i * 32] = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
        pair_sync(1 + rg);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const float4 p = xch_partner[i * 32];
            s[i][0] += p.x;
            s[i][1] += p.y;
            s[i][2] += p.z;
            s[i][3] += p.w;
        }

        // Online softmax (base 2) over the 32 tokens.
        const int col0 = start + tile * BLOCK_N + (R16 ? rg * 8 : 0) + c4 * 2;
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int i = 0; i < NT; ++i) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = col0 + i * 8 + j;
                bool valid0 = col < end, valid1 = valid0;
                if constexpr (TAIL) {
                    valid0 = valid0 && (!ok0 || mask0[col] != 0);
                    valid1 = valid1 && (!ok1 || mask1[col] != 0);
                }
                s[i][j] = valid0 ? s[i][j] * qk : DROPPED;
                s[i][2 + j] = valid1 ? s[i][2 + j] * qk : DROPPED;
                mx0 = fmaxf(mx0, s[i][j]);
                mx1 = fmaxf(mx1, s[i][2 + j]);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // The running max moves, and the output is rescaled, only when some row of the warp grew by more
        // than rescale_slack (base 2): otherwise the stale max stays, the result is the same up to
        // rounding, and the probabilities stay below 2^rescale_slack (256 at the default 8, within f16
        // and bf16 operands and fp32 sums).
        if (__any_sync(0xffffffffu, mx0 > m0 + rescale_slack || mx1 > m1 + rescale_slack)) {
            const float alpha0 = exp2f(m0 - mx0), alpha1 = exp2f(m1 - mx1);
            m0 = mx0;
            m1 = mx1;
            l0 *= alpha0;
            l1 *= alpha1;
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                o[i][0] *= alpha0;
                o[i][1] *= alpha0;
                o[i][2] *= alpha1;
                o[i][3] *= alpha1;
            }
        }
        // R16: a pair may have seen no token of its split yet (a split shorter than a tile), its max
        // still -inf; its scores are then all dropped and count as 0.
        const float mu0 = (R16 && m0 == NEG_INF) ? 0.f : m0, mu1 = (R16 && m1 == NEG_INF) ? 0.f : m1;
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            s[i][0] = exp2f(s[i][0] - mu0);
            s[i][1] = exp2f(s[i][1] - mu0);
            s[i][2] = exp2f(s[i][2] - mu1);
            s[i][3] = exp2f(s[i][3] - mu1);
            l0 += s[i][0] + s[i][1];
            l1 += s[i][2] + s[i][3];
        }
        u32 pa[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if constexpr (R16) {  // the m16n8k8 A operand: rows g and g + 8, this pair's 8 tokens
                pa[j][0] = pack2<KV8>(s[0][0], s[0][1]);
                pa[j][1] = pack2<KV8>(s[0][2], s[0][3]);
                pa[j][2] = pa[j][3] = 0u;
            } else {
                pa[j][0] = pack2<KV8>(s[2 * j][0], s[2 * j][1]);
                pa[j][1] = pack2<KV8>(s[2 * j][2], s[2 * j][3]);
                pa[j][2] = pack2<KV8>(s[2 * j + 1][0], s[2 * j + 1][1]);
                pa[j][3] = pack2<KV8>(s[2 * j + 1][2], s[2 * j + 1][3]);
            }
        }

        if constexpr (TAIL) {
            // The tail's values need not be its keys' first 512 dims: once every warp has read the keys,
            // the tile's first 512 dims are copied over from V_ext.
            __syncthreads();
            const bool valid = start + tile * BLOCK_N + ld_row < end;
            const u16* vsrc = V_ext + (long long)idx[(tile % 3) * BLOCK_N + ld_row] * stride_vt + (tid & 7) * 8;
#pragma unroll
            for (int i = 0; i < 8; ++i) cp_async16(ld_dst + stage_off(stage) + i * 128, vsrc + i * 64, valid ? 16 : 0);
            cp_commit();
            cp_wait_all();
            __syncthreads();
        }

        if constexpr (Q8 && !R16 && Q8_SYNC_AFTER_SCORES) __syncthreads();  // the tile's f16 values are in
        // This warp's 256 value dims: o += p @ v. fp8: each register of a load holds two dims (an even and
        // an odd n8 tile of the 16-dim block, fp8_to_bf16_layout below).
        if constexpr (PROBE_NO_VALUES && KV8 && R16) {
        } else if constexpr (KV8 && R16) {
#pragma unroll
            for (int dq = 0; dq < 4; ++dq) {
                u32 r[4];
                ldsm_x4_t(st + v8_lane + dq * 64, r[0], r[1], r[2], r[3]);
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    if constexpr (VALUES16_INT) {  // bytes 0 and 2: dim d's two tokens; 1 and 3: dim d + 1's
                        mma8<true>(o[2 * (4 * dq + m)], pa[0][0], pa[0][1], f8s_even(r[m]));
                        mma8<true>(o[2 * (4 * dq + m) + 1], pa[0][0], pa[0][1], f8s_odd(r[m]));
                    } else {
                        const u32 w = by_dim(r[m]);
                        mma8<true>(o[2 * (4 * dq + m)], pa[0][0], pa[0][1], f8_lo(w));
                        mma8<true>(o[2 * (4 * dq + m) + 1], pa[0][0], pa[0][1], f8_hi(w));
                    }
                }
            }
        } else if constexpr (R16) {
#pragma unroll
            for (int dq = 0; dq < 8; ++dq) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(st + v_lane + dq * 64, b0, b1, b2, b3);
                mma8<KV8>(o[4 * dq], pa[0][0], pa[0][1], b0);
                mma8<KV8>(o[4 * dq + 1], pa[0][0], pa[0][1], b1);
                mma8<KV8>(o[4 * dq + 2], pa[0][0], pa[0][1], b2);
                mma8<KV8>(o[4 * dq + 3], pa[0][0], pa[0][1], b3);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int dt = 0; dt < 16; ++dt) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4_t(st + v_lane + j * 16 * SROW + dt * 32, b0, b1, b2, b3);
                    mma16<KV8>(o[2 * dt], pa[j], b0, b1);
                    mma16<KV8>(o[2 * dt + 1], pa[j], b2, b3);
                }
            }
        }
    }

    if constexpr (KV8 && R16) {
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            fp8_to_bf16_layout(o[2 * c], o[2 * c + 1], 0, c4);
            fp8_to_bf16_layout(o[2 * c], o[2 * c + 1], 2, c4);
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    TL(4);
    if constexpr (R16) {
        static_assert(P16, "16-row programs write bf16 partial results (the one launch)");
        store16(o, m0, m1, l0, l1, KV8 && VALUES16_INT ? v_scale * 256.f : v_scale, O_part, L_part, q_start, n_rows,
                heads, rb * RB, split, stride_ot, stride_oh, stride_os, stride_lt, stride_lh);
        return;
    }
    const float sc0 = v_scale / l0, sc1 = v_scale / l1;
    const long long t0 = q_start + (ok0 ? r0 / heads : 0), h0 = ok0 ? r0 % heads : 0;
    const long long t1 = q_start + (ok1 ? r1 / heads : 0), h1 = ok1 ? r1 % heads : 0;
    float* o0 = O_part + t0 * stride_ot + h0 * stride_oh + split * stride_os + hf * DV_WARP + c4 * 2;
    float* o1 = O_part + t1 * stride_ot + h1 * stride_oh + split * stride_os + hf * DV_WARP + c4 * 2;
    if constexpr (P16) {  // bf16 partial results (O_part holds bf16, with the same element strides)
        // Straight from registers, 16 bytes a store: of each 32-dim block k (value dims 8 i + 2 c4 of
        // i = 4 k .. 4 k + 3), the quad's lanes trade their pairs so that lane c4 holds dims 8 c4 .. 8 c4 + 7,
        // and a warp's store covers 64 contiguous bytes of each of its eight rows.
        u16* p0 = (u16*)O_part + t0 * stride_ot + h0 * stride_oh + split * stride_os + hf * DV_WARP + c4 * 8;
        u16* p1 = (u16*)O_part + t1 * stride_ot + h1 * stride_oh + split * stride_os + hf * DV_WARP + c4 * 8;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            u32 a0 = pack2<false>(o[4 * k][0] * sc0, o[4 * k][1] * sc0);
            u32 a1 = pack2<false>(o[4 * k + 1][0] * sc0, o[4 * k + 1][1] * sc0);
            u32 a2 = pack2<false>(o[4 * k + 2][0] * sc0, o[4 * k + 2][1] * sc0);
            u32 a3 = pack2<false>(o[4 * k + 3][0] * sc0, o[4 * k + 3][1] * sc0);
            u32 b0 = pack2<false>(o[4 * k][2] * sc1, o[4 * k][3] * sc1);
            u32 b1 = pack2<false>(o[4 * k + 1][2] * sc1, o[4 * k + 1][3] * sc1);
            u32 b2 = pack2<false>(o[4 * k + 2][2] * sc1, o[4 * k + 2][3] * sc1);
            u32 b3 = pack2<false>(o[4 * k + 3][2] * sc1, o[4 * k + 3][3] * sc1);
            quad_transpose(a0, a1, a2, a3, c4);
            quad_transpose(b0, b1, b2, b3, c4);
            if (ok0) *(uint4*)(p0 + 32 * k) = make_uint4(a0, a1, a2, a3);
            if (ok1) *(uint4*)(p1 + 32 * k) = make_uint4(b0, b1, b2, b3);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            if (ok0) *(float2*)(o0 + i * 8) = make_float2(o[i][0] * sc0, o[i][1] * sc0);
            if (ok1) *(float2*)(o1 + i * 8) = make_float2(o[i][2] * sc1, o[i][3] * sc1);
        }
    }
    if (hf == 0 && c4 == 0) {
        if (ok0) L_part[t0 * stride_lt + h0 * stride_lh + split] = m0 + log2f(l0);
        if (ok1) L_part[t1 * stride_lt + h1 * stride_lh + split] = m1 + log2f(l1);
    }
}

// 16-row programs of a decode call that hold 8 query rows or fewer (8 heads or fewer; a verify's programs keep the
// 16-row body, as the device checks cover decode only) with fp8 KV on the exact path: the products transposed, so that
// the 16 rows of an mma are KV tokens and its 8 columns the query rows (1 on, 0: such programs run the 16-row body
// above). The 16-row body spends half of each m16 product on rows it does not hold and its values on m16n8k8; here the
// scores are m16n8k16 (16 tokens x 8 rows) with the keys as the A operand and the queries (B) in registers, and the
// values m16n8k16 (16 value dims x 8 rows over 16 tokens) with the values as the A operand (ldmatrix.trans of the fp8
// tile) and the probabilities as B, which movmatrix turns from the scores' accumulator layout (tokens x rows) into
// (rows x tokens). Warps 0-3 and 4-7 form two groups, each on its own 16 tokens of a 32-token tile: a warp takes a
// quarter of the dims (144 of the keys', 128 of the values'), the four partial scores meet through shared memory
// at the group's barrier, and each group copies its own rows of the fp8 stages and waits at its own barrier (128
// threads), so the pipeline is the 16-row one's with 16-token halves, with STAGES8 stages (the launcher's figure,
// four: three tiles in flight while one is scored; the launcher's fp8 shared memory holds them). The two groups'
// results meet at one max at the end. A warp holds its queries in 18 registers and its output in 32 (DECODE8).
// The same body with two blocks of 8 columns (NC = 2: 36 and 64 registers, each key and value fragment used by both
// blocks) serves the decode programs of 9 to 16 rows where DECODE16 is 1.
#ifndef DECODE8
#define DECODE8 1
#endif
// Stages of the fp8 tile in these programs: STAGES8 (the launcher's figure, which sizes the shared memory), or
// fewer where a -D flag says so (benchmarks compare the counts).
#ifndef DECODE8_STAGES
#define DECODE8_STAGES STAGES8
#endif
#if (defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_KV_LOADS)) || \
    (defined(SM120_TIMELINE) && defined(SM120_PROBE_NO_MATH))
constexpr bool PROBE_LOOP = true;  // the probes time the 16-row body's loop
#else
constexpr bool PROBE_LOOP = false;
#endif
constexpr bool USE_DECODE8 = DECODE8 && FP8_UNPACK16 == 0 && !PROBE_NO_SCORES && !PROBE_NO_VALUES && !PROBE_LOOP;
// The same body with two blocks of 8 columns for the fp8 decode programs of 9 to 16 rows (16 heads), where the
// request's splits walk DECODE16_MAX_SPLIT prefix tokens or fewer: 1 (the default), 0: they run the 16-row body.
// Timed (docs/benchmarks.md, "2026-12-05, evening" and "2026-12-05, night"): its loop is 3-6 % slower than the 16-row
// body's, its store and grid barrier shorter, so it wins where a split is short. Splits of 64 and 256 tokens (8k at
// batch 1 and 4, 32k at batch 1) gained 1.04-1.11x on the H100 and on the H200. Splits of 1024 and 1408 tokens (32k at
// batch 4, 131k and 185k at batch 1) gained 1.02-1.03x on the H100 and lost on the H200 (0.93-0.97x), and splits of
// 4000 and 5632 tokens lost on the H100 (0.96-0.98x; not timed on the H200). The limit lies between the longest split
// that won on both and the shortest that lost on one.
#ifndef DECODE16
#define DECODE16 1
#endif
#ifndef DECODE16_MAX_SPLIT
#define DECODE16_MAX_SPLIT 512
#endif
constexpr bool USE_DECODE16 = USE_DECODE8 && DECODE16;
// MLA's values are the first 512 dims of its keys, the same fp8 bytes: with VALUES_FROM_KEYS 1 a warp of the body
// takes the key dims whose values it owns (latent dims 128 wq .. 128 wq + 127, and rope dims 512 + 16 wq .. + 15),
// keeps the f16 key fragments of its latent dims, and turns each into the values' A operand with four movmatrix,
// instead of reading the tile again (ldmatrix.trans), regrouping its bytes and converting them a second time. 0 (the
// default): the values are read and converted on their own. Timed: the 8-head loop no faster (41.62 against 41.60 us
// at 185k), the two-block loop slower (45.16 against 44.33 us).
#ifndef VALUES_FROM_KEYS
#define VALUES_FROM_KEYS 0
#endif
// The same body for bf16 KV (DECODE8_BF16): the keys' A operand straight from the tile (ldmatrix, one k16 step a
// load), the values' with ldmatrix.trans, bf16 products and probabilities, two stages of 32 tokens (the launcher's
// bf16 shared memory holds two). 1 (the default; timed: 8-head bf16 decode 1.05-1.29x faster than Triton's at 8k-185k
// and 1.04-1.05x faster than the 16-row body at batch 4), 0: bf16 decode programs take the 16-row body. With
// DECODE16_BF16 1 as well (the default), the bf16 decode programs of 9 to 16 rows take two blocks where the request's
// splits walk DECODE16_BF16_MAX_SPLIT tokens or fewer; timed on the H200 against the 16-row bf16 body (16 heads,
// batch 4, the route's launch): splits of 256 and 1024 tokens 1.01 and 1.13x ("2026-12-05, night").
#ifndef DECODE8_BF16
#define DECODE8_BF16 1
#endif
#ifndef DECODE16_BF16
#define DECODE16_BF16 1
#endif
#ifndef DECODE16_BF16_MAX_SPLIT
#define DECODE16_BF16_MAX_SPLIT 2048
#endif
constexpr bool USE_DECODE8_BF16 = DECODE8_BF16 && !PROBE_NO_SCORES && !PROBE_NO_VALUES && !PROBE_LOOP;

// Whether this program of a 16-row launch takes transposed_body below with one block of 8 columns: decode (no draft
// tail), fp8 KV on the exact path (bf16 KV where DECODE8_BF16 is 1), 8 rows or fewer.
template <bool KV8, bool R16, bool Q8>
__device__ __forceinline__ bool takes_decode8(const RowPtrs& rp, int heads, int has_tail) {
    if constexpr ((KV8 ? USE_DECODE8 : USE_DECODE8_BF16) && R16 && !Q8)
        return !has_tail && (rp.q_end - rp.q_start) * heads - (int)blockIdx.x * ROWS16 <= 8;
    else
        return false;
}
// ... with two blocks (asked where takes_decode8 said no: a 16-row program of a decode call holds 9 to 16 rows),
// where the request's splits are DECODE16_MAX_SPLIT (bf16: DECODE16_BF16_MAX_SPLIT) tokens or shorter (every
// program of a request takes one body).
template <bool KV8, bool R16, bool Q8>
__device__ __forceinline__ bool takes_decode16(const RowPtrs& rp, int has_tail, int num_splits, int min_split) {
    constexpr int max_split = KV8 ? DECODE16_MAX_SPLIT : DECODE16_BF16_MAX_SPLIT;
    if constexpr ((KV8 ? USE_DECODE16 : USE_DECODE8_BF16 && DECODE16_BF16) && R16 && !Q8)
        return !has_tail && split_chunk(rp.kv_end - rp.kv_start, num_splits, min_split) <= max_split;
    else
        return false;
}

__device__ __forceinline__ void group_sync(int grp) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + grp));
}

__device__ __forceinline__ void ldsm_x2(u32 addr, u32& r0, u32& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// The transpose of an 8 x 8 matrix of 16-bit values in the mma accumulator layout (lane 4 i + j: row i, columns
// 2 j and 2 j + 1), in the same layout.
__device__ __forceinline__ u32 movmatrix_t(u32 a) {
    u32 d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

template <typename IdxT, int NC, bool KV8>
__device__ __forceinline__ void transposed_body(const u16* __restrict__ Q, const u8* __restrict__ KV,
                                                const IdxT* __restrict__ kv_indices, float* __restrict__ O_part,
                                                float* __restrict__ L_part, float qk, float v_scale,
                                                float rescale_slack, long long stride_qt, long long stride_qh,
                                                long long stride_kt, long long stride_ot, long long stride_oh,
                                                long long stride_os, long long stride_lt, long long stride_lh,
                                                int heads, int num_splits, int min_split, const RowPtrs& rp) {
    constexpr int S = KV8 ? DECODE8_STAGES : 2;                   // stages of the KV tile
    constexpr int ROW_BYTES = KV8 ? SROW8 : SROW;                 // a KV row in shared memory
    constexpr int STAGE_BYTES = KV8 ? TILE8_BYTES : TILE_BYTES;   // a stage: BLOCK_N rows
    constexpr int SMEM = KV8 ? SMEM_BYTES_FP8 : SMEM_BYTES_BF16;  // what the launcher asks for
    constexpr int ELEM = KV8 ? 1 : 2;                             // bytes a KV value
    constexpr bool VFK = KV8 && VALUES_FROM_KEYS;                 // the values from the keys' f16 fragments
    constexpr int R = 8 * NC;                                     // query rows: NC blocks of 8 columns
    static_assert(NC == 1 || NC == 2, "one or two blocks of 8 query rows");
    static_assert(S >= (KV8 ? 3 : 2) && S * STAGE_BYTES + NC * XCH8_BYTES <= SMEM,
                  "the KV stages and the exchange do not fit");
    static_assert((2 * R * OB_STRIDE + 4 * R) * 4 <= SMEM, "the two groups' sums do not fit");
    extern __shared__ __align__(16) unsigned char smem[];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int rb = blockIdx.x, split = blockIdx.y;
    const int q_start = rp.q_start, q_end = rp.q_end, kv_start = rp.kv_start, kv_end = rp.kv_end;
    const int n_rows = (q_end - q_start) * heads, row0 = rb * ROWS16;
    const int kv_len = kv_end - kv_start;
    int start, end;
    split_range(kv_len, split, num_splits, min_split, start, end);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = warp >> 2, wq = warp & 3;  // the group (half of each tile) and the quarter of the dims
    const int g = lane >> 2, c4 = lane & 3;
    if (row0 >= n_rows) return;
    if (start >= end) {
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (warp == 0 && c4 == 0 && row0 + 8 * c + g < n_rows) {
                const int r = row0 + 8 * c + g;
                L_part[(q_start + r / heads) * stride_lt + (r % heads) * stride_lh + split] = NEG_INF;
            }
        return;
    }
    const int n_tiles = (end - start + BLOCK_N - 1) / BLOCK_N;
    const u32 kv_base = smem_addr(smem);

    // Each KV row is copied by 8 threads of the group that scores it (rows 16 grp .. 16 grp + 15 of a tile), its
    // slot read into a register a tile ahead (tiles 0-3 at the start).
    const int ld_row = 16 * grp + ((tid & 127) >> 3);
    auto slot_of = [&](int tile) -> IdxT {
        const int col = start + tile * BLOCK_N + ld_row;
        return col < end ? kv_indices[kv_start + col] : (IdxT)0;
    };
    IdxT slot_first[S - 1];  // tiles 0 .. S - 2, asked for before the loop
#pragma unroll
    for (int i = 0; i < S - 1; ++i) slot_first[i] = slot_of(i);
    IdxT slot_next = slot_of(S - 1);

    // The queries as the B operand of the scores: column g of block c = query row row0 + 8 c + g (zeros past the
    // request's end), k step s of this warp's 144 key dims: fp8, dims 4 c4 .. 4 c4 + 3 of its 16 (the order the fp8
    // keys arrive in); bf16, dims 2 c4, 2 c4 + 1 (x) and 8 + 2 c4, 9 + 2 c4 (y), the operand's own order.
    // (VALUES_FROM_KEYS: steps 0-7 the latent dims 128 wq onward, step 8 the rope dims 512 + 16 wq onward.)
    uint2 qv[NC][9];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int r = row0 + 8 * c + g;
        const bool ok = r < n_rows;
        if constexpr (!KV8) {
            const u16* src =
                Q + (q_start + (ok ? r / heads : 0)) * stride_qt + (ok ? r % heads : 0) * stride_qh + wq * 144 + c4 * 2;
#pragma unroll
            for (int s = 0; s < 9; ++s)
                qv[c][s] =
                    ok ? make_uint2(*(const u32*)(src + s * 16), *(const u32*)(src + s * 16 + 8)) : make_uint2(0u, 0u);
        } else if constexpr (VFK) {
            const u16* src =
                Q + (q_start + (ok ? r / heads : 0)) * stride_qt + (ok ? r % heads : 0) * stride_qh + c4 * 4;
#pragma unroll
            for (int s = 0; s < 9; ++s)
                qv[c][s] = ok ? *(const uint2*)(src + (s < 8 ? wq * 128 + s * 16 : 512 + wq * 16)) : make_uint2(0u, 0u);
        } else {
            const u16* src =
                Q + (q_start + (ok ? r / heads : 0)) * stride_qt + (ok ? r % heads : 0) * stride_qh + wq * 144 + c4 * 4;
#pragma unroll
            for (int s = 0; s < 9; ++s) qv[c][s] = ok ? *(const uint2*)(src + s * 16) : make_uint2(0u, 0u);
        }
    }
    TL(2);
    const u32 ld_dst = kv_base + ld_row * ROW_BYTES + (tid & 7) * 16;
    auto load_tile_at = [&](int tile, int stage, IdxT slot) {
        const bool valid = start + tile * BLOCK_N + ld_row < end;
        const u8* src = KV + ((long long)slot * stride_kt + (tid & 7) * (16 / ELEM)) * ELEM;
        constexpr int CHUNKS = KV8 ? 5 : 9;  // per thread: an fp8 row has 36 chunks (4 threads copy a fifth), bf16 72
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i)
            if (!KV8 || i < 4 || (tid & 7) < 4)
                cp_async16(ld_dst + stage * STAGE_BYTES + i * 128, src + i * 128, valid ? 16 : 0);
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {  // tile i into stage i, a group each
        if (i < n_tiles) load_tile_at(i, i, slot_first[i]);
        cp_commit();
    }
    u32 qb[NC][9][2];
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int s = 0; s < 9; ++s) {
            qb[c][s][0] = q_pair<KV8>(qv[c][s].x);
            qb[c][s][1] = q_pair<KV8>(qv[c][s].y);
        }

    // ldmatrix rows of this lane: matrix mi = tokens 8 (mi & 1) onward of the group's 16, bytes 16 (mi >> 1) onward
    // (fp8: the next 16 dims, two k16 steps a load; bf16: dims 8 onward of one k16 step). bf16 values
    // (ldmatrix.trans): matrix mi = tokens 8 (mi >> 1) onward, dims 8 (mi & 1) onward.
    const int mi = lane >> 3, mr = lane & 7;
    const u32 row_lane = (16 * grp + mr + 8 * (mi & 1)) * ROW_BYTES + 16 * (mi >> 1);
    const u32 k_lane = row_lane + wq * (VFK ? 128 : 144) * ELEM;
    const u32 v_lane = KV8 ? row_lane + wq * 128 : (16 * grp + mr + 8 * (mi >> 1)) * SROW + 16 * (mi & 1) + wq * 256;
    const u32 rope_lane = VFK ? row_lane + 512 + 16 * wq : k_lane + 128 * ELEM;  // the keys' ninth k16 step
    float4* const xch = (float4*)(smem + S * STAGE_BYTES);  // [8 warps][NC blocks][32 lanes] partial scores

    // o[c][2 j] / o[c][2 j + 1]: value dims 128 wq + 32 (j / 2) + 2 g (+ 1) in c[0..1], + 16 in c[2..3]; columns
    // (query rows) 8 c + 2 c4 and 8 c + 2 c4 + 1. bf16: o[c][j] value dims 128 wq + 16 j + g in c[0..1], + 8 in
    // c[2..3].
    float o[NC][8][4];
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[c][i][0] = o[c][i][1] = o[c][i][2] = o[c][i][3] = 0.f;
    float m0[NC], m1[NC], l0[NC], l1[NC];  // query rows 8 c + 2 c4 and 8 c + 2 c4 + 1
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        m0[c] = m1[c] = NEG_INF;
        l0[c] = l1[c] = 0.f;
    }

    int stage = 0, stage_back = S - 1;  // tile t's stage, and tile t - 1's (where tile t + S - 1 goes)
    for (int tile = 0; tile < n_tiles; ++tile) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2));  // tile t (t + 1 .. t + S - 2 may be in flight)
        group_sync(grp);
        if (tile == 0) TL(3);
        // tile t + S - 1 into the stage of tile t - 1, which the group's warps have read (the barrier above)
        if (tile + S - 1 < n_tiles) load_tile_at(tile + S - 1, stage_back, slot_next);
        cp_commit();
        slot_next = slot_of(tile + S);
        const u32 st = kv_base + stage * STAGE_BYTES;

        // Scores: 16 tokens (rows g and g + 8) x 8 query rows of each block (columns 2 c4, 2 c4 + 1) over 144 dims,
        // two k16 steps a load, even and odd steps in two accumulators.
        float s[NC][4], s2[NC][4];
#pragma unroll
        for (int c = 0; c < NC; ++c)
            s[c][0] = s[c][1] = s[c][2] = s[c][3] = s2[c][0] = s2[c][1] = s2[c][2] = s2[c][3] = 0.f;
        u32 kf[VFK ? 8 : 1][4];  // VALUES_FROM_KEYS: the latent dims' key fragments, for the values
        if constexpr (!KV8) {    // bf16: one k16 step a load, the last (rope) step with the even ones
#pragma unroll
            for (int k2 = 0; k2 < 4; ++k2) {
                u32 a0[4], a1[4];
                ldsm_x4(st + k_lane + k2 * 64, a0[0], a0[1], a0[2], a0[3]);
                ldsm_x4(st + k_lane + k2 * 64 + 32, a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    mma16<false>(s[c], a0, qb[c][2 * k2][0], qb[c][2 * k2][1]);
                    mma16<false>(s2[c], a1, qb[c][2 * k2 + 1][0], qb[c][2 * k2 + 1][1]);
                }
            }
            u32 a0[4];
            ldsm_x4(st + rope_lane, a0[0], a0[1], a0[2], a0[3]);
#pragma unroll
            for (int c = 0; c < NC; ++c) mma16<false>(s[c], a0, qb[c][8][0], qb[c][8][1]);
        } else {
#pragma unroll
            for (int k2 = 0; k2 < 4; ++k2) {
                u32 r[4];
                ldsm_x4(st + k_lane + k2 * 32, r[0], r[1], r[2], r[3]);
                const u32 a0[4] = {f8_lo(r[0]), f8_lo(r[1]), f8_hi(r[0]), f8_hi(r[1])};
                const u32 a1[4] = {f8_lo(r[2]), f8_lo(r[3]), f8_hi(r[2]), f8_hi(r[3])};
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    mma16<true>(s[c], a0, qb[c][2 * k2][0], qb[c][2 * k2][1]);
                    mma16<true>(s2[c], a1, qb[c][2 * k2 + 1][0], qb[c][2 * k2 + 1][1]);
                }
                if constexpr (VFK) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        kf[2 * k2][i] = a0[i];
                        kf[2 * k2 + 1][i] = a1[i];
                    }
                }
            }
            {
                u32 r0, r1;
                ldsm_x2(st + rope_lane, r0, r1);
                const u32 a0[4] = {f8_lo(r0), f8_lo(r1), f8_hi(r0), f8_hi(r1)};
#pragma unroll
                for (int c = 0; c < NC; ++c) mma16<true>(s[c], a0, qb[c][8][0], qb[c][8][1]);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int j = 0; j < 4; ++j) s[c][j] += s2[c][j];
        // The group's four quarters, summed in the same order in every warp (so all four agree on each max).
#pragma unroll
        for (int c = 0; c < NC; ++c) xch[(warp * NC + c) * 32 + lane] = make_float4(s[c][0], s[c][1], s[c][2], s[c][3]);
        group_sync(grp);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            float4 x = xch[(4 * grp * NC + c) * 32 + lane];
#pragma unroll
            for (int j = 1; j < 4; ++j) {
                const float4 y = xch[((4 * grp + j) * NC + c) * 32 + lane];
                x.x += y.x;
                x.y += y.y;
                x.z += y.z;
                x.w += y.w;
            }
            s[c][0] = x.x;
            s[c][1] = x.y;
            s[c][2] = x.z;
            s[c][3] = x.w;
        }

        // Online softmax (base 2) of each query row over the 16 tokens: a column's max over the lanes of g.
        const int col = start + tile * BLOCK_N + 16 * grp + g;
        const bool va = col < end, vb = col + 8 < end;
        float mx0[NC], mx1[NC];
        bool moves = false;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            s[c][0] = va ? s[c][0] * qk : NEG_INF;
            s[c][1] = va ? s[c][1] * qk : NEG_INF;
            s[c][2] = vb ? s[c][2] * qk : NEG_INF;
            s[c][3] = vb ? s[c][3] * qk : NEG_INF;
            mx0[c] = fmaxf(m0[c], fmaxf(s[c][0], s[c][2]));
            mx1[c] = fmaxf(m1[c], fmaxf(s[c][1], s[c][3]));
#pragma unroll
            for (int d = 4; d < 32; d *= 2) {
                mx0[c] = fmaxf(mx0[c], __shfl_xor_sync(0xffffffffu, mx0[c], d));
                mx1[c] = fmaxf(mx1[c], __shfl_xor_sync(0xffffffffu, mx1[c], d));
            }
            moves = moves || mx0[c] > m0[c] + rescale_slack || mx1[c] > m1[c] + rescale_slack;
        }
        if (__any_sync(0xffffffffu, moves)) {
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float alpha0 = exp2f(m0[c] - mx0[c]), alpha1 = exp2f(m1[c] - mx1[c]);
                m0[c] = mx0[c];
                m1[c] = mx1[c];
                l0[c] *= alpha0;
                l1[c] *= alpha1;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    o[c][i][0] *= alpha0;
                    o[c][i][1] *= alpha1;
                    o[c][i][2] *= alpha0;
                    o[c][i][3] *= alpha1;
                }
            }
        }
        // P as the B operand of the values: (tokens 2 c4, 2 c4 + 1 | + 8, + 9) x query row 8 c + g.
        u32 pb0[NC], pb1[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            // A group may have seen no token of its split yet (a split shorter than 16 tokens): its max is still
            // -inf, its scores are all dropped and count as 0.
            const float mu0 = m0[c] == NEG_INF ? 0.f : m0[c], mu1 = m1[c] == NEG_INF ? 0.f : m1[c];
            s[c][0] = exp2f(s[c][0] - mu0);
            s[c][1] = exp2f(s[c][1] - mu1);
            s[c][2] = exp2f(s[c][2] - mu0);
            s[c][3] = exp2f(s[c][3] - mu1);
            l0[c] += s[c][0] + s[c][2];
            l1[c] += s[c][1] + s[c][3];
            pb0[c] = movmatrix_t(pack2<KV8>(s[c][0], s[c][1]));
            pb1[c] = movmatrix_t(pack2<KV8>(s[c][2], s[c][3]));
        }

        // Values: 32 dims a load; the even dims of each pair of the load in o[2 j], the odd ones in o[2 j + 1]
        // (by_dim: a register's bytes regrouped so that each half holds one dim's two tokens). VALUES_FROM_KEYS:
        // key fragment f (16 tokens x 16 dims) transposed block by block is the A operand of dims 16 f onward of
        // this warp's 128, in the keys' k order: o[f] row i holds dim 4 (i / 2) + i % 2, row i + 8 that dim + 2.
        // bf16: 16 dims a load (ldmatrix.trans gives the A operand as it is).
        if constexpr (!KV8) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                u32 av[4];
                ldsm_x4_t(st + v_lane + j * 32, av[0], av[1], av[2], av[3]);
#pragma unroll
                for (int c = 0; c < NC; ++c) mma16<false>(o[c][j], av, pb0[c], pb1[c]);
            }
        } else if constexpr (VFK) {
#pragma unroll
            for (int f = 0; f < 8; ++f) {
                const u32 av[4] = {movmatrix_t(kf[f][0]), movmatrix_t(kf[f][2]), movmatrix_t(kf[f][1]),
                                   movmatrix_t(kf[f][3])};
#pragma unroll
                for (int c = 0; c < NC; ++c) mma16<true>(o[c][f], av, pb0[c], pb1[c]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                u32 r[4];
                ldsm_x4_t(st + v_lane + j * 32, r[0], r[1], r[2], r[3]);
                const u32 w0 = by_dim(r[0]), w1 = by_dim(r[1]), w2 = by_dim(r[2]), w3 = by_dim(r[3]);
                const u32 ae[4] = {f8_lo(w0), f8_lo(w2), f8_lo(w1), f8_lo(w3)};
                const u32 ao[4] = {f8_hi(w0), f8_hi(w2), f8_hi(w1), f8_hi(w3)};
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    mma16<true>(o[c][2 * j], ae, pb0[c], pb1[c]);
                    mma16<true>(o[c][2 * j + 1], ao, pb0[c], pb1[c]);
                }
            }
        }
        stage_back = stage;
        stage = stage + 1 == S ? 0 : stage + 1;
    }
    // Each column's sum over the lanes of g.
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int d = 4; d < 32; d *= 2) {
            l0[c] += __shfl_xor_sync(0xffffffffu, l0[c], d);
            l1[c] += __shfl_xor_sync(0xffffffffu, l1[c], d);
        }
    TL(4);

    // The end: the two groups' results, each as it stands with its max and sum, through shared memory, then added
    // at one max as the bf16 partial results are stored, 16 bytes a store.
    float* ob = (float*)smem;            // [2 groups][R rows][OB_STRIDE]
    float* mx = ob + 2 * R * OB_STRIDE;  // [2 groups][R rows] running max
    float* ls = mx + 2 * R;              // [2 groups][R rows] sum of probabilities
    cp_wait_all();
    __syncthreads();  // every warp is done with the KV tiles
#pragma unroll
    for (int c = 0; c < NC; ++c)
        if (wq == 0 && g == 0) {
            mx[grp * R + 8 * c + 2 * c4] = m0[c];
            mx[grp * R + 8 * c + 2 * c4 + 1] = m1[c];
            ls[grp * R + 8 * c + 2 * c4] = l0[c];
            ls[grp * R + 8 * c + 2 * c4 + 1] = l1[c];
        }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if constexpr (!KV8 || VFK) {
            // o[f]: dims 16 f + d and d + up of the warp's 128; bf16: d = g, up = 8; VALUES_FROM_KEYS (the keys' k
            // order): d = 4 (g / 2) + g % 2, up = 2.
            constexpr int up = KV8 ? 2 : 8;
            const int d = KV8 ? 4 * (g >> 1) + (g & 1) : g;
            float* const mine = ob + (grp * R + 8 * c) * OB_STRIDE + wq * 128 + d;
#pragma unroll
            for (int f = 0; f < 8; ++f) {
                float* at = mine + 16 * f;
                at[2 * c4 * OB_STRIDE] = o[c][f][0];
                at[(2 * c4 + 1) * OB_STRIDE] = o[c][f][1];
                at[2 * c4 * OB_STRIDE + up] = o[c][f][2];
                at[(2 * c4 + 1) * OB_STRIDE + up] = o[c][f][3];
            }
        } else {
            float* const mine = ob + (grp * R + 8 * c) * OB_STRIDE + wq * 128 + 2 * g;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float* at = mine + 32 * j;
                *(float2*)(at + 2 * c4 * OB_STRIDE) = make_float2(o[c][2 * j][0], o[c][2 * j + 1][0]);
                *(float2*)(at + (2 * c4 + 1) * OB_STRIDE) = make_float2(o[c][2 * j][1], o[c][2 * j + 1][1]);
                *(float2*)(at + 2 * c4 * OB_STRIDE + 16) = make_float2(o[c][2 * j][2], o[c][2 * j + 1][2]);
                *(float2*)(at + (2 * c4 + 1) * OB_STRIDE + 16) = make_float2(o[c][2 * j][3], o[c][2 * j + 1][3]);
            }
        }
    }
    __syncthreads();
    // A row's max and sum over the two groups, and the weight of each group's result (a group with no token of
    // the split, -inf, weighs 0).
    auto row_total = [&](int row, float& M, float& L, float& fa, float& fc) {
        const float a = mx[row], c = mx[R + row];
        M = fmaxf(a, c);
        const float ea = a == NEG_INF ? 0.f : exp2f(a - M), ec = c == NEG_INF ? 0.f : exp2f(c - M);
        L = ls[row] * ea + ls[R + row] * ec;
        const float inv = L > 0.f ? v_scale / L : 0.f;
        fa = ea * inv;
        fc = ec * inv;
    };
    for (int k = tid; k < R * 64; k += THREADS) {
        const int rw = k >> 6, ch = k & 63, r = row0 + rw;
        if (r >= n_rows) continue;
        float M, L, fa, fc;
        row_total(rw, M, L, fa, fc);
        const long long t = q_start + r / heads, h = r % heads;
        const float* a = ob + rw * OB_STRIDE + ch * 8;
        const float* c = a + R * OB_STRIDE;
        const float4 a0 = *(const float4*)a, a1 = *(const float4*)(a + 4);
        const float4 c0 = *(const float4*)c, c1 = *(const float4*)(c + 4);
        *(uint4*)((u16*)O_part + t * stride_ot + h * stride_oh + split * stride_os + ch * 8) =
            make_uint4(pack2<false>(a0.x * fa + c0.x * fc, a0.y * fa + c0.y * fc),
                       pack2<false>(a0.z * fa + c0.z * fc, a0.w * fa + c0.w * fc),
                       pack2<false>(a1.x * fa + c1.x * fc, a1.y * fa + c1.y * fc),
                       pack2<false>(a1.z * fa + c1.z * fc, a1.w * fa + c1.w * fc));
    }
    if (tid < R && row0 + tid < n_rows) {
        const int r = row0 + tid;
        float M, L, fa, fc;
        row_total(tid, M, L, fa, fc);
        L_part[(q_start + r / heads) * stride_lt + (r % heads) * stride_lh + split] = L > 0.f ? M + log2f(L) : NEG_INF;
    }
}

#define PREFIX_ARGS(IdxT)                                                                                        \
    const u16 *__restrict__ Q, const void *__restrict__ KV, const int *__restrict__ q_indptr,                    \
        const int *__restrict__ kv_indptr, const IdxT *__restrict__ kv_indices, float *__restrict__ O_part,      \
        float *__restrict__ L_part, float qk_scale, float v_scale, float rescale_slack, long long stride_qt,     \
        long long stride_qh, long long stride_kt, long long stride_ot, long long stride_oh, long long stride_os, \
        long long stride_lt, long long stride_lh, int heads, int num_splits, int min_split
#define PREFIX_CALL(IdxT, KV8, Q8)                                                                                    \
    prefix_body<IdxT, KV8, false, false, false, Q8>(Q, KV, q_indptr, kv_indptr, kv_indices, O_part, L_part, qk_scale, \
                                                    v_scale, rescale_slack, stride_qt, stride_qh, stride_kt,          \
                                                    stride_ot, stride_oh, stride_os, stride_lt, stride_lh, heads,     \
                                                    num_splits, min_split, nullptr, nullptr, nullptr, 0);             \
    TL(5);                                                                                                            \
    TL(9)

extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_bf16_i32(PREFIX_ARGS(int)) {
    PREFIX_CALL(int, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_bf16_i64(PREFIX_ARGS(long long)) {
    PREFIX_CALL(long long, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_fp8_i32(PREFIX_ARGS(int)) {
    PREFIX_CALL(int, true, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_fp8_i64(PREFIX_ARGS(long long)) {
    PREFIX_CALL(long long, true, false);
}
// The fp8-mma path: fp8 KV scored with e4m3 m16n8k32 against the queries quantized to e4m3 (Q8 above).
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_fp8q_i32(PREFIX_ARGS(int)) {
    PREFIX_CALL(int, true, true);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_prefix_mma_fp8q_i64(PREFIX_ARGS(long long)) {
    PREFIX_CALL(long long, true, true);
}

// Every program of the grid waits here for every other; the grid must be co-resident (a cooperative
// launch). One word counts arrivals: program 0 adds 2^31 - (n - 1) and the others 1, so the n arrivals
// add 2^31 and flip its top bit, which each program waits to see move from what its own add returned;
// the word serves every later launch unchanged. Thread 0 arrives with release and reads with acquire
// (at GPU scope) after the block's barrier, which orders the whole program's writes before the others'
// reads: one round trip to L2 and no full fence.
__device__ __forceinline__ void grid_barrier(unsigned int* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int n = gridDim.x * gridDim.y * gridDim.z;
        const bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
        const unsigned int add = first ? 0x80000000u - (n - 1) : 1u;
        unsigned int old, now;
        asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(bar), "r"(add) : "memory");
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(bar) : "memory");
        } while (((old ^ now) & 0x80000000u) == 0);
    }
    __syncthreads();
}

#define MERGE_ROUND 20  // slots a half-warp loads in one round: the 17 of 8 drafts x 8 or 16 heads, with room

// Where a program's share of the merge lies (MergeShare): a program takes a row's 512 value dims (or a half or
// a quarter of them, where there are fewer rows than programs), its first row u = its index. Worked out before the
// grid barrier, while the program waits there, so that the merge's loads go out as soon as it passes
// (MERGE_EARLY 1; 0: after the barrier, as before; a -D flag may set it, benchmarks compare both).
#ifndef MERGE_EARLY
#define MERGE_EARLY 1
#endif
struct MergeShare {
    int dsplit, dims, dg, sgroups, sg, half, hl, streams, stream;
    int part;           // of the first row's dims
    long long t, h;     // the first row's token and head
    const float* lrow;  // the first row's log-sum-exps
    long long ooff;     // the first row's partial results, this lane's 8 dims
};

// Keeps a value computed where it stands (the compiler may not move its work past this point).
template <typename T>
__device__ __forceinline__ void pin(T& v) {
    if constexpr (sizeof(T) == 8)
        asm volatile("" : "+l"(v));
    else
        asm volatile("" : "+r"(v));
}

__device__ __forceinline__ MergeShare merge_share(const float* __restrict__ L_part, int heads, int total_rows,
                                                  long long stride_ot, long long stride_oh, long long stride_lt,
                                                  long long stride_lh) {
    MergeShare m;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_ctas = gridDim.x * gridDim.y * gridDim.z;
    const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    m.dsplit = 1;
    while (m.dsplit < 4 && total_rows * m.dsplit * 2 <= n_ctas) m.dsplit *= 2;
    const int dgroups = 4 / m.dsplit;  // warps across the dims (the others across the slots)
    m.sgroups = 8 / dgroups;
    m.dims = 128 * dgroups;  // value dims of one program's share
    m.dg = warp % dgroups;
    m.sg = warp / dgroups;
    m.half = lane >> 4;
    m.hl = lane & 15;
    m.streams = 2 * m.sgroups;  // a half-warp takes every streams-th slot
    m.stream = 2 * m.sg + m.half;
    const int r = cta / m.dsplit;
    m.part = cta % m.dsplit;
    m.t = r / heads;
    m.h = r % heads;
    pin(m.t);
    pin(m.h);
    const long long t = m.t, h = m.h;
    m.lrow = L_part + t * stride_lt + h * stride_lh;
    m.ooff = t * stride_ot + h * stride_oh + m.part * m.dims + m.dg * 128 + m.hl * 8;
    long long lrow = (long long)m.lrow;
    pin(lrow);
    pin(m.ooff);
    m.lrow = (const float*)lrow;
    return m;
}

// The merge of every slot of every query row after the barrier, each program its share (above): each warp 128
// dims, each of its half-warps every (2 sgroups)-th slot, eight bf16 partial values a lane (16-byte loads from L2,
// ld.global.cg, MERGE_ROUND slots a round), weighed at the half-warp's own max; the halves then meet
// through a shuffle, and the warps' sums in shared memory, at the row's max.
__device__ __forceinline__ void merge_slots(const MergeShare& ms, const u16* __restrict__ O_part,
                                            const float* __restrict__ L_part, u16* __restrict__ O, int n_slots,
                                            int heads, int total_rows, long long stride_ot, long long stride_oh,
                                            long long stride_os, long long stride_lt, long long stride_lh,
                                            long long stride_out_t, long long stride_out_h, float* __restrict__ lse_out,
                                            long long stride_lse_t, long long stride_lse_h) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x;
    const int n_ctas = gridDim.x * gridDim.y * gridDim.z;
    const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int dsplit = ms.dsplit, dims = ms.dims, dg = ms.dg, sgroups = ms.sgroups, sg = ms.sg, half = ms.half;
    const int streams = ms.streams, stream = ms.stream, hl = ms.hl, lane = tid & 31;
    float* red = (float*)smem;  // [sgroups][dims] sums, then [sgroups] weights and [sgroups] maxes
    for (int u = cta; u < total_rows * dsplit; u += n_ctas) {
        const int r = u / dsplit, part = u == cta ? ms.part : u % dsplit;
        const long long t = u == cta ? ms.t : r / heads, h = u == cta ? ms.h : r % heads;
        const int d0 = part * dims;
        const float* lrow = u == cta ? ms.lrow : L_part + t * stride_lt + h * stride_lh;
        const long long ooff = u == cta ? ms.ooff : t * stride_ot + h * stride_oh + d0 + dg * 128 + hl * 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        float den = 0.f, mw = NEG_INF;
        for (int s0 = stream; s0 < n_slots; s0 += MERGE_ROUND * streams) {
            uint4 p[MERGE_ROUND];
            float l[MERGE_ROUND];
            // Slot s0 + j streams: the addresses by steps (one add a slot, not a multiply).
            const float* lp = lrow + s0;
            const u16* pp = O_part + ooff + s0 * stride_os;
            const long long pstep = streams * stride_os;
#pragma unroll
            for (int j = 0; j < MERGE_ROUND; ++j) {
                const bool ok = s0 + j * streams < n_slots;
                l[j] = ok ? __ldcg(lp) : NEG_INF;
                p[j] = ok ? __ldcg((const uint4*)pp) : make_uint4(0u, 0u, 0u, 0u);
                lp += streams;
                pp += pstep;
            }
            // The half-warp's max over its slots so far (its lanes loaded the same log-sum-exps).
            float mr = mw;
#pragma unroll
            for (int j = 0; j < MERGE_ROUND; ++j) mr = fmaxf(mr, l[j]);
            if (mr > mw) {  // a later round with a larger max: what was summed moves to the new one
                const float a = mw == NEG_INF ? 0.f : exp2f(mw - mr);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] *= a;
                den *= a;
                mw = mr;
            }
#pragma unroll
            for (int j = 0; j < MERGE_ROUND; ++j) {
                // A slot with no tokens (-inf) was never written: its weight is 0 and its values are dropped.
                const bool live = l[j] > NEG_INF;
                const float w = live ? exp2f(l[j] - mw) : 0.f;
                den += w;
                const u32 v[4] = {p[j].x, p[j].y, p[j].z, p[j].w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[2 * e] = fmaf(w, live ? __uint_as_float(v[e] << 16) : 0.f, acc[2 * e]);
                    acc[2 * e + 1] = fmaf(w, live ? __uint_as_float(v[e] & 0xffff0000u) : 0.f, acc[2 * e + 1]);
                }
            }
        }
        // The two half-warps at the larger of their maxes (one with no live slot weighs 0).
        {
            const float mo = __shfl_xor_sync(0xffffffffu, mw, 16);
            const float m = fmaxf(mw, mo);
            const float f = mw == NEG_INF ? 0.f : exp2f(mw - m), fo = mo == NEG_INF ? 0.f : exp2f(mo - m);
            den = f * den + fo * __shfl_xor_sync(0xffffffffu, den, 16);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = f * acc[e] + fo * __shfl_xor_sync(0xffffffffu, acc[e], 16);
            mw = m;
        }
        TL(7);
        __syncthreads();  // the previous row's sums are read
        if (half == 0) {
            float* at = red + sg * dims + dg * 128 + hl * 8;
            *(float4*)at = make_float4(acc[0], acc[1], acc[2], acc[3]);
            *(float4*)(at + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
        if (dg == 0 && lane == 0) {
            red[sgroups * dims + sg] = den;
            red[sgroups * dims + 8 + sg] = mw;
        }
        __syncthreads();
        if (tid * 2 < dims) {
            float m = NEG_INF;
            for (int g = 0; g < sgroups; ++g) m = fmaxf(m, red[sgroups * dims + 8 + g]);
            float x = 0.f, y = 0.f, total = 0.f;
            for (int g = 0; g < sgroups; ++g) {
                const float mg = red[sgroups * dims + 8 + g];
                const float f = mg == NEG_INF ? 0.f : exp2f(mg - m);  // a warp with no live slot weighs 0
                x += f * red[g * dims + tid * 2];
                y += f * red[g * dims + tid * 2 + 1];
                total += f * red[sgroups * dims + g];
            }
            const float inv = total > 0.f ? 1.f / total : 0.f;
            *(u32*)(O + t * stride_out_t + h * stride_out_h + d0 + tid * 2) = pack2<false>(x * inv, y * inv);
            // The row's log-sum-exp (natural log, as SGLang's decode keeps it), where the caller asks for it.
            if (lse_out != nullptr && part == 0 && tid == 0)
                lse_out[t * stride_lse_t + h * stride_lse_h] =
                    total > 0.f ? (m + log2f(total)) * 0.6931471805599453f : NEG_INF;
        }
    }
}

// The whole verify call in one cooperative launch: grid (row blocks, splits + 1, requests); programs
// 0 .. num_splits - 1 of a row block take the prefix splits, program num_splits the draft tail (bf16 K_ext
// and V_ext), each writing its partial result in bf16 (half the bytes to write and to merge); then, after the grid
// barrier, every program merges a share of the rows into O (bf16). Saves the merge kernel's launch and its reads from
// memory.
#define FUSED_ARGS(IdxT)                                                                                       \
    PREFIX_ARGS(IdxT), const u16 *__restrict__ K_ext, long long stride_et, const u8 *__restrict__ mask,        \
        const long long *__restrict__ mask_indptr, const u16 *__restrict__ V_ext, long long stride_vt,         \
        float tail_scale, u16 *__restrict__ O, long long stride_out_t, long long stride_out_h, int total_rows, \
        unsigned int *bar, int has_tail, float *__restrict__ lse_out, long long stride_lse_t, long long stride_lse_h
// has_tail 0 (decode): no draft tail, num_splits programs a row block. lse_out: where the merge writes each
// row's log-sum-exp (natural log), or null.
#define FUSED_CALL(IdxT, KV8, R16, Q8)                                                                                 \
    if (has_tail && blockIdx.y == num_splits)                                                                          \
        prefix_body<IdxT, false, true, true, R16>(Q, K_ext, q_indptr, kv_indptr, kv_indices, O_part, L_part,           \
                                                  tail_scale, 1.f, rescale_slack, stride_qt, stride_qh, stride_et,     \
                                                  stride_ot, stride_oh, stride_os, stride_lt, stride_lh, heads,        \
                                                  num_splits, min_split, mask, mask_indptr, V_ext, stride_vt);         \
    else {                                                                                                             \
        TL(0);                                                                                                         \
        TL(1);                                                                                                         \
        const RowPtrs rp_ = row_ptrs(q_indptr, kv_indptr, blockIdx.z);                                                 \
        if (takes_decode8<KV8, R16, Q8>(rp_, heads, has_tail))                                                         \
            transposed_body<IdxT, 1, KV8>(Q, (const u8*)KV, kv_indices, O_part, L_part, qk_scale, v_scale,             \
                                          rescale_slack, stride_qt, stride_qh, stride_kt, stride_ot, stride_oh,        \
                                          stride_os, stride_lt, stride_lh, heads, num_splits, min_split, rp_);         \
        else if (takes_decode16<KV8, R16, Q8>(rp_, has_tail, num_splits, min_split))                                   \
            transposed_body<IdxT, 2, KV8>(Q, (const u8*)KV, kv_indices, O_part, L_part, qk_scale, v_scale,             \
                                          rescale_slack, stride_qt, stride_qh, stride_kt, stride_ot, stride_oh,        \
                                          stride_os, stride_lt, stride_lh, heads, num_splits, min_split, rp_);         \
        else                                                                                                           \
            prefix_body<IdxT, KV8, false, true, R16, Q8>(                                                              \
                Q, KV, q_indptr, kv_indptr, kv_indices, O_part, L_part, qk_scale, v_scale, rescale_slack, stride_qt,   \
                stride_qh, stride_kt, stride_ot, stride_oh, stride_os, stride_lt, stride_lh, heads, num_splits,        \
                min_split, nullptr, nullptr, nullptr, 0, &rp_);                                                        \
    }                                                                                                                  \
    TL(5);                                                                                                             \
    MergeShare share_;                                                                                                 \
    if (MERGE_EARLY) share_ = merge_share(L_part, heads, total_rows, stride_ot, stride_oh, stride_lt, stride_lh);      \
    grid_barrier(bar);                                                                                                 \
    TL(6);                                                                                                             \
    if (!MERGE_EARLY) share_ = merge_share(L_part, heads, total_rows, stride_ot, stride_oh, stride_lt, stride_lh);     \
    merge_slots(share_, (const u16*)O_part, L_part, O, num_splits + has_tail, heads, total_rows, stride_ot, stride_oh, \
                stride_os, stride_lt, stride_lh, stride_out_t, stride_out_h, lse_out, stride_lse_t, stride_lse_h);     \
    TL(8);                                                                                                             \
    TL(9)

extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_bf16_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, false, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_bf16_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, false, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_fp8_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, true, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_fp8_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, true, false, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_bf16_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, false, true, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_bf16_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, false, true, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_fp8_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, true, true, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_fp8_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, true, true, false);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_fp8q_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, true, false, true);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused_mma_fp8q_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, true, false, true);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_fp8q_i32(FUSED_ARGS(int)) {
    FUSED_CALL(int, true, true, true);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) sm120_mla_fused16_mma_fp8q_i64(FUSED_ARGS(long long)) {
    FUSED_CALL(long long, true, true, true);
}
