#!/usr/bin/env python3
"""Write the diffs of the ``sm120-pcie-allreduce`` patch (its hooks; the module is a [[files]] entry).

The patch backports SGLang 0.5.21's opt-in PCIe-IPC all-reduce (FlashInfer's ``pcie_ipc_comm`` kernels,
``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE``) to the releases before it that choose their out-of-place all-reduce in
``GroupCoordinator._resolve_outplace_all_reduce_method`` and warm up in ``BaseRunner.warmup`` (0.5.16 to
0.5.20). It adds one module, ``device_communicators/sm120_pcie_ipc_ar.py`` (source: kernels/pcie_allreduce/), and five
short hooks: the communicator is made in ``GroupCoordinator.__init__``, chosen after the custom all-reduce,
run in ``_all_reduce_out_place``, freed first in ``destroy``, and its workspace is built in ``warmup`` before
CUDA graph capture. Each variant is this code inserted into its base release (downloaded into the sm120kit
cache):

    python scripts/gen_pcie_allreduce_patch.py            # rewrite the diffs
    python scripts/gen_pcie_allreduce_patch.py --check    # exit 1 if a diff is not what this script writes

tests/kernels/test_pcie_allreduce_patch.py checks that the diffs in the series are this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import variant_diffs  # beside this script (scripts/ is on the path when it runs, and in the tests)

from sm120kit.sglang import releases

REPO = Path(__file__).resolve().parents[1]

PATCH_DIR = REPO / "patches" / "sglang" / "sm120-pcie-allreduce"
PARALLEL_STATE = "sglang/srt/distributed/parallel_state.py"
BASE_RUNNER = "sglang/srt/model_executor/runner/base_runner.py"
MODULE_PATH = "sglang/srt/distributed/device_communicators/sm120_pcie_ipc_ar.py"
# One variant per base release where the lines around a hook change (0.5.17 adds a second workspace line
# after the warmup hook); patch.toml gives the ranges (a diff applies at an offset up to the next base).
BASES = ("0.5.16", "0.5.17")

# The module the patch adds, shipped whole by a [[files]] entry of patch.toml.
MODULE_SOURCE = REPO / "kernels" / "pcie_allreduce" / "sm120_pcie_ipc_ar.py"
MODULE = MODULE_SOURCE.read_text(encoding="utf-8")

INIT_ANCHOR = "        self.ca_comm: Optional[Any] = None\n"
INIT_HOOK = """\
        # sm120kit sm120-pcie-allreduce: FlashInfer's PCIe-IPC all-reduce, off unless
        # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set (device_communicators/sm120_pcie_ipc_ar.py).
        from sglang.srt.distributed.device_communicators import sm120_pcie_ipc_ar

        self.pcie_ipc_comm: Optional[Any] = sm120_pcie_ipc_ar.attach(self, group_name)
"""
CHOICE_ANCHOR = '            return "ca"\n'
CHOICE_HOOK = """\
        # sm120kit sm120-pcie-allreduce: after the custom all-reduce, as in SGLang 0.5.21.
        pcie_ipc_comm = getattr(self, "pcie_ipc_comm", None)
        if (
            pcie_ipc_comm is not None
            and not should_use_pymscclpp_allreduce
            and pcie_ipc_comm.should_pcie_ipc_ar(input_)
        ):
            return "pcie_ipc"
"""
RUN_METHOD = "    def _all_reduce_out_place(\n"
RUN_ANCHOR = "        ca_comm = self.ca_comm\n"
RUN_HOOK = """\
        if outplace_all_reduce_method == "pcie_ipc":  # sm120kit sm120-pcie-allreduce
            return self.pcie_ipc_comm.pcie_ipc_all_reduce(input_)
"""
DESTROY_ANCHOR = "    def destroy(self):\n"
DESTROY_HOOK = """\
        # sm120kit sm120-pcie-allreduce: the workspace is freed jointly, before its process group goes.
        if getattr(self, "pcie_ipc_comm", None) is not None:
            self.pcie_ipc_comm.destroy()
            self.pcie_ipc_comm = None
"""
WARMUP_ANCHOR = "        self._pre_initialize_flashinfer_allreduce_workspace()\n"
WARMUP_HOOK = """\
        # sm120kit sm120-pcie-allreduce: the PCIe-IPC workspace, built (and tuned) before graph capture.
        from sglang.srt.distributed.device_communicators import sm120_pcie_ipc_ar

        sm120_pcie_ipc_ar.prepare_for_runner(self)
"""


def _index(lines: list[str], anchor: str, path: str, start: int = 0) -> int:
    found = [i for i in range(start, len(lines)) if lines[i] == anchor]
    if not found:
        raise SystemExit(f"{path}: no line {anchor.strip()!r} after line {start + 1}")
    return found[0]


def patch_parallel_state(original: str) -> str:
    lines = original.splitlines(keepends=True)
    if original.count(INIT_ANCHOR) != 1 or original.count(CHOICE_ANCHOR) != 1 or original.count(DESTROY_ANCHOR) != 1:
        raise SystemExit(f"{PARALLEL_STATE}: the __init__, choice or destroy anchor is not there exactly once")
    init = _index(lines, INIT_ANCHOR, PARALLEL_STATE) + 1
    choice = _index(lines, CHOICE_ANCHOR, PARALLEL_STATE) + 1
    run = _index(lines, RUN_ANCHOR, PARALLEL_STATE, _index(lines, RUN_METHOD, PARALLEL_STATE))
    destroy = _index(lines, DESTROY_ANCHOR, PARALLEL_STATE) + 1
    inserts = sorted([(init, INIT_HOOK), (choice, CHOICE_HOOK), (run, RUN_HOOK), (destroy, DESTROY_HOOK)], reverse=True)
    for at, hook in inserts:
        lines[at:at] = [hook]
    return "".join(lines)


def patch_base_runner(original: str) -> str:
    lines = original.splitlines(keepends=True)
    if original.count(WARMUP_ANCHOR) != 1:
        raise SystemExit(f"{BASE_RUNNER}: the warmup anchor is not there exactly once")
    at = _index(lines, WARMUP_ANCHOR, BASE_RUNNER)  # before SGLang's own workspaces
    lines[at:at] = [WARMUP_HOOK]
    return "".join(lines)


def render(base: str) -> str:
    root = releases.fetch_release(base)
    state = (root / PARALLEL_STATE).read_text(encoding="utf-8")
    runner = (root / BASE_RUNNER).read_text(encoding="utf-8")
    return variant_diffs.file_diff(state, patch_parallel_state(state), PARALLEL_STATE) + variant_diffs.file_diff(
        runner, patch_base_runner(runner), BASE_RUNNER
    )


def main(argv: list[str] | None = None) -> int:
    return variant_diffs.main(
        argv, __doc__.splitlines()[0], PATCH_DIR, BASES, render, "scripts/gen_pcie_allreduce_patch.py"
    )


if __name__ == "__main__":
    sys.exit(main())
