# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""Which kernels run an MLA verify or decode call, as a pure function: :func:`choose` (a Call -> a Route).

Added to SGLang by sm120kit's ``sm120-mla-attention`` patch beside ``sm120_mla.py``, whose launcher asks it.
The paths (``Route.path``):

* ``TRITON``: the Triton prefix kernel (``_prefix_pair_kernel`` for verify where ``Route.pair``), the draft
  tail inside the merge or in its own pass (``Route.tail``), the Triton merge;
* ``CUDA64``: the CUDA kernel's 64-row prefix programs, then the same tail and merge;
* ``CUDA64_ONE_LAUNCH`` and ``CUDA16_ONE_LAUNCH``: the prefix splits, the draft tail and the merge in one
  cooperative launch of the CUDA kernel, 64 or 16 query rows a program.

A call states its shape, dtypes, the GPU's SM count, what the CUDA kernels offer it (:class:`Cuda`, from
the launcher: whether they take the call at all and how many programs the GPU holds at once) and the
``SGLANG_SM120_MLA_FP8_MMA`` setting; ``Route.fp8_mma`` says whether fp8 KV runs the CUDA kernels' fp8-mma
entry points (e4m3 scores) rather than the exact ones. The thresholds
are :data:`TABLE`; each names the heading of docs/benchmarks.md (in sm120kit) that holds its measurements.
Benchmarks and tests choose with another table (``TABLE._replace(...)``, :func:`force`), for one call or, with
:func:`using`, for every call in a block. Nothing here reads a device or a tensor.
"""

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

TRITON = "triton"
CUDA64 = "cuda64"
CUDA64_ONE_LAUNCH = "cuda64 one launch"
CUDA16_ONE_LAUNCH = "cuda16 one launch"
PATHS = (TRITON, CUDA64, CUDA64_ONE_LAUNCH, CUDA16_ONE_LAUNCH)

MAX_SPLITS = 256  # KV splits a request may have (the merge's slots)
NEVER = float("inf")  # a threshold no call reaches


class TileConfig(NamedTuple):
    block_t: int  # query tokens per program
    block_h: int  # heads per program (all of one KV head's group, or a power-of-two slice of it)
    block_n: int  # KV tokens per step
    num_warps: int
    num_stages: int


class Table(NamedTuple):
    """The route's thresholds; each comment names its heading of docs/benchmarks.md."""

    mma_min_rows: float = 64  # 64-row CUDA programs from this many query rows a request: "Route: 64-row CUDA programs"
    mma_waves: int = 1  # waves of 64-row prefix programs, one resident an SM: "Route: 64-row CUDA programs"
    one_launch_max_programs: float = 4  # 64-row programs a split, at most, for the one launch: "Route: one launch"
    rows16_max_programs: float = 4  # 16-row programs a split, at most, for their one launch: "Route: 16-row programs"
    rows16_min_programs_bf16: float = 2  # bf16 decode: 16-row programs a split, at least: "Route: 16-row programs"
    rows16_transposed_rows_bf16: float = 8  # bf16 decode: or one program of <= these rows: "Route: 16-row programs"
    rows16_min_programs_bf16_verify: float = 1  # bf16 verify: the same: "Route: 16-row programs"
    rows16_max_programs_fp8_verify: float = 32  # fp8 verify: the same, at most: "Route: several requests"
    one_launch_min_rows_bf16_verify: float = 32  # bf16 verify left: 64-row launch from: "Route: several requests"
    one_launch_max_programs_bf16_verify: float = 16  # ... up to these a split: "Route: several requests"
    fuse_tail_max_rows: float = 128  # draft tail inside the merge up to these rows: "Route: draft tail in the merge"
    min_chunk: int = 256  # fewest prefix tokens a split walks: "Route: fewest tokens a split"
    min_chunk_one: int = 64  # the same where a split has one program: "Route: fewest tokens a split"
    waves_decode: int = 8  # Triton decode: waves of programs the splits fill: "Route: split count"
    waves_verify: int = 2  # Triton verify: the same: "Route: split count"
    merge: tuple[int, int, int] = (64, 128, 4)  # merge program: value dims, slots a step, warps: "Route: merge program"
    splits: int | None = None  # a fixed split count (benchmarks); None: from the SM count
    tiles: TileConfig | None = None  # fixed Triton tiles (benchmarks, compile tests); None: pick_tiles
    fp8_mma: bool = False  # fp8 KV on the fp8-mma path where SGLANG_SM120_MLA_FP8_MMA is unset: "Route: fp8-mma path"


TABLE = Table()


class Cuda(NamedTuple):
    """What the CUDA kernels offer a call they take (their figures, from sm120_mla_mma, and the GPU's)."""

    rows: int  # query rows a program of the 64-row entry points
    rows16: int  # query rows a program of the 16-row entry points
    max_slots: int  # slots (splits and the draft tail) a row block of a one launch may have
    capacity: int  # 64-row one-launch programs the GPU holds at once
    capacity16: int  # 16-row one-launch programs the GPU holds at once
    one_launch: bool  # the output, log-sum-exp and draft tail are what the one launch takes


class Call(NamedTuple):
    """What the route needs to know of a call."""

    decode: bool  # MLA decode (one query token a request, no query pointers); else verify
    batch: int  # requests
    tokens: int  # query tokens of the longest request
    heads: int  # query heads
    kv_heads: int
    lk: int  # query and key dims
    lv: int  # value dims
    kv_dtype: str  # torch's name of the KV dtype: "bfloat16", "float8_e4m3fn", ...
    tail: bool  # a draft tail to score (verify)
    sm_count: int  # SMs of the GPU
    v_from_k: bool  # the values are the first lv dims of the keys' rows (MLA's latent KV)
    cuda: Cuda | None  # the CUDA kernels, where they take the call; None: Triton only
    fp8_mma: bool | None = None  # SGLANG_SM120_MLA_FP8_MMA: on, off, or None (unset: Table.fp8_mma decides)


class Route(NamedTuple):
    path: str  # one of PATHS
    splits: int  # KV splits a request (the grid's second dimension, before the draft tail's slot)
    min_chunk: int  # fewest prefix tokens a split walks
    tiles: TileConfig  # the Triton kernels' tiles (TRITON)
    pair: bool  # TRITON verify: the two-group prefix kernel (_prefix_pair_kernel)
    tail: str  # where the draft tail is scored: "none", "one launch", "merge", "own pass"
    merge: tuple[int, int, int]  # the Triton merge's value dims, slots a step and warps
    v_from_k: bool  # the Triton prefix kernel reads the values from the keys' rows
    fp8_mma: bool = False  # CUDA paths, fp8 KV: scores with e4m3 mma.sync on queries quantized to e4m3


def head_dim_split(lk: int) -> tuple[int, int] | None:
    """(BLOCK_D, BLOCK_DPE) for a query/key head dim: a power of two plus an optional rope part."""
    if lk & (lk - 1) == 0 and 16 <= lk <= 512:
        return lk, 0
    for main in (512, 256, 128, 64):
        rest = lk - main
        if 0 < rest < main and rest & (rest - 1) == 0 and rest >= 16:
            return main, rest
    return None


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pick_tiles(lk: int, lv: int, group: int, tokens: int) -> TileConfig:
    """Tiles for the split-KV Triton kernels, chosen for SM120's 101376-byte shared memory.

    A program holds 16 rows (one query token per request: decode) or 32 rows (draft tokens x heads of
    one KV head), the fewest mma.sync takes and the most whose fp32 accumulator of 512 value dims
    stays in registers. ``block_h`` heads of the group share each KV tile (at most 16 for MLA's wide
    values); the KV tile is 32 tokens for head dims over 128, else 64. Three stages, four warps: the
    fastest set measured on the H200 in SM120 mode (docs/benchmarks.md), and every set this function
    returns compiles for sm_120 within the limit (tests/kernels/test_mla_kernels.py, sm120kit audit).
    """
    rows = 16 if tokens == 1 else 32
    block_h = min(pow2_at_least(group), 16 if lv > 256 else rows)
    block_t = max(1, rows // block_h)
    return TileConfig(block_t, block_h, 32 if lk > 128 else 64, 4, 3)


def num_splits_for(programs_per_split: int, sm_count: int, waves: int = 2) -> int:
    """KV splits per request: as many programs as fill ``waves`` waves of the GPU's SMs, and no more.

    Rounded down, so the programs end in whole waves: one program over (17 splits x 16 row blocks = 272
    programs on 264 slots of the H200) costs a second round, 1.6x at 32 drafts (docs/benchmarks.md).
    The count is an upper bound; each request then walks at least ``min_chunk`` prefix tokens per split,
    so a short request uses fewer splits (decided on the device from its own length).
    """
    splits = (sm_count * waves) // max(1, programs_per_split)
    return max(1, min(MAX_SPLITS, splits))


def split_length(kv_len: int, splits: int, min_chunk: int, block_n: int) -> int:
    """Prefix tokens a split of a request of ``kv_len`` walks (its last split may walk fewer): equal chunks of whole
    ``block_n``-token tiles, at least ``min_chunk``, as the kernels' ``split_range`` cuts them (sm120_mla.py and
    sm120_mla_mma.cu). The CUDA kernels choose their decode body by this length (``DECODE16_MAX_SPLIT``)."""
    per_split = -(-kv_len // splits)
    return max(-(-per_split // block_n) * block_n, min_chunk)


def row_blocks(tokens: int, heads: int, rows: int) -> int:
    """Programs a request of ``tokens`` query tokens x ``heads`` takes with ``rows`` query rows a program."""
    return -(-(tokens * heads) // rows)


def _one_launch_splits(call: Call, rows: int, capacity: int, table: Table) -> int | None:
    """Prefix splits of a one launch with ``rows`` query rows a program: as many as leave the draft tail its
    slot and fit the GPU at once; None where the one launch cannot take the call."""
    cuda, has_tail = call.cuda, int(call.tail)
    if not cuda.one_launch:
        return None
    per_split = row_blocks(call.tokens, call.heads, rows) * call.batch
    splits = table.splits or min(MAX_SPLITS, cuda.max_slots - has_tail, capacity // per_split - has_tail)
    if splits < 1 or per_split * (splits + has_tail) > capacity or splits + has_tail > cuda.max_slots:
        return None
    return splits


def choose(call: Call, table: Table | None = None) -> Route:
    """The route of ``call`` under ``table`` (:data:`TABLE` when None, or what :func:`using` put in its place)."""
    table = TABLE if table is None else table
    group = call.heads // call.kv_heads
    tiles = table.tiles or pick_tiles(call.lk, call.lv, group, call.tokens)
    merge = (min(pow2_at_least(call.lv), table.merge[0]),) + tuple(table.merge[1:])
    rows = call.tokens * call.heads  # query rows a request
    cuda = call.cuda if call.v_from_k else None
    one_tail = "one launch" if call.tail else "none"
    # The fp8-mma path: fp8 KV on the CUDA kernels, where the setting (or, unset, the table) asks for it.
    fp8_mma = call.kv_dtype == "float8_e4m3fn" and (table.fp8_mma if call.fp8_mma is None else call.fp8_mma)

    def route(path, splits, min_chunk, pair=False, tail=one_tail):
        return Route(path, splits, min_chunk, tiles, pair, tail, merge, call.v_from_k, fp8_mma and path != TRITON)

    # 64-row programs from mma_min_rows rows a request; below, the 16-row ones (one launch only) where a
    # split has few enough programs, and for bf16 KV enough of them.
    use_mma = cuda is not None and rows >= table.mma_min_rows
    if cuda is not None and not use_mma:
        programs16 = row_blocks(call.tokens, call.heads, cuda.rows16) * call.batch
        fewest = table.rows16_min_programs_bf16 if call.decode else table.rows16_min_programs_bf16_verify
        # bf16 decode of 8 rows a request or fewer runs the 16-row launch's transposed body even with one program
        # a split.
        transposed = call.decode and rows <= table.rows16_transposed_rows_bf16
        # fp8 verify of several requests keeps the 16-row launch up to more programs a split than the rest.
        fp8_verify = not call.decode and call.kv_dtype == "float8_e4m3fn"
        most = max(table.rows16_max_programs, table.rows16_max_programs_fp8_verify if fp8_verify else 0)
        if programs16 <= most and (call.kv_dtype != "bfloat16" or programs16 >= fewest or transposed):
            splits = _one_launch_splits(call, cuda.rows16, cuda.capacity16, table)
            if splits is not None:
                return route(CUDA16_ONE_LAUNCH, splits, table.min_chunk_one if programs16 == 1 else table.min_chunk)
        # bf16 verify of several requests whose 16-row programs are too many a split: the 64-row programs in one
        # launch (each request's rows in one program, half of them padding at 32 rows) where a request has enough
        # rows and a split few enough programs.
        programs64 = row_blocks(call.tokens, call.heads, cuda.rows) * call.batch
        if (
            not call.decode
            and call.kv_dtype == "bfloat16"
            and programs16 > table.rows16_max_programs
            and rows >= table.one_launch_min_rows_bf16_verify
            and programs64 <= table.one_launch_max_programs_bf16_verify
        ):
            splits = _one_launch_splits(call, cuda.rows, cuda.capacity, table)
            if splits is not None:
                return route(CUDA64_ONE_LAUNCH, splits, table.min_chunk)
    triton_programs = -(-group // tiles.block_h) * -(-call.tokens // tiles.block_t) * call.batch * call.kv_heads
    min_chunk = table.min_chunk_one if not use_mma and triton_programs == 1 else table.min_chunk
    if use_mma:
        programs = row_blocks(call.tokens, call.heads, cuda.rows) * call.batch
        if programs <= table.one_launch_max_programs:
            splits = _one_launch_splits(call, cuda.rows, cuda.capacity, table)
            if splits is not None:
                return route(CUDA64_ONE_LAUNCH, splits, min_chunk)
        splits = table.splits or num_splits_for(programs, call.sm_count, table.mma_waves)
    else:
        waves = table.waves_decode if call.decode else table.waves_verify
        splits = table.splits or num_splits_for(triton_programs, call.sm_count, waves)
    tail = "none" if not call.tail else ("merge" if rows <= table.fuse_tail_max_rows else "own pass")
    if use_mma:
        return route(CUDA64, splits, min_chunk, tail=tail)
    rope = head_dim_split(call.lk)[1] > 0
    pair = not call.decode and call.v_from_k and rope and tiles.block_t * tiles.block_h == 32
    return route(TRITON, splits, min_chunk, pair=pair, tail=tail)


def force(path: str, table: Table | None = None) -> Table:
    """``table`` (default :data:`TABLE`) changed so that :func:`choose` takes ``path`` wherever the kernels of
    that path take the call (TRITON: always); benchmarks time each path on the same inputs with it. A one
    launch that cannot take the call leaves CUDA16_ONE_LAUNCH to TRITON and CUDA64_ONE_LAUNCH to CUDA64."""
    table = TABLE if table is None else table
    if path == TRITON:
        return table._replace(
            mma_min_rows=NEVER,
            rows16_max_programs=0,
            rows16_max_programs_fp8_verify=0,
            one_launch_min_rows_bf16_verify=NEVER,
        )
    if path == CUDA64:
        return table._replace(mma_min_rows=0, one_launch_max_programs=0)
    if path == CUDA64_ONE_LAUNCH:
        return table._replace(mma_min_rows=0, one_launch_max_programs=NEVER)
    if path == CUDA16_ONE_LAUNCH:
        return table._replace(
            mma_min_rows=NEVER,
            rows16_max_programs=NEVER,
            rows16_min_programs_bf16=0,
            rows16_min_programs_bf16_verify=0,
            one_launch_min_rows_bf16_verify=NEVER,
        )
    raise ValueError(f"no route path {path!r}; the paths are {', '.join(PATHS)}")


@contextlib.contextmanager
def using(table: Table) -> Iterator[Table]:
    """Within the block, :func:`choose` takes ``table`` in place of :data:`TABLE` for every call that names
    none (benchmarks and tests, through the launchers' own entry points)."""
    global TABLE
    saved, TABLE = TABLE, table
    try:
        yield table
    finally:
        TABLE = saved
