"""The multi-GPU part of ``sm120kit verify``: how the GPUs are connected, NCCL, and the PCIe-IPC all-reduce.

:func:`collect` gathers the facts (``nvidia-smi topo`` through :mod:`sm120kit.hardware.topology`, NCCL's
version from torch, whether the installed FlashInfer and SGLang have the PCIe-IPC all-reduce, the
switches in the environment) into a :class:`MultiGpuInfo`; :func:`assess` turns them into findings and is
a pure function, so it is tested with faked topologies. The findings say when a box of two or more 12.x
GPUs would send its decode all-reduces to NCCL although the PCIe-IPC path could serve them, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120kit.hardware import arch
from sm120kit.hardware.topology import GpuTopology, pair_label, probe_topology
from sm120kit.sglang import pcie_allreduce
from sm120kit.sglang.metadata import installed_version
from sm120kit.verify.flag import INFO, WARNING, Flag

COMPONENT = "all-reduce"


@dataclass(frozen=True)
class MultiGpuInfo:
    gpu_count: int | None  # CUDA devices torch sees (or nvidia-smi lists); None: unknown
    topology: str | None  # one line: link kinds, peer access, NUMA nodes
    topology_note: str  # why there is no topology, or what was not read
    nvlink: bool | None  # every pair joined by NVLink
    pairs_without_peer_access: tuple[str, ...] = ()  # "GPU0-GPU1 (GNS)"
    cross_numa_pairs: tuple[str, ...] = ()
    links: tuple[tuple[str, ...], ...] = ()
    numa: tuple[int | None, ...] = ()
    nccl: str | None = None  # the NCCL torch runs with (torch.cuda.nccl.version())
    nccl_package: str | None = None  # nvidia-nccl-cu12 / -cu13 on PyPI
    nccl_note: str = ""
    flashinfer_version: str | None = None
    flashinfer_pcie_ipc: bool | None = None
    flashinfer_note: str = ""
    sglang_version: str | None = None
    sglang_pcie_ipc: str | None = None  # "upstream" | "backport" | None
    enabled: bool = False  # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is true in this environment
    deterministic: bool = False
    nccl_env: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            (
                "GPUs, topology",
                f"{self.gpu_count if self.gpu_count is not None else '?'} GPU(s); "
                + (self.topology or self.topology_note),
            )
        ]
        if self.topology and self.topology_note:
            rows.append(("  topology note", self.topology_note))
        rows.append(
            (
                "NCCL",
                f"{self.nccl or '-'} (torch)"
                + (f", package {self.nccl_package}" if self.nccl_package else "")
                + (f"; {self.nccl_note}" if self.nccl_note else ""),
            )
        )
        fi = {True: "yes", False: "no", None: "-"}[self.flashinfer_pcie_ipc]
        rows.append(("FlashInfer pcie_ipc_comm", f"{fi}: {self.flashinfer_note}"))
        where = {
            "upstream": "yes (SGLang's own, 0.5.21 on)",
            "backport": "yes (sm120kit's sm120-pcie-allreduce)",
            None: "no",
        }[self.sglang_pcie_ipc]
        rows.append(
            (
                "SGLang PCIe-IPC all-reduce",
                f"{where}; {pcie_allreduce.ENABLE_VAR} "
                f"{'on' if self.enabled else 'off'}" + ("; deterministic inference on" if self.deterministic else ""),
            )
        )
        return rows


def _nccl(torch_module: Any) -> tuple[str | None, str]:
    if torch_module is None:
        return None, "torch is not installed"
    try:
        version = torch_module.cuda.nccl.version()
    except Exception as exc:  # a CPU build of torch has no NCCL
        return None, f"torch has no NCCL ({type(exc).__name__}: {str(exc)[:120]})"
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version), ""
    return str(version), ""


def _gpu_count(torch_module: Any) -> int | None:
    try:
        if torch_module is not None and torch_module.cuda.is_available():
            return int(torch_module.cuda.device_count())
    except Exception:
        pass
    return None


def from_facts(
    *,
    topology: GpuTopology | None,
    topology_note: str,
    gpu_count: int | None,
    nccl: str | None,
    nccl_note: str,
    nccl_package: str | None,
    flashinfer_dir: Path | None,
    flashinfer_version: str | None,
    sglang_dir: Path | None,
    sglang_version: str | None,
    env: Mapping[str, str],
) -> MultiGpuInfo:
    """The facts, put together (no probing): what :func:`collect` and the tests build the info from."""
    has_fi, fi_note = pcie_allreduce.flashinfer_has(flashinfer_dir, flashinfer_version)
    peerless = ()
    if topology is not None:
        peerless = tuple(
            f"{topology.gpus[i]}-{topology.gpus[j]} ({topology.peer_status(i, j)})"
            for i, j in topology.pairs_without_peer_access()
        )
    return MultiGpuInfo(
        gpu_count=gpu_count if gpu_count is not None else (len(topology.gpus) if topology else None),
        topology=topology.describe() if topology else None,
        topology_note=topology_note,
        nvlink=topology.all_nvlink if topology and topology.pairs else None,
        pairs_without_peer_access=peerless,
        cross_numa_pairs=tuple(pair_label(topology, [p]) for p in topology.cross_numa_pairs()) if topology else (),
        links=topology.links if topology else (),
        numa=topology.numa if topology else (),
        nccl=nccl,
        nccl_package=nccl_package,
        nccl_note=nccl_note,
        flashinfer_version=flashinfer_version,
        flashinfer_pcie_ipc=has_fi,
        flashinfer_note=fi_note,
        sglang_version=sglang_version,
        sglang_pcie_ipc=pcie_allreduce.tree_has(sglang_dir),
        enabled=pcie_allreduce.enabled(env),
        deterministic=pcie_allreduce.deterministic(env),
        nccl_env={k: v for k, v in env.items() if k.startswith("NCCL_")},
    )


def collect(
    torch_module: Any,
    sglang_path: str | None,
    sglang_version: str | None,
    flashinfer_path: str | None,
    flashinfer_version: str | None,
    env: Mapping[str, str],
) -> MultiGpuInfo:
    """Probe this machine: nvidia-smi's topology, torch's NCCL, the FlashInfer and SGLang installed."""
    topology, note = probe_topology()
    nccl, nccl_note = _nccl(torch_module)
    return from_facts(
        topology=topology,
        topology_note=note,
        gpu_count=_gpu_count(torch_module),
        nccl=nccl,
        nccl_note=nccl_note,
        nccl_package=_nccl_package(),
        flashinfer_dir=Path(flashinfer_path) if flashinfer_path else None,
        flashinfer_version=flashinfer_version,
        sglang_dir=Path(sglang_path) if sglang_path else None,
        sglang_version=sglang_version,
        env=env,
    )


def _nccl_package() -> str | None:
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        version = installed_version(name)
        if version:
            return f"{name} {version}"
    return None


def assess(info: MultiGpuInfo | None, judged: tuple[int, int]) -> list[Flag]:
    """Findings for a box of two or more GPUs of compute capability 12.x (``judged``); none otherwise."""
    if info is None or not info.gpu_count or info.gpu_count < 2 or not arch.is_sm12x(judged):
        return []
    flags: list[Flag] = []
    n = info.gpu_count
    lead = (
        f"This machine has {n} GPUs of compute capability {judged[0]}.{judged[1]}, which have no NVLink "
        f"({arch.NO_NVLINK.get(tuple(judged), 'PCIe only')}): with tensor parallelism their decode "
        "all-reduces would go to NCCL over PCIe"
    )
    if info.nvlink:
        flags.append(
            Flag(
                INFO,
                COMPONENT,
                f"nvidia-smi reports NVLink between every pair of the {n} GPUs; the PCIe findings below may not apply.",
            )
        )
    if n not in pcie_allreduce.WORLD_SIZES:
        flags.append(
            Flag(
                INFO,
                COMPONENT,
                f"FlashInfer's PCIe-IPC all-reduce serves 2, 4 or 8 ranks; with all {n} "
                "GPUs in one tensor-parallel group its decode all-reduces go to NCCL.",
                "Serve with --tp-size 2, 4 or 8.",
            )
        )
    if info.pairs_without_peer_access:
        flags.append(
            Flag(
                WARNING,
                COMPONENT,
                f"{lead}: GPU pairs without peer access "
                f"({', '.join(info.pairs_without_peer_access)}; nvidia-smi topo -p2p r) cannot use "
                "SGLang's custom all-reduce nor FlashInfer's PCIe-IPC kernels, which write into the other "
                "GPUs' memory.",
                "Only NCCL serves them: measure its settings on this box with `sm120kit bench-allreduce`.",
            )
        )
    if info.sglang_version is not None and info.sglang_pcie_ipc is None:
        fix = (
            f"`sm120kit apply` adds it to this release (patch {pcie_allreduce.BACKPORT_PATCH})"
            if pcie_allreduce.backport_covers(info.sglang_version)
            else f"SGLang {pcie_allreduce.FIRST_RELEASE} or newer has it"
        )
        flags.append(
            Flag(
                WARNING,
                COMPONENT,
                f"{lead}: SGLang {info.sglang_version} has no PCIe-IPC all-reduce.",
                f"{fix}; then set {pcie_allreduce.ENABLE_VAR}=1.",
            )
        )
    if info.flashinfer_pcie_ipc is not True and (info.sglang_pcie_ipc or info.enabled):
        flags.append(
            Flag(
                WARNING,
                COMPONENT,
                f"{lead}: {info.flashinfer_note}, so SGLang's PCIe-IPC all-reduce "
                "cannot run (it logs a warning and NCCL serves).",
                f"Install flashinfer-python>={pcie_allreduce.FLASHINFER_FIRST} (SGLang 0.5.22 pins 0.7.1, "
                "0.5.23 pins 0.7.2).",
            )
        )
    if info.sglang_pcie_ipc and not info.enabled:
        flags.append(
            Flag(
                WARNING,
                COMPONENT,
                f"{lead}: {pcie_allreduce.ENABLE_VAR} is not set in this "
                "environment, and SGLang's PCIe-IPC all-reduce is off without it.",
                f"Set {pcie_allreduce.ENABLE_VAR}=1 (the multi-GPU recipes do).",
            )
        )
    if info.sglang_pcie_ipc and info.enabled and info.deterministic:
        flags.append(
            Flag(
                WARNING,
                COMPONENT,
                f"{lead}: deterministic inference is on "
                f"({pcie_allreduce.DETERMINISTIC_VAR} or {pcie_allreduce.ONE_STAGE_VAR}), which keeps the "
                "PCIe-IPC all-reduce off.",
                "Unset it unless identical outputs from run to run are required.",
            )
        )
    if info.cross_numa_pairs:
        flags.append(
            Flag(
                INFO,
                COMPONENT,
                f"{len(info.cross_numa_pairs)} GPU pair(s) cross NUMA nodes (SYS: "
                f"{', '.join(info.cross_numa_pairs[:4])}{' ...' if len(info.cross_numa_pairs) > 4 else ''}); "
                "their traffic crosses the CPUs' interconnect.",
            )
        )
    return flags
