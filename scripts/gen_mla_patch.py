#!/usr/bin/env python3
"""Write the diffs of the ``sm120-mla-attention`` patch from its kernel module and the backend hook.

The patch adds the kernel's files (``KERNEL_FILES``, from ``kernels/sm120_attention/``, as [[files]] entries of its
patch.toml) to SGLang beside its
Triton attention kernels (``sglang/kernels/ops/attention/`` from 0.5.16, ``sglang/srt/layers/attention/triton_ops/``
before) and inserts a call of ``sm120_mla.install()`` into the Triton attention backend's constructor, after the
backend has bound its launchers. The diffs hold that hook alone; the files in ``kernels/sm120_attention/`` are
shipped as they are. After a change of the hook or a new base release, run

    python scripts/gen_mla_patch.py            # rewrite the diffs
    python scripts/gen_mla_patch.py --check    # exit 1 if a diff is not what this script would write

Each variant is made against the release named as its base (downloaded into the sm120kit cache);
tests/kernels/test_mla_kernels.py checks that the diffs in the series are this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import variant_diffs  # beside this script (scripts/ is on the path when it runs, and in the tests)

from sm120kit.sglang import releases

REPO = Path(__file__).resolve().parents[1]

PATCH_DIR = REPO / "patches" / "sglang" / "sm120-mla-attention"
KERNEL_DIR = REPO / "kernels" / "sm120_attention"
# The files of the kernel, each shipped whole into the Triton attention package of SGLang by a [[files]] entry of
# patch.toml (one per file and package; tests/kernels/test_mla_kernels.py checks the entries against this list): the
# launcher and Triton kernels, the route between paths, the CUDA launcher and source, the NVRTC and driver calls.
# Each name starts with sm120_mla, so none can collide with SGLang's own.
KERNEL_FILES = ("sm120_mla.py", "sm120_mla_route.py", "sm120_mla_mma.py", "sm120_mla_mma.cu", "sm120_mla_nvrtc.py")
BACKEND_PATH = "sglang/srt/layers/attention/triton_backend.py"
# The Triton attention kernels' package: srt/layers/attention/triton_ops up to 0.5.15, kernels/ops/attention on.
OLD_PACKAGE, NEW_PACKAGE = "sglang.srt.layers.attention.triton_ops", "sglang.kernels.ops.attention"
# One variant per base release, each where the lines around the hook (or the package) change; patch.toml
# gives their release ranges.
BASES = {
    "0.5.2": OLD_PACKAGE,
    "0.5.4": OLD_PACKAGE,
    "0.5.14": OLD_PACKAGE,
    "0.5.15": OLD_PACKAGE,
    "0.5.16": NEW_PACKAGE,
    "0.5.18": NEW_PACKAGE,
}
ANCHOR = "        # Parse args\n"  # the hook goes right before the constructor's argument parsing
HOOK = """\
        # sm120kit sm120-mla-attention: on compute capability 12.x, speculative verify with a tree
        # mask and MLA decode take split-KV kernels first (SGLANG_SM120_MLA=0 turns this off).
        from {package} import sm120_mla

        sm120_mla.install(self, model_runner.device)

"""


def module_path(package: str, name: str = "sm120_mla.py") -> str:
    return package.replace(".", "/") + "/" + name


def backend_diff(original: str, package: str) -> list[str]:
    if original.count(ANCHOR) < 1:
        raise SystemExit(f"{BACKEND_PATH}: no line {ANCHOR.strip()!r} to place the hook before")
    patched = original.replace(ANCHOR, HOOK.format(package=package) + ANCHOR, 1)
    return [variant_diffs.file_diff(original, patched, BACKEND_PATH)]


def render(base: str) -> str:
    """The variant diff of ``base``: the hook alone (the kernel modules are [[files]] entries of patch.toml)."""
    package = BASES[base]
    root = releases.fetch_release(base)
    original = (root / BACKEND_PATH).read_text(encoding="utf-8")
    return "".join(backend_diff(original, package))


def main(argv: list[str] | None = None) -> int:
    return variant_diffs.main(argv, __doc__.splitlines()[0], PATCH_DIR, BASES, render, "scripts/gen_mla_patch.py")


if __name__ == "__main__":
    sys.exit(main())
