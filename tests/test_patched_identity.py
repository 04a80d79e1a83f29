"""What lands in SGLang does not change when the series' layout does (issue: kernels as source).

tests/data/patched-hashes.json holds, per final release 0.5.2-0.5.23, the SHA-256 and mode of every file the
series created or changed, recorded by scripts/record_patched_hashes.py before the kernel modules became
[[files]] entries. The series is planned again on the real release (nothing is written) and every file must
be byte-identical, except:

* the kernel modules of sm120-mla-attention, which must equal their sources in kernels/sm120_attention/
  (the kernels may be edited, and may become several files; each one shipped must be a file of that folder);
* NO_LONGER_WRITTEN and CHANGED_ON_PURPOSE below: files dropped or changed on purpose, each with its reason;
* files written only by a patch added to the series after the record (its own tests prove them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath

import pytest

from conftest import REPO_ROOT, quick_on_one
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series

RECORDED = json.loads((REPO_ROOT / "tests" / "data" / "patched-hashes.json").read_text(encoding="utf-8"))
KERNEL_DIR = REPO_ROOT / "kernels" / "sm120_attention"
ATTENTION_DIRS = ("sglang/kernels/ops/attention", "sglang/srt/layers/attention/triton_ops")

# File names the record holds that the series no longer writes, and why.
_LOADER_REJECTS = ("SGLang's FP8 block-quant MoE loader rejects an intermediate size per partition that is not "
                   "a multiple of 128 (fp8.py create_weights), so these config files could never be used")
NO_LONGER_WRITTEN: dict[str, str] = {
    f"E=128,N={n},device_name={device},dtype=fp8_w8a8,block_shape=[128, 128].json": _LOADER_REJECTS
    for n in (192, 352, 704)
    for device in ("NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition", "NVIDIA_GeForce_RTX_5090")
}


# File names whose content changed on purpose since the record, and why; each must still be written.
CHANGED_ON_PURPOSE: dict[str, str] = {
    "sm12x_backend_gate.py": "sm120-backend-gating reads which trtllm_mha roles run on 12.x from the tree's own "
                             "backend instead of fixing them per release (a main with SM120 fmha_v2 prefill keeps "
                             "trtllm_mha)",
}


def _is_kernel_module(path: str) -> bool:
    pure = PurePosixPath(path)
    return str(pure.parent) in ATTENTION_DIRS and pure.name.startswith("sm120_mla")


@pytest.mark.parametrize("version", quick_on_one(tuple(RECORDED), quick="0.5.23"))
def test_patched_tree_is_byte_identical_to_the_record(version, release_dir):
    plan = plan_series(release_dir(version), load_series(), version=version, recorded=())
    recorded = RECORDED[version]
    statuses = {p.patch_id: str(p.status) for p in plan.patches}
    assert {k: v for k, v in statuses.items() if k in recorded["patches"]} == recorded["patches"]
    # A patch added to the series after the record writes its own files, which the record cannot hold.
    new_patches = set(statuses) - set(recorded["patches"])
    now = {c.path: c for c in plan.changes if not set(c.patches) <= new_patches}
    kernels = {p for p in now if _is_kernel_module(p)}
    assert kernels, f"{version}: the series ships no kernel module"
    for path in sorted(kernels):
        source = KERNEL_DIR / PurePosixPath(path).name
        assert source.is_file(), f"{path} is shipped but kernels/sm120_attention/ has no such file"
        assert now[path].after == source.read_bytes(), path
        assert now[path].before is None and now[path].mode == 0o644, path
    dropped = {p for p in recorded["files"] if PurePosixPath(p).name in NO_LONGER_WRITTEN}
    assert len(dropped) == len(NO_LONGER_WRITTEN), f"{version}: {sorted(dropped)}"
    assert not dropped & set(now), f"{version}: still written: {sorted(dropped & set(now))}"
    for path, want in recorded["files"].items():
        if _is_kernel_module(path) or path in dropped:
            continue
        assert path in now, f"{version}: {path} is no longer written"
        change = now[path]
        if PurePosixPath(path).name in CHANGED_ON_PURPOSE:
            assert hashlib.sha256(change.after).hexdigest() != want["sha256"], f"{path}: no longer changed"
            continue
        assert hashlib.sha256(change.after).hexdigest() == want["sha256"], f"{version}: {path} differs"
        assert (change.mode, change.action) == (want["mode"], want["action"]), path
    extra = set(now) - set(recorded["files"]) - kernels
    assert not extra, f"{version}: files written that the record does not hold: {sorted(extra)}"
