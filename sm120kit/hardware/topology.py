"""How the GPUs of one machine are connected: NVLink or PCIe, peer access between each pair, the NUMA split.

The facts come from ``nvidia-smi topo -m`` (the link matrix: ``NV#`` bonded NVLinks, or the PCIe path
``PIX``/``PXB``/``PHB``/``NODE``/``SYS``, and each GPU's CPU and NUMA affinity) and ``nvidia-smi topo -p2p r``
(whether each pair may read the other's memory directly: ``OK``, or why not, e.g. ``GNS`` "GPU not
supported" on GeForce cards). :func:`parse_link_matrix` and :func:`parse_peer_matrix` read that output
(pure functions, tested on the format nvidia-smi prints); :func:`probe_topology` runs the two commands
through :mod:`sm120kit.runner`. Nothing here knows about SGLang or NCCL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sm120kit import runner

# nvidia-smi's legend for the link matrix (the words it prints under "Legend:").
LINK_MEANING = {
    "X": "the GPU itself",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (e.g. QPI/UPI)",
    "NODE": "PCIe and the interconnect between PCIe host bridges within a NUMA node",
    "PHB": "PCIe and a PCIe host bridge (typically the CPU)",
    "PXB": "multiple PCIe bridges, without the PCIe host bridge",
    "PIX": "at most a single PCIe bridge",
    "NV#": "a bonded set of # NVLinks",
}
# and for the peer matrix (-p2p)
PEER_MEANING = {
    "X": "the GPU itself",
    "OK": "peer access works",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by registry key",
    "U": "unknown",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")
_NVLINK = re.compile(r"^NV(\d+)$")
MAX_OUTPUT = 1 << 20  # bytes of nvidia-smi output read (a machine has at most a few dozen devices)


def _lines(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in text[:MAX_OUTPUT].splitlines()]


def _matrix(text: str) -> tuple[list[str], list[list[str]]]:
    """(device column names, rows of tokens starting with ``GPUn``) of nvidia-smi's matrix output. The header
    is the first line that starts with a device name and has no ``X`` (every row has one, on its diagonal)."""
    header: list[str] | None = None
    rows: list[list[str]] = []
    for line in _lines(text):
        tokens = line.split()
        if not tokens:
            if rows:
                break
            continue
        if tokens[0] == "Legend:":
            break
        if header is None:
            if _DEVICE.match(tokens[0]) and "X" not in tokens:
                header = [t for t in tokens if _DEVICE.match(t)]
            continue
        if re.match(r"^GPU\d+$", tokens[0]):
            rows.append(tokens)
    if header is None:
        raise ValueError("no matrix header (a line of GPU0 GPU1 ... column names) in the nvidia-smi output")
    return header, rows


def parse_link_matrix(
    text: str,
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...], tuple[str | None, ...], tuple[int | None, ...]]:
    """``nvidia-smi topo -m`` -> (GPU names, the GPU-to-GPU link labels, each GPU's CPU affinity, NUMA node).

    NIC columns are left out. ValueError when the text holds no such matrix."""
    header, rows = _matrix(text)
    gpu_columns = [i for i, name in enumerate(header) if name.startswith("GPU")]
    names: list[str] = []
    links: list[tuple[str, ...]] = []
    affinity: list[str | None] = []
    numa: list[int | None] = []
    for tokens in rows:
        cells = tokens[1:]
        if len(cells) < len(header):
            raise ValueError(f"the row of {tokens[0]} has {len(cells)} cells for {len(header)} devices")
        names.append(tokens[0])
        links.append(tuple(cells[i] for i in gpu_columns))
        rest = cells[len(header) :]
        affinity.append(rest[0] if rest and rest[0] != "N/A" else None)
        numa.append(int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None)
    if not names:
        raise ValueError("the nvidia-smi matrix lists no GPU rows")
    if len(names) != len(gpu_columns):
        raise ValueError(f"the matrix has {len(names)} GPU rows for {len(gpu_columns)} GPU columns")
    return tuple(names), tuple(links), tuple(affinity), tuple(numa)


def parse_peer_matrix(text: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """``nvidia-smi topo -p2p r`` -> (GPU names, status labels: ``X``, ``OK``, ``GNS`` ...)."""
    header, rows = _matrix(text)
    names = tuple(tokens[0] for tokens in rows)
    if len(names) != len(header):
        raise ValueError(f"the peer matrix has {len(names)} rows for {len(header)} columns")
    return names, tuple(tuple(tokens[1 : 1 + len(header)]) for tokens in rows)


def nvlinks(label: str) -> int:
    """The NVLink count of a link label (``NV18`` -> 18), 0 for a PCIe path."""
    match = _NVLINK.match(label)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class GpuTopology:
    gpus: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]  # links[i][j]: nvidia-smi's label for the path from GPU i to GPU j
    cpu_affinity: tuple[str | None, ...]
    numa: tuple[int | None, ...]
    peer: tuple[tuple[str, ...], ...] | None = None  # -p2p r labels; None when that could not be read
    source: str = "nvidia-smi topo -m"

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(len(self.gpus)) for j in range(i + 1, len(self.gpus))]

    @property
    def all_nvlink(self) -> bool:
        """Every pair of GPUs is joined by NVLink (False for a single GPU)."""
        return bool(self.pairs) and all(nvlinks(self.links[i][j]) for i, j in self.pairs)

    @property
    def any_nvlink(self) -> bool:
        return any(nvlinks(self.links[i][j]) for i, j in self.pairs)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for n in self.numa if n is not None}))

    def cross_numa_pairs(self) -> list[tuple[int, int]]:
        return [(i, j) for i, j in self.pairs if self.links[i][j] == "SYS"]

    def peer_status(self, i: int, j: int) -> str | None:
        return self.peer[i][j] if self.peer is not None else None

    def pairs_without_peer_access(self) -> list[tuple[int, int]]:
        if self.peer is None:
            return []
        return [(i, j) for i, j in self.pairs if self.peer[i][j] != "OK" or self.peer[j][i] != "OK"]

    def describe(self) -> str:
        """One line: the kinds of links, peer access and the NUMA split."""
        kinds = sorted({self.links[i][j] for i, j in self.pairs})
        text = f"{len(self.gpus)} GPU(s)"
        if self.pairs:
            text += (
                "; links "
                + ", ".join(kinds)
                + (" (NVLink)" if self.all_nvlink else " (PCIe only)" if not self.any_nvlink else " (partly NVLink)")
            )
        if self.peer is not None and self.pairs:
            missing = self.pairs_without_peer_access()
            text += (
                "; peer access between every pair"
                if not missing
                else f"; no peer access for {len(missing)} of {len(self.pairs)} pair(s) "
                f"({', '.join(sorted({self.peer[i][j] for i, j in missing}))})"
            )
        if self.numa_nodes:
            text += f"; NUMA node(s) {', '.join(map(str, self.numa_nodes))}"
        return text

    def to_json(self) -> dict:
        return {
            "gpus": list(self.gpus),
            "links": [list(r) for r in self.links],
            "cpu_affinity": list(self.cpu_affinity),
            "numa": list(self.numa),
            "peer": [list(r) for r in self.peer] if self.peer is not None else None,
            "all_nvlink": self.all_nvlink,
            "any_nvlink": self.any_nvlink,
            "cross_numa_pairs": [list(p) for p in self.cross_numa_pairs()],
            "pairs_without_peer_access": [list(p) for p in self.pairs_without_peer_access()],
            "summary": self.describe(),
            "source": self.source,
        }


def topology_from_text(matrix: str, peer: str | None = None) -> GpuTopology:
    """A :class:`GpuTopology` from the two commands' output (``peer`` None: not read). ValueError on text that
    is not nvidia-smi's matrix, or a peer matrix for other GPUs."""
    names, links, affinity, numa = parse_link_matrix(matrix)
    peer_rows = None
    source = "nvidia-smi topo -m"
    if peer is not None:
        peer_names, peer_rows = parse_peer_matrix(peer)
        if peer_names != names:
            raise ValueError(f"the peer matrix lists {', '.join(peer_names)}, the link matrix {', '.join(names)}")
        source += ", nvidia-smi topo -p2p r"
    return GpuTopology(names, links, affinity, numa, peer_rows, source)


def probe_topology(timeout: float = 60) -> tuple[GpuTopology | None, str]:
    """This machine's topology from nvidia-smi, or (None, why not). Never raises for a missing or failing
    nvidia-smi; the peer matrix is optional (older drivers lack ``-p2p``)."""
    if runner.which("nvidia-smi") is None:
        return None, "nvidia-smi is not on PATH (no NVIDIA driver here)"
    matrix = runner.run(["nvidia-smi", "topo", "-m"], check=False, timeout=timeout, what="nvidia-smi topo -m")
    if not matrix.ok:
        tail = (matrix.stderr or matrix.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"nvidia-smi topo -m failed (exit {matrix.returncode}: {tail[0]})"
    peer = runner.run(["nvidia-smi", "topo", "-p2p", "r"], check=False, timeout=timeout, what="nvidia-smi topo -p2p")
    try:
        return topology_from_text(matrix.stdout, peer.stdout if peer.ok else None), ""
    except ValueError as exc:
        if peer.ok:
            try:
                return topology_from_text(matrix.stdout), f"the peer matrix was not read: {exc}"
            except ValueError:
                pass
        return None, f"nvidia-smi topo -m printed no readable matrix: {exc}"


def pair_label(topology: GpuTopology, pairs: Sequence[tuple[int, int]]) -> str:
    """``GPU0-GPU1, GPU2-GPU3``."""
    return ", ".join(f"{topology.gpus[i]}-{topology.gpus[j]}" for i, j in pairs)
