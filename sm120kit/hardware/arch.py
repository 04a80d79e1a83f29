"""The GPU family model: what each NVIDIA compute capability offers, with sources.

Facts live here once; checks, audits and patches read them from here.
"""

from __future__ import annotations

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
    min_cuda: tuple[int, int]
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
        GpuFamily("consumer/workstation Blackwell", (12, 0), SM120_SHARED_MEMORY_PER_BLOCK, "sm_120a", (12, 8),
                  ("RTX PRO 6000 Blackwell", "RTX 5090", "RTX 5080"), ("wgmma", "tcgen05", "tmem")),
        GpuFamily("DGX Spark", (12, 1), SM120_SHARED_MEMORY_PER_BLOCK, "sm_121a", (12, 9),
                  ("GB10",), ("wgmma", "tcgen05", "tmem")),
    )
}


def family(capability: tuple[int, int]) -> GpuFamily | None:
    return FAMILIES.get(tuple(capability))  # type: ignore[arg-type]


def is_sm12x(capability: tuple[int, int]) -> bool:
    return capability[0] == 12


def parse_capability(text: str) -> tuple[int, int]:
    """``"12.0"``, ``"12.1a"``, ``"120"`` or ``"sm_120a"`` -> ``(12, 0)``; ValueError otherwise."""
    raw = text.strip().lower().removeprefix("sm_").removeprefix("compute_").rstrip("af")
    if "." in raw:
        major, minor = raw.split(".", 1)
        return int(major), int(minor)
    if raw.isdigit() and len(raw) in (2, 3):
        return int(raw[:-1]), int(raw[-1])
    raise ValueError(f"not a compute capability: {text!r}")
