#!/usr/bin/env python3
"""Write the diffs of the ``sm120-flashinfer-mla-fp8-pages`` patch from its code in kernels/flashinfer_mla_fp8_pages/.

The patch adds a page-only fp8 -> query-dtype conversion to SGLang's FlashInfer MLA backend
(``flashinfer_mla_backend.py``, before its first ``@dataclass``) and routes forward_decode's whole-pool
conversion, ``k_buffer = ...get_key_buffer(layer.layer_id).to(q.dtype)``, through it. Each variant is this
code applied to its base release:

    python scripts/gen_fp8_pages_patch.py            # rewrite the diffs
    python scripts/gen_fp8_pages_patch.py --check    # exit 1 if a diff is not what this script writes

tests/kernels/test_fp8_pages.py checks that the diffs in the series are this script's output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import variant_diffs  # beside this script (scripts/ is on the path when it runs, and in the tests)

from sm120kit.sglang import releases

REPO = Path(__file__).resolve().parents[1]

PATCH_DIR = REPO / "patches" / "sglang" / "sm120-flashinfer-mla-fp8-pages"
BACKEND_PATH = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
BASES = ("0.5.2", "0.5.5.post1", "0.5.5.post3", "0.5.13", "0.5.15")

# The code inserted into SGLang, written once as a source file in kernels/flashinfer_mla_fp8_pages/.
HELPERS_SOURCE = REPO / "kernels" / "flashinfer_mla_fp8_pages" / "flashinfer_mla_backend_helpers.py"
HELPERS = HELPERS_SOURCE.read_text(encoding="utf-8")

LINE = re.compile(
    r"^(?P<indent>[ ]+)k_buffer = (?P<owner>self|forward_batch)\.token_to_kv_pool"
    r"\.get_key_buffer\(layer\.layer_id\)\.to\(\s*q\.dtype\s*\)\n",
    re.M,
)


def insert(original: str) -> str:
    lines = original.splitlines(keepends=True)
    try:
        first_dataclass = next(i for i, line in enumerate(lines) if line.startswith("@dataclass"))
    except StopIteration:
        raise SystemExit(f"{BACKEND_PATH}: no '@dataclass' line") from None
    text = "".join(lines[:first_dataclass]) + HELPERS + "".join(lines[first_dataclass:])

    def repl(m: re.Match) -> str:
        ind = m["indent"]
        return (
            f"{ind}k_buffer = _sm120_fp8_pages(\n"
            f"{ind}    {m['owner']}.token_to_kv_pool.get_key_buffer(layer.layer_id),\n"
            f"{ind}    decode_wrapper,\n"
            f"{ind}    q.dtype,\n"
            f"{ind}    forward_batch,\n"
            f"{ind})\n"
        )

    text, n = LINE.subn(repl, text)
    if n != 1:
        raise SystemExit(f"{BACKEND_PATH}: expected one whole-pool conversion in forward_decode, found {n}")
    return text


def render(base: str) -> str:
    original = (releases.fetch_release(base) / BACKEND_PATH).read_text(encoding="utf-8")
    return variant_diffs.file_diff(original, insert(original), BACKEND_PATH)


def main(argv: list[str] | None = None) -> int:
    return variant_diffs.main(argv, __doc__.splitlines()[0], PATCH_DIR, BASES, render, "scripts/gen_fp8_pages_patch.py")


if __name__ == "__main__":
    sys.exit(main())
