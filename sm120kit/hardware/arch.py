"""The GPU family model: what each NVIDIA compute capability offers, with sources.

Facts live here once; checks, audits and patches read them from here.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

SM120_SHARED_MEMORY_PER_BLOCK = 101376
"""Opt-in shared memory per block on 12.0/12.1 (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
the figure in Triton's "out of resource: shared memory ... Hardware limit: 101376" error."""


@dataclass(frozen=True)
class GpuFamily:
    name: str
    capability: tuple[int, int]
    shared_memory_per_block: int | None  # opt-in bytes per block
    sass_arch: str  # the arch-specific target nvcc and Triton emit (sm_XXa)
    min_cuda: tuple[int, int]  # on any platform; min_cuda() adds the per-platform table
    cards: tuple[str, ...]
    lacks: tuple[str, ...] = ()

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    @property
    def label(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


FAMILIES: dict[tuple[int, int], GpuFamily] = {
    f.capability: f
    for f in (
        GpuFamily("Ampere", (8, 0), 166912, "sm_80", (11, 0), ("A100",)),
        GpuFamily("Ada", (8, 9), 101376, "sm_89", (11, 8), ("L40S", "RTX 4090"), ("wgmma", "tma", "fp4")),
        GpuFamily("Hopper", (9, 0), 232448, "sm_90a", (12, 0), ("H100", "H200"), ("tcgen05", "tmem", "fp4")),
        GpuFamily("datacenter Blackwell", (10, 0), 232448, "sm_100a", (12, 8), ("B200", "GB200")),
        GpuFamily("datacenter Blackwell Ultra", (10, 3), 232448, "sm_103a", (12, 9), ("B300", "GB300")),
        GpuFamily(
            "consumer/workstation Blackwell",
            (12, 0),
            SM120_SHARED_MEMORY_PER_BLOCK,
            "sm_120a",
            (12, 8),
            ("RTX PRO 6000 Blackwell", "RTX 5090", "RTX 5080"),
            ("wgmma", "tcgen05", "tmem"),
        ),
        GpuFamily(
            "DGX Spark",
            (12, 1),
            SM120_SHARED_MEMORY_PER_BLOCK,
            "sm_121a",
            (12, 9),
            ("GB10",),
            ("wgmma", "tcgen05", "tmem"),
        ),
    )
}


def family(capability: tuple[int, int]) -> GpuFamily | None:
    return FAMILIES.get(tuple(capability))  # type: ignore[arg-type]


NO_NVLINK: dict[tuple[int, int], str] = {
    (12, 0): "the RTX PRO 6000 Blackwell and GeForce RTX 50 cards connect to each other over PCIe 5.0 x16 only",
    (12, 1): "GB10 (DGX Spark) is one GPU; two DGX Sparks connect over ConnectX-7 networking",
}
"""Capabilities none of whose cards has NVLink, with why: tensor parallelism on them runs every all-reduce over
PCIe (or the network). Sources: NVIDIA's product pages (https://www.nvidia.com/en-us/products/workstations/
professional-desktop-gpus/rtx-pro-6000/, https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/,
https://www.nvidia.com/en-us/products/workstations/dgx-spark/) list no NVLink for these cards, and the
RTX PRO 6000 community knowledge base describes 2-, 4- and 8-card boxes "in PCIe configurations without
NVLink" (https://github.com/voipmonitor/rtx6kpro)."""


def has_nvlink(capability: tuple[int, int]) -> bool | None:
    """False where no card of ``capability`` has NVLink (:data:`NO_NVLINK`); None where it depends on the card."""
    return False if tuple(capability) in NO_NVLINK else None


def is_sm12x(capability: tuple[int, int]) -> bool:
    """The SM120 family (12.0 RTX PRO 6000 Blackwell / RTX 5090, 12.1 DGX Spark): the one capability test every
    module uses."""
    return capability[0] == 12


def has_block_scaled_fp4(capability: tuple[int, int]) -> bool:
    """Block-scaled FP4 (NVFP4/MXFP4) MMA: datacenter Blackwell (10.x) and the SM120 family (12.x) have it,
    Hopper and older do not (PTX ISA, ``mma``/``tcgen05.mma`` with ``.block_scale``; the ``lacks`` column)."""
    return capability[0] in (10, 12)


SM12X_CAPABILITIES: tuple[tuple[int, int], ...] = tuple(c for c in FAMILIES if is_sm12x(c))
"""``((12, 0), (12, 1))``: the capabilities of the family sm120kit targets."""

SM12X_LABELS: tuple[str, ...] = tuple(FAMILIES[c].label for c in SM12X_CAPABILITIES)
"""``("12.0", "12.1")``: the capabilities of the family, as the audits and rule tables spell them."""


# -- minimum CUDA per architecture -------------------------------------------------------------------------

MIN_CUDA_BY_MACHINE: dict[tuple[int, int], dict[str, tuple[int, int]]] = {
    (12, 1): {"x86_64": (13, 0), "aarch64": (12, 9)},
}
"""Where the minimum CUDA release for a capability differs by platform (``platform.machine()``, normalised).
sm_121 wants CUDA 13 (the sm_121a targets of sgl-kernel's CMakeLists and the cu130 wheels); the DGX Spark's
aarch64 CUDA 12.9 already targets it. Capabilities not listed take ``GpuFamily.min_cuda``."""

MIN_CUDA_FAMILY_TARGET = (12, 9)
"""The ``f`` (family) targets such as ``sm_120f`` need CUDA >= 12.9 (nvcc 12.9 release notes)."""

FLASHINFER_JIT_MIN_CUDA_SM12X = (12, 9)
"""FlashInfer compiles its JIT kernels for SM12x only with CUDA >= 12.9 (its ``_normalize_cuda_arch``)."""

_MACHINES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def normalize_machine(machine: str | None = None) -> str:
    """``platform.machine()`` (or ``machine``) in the spelling of :data:`MIN_CUDA_BY_MACHINE`."""
    raw = (machine or platform.machine()).lower()
    return _MACHINES.get(raw, raw)


def min_cuda(capability: tuple[int, int], *, variant: str = "", machine: str | None = None) -> tuple[int, int] | None:
    """The oldest CUDA release whose tools target ``capability`` (with ``variant`` "a"/"f") on ``machine``
    (default: this one); None for a capability without a family here. Sources: the ``GpuFamily`` table,
    :data:`MIN_CUDA_BY_MACHINE`, :data:`MIN_CUDA_FAMILY_TARGET`."""
    capability = (int(capability[0]), int(capability[1]))
    fam = family(capability)
    if fam is None:
        return None
    need = fam.min_cuda
    by_machine = MIN_CUDA_BY_MACHINE.get(capability)
    if by_machine:
        need = by_machine.get(normalize_machine(machine), max(by_machine.values()))
    if variant == "f":
        need = max(need, MIN_CUDA_FAMILY_TARGET)
    return need


# -- architecture names -----------------------------------------------------------------------------------

KNOWN_CAPABILITIES: tuple[tuple[int, int], ...] = (
    (3, 0),
    (3, 2),
    (3, 5),
    (3, 7),
    (5, 0),
    (5, 2),
    (5, 3),
    (6, 0),
    (6, 1),
    (6, 2),
    (7, 0),
    (7, 2),
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 7),
    (8, 8),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 1),
    (10, 3),
    (11, 0),
    (12, 0),
    (12, 1),
)
"""Every compute capability NVIDIA has shipped or nvcc targets (CUDA C Programming Guide, "Compute
Capabilities"; ``nvcc --list-gpu-arch`` of CUDA 12.x and 13.0, where 10.1 became 11.0)."""

ACCEPTED_FORMS = "12.0, 12.0a, 12.0f, 120, 120a, sm_120a, compute_120a"

_ARCH_RE = re.compile(r"(?:(?P<prefix>sm|compute|lto)_)?(?P<num>\d+(?:\.\d+)?)(?P<variant>[af]?)(?P<ptx>\+ptx)?")


class NotAnArch(ValueError):
    """A string that is not an architecture name, or names no known compute capability. A ValueError: the
    command line turns it into a UsageError naming its option (every error class keeps its own exit code)."""

    @property
    def message(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Arch:
    """One architecture name, as written: ``sm_120a`` -> capability (12, 0), variant "a", prefix "sm"."""

    capability: tuple[int, int]
    variant: str = ""  # "" | "a" (arch-specific) | "f" (family)
    prefix: str = ""  # "sm" | "compute" | "lto" | "" (a bare number such as 12.0)
    plus_ptx: bool = False  # TORCH_CUDA_ARCH_LIST's "9.0+PTX"

    @property
    def major(self) -> int:
        return self.capability[0]

    @property
    def minor(self) -> int:
        return self.capability[1]

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor

    @property
    def label(self) -> str:
        return f"{self.major}.{self.minor}{self.variant}"

    @property
    def sass(self) -> str:
        return f"sm_{self.sm}{self.variant}"

    @property
    def ptx(self) -> str:
        return f"compute_{self.sm}{self.variant}"


def _refuse(text: str, why: str) -> NotAnArch:
    known = ", ".join(f"{a}.{b}" for a, b in KNOWN_CAPABILITIES)
    return NotAnArch(
        f"{text!r} {why}. An architecture is written as one of {ACCEPTED_FORMS} (a, f: the "
        f"arch-specific and family targets), for a known NVIDIA compute capability: {known}."
    )


def parse_arch(text: str, *, known_only: bool = True, allow_plus_ptx: bool = False) -> Arch:
    """The one parser of architecture names: ``"12.0"``, ``"12.0a"``, ``"120"``, ``"sm_120a"``,
    ``"compute_120a"`` (and ``"lto_120"``; ``"9.0+PTX"`` with ``allow_plus_ptx``) -> :class:`Arch`.

    ``known_only`` (the default) refuses capabilities not in :data:`KNOWN_CAPABILITIES` (``"99"``, ``"12.7"``);
    readers of compiled target lists pass False so a newer target than this table does not stop them.
    Raises :class:`NotAnArch` (a ValueError).
    """
    m = _ARCH_RE.fullmatch(str(text).strip().lower())
    num = m.group("num") if m is not None and (allow_plus_ptx or not m.group("ptx")) else ""
    if "." in num:
        major_s, minor_s = num.split(".", 1)
        capability = (int(major_s), int(minor_s))
    elif len(num) in (2, 3):
        capability = (int(num[:-1]), int(num[-1]))
    else:
        raise _refuse(str(text), "is not a target GPU architecture: not a compute capability or architecture name")
    if known_only and capability not in KNOWN_CAPABILITIES:
        raise _refuse(
            str(text), f"names compute capability {capability[0]}.{capability[1]}, which is not a known NVIDIA one"
        )
    return Arch(capability, m.group("variant"), m.group("prefix") or "", bool(m.group("ptx")))


def parse_capability(text: str, *, known_only: bool = True) -> tuple[int, int]:
    """``"12.0"``, ``"12.1a"``, ``"120"`` or ``"sm_120a"`` -> ``(12, 0)``; :class:`NotAnArch` (a ValueError)
    otherwise."""
    return parse_arch(text, known_only=known_only).capability
