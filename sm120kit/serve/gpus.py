"""GPUs: what ``nvidia-smi`` lists, and the warnings when it differs from what a recipe was written for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sm120kit import runner
from sm120kit.hardware import arch
from sm120kit.serve.recipe import GpuSpec


@dataclass(frozen=True)
class ListedGpu:
    """One GPU as a line of ``nvidia-smi`` lists it (no torch needed; the capability is None on drivers before
    510)."""

    name: str
    capability: tuple[int, int] | None
    memory_mib: int | None = None

    def to_json(self) -> dict:
        cap = f"{self.capability[0]}.{self.capability[1]}" if self.capability else None
        return {"name": self.name, "capability": cap, "memory_mib": self.memory_mib}


def detect_gpus() -> tuple[ListedGpu, ...] | None:
    """The NVIDIA GPUs ``nvidia-smi`` lists; None when nvidia-smi is absent or fails (no driver)."""
    if runner.which("nvidia-smi") is None:
        return None
    result = None
    # compute_cap is a query field of drivers from 510 on; older ones reject the whole query.
    for fields in ("name,compute_cap,memory.total", "name,memory.total"):
        result = runner.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            check=False,
            timeout=60,
            what="nvidia-smi",
        )
        if result.ok:
            break
    if result is None or not result.ok:
        return None
    with_cap = "compute_cap" in result.argv[1]
    gpus = []
    for line in result.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not parts or not parts[0]:
            continue
        cap = None
        if with_cap and len(parts) > 1:
            try:
                cap = arch.parse_capability(parts[1])
            except ValueError:
                cap = None
        mem_text = parts[2 if with_cap else 1] if len(parts) > (2 if with_cap else 1) else ""
        gpus.append(ListedGpu(parts[0], cap, int(mem_text) if mem_text.isdigit() else None))
    return tuple(gpus)


def check_gpus(spec: GpuSpec, found: Sequence[ListedGpu] | None) -> list[str]:
    """Warnings when the GPUs present do not match what the recipe was written for."""
    if found is None:
        return [f"no NVIDIA GPU found (nvidia-smi is not on PATH or failed); the recipe expects {spec.label}."]
    warnings = []
    if len(found) < spec.count:
        warnings.append(f"{len(found)} GPU(s) found, the recipe expects {spec.count} ({spec.label}).")
    for i, gpu in enumerate(found[: spec.count]):
        if not any(n.lower() in gpu.name.lower() for n in spec.names):
            warnings.append(f"GPU {i} is '{gpu.name}', the recipe was written for {' / '.join(spec.names)}.")
        if gpu.capability is not None and gpu.capability != spec.capability:
            have = f"{gpu.capability[0]}.{gpu.capability[1]}"
            want = f"{spec.capability[0]}.{spec.capability[1]}"
            warnings.append(f"GPU {i} has compute capability {have}, the recipe is for {want}.")
    return warnings
