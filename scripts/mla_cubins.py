#!/usr/bin/env python3
"""Write the cubins NVRTC compiles from the MLA CUDA kernels, one per target and build, to compare two revisions.

    python scripts/mla_cubins.py OUT_DIR [--kernels DIR]

For each of sm_120a, sm_121a and sm_90a (the H200 that runs the benchmarks in SM120 mode), the launchers'
build and the timeline build of ``bench_mla.py --timeline`` (SM120_TIMELINE): ``OUT_DIR/<arch>[-<define>].cubin``
(every entry point of the source is in each), and ``OUT_DIR/sha256.json`` with their hashes. No GPU is needed,
only NVRTC (the ``nvidia-cuda-nvrtc`` wheel). ``--kernels DIR`` compiles the ``sm120_mla_mma.py`` in DIR
(another revision of the kernels, loaded from its file) instead of the installed ``sm120_attention``. Two runs
compare with ``cmp`` or by their sha256.json; where bytes differ, ``cuobjdump -sass`` of both shows whether
the code does.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import sys
from pathlib import Path

ARCHS = ("sm_120a", "sm_121a", "sm_90a")
BUILDS = ((), ("SM120_TIMELINE",))


def kernel_module(folder: str | None):
    if folder is None:
        return importlib.import_module("sm120_attention.sm120_mla_mma")
    spec = importlib.util.spec_from_file_location("sm120_mla_mma_under_test", Path(folder) / "sm120_mla_mma.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for the cubins (created)")
    ap.add_argument("--kernels", metavar="DIR", help="the folder of another revision's sm120_mla_mma.py")
    args = ap.parse_args(argv)
    mma = kernel_module(args.kernels)
    args.out.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for arch in ARCHS:
        for defines in BUILDS:
            name = "-".join((arch,) + defines) + ".cubin"
            cubin = mma.compile_cubin(arch, defines=defines)
            (args.out / name).write_bytes(cubin)
            hashes[name] = hashlib.sha256(cubin).hexdigest()
            print(f"{hashes[name]}  {name}  ({len(cubin)} bytes)", flush=True)
    (args.out / "sha256.json").write_text(json.dumps(hashes, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
