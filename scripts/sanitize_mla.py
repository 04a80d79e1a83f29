#!/usr/bin/env python3
"""Small MLA calls through each CUDA entry point of ``sm120-mla-attention``, for compute-sanitizer.

    PYTHONPATH=<sglang release>:kernels compute-sanitizer --tool racecheck --kernel-name kns=sm120_mla \
        python scripts/sanitize_mla.py

(also ``--tool memcheck`` and ``--tool synccheck``; ``kernels`` may be left off where sm120kit is installed,
which brings the kernels' package ``sm120_attention``). Runs the 16-row one launch for decode (bf16 and fp8 at
batch 1 with 16 and 12 heads, at batch 2 with 8 heads and at batch 1 with 3, the last two through the one-block
transposed body, the first two through the two-block one where the build has DECODE16 for fp8 and DECODE16_BF16
for bf16 (both the default); bf16 at batch 2 with 16 heads; fp8 on the fp8-mma path at batch 2) and verify (1 draft x 16
heads), and the 64-row one launch (8 drafts x 16 heads: bf16, and fp8 on the fp8-mma path), each over 3000 prefix
tokens (splits of 64 tokens: short enough for the two-block body), and prints each output's max abs
difference to the float32 reference. ``--defines A=1,B`` builds the kernels with those -D flags first (a flag's
code under the sanitizers). Needs a CUDA GPU.
"""

import argparse
import sys

import torch

from sm120_attention import reference as ref
from sm120_attention import sm120_mla as mla
from sm120_attention import sm120_mla_route as routes

LK, LV = 576, 512
ROWS16 = routes.force(routes.CUDA16_ONE_LAUNCH)  # the 16-row one launch wherever it can take the call
FP8_MMA = routes.TABLE._replace(fp8_mma=True)  # fp8 KV on the fp8-mma path (e4m3 scores)

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--defines", default="", help="comma-separated -D flags of the CUDA kernels' build")
DEFINES = mla.cuda_prefix.merge_defines(ap.parse_args().defines)
if DEFINES:
    try:
        mla.cuda_prefix.install(torch.device("cuda", torch.cuda.current_device()), DEFINES)
    except mla.cuda_prefix.CompileError as exc:
        sys.exit(f"sanitize_mla.py: the CUDA kernels do not compile with --defines {','.join(DEFINES)}: {exc}")
    print("built with", " ".join("-D" + d for d in DEFINES), flush=True)


def run(q, k_pool, v_pool, o, qo_indptr, kv_indptr, kv_indices, batch, max_tokens, table=None, tail=None, lse=None):
    args = (q, k_pool, v_pool, o, qo_indptr, kv_indptr, kv_indices, batch, max_tokens)
    route = routes.choose(mla.call_of(*args, tail, lse), table)
    mla._run_split_attention(*args, 1 / LK**0.5, 1.0, 1.0, tail=tail, lse_out=lse, route=route)
    torch.cuda.synchronize()
    return route


for kvd, heads, batch, table in (
    ("bf16", 16, 2, ROWS16),
    *((kvd, heads, batch, ROWS16) for kvd in ("bf16", "fp8") for heads, batch in ((16, 1), (12, 1), (8, 2), (3, 1))),
    ("fp8", 16, 2, ROWS16._replace(fp8_mma=True)),
):
    d = ref.make_decode_case([3000] * batch, heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, device="cuda")
    if kvd == "fp8":
        d["k_pool"] = d["k_pool"].to(torch.float8_e4m3fn)
    d["v_pool"] = d["k_pool"][:, :, :LV]
    o = torch.zeros(batch, heads, LV, dtype=torch.bfloat16, device="cuda")
    lse = torch.zeros(batch, heads, 4, device="cuda")
    route = run(
        d["q"], d["k_pool"], d["v_pool"], o, None, d["kv_indptr"], d["kv_indices"], batch, 1, table, lse=lse[:, :, 0]
    )
    print(
        "decode16",
        kvd,
        route.path,
        "fp8-mma" if route.fp8_mma else "exact",
        (o.float() - ref.reference_decode(d)).abs().max().item(),
        flush=True,
    )
for drafts, heads, kvd in ((8, 16, "bf16"), (1, 16, "bf16"), (8, 16, "fp8")):
    c = ref.make_verify_case(
        [3000], [drafts], heads=heads, lk=LK, lv=LV, dtype=torch.bfloat16, tree="tree", device="cuda"
    )
    if kvd == "fp8":
        c["k_pool"] = c["k_pool"].to(torch.float8_e4m3fn)
        c["v_pool"] = c["k_pool"][:, :, :LV]
    tail = (c["k_ext"], c["v_ext"], c["custom_mask"].view(torch.int8), c["mask_indptr"])
    o = torch.zeros(drafts, heads, LV, dtype=torch.bfloat16, device="cuda")
    route = run(
        c["q"],
        c["k_pool"],
        c["v_pool"],
        o,
        c["qo_indptr"],
        c["kv_indptr"],
        c["kv_indices"],
        1,
        c["max_len"],
        ROWS16 if drafts == 1 else (FP8_MMA if kvd == "fp8" else None),
        tail=tail,
    )
    print(
        "verify",
        drafts,
        heads,
        kvd,
        route.path,
        "fp8-mma" if route.fp8_mma else "exact",
        (o.float() - ref.reference_verify(c)).abs().max().item(),
        flush=True,
    )
