#!/usr/bin/env python3
"""Long-context decode on the Triton backend: the release's KV-split choice against sm120-decode-kv-splits',
and the fp8 KV pool conversion of the FlashInfer MLA backend against a page-only conversion. One run.

    PYTHONPATH=<unpacked sglang wheel>:<its small deps> python scripts/bench_decode.py \
        [--cases all|quick] [--no-sweep] [--no-fp8] [--json FILE]

Needs a CUDA GPU and an SGLang release on the path (its pure-Python files are enough: SGLang's own decode
launcher and split scheduler, ``get_num_kv_splits_triton``, are what is timed). On a GPU that is not SM120
it runs in *SM120 mode* and says so: ``DISABLE_MMA_V3=1`` before the first Triton compile (mma.sync, as
on sm_120, instead of wgmma); the release's decode launcher has no capability-dependent tiles on CUDA, so
its 12.0 choices are the ones it makes here. ``--native`` skips SM120 mode.

Decode cases: MLA 576/512 with 16 heads, GQA 64/8 and 32/4 heads of 128; contexts 8k, 32k, 128k, 185k;
batch 1, 4, 32; bf16 KV, one token per slot, slots scattered over the pool. For each case both split
choices run on the same inputs: the release's cap (``--triton-attention-num-kv-splits`` 8; for MLA the
release's own ``_mla_decode_kv_splits_cap`` where it has one) and the patched cap
(``_sm120_decode_kv_splits_cap`` from scripts/gen_decode_splits_patch.py, the code the patch installs),
each through the release's per-batch scheduler with this GPU's SM count. Printed per case: time per layer
(one decode call, timed by CUDA graph replay), the splits each took, the ratio, and the share of the read
roofline (bytes of K and V that must be read once / time, against ``torch.sum`` over 512 MiB measured in
the same run). At batch 1 a sweep of forced split counts (8 ... 256) gives the best count found, the
patched choice's distance to it and its speedup over 8 splits. Outputs of both choices are compared.

fp8 conversion: a fp8 (e4m3) MLA pool of 10^5, 10^6 and 4*10^6 tokens; before: the whole layer pool
converted to bf16 (``get_key_buffer(layer_id).to(q.dtype)``); after: only the slots the batch reads,
into a preallocated bf16 buffer by the Triton kernel sm120-flashinfer-mla-fp8-pages installs (written
by scripts/gen_fp8_pages_patch.py; :func:`convert_pages` is its torch equivalent), checked bit-identical
to the full conversion on those slots.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import torch

SM120_MODE = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 12 and "--native" not in sys.argv
if SM120_MODE:
    os.environ["DISABLE_MMA_V3"] = "1"  # before the first Triton compile: it is part of Triton's cache key

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE_SPLITS = 8  # --triton-attention-num-kv-splits default
MODEL_CONTEXT = 262144  # the model's context length the caps are sized for (Qwen3.5 / Kimi-K2: 256k)

# name -> (q heads, kv heads, qk head dim, v head dim)
SHAPES = {
    "mla-16": (16, 1, 576, 512),
    "gqa-64/8": (64, 8, 128, 128),
    "gqa-32/4": (32, 4, 128, 128),
}
CONTEXTS = (8192, 32768, 131072, 185000)
BATCHES = (1, 4, 32)
SWEEP = (8, 16, 32, 64, 128, 256)
POOLS = (10**5, 10**6, 4 * 10**6)
FP8_BATCHES = (1, 4, 32)
FP8_TOKENS_PER_REQUEST = 2048


def cases(which: str = "all") -> list[tuple[str, int, int]]:
    """(shape, context, batch) of the decode table; ``quick``: 128k at batch 1 only."""
    if which == "quick":
        return [(s, 131072, 1) for s in SHAPES]
    return [(s, c, b) for s in SHAPES for c in CONTEXTS for b in BATCHES]


# -- the split caps ---------------------------------------------------------------------------------------


def patched_cap_function():
    """``_sm120_decode_kv_splits_cap`` as the patch installs it (the generator's source, executed)."""
    import gen_decode_splits_patch as gen  # beside this file

    namespace = {"torch": torch, "Optional": Optional}
    exec(compile(gen.HELPERS, "sm120-decode-kv-splits", "exec"), namespace)
    return namespace["_sm120_decode_kv_splits_cap"]


def _sglang_file(*candidates: str) -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    for rel in candidates:
        if (root / rel).is_file():
            return root / rel
    return None


def _functions_from(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Execute the named top-level functions and constants of ``path`` (no module import: the backend
    module pulls in the whole server)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    keep = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name in names)
        or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in n.targets))
    ]
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def release_mla_cap_function():
    """The release's ``_mla_decode_kv_splits_cap`` (sglang #20479, 0.5.12 on), or None."""
    path = _sglang_file("srt/layers/attention/triton_backend.py")
    if path is None or "def _mla_decode_kv_splits_cap" not in path.read_text(encoding="utf-8"):
        return None
    ns = _functions_from(
        path,
        ("_mla_decode_kv_splits_cap", "_MLA_DECODE_MIN_BLOCK_KV"),
        {"triton": triton, "next_power_of_2": triton.next_power_of_2},
    )
    return ns["_mla_decode_kv_splits_cap"]


def split_caps(
    shape: str, sm_count: int, model_context: int = MODEL_CONTEXT, *, patched_cap=None, release_mla_cap=None
) -> tuple[int, int]:
    """(release cap, patched cap) of max_kv_splits for ``shape`` on a GPU of ``sm_count`` SMs."""
    heads, kv_heads, _, lv = SHAPES[shape]
    patched_cap = patched_cap or patched_cap_function()
    release = BASE_SPLITS
    if kv_heads == 1 and release_mla_cap is not None:
        release = release_mla_cap(BASE_SPLITS, sm_count, model_context)
    return release, patched_cap(BASE_SPLITS, sm_count, model_context, heads, kv_heads, lv)


def kv_read_bytes(shape: str, context: int, batch: int, elt: int = 2) -> int:
    """Bytes of K and V a decode call must read at least once (MLA: V is part of K)."""
    _, kv_heads, lk, lv = SHAPES[shape]
    per_token = lk if kv_heads == 1 and lk > lv else lk + lv
    return batch * context * kv_heads * per_token * elt


def roofline_share(nbytes: int, ms: float, read_gbs: float) -> float:
    return 100.0 * nbytes / (ms * 1e-3) / 1e9 / read_gbs


# -- the page-only fp8 conversion ----------------------------------------------------------------------------


def convert_pages(pool: torch.Tensor, kv_indices: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write ``pool[kv_indices]`` converted to ``out.dtype`` into the same rows of ``out`` (a buffer shaped
    like the pool) and return ``out``: every row an attention kernel reads through ``kv_indices`` holds
    exactly what ``pool.to(out.dtype)`` would hold there; rows nobody reads are left as they were."""
    out.index_copy_(0, kv_indices, pool.index_select(0, kv_indices).to(out.dtype))
    return out


# -- timing ----------------------------------------------------------------------------------------------------

TIMING = {"plain": 0}


def bench(fn, slow=False):
    """Time per call in ms by CUDA graph replay (as SGLang runs decode); plain launches if capture fails."""
    fn()
    torch.cuda.synchronize()
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=60 if slow else 200)
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()
        TIMING["plain"] += 1
    return triton.testing.do_bench(fn, warmup=3 if slow else 20, rep=60 if slow else 200)


def read_roofline_gbs() -> float:
    buf = torch.empty(512 * 2**20 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    ms = triton.testing.do_bench(lambda: buf.sum(), warmup=10, rep=100)
    del buf
    return 512 * 2**20 / (ms * 1e-3) / 1e9


# -- SGLang's launchers ----------------------------------------------------------------------------------------


def sglang_decode():
    try:
        from sglang.kernels.ops.attention import decode_attention as dec
    except ImportError:
        from sglang.srt.layers.attention.triton_ops import decode_attention as dec
    return dec


def sglang_split_scheduler():
    """The release's ``get_num_kv_splits_triton`` (metadata.py from 0.5.16; triton_backend.py before)."""
    try:
        from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

        return get_num_kv_splits_triton
    except ImportError:
        path = _sglang_file("srt/layers/attention/triton_backend.py")
        return _functions_from(path, ("get_num_kv_splits_triton",), {"triton": triton, "tl": tl})[
            "get_num_kv_splits_triton"
        ]


class DecodeRunner:
    """One decode case on the GPU: inputs, and a call with a given split cap (or forced count)."""

    def __init__(self, dec, scheduler, shape, context, batch, sm_count):
        heads, kv_heads, lk, lv = SHAPES[shape]
        self.dec, self.scheduler, self.sm_count = dec, scheduler, sm_count
        self.heads, self.kv_heads, self.lk, self.lv, self.batch = heads, kv_heads, lk, lv, batch
        g = torch.Generator(device="cuda").manual_seed(context + batch)
        slots = batch * context + 64
        self.k = torch.randn(slots, kv_heads, lk, device="cuda", dtype=torch.bfloat16, generator=g)
        self.v = (
            self.k[:, :, :lv]
            if kv_heads == 1
            else torch.randn(slots, kv_heads, lv, device="cuda", dtype=torch.bfloat16, generator=g)
        )
        self.q = torch.randn(batch, heads, lk, device="cuda", dtype=torch.bfloat16, generator=g)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        self.kv_indptr = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * context
        self.kv_indices = torch.randperm(slots, device="cuda", generator=g)[: batch * context].to(torch.int64)
        self.sm_scale = 1.0 / (lk**0.5)
        self.params = set(inspect.signature(dec.decode_attention_fwd).parameters)

    def splits(self, cap: int) -> torch.Tensor:
        n = torch.empty(self.batch, dtype=torch.int32, device="cuda")
        seq = 256 if self.batch < 256 else triton.next_power_of_2(self.batch)
        self.scheduler[(1,)](
            n, self.seq_lens, self.batch, 1, self.heads, self.kv_heads, cap, self.sm_count, MAX_NUM_SEQ=seq
        )
        return n

    def call(self, cap: int, forced: int | None = None):
        """(launch closure, output, per-request splits) with max_kv_splits = cap."""
        num = torch.full((self.batch,), forced, dtype=torch.int32, device="cuda") if forced else self.splits(cap)
        o = torch.empty(self.batch, self.heads, self.lv, device="cuda", dtype=torch.bfloat16)
        logits = torch.empty(self.batch, self.heads, cap, self.lv, device="cuda", dtype=torch.float32)
        lse = torch.empty(self.batch, self.heads, cap, device="cuda", dtype=torch.float32)
        kwargs = dict(
            q=self.q,
            k_buffer=self.k,
            v_buffer=self.v,
            o=o,
            kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices,
            attn_logits=logits,
            attn_lse=lse,
            num_kv_splits=num,
            max_kv_splits=cap,
            sm_scale=self.sm_scale,
            k_scale=1.0,
            v_scale=1.0,
        )
        if "has_mla" in self.params:
            kwargs["has_mla"] = self.kv_heads == 1 and self.lk > self.lv
        kwargs = {k: v for k, v in kwargs.items() if k in self.params}
        return (lambda: self.dec.decode_attention_fwd(**kwargs)), o, num


def run_decode(args, sm_count, read_gbs, patched_cap, release_mla_cap) -> list[dict]:
    dec, scheduler = sglang_decode(), sglang_split_scheduler()
    rows = []
    for shape, context, batch in cases(args.cases):
        r_cap, p_cap = split_caps(
            shape, sm_count, args.model_context, patched_cap=patched_cap, release_mla_cap=release_mla_cap
        )
        run = DecodeRunner(dec, scheduler, shape, context, batch, sm_count)
        slow = context * batch > 10**6
        fn_r, o_r, n_r = run.call(r_cap)
        fn_p, o_p, n_p = run.call(p_cap)
        ms_r, ms_p = bench(fn_r, slow), bench(fn_p, slow)
        nbytes = kv_read_bytes(shape, context, batch)
        row = {
            "shape": shape,
            "context": context,
            "batch": batch,
            "release": {
                "cap": r_cap,
                "splits": int(n_r.max()),
                "ms": ms_r,
                "roofline_pct": roofline_share(nbytes, ms_r, read_gbs),
            },
            "patched": {
                "cap": p_cap,
                "splits": int(n_p.max()),
                "ms": ms_p,
                "roofline_pct": roofline_share(nbytes, ms_p, read_gbs),
            },
            "speedup": ms_r / ms_p,
            "max_abs_diff": float((o_r.float() - o_p.float()).abs().max()),
        }
        if batch == 1 and not args.no_sweep:
            sweep = {}
            for s in SWEEP:
                fn_s, _, _ = run.call(s, forced=s)
                sweep[s] = bench(fn_s, slow)
            best = min(sweep, key=sweep.get)
            row["sweep_ms"] = sweep
            row["best_splits"] = best
            row["patched_over_best"] = ms_p / sweep[best]
            row["eight_over_patched"] = sweep[8] / ms_p
        rows.append(row)
        extra = ""
        if "sweep_ms" in row:
            extra = (
                f"  best {row['best_splits']:>3} splits: patched/best {row['patched_over_best']:.2f}x,"
                f" 8 splits/patched {row['eight_over_patched']:.2f}x"
            )
        print(
            f"{shape:>9} ctx {context:>6} bs {batch:>2}: release {ms_r:8.3f} ms ({row['release']['splits']:>3} "
            f"splits, {row['release']['roofline_pct']:5.1f} %)  patched {ms_p:8.3f} ms "
            f"({row['patched']['splits']:>3} splits, {row['patched']['roofline_pct']:5.1f} %)  "
            f"{row['speedup']:5.2f}x  diff {row['max_abs_diff']:.1e}{extra}",
            flush=True,
        )
        del run, fn_r, fn_p, o_r, o_p
        torch.cuda.empty_cache()
    return rows


def patch_fp8_pages_module():
    """The conversion code sm120-flashinfer-mla-fp8-pages installs (scripts/gen_fp8_pages_patch.py), as a
    module in a temporary file (Triton reads a kernel's source from its file)."""
    import tempfile

    import gen_fp8_pages_patch as gen  # beside this file

    path = Path(tempfile.mkdtemp(prefix="fp8-pages-")) / "sm120_fp8_pages_bench.py"
    path.write_text("from __future__ import annotations\nimport torch\n" + gen.HELPERS, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("sm120_fp8_pages_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_fp8(args) -> list[dict]:
    """Whole-pool conversion against the patch's page-only kernel (the rows of ``batch`` requests of
    FP8_TOKENS_PER_REQUEST tokens each, scattered over the pool)."""
    patch = patch_fp8_pages_module()
    rows = []
    for pool_tokens in POOLS:
        g = torch.Generator(device="cuda").manual_seed(pool_tokens)
        pool = (torch.randn(pool_tokens, 1, 576, device="cuda", dtype=torch.bfloat16, generator=g) / 2).to(
            torch.float8_e4m3fn
        )
        out = torch.zeros(pool_tokens, 1, 576, device="cuda", dtype=torch.bfloat16)
        ms_full = bench(lambda: pool.to(torch.bfloat16))
        full = pool.to(torch.bfloat16)
        for batch in FP8_BATCHES:
            read = min(pool_tokens, batch * FP8_TOKENS_PER_REQUEST)
            idx = torch.randperm(pool_tokens, device="cuda", generator=g)[:read].to(torch.int32)
            lens = torch.full((batch,), read // batch, dtype=torch.int32, device="cuda")
            ms_pages = bench(lambda: patch._sm120_convert_pages(pool, idx, lens, batch, out))
            same = bool(torch.equal(out[idx].view(torch.int16), full[idx].view(torch.int16)))
            rows.append(
                {
                    "pool_tokens": pool_tokens,
                    "batch": batch,
                    "tokens_read": read,
                    "full_ms": ms_full,
                    "pages_ms": ms_pages,
                    "ratio": ms_full / ms_pages,
                    "bit_identical": same,
                }
            )
            print(
                f"fp8 pool {pool_tokens:>8} bs {batch:>2} ({read:>6} tokens read): whole pool {ms_full:8.3f} ms"
                f"  pages only {ms_pages:7.3f} ms  {ms_full / ms_pages:7.1f}x  bit-identical {same}",
                flush=True,
            )
        del pool, out, full
        torch.cuda.empty_cache()
    for batch in FP8_BATCHES:
        times = [r["pages_ms"] for r in rows if r["batch"] == batch]
        print(f"fp8 pages-only cost, bs {batch}: largest/smallest pool {max(times) / min(times):.2f}x")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", choices=("all", "quick"), default="all")
    ap.add_argument("--no-sweep", action="store_true", help="skip the forced split-count sweep at batch 1")
    ap.add_argument("--no-fp8", action="store_true", help="skip the fp8 pool conversion table")
    ap.add_argument(
        "--model-context",
        type=int,
        default=MODEL_CONTEXT,
        help="the model context length the caps are sized for (default %(default)s)",
    )
    ap.add_argument("--native", action="store_true", help="no SM120 mode on a GPU that is not 12.x")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode.py needs a CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    import sglang

    version = getattr(sglang, "__version__", "?")
    mode = "SM120 mode (DISABLE_MMA_V3=1)" if SM120_MODE else "native"
    print(
        f"{props.name}, {props.multi_processor_count} SMs, capability {props.major}.{props.minor}, {mode}; "
        f"SGLang {version}, Triton {triton.__version__}",
        flush=True,
    )
    started = time.time()
    read_gbs = read_roofline_gbs()
    print(f"read roofline (torch.sum over 512 MiB): {read_gbs:.0f} GB/s", flush=True)
    patched_cap, release_mla_cap = patched_cap_function(), release_mla_cap_function()
    result = {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "sm120_mode": SM120_MODE,
        "sglang": version,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "read_roofline_gbs": read_gbs,
        "model_context": args.model_context,
        "timing": "cuda graph replay",
        "release_mla_cap": release_mla_cap is not None,
    }
    result["decode"] = run_decode(args, props.multi_processor_count, read_gbs, patched_cap, release_mla_cap)
    if not args.no_fp8:
        result["fp8_conversion"] = run_fp8(args)
    result["plain_launch_timings"] = TIMING["plain"]
    result["seconds"] = time.time() - started
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
