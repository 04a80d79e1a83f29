#!/usr/bin/env python3
"""Write the diffs of the ``sm120-decode-kv-splits`` patch from its code in kernels/decode_kv_splits/.

The patch adds two functions to SGLang's Triton attention backend (``triton_backend.py``, before its first
``@dataclass``) and one line to the backend's constructor, right after the release sets
``self.max_kv_splits`` (and, from 0.5.12, after upstream's MLA cap). The code is written once, in kernels/decode_kv_splits/triton_backend_helpers.py; each
variant is this code inserted into its base release (downloaded into the sm120kit cache):

    python scripts/gen_decode_splits_patch.py            # rewrite the diffs
    python scripts/gen_decode_splits_patch.py --check    # exit 1 if a diff is not what this script writes

tests/kernels/test_decode_kv_splits.py checks that the diffs in the series are this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import variant_diffs  # beside this script (scripts/ is on the path when it runs, and in the tests)

from sm120kit.sglang import releases

REPO = Path(__file__).resolve().parents[1]

PATCH_DIR = REPO / "patches" / "sglang" / "sm120-decode-kv-splits"
BACKEND_PATH = "sglang/srt/layers/attention/triton_backend.py"
# One variant per base release, where the lines around the two insertions change; patch.toml gives the
# release ranges (the same diff applies at an offset to every release up to the next base).
BASES = ("0.5.2", "0.5.3", "0.5.9", "0.5.12", "0.5.13", "0.5.15")

# The code inserted into SGLang, written once as a source file in kernels/decode_kv_splits/.
HELPERS_SOURCE = REPO / "kernels" / "decode_kv_splits" / "triton_backend_helpers.py"
HELPERS = HELPERS_SOURCE.read_text(encoding="utf-8")

HOOK = """\
        # sm120kit sm120-decode-kv-splits: on compute capability 12.x the decode's KV-split cap comes
        # from the SM count and the context length (bounded in memory; see the functions above).
        self.max_kv_splits = _sm120_decode_max_kv_splits(self, model_runner)
"""


def insert(original: str) -> str:
    lines = original.splitlines(keepends=True)
    try:
        first_dataclass = next(i for i, line in enumerate(lines) if line.startswith("@dataclass"))
        cap_line = next(i for i, line in enumerate(lines) if line.startswith("        self.max_kv_splits = "))
    except StopIteration:
        raise SystemExit(f"{BACKEND_PATH}: no '@dataclass' or 'self.max_kv_splits = ' line") from None
    end = cap_line + 1
    if lines[end].startswith("        if self.use_mla"):  # upstream's MLA cap (0.5.12 on) stays before the hook
        end += 1
        while lines[end].startswith("            "):
            end += 1
    if "Optional" not in original.split("\nclass ", 1)[0]:
        raise SystemExit(f"{BACKEND_PATH}: typing.Optional is not imported")
    patched = lines[:first_dataclass] + [HELPERS] + lines[first_dataclass:end] + [HOOK] + lines[end:]
    return "".join(patched)


def render(base: str) -> str:
    root = releases.fetch_release(base)
    original = (root / BACKEND_PATH).read_text(encoding="utf-8")
    return variant_diffs.file_diff(original, insert(original), BACKEND_PATH)


def main(argv: list[str] | None = None) -> int:
    return variant_diffs.main(
        argv, __doc__.splitlines()[0], PATCH_DIR, BASES, render, "scripts/gen_decode_splits_patch.py"
    )


if __name__ == "__main__":
    sys.exit(main())
