#!/usr/bin/env python3
"""Generate SGLang fused-MoE Triton config files for SM120 cards by a fixed rule.

SGLang looks up ``E=<experts>,N=<intermediate per GPU>,device_name=<torch device name>[,dtype=...]
[,block_shape=[n, k]].json`` in its ``configs/triton_<version>/`` folder; without a file it falls back to a
default config that, before 0.5.14, needs 147456 bytes of shared memory for FP8 (over the 101376 bytes an
SM120 block may use). No files exist upstream for "NVIDIA RTX PRO 6000 Blackwell Workstation Edition" or
"NVIDIA GeForce RTX 5090", so this script writes them for a set of MoE models that fit such machines.

The configs are not measured on hardware; they follow one rule, read off the shape of the configs that
SGLang ships tuned on SM120 cards (RTX PRO 6000 Blackwell Server/Max-Q Edition, GB10):

* ``t = M * topk / E`` is the mean number of token rows each expert receives for a batch of M tokens;
  ``BLOCK_SIZE_M`` is the next power of two >= t, kept within [16, 128].
* Small row blocks (BLOCK_SIZE_M <= 32) stream weights: ``BLOCK_SIZE_N = 64`` and a long K step
  (``BLOCK_SIZE_K = 256`` for 1-byte FP8/INT8 activations, 128 for 2-byte ones); larger row blocks use
  ``BLOCK_SIZE_N = 128`` and a shorter K step (128 / 64). Block-wise FP8 keeps BLOCK_SIZE_K a divisor of
  the quantization block (128).
* ``num_warps`` is 4 for tiles of at most 64x64 elements, else 8; ``GROUP_SIZE_M`` is 1 for small row
  blocks, else 16.
* ``num_stages`` is the largest value in [2, 4] whose pipelined tiles fit SM120's shared memory:
  ``(num_stages - 1) * BLOCK_SIZE_K * (BLOCK_SIZE_M + BLOCK_SIZE_N) * element_bytes <= 101376``.
  Triton keeps ``num_stages - 1`` copies of the A and B tiles (measured: the compiled kernels'
  ``metadata.shared`` for sm_120 equals that product for all 76 configs SGLang ships tuned on SM120).

The same estimate drives the clamp in the ``sm120-moe-configs`` patch, so these configs pass through it
unchanged. No file is written for a shape SGLang cannot load: with FP8 128x128 blocks, the fused-MoE loader
(``Fp8MoEMethod.create_weights`` in ``srt/layers/quantization/fp8.py``, every release 0.5.2-0.5.23) raises
unless the intermediate size per partition (the ``N`` of the file name) is a multiple of block_n (and, at
TP > 1, of block_k), so GLM-4.5-Air at TP 2 and 4 (N = 704, 352) and Qwen3-235B-A22B at TP 8 (N = 192) get no
FP8-block file.

The files are the patch's [[files]] source, ``kernels/moe_configs/triton_3_3_1/``:

    python scripts/gen_moe_configs.py            # rewrite them there
    python scripts/gen_moe_configs.py --check    # exit 1 if they are not this script's output
    python scripts/gen_moe_configs.py --out DIR  # write DIR/triton_3_3_1/ (a copy for SGLANG_MOE_CONFIG_DIR)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SM120_SHARED_MEMORY_PER_BLOCK = 101376
DEVICES = ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA GeForce RTX 5090")
# Batch sizes (tokens) SGLang's tuning script writes configs for.
BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
TRITON_FOLDER = "triton_3_3_1"
SOURCE_DIR = Path(__file__).resolve().parents[1] / "kernels" / "moe_configs"
# The FP8 block size of the block-quantized checkpoints (weight_block_size [block_n, block_k]).
FP8_BLOCK = (128, 128)

# (model, experts, moe intermediate size, experts per token, tensor-parallel sizes, quantizations)
# Quantization: None = bf16/fp16 weights, "fp8" = FP8 per tensor, "fp8-block" = FP8 with 128x128 blocks.
MODELS = (
    ("Mixtral-8x7B", 8, 14336, 2, (1, 2), (None, "fp8")),
    ("Qwen3-30B-A3B", 128, 768, 8, (1, 2), (None, "fp8-block")),
    ("Qwen3-Next-80B-A3B", 512, 512, 10, (1, 2), (None, "fp8-block")),
    ("GLM-4.5-Air", 128, 1408, 8, (2, 4), ("fp8-block",)),
    ("Qwen3-235B-A22B", 128, 1536, 8, (4, 8), ("fp8-block",)),
    ("DeepSeek-V3", 256, 2048, 8, (8,), ("fp8-block",)),
)


def element_bytes(dtype: str | None) -> int:
    """Bytes per activation element of SGLang's config dtype string (what the A tile holds)."""
    return 1 if dtype in ("fp8_w8a8", "int8_w8a8") else 4 if dtype == "float32" else 2


def pipelined_shared_memory(config: dict, elem: int) -> int:
    """Shared memory Triton allocates for the fused-MoE kernel's pipelined A and B tiles."""
    stages = max(config.get("num_stages", 3) - 1, 1)
    return stages * config["BLOCK_SIZE_K"] * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * elem


def rule_config(m: int, experts: int, topk: int, elem: int, block_k: int | None) -> dict:
    rows = math.ceil(m * topk / experts)
    block_m = min(128, max(16, 1 << max(0, rows - 1).bit_length()))
    small = block_m <= 32
    block_n = 64 if small else 128
    block_k_step = (256 if small else 128) if elem == 1 else (128 if small else 64)
    if block_k:
        block_k_step = min(block_k_step, block_k)
    config = {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": block_n,
        "BLOCK_SIZE_K": block_k_step,
        "GROUP_SIZE_M": 1 if small else 16,
        "num_warps": 4 if block_m * block_n <= 64 * 64 else 8,
        "num_stages": 2,
    }
    for stages in (4, 3, 2):
        config["num_stages"] = stages
        if pipelined_shared_memory(config, elem) <= SM120_SHARED_MEMORY_PER_BLOCK:
            break
    assert pipelined_shared_memory(config, elem) <= SM120_SHARED_MEMORY_PER_BLOCK, config
    return config


def file_name(experts: int, n: int, device: str, dtype: str | None, block_shape: list[int] | None) -> str:
    """The name SGLang's get_config_file_name() builds (without per-channel or down-projection suffixes)."""
    name = f"E={experts},N={n},device_name={device.replace(' ', '_')}"
    if dtype:
        name += f",dtype={dtype}"
    if block_shape:
        name += f",block_shape={block_shape}"
    return name + ".json"


def loadable(n: int, tp: int, block_shape: list[int] | None) -> bool:
    """Whether SGLang's FP8 block-quant MoE loader accepts an intermediate size per partition of ``n``:
    a multiple of block_n, and at TP > 1 also of block_k (fp8.py, Fp8MoEMethod.create_weights)."""
    if not block_shape:
        return True
    block_n, block_k = block_shape
    return n % block_n == 0 and (tp == 1 or n % block_k == 0)


def rejected() -> list[tuple[str, int, str]]:
    """(model, tensor-parallel size, file name) of each FP8-block file not written because SGLang's loader
    rejects its shape (see loadable); docs/series.md lists them."""
    out = []
    for model, experts, inter, _topk, tps, quants in MODELS:
        for tp in tps:
            if "fp8-block" in quants and not loadable(inter // tp, tp, list(FP8_BLOCK)):
                out += [
                    (model, tp, file_name(experts, inter // tp, device, "fp8_w8a8", list(FP8_BLOCK)))
                    for device in DEVICES
                ]
    return out


def generate() -> dict[str, dict[str, dict]]:
    """{file name: {batch size: config}} for every device, model, tensor-parallel size and quantization
    that SGLang can load."""
    files: dict[str, dict[str, dict]] = {}
    for _model, experts, inter, topk, tps, quants in MODELS:
        for tp in tps:
            n = inter // tp
            for quant in quants:
                if not loadable(n, tp, list(FP8_BLOCK) if quant == "fp8-block" else None):
                    continue
                dtype = None if quant is None else "fp8_w8a8"
                block_shape = list(FP8_BLOCK) if quant == "fp8-block" else None
                elem = element_bytes(dtype)
                table = {
                    str(m): rule_config(m, experts, topk, elem, block_shape[1] if block_shape else None)
                    for m in BATCH_SIZES
                }
                for device in DEVICES:
                    files[file_name(experts, n, device, dtype, block_shape)] = table
    return files


def render(table: dict) -> str:
    return json.dumps(table, indent=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=SOURCE_DIR,
        help=f"folder to write {TRITON_FOLDER}/<file>.json into (default: the patch's source, "
        "kernels/moe_configs/; or SGLang's configs/ folder, or a copy for SGLANG_MOE_CONFIG_DIR)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare the folder with this script's output instead of writing; exit 1 on a difference",
    )
    args = parser.parse_args(argv)
    folder = args.out / TRITON_FOLDER
    files = generate()
    if args.check:
        present = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.json")} if folder.is_dir() else {}
        stale = sorted(n for n in files.keys() | present.keys() if present.get(n) != render(files.get(n, {})))
        if stale:
            print(f"out of date in {folder}: {', '.join(stale)} (run python scripts/gen_moe_configs.py)")
            return 1
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    for name, table in files.items():
        (folder / name).write_text(render(table), encoding="utf-8")
    print(f"wrote {len(files)} config files to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
