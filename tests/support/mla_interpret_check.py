"""Numeric checks of the SM120 split-KV kernels on the CPU, through Triton's interpreter.

Run by tests/kernels/test_mla_kernels.py in a fresh interpreter (``TRITON_INTERPRET=1`` must be set before the
kernels are defined), with a patched SGLang release first on ``PYTHONPATH`` and then ``kernels/`` (for the
float32 reference, ``sm120_attention.reference``)::

    python tests/support/mla_interpret_check.py OUT.json [--release-only]

``--release-only`` skips the checks against the float32 reference: they exercise only the patch's own
module, which is the same file on every release, so one release runs them. Those checks take every pair of
(shape, dtype, layout) values once (6 kernel runs, :data:`PAIRWISE`) rather than all 12 combinations: each
factor picks its own code (head dims and grouping; the cast and the tolerance; mask and page walk), and no
branch of the launchers depends on two of them at once beyond what a pair shows.
``SM120KIT_TEST_EVERY_CASE=1`` runs all 12.

It imports ``sm120_mla`` and the release's own ``extend_attention`` / ``decode_attention`` from that
tree (CPU torch: SGLang's ``is_cuda()`` is false, so nothing reads a device at import) and writes one
record per check: the largest difference against the float32 reference and against the release's kernel,
and, for calls the new launchers must decline, whether they returned False and left the output as it was.
fp32 and fp16 only: Triton 3.9's interpreter returns garbage for bf16 even for SGLang's own kernels.

The interpreter runs a grid's programs one after another at about 20 ms each, and the merge that scores the draft
tail (``_merge_tail_kernel``) has a program per (query row, head, value block): 2048 programs for 16 heads x 16
rows at the route's 64 value dims a program, 44 of the 45 s the first MLA check takes on a 2-core machine. That
first check (MLA, float32, tree mask) runs the route table as SGLang gets it; every other MLA call runs with
:data:`MERGE_DV` value dims a merge program (:func:`fewer_programs`: the same kernels with two value blocks, so
the offsets of a later block are still checked; 12 s instead of 44).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from sm120_attention import reference as ref  # noqa: E402

try:  # the kernels' package from 0.5.16 on, and before
    from sglang.kernels.ops.attention import (  # noqa: E402
        decode_attention,
        extend_attention,
        sm120_mla,
        sm120_mla_route,  # noqa: E402
    )
except ModuleNotFoundError:
    from sglang.srt.layers.attention.triton_ops import (  # noqa: E402
        decode_attention,
        extend_attention,
        sm120_mla,
        sm120_mla_route,  # noqa: E402
    )

SHAPES = {  # name: (kv heads, qk head dim, v head dim, query heads)
    "mla": (1, 576, 512, 16),
    "gqa": (2, 128, 128, 8),
    "mha": (4, 64, 64, 4),
}


LAYOUTS = (("tree", 1), ("chain", 16))  # (mask, page size): a tree mask on single slots, a chain on pages
# Every shape with each dtype and each layout, and each dtype with each layout (all pairs of the three
# factors; each case costs a full interpreted kernel run, the 576/512 MLA shape most).
PAIRWISE = (
    ("mla", torch.float32, LAYOUTS[0]),
    ("mla", torch.float16, LAYOUTS[1]),
    ("gqa", torch.float32, LAYOUTS[1]),
    ("gqa", torch.float16, LAYOUTS[0]),
    ("mha", torch.float32, LAYOUTS[0]),
    ("mha", torch.float16, LAYOUTS[1]),
)


MERGE_DV = 256  # value dims a merge program takes in the checks after the first (the route's own: 64)


def fewer_programs():
    """The route table with :data:`MERGE_DV` value dims a merge program (a quarter of the merge's programs)."""
    return sm120_mla_route.using(sm120_mla_route.TABLE._replace(merge=(MERGE_DV, *sm120_mla_route.TABLE.merge[1:])))


def verify_reference_cases() -> list:
    """(shape, dtype, (mask, page size)) of the checks against the float32 reference: the all-pairs set, or
    every combination with ``SM120KIT_TEST_EVERY_CASE=1``."""
    if os.environ.get("SM120KIT_TEST_EVERY_CASE") == "1":
        return [(n, d, lay) for n in SHAPES for d in (torch.float32, torch.float16) for lay in LAYOUTS]
    return list(PAIRWISE)


def paged(case, page_size, seed=0):
    """Lay the prefix slots out as whole pages of ``page_size`` in scattered order (SGLang's paged pool)."""
    gen = torch.Generator().manual_seed(seed)
    total = case["kv_indices"].numel()
    pool_pages = case["k_pool"].shape[0] // page_size
    order = torch.randperm(pool_pages, generator=gen)[: -(-total // page_size)]
    slots = (order[:, None] * page_size + torch.arange(page_size)[None, :]).flatten()[:total]
    case["kv_indices"] = slots.to(torch.int64)
    return case


def release_call(fn, **kwargs):
    """Call a launcher of the release by name with the arguments it declares (their order and set changed
    over releases: no k_scale/v_scale before 0.5.10, no has_mla before 0.5.15)."""
    params = inspect.signature(inspect.unwrap(fn)).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def main(out_path: str, reference: bool = True) -> int:
    records = []
    as_shipped = sm120_mla_route.TABLE  # the route table SGLang gets, for the first check
    with fewer_programs():
        if reference:
            reference_checks(records, as_shipped)
        release_checks(records)
        decline_checks(records)
    Path(out_path).write_text(json.dumps(records, indent=1))
    return 0


def reference_checks(records: list, as_shipped) -> None:
    # 1. against the float32 reference: every shape with both dtypes and with both layouts (a tree mask on
    #    page size 1, a chain mask on page size 16), each dtype with each layout, uneven batches (one request
    #    with no prefix at all).
    for index, (name, dtype, (tree, page)) in enumerate(verify_reference_cases()):
        kvh, lk, lv, heads = SHAPES[name]
        c = ref.make_verify_case(
            [200, 75, 0],
            [8, 5, 3],
            heads=heads,
            kv_heads=kvh,
            lk=lk,
            lv=lv,
            dtype=dtype,
            tree=tree,
            seed=lk + kvh,
            pool_extra=128,
        )
        if page > 1:
            c = paged(c, page)
        o = torch.zeros(c["q"].shape[0], heads, lv, dtype=dtype)
        with sm120_mla_route.using(as_shipped if index == 0 else sm120_mla_route.TABLE):
            ran = sm120_mla.sm120_tree_verify_fwd(*ref.verify_args(c, o), page_size=page)
        records.append(
            {
                "check": "verify-reference",
                "shape": name,
                "dtype": str(dtype)[6:],
                "mask": tree,
                "page_size": page,
                "ran": ran,
                "max_abs_diff": diff(o, ref.reference_verify(c)),
            }
        )
    # The draft tail as its own pass (_tail_kernel) instead of inside the merge: a route table that never
    # scores it in the merge, for the calls of the launcher's own entry point.
    with sm120_mla_route.using(sm120_mla_route.TABLE._replace(fuse_tail_max_rows=0)):
        for name, (kvh, lk, lv, heads) in SHAPES.items():
            c = ref.make_verify_case(
                [200, 75, 0],
                [8, 5, 3],
                heads=heads,
                kv_heads=kvh,
                lk=lk,
                lv=lv,
                dtype=torch.float32,
                tree="tree",
                seed=lk + kvh,
                pool_extra=128,
            )
            o = torch.zeros(c["q"].shape[0], heads, lv, dtype=torch.float32)
            ran = sm120_mla.sm120_tree_verify_fwd(*ref.verify_args(c, o))
            records.append(
                {
                    "check": "verify-separate-tail",
                    "shape": name,
                    "dtype": "float32",
                    "ran": ran,
                    "max_abs_diff": diff(o, ref.reference_verify(c)),
                }
            )
    for dtype in (torch.float32, torch.float16):
        c = ref.make_decode_case([300, 17, 1], heads=16, dtype=dtype, seed=3)
        o = torch.zeros(3, 16, 512, dtype=dtype)
        ran = sm120_mla.sm120_mla_decode_fwd(c["q"], c["k_pool"], c["v_pool"], o, c["kv_indptr"], c["kv_indices"])
        records.append(
            {
                "check": "decode-reference",
                "shape": "mla",
                "dtype": str(dtype)[6:],
                "ran": ran,
                "max_abs_diff": diff(o, ref.reference_decode(c)),
            }
        )
    # fp8 scales: k_scale/v_scale applied to the pool (a scaled fp16 pool stands in for fp8 storage,
    # which the interpreter cannot load).
    c = ref.make_verify_case([150, 40], [6, 4], heads=16, dtype=torch.float16, seed=9)
    c["k_pool"] = c["k_pool"] * 2
    c["v_pool"] = c["k_pool"][:, :, :512]
    o = torch.zeros(c["q"].shape[0], 16, 512, dtype=torch.float16)
    ran = sm120_mla.sm120_tree_verify_fwd(*ref.verify_args(c, o, k_scale=0.5, v_scale=0.5))
    records.append(
        {
            "check": "verify-scales",
            "shape": "mla",
            "dtype": "float16",
            "ran": ran,
            "max_abs_diff": diff(o, ref.reference_verify(c, k_scale=0.5, v_scale=0.5)),
        }
    )


def release_checks(records: list) -> None:
    # 2. against the release's own kernels, same inputs, through the backend's routing wrappers.
    extend_fwd = sm120_mla.verify_first(extend_attention.extend_attention_fwd)
    for name in ("mla", "gqa"):
        kvh, lk, lv, heads = SHAPES[name]
        c = ref.make_verify_case(
            [120, 33], [8, 6], heads=heads, kv_heads=kvh, lk=lk, lv=lv, dtype=torch.float16, tree="tree", seed=5
        )
        o_new = torch.zeros(c["q"].shape[0], heads, lv, dtype=torch.float16)
        o_old = torch.zeros_like(o_new)
        release_call(extend_fwd, **ref.verify_kwargs(c, o_new))
        release_call(extend_attention.extend_attention_fwd, **ref.verify_kwargs(c, o_old))
        records.append(
            {
                "check": "verify-release",
                "shape": name,
                "dtype": "float16",
                "ran": True,
                "max_abs_diff": diff(o_new, o_old),
            }
        )
    # A prefill-style call (no custom mask) goes to the release's kernel untouched: bit-identical.
    c = ref.make_verify_case([64], [16], heads=8, kv_heads=2, lk=128, lv=128, dtype=torch.float16, seed=6)
    o_new = torch.zeros(16, 8, 128, dtype=torch.float16)
    o_old = torch.zeros_like(o_new)
    no_mask = dict(ref.verify_kwargs(c, o_new), custom_mask=None, is_causal=True, mask_indptr=None)
    release_call(extend_fwd, **no_mask)
    release_call(extend_attention.extend_attention_fwd, **dict(no_mask, o_extend=o_old))
    records.append(
        {
            "check": "fallback-identical",
            "shape": "gqa",
            "dtype": "float16",
            "ran": False,
            "max_abs_diff": diff(o_new, o_old),
            "bit_identical": bool(torch.equal(o_new, o_old)),
        }
    )

    decode_fwd = sm120_mla.decode_first(decode_attention.decode_attention_fwd)
    c = ref.make_decode_case([250, 40], heads=16, dtype=torch.float16, seed=7)
    splits = 8
    o_new = torch.zeros(2, 16, 512, dtype=torch.float16)
    o_old = torch.zeros_like(o_new)
    for o in (o_new, o_old):
        logits = torch.empty(2, 16, splits, 512, dtype=torch.float32)
        lse = torch.empty(2, 16, splits, dtype=torch.float32)
        nsplit = torch.full((2,), splits, dtype=torch.int32)
        fn = decode_fwd if o is o_new else decode_attention.decode_attention_fwd
        release_call(
            fn,
            q=c["q"],
            k_buffer=c["k_pool"],
            v_buffer=c["v_pool"],
            o=o,
            kv_indptr=c["kv_indptr"],
            kv_indices=c["kv_indices"],
            attn_logits=logits,
            attn_lse=lse,
            num_kv_splits=nsplit,
            max_kv_splits=splits,
            sm_scale=1 / 576**0.5,
            k_scale=1.0,
            v_scale=1.0,
            has_mla=True,
        )
    records.append(
        {"check": "decode-release", "shape": "mla", "dtype": "float16", "ran": True, "max_abs_diff": diff(o_new, o_old)}
    )
    # SGLang's backend sets enable_lean for MLA batches of 8+ under CUDA graphs on every GPU; its CUDA
    # kernel ignores it (ROCm only), so the split-KV decode must serve such calls too.
    o_lean = torch.zeros_like(o_new)
    ran = sm120_mla.sm120_mla_decode_fwd(
        c["q"],
        c["k_pool"],
        c["v_pool"],
        o_lean,
        c["kv_indptr"],
        c["kv_indices"],
        enable_lean=True,
        lean_Mp=torch.empty(1),
        lean_locks=torch.empty(1),
    )
    records.append(
        {
            "check": "decode-release",
            "shape": "mla",
            "dtype": "float16",
            "ran": ran,
            "case": "enable_lean",
            "max_abs_diff": diff(o_lean, o_old),
        }
    )


def decline_checks(records: list) -> None:
    # 3. calls the launchers must decline: False, and the output left exactly as it was.
    c = ref.make_verify_case([40], [4], heads=16, dtype=torch.float16, seed=8)
    declines = {
        "no custom mask": dict(custom_mask=None),
        "masked prefix": dict(skip_prefix_custom_mask=False),
        "sliding window": dict(sliding_window_size=16),
        "logit soft cap": dict(logit_cap=30.0),
        "sinks": dict(sinks=torch.zeros(16)),
        "lse output": dict(lse_extend=torch.zeros(4, 16)),
        "tail over 64": dict(max_len_extend=65),
        "unknown argument": dict(new_feature=torch.zeros(1)),
    }
    for label, change in declines.items():
        o = torch.full((4, 16, 512), 7.0, dtype=torch.float16)
        kwargs = ref.verify_kwargs(c, o)
        kwargs.update(change)
        ran = sm120_mla.sm120_tree_verify_fwd(**kwargs)
        records.append(
            {"check": "decline", "launcher": "verify", "case": label, "ran": ran, "untouched": bool((o == 7.0).all())}
        )
    gqa = ref.make_decode_case([30], heads=8, lk=128, lv=128, dtype=torch.float16)
    gqa["k_pool"] = gqa["k_pool"][:, :, :128]
    for label, (case, change) in {
        "not MLA (qk dim = v dim)": (gqa, {}),
        "logit soft cap": (ref.make_decode_case([30], heads=16, dtype=torch.float16), dict(logit_cap=30.0)),
        "has_mla False": (ref.make_decode_case([30], heads=16, dtype=torch.float16), dict(has_mla=False)),
    }.items():
        heads, lv = case["q"].shape[1], case["v_pool"].shape[-1]
        o = torch.full((1, heads, lv), 7.0, dtype=torch.float16)
        ran = sm120_mla.sm120_mla_decode_fwd(
            case["q"], case["k_pool"], case["v_pool"], o, case["kv_indptr"], case["kv_indices"], **change
        )
        records.append(
            {"check": "decline", "launcher": "decode", "case": label, "ran": ran, "untouched": bool((o == 7.0).all())}
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], reference="--release-only" not in sys.argv[2:]))
