"""Patch sm120-decode-kv-splits on real SGLang releases from PyPI.

The whole bundled series is applied to a copy of each release of the series matrix; the patched
``triton_backend.py`` then holds the split-cap functions, which are taken from that file (not from this
repository) and run under a faked device: 12.0 and 12.1 get the cap sized from the SM count and the
context length, 9.0, 10.0 and an AMD GPU that reports major 12 keep the configured one. No GPU is used.
"""

from __future__ import annotations

from types import SimpleNamespace

import gen_decode_splits_patch as gen  # scripts/ (pytest's pythonpath)
import pytest
import torch
from conftest import REPO_ROOT, SERIES_RELEASES
from series_support import patched_file_reader

from sm120kit.audit.resolve_probe import split_cap_functions
from sm120kit.hardware.fake_device import PRESETS, faked_cuda

PATCH_ID = "sm120-decode-kv-splits"
BACKEND = "sglang/srt/layers/attention/triton_backend.py"


def test_diffs_are_the_generator_output():
    assert gen.main(["--check"]) == 0


@pytest.fixture(scope="module")
def patched_backends(tmp_path_factory):
    """``patched_backends(version)`` -> the text of the patched backend file after the whole series."""
    return patched_file_reader(tmp_path_factory, "decode-splits", PATCH_ID, BACKEND)


def _helpers(text: str) -> dict:
    """The patch's constants and functions (and the release's own MLA cap, where it has one), executed from
    the patched file's own source as the backend audit runs them."""
    return split_cap_functions(text, BACKEND)


def _backend(
    heads=64,
    kv_heads=8,
    v_dim=128,
    ctx=131072,
    sms=188,
    base=8,
    static=False,
    swa_v=None,
    decode_name="decode_attention_fwd",
):
    fn = lambda *a, **k: None  # noqa: E731
    fn.__name__ = decode_name
    backend = SimpleNamespace(
        max_kv_splits=base,
        static_kv_splits=static,
        device_core_count=sms,
        max_context_len=ctx,
        num_head=heads,
        num_kv_head=kv_heads,
        v_head_dim=v_dim,
        decode_attention_fwd=fn,
    )
    if swa_v is not None:
        backend.swa_v_head_dim = swa_v
    return backend


# (heads, kv heads, v head dim, context, SMs) -> cap; 188 SMs: RTX PRO 6000, 48: GB10.
CAPS = {
    (64, 8, 128, 131072, 188): 94,  # four waves of 8 programs per split
    (32, 4, 128, 131072, 188): 188,
    (8, 1, 128, 131072, 188): 256,
    (32, 32, 128, 131072, 188): 24,  # MHA: 32 programs per split
    (64, 8, 128, 8192, 188): 32,  # 8k context: at least 256 tokens per split
    (64, 8, 128, 4096, 188): 16,
    (32, 4, 128, 131072, 48): 48,  # GB10
    (16, 1, 512, 131072, 188): 128,  # MLA shape: 8 MiB per token allows 128
    (4, 4, 128, 1024, 188): 8,  # never below the configured cap
}


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_split_arithmetic_on_the_patched_release(patched_backends, version):
    text = patched_backends(version)
    ns = _helpers(text)
    cap = ns["_sm120_decode_kv_splits_cap"]
    for (heads, kv, dv, ctx, sms), want in CAPS.items():
        got = cap(8, sms, ctx, heads, kv, dv)
        assert got == want, ((heads, kv, dv, ctx, sms), got)
        assert got <= ns["_SM120_DECODE_MAX_SPLITS"]
        # the bound the patch states: attn_logits + attn_lse, fp32, per decode token
        assert got == 8 or 4 * heads * got * (dv + 1) <= ns["_SM120_DECODE_BYTES_PER_TOKEN"]
    assert cap(32, 188, 131072, 64, 8, 128) == 94 and cap(512, 188, 131072, 64, 8, 128) == 512
    assert cap(8, 0, 131072, 64, 8, 128) == 8  # no SM count: as configured
    # a separate SWA buffer counts against the same budget
    assert cap(8, 188, 131072, 32, 4, 128, 256) == 128  # 188 without it
    # the hook runs after the release's own cap and before deterministic mode's split tile size
    hook = text.index("self.max_kv_splits = _sm120_decode_max_kv_splits(self, model_runner)")
    assert text.index("triton_attention_num_kv_splits") < hook
    if "self.split_tile_size = " in text:
        assert hook < text.index("if self.split_tile_size is not None:")


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_only_12x_changes(patched_backends, version):
    ns = _helpers(patched_backends(version))
    limit = ns["_sm120_decode_max_kv_splits"]
    runner, mla_runner = SimpleNamespace(gpu_id=0), SimpleNamespace(gpu_id=0, use_mla_backend=True)
    has_mla_cap = "_mla_decode_kv_splits_cap" in ns
    for key in ("12.0", "12.1"):
        sms = PRESETS[key].multi_processor_count
        with faked_cuda(PRESETS[key]):
            assert limit(_backend(sms=sms), runner) == (94 if sms == 188 else 24)
            assert limit(_backend(sms=sms, heads=32, kv_heads=4), runner) == (188 if sms == 188 else 48)
            assert limit(_backend(sms=sms, static=True), runner) == 8
            # MLA: left to sm120-mla-attention's kernel, or to the release's own cap (0.5.12 on)
            mla = dict(heads=16, kv_heads=1, v_dim=512, sms=sms)
            assert limit(_backend(**mla, decode_name="decode_attention_fwd_sm120"), mla_runner) == 8
            assert limit(_backend(**mla), mla_runner) == (8 if has_mla_cap else 128)
            # the backend's num_kv_head is the config's count (16 for DeepSeek-V2-Lite); MLA decode reads
            # one latent head, and the cap is sized for that
            assert limit(_backend(**{**mla, "kv_heads": 16}), mla_runner) == (8 if has_mla_cap else 128)
    for key in ("9.0", "10.0", "8.9", "hip-12"):
        with faked_cuda(PRESETS[key]):
            for b in (_backend(sms=PRESETS[key].multi_processor_count), _backend(heads=32, kv_heads=4)):
                assert limit(b, runner) == 8, key
            assert limit(_backend(heads=16, kv_heads=1, v_dim=512), mla_runner) == 8


def test_mla_kernel_wrapper_is_recognised():
    """The name the cap looks for is the one sm120-mla-attention's installed decode launcher carries
    (through torch.compiler.disable); the module is the one that patch installs."""
    import importlib.util

    source = REPO_ROOT / "kernels" / "sm120_attention" / "sm120_mla.py"
    spec = importlib.util.spec_from_file_location("sm120_mla_under_test", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def decode_attention_fwd(q, k_buffer, v_buffer, o):
        return None

    wrapped = module.decode_first(torch.compiler.disable(decode_attention_fwd))
    assert wrapped.__name__ == "decode_attention_fwd_sm120"
