# sm120kit sm120-decode-kv-splits: the Triton decode's maximum KV-split count on compute capability 12.x.
# The per-batch split choice (get_num_kv_splits) already grows with the SM count and the context length,
# but never past max_kv_splits (--triton-attention-num-kv-splits, default 8): at batch 1 and long contexts
# a few dozen programs then walk the whole context. On 12.x the cap is sized here instead.
_SM120_DECODE_WAVES = 4  # programs per SM the cap allows at batch 1: past that, splits add merge work
_SM120_DECODE_MAX_SPLITS = 256
_SM120_DECODE_MIN_CHUNK = 256  # fewest context tokens per split at the model's context length
# attn_logits + attn_lse (+ the SWA layers' attn_logits) are fp32 [tokens, heads, max_kv_splits, ...]:
# at most this many bytes per decode token (the CUDA graph buffers hold max_num_tokens of them).
_SM120_DECODE_BYTES_PER_TOKEN = 8 << 20


def _sm120_decode_kv_splits_cap(
    base_max_kv_splits: int,
    sm_count: int,
    max_context_len: int,
    num_head: int,
    num_kv_head: int,
    v_head_dim: int,
    swa_v_head_dim: Optional[int] = None,
) -> int:
    """The largest KV-split count a decode request may use: enough programs for
    _SM120_DECODE_WAVES waves at batch 1, at least _SM120_DECODE_MIN_CHUNK tokens per split at the
    context length, at most _SM120_DECODE_MAX_SPLITS, and partial-result buffers of at most
    _SM120_DECODE_BYTES_PER_TOKEN per decode token (the context bound rounded up, the memory bound down
    to a power of two), never below the configured cap."""
    if sm_count <= 0 or max_context_len <= 0 or num_head <= 0 or v_head_dim <= 0:
        return base_max_kv_splits
    group = max(1, num_head // max(1, num_kv_head))
    # Stage-1 programs per split at batch 1: one per head (MHA), one per block of up to 16 heads of one
    # KV head (grouped decode, MLA included), as in decode_attention_fwd and get_num_kv_splits_triton.
    programs = num_head if group == 1 else -(-num_head // min(16, group))
    by_waves = -(-_SM120_DECODE_WAVES * sm_count // programs)
    by_context = 1 << max(0, (-(-max_context_len // _SM120_DECODE_MIN_CHUNK) - 1).bit_length())
    row_bytes = 4 * num_head * (v_head_dim + 1 + (swa_v_head_dim + 1 if swa_v_head_dim else 0))
    by_memory = max(1, _SM120_DECODE_BYTES_PER_TOKEN // row_bytes)
    by_memory = 1 << (by_memory.bit_length() - 1)
    cap = min(_SM120_DECODE_MAX_SPLITS, by_waves, by_context, by_memory)
    return max(base_max_kv_splits, cap)


def _sm120_decode_max_kv_splits(backend, model_runner) -> int:
    """backend.max_kv_splits, raised to _sm120_decode_kv_splits_cap on a CUDA GPU of compute capability
    12.x; unchanged on any other GPU, on ROCm, with SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS (every
    request then takes the configured count) and for MLA where another SM-count cap already applies:
    the release's own (_mla_decode_kv_splits_cap, sglang #20479) or sm120-mla-attention's decode kernel,
    which sizes its own splits (SGLANG_SM120_MLA=0 turns that kernel off, and then this cap applies)."""
    base = backend.max_kv_splits
    if torch.version.hip or torch.version.cuda is None or not torch.cuda.is_available():
        return base
    if torch.cuda.get_device_capability(model_runner.gpu_id)[0] != 12:
        return base
    if backend.static_kv_splits or backend.device_core_count <= 0:
        return base
    use_mla = getattr(model_runner, "use_mla_backend", False)
    if use_mla and (
        "_mla_decode_kv_splits_cap" in globals()
        or getattr(backend.decode_attention_fwd, "__name__", "") == "decode_attention_fwd_sm120"
    ):
        return base
    return _sm120_decode_kv_splits_cap(
        base,
        backend.device_core_count,
        backend.max_context_len,
        backend.num_head,
        # MLA decode reads one latent KV head for all heads; backend.num_kv_head is the model config's count.
        1 if use_mla else backend.num_kv_head,
        backend.v_head_dim,
        getattr(backend, "swa_v_head_dim", None),
    )


