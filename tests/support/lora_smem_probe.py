"""Compile SGLang's LoRA Triton kernels for a faked 12.0 GPU at given settings and print their shared memory.

Usage: python lora_smem_probe.py RELEASE_ROOT CASE [CASE ...]  -> one JSON object on stdout:
``{"triton": version, "cases": {CASE: {"kernels": [{"name", "shared", "constexprs", "num_warps",
"num_stages"}], "error": str | null}}}``.

A CASE is ``KIND:VALUE[:EXTRA]``:

* ``csgmv:CHUNK`` - the csgmv backend's shrink (``chunked_sgmv_lora_shrink_forward``) with chunk size CHUNK
  (``--max-lora-chunk-size``; SGLang's BLOCK_M), Llama-3-8B qkv (K 4096, 3 slices), rank 64, bf16, default tiles.
* ``csgmv-tuned:CHUNK:BLOCK_K`` - the same, with a tuned tile file that SGLang itself reads
  (``$SGLANG_LORA_CONFIG_DIR/csgmv_configs/triton_<version>/lora_shrink,K=4096,R=64,S=3,device=<GPU>.json``,
  entry CHUNK: BLOCK_N 16, BLOCK_K BLOCK_K); releases with ``lora_tuning_config`` only.
* ``exp-shrink:RANK:SLICES`` - the experimental shrink (``trtllm_lora_temp`` ``sgemm_lora_a_fwd``) for a
  LoRA of RANK over SLICES stacked projections (qkv 3, gate_up 2, o_proj 1), K 4096.
* ``exp-expand:RANK`` - the experimental expand (``trtllm_lora_temp`` ``sgemm_lora_b_fwd``), N 4096.
* ``exp-moe-shrink:RANK:TOKENS`` - the experimental virtual-experts MoE shrink
  (``trtllm_lora_temp`` ``_invoke_moe_lora_shrink_splitk`` with ``_get_shrink_stage_config``): Qwen3-30B-A3B
  (hidden 2048, top 8), 4 adapters x 128 experts.

SGLang's own launchers run with ``meta`` tensors under :func:`sm120kit.hardware.fake_device.faked_device`
(it stands in for the RTX PRO 6000 this machine lacks): every launch is a real Triton compile for sm_120,
nothing runs. Run in its own interpreter so the imported release does not reach other tests. SGLang caches the
compiled csgmv shrink by (K, slices, BLOCK_M) (``cached_triton_kernel``), not by its tiles: a ``csgmv-tuned`` case
needs an interpreter in which no ``csgmv`` case of the same chunk ran.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

TOKENS, SEQS, ADAPTERS, K, N_OUT = 1024, 4, 4, 4096, 4096


def _first(*names: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (exc.name and name.startswith(exc.name)):
                raise
    raise ModuleNotFoundError(f"none of {names}")


def _meta(torch, *shape, dtype=None):
    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device="meta")


def _batch(torch, chunk: int, sorted_: bool):
    i32 = lambda *s: _meta(torch, *s, dtype=torch.int32)  # noqa: E731
    segments = TOKENS // chunk if sorted_ else SEQS
    return SimpleNamespace(
        use_cuda_graph=False,
        bs=SEQS,
        num_segments=segments,
        seg_indptr=i32(segments + 1),
        weight_indices=i32(segments),
        lora_ranks=i32(ADAPTERS),
        scalings=_meta(torch, ADAPTERS, dtype=torch.float32),
        max_len=chunk,
        seg_lens=i32(SEQS),
        permutation=_meta(torch, TOKENS, dtype=torch.int64) if sorted_ else None,
        expected_tokens=TOKENS,
        has_active_lora=True,
        is_prefill=True,
    )


def run_case(torch, device_name: str, case: str) -> None:
    kind, *args = case.split(":")
    values = [int(a) for a in args]
    if kind in ("csgmv", "csgmv-tuned"):
        chunk = values[0]
        mod = _first(
            "sglang.kernels.ops.lora.dense.chunked_sgmv_shrink",
            "sglang.kernels.ops.gemm.chunked_sgmv_shrink",
            "sglang.srt.lora.triton_ops.chunked_sgmv_shrink",
        )
        if kind == "csgmv-tuned":
            tuning = _first(mod.__name__.rsplit(".", 1)[0] + ".lora_tuning_config")
            import triton

            folder = (
                Path(tempfile.mkdtemp(dir=_WORK[0]))
                / "csgmv_configs"
                / f"triton_{triton.__version__.replace('.', '_')}"
            )
            folder.mkdir(parents=True)
            name = f"lora_shrink,K={K},R=64,S=3,device={device_name.replace(' ', '_')}.json"
            (folder / name).write_text(json.dumps({str(chunk): {"BLOCK_N": 16, "BLOCK_K": values[1]}}))
            os.environ["SGLANG_LORA_CONFIG_DIR"] = str(folder.parent.parent)
            tuning.get_lora_configs.cache_clear()
        mod.chunked_sgmv_lora_shrink_forward(
            _meta(torch, TOKENS, K), _meta(torch, ADAPTERS, 3 * 64, K), _batch(torch, chunk, sorted_=True), 3
        )
    elif kind == "exp-shrink":
        rank, slices = values
        mod = _first(
            "sglang.kernels.ops.lora.dense.trtllm_lora_temp.sgemm_lora_a",
            "sglang.kernels.ops.gemm.trtllm_lora_temp.sgemm_lora_a",
            "sglang.srt.lora.trtllm_lora_temp.triton_ops.sgemm_lora_a",
        )
        mod.sgemm_lora_a_fwd(
            _meta(torch, TOKENS, K),
            _meta(torch, ADAPTERS, slices * rank, K),
            _batch(torch, 256, sorted_=False),
            stack_num=slices,
        )
    elif kind == "exp-expand":
        (rank,) = values
        mod = _first(
            "sglang.kernels.ops.lora.dense.trtllm_lora_temp.sgemm_lora_b",
            "sglang.kernels.ops.gemm.trtllm_lora_temp.sgemm_lora_b",
            "sglang.srt.lora.trtllm_lora_temp.triton_ops.sgemm_lora_b",
        )
        mod.sgemm_lora_b_fwd(
            _meta(torch, TOKENS, rank), _meta(torch, ADAPTERS, N_OUT, rank), _batch(torch, 256, sorted_=False)
        )
    elif kind == "exp-moe-shrink":
        rank, tokens = values
        mod = _first(
            "sglang.kernels.ops.lora.moe.trtllm_lora_temp.virtual_experts",
            "sglang.kernels.ops.moe.trtllm_lora_temp.virtual_experts",
            "sglang.srt.lora.trtllm_lora_temp.triton_ops.virtual_experts",
        )
        experts, topk, hidden = ADAPTERS * 128, 8, 2048
        weight = _meta(torch, experts, rank, hidden)
        config = mod._get_shrink_stage_config(weight.shape, tokens)
        block_m = config["BLOCK_SIZE_M"]
        padded = tokens * topk + min(tokens * topk, experts) * (block_m - 1)
        i32 = lambda *s: _meta(torch, *s, dtype=torch.int32)  # noqa: E731
        mod._invoke_moe_lora_shrink_splitk(
            _meta(torch, tokens, hidden),
            weight,
            _meta(torch, tokens * topk, rank),
            i32(tokens, topk),
            i32(padded),
            i32(-(-padded // block_m)),
            i32(1),
            topk,
            config,
        )
    else:
        raise SystemExit(f"unknown case kind {kind!r}")


_WORK: list[str] = []  # the run's temporary folder (main), under which each tuned case writes its config folder


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sm120kit-lora-probe-") as work:
        _WORK.append(work)
        return _main()


def _main() -> int:
    root, cases = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, root)
    os.environ.setdefault("SGLANG_IS_IN_CI", "false")
    import torch
    import triton

    from sm120kit.audit.kernel_probe import _ServingDefaults
    from sm120kit.hardware import fake_device

    device = fake_device.preset("12.0")
    out: dict = {"triton": triton.__version__, "device": device.name, "cases": {}}
    with fake_device.faked_device(device) as recorder, fake_device.stand_in_packages():
        try:
            importlib.import_module("sglang.srt.server_args").get_global_server_args = _ServingDefaults()
        except ImportError:
            pass
        for case in cases:
            recorder.take()
            error = None
            try:
                run_case(torch, device.name, case)
            except Exception as exc:  # noqa: BLE001 - reported per case
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
            kernels = [
                {
                    "name": k.name,
                    "shared": k.shared,
                    "num_warps": k.num_warps,
                    "num_stages": k.num_stages,
                    "constexprs": {n: v for n, v in k.constexprs.items() if n.startswith("BLOCK")},
                }
                for k in recorder.take()
            ]
            out["cases"][case] = {"kernels": kernels, "error": error}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
