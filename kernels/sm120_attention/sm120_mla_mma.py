# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""The launcher of the MLA CUDA mma.sync kernels in ``sm120_mla_mma.cu`` beside this file, compiled at first use.

Added to SGLang by sm120kit's ``sm120-mla-attention`` patch, beside ``sm120_mla.py``, which calls it for MLA
verify and decode (576 query/key dims, the first 512 of them the values, one latent KV head; bf16 queries,
bf16 or fp8 e4m3 KV) and runs its Triton kernels wherever these decline or cannot be built. Three kinds of
entry point (``ENTRY_NAMES``), each for bf16 or fp8 KV and int32 or int64 KV slots:

* ``prefix`` (:func:`prefix_pass`): 64 query rows a program against one split of the prefix, the partial
  results in fp32 for the Triton merge;
* ``fused`` (:func:`fused_pass`): the prefix splits, the draft tail and the merge in one cooperative launch;
* ``fused16``: the same with 16 query rows a program, for requests with few rows (decode, one draft token).

The source reads its figures (rows, tile sizes, the shared-memory layout) from :data:`FIGURES` as ``-D``
flags and refuses to compile where its layout and these differ; the source file says how the kernels work.
Compiling, loading and launching go through ``sm120_mla_nvrtc.py``, which needs only the CUDA driver and
NVRTC. If either is missing, or the compile fails, :func:`kernel` returns None (:func:`error` says why) and
the caller keeps its Triton kernels. ``SGLANG_SM120_MLA_MMA=0`` turns this path off.

fp8 KV has two paths: the exact one (f16 mma.sync on the fp8 values, the default) and the fp8-mma one (entry
points ending ``fp8q``: e4m3 mma.sync scores on queries quantized to e4m3 per half row), which
``SGLANG_SM120_MLA_FP8_MMA=1`` asks for (:func:`fp8_mma_setting`; ``sm120_mla_route.choose`` decides).
"""

import ctypes
import importlib.util
import logging
import os
import threading
from collections.abc import Mapping
from typing import Optional

import torch


def _sibling(name: str):
    """The module ``name`` from its file beside this one (for a copy of the kernels loaded from its files)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    from . import sm120_mla_nvrtc as nvrtc
except ImportError:  # imported from its file, not as part of a package: the sibling file
    nvrtc = _sibling("sm120_mla_nvrtc")

CompileError = nvrtc.CompileError

# The kernels' figures, each written once: the launcher's, and the source's through FIGURES below.
ROWS = 64  # query rows (draft tokens x heads) a program of the prefix and fused entry points holds
ROWS16 = 16  # query rows a program of the fused16 entry points holds
BLOCK_N = 32  # KV tokens a step
HEAD_DIM = 576  # query and key dims
V_DIM = 512  # value dims: the first of a KV row
THREADS = 256  # threads a program: eight warps
SMEM_LIMIT = 101376  # shared memory a block may have on SM120 (sm120kit.hardware.arch's figure; a test compares)
SROW = HEAD_DIM * 2 + 16  # bytes a row of a 16-bit KV tile takes, padded so ldmatrix rows fall in distinct banks
SROW8 = HEAD_DIM + 16  # bytes a row of an fp8 KV tile takes as copied
TILE_BYTES = BLOCK_N * SROW  # one 16-bit KV tile
FP8_TILE_BYTES = BLOCK_N * SROW8  # one fp8 KV tile as copied
IDX_BYTES = 3 * BLOCK_N * 8  # three slots of KV indices, 8 bytes at most
XCH_BYTES = THREADS * 16 * 4  # the exchange of partial scores: 16 floats a thread
STAGES8 = 4  # fp8 stages of the 8-row programs (three tiles in flight while one is scored; five measured no faster)
XCH8_BYTES = THREADS * 16  # their exchange of partial scores: 4 floats a thread
# bf16 KV: two stages of the tile; fp8 KV: two stages of the fp8 tile and one f16 tile converted from it (the
# 16-row programs: four fp8 stages in the same bytes), or the 8-row programs' stages and exchange, the larger.
SMEM_BYTES = {
    torch.bfloat16: 2 * TILE_BYTES + IDX_BYTES + XCH_BYTES,
    torch.float8_e4m3fn: max(
        TILE_BYTES + 2 * FP8_TILE_BYTES + IDX_BYTES + XCH_BYTES, STAGES8 * FP8_TILE_BYTES + XCH8_BYTES
    ),
}
# What the source takes as -D flags: it names these and checks its layout against them (static_assert).
FIGURES: dict[str, int] = {
    "ROWS": ROWS,
    "ROWS16": ROWS16,
    "BLOCK_N": BLOCK_N,
    "HEAD_DIM": HEAD_DIM,
    "V_DIM": V_DIM,
    "THREADS": THREADS,
    "SROW": SROW,
    "SROW8": SROW8,
    "TILE_BYTES": TILE_BYTES,
    "TILE8_BYTES": FP8_TILE_BYTES,
    "IDX_BYTES": IDX_BYTES,
    "STAGES8": STAGES8,
    "XCH8_BYTES": XCH8_BYTES,
    "XCH_BYTES": XCH_BYTES,
    "SMEM_BYTES_BF16": SMEM_BYTES[torch.bfloat16],
    "SMEM_BYTES_FP8": SMEM_BYTES[torch.float8_e4m3fn],
    "SMEM_LIMIT": SMEM_LIMIT,
}
# The running max of a row moves (and the output is rescaled) only when a step's scores pass it by more
# than this, base 2: exact up to rounding, and it skips most of the 128 multiplies a thread does per step
# to rescale its output (-inf: rescale at every step, as a textbook online softmax does). A kernel argument.
RESCALE_SLACK = 8.0
FUSED_MAX_SLOTS = 256  # slots (prefix splits and the draft tail) a row block of the fused kernels may have

# Keys (KV dtype, slot dtype, fp8-mma): the exact path computes fp8 KV with f16 mma.sync; the fp8-mma path
# (fp8 KV only) scores with e4m3 m16n8k32 against the queries quantized to e4m3 per row (fp8_mma_setting).
_NAMED = [
    ((kv, idx, q8), f"{kv_name}_{idx_name}")
    for kv, kv_name, q8 in (
        (torch.bfloat16, "bf16", False),
        (torch.float8_e4m3fn, "fp8", False),
        (torch.float8_e4m3fn, "fp8q", True),
    )
    for idx, idx_name in ((torch.int32, "i32"), (torch.int64, "i64"))
]
KERNEL_NAMES = {key: f"sm120_mla_prefix_mma_{name}" for key, name in _NAMED}
# The prefix splits, the draft tail and the merge in one cooperative launch (verify with a draft tail).
FUSED_NAMES = {key: f"sm120_mla_fused_mma_{name}" for key, name in _NAMED}
# The same with 16 query rows a program, the four warp pairs on different tokens of a tile: verify with few
# rows a request (one draft token x 16 heads) and MLA decode, where 64-row programs would be mostly padding.
FUSED16_NAMES = {key: f"sm120_mla_fused16_mma_{name}" for key, name in _NAMED}
# Every entry point of the source, by the launch it serves.
ENTRY_NAMES = {"prefix": KERNEL_NAMES, "fused": FUSED_NAMES, "fused16": FUSED16_NAMES}
FP8_MMA_ENV = "SGLANG_SM120_MLA_FP8_MMA"
DEFINES_ENV = "SGLANG_SM120_MLA_DEFINES"
# The build flags a card may set for itself (DEFINES_ENV, read when the kernels are first built): each chooses
# between code paths whose speed was measured on an H200 standing in for SM120, not on an SM120 card
# (docs/benchmarks.md), and none changes what the kernels compute beyond the order of their sums. Name -> the
# smallest and largest value the source takes (the split limits are in prefix tokens).
TUNABLES: dict[str, tuple[int, int]] = {
    "DECODE8": (0, 1),
    "DECODE8_BF16": (0, 1),
    "DECODE8_STAGES": (3, 4),
    "DECODE16": (0, 1),
    "DECODE16_MAX_SPLIT": (0, 1 << 24),
    "DECODE16_BF16": (0, 1),
    "DECODE16_BF16_MAX_SPLIT": (0, 1 << 24),
    "FP8_UNPACK16": (0, 3),
    "STAGES16_FP8": (2, 4),
    "VALUES_FROM_KEYS": (0, 1),
}

SOURCE_NAME = "sm120_mla_mma.cu"
SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), SOURCE_NAME)
OPTIONS = ("--std=c++17", "--use_fast_math")

_LOCK = threading.Lock()
_KERNELS: dict[int, Optional["_Kernel"]] = {}
_ERRORS: dict[int, str] = {}


def _env_enabled() -> bool:
    return os.environ.get("SGLANG_SM120_MLA_MMA", "1").strip().lower() not in ("0", "false", "off", "no")


def fp8_mma_setting() -> bool | None:
    """``SGLANG_SM120_MLA_FP8_MMA``: True (1, on, ...) takes the fp8-mma path for fp8 KV, False (0, off, ...)
    the exact one; None where unset (or another word): the route's default (``sm120_mla_route.TABLE.fp8_mma``)."""
    value = os.environ.get(FP8_MMA_ENV, "").strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    return None


def parse_tunables(text: str) -> tuple[str, ...]:
    """``NAME=VALUE`` flags of :data:`TUNABLES`, comma-separated (spaces and empty items ignored, a later value of
    a name in place of an earlier one), as -D flags; ValueError, naming the item and what is allowed, for any item
    that is not a known name with an integer value in its range."""
    taken = []
    for flag in merge_defines(text.replace(" ", "")):
        name, sep, value = flag.partition("=")
        if name not in TUNABLES:
            known = ", ".join(sorted(TUNABLES))
            raise ValueError(f"{flag!r}: {name!r} is not a flag the kernels may take from here (known: {known})")
        low, high = TUNABLES[name]
        try:
            number = int(value, 10) if sep else None
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            raise ValueError(f"{flag!r}: {name} takes a whole number from {low} to {high} ({name}={low} .. {high})")
        taken.append(f"{name}={number}")
    return tuple(taken)


def defines_setting() -> tuple[tuple[str, ...], str | None]:
    """``SGLANG_SM120_MLA_DEFINES`` (``DECODE16_MAX_SPLIT=2048,FP8_UNPACK16=3``; see :data:`TUNABLES`): the -D
    flags the kernels are built with at first use, and None; where the value cannot be taken, no flags and what is
    wrong with it (the kernels are then built as shipped and :func:`kernel` logs it)."""
    try:
        return parse_tunables(os.environ.get(DEFINES_ENV, "")), None
    except ValueError as exc:
        return (), f"{DEFINES_ENV} is ignored, the kernels are built as shipped: {exc}"


def read_source() -> str:
    """The kernels' source, from its file beside this module."""
    try:
        with open(SOURCE_PATH, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CompileError(f"the CUDA source {SOURCE_PATH} could not be read: {exc}") from exc


def merge_defines(*lists: str) -> tuple[str, ...]:
    """-D flags ("NAME" or "NAME=VALUE") of several comma-separated lists as one tuple, a later list's value of a
    name in place of an earlier one's (the scripts' ``--defines``; bench_mla.py's ``--timeline-also`` on top)."""
    merged = {}
    for flags in lists:
        for flag in (f.strip() for f in flags.split(",")):
            if flag:
                merged[flag.split("=", 1)[0]] = flag
    return tuple(merged.values())


def compile_cubin(
    arch: str, source: str | None = None, defines: tuple[str, ...] = (), figures: Mapping[str, int] | None = None
) -> bytes:
    """Compile the kernels to a cubin for ``arch`` (``sm_120a``, ``sm_90a``) with NVRTC; no GPU needed.
    ``source``: another source text (tests); ``defines``: extra macros (``SM120_TIMELINE`` for the benchmark's
    timeline); ``figures``: other figures than :data:`FIGURES` (tests: the source refuses a layout that differs)."""
    figures = FIGURES if figures is None else figures
    options = list(OPTIONS) + [f"-D{name}={value}" for name, value in figures.items()] + [f"-D{d}" for d in defines]
    return nvrtc.compile_cubin(read_source() if source is None else source, SOURCE_NAME, arch, options)


class _Kernel:
    """The compiled kernels loaded into the current CUDA context of one device."""

    def __init__(self, cubin: bytes):
        self.module = nvrtc.Module(cubin)
        # (entry, kv dtype, index dtype, fp8-mma) -> function; entry as in ENTRY_NAMES
        self.functions = {}
        # Programs of a fused kernel that can be resident on one SM (a cooperative launch's limit).
        self.capacity = {}
        for entry, names in ENTRY_NAMES.items():
            for (kv_dtype, idx_dtype, q8), name in names.items():
                function = self.module.function(name, SMEM_BYTES[kv_dtype])
                self.functions[(entry, kv_dtype, idx_dtype, q8)] = function
                if entry != "prefix":
                    self.capacity[(entry, kv_dtype, idx_dtype, q8)] = self.module.resident(
                        function, THREADS, SMEM_BYTES[kv_dtype]
                    )

    def launch(
        self, kv_dtype, index_dtype, grid: tuple[int, int, int], stream: int, args, entry="prefix", fp8_mma=False
    ) -> None:
        """Launch ``entry`` for these dtypes; the fused entry points cooperatively (their grid barrier)."""
        self.module.launch(
            self.functions[(entry, kv_dtype, index_dtype, fp8_mma and kv_dtype == torch.float8_e4m3fn)],
            grid,
            THREADS,
            SMEM_BYTES[kv_dtype],
            stream,
            args,
            cooperative=entry != "prefix",
        )


def _arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _index(device: torch.device) -> int:
    """The CUDA device index of ``device`` (the current device where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _context(index: int) -> None:
    """Make the device's primary CUDA context current (torch creates it at the first allocation on the device; a
    script that builds the kernels before any tensor lives there has none, and cuModuleLoadData fails with 201)."""
    torch.cuda.init()
    torch.empty(1, device=torch.device("cuda", index))


def kernel(device: torch.device) -> _Kernel | None:
    """The kernel for ``device``, compiled and loaded on first use (with the flags of ``SGLANG_SM120_MLA_DEFINES``,
    :func:`defines_setting`); None if it cannot be."""
    index = _index(device)
    with _LOCK:
        if index not in _KERNELS:
            defines, problem = defines_setting()
            if problem is not None:
                logging.getLogger(__name__).warning("%s", problem)
            try:
                with torch.cuda.device(index):
                    _context(index)
                    _KERNELS[index] = _Kernel(compile_cubin(_arch(index), defines=defines))
            except (CompileError, OSError, AttributeError) as exc:
                _KERNELS[index] = None
                _ERRORS[index] = str(exc)
        return _KERNELS[index]


def install(device: torch.device, defines: tuple[str, ...]) -> _Kernel:
    """Compile the kernels with more -D flags (``defines``, such as ``DECODE16=1``) and make that build the one the
    launchers use on ``device`` from now on: benchmarks and sanitizer runs of a flag's code (scripts/bench_mla.py
    and scripts/sanitize_mla.py, ``--defines``). A compile error raises :class:`CompileError`."""
    index = _index(device)
    with torch.cuda.device(index):
        _context(index)
        built = _Kernel(compile_cubin(_arch(index), defines=defines))
    with _LOCK:
        _KERNELS[index] = built
    return built


def error(device: torch.device) -> str | None:
    index = _index(device)
    return _ERRORS.get(index)


def fits(q, kv, q_indptr, kv_indptr, kv_indices, kv_heads: int) -> bool:
    """Whether the tensors are what the kernel takes: MLA 576/512 with one KV head, bf16 queries, bf16 or fp8
    (e4m3) KV, int32 row pointers, int32 or int64 KV slots, query and KV rows aligned for 16-byte copies."""
    elem = kv.element_size()
    return (
        q.dtype == torch.bfloat16
        and kv.dtype in SMEM_BYTES
        and q.dim() == 3
        and kv.dim() == 3
        and q.shape[-1] == HEAD_DIM
        and kv.shape[-1] == HEAD_DIM
        and kv_heads == 1
        and q.stride(-1) == 1
        and kv.stride(-1) == 1
        and q.stride(0) % 8 == 0
        and q.stride(1) % 8 == 0
        and (kv.stride(0) * elem) % 16 == 0
        and q.data_ptr() % 16 == 0
        and kv.data_ptr() % 16 == 0
        and all(t.dtype == torch.int32 and t.is_contiguous() for t in (q_indptr, kv_indptr))
        and (kv.dtype, kv_indices.dtype, False) in KERNEL_NAMES
        and kv_indices.is_contiguous()
    )


def serves(q, kv, q_indptr, kv_indptr, kv_indices, kv_heads: int) -> bool:
    """Whether this kernel takes the call: on a CUDA tensor that :func:`fits`, unless turned off."""
    return _env_enabled() and q.is_cuda and fits(q, kv, q_indptr, kv_indptr, kv_indices, kv_heads)


def row_blocks(max_tokens: int, heads: int, rows: int = ROWS) -> int:
    """Row blocks a request of ``max_tokens`` query tokens takes with ``rows`` rows a program."""
    return -(-(max_tokens * heads) // rows)


def prefix_pass(
    q,
    kv,
    q_indptr,
    kv_indptr,
    kv_indices,
    o_part,
    l_part,
    qk_scale: float,
    v_scale: float,
    batch: int,
    max_tokens: int,
    num_splits: int,
    min_split: int,
    fp8_mma: bool = False,
) -> bool:
    """Write the prefix partial results of every split into ``o_part``/``l_part``; False if not run. ``fp8_mma``:
    fp8 KV through the fp8-mma path (e4m3 scores)."""
    k = kernel(q.device)
    if k is None:
        return False
    heads = q.shape[1]
    args = [
        ctypes.c_void_p(q.data_ptr()),
        ctypes.c_void_p(kv.data_ptr()),
        ctypes.c_void_p(q_indptr.data_ptr()),
        ctypes.c_void_p(kv_indptr.data_ptr()),
        ctypes.c_void_p(kv_indices.data_ptr()),
        ctypes.c_void_p(o_part.data_ptr()),
        ctypes.c_void_p(l_part.data_ptr()),
        ctypes.c_float(qk_scale),
        ctypes.c_float(v_scale),
        ctypes.c_float(RESCALE_SLACK),
        ctypes.c_longlong(q.stride(0)),
        ctypes.c_longlong(q.stride(1)),
        ctypes.c_longlong(kv.stride(0)),
        ctypes.c_longlong(o_part.stride(0)),
        ctypes.c_longlong(o_part.stride(1)),
        ctypes.c_longlong(o_part.stride(2)),
        ctypes.c_longlong(l_part.stride(0)),
        ctypes.c_longlong(l_part.stride(1)),
        ctypes.c_int(heads),
        ctypes.c_int(num_splits),
        ctypes.c_int(min_split),
    ]
    stream = torch.cuda.current_stream(q.device).cuda_stream
    grid = (row_blocks(max_tokens, heads), num_splits, batch)
    k.launch(kv.dtype, kv_indices.dtype, grid, stream, args, "prefix", fp8_mma)
    return True


# One word per (device, stream) for the fused kernel's grid barrier: it leaves it ready for the next
# launch, so it is zeroed once (a launch on another stream gets its own, as two may run at once).
_BARRIERS: dict[tuple[int, int], torch.Tensor] = {}


def _barrier(device: torch.device, stream: int) -> torch.Tensor:
    key = (_index(device), stream)
    with _LOCK:
        if key not in _BARRIERS:
            _BARRIERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
        return _BARRIERS[key]


def fused_capacity(q, kv, kv_indices, rows: int = ROWS) -> int:
    """Programs of the fused kernel (``rows`` query rows a program) the GPU of ``q`` holds at once (0: it
    cannot run there); for fp8 KV the fewer of the exact and the fp8-mma build, so a route fits either."""
    if not q.is_cuda:
        return 0
    k = kernel(q.device)
    if k is None:
        return 0
    entry = "fused16" if rows == ROWS16 else "fused"
    per_sm = min(
        k.capacity.get((entry, kv.dtype, kv_indices.dtype, q8), 0)
        for q8 in ((False, True) if kv.dtype == torch.float8_e4m3fn else (False,))
    )
    return per_sm * torch.cuda.get_device_properties(q.device).multi_processor_count


def _tail_fits(k_ext, v_ext, mask, mask_indptr) -> bool:
    return (
        all(
            t.dtype == torch.bfloat16
            and t.dim() == 3
            and t.shape[1] == 1
            and t.shape[-1] == dim
            and t.stride(-1) == 1
            and (t.stride(0) * 2) % 16 == 0
            and t.data_ptr() % 16 == 0
            for t, dim in ((k_ext, HEAD_DIM), (v_ext, V_DIM))
        )
        and mask.element_size() == 1
        and mask.is_contiguous()
        and mask_indptr.dtype == torch.int64
        and mask_indptr.is_contiguous()
    )


def output_fits(o, lse=None) -> bool:
    """Whether the fused kernel can write ``o`` (bf16, 512 dims, aligned for pair stores) and ``lse`` (fp32
    per token and head, or None)."""
    return (
        o.dtype == torch.bfloat16
        and o.dim() == 3
        and o.shape[-1] == V_DIM
        and o.stride(-1) == 1
        and o.stride(0) % 2 == 0
        and o.stride(1) % 2 == 0
        and o.data_ptr() % 4 == 0
        and (lse is None or (lse.dtype == torch.float32 and lse.dim() == 2))
    )


def fused_fits(q, o, k_ext, v_ext, mask, mask_indptr) -> bool:
    """Whether the draft tail and output are what the fused kernel takes: bf16 tail keys (576 dims) and
    values (512) of one KV head with rows aligned for 16-byte copies, a one-byte mask with int64 row
    pointers, a bf16 output of 512 dims aligned for pair stores."""
    return _tail_fits(k_ext, v_ext, mask, mask_indptr) and output_fits(o)


def fused_pass(
    q,
    kv,
    q_indptr,
    kv_indptr,
    kv_indices,
    tail,
    o_part,
    l_part,
    o,
    qk_scale: float,
    v_scale: float,
    tail_scale: float,
    batch: int,
    max_tokens: int,
    num_splits: int,
    min_split: int,
    rows: int = ROWS,
    lse=None,
    fp8_mma: bool = False,
) -> bool:
    """A whole verify or decode call in one cooperative launch of (row blocks, num_splits (+ 1 for a draft
    tail), batch) programs of ``rows`` query rows (ROWS or ROWS16): the prefix splits, the draft tail
    (``tail`` = (k_ext, v_ext, mask, mask_indptr), or None for decode) and the merge into ``o`` (and each
    row's log-sum-exp into ``lse`` where given). ``o_part`` (bf16) and ``l_part`` (fp32) hold a slot per
    program of a row block. ``fp8_mma``: fp8 KV through the fp8-mma path (e4m3 scores). False if not run (no
    kernel, or more programs than the GPU holds at once)."""
    k = kernel(q.device)
    if k is None:
        return False
    heads = q.shape[1]
    has_tail = 1 if tail is not None else 0
    grid = (row_blocks(max_tokens, heads, rows), num_splits + has_tail, batch)
    if grid[0] * grid[1] * grid[2] > fused_capacity(q, kv, kv_indices, rows) or num_splits + has_tail > FUSED_MAX_SLOTS:
        return False
    stream = torch.cuda.current_stream(q.device).cuda_stream
    bar = _barrier(q.device, stream)
    if tail is not None:
        k_ext, v_ext, mask, mask_indptr = tail
        tail_args = [
            ctypes.c_void_p(k_ext.data_ptr()),
            ctypes.c_longlong(k_ext.stride(0)),
            ctypes.c_void_p(mask.data_ptr()),
            ctypes.c_void_p(mask_indptr.data_ptr()),
            ctypes.c_void_p(v_ext.data_ptr()),
            ctypes.c_longlong(v_ext.stride(0)),
        ]
    else:
        tail_args = [
            ctypes.c_void_p(0),
            ctypes.c_longlong(0),
            ctypes.c_void_p(0),
            ctypes.c_void_p(0),
            ctypes.c_void_p(0),
            ctypes.c_longlong(0),
        ]
    args = (
        [
            ctypes.c_void_p(q.data_ptr()),
            ctypes.c_void_p(kv.data_ptr()),
            ctypes.c_void_p(q_indptr.data_ptr()),
            ctypes.c_void_p(kv_indptr.data_ptr()),
            ctypes.c_void_p(kv_indices.data_ptr()),
            ctypes.c_void_p(o_part.data_ptr()),
            ctypes.c_void_p(l_part.data_ptr()),
            ctypes.c_float(qk_scale),
            ctypes.c_float(v_scale),
            ctypes.c_float(RESCALE_SLACK),
            ctypes.c_longlong(q.stride(0)),
            ctypes.c_longlong(q.stride(1)),
            ctypes.c_longlong(kv.stride(0)),
            ctypes.c_longlong(o_part.stride(0)),
            ctypes.c_longlong(o_part.stride(1)),
            ctypes.c_longlong(o_part.stride(2)),
            ctypes.c_longlong(l_part.stride(0)),
            ctypes.c_longlong(l_part.stride(1)),
            ctypes.c_int(heads),
            ctypes.c_int(num_splits),
            ctypes.c_int(min_split),
        ]
        + tail_args
        + [
            ctypes.c_float(tail_scale),
            ctypes.c_void_p(o.data_ptr()),
            ctypes.c_longlong(o.stride(0)),
            ctypes.c_longlong(o.stride(1)),
            ctypes.c_int(q.shape[0] * heads),
            ctypes.c_void_p(bar.data_ptr()),
            ctypes.c_int(has_tail),
            ctypes.c_void_p(lse.data_ptr() if lse is not None else 0),
            ctypes.c_longlong(lse.stride(0) if lse is not None else 0),
            ctypes.c_longlong(lse.stride(1) if lse is not None else 0),
        ]
    )
    k.launch(kv.dtype, kv_indices.dtype, grid, stream, args, "fused16" if rows == ROWS16 else "fused", fp8_mma)
    return True
