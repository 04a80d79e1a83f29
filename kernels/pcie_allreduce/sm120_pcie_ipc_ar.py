# sm120kit sm120-pcie-allreduce: FlashInfer's PCIe-IPC all-reduce for the tensor-parallel group.
"""FlashInfer's PCIe-IPC all-reduce for the tensor-parallel group, for releases before SGLang 0.5.21.

SGLang 0.5.21 can serve the decode all-reduces of GPUs that talk over PCIe only (every card of compute
capability 12.x) with FlashInfer's PCIe-IPC kernels, switched on by SGLANG_ENABLE_PCIE_IPC_ALLREDUCE. This
module gives this release the same switch:

* off unless SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is true (1, true, yes or y, as SGLang reads its switches);
* the "tp" group only, of 2, 4 or 8 ranks on CUDA devices, and only contiguous bf16 tensors;
* off under deterministic inference (SGLANG_ENABLE_DETERMINISTIC_INFERENCE, or SGLANG_USE_1STAGE_ALLREDUCE
  where that is set): the kernels choose their launch per shape, so the order of the sums would follow
  the batch;
* with a FlashInfer that lacks the kernels (flashinfer.comm.PcieIpcAllReduceWorkspace arrived in
  FlashInfer 0.7.0) it logs one warning at start-up and changes nothing;
* the workspace holds the widest decode reduction (the largest captured decode batch, times the rows a
  request decodes per step, times the hidden size; SGLANG_PCIE_IPC_MAX_NUMEL overrides it), so
  prefill-sized reductions stay on NCCL;
* where SGLang's custom all-reduce serves a tensor it goes first, as in 0.5.21.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

ENABLE_VAR = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL_VAR = "SGLANG_PCIE_IPC_MAX_NUMEL"
WORLD_SIZES = (2, 4, 8)  # the rank counts FlashInfer's kernels are built for
GROUP_NAMES = ("tp",)
FALLBACK_ROWS = 64  # decode rows the workspace holds when the widest decode batch is not known
_TRUE = ("true", "1", "yes", "y")
_FALSE = ("false", "0", "no", "n")
_said = set()


def _say_once(level: int, key: Any, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        logger.log(level, message, *args)


def env_flag(name: str) -> Optional[bool]:
    """The boolean switch ``name`` as SGLang reads it; None when it is unset or not a boolean."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _say_once(logging.WARNING, ("not-a-boolean", name),
              "%s=%r is not a boolean (1/0, true/false, yes/no); it is ignored.", name, raw)
    return None


def deterministic() -> bool:
    """Whether this process runs deterministic collectives."""
    one_stage = env_flag("SGLANG_USE_1STAGE_ALLREDUCE")
    if one_stage is not None:
        return one_stage
    return bool(env_flag("SGLANG_ENABLE_DETERMINISTIC_INFERENCE"))


def _workspace_class() -> Any:
    try:
        from flashinfer.comm import PcieIpcAllReduceWorkspace
    except Exception:  # no FlashInfer, one without the kernels, or one that fails to import
        return None
    return PcieIpcAllReduceWorkspace


def _flashinfer_version() -> str:
    try:
        from importlib.metadata import version

        return version("flashinfer-python")
    except Exception:
        return "not installed"


def attach(group: Any, group_name: Optional[str]) -> Optional["PcieIpcAllReduce"]:
    """The PCIe-IPC all-reduce of a new GroupCoordinator, or None where it stays off (the release's own
    all-reduce paths then run exactly as before)."""
    if not env_flag(ENABLE_VAR) or group_name not in GROUP_NAMES or group.world_size <= 1:
        return None
    if deterministic():
        _say_once(logging.WARNING, "deterministic",
                  "%s is set, but deterministic inference is on: the PCIe-IPC all-reduce stays off (its "
                  "kernels choose a launch per shape, so the order of the sums would follow the batch).",
                  ENABLE_VAR)
        return None
    if group.world_size not in WORLD_SIZES:
        _say_once(logging.WARNING, "world-size",
                  "%s is set, but FlashInfer's PCIe-IPC all-reduce serves 2, 4 or 8 ranks, not %d: "
                  "all-reduces stay on the release's own paths.", ENABLE_VAR, group.world_size)
        return None
    device = getattr(group, "device", None)
    if not isinstance(device, torch.device) or device.type != "cuda":
        _say_once(logging.WARNING, "device",
                  "%s is set, but the group's device is %s, not a CUDA GPU: the PCIe-IPC all-reduce stays "
                  "off.", ENABLE_VAR, device)
        return None
    workspace_class = _workspace_class()
    if workspace_class is None:
        _say_once(logging.WARNING, "flashinfer",
                  "%s is set, but the FlashInfer here (flashinfer-python %s) has no PCIe-IPC all-reduce "
                  "(flashinfer.comm.PcieIpcAllReduceWorkspace, the pcie_ipc_comm kernels of FlashInfer 0.7.0 and "
                  "later): all-reduces stay on the release's own paths, unchanged.", ENABLE_VAR,
                  _flashinfer_version())
        return None
    _say_once(logging.INFO, "on",
              "PCIe-IPC all-reduce on for the %s group of %d ranks (flashinfer-python %s); its workspace is "
              "built before CUDA graph capture, or at the first reduction.", group_name, group.world_size,
              _flashinfer_version())
    return PcieIpcAllReduce(group.device_group, group.cpu_group, device, group.world_size, workspace_class)


def _capturing() -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # a build of torch without CUDA
        return False


def tune_rows(max_rows: int) -> Tuple[int, ...]:
    """The decode row counts to tune: the powers of two up to ``max_rows``, and ``max_rows`` itself."""
    rows = {1 << i for i in range(max(1, max_rows).bit_length()) if 1 << i <= max_rows}
    rows.add(max(1, max_rows))
    return tuple(sorted(rows))


class PcieIpcAllReduce:
    """The tensor-parallel group's PCIe-IPC all-reduce; the workspace is made on first need."""

    def __init__(self, device_group: Any, cpu_group: Any, device: torch.device, world_size: int,
                 workspace_class: Any) -> None:
        self.device_group = device_group  # the IPC handshake runs on the device (NCCL) group
        self.cpu_group = cpu_group  # tuning meets on the host group
        self.device = device
        self.world_size = world_size
        self.workspace_class = workspace_class
        self.workspace: Any = None
        self.max_numel = 0
        self.max_rows: Optional[int] = None
        self.tune = True
        self.disabled = False
        self._failed = False
        self._stream: Any = None

    # -- the workspace --------------------------------------------------------------------------------
    def prepare(self, hidden: int, max_rows: Optional[int] = None, tune: bool = True) -> None:
        """Build (and tune) the workspace ahead of CUDA graph capture; collective: every rank calls it alike."""
        if self.disabled or self.workspace is not None:
            return
        if max_rows:
            self.max_rows = int(max_rows)
        self.tune = tune
        self._build(int(hidden))

    def _capacity(self, hidden: int) -> int:
        override = os.environ.get(MAX_NUMEL_VAR, "").strip()
        if override:
            try:
                if int(override) > 0:
                    return int(override)
            except ValueError:
                pass
            _say_once(logging.WARNING, "max-numel", "%s=%r is not a positive integer; it is ignored.",
                      MAX_NUMEL_VAR, override)
        rows = self.max_rows
        if not rows:
            _say_once(logging.WARNING, "rows",
                      "PCIe-IPC all-reduce: the widest decode batch is not known here, so the workspace holds "
                      "%d rows; set %s (elements) to choose.", FALLBACK_ROWS, MAX_NUMEL_VAR)
            rows = FALLBACK_ROWS
        return rows * hidden

    def _build(self, hidden: int) -> bool:
        if self.workspace is not None:
            return True
        if self._failed:
            return False
        numel = self._capacity(hidden)
        try:
            self.workspace = self.workspace_class(group=self.device_group, max_numel=numel, dtype=torch.bfloat16,
                                                  tune_batches=tune_rows(max(1, numel // hidden)))
        except Exception as exc:  # every rank fails alike: the workspace is built jointly
            self._failed = True
            self.disabled = True
            logger.warning("The PCIe-IPC all-reduce workspace (%d elements) could not be built (%s: %s); "
                           "all-reduces stay on NCCL.", numel, type(exc).__name__, exc)
            return False
        self.max_numel = numel
        logger.info("PCIe-IPC all-reduce workspace built: %d ranks, %d elements (%d rows of %d).",
                    self.world_size, numel, numel // hidden, hidden)
        if self.tune:
            self._tune(hidden)
        return True

    def _tune(self, hidden: int) -> None:
        if _capturing():
            logger.warning("PCIe-IPC all-reduce: first reduction inside a CUDA graph capture; not tuned "
                           "(FlashInfer's default launches).")
            return
        try:
            from flashinfer.autotuner import AutoTuner

            if AutoTuner.get().is_tuning_mode:
                logger.warning("PCIe-IPC all-reduce: first reduction inside another autotune pass; not tuned "
                               "(FlashInfer's default launches).")
                return
        except Exception:
            pass
        tune = getattr(self.workspace, "tune", None)
        if tune is None:
            return
        try:
            tuned = tune([hidden], dtype=torch.bfloat16, tune_group=self.cpu_group)
        except Exception as exc:
            logger.warning("PCIe-IPC all-reduce tuning failed (%s: %s); FlashInfer's default launches stay.",
                           type(exc).__name__, exc)
            return
        logger.info("PCIe-IPC all-reduce tuned for %d shape(s) of hidden size %d.", len(tuned or ()), hidden)

    # -- the calls GroupCoordinator makes --------------------------------------------------------------
    def should_pcie_ipc_ar(self, inp: torch.Tensor) -> bool:
        """Whether ``inp`` goes to the PCIe-IPC kernels rather than the release's next choice."""
        if self.disabled or inp.dim() < 2 or not inp.is_contiguous():
            return False
        if inp.dtype != torch.bfloat16:
            _say_once(logging.INFO, ("dtype", str(inp.dtype)),
                      "PCIe-IPC all-reduce serves bf16 only; %s all-reduces stay on NCCL.", inp.dtype)
            return False
        if not self._build(int(inp.shape[-1])):
            return False
        if inp.numel() > self.max_numel:
            return False
        return bool(self.workspace.supports(inp))

    def pcie_ipc_all_reduce(self, inp: torch.Tensor) -> torch.Tensor:
        """The sum over the group, out of place. One workspace serves one stream at a time: it is moved to
        the caller's stream when that changes (capture, then replay), never used from two at once."""
        if inp.is_cuda:
            stream = torch.cuda.current_stream()
            if self._stream is not None and stream != self._stream:
                self.workspace.rebind_stream()
            self._stream = stream
        return self.workspace.all_reduce(inp)

    def destroy(self) -> None:
        """Free the workspace (collective); before the group's process groups are destroyed."""
        workspace, self.workspace = self.workspace, None
        self.disabled = True
        if workspace is not None:
            workspace.destroy()


def prepare_for_runner(runner: Any) -> None:
    """From BaseRunner.warmup: build the tensor-parallel group's workspace before CUDA graph capture, sized
    for the runner's widest decode batch."""
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        comm = getattr(get_tp_group(), "pcie_ipc_comm", None)
    except Exception:
        return
    if comm is None or comm.disabled:
        return
    model_runner = getattr(runner, "model_runner", None)
    hidden = getattr(getattr(model_runner, "model_config", None), "hidden_size", None)
    if not hidden:
        return
    rows = None
    capture_bs = getattr(runner, "capture_bs", None)
    if capture_bs:
        rows = max(capture_bs) * int(getattr(runner, "captured_req_width", 1) or 1)
    server_args = getattr(model_runner, "server_args", None)
    if rows is None and server_args is not None and not getattr(server_args, "disable_cuda_graph", True):
        max_bs = getattr(server_args, "cuda_graph_max_bs", None)
        per_request = getattr(model_runner, "decode_num_tokens_per_req", None)
        if max_bs and callable(per_request):
            rows = int(max_bs) * int(per_request())
    comm.prepare(int(hidden), rows, tune=not getattr(server_args, "disable_flashinfer_autotune", False))
