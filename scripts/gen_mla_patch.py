#!/usr/bin/env python3
"""Write the diffs of the ``sm120-mla-attention`` patch from its kernel module and the backend hook.

The patch adds ``patches/sglang/sm120-mla-attention/sm120_mla.py`` to SGLang as
``sglang/kernels/ops/attention/sm120_mla.py`` and inserts a call of its ``install()`` into the Triton
attention backend's constructor, after the backend has bound its launchers. The module file is the
source: edit it, then run

    python scripts/gen_mla_patch.py            # rewrite the diffs
    python scripts/gen_mla_patch.py --check    # exit 1 if a diff is not what this script would write

Each variant is made against the release named as its base (downloaded into the sm120kit cache);
tests/test_mla_kernels.py checks that the diffs in the series are this script's output.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sm120kit import releases  # noqa: E402

PATCH_DIR = REPO / "patches" / "sglang" / "sm120-mla-attention"
MODULE_SOURCE = PATCH_DIR / "sm120_mla.py"
MODULE_PATH = "sglang/kernels/ops/attention/sm120_mla.py"
BACKEND_PATH = "sglang/srt/layers/attention/triton_backend.py"
BASES = ("0.5.16", "0.5.18")  # one variant each; patch.toml gives their release ranges
ANCHOR = "        # Parse args\n"  # the hook goes right before the constructor's argument parsing
HOOK = """\
        # sm120kit sm120-mla-attention: on compute capability 12.x, speculative verify with a tree
        # mask and MLA decode take split-KV kernels first (SGLANG_SM120_MLA=0 turns this off).
        from sglang.kernels.ops.attention import sm120_mla

        sm120_mla.install(self, model_runner.device)

"""


def backend_diff(original: str) -> list[str]:
    if original.count(ANCHOR) < 1:
        raise SystemExit(f"{BACKEND_PATH}: no line {ANCHOR.strip()!r} to place the hook before")
    patched = original.replace(ANCHOR, HOOK + ANCHOR, 1)
    return list(difflib.unified_diff(original.splitlines(keepends=True), patched.splitlines(keepends=True),
                                     f"a/{BACKEND_PATH}", f"b/{BACKEND_PATH}", n=3))


def new_file_diff(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    return [f"--- /dev/null\n", f"+++ b/{MODULE_PATH}\n", f"@@ -0,0 +1,{len(lines)} @@\n"] + ["+" + line for line in lines]


def render(base: str) -> str:
    root = releases.fetch_release(base)
    original = (root / BACKEND_PATH).read_text(encoding="utf-8")
    return "".join(new_file_diff(MODULE_SOURCE.read_text(encoding="utf-8")) + backend_diff(original))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    stale = []
    for base in BASES:
        path = PATCH_DIR / f"{base}.diff"
        text = render(base)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/gen_mla_patch.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
