"""Register counts of compiled kernels, read from their cubin with ``cuobjdump --dump-resource-usage``.

``cuobjdump`` comes with a CUDA toolkit, with the ``nvidia-cuda-cuobjdump`` wheel, and inside Triton's
wheel (``triton/backends/nvidia/bin``). Without one, counts are simply not reported.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sm120kit import runner

_FUNCTION_RE = re.compile(r"^\s*Function\s+(\S+?):?\s*$")
_FIELD_RE = re.compile(r"([A-Z_]+(?:\[\d+\])?):(\d+)")


@dataclass(frozen=True)
class ResourceUsage:
    registers: int
    stack: int
    local: int  # bytes of local memory per thread (spills land here)
    shared: int  # static shared memory only; Triton's dynamic shared memory is metadata.shared


def find_cuobjdump() -> str | None:
    """``$SM120KIT_CUOBJDUMP``, Triton's bundled copy, the pip package's, or one on PATH."""
    env = os.environ.get("SM120KIT_CUOBJDUMP")
    if env:
        return env
    candidates: list[Path] = []
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    try:
        import nvidia.cuda_cuobjdump as pkg  # the nvidia-cuda-cuobjdump wheel

        candidates.append(Path(list(pkg.__path__)[0]) / "bin" / "cuobjdump")
    except ImportError:
        pass
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return runner.which("cuobjdump")


def parse_resource_usage(text: str) -> dict[str, ResourceUsage]:
    """Parse ``cuobjdump --dump-resource-usage`` output: one entry per function."""
    result: dict[str, ResourceUsage] = {}
    current: str | None = None
    for line in text.splitlines():
        match = _FUNCTION_RE.match(line)
        if match:
            current = match.group(1)
            continue
        if current and "REG:" in line:
            fields = dict(_FIELD_RE.findall(line))
            result[current] = ResourceUsage(
                registers=int(fields.get("REG", 0)),
                stack=int(fields.get("STACK", 0)),
                local=int(fields.get("LOCAL", 0)),
                shared=int(fields.get("SHARED", 0)),
            )
            current = None
    return result


def resource_usage(cubin: bytes, cuobjdump: str | None = None) -> dict[str, ResourceUsage] | None:
    """Resource usage of every function in ``cubin``; None when no cuobjdump is available."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None or not cubin:
        return None
    with tempfile.TemporaryDirectory(prefix="sm120kit-cubin-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        result = runner.run([tool, "--dump-resource-usage", str(path)], what="cuobjdump", timeout=120)
    return parse_resource_usage(result.stdout)
