"""What lands in SGLang does not change when the series' layout does (issue: kernels as source).

tests/data/patched-hashes.json holds, per final release 0.5.2-0.5.23, the status of every patch and the
SHA-256, mode and action of every file that applying the series to a fresh copy of the release created or
changed, recorded by scripts/record_patched_hashes.py before whole files became [[files]] entries (each patch
from the last commit before its own files moved). The series is applied again to a fresh copy of the real
release, every file that then differs from the release is compared with the record, and every one must be
byte-identical, with the same mode, except:

* the kernel modules of sm120-mla-attention, which must instead equal the sources in kernels/sm120_attention/
  that its [[files]] entries ship (the kernels may be edited, and may become several files: each file written
  beyond the record must be one of those, and each recorded kernel module must still be shipped from there);
* NO_LONGER_WRITTEN and CHANGED_ON_PURPOSE below: files dropped or changed on purpose, each with its reason.

A patch added to the series later is recorded with ``record_patched_hashes.py --patch ID`` when it is added.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import PurePosixPath

import pytest
from conftest import DATA_DIR, REPO_ROOT, quick_on_one
from record_patched_hashes import tree_files  # the walk that made the record

from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target

RECORDED = json.loads((DATA_DIR / "patched-hashes.json").read_text(encoding="utf-8"))
KERNEL_DIR = REPO_ROOT / "kernels" / "sm120_attention"
MLA_PATCH = "sm120-mla-attention"
# The kernel modules the record holds (their content may change; where they land may not).
RECORDED_KERNEL_NAMES = ("sm120_mla.py", "sm120_mla_mma.py")

# File names the record holds that the series no longer writes, and why.
_LOADER_REJECTS = (
    "SGLang's FP8 block-quant MoE loader (fp8.py, create_weights) rejects an intermediate size "
    "per partition that is not a multiple of block_n (and, at TP > 1, of block_k), here 128, so "
    "these config files could never be used (scripts/gen_moe_configs.py, loadable)"
)
NO_LONGER_WRITTEN: dict[str, str] = {
    f"E=128,N={n},device_name={device},dtype=fp8_w8a8,block_shape=[128, 128].json": _LOADER_REJECTS
    for n in (192, 352, 704)
    for device in ("NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition", "NVIDIA_GeForce_RTX_5090")
}

# File names whose content changed on purpose since the record, and why; each must still be written, and differ.
CHANGED_ON_PURPOSE: dict[str, str] = {
    "sm12x_backend_gate.py": "sm120-backend-gating reads which trtllm_mha roles run on 12.x from the tree's own "
    "backend instead of fixing them per release (a main with SM120 fmha_v2 prefill keeps "
    "trtllm_mha)",
}


@pytest.mark.parametrize("version", quick_on_one(tuple(RECORDED), quick="0.5.23"))
def test_patched_tree_is_byte_identical_to_the_record(version, release_dir, tmp_path):
    release = release_dir(version)
    site = tmp_path / "site-packages"
    try:  # the patch manager replaces the files it writes (temporary file + rename): hard links are safe here
        shutil.copytree(release, site, symlinks=True, copy_function=os.link)
    except OSError:
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(release, site, symlinks=True)
    result = apply_series(find_target(site / "sglang"), load_series())
    assert result.exit_code == 0, result.message
    recorded = RECORDED[version]
    assert {p.patch_id: str(p.status) for p in result.plan.patches} == recorded["patches"], (
        "a patch's status changed, or a patch is missing from the record "
        "(record a new patch with scripts/record_patched_hashes.py --patch ID)"
    )

    pristine, patched = tree_files(release), tree_files(site)
    now = {p: patched.get(p) for p in set(pristine) | set(patched) if pristine.get(p) != patched.get(p)}

    # The kernel modules: what sm120-mla-attention's [[files]] entries ship from kernels/sm120_attention/.
    mla = next(p for p in result.plan.patches if p.patch_id == MLA_PATCH)
    assert mla.variant is not None and str(mla.status) == "applies", mla.reason
    kernels = {
        dest: source
        for entry in mla.variant.shipped
        for source, dest, _ in entry.sources
        if source.parent == KERNEL_DIR
    }
    assert kernels, f"{version}: {MLA_PATCH} ships nothing from kernels/sm120_attention/"
    for dest, source in sorted(kernels.items()):
        assert now.get(dest) == (hashlib.sha256(source.read_bytes()).hexdigest(), 0o644), (
            f"{version}: {dest} is not its source {source.name} byte for byte (mode 0644)"
        )
    recorded_kernels = {p for p in recorded["files"] if PurePosixPath(p).name in RECORDED_KERNEL_NAMES}
    assert len(recorded_kernels) == len(RECORDED_KERNEL_NAMES)
    assert recorded_kernels <= set(kernels), f"{version}: no longer shipped: {sorted(recorded_kernels - set(kernels))}"

    dropped = {p for p in recorded["files"] if PurePosixPath(p).name in NO_LONGER_WRITTEN}
    assert {PurePosixPath(p).name for p in dropped} == set(NO_LONGER_WRITTEN), f"{version}: {sorted(dropped)}"
    assert not dropped & set(now), f"{version}: still written: {sorted(dropped & set(now))}"
    for path, want in recorded["files"].items():
        if path in kernels or path in dropped:
            continue
        assert path in now, f"{version}: {path} is no longer written (or no longer changed)"
        if PurePosixPath(path).name in CHANGED_ON_PURPOSE:
            assert now[path] != (want["sha256"], want["mode"]), f"{version}: {path} no longer changed on purpose"
            continue
        assert (now[path] or (None, None)) == (want["sha256"], want["mode"]), (
            f"{version}: {path} differs from the record"
        )
        action = "create" if path not in pristine else "delete" if now[path] is None else "modify"
        assert action == want["action"], path
    extra = set(now) - set(recorded["files"]) - set(kernels)
    assert not extra, f"{version}: files written that the record does not hold: {sorted(extra)}"
