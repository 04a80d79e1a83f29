"""What an SGLang tree does on each GPU family: capability helpers and the Triton launches it makes.

Run by ``tests/series/test_series_kernels.py`` in a fresh interpreter per release (SGLang's kernel modules read
the device capability when they are imported)::

    python tests/support/series_probe.py --tree patched=DIR --tree unpatched=DIR [--compile-unpatched CASE ...]

and prints one JSON document. For every tree and every device preset of
:mod:`sm120kit.hardware.fake_device` it loads the tree's own modules (:mod:`sglang_light`, one fresh load
per preset) under the faked device and records:

* ``capabilities``: what ``is_blackwell()``, ``is_sm120_supported()``, ``is_sm120()`` ... return (or
  ``"absent"`` / ``"raises <Error>"``);
* ``launches``: for each case (extend, prefill, fused-MoE, double-sparsity and Inkling launchers on
  meta tensors), the keyword arguments of every Triton launch (block sizes, warps, stages). On 12.0 the
  patched tree's launches are real Triton compiles for sm_120 and carry ``shared`` (``metadata.shared``);
  on the other presets, and for the unpatched tree unless a case is named with ``--compile-unpatched``,
  each launch is only recorded.

The GPU is the only thing stood in for: it is faked (this machine has none), launches are compiled or
recorded instead of run, and SGLang's activation-quantization CUDA ops (no CPU build) return empty
tensors of the right shapes. SGLang's launchers, config selection and Triton's compiler are the real ones.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import traceback
from pathlib import Path

from sglang_light import LightTree  # beside this file (run as a script)

PRESET_KEYS = ("12.0", "12.1", "10.0", "9.0", "8.9", "hip-12")
LAUNCH_PRESETS = ("12.0", "12.1", "10.0", "9.0")
HELPERS = (
    "is_blackwell",
    "is_blackwell_supported",
    "is_sm120_supported",
    "is_sm120",
    "is_sm121",
    "is_sm100_supported",
    "is_sm90_supported",
)
RECORDED = ("BLOCK", "GROUP", "num_warps", "num_stages", "Lq", "Lk", "Lv")

# name -> (launcher kind, parameters)
ATTENTION_CASES = {
    "extend-hd128-gqa4": ("extend", dict(qk_head_dim=128, v_head_dim=128, num_heads=32, num_kv_heads=8)),
    "extend-hd256-gqa8": ("extend", dict(qk_head_dim=256, v_head_dim=256, num_heads=16, num_kv_heads=2)),
    "extend-qk192-v128": ("extend", dict(qk_head_dim=192, v_head_dim=128, num_heads=16, num_kv_heads=16)),
    "extend-mla576": ("extend", dict(qk_head_dim=576, v_head_dim=512, num_heads=16, num_kv_heads=1)),
    "prefill-bf16-hd256": ("prefill", dict(qk_head_dim=256, num_heads=16, num_kv_heads=16)),
    "prefill-fp32-hd128": ("prefill", dict(qk_head_dim=128, num_heads=16, num_kv_heads=16, dtype="float32")),
    "prefill-fp32-hd256": ("prefill", dict(qk_head_dim=256, num_heads=16, num_kv_heads=16, dtype="float32")),
}
# name -> (experts, intermediate per GPU, top k, hidden, tokens, quantization)
MOE_CASES = {
    # No config file anywhere: SGLang's FP8 per-tensor default (128x256x128, 4 stages before 0.5.14).
    "moe-fp8-default-m4096": (64, 1536, 6, 2048, 4096, "fp8"),
    # Shapes the sm120-moe-configs patch ships files for (found under the RTX PRO 6000 device name).
    "moe-bf16-qwen3-30b-m1": (128, 768, 8, 2048, 1, "bf16"),
    "moe-bf16-qwen3-30b-m4096": (128, 768, 8, 2048, 4096, "bf16"),
    "moe-fp8-mixtral-m256": (8, 14336, 2, 4096, 256, "fp8"),
    "moe-fp8block-deepseek-v3-tp8-m512": (256, 256, 8, 7168, 512, "fp8_block"),
}
DS_CASES = {
    "ds-extend-hd256": (256, 256, 16),
    "ds-extend-mla576": (576, 512, 1),
}
INKLING_CASES = {"inkling-small-m-bf16": "bfloat16", "inkling-small-m-fp32": "float32"}
# Not loaded for the launches: the server-argument module imports transformers and most of the server
# (seconds per load); the MoE config module reads only enable_deterministic_inference from it, which
# sm120kit.audit.kernel_probe._ServingDefaults answers with SGLang's default.
BLOCKED = ("sglang.srt.server_args",)
DS_MODULE = "sglang.srt.layers.attention.triton_ops.double_sparsity_attention"
INKLING_MODULES = ("sglang.kernels.ops.moe.inkling_moe", "sglang.srt.layers.moe.moe_runner.triton_utils.inkling_moe")


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


@contextlib.contextmanager
def recorded_launches(compile_kernels: bool, recorder=None):
    """Record every ``kernel[grid](...)``: its keyword arguments, plus ``shared`` when it is compiled."""
    from triton.runtime.jit import JITFunction

    launches: list[dict] = []
    previous = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        entry = {"kernel": getattr(self, "__name__", None) or self.fn.__name__}
        entry.update({k: _plain(v) for k, v in kwargs.items() if k.startswith(RECORDED)})
        launches.append(entry)
        if not compile_kernels:
            return None  # nothing can run here: the launch is only recorded
        before = len(recorder.kernels)
        kernel = previous(self, *args, grid=grid, warmup=warmup, **kwargs)
        if len(recorder.kernels) > before:
            record = recorder.kernels[-1]
            entry.update(shared=record.shared, compiled_stages=record.num_stages, compiled_warps=record.num_warps)
        return kernel

    JITFunction.run = run
    try:
        yield launches
    finally:
        JITFunction.run = previous


def capabilities(root: Path) -> dict:
    from sm120kit.hardware.fake_device import PRESETS, faked_cuda

    out = {}
    for key in PRESET_KEYS:
        answers = {}
        with faked_cuda(PRESETS[key]), LightTree(root) as tree:
            utils = tree.load("sglang.srt.utils")
            for name in HELPERS:
                fn = getattr(utils, name, None)
                if fn is None:
                    answers[name] = "absent"
                    continue
                try:
                    answers[name] = bool(fn())
                except Exception as exc:  # noqa: BLE001 - the answer is what the helper does
                    answers[name] = f"raises {type(exc).__name__}"
        out[key] = answers
    return out


# -- launches ------------------------------------------------------------------------------------------------


def _call(fn, available: dict):
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in available.items() if k in params})


def _moe(probe, case) -> dict:
    import torch
    import triton.language as tl

    from sm120kit.audit.kernel_probe import _ServingDefaults

    E, N, topk, H, M, quant = case
    kernels, config_module = probe.module("moe")
    for reader in ("get_global_server_args", "get_exec"):
        if reader not in vars(config_module):  # its import was not loaded (BLOCKED): serve the defaults
            setattr(config_module, reader, _ServingDefaults())
    fp8 = quant in ("fp8", "fp8_block")
    block_shape = [128, 128] if quant == "fp8_block" else None
    meta = dict(device="meta")

    def fake_tensor_quant(A, A_scale=None, *args, **kwargs):
        # Stands in for sgl_kernel's per-tensor FP8 activation quantization (a CUDA op with no CPU build).
        scale = A_scale if A_scale is not None else torch.empty(1, dtype=torch.float32, **meta)
        return torch.empty_like(A, dtype=torch.float8_e4m3fn), scale

    kernels.scaled_fp8_quant = fake_tensor_quant
    wdtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    w1 = torch.empty(E, 2 * N, H, dtype=wdtype, **meta)
    w2 = torch.empty(E, H, N, dtype=wdtype, **meta)
    chooser = config_module.try_get_optimal_moe_config
    kwargs = {"block_shape": block_shape}
    if "return_down_config" in inspect.signature(chooser).parameters:
        config, _ = chooser(w1.shape, w2.shape, topk, "fp8_w8a8" if fp8 else None, M, return_down_config=True, **kwargs)
    else:
        config = chooser(w1.shape, w2.shape, topk, "fp8_w8a8" if fp8 else None, M, **kwargs)
    config = {k: v for k, v in dict(config).items() if k != "USE_TMA"}
    padded = M * topk + E * (config["BLOCK_SIZE_M"] - 1)
    scales = None
    if quant == "fp8":
        scales = torch.empty(E, dtype=torch.float32, **meta)
    elif quant == "fp8_block":
        scales = torch.empty(E, -(-2 * N // 128), -(-H // 128), dtype=torch.float32, **meta)
    _call(
        kernels.invoke_fused_moe_kernel,
        dict(
            A=torch.empty(M, H, dtype=torch.bfloat16, **meta),
            B=w1,
            bias=None,
            C=torch.empty(M, topk, 2 * N, dtype=torch.bfloat16, **meta),
            A_scale=None,
            B_scale=scales,
            B_zp=None,
            topk_weights=torch.empty(M, topk, dtype=torch.float32, **meta),
            topk_ids=torch.empty(M, topk, dtype=torch.int32, **meta),
            sorted_token_ids=torch.empty(padded, dtype=torch.int32, **meta),
            expert_ids=torch.empty(-(-padded // config["BLOCK_SIZE_M"]), dtype=torch.int32, **meta),
            num_tokens_post_padded=torch.empty(1, dtype=torch.int32, **meta),
            mul_routed_weight=False,
            top_k=topk,
            config=config,
            compute_type=tl.bfloat16,
            use_fp8_w8a8=fp8,
            use_int8_w8a8=False,
            use_int8_w8a16=False,
            use_int4_w4a16=False,
            per_channel_quant=False,
            block_shape=block_shape,
        ),
    )
    return config


def _double_sparsity(tree, case) -> None:  # noqa: D401
    import torch

    dq, dv, kv_heads = case
    module = tree.load(DS_MODULE)
    meta = dict(device="meta", dtype=torch.bfloat16)
    batch, tokens = 2, 64
    i32 = lambda *shape: torch.empty(*shape, dtype=torch.int32, device="meta")  # noqa: E731
    module.extend_attention_fwd(
        torch.empty(batch * tokens, 16, dq, **meta),
        torch.empty(batch * tokens, kv_heads, dq, **meta),
        torch.empty(batch * tokens, kv_heads, dv, **meta),
        torch.empty(batch * tokens, 16, dv, **meta),
        torch.empty(1024, kv_heads, dq, **meta),
        torch.empty(1024, kv_heads, dv, **meta),
        i32(batch, 512),
        i32(batch),
        i32(batch),
        i32(batch),
        i32(batch),
        tokens,
    )


def _inkling(tree, dtype_name) -> None:
    import torch

    for name in INKLING_MODULES:
        if tree._source_of(name)[0] is not None:
            module = tree.load(name)
            break
    dtype = getattr(torch, dtype_name)
    E, N, K, M = 8, 2048, 1024, 256
    i32 = lambda *shape: torch.empty(*shape, dtype=torch.int32, device="meta")  # noqa: E731
    module.grouped_gemm_triton(
        torch.empty(M, K, dtype=dtype, device="meta"),
        torch.empty(E, N, K, dtype=dtype, device="meta"),
        E,
        i32(E),
        i32(E + 1),
        i32(E + 1),
        i32(64),
        block_size_m=module.SMALL_M_BLOCK_SIZE_M,
    )


def cases_for(root: Path) -> dict:
    """The cases this tree has launchers for."""
    cases = dict(ATTENTION_CASES)
    cases.update(MOE_CASES)
    if (root / "sglang/srt/layers/attention/triton_ops/double_sparsity_attention.py").is_file():
        cases.update(DS_CASES)
    if any((root / (m.replace(".", "/") + ".py")).is_file() for m in INKLING_MODULES):
        cases.update(INKLING_CASES)
    return cases


def launches(root: Path, preset: str, compile_kernels: bool, only: set[str] | None) -> dict:
    """Run every case (or those in ``only``) with the tree loaded once under ``preset``."""
    from sm120kit.audit.kernel_probe import Probe
    from sm120kit.hardware.fake_device import PRESETS, faked_cuda, faked_device

    device = PRESETS[preset]
    results = {}
    fake = faked_device(device) if compile_kernels else contextlib.nullcontext(None)
    with (
        faked_cuda(device),
        fake as recorder,
        LightTree(root, blocked=BLOCKED) as tree,
        recorded_launches(compile_kernels, recorder) as seen,
    ):
        probe = Probe(root, {})
        for name, case in cases_for(root).items():
            if only is not None and name not in only:
                continue
            first = len(seen)
            result: dict = {}
            try:
                if name in ATTENTION_CASES:
                    kind, params = case
                    probe.run(
                        kind,
                        dict(
                            {"dtype": "bfloat16", "kv_cache_dtype": "auto", "v_head_dim": params["qk_head_dim"]},
                            **params,
                        ),
                    )
                elif name in MOE_CASES:
                    result["config"] = _moe(probe, case)
                elif name in DS_CASES:
                    _double_sparsity(tree, case)
                else:
                    _inkling(tree, case)
            except Exception as exc:  # noqa: BLE001 - reported per case
                result["error"] = f"{type(exc).__name__}: {exc}"
                result["traceback"] = traceback.format_exc(limit=-3)
            result["launches"] = seen[first:]
            results[name] = result
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="LABEL=DIR (DIR holds sglang/)")
    parser.add_argument(
        "--compile",
        action="append",
        default=[],
        help="LABEL:CASE compiled on 12.0 (default: every case of the label 'patched')",
    )
    args = parser.parse_args(argv)
    out = {}
    for item in args.tree:
        label, folder = item.split("=", 1)
        root = Path(folder)
        extra = {c.split(":", 1)[1] for c in args.compile if c.startswith(label + ":")}
        tree_out = {"capabilities": capabilities(root), "launches": {}}
        for preset in LAUNCH_PRESETS:
            if preset == "12.0" and label == "patched":
                recorded = launches(root, preset, compile_kernels=True, only=None)
            else:
                recorded = launches(root, preset, compile_kernels=False, only=None)
                if preset == "12.0" and extra:
                    recorded.update(launches(root, preset, compile_kernels=True, only=extra))
            tree_out["launches"][preset] = recorded
        out[label] = tree_out
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
