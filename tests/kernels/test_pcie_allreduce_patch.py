"""Patch sm120-pcie-allreduce on real SGLang releases from PyPI.

What is proved:

* the diffs are what ``scripts/gen_pcie_allreduce_patch.py`` writes;
* on every release of its range (0.5.16 to 0.5.20) the patch applies with zero fuzz, alone and as part of
  the whole series, every file it leaves compiles, and revert gives back a byte-identical tree; before
  0.5.16 it is not applicable, from 0.5.21 on SGLang has the feature (present-upstream);
* in a patched tree (``tests/support/pcie_allreduce_probe.py``: two real gloo processes; on the first
  release of each variant and the last of the range, all five with ``SM120KIT_TEST_EVERY_CASE=1``) SGLang's own
  ``GroupCoordinator`` and ``base_runner`` import and run: with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset nothing
  changes and FlashInfer is not even imported; with it set, on a faked 12.x GPU, the tensor-parallel group
  sends bf16 decode-sized reductions to the PCIe-IPC workspace (after SGLang's custom all-reduce), keeps
  others on NCCL, builds the workspace in warmup for the widest decode batch, and frees it in ``destroy``;
  a FlashInfer without the kernels, deterministic inference, another group or world size leave it off,
  with a start-up line saying why.

Stand-ins (this machine has no GPU): the CUDA device (``faked_cuda``), ``sgl_kernel``/``torchvision``, and
FlashInfer's GPU kernels (``tests/data/flashinfer-standin``: a workspace whose sum is the gloo all-reduce).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import gen_pcie_allreduce_patch as gen  # scripts/ (pytest's pythonpath)
import pytest
from apply_support import tree_hashes
from conftest import REPO_ROOT, SUPPORT_DIR, quick_on_one
from packaging.version import Version

from sm120kit.audit.probe_env import dependency_overlay
from sm120kit.patching.engine import apply_series, revert_series
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target

PATCH_ID = "sm120-pcie-allreduce"
PATCH_DIR = REPO_ROOT / "patches" / "sglang" / PATCH_ID
RANGE = ("0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20")
QUICK = "0.5.20"
# The releases the gloo probe runs on: the first release of each variant (0.5.16.diff, 0.5.17.diff) and the
# last of the range. 0.5.18 and 0.5.19 take the 0.5.17 variant; test_apply_and_revert_are_byte_exact applies
# it there (zero fuzz, each hook once, every file compiles). SM120KIT_TEST_EVERY_CASE=1 probes all five.
PROBED = RANGE if os.environ.get("SM120KIT_TEST_EVERY_CASE") == "1" else ("0.5.16", "0.5.17", "0.5.20")
PROBE = SUPPORT_DIR / "pcie_allreduce_probe.py"
FILES = {gen.MODULE_PATH, gen.PARALLEL_STATE, gen.BASE_RUNNER}


def test_diffs_are_the_generator_output(release_dir):
    for base in gen.BASES:
        release_dir(base)
    assert gen.main(["--check"]) == 0


@pytest.fixture(scope="session")
def alone(tmp_path_factory):
    root = tmp_path_factory.mktemp("pcie-allreduce-series")
    folder = root / "patches" / "sglang"
    shutil.copytree(PATCH_DIR, folder / PATCH_ID)
    shutil.copytree(gen.MODULE_SOURCE.parent, root / "kernels" / gen.MODULE_SOURCE.parent.name)
    (folder / "series.toml").write_text(f'patches = ["{PATCH_ID}"]\n')
    return load_series(folder)


def test_status_on_every_release_from_0_5_2_to_0_5_23(release_dir, alone):
    """Planning only, the patch alone: not applicable before its range, applies in it, present upstream after."""
    for version in ("0.5.2", "0.5.10", "0.5.15", *RANGE, "0.5.21", "0.5.22", "0.5.23"):
        (plan,) = plan_series(release_dir(version), alone, version=version).patches
        v = Version(version)
        want = "not-applicable" if v < Version("0.5.16") else "applies" if v < Version("0.5.21") else "present-upstream"
        assert plan.status == want, (version, plan.status, plan.reason)
        if want == "applies":
            assert Version(version) in plan.variant.releases and all(h.fuzz == 0 for h in plan.hunks)
        if want == "present-upstream":
            assert "device_communicators/pcie_ipc_ar.py" in plan.reason


@pytest.mark.parametrize("version", quick_on_one(RANGE, QUICK))
def test_apply_and_revert_are_byte_exact(version, installed_tree, alone):
    package = installed_tree(version, link=True)  # only the patch manager writes to it
    top = package.parent
    pristine = tree_hashes(top)
    for series in (alone, load_series()):
        result = apply_series(find_target(package), series)
        assert result.exit_code == 0, result.message
        assert result.statuses[PATCH_ID] == "applied"
        plan = {p.patch_id: p for p in result.plan.patches}[PATCH_ID]
        assert Version(version) in plan.variant.releases and all(h.fuzz == 0 for h in plan.hunks)
        mine = {c.path for c in result.written if PATCH_ID in c.patches}
        assert mine == FILES
        for rel in FILES:
            text = (package.parent / rel).read_text(encoding="utf-8")
            compile(text, rel, "exec", dont_inherit=True)
        assert (package.parent / gen.MODULE_PATH).read_text(encoding="utf-8") == gen.MODULE
        state = (package.parent / gen.PARALLEL_STATE).read_text(encoding="utf-8")
        assert state.count("sm120_pcie_ipc_ar.attach(self, group_name)") == 1
        assert state.count('return "pcie_ipc"') == 1 and state.count("pcie_ipc_all_reduce(input_)") == 1
        reverted = revert_series(find_target(package))
        assert reverted.exit_code == 0, reverted.message
        assert tree_hashes(top) == pristine, "revert is not byte-identical"


def _free_port() -> int:
    """A port no one listens on now (parallel test workers and other runs on this host must not share one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _probe(tree: Path, release: Path, tmp_path: Path, port: int) -> dict:
    overlay = dependency_overlay(release)
    paths = [str(tree)] + ([str(overlay.path)] if overlay.path else []) + [str(REPO_ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))  # the probe sets the patch's switches itself
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(out), str(port)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("version", PROBED)
def test_patched_tree_under_a_faked_12x_pair(version, release_dir, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(release_dir(version), site)
    assert apply_series(find_target(site / "sglang"), load_series()).exit_code == 0
    seen = _probe(site, release_dir(version), tmp_path, _free_port())

    # the patched __init__ on the CPU: a real group, the switch on, no GPU: off, and the sum is gloo's
    assert seen["cpu_init"]["pcie_ipc_comm"] == "None" and seen["cpu_init"]["sum"] == 3.0
    assert "not a CUDA GPU" in seen["cpu_init"]["log"][0]
    assert seen["base_runner_imported"] is True
    # off unless switched on; then FlashInfer is not even imported
    for case in ("unset", "zero", "attention_group"):
        assert seen[case] == {"on": False, "log": [], "flashinfer_imported": False}, case
    old = seen["old_flashinfer"]
    assert not old["on"] and len(old["log"]) == 1
    assert "(flashinfer-python 0.6.18+standin) has no PCIe-IPC all-reduce" in old["log"][0]
    assert "unchanged" in old["log"][0]
    assert "not installed" in seen["no_flashinfer"]["log"][0] and not seen["no_flashinfer"]["on"]
    for case in ("deterministic", "one_stage_on"):
        assert not seen[case]["on"] and "deterministic inference is on" in seen[case]["log"][0], case
    assert seen["one_stage_off"]["on"]  # SGLANG_USE_1STAGE_ALLREDUCE=0 overrides, as in SGLang 0.5.21
    assert not seen["three_ranks"]["on"] and "not 3" in seen["three_ranks"]["log"][0]
    assert not seen["not_a_boolean"]["on"] and "is not a boolean" in seen["not_a_boolean"]["log"][0]
    # on: decode-sized bf16 reductions go to the workspace, the rest stay where they were
    assert seen["choice"] == {
        "bf16 4 rows": "pcie_ipc",
        "bf16 64 rows": "pcie_ipc",
        "bf16 65 rows": None,
        "fp32 4 rows": None,
        "bf16 1-d": None,
        "bf16 strided": None,
    }
    assert seen["sum"] == {"dtype": "torch.bfloat16", "values": [3.0]}  # 1 + 2 over the two ranks
    assert seen["all_reduce_method"] == ["pcie_ipc"]
    assert seen["with_custom_ar"] == "ca"
    init, tune, reduce = seen["calls_before_destroy"]
    # warmup sized it for the widest decode batch: 32 requests x 2 rows each x hidden 7168, tuned once
    assert init == [
        "init",
        {"max_numel": 64 * 7168, "dtype": "torch.bfloat16", "tune_batches": [1, 2, 4, 8, 16, 32, 64]},
    ]
    assert tune == ["tune", {"hiddens": [7168], "tune_group": True}]
    assert reduce == ["all_reduce", {"shape": [4, 7168]}]
    assert seen["destroy"] == {"workspace_destroyed": True, "attribute": "None", "comm_disabled": True}
    assert seen["max_numel"]["max_numel"] == 8 * 7168
    assert seen["max_numel"]["calls"] == [
        ["init", {"max_numel": 8 * 7168, "dtype": "torch.bfloat16", "tune_batches": [1, 2, 4, 8]}]
    ]
    lazy = seen["lazy"]
    assert lazy["first"] is True and lazy["max_numel"] == 64 * 7168
    assert any("widest decode batch is not known" in line for line in lazy["log"])
    assert seen["tune_rows"] == {
        "1": [1],
        "6": [1, 2, 4, 6],
        "64": [1, 2, 4, 8, 16, 32, 64],
        "96": [1, 2, 4, 8, 16, 32, 64, 96],
    }
