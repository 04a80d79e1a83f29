"""SGLang's PCIe-IPC all-reduce: its switch, which trees have it, and the FlashInfer it needs.

SGLang 0.5.21 added an all-reduce on FlashInfer's PCIe-IPC kernels for GPUs that talk over PCIe only
(``srt/distributed/device_communicators/pcie_ipc_ar.py``, wired into ``parallel_state.py`` and
``model_executor/runner/base_runner.py``; the same in 0.5.22 and 0.5.23). What its code says:

* ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` (default off) turns it on; ``SGLANG_PCIE_IPC_MAX_NUMEL`` overrides
  the workspace size;
* only the ``tp`` group, of 2, 4 or 8 ranks; only bf16 tensors; the workspace holds the widest decode
  reduction (largest captured decode batch x draft tokens x hidden size), so prefill chunks stay on NCCL;
* it is chosen after SGLang's custom all-reduce (``ca``) and before the other backends;
* deterministic inference turns it off: ``SGLANG_USE_1STAGE_ALLREDUCE`` where set, else
  ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE`` (which ``--enable-deterministic-inference`` sets);
* without ``flashinfer.comm.PcieIpcAllReduceWorkspace`` it logs a warning and NCCL serves.

FlashInfer's side (read in the wheels' contents): ``flashinfer/comm/pcie_ipc_ar.py`` with
``PcieIpcAllReduceWorkspace`` and the JIT module ``pcie_ipc_comm`` are in flashinfer-python 0.7.0 and
0.7.2, not in 0.6.18 or 0.6.18.post1 (the release before 0.7.0). SGLang 0.5.21 pins 0.6.18, 0.5.22 pins
0.7.1 and 0.5.23 0.7.2: 0.5.21 with its own pin cannot use the feature.

sm120kit's ``sm120-pcie-allreduce`` patch gives releases 0.5.16 to 0.5.20 the same switch through
``device_communicators/sm120_pcie_ipc_ar.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

ENABLE_VAR = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL_VAR = "SGLANG_PCIE_IPC_MAX_NUMEL"
DETERMINISTIC_VAR = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"
ONE_STAGE_VAR = "SGLANG_USE_1STAGE_ALLREDUCE"
FIRST_RELEASE = "0.5.21"
WORLD_SIZES = (2, 4, 8)
UPSTREAM_MODULE = "srt/distributed/device_communicators/pcie_ipc_ar.py"  # relative to sglang/
BACKPORT_MODULE = "srt/distributed/device_communicators/sm120_pcie_ipc_ar.py"
BACKPORT_PATCH = "sm120-pcie-allreduce"
BACKPORT_RELEASES = ">=0.5.16,<0.5.21"  # the patch's variants together (tests/kernels/test_pcie_allreduce_patch.py)
FLASHINFER_FIRST = "0.7.0"
FLASHINFER_MODULE = "comm/pcie_ipc_ar.py"  # relative to the flashinfer package
FLASHINFER_CLASS = "PcieIpcAllReduceWorkspace"
SOURCE = (
    "https://github.com/sgl-project/sglang/blob/v0.5.21/python/sglang/srt/distributed/device_communicators/"
    "pcie_ipc_ar.py"
)
# The figures SGLang's module reports for an 8x SM120 host (GPUs 0-3 and 4-7 on two NUMA nodes), hidden 6144.
MEASURED = (
    "12 KiB in 5.3 us against NCCL's 205.1 us; a TP8 decode step 21.1 ms with NCCL only, 13.6 ms with "
    "a decode-sized PCIe-IPC workspace (35.0 -> 48.1 output tok/s)"
)
_READ_LIMIT = 4 << 20  # bytes read of a module file

_TRUE = ("true", "1", "yes", "y")
_FALSE = ("false", "0", "no", "n")


def env_bool(value: str | None) -> bool | None:
    """A switch's value as SGLang's ``EnvBool`` reads it: True, False, or None (unset or not a boolean)."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None


def enabled(env: Mapping[str, str]) -> bool:
    return bool(env_bool(env.get(ENABLE_VAR)))


def deterministic(env: Mapping[str, str], given: Mapping[str, object] | None = None) -> bool:
    """Whether deterministic collectives (which keep the PCIe-IPC all-reduce off) are on, from the environment
    and, when given, the server arguments set on the command line (``--enable-deterministic-inference``)."""
    one_stage = env_bool(env.get(ONE_STAGE_VAR))
    if one_stage is not None:
        return one_stage
    return bool(env_bool(env.get(DETERMINISTIC_VAR))) or bool((given or {}).get("enable_deterministic_inference"))


def _reads(path: Path, needle: str) -> bool:
    try:
        if not path.is_file() or path.is_symlink():
            return False
        with open(path, encoding="utf-8", errors="replace") as handle:
            return needle in handle.read(_READ_LIMIT)
    except OSError:
        return False


def tree_has(package_dir: Path | None) -> str | None:
    """Where the SGLang tree at ``package_dir`` (its ``sglang/`` folder) has the PCIe-IPC all-reduce:
    "upstream" (0.5.21 on), "backport" (sm120kit's patch applied), or None."""
    if package_dir is None:
        return None
    if _reads(package_dir / UPSTREAM_MODULE, ENABLE_VAR):
        return "upstream"
    if _reads(package_dir / BACKPORT_MODULE, ENABLE_VAR):
        return "backport"
    return None


def backport_covers(release: str | None) -> bool:
    from packaging.specifiers import SpecifierSet

    try:
        return release is not None and Version(release) in SpecifierSet(BACKPORT_RELEASES)
    except InvalidVersion:
        return False


def flashinfer_has(package_dir: Path | None, version: str | None) -> tuple[bool | None, str]:
    """Whether the FlashInfer at ``package_dir`` (its ``flashinfer/`` folder) has the PCIe-IPC all-reduce,
    read from its files without importing it: (True/False, why), or (None, why) when FlashInfer is absent."""
    if package_dir is None:
        return None, "FlashInfer is not installed"
    module = package_dir / FLASHINFER_MODULE
    if _reads(module, f"class {FLASHINFER_CLASS}") and _reads(package_dir / "comm" / "__init__.py", FLASHINFER_CLASS):
        return True, f"flashinfer.comm.{FLASHINFER_CLASS} is there ({module})"
    older = ""
    try:
        if version and Version(version) < Version(FLASHINFER_FIRST):
            older = f"; it arrived in FlashInfer {FLASHINFER_FIRST}"
    except InvalidVersion:
        pass
    return False, f"flashinfer {version or '?'} has no flashinfer.comm.{FLASHINFER_CLASS} ({module} absent){older}"
