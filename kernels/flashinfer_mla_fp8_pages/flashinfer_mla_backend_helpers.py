# sm120kit sm120-flashinfer-mla-fp8-pages: with an fp8 KV cache this backend converted the layer's whole KV
# pool to the query dtype on every decode step, a cost that grows with the pool and not with the tokens
# read. On compute capability 12.x a plain decode step (no speculative or decode-context-parallel
# metadata) converts only the rows its planned wrapper reads: the first sum(seq_lens) entries of the
# wrapper's kv_indices (one token per entry, requests in order), into one pool-shaped buffer shared by
# every backend of the process. The kernel reads exactly the values it read before: the output is
# bit-identical. Every other call converts the whole pool, as before.
import triton as _sm120_triton  # noqa: E402
import triton.language as tl  # noqa: E402

_SM120_FP8_PAGES_BUFFERS = {}
_SM120_FP8_PAGES_CAPABILITY = {}


def _sm120_fp8_pages_enabled(t: torch.Tensor) -> bool:
    if t.device.type != "cuda" or torch.version.hip or torch.version.cuda is None:
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _SM120_FP8_PAGES_CAPABILITY:
        _SM120_FP8_PAGES_CAPABILITY[index] = torch.cuda.get_device_capability(index)[0] == 12
    return _SM120_FP8_PAGES_CAPABILITY[index]


@_sm120_triton.jit
def _sm120_convert_rows(src, dst, indices, seq_lens, n_req, n_indices, n_rows, row_elems,
                        BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    # Rows read: indices[:count], count = sum(seq_lens[:n_req]) read on the GPU (so a CUDA graph replays
    # it with the new lengths), at most the indices held.
    count = tl.zeros([BLOCK_R], dtype=tl.int64)
    for r0 in range(0, n_req, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        count += tl.load(seq_lens + r, mask=r < n_req, other=0).to(tl.int64)
    total = tl.minimum(tl.sum(count, axis=0), n_indices)
    step = tl.num_programs(0) * BLOCK_I
    for start in range(tl.program_id(0) * BLOCK_I, total, step):
        i = start + tl.arange(0, BLOCK_I)
        rows = tl.load(indices + i, mask=i < total, other=-1).to(tl.int64)
        ok = (rows >= 0) & (rows < n_rows)
        for d0 in range(0, row_elems, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            m = ok[:, None] & (d[None, :] < row_elems)
            x = tl.load(src + rows[:, None] * row_elems + d[None, :], mask=m)
            tl.store(dst + rows[:, None] * row_elems + d[None, :], x.to(dst.dtype.element_ty), mask=m)


def _sm120_convert_pages(pool, indices, seq_lens, n_req, out):
    """Write ``pool[r].to(out.dtype)`` into ``out[r]`` for every row ``r`` in
    ``indices[:min(len(indices), sum(seq_lens[:n_req]))]`` (rows outside the pool are skipped) and return
    ``out``. On a CUDA tensor a Triton kernel with a fixed grid does it (CUDA-graph safe: the count is
    read on the GPU); on any other device this torch code, which is the kernel's reference."""
    if pool.device.type != "cuda":
        n = min(indices.numel(), int(seq_lens[:n_req].sum()))
        rows = indices[:n].long()
        rows = rows[(rows >= 0) & (rows < pool.shape[0])]
        out[rows] = pool[rows].to(out.dtype)
        return out
    row_elems = pool[0].numel() if pool.shape[0] else 0
    block_i = 16
    grid = (max(1, min(_sm120_triton.cdiv(indices.numel(), block_i), 1024)),)
    _sm120_convert_rows[grid](
        pool, out, indices, seq_lens, n_req, indices.numel(), pool.shape[0], row_elems,
        BLOCK_I=block_i, BLOCK_D=_sm120_triton.next_power_of_2(min(max(row_elems, 1), 256)), BLOCK_R=256,
        num_warps=4,
    )
    return out


def _sm120_fp8_pages(pool: torch.Tensor, wrapper, dtype, forward_batch) -> torch.Tensor:
    """``pool.to(dtype)`` as the planned decode ``wrapper`` reads it (see above)."""
    if pool.dtype == dtype or not _sm120_fp8_pages_enabled(pool) or not pool.is_contiguous():
        return pool.to(dtype)
    if (
        getattr(forward_batch, "spec_info", None) is not None
        or getattr(forward_batch, "attn_dcp_metadata", None) is not None
        or not forward_batch.forward_mode.is_decode()
    ):
        return pool.to(dtype)
    if "get_parallel" in globals() and getattr(get_parallel(), "dcp_enabled", False):
        return pool.to(dtype)
    indices = getattr(wrapper, "_kv_indices_buf", None)
    seq_lens = forward_batch.seq_lens
    n_req = forward_batch.batch_size
    if not isinstance(indices, torch.Tensor) or indices.device != pool.device or seq_lens.device != pool.device:
        return pool.to(dtype)
    key = (pool.device, tuple(pool.shape), dtype)
    out = _SM120_FP8_PAGES_BUFFERS.get(key)
    if out is None:
        _SM120_FP8_PAGES_BUFFERS.clear()  # one buffer: the pool's shape does not change in a process
        out = _SM120_FP8_PAGES_BUFFERS[key] = torch.empty(pool.shape, dtype=dtype, device=pool.device)
    return _sm120_convert_pages(pool, indices, seq_lens, n_req, out)


