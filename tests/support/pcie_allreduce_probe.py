"""The sm120-pcie-allreduce patch at work in a patched SGLang tree: two real gloo processes, a faked 12.x GPU.

``python pcie_allreduce_probe.py RESULT.json`` with ``PYTHONPATH`` at the patched tree (and the release's
transformers overlay, and this repository). Each of two processes (``torch.multiprocessing.spawn``, a real
``torch.distributed`` gloo group) builds SGLang's own ``GroupCoordinator`` with the patched ``__init__`` on
the CPU, imports the patched ``base_runner``, then runs the scenarios below; rank 0 writes what it saw.
What stands in for hardware this machine lacks: the CUDA device (``faked_cuda``, compute capability 12.0, an
RTX PRO 6000 Blackwell), ``sgl_kernel``/``torchvision`` (``stand_in_packages``) and FlashInfer's GPU
kernels (``tests/data/flashinfer-standin``: a workspace whose sum is the gloo all-reduce).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from repo_paths import DATA_DIR  # beside this file (run as a script)

STANDIN = DATA_DIR / "flashinfer-standin"
MODULE = "sglang.srt.distributed.device_communicators.sm120_pcie_ipc_ar"
HIDDEN = 7168
VARS = (
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
    "SGLANG_ENABLE_DETERMINISTIC_INFERENCE",
    "SGLANG_USE_1STAGE_ALLREDUCE",
    "SGLANG_PCIE_IPC_MAX_NUMEL",
)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def use_flashinfer(kind: str | None):
    """Put the ``kind`` stand-in ("with-pcie-ipc", "without-pcie-ipc") or none first on sys.path."""
    for name in [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not p.startswith(str(STANDIN))]
    if kind:
        sys.path.insert(0, str(STANDIN / kind))
    importlib.invalidate_caches()


def set_env(**values: str) -> None:
    for name in VARS:
        os.environ.pop(name, None)
    os.environ.update(values)


def fresh(module) -> None:
    module._said.clear()


def run(rank: int, world: int, out: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from sm120kit.hardware.fake_device import PRESETS, faked_cuda, stand_in_packages

    results: dict = {}
    records = Records()
    with stand_in_packages():
        set_env(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
        use_flashinfer("with-pcie-ipc")
        import sglang.srt.distributed.parallel_state as ps

        module = importlib.import_module(MODULE)
        logging.getLogger(MODULE).addHandler(records)
        logging.getLogger(MODULE).setLevel(logging.DEBUG)

        # -- the patched __init__ on the CPU: a real group, the switch on, the device not a GPU ------------
        params = inspect.signature(ps.GroupCoordinator.__init__).parameters
        flags = {name: False for name in params if name.startswith("use_")}
        group = ps.GroupCoordinator(
            group_ranks=[list(range(world))],
            local_rank=rank,
            torch_distributed_backend="gloo",
            group_name="tp",
            **flags,
        )
        x = torch.full((2, 8), float(rank + 1))
        results["cpu_init"] = {
            "pcie_ipc_comm": repr(group.pcie_ipc_comm),
            "sum": group.all_reduce(x)[0, 0].item(),
            "log": list(records.lines),
        }
        importlib.import_module("sglang.srt.model_executor.runner.base_runner")
        results["base_runner_imported"] = True

        with faked_cuda(PRESETS["12.0"]):
            group.device = torch.device("cuda:0")  # the faked RTX PRO 6000 Blackwell (no tensor goes there)

            def attach(
                name: str = "tp", world_size: int | None = None, flashinfer: str | None = "with-pcie-ipc", **env: str
            ) -> dict:
                set_env(**env)
                use_flashinfer(flashinfer)
                fresh(module)
                records.lines.clear()
                saved = group.world_size
                if world_size is not None:
                    group.world_size = world_size
                try:
                    comm = module.attach(group, name)
                finally:
                    group.world_size = saved
                return {
                    "on": comm is not None,
                    "log": list(records.lines),
                    "flashinfer_imported": "flashinfer" in sys.modules,
                }

            results["unset"] = attach()
            results["zero"] = attach(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="0")
            results["old_flashinfer"] = attach(flashinfer="without-pcie-ipc", SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            results["no_flashinfer"] = attach(flashinfer=None, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            results["deterministic"] = attach(
                SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1", SGLANG_ENABLE_DETERMINISTIC_INFERENCE="1"
            )
            results["one_stage_on"] = attach(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1", SGLANG_USE_1STAGE_ALLREDUCE="1")
            results["one_stage_off"] = attach(
                SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1",
                SGLANG_USE_1STAGE_ALLREDUCE="0",
                SGLANG_ENABLE_DETERMINISTIC_INFERENCE="1",
            )
            results["attention_group"] = attach("attention_tp", SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            results["three_ranks"] = attach(world_size=3, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            results["not_a_boolean"] = attach(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="maybe")

            # -- on: the workspace is built in warmup, sized for the widest decode batch -------------------
            set_env(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            use_flashinfer("with-pcie-ipc")
            fresh(module)
            calls = importlib.import_module("flashinfer.comm").CALLS
            group.pcie_ipc_comm = module.attach(group, "tp")
            ps._TP = group
            runner = SimpleNamespace(
                capture_bs=[1, 2, 4, 8, 16, 24, 32],
                captured_req_width=2,
                model_runner=SimpleNamespace(
                    model_config=SimpleNamespace(hidden_size=HIDDEN),
                    server_args=SimpleNamespace(disable_flashinfer_autotune=False),
                ),
            )
            module.prepare_for_runner(runner)
            module.prepare_for_runner(runner)  # a second runner's warmup builds nothing more
            value = float(rank + 1)
            cases = {
                "bf16 4 rows": torch.full((4, HIDDEN), value, dtype=torch.bfloat16),
                "bf16 64 rows": torch.full((64, HIDDEN), value, dtype=torch.bfloat16),
                "bf16 65 rows": torch.full((65, HIDDEN), value, dtype=torch.bfloat16),
                "fp32 4 rows": torch.full((4, HIDDEN), value, dtype=torch.float32),
                "bf16 1-d": torch.full((HIDDEN,), value, dtype=torch.bfloat16),
                "bf16 strided": torch.full((4, 2 * HIDDEN), value, dtype=torch.bfloat16)[:, ::2],
            }
            results["choice"] = {k: group._resolve_outplace_all_reduce_method(v) for k, v in cases.items()}
            summed = group._all_reduce_out_place(cases["bf16 4 rows"], "pcie_ipc")
            values = sorted({float(v) for v in summed.float().flatten()})
            results["sum"] = {"dtype": str(summed.dtype), "values": values}

            # the user-facing all_reduce picks the method for a tensor that is not on the CPU
            picked = []
            real = ps.outplace_all_reduce
            ps.outplace_all_reduce = lambda t, group_name, outplace_all_reduce_method: (
                picked.append(outplace_all_reduce_method) or t
            )
            try:
                group.all_reduce(torch.empty((4, HIDDEN), dtype=torch.bfloat16, device="meta"))
            finally:
                ps.outplace_all_reduce = real
            results["all_reduce_method"] = picked

            # SGLang's custom all-reduce, where it takes a tensor, goes first
            group.ca_comm = SimpleNamespace(disabled=False, should_custom_ar=lambda t: True)
            results["with_custom_ar"] = group._resolve_outplace_all_reduce_method(cases["bf16 4 rows"])
            group.ca_comm = None
            results["calls_before_destroy"] = [list(c) for c in calls]
            comm = group.pcie_ipc_comm
            saved_groups = group.device_group, group.cpu_group
            group.device_group = group.cpu_group = None  # the gloo world stays for the scenarios below
            group.destroy()
            group.device_group, group.cpu_group = saved_groups
            results["destroy"] = {
                "workspace_destroyed": calls[-1][0] == "destroy",
                "attribute": repr(group.pcie_ipc_comm),
                "comm_disabled": comm.disabled,
            }

            # -- SGLANG_PCIE_IPC_MAX_NUMEL, and a first reduction with no warmup (fallback width) -------------
            set_env(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1", SGLANG_PCIE_IPC_MAX_NUMEL=str(8 * HIDDEN))
            use_flashinfer("with-pcie-ipc")
            fresh(module)
            calls = importlib.import_module("flashinfer.comm").CALLS
            comm = module.attach(group, "tp")
            comm.prepare(HIDDEN, 64, tune=False)
            results["max_numel"] = {"calls": [list(c) for c in calls], "max_numel": comm.max_numel}
            comm.destroy()
            set_env(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
            use_flashinfer("with-pcie-ipc")
            fresh(module)
            records.lines.clear()
            calls = importlib.import_module("flashinfer.comm").CALLS
            comm = module.attach(group, "tp")
            first = comm.should_pcie_ipc_ar(torch.zeros((2, HIDDEN), dtype=torch.bfloat16))
            results["lazy"] = {
                "first": first,
                "max_numel": comm.max_numel,
                "calls": [list(c) for c in calls],
                "log": list(records.lines),
            }
            comm.destroy()
            results["tune_rows"] = {str(n): list(module.tune_rows(n)) for n in (1, 6, 64, 96)}
        ps._TP = None
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(run, args=(2, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "29561"), nprocs=2)
