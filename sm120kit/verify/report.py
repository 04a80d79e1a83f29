"""The environment report of ``sm120kit verify``: what is installed, what the GPU is, and what does not fit.

:func:`collect_report` probes this machine (GPU, driver, CUDA tools, torch, Triton, SGLang, sgl_kernel,
FlashInfer, environment variables) and returns an :class:`EnvironmentReport`. The probing functions only
gather facts; :func:`assess` turns the facts into :class:`Flag` findings and is a pure function, so the
decision logic is tested with faked devices on machines without a GPU.

Every finding is judged against one compute capability: the GPU present, else SM120 (12.0, the family
this tool exists for), else the one given with ``--arch``. The rules come from :mod:`sm120kit.hardware.arch`
(minimum CUDA release, the arch-specific target) and from how binary code is matched to a GPU:

* SASS for ``sm_XY`` runs on a GPU of the same major version with minor >= Y (``sm_120`` runs on 12.1);
  ``sm_XYa`` only on exactly X.Y; ``sm_XYf`` on the same major version with minor >= Y.
* PTX for ``compute_XY`` is compiled by the driver for any GPU >= X.Y; ``a``/``f`` PTX follows the SASS
  rules of its suffix.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sm120kit import runner
from sm120kit.errors import MissingDependency, NotSglangTree, Sm120kitError, ToolFailed
from sm120kit.hardware import arch
from sm120kit.sglang import mla_kernels
from sm120kit.sglang.metadata import dist_metadata_files, installed_version, version_in_file
from sm120kit.verify.flag import ERROR, INFO, WARNING, Flag  # noqa: F401 (re-exported for the report's users)

ENV_NAMES = (
    "TORCH_CUDA_ARCH_LIST",
    "FLASHINFER_CUDA_ARCH_LIST",
    "TRITON_PTXAS_PATH",
    "TRITON_PTXAS_BLACKWELL_PATH",
    "CUDA_HOME",
    "CUDA_VISIBLE_DEVICES",
)
ENV_PREFIXES = ("SGLANG_", "NCCL_", "SGL_")


# -- architecture names and binary compatibility ---------------------------------------------------------


@dataclass(frozen=True)
class ArchEntry:
    """One compiled target: ``sm_120a`` SASS, ``compute_90`` PTX, FlashInfer's ``12.0f`` ..."""

    capability: tuple[int, int]
    suffix: str  # "" | "a" | "f"
    kind: str  # "sass" | "ptx"

    @property
    def name(self) -> str:
        prefix = "sm" if self.kind == "sass" else "compute"
        return f"{prefix}_{self.capability[0]}{self.capability[1]}{self.suffix}"


def parse_arch_entries(text: str, *, kind: str | None = None) -> list[ArchEntry]:
    """Parse one arch name in any of the spellings the tools use (:func:`sm120kit.hardware.arch.parse_arch`).

    ``sm_120a`` and ``12.0a`` are SASS, ``compute_120`` is PTX, ``9.0+PTX`` (TORCH_CUDA_ARCH_LIST) is both.
    ``kind`` overrides the kind (the fat-binary reader names PTX entries ``sm_XY`` as cuobjdump does).
    Targets newer than sm120kit's table of capabilities are kept. ValueError for anything else.
    """
    parsed = arch.parse_arch(text, known_only=False, allow_plus_ptx=True)
    base_kind = kind or ("ptx" if parsed.prefix == "compute" else "sass")
    entries = [ArchEntry(parsed.capability, parsed.variant, base_kind)]
    if parsed.plus_ptx:
        entries.append(ArchEntry(parsed.capability, parsed.variant, "ptx"))
    return entries


def parse_arch_list(items: str | Iterable[str], *, kind: str | None = None) -> list[ArchEntry]:
    """A list of arch names: ``torch.cuda.get_arch_list()``, or a ``"8.0;9.0+PTX 12.0a"`` string."""
    if isinstance(items, str):
        items = [p for p in re.split(r"[;,\s]+", items) if p]
    entries: list[ArchEntry] = []
    for item in items:
        entries.extend(parse_arch_entries(item, kind=kind))
    return entries


def runs_on(entry: ArchEntry, capability: tuple[int, int]) -> bool:
    """Whether code compiled for ``entry`` can run on a GPU of ``capability`` (rules in the module doc)."""
    major, minor = capability
    e_major, e_minor = entry.capability
    if entry.suffix == "a":
        return entry.capability == tuple(capability)
    if entry.kind == "ptx" and not entry.suffix:
        return (e_major, e_minor) <= (major, minor)
    return e_major == major and e_minor <= minor


def covering(entries: Sequence[ArchEntry], capability: tuple[int, int]) -> list[ArchEntry]:
    return [e for e in entries if runs_on(e, capability)]


# -- tool versions -----------------------------------------------------------------------------------------

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+)(?:, V([\d.]+))?")


def parse_cuda_tool_version(text: str) -> tuple[tuple[int, int] | None, str | None]:
    """``nvcc --version`` / ``ptxas --version`` output -> ``((13, 0), "13.0.88")``; ``(None, None)`` if absent."""
    match = _RELEASE_RE.search(text or "")
    if not match:
        return None, None
    release = (int(match.group(1)), int(match.group(2)))
    return release, match.group(3) or f"{release[0]}.{release[1]}"


def parse_version_tuple(text: str | None) -> tuple[int, int] | None:
    """``"12.8"`` / ``"13.0.1"`` / ``"2.11.0+cu130"`` -> ``(12, 8)``; None when unparsable."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def fmt_version(version: tuple[int, int] | None) -> str:
    return f"{version[0]}.{version[1]}" if version else "?"


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change how SGLang, its kernels and NCCL behave on a GPU."""
    picked = {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(sorted(picked.items()))


# -- the report's parts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchGpu:
    """The visible GPU as torch in this process reports it, with the shared-memory figures the report judges."""

    index: int
    name: str
    capability: tuple[int, int]
    platform: str  # "cuda" | "hip"
    shared_memory_per_block_optin: int | None  # from the device
    known_shared_memory_per_block: int | None  # sm120kit.hardware.arch's figure for the family
    family: str | None
    sm_count: int | None
    total_memory: int | None

    @property
    def label(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


@dataclass(frozen=True)
class DriverInfo:
    version: str | None  # "580.159.04"
    cuda_version: tuple[int, int] | None  # the newest CUDA the driver supports (cuDriverGetVersion)
    source: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ToolInfo:
    name: str
    path: str | None
    release: tuple[int, int] | None = None
    version: str | None = None
    source: str | None = None  # "PATH", "TRITON_PTXAS_PATH", "bundled with triton" ...
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.path is not None and self.release is not None


@dataclass(frozen=True)
class TorchInfo:
    version: str | None
    cuda: str | None  # torch.version.cuda: the CUDA runtime torch was built with
    hip: str | None
    arch_list: tuple[str, ...] = ()
    error: str | None = None

    @property
    def installed(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class PackageInfo:
    name: str
    version: str | None
    location: str | None = None
    error: str | None = None

    @property
    def installed(self) -> bool:
        return self.version is not None or self.location is not None


@dataclass(frozen=True)
class LibraryInfo:
    path: str  # relative to the package folder
    sass: tuple[str, ...] = ()
    ptx: tuple[str, ...] = ()
    loaded_by_loader: bool = False
    error: str | None = None


@dataclass(frozen=True)
class SglKernelInfo:
    version: str | None
    location: str | None
    variant: str | None = None  # "sm90" | "sm100" | "" (top-level fallback)
    variant_library: str | None = None  # the library the loader would load on the judged GPU
    variant_reason: str | None = None
    libraries: tuple[LibraryInfo, ...] = ()
    archs_note: str | None = None  # why the SASS lists are missing, when they are

    @property
    def installed(self) -> bool:
        return self.location is not None


@dataclass(frozen=True)
class FlashInferInfo:
    version: str | None
    location: str | None = None
    jit_archs: tuple[str, ...] = ()
    jit_archs_source: str | None = None
    prebuilt: tuple[str, ...] = ()  # flashinfer-cubin / flashinfer-jit-cache "name version"
    error: str | None = None

    @property
    def installed(self) -> bool:
        return self.version is not None or self.location is not None


@dataclass(frozen=True)
class SglangInfo:
    version: str | None
    path: str | None = None
    kind: str | None = None
    patch_state: Any = None  # whatever the patch engine reports, as JSON
    patch_summary: str | None = None
    error: str | None = None
    pins: dict[str, str] = field(default_factory=dict)  # "torch" -> "==2.14.1", from the release's metadata

    @property
    def installed(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class EnvironmentReport:
    judged_for: tuple[int, int]
    judged_reason: str
    gpu: TorchGpu | None
    gpu_note: str
    driver: DriverInfo
    nvcc: ToolInfo
    ptxas: ToolInfo
    triton_ptxas: ToolInfo
    torch: TorchInfo
    triton: PackageInfo
    sglang: SglangInfo
    sgl_kernel: SglKernelInfo
    flashinfer: FlashInferInfo
    env: dict[str, str] = field(default_factory=dict)
    flags: tuple[Flag, ...] = ()
    multi_gpu: Any = None  # sm120kit.verify.topology.MultiGpuInfo: topology, NCCL, the PCIe-IPC all-reduce

    @property
    def errors(self) -> list[Flag]:
        return [f for f in self.flags if f.severity == ERROR]

    def to_json(self) -> dict:
        data = asdict(self)
        data["judged_for"] = f"{self.judged_for[0]}.{self.judged_for[1]}"
        return data


# -- probes (side effects: imports, subprocesses, file reads) -----------------------------------------------


def probe_torch() -> tuple[TorchInfo, Any]:
    """torch's version, CUDA/HIP build and arch list; also returns the module (None if missing)."""
    try:
        import torch
    except ImportError as exc:
        return TorchInfo(None, None, None, error=f"torch is not importable: {exc}"), None
    try:
        arch_list = tuple(torch.cuda.get_arch_list())
    except Exception as exc:  # a CPU build can raise instead of returning []
        arch_list = ()
        return TorchInfo(
            torch.__version__,
            torch.version.cuda,
            getattr(torch.version, "hip", None),
            arch_list,
            error=f"torch.cuda.get_arch_list() failed: {exc}",
        ), torch
    return TorchInfo(str(torch.__version__), torch.version.cuda, getattr(torch.version, "hip", None), arch_list), torch


def probe_gpu(torch_module: Any) -> tuple[TorchGpu | None, str]:
    """The first visible GPU as torch sees it, or None with the reason."""
    if torch_module is None:
        return None, "torch is not installed, so no GPU can be queried"
    try:
        if not torch_module.cuda.is_available():
            return None, "no GPU: torch.cuda.is_available() is False"
        index = torch_module.cuda.current_device()
        props = torch_module.cuda.get_device_properties(index)
        capability = tuple(torch_module.cuda.get_device_capability(index))
    except Exception as exc:
        return None, f"no GPU: querying the device failed ({type(exc).__name__}: {exc})"
    platform = "hip" if getattr(torch_module.version, "hip", None) else "cuda"
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if optin is None:
        optin = _triton_max_shared(index)
    fam = arch.family(capability) if platform == "cuda" else None
    return TorchGpu(
        index=index,
        name=str(props.name),
        capability=(int(capability[0]), int(capability[1])),
        platform=platform,
        shared_memory_per_block_optin=int(optin) if optin is not None else None,
        known_shared_memory_per_block=fam.shared_memory_per_block if fam else None,
        family=fam.name if fam else None,
        sm_count=getattr(props, "multi_processor_count", None),
        total_memory=getattr(props, "total_memory", None),
    ), ""


def _triton_max_shared(index: int) -> int | None:
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:
        return None


_NVRM_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver_version_file(text: str) -> str | None:
    """``/proc/driver/nvidia/version`` -> ``"580.159.04"``."""
    match = _NVRM_RE.search(text or "")
    return match.group(1) if match else None


def probe_driver() -> DriverInfo:
    version = source = None
    proc = Path("/proc/driver/nvidia/version")
    try:
        version = parse_driver_version_file(proc.read_text(errors="replace"))
        source = str(proc) if version else None
    except OSError:
        pass
    if version is None and runner.which("nvidia-smi"):
        try:
            result = runner.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                check=False,
                timeout=60,
                what="nvidia-smi",
            )
            line = result.stdout.strip().splitlines()[0].strip() if result.ok and result.stdout.strip() else ""
            if line:
                version, source = line, "nvidia-smi"
        except Sm120kitError:
            pass
    cuda_version = None
    error = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value:
            cuda_version = (value.value // 1000, (value.value % 1000) // 10)
    except OSError:
        error = "no NVIDIA driver library (libcuda.so.1) on this machine"
    if version is None and error is None:
        error = "the driver version could not be read (/proc/driver/nvidia/version, nvidia-smi)"
    return DriverInfo(version, cuda_version, source, error)


def probe_tool(name: str, path: str | None = None, source: str | None = None) -> ToolInfo:
    """Run ``<tool> --version`` (through :mod:`sm120kit.runner`) and parse its CUDA release."""
    found = path or runner.which(name)
    if not found:
        return ToolInfo(name, None, error=f"{name} is not on PATH")
    try:
        result = runner.run([found, "--version"], check=False, timeout=60, what=f"{name} --version")
    except (MissingDependency, ToolFailed) as exc:
        return ToolInfo(name, found, source=source, error=exc.message)
    release, version = parse_cuda_tool_version(result.stdout + "\n" + result.stderr)
    if release is None:
        tail = (result.stdout or result.stderr).strip().splitlines()[-1:] or ["no output"]
        return ToolInfo(name, found, source=source, error=f"{found} --version printed no CUDA release ({tail[0]})")
    return ToolInfo(name, found, release, version, source or "PATH")


def triton_ptxas_choice(
    triton_dir: Path, sm: int, environ: Mapping[str, str], has_blackwell_knob: bool
) -> tuple[str, str, str]:
    """Which ptxas Triton runs for ``sm``: ``(path, source, env var consulted)``.

    Triton >= 3.6 has a second bundled assembler, ``ptxas-blackwell`` (``TRITON_PTXAS_BLACKWELL_PATH``),
    and uses it for every target >= sm_90; older releases use ``ptxas`` (``TRITON_PTXAS_PATH``) for all.
    An environment variable wins when it names a runnable file; Triton falls back to its bundled binary
    otherwise.
    """
    bin_dir = triton_dir / "backends" / "nvidia" / "bin"
    if has_blackwell_knob and sm >= 90 and (bin_dir / "ptxas-blackwell").exists():
        binary, key = "ptxas-blackwell", "TRITON_PTXAS_BLACKWELL_PATH"
    else:
        binary, key = "ptxas", "TRITON_PTXAS_PATH"
    override = environ.get(key)
    if override and os.access(override, os.X_OK):
        return override, key, key
    return str(bin_dir / binary), "bundled with triton" + (f" ({key} names no runnable file)" if override else ""), key


def _triton_own_choice(sm: int) -> str | None:
    """The ptxas path Triton's own NVIDIA backend picks for ``sm`` (``get_ptxas``), when it has that API."""
    try:
        import inspect

        from triton.backends.nvidia import compiler as nv_compiler

        get_ptxas = getattr(nv_compiler, "get_ptxas", None)
        if get_ptxas is None:
            return None
        tool = get_ptxas(sm) if inspect.signature(get_ptxas).parameters else get_ptxas()
        return str(getattr(tool, "path", None) or tool) if tool else None
    except Exception:
        return None


def probe_triton(sm: int) -> tuple[PackageInfo, ToolInfo]:
    """triton's version and the ptxas it assembles ``sm_<sm>a`` code with (asked from Triton when it can say)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return PackageInfo("triton", None), ToolInfo("ptxas (Triton)", None, error="triton is not installed")
    triton_dir = Path(list(spec.submodule_search_locations)[0])
    version = installed_version("triton", "pytorch-triton", "triton-nightly")
    has_knob = False
    try:
        import triton.knobs as knobs  # noqa: PLC0415

        has_knob = hasattr(knobs.nvidia, "ptxas_blackwell")
    except Exception:
        pass
    package = PackageInfo("triton", version, str(triton_dir))
    path, source, key = triton_ptxas_choice(triton_dir, sm, os.environ, has_knob)
    own = _triton_own_choice(sm)
    if own and Path(own).resolve() != Path(path).resolve():
        path = own
        overrides = [k for k in ("TRITON_PTXAS_BLACKWELL_PATH", "TRITON_PTXAS_PATH") if os.environ.get(k) == own]
        source = overrides[0] if overrides else "bundled with triton"
    if not Path(path).exists():
        return package, ToolInfo("ptxas (Triton)", None, source=source, error=f"{path} does not exist")
    tool = probe_tool("ptxas", path, source)
    return package, ToolInfo("ptxas (Triton)", tool.path, tool.release, tool.version, tool.source, tool.error)


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def sgl_kernel_variant(package_dir: Path, capability: tuple[int, int] | None) -> tuple[str | None, str | None, str]:
    """The ``common_ops`` library sgl_kernel's loader picks: ``(variant, library, reason)``.

    Read from sgl_kernel's ``load_utils._load_architecture_specific_ops`` (0.3.x-0.4.x): capability 9.0
    loads ``sm90/common_ops.*``; every other capability, and a machine with no GPU, loads
    ``sm100/common_ops.*``; when that folder holds no library it falls back to ``common_ops.*`` beside
    the package's ``__init__.py``.
    """
    sm = capability[0] * 10 + capability[1] if capability else None
    variant = "sm90" if sm == 90 else "sm100"
    why = (
        "capability 9.0 loads sm90/"
        if sm == 90
        else (
            f"capability {capability[0]}.{capability[1]} is not 9.0, so the loader takes sm100/"
            if capability
            else "no GPU: the loader takes sm100/"
        )
    )
    for folder, name in ((package_dir / variant, variant), (package_dir, "")):
        libs = sorted(p for p in folder.glob("common_ops.*") if ".so" in p.name or p.suffix in (".pyd", ".dll"))
        if libs:
            rel = libs[0].relative_to(package_dir).as_posix()
            if name:
                return name, rel, why
            return "", rel, why + f"; {variant}/ holds no library, so it falls back to {rel}"
    return None, None, why + f"; but neither {variant}/common_ops.* nor common_ops.* exists"


def _fatbin_reader():
    try:
        module = importlib.import_module("sm120kit.hardware.fatbin")
        return getattr(module, "inspect_library")
    except (ImportError, AttributeError):
        return None


def probe_sgl_kernel(capability: tuple[int, int] | None) -> SglKernelInfo:
    package_dir = _package_dir("sgl_kernel")
    version = installed_version("sglang-kernel", "sgl-kernel")
    if package_dir is None:
        return SglKernelInfo(version, None)
    if version is None:
        version = version_in_file(package_dir / "version.py")
    variant, variant_lib, reason = sgl_kernel_variant(package_dir, capability)
    reader = _fatbin_reader()
    libraries = []
    for lib in sorted(package_dir.rglob("*.so")):
        rel = lib.relative_to(package_dir).as_posix()
        if reader is None:
            libraries.append(LibraryInfo(rel, loaded_by_loader=rel == variant_lib))
            continue
        try:
            found = reader(lib)
            libraries.append(LibraryInfo(rel, tuple(found.sass), tuple(found.ptx), rel == variant_lib))
        except Exception as exc:
            libraries.append(
                LibraryInfo(rel, loaded_by_loader=rel == variant_lib, error=f"{type(exc).__name__}: {exc}")
            )
    note = None if reader else "SASS archs not read: sm120kit.hardware.fatbin (the fat-binary reader) is not available"
    return SglKernelInfo(version, str(package_dir), variant, variant_lib, reason, tuple(libraries), note)


def format_flashinfer_arch(item: Any) -> str:
    """FlashInfer's ``(12, "0f")`` target tuple -> ``"12.0f"``."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return f"{item[0]}.{item[1]}"
    return str(item)


def probe_flashinfer() -> FlashInferInfo:
    package_dir = _package_dir("flashinfer")
    version = installed_version("flashinfer-python", "flashinfer")
    prebuilt = tuple(
        f"{n} {v}" for n in ("flashinfer-cubin", "flashinfer-jit-cache") if (v := installed_version(n)) is not None
    )
    if package_dir is None:
        return FlashInferInfo(version, None, prebuilt=prebuilt)
    env_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    try:
        module = importlib.import_module("flashinfer.compilation_context")
        archs = tuple(sorted(format_flashinfer_arch(a) for a in module.CompilationContext().TARGET_CUDA_ARCHS))
        source = "FLASHINFER_CUDA_ARCH_LIST" if env_list else "from the visible GPUs"
        return FlashInferInfo(version, str(package_dir), archs, f"{source} (flashinfer.compilation_context)", prebuilt)
    except Exception as exc:
        if env_list:
            return FlashInferInfo(
                version, str(package_dir), tuple(env_list.split()), "FLASHINFER_CUDA_ARCH_LIST", prebuilt
            )
        return FlashInferInfo(
            version,
            str(package_dir),
            (),
            None,
            prebuilt,
            error=f"JIT arch list not readable ({type(exc).__name__}: {exc})",
        )


def probe_sglang(path: str | Path | None) -> SglangInfo:
    from sm120kit.sglang.target import find_target

    try:
        target = find_target(path)
    except NotSglangTree as exc:
        return SglangInfo(None, error=exc.message if path else "SGLang is not installed in this environment")
    state, summary = patch_state(target)
    return SglangInfo(
        target.version, str(target.package_dir), target.kind, state, summary, pins=read_pins(target.package_dir)
    )


PINNED = ("torch", "sglang-kernel", "sgl-kernel", "flashinfer-python", "triton")


def parse_pins(metadata_text: str) -> dict[str, str]:
    """The version pins of :data:`PINNED` packages among a wheel's ``Requires-Dist`` lines (extras skipped)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in metadata_text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        if name in PINNED and req.marker is None and str(req.specifier):
            pins[name] = str(req.specifier)
    return pins


def read_pins(package_dir: Path) -> dict[str, str]:
    for meta in dist_metadata_files(package_dir.parent, "sglang"):
        try:
            return parse_pins(meta.read_text(errors="replace"))
        except OSError:
            return {}
    return {}


def pin_mismatches(pins: Mapping[str, str], installed: Mapping[str, str | None]) -> list[tuple[str, str, str]]:
    """``(package, pin, installed version)`` for each installed package outside its pin (local tags ignored)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    out = []
    for name, spec in pins.items():
        version = installed.get(name)
        if not version:
            continue
        try:
            public = Version(version).public
            if not SpecifierSet(spec).contains(public, prereleases=True):
                out.append((name, spec, version))
        except InvalidVersion:
            continue
    return out


def patch_state(target) -> tuple[Any, str]:
    """The sm120kit patch state of ``target`` from the patch engine, or a note why there is none."""
    try:
        apply_module = importlib.import_module("sm120kit.patching.engine")
        series_status = getattr(apply_module, "series_status")
        load_series = getattr(importlib.import_module("sm120kit.patching.series"), "load_series")
    except (ImportError, AttributeError):
        return None, "not available: this sm120kit has no patch-state reader (sm120kit.patching.engine.series_status)"
    try:
        result = series_status(target, load_series())
    except Sm120kitError as exc:
        return None, f"could not be read: {exc.message}"
    data = result.to_json() if hasattr(result, "to_json") else result
    return data, summarize_patch_state(data)


def summarize_patch_state(data: Any) -> str:
    """``"3 applied, 1 not-applicable"`` from the statuses found in the patch engine's JSON."""
    counts: dict[str, int] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            status = node.get("status")
            if isinstance(status, str) and ("patch" in node or "name" in node or "id" in node):
                counts[status] = counts.get(status, 0) + 1
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(data)
    if not counts:
        return "no patch statuses reported"
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


# -- the decision logic (pure) -------------------------------------------------------------------------------


def _family_or_default(capability: tuple[int, int]) -> arch.GpuFamily | None:
    return arch.family(capability)


def min_tool_release(capability: tuple[int, int], machine: str | None = None) -> tuple[int, int]:
    """The oldest CUDA release whose tools target ``capability`` on ``machine`` (default: this one), from
    :func:`sm120kit.hardware.arch.min_cuda`; 12.0 for capabilities without a family there."""
    return arch.min_cuda(capability, machine=machine) or (12, 0)


def _mla_defines_problem(value: str) -> str | None:
    """What the kernels' own parser finds wrong with a value of SGLANG_SM120_MLA_DEFINES, or None; None as well
    where the kernels' package (with torch) cannot be imported here, as nothing can then be said of it."""
    try:
        from sm120_attention import sm120_mla_mma
    except Exception:  # noqa: BLE001 - no torch here, or another sm120kit's kernels: no finding
        return None
    try:
        sm120_mla_mma.parse_tunables(value)
    except ValueError as exc:
        return str(exc)
    return None


def assess(
    *,
    judged: tuple[int, int],
    gpu: TorchGpu | None,
    driver: DriverInfo,
    nvcc: ToolInfo,
    triton_ptxas: ToolInfo,
    torch: TorchInfo,
    triton: PackageInfo,
    sglang: SglangInfo,
    sgl_kernel: SglKernelInfo,
    flashinfer: FlashInferInfo,
    env: Mapping[str, str],
    machine: str | None = None,
) -> tuple[Flag, ...]:
    """Every mismatch between this environment and a GPU of capability ``judged`` (on ``machine``, default:
    this one; the minimum CUDA of 12.1 differs between x86-64 and aarch64)."""
    flags: list[Flag] = []
    label = f"{judged[0]}.{judged[1]}"
    fam = _family_or_default(judged)
    target = fam.sass_arch if fam else f"sm_{judged[0]}{judged[1]}"
    need = min_tool_release(judged, machine)
    sm12x = arch.is_sm12x(judged)

    if gpu is not None and gpu.platform == "hip":
        flags.append(
            Flag(
                WARNING,
                "gpu",
                f"{gpu.name} is an AMD GPU seen through ROCm/HIP (capability "
                f"{gpu.label} as HIP reports it); it is not an NVIDIA SM{gpu.capability[0]}{gpu.capability[1]} "
                "device and none of the CUDA findings below apply to it.",
                "Use SGLang's ROCm documentation for this GPU.",
            )
        )
    if gpu is not None and gpu.platform == "cuda":
        if (
            gpu.known_shared_memory_per_block
            and gpu.shared_memory_per_block_optin
            and gpu.shared_memory_per_block_optin != gpu.known_shared_memory_per_block
        ):
            flags.append(
                Flag(
                    WARNING,
                    "gpu",
                    f"The device reports {gpu.shared_memory_per_block_optin} B of opt-in "
                    f"shared memory per block; sm120kit's figure for {gpu.family} is "
                    f"{gpu.known_shared_memory_per_block} B.",
                    "Kernel block sizes chosen for the family may not fit; report this GPU to sm120kit.",
                )
            )
        if gpu.known_shared_memory_per_block is None:
            flags.append(Flag(INFO, "gpu", f"sm120kit has no facts for capability {gpu.label} ({gpu.name})."))

    # torch
    if not torch.installed:
        flags.append(
            Flag(
                ERROR,
                "torch",
                "torch is not installed.",
                "Install the CUDA build of torch that your SGLang release pins.",
            )
        )
    elif torch.cuda is None and torch.hip is None:
        flags.append(
            Flag(
                ERROR,
                "torch",
                f"torch {torch.version} is a CPU-only build: no kernel can run on a GPU.",
                "Install a CUDA build (for SM120: CUDA 12.8 or newer, e.g. the cu128/cu130 wheels).",
            )
        )
    elif torch.cuda is not None:
        cuda = parse_version_tuple(torch.cuda)
        if cuda and cuda < need:
            flags.append(
                Flag(
                    ERROR,
                    "torch",
                    f"torch {torch.version} is built with CUDA {torch.cuda}; {label} "
                    f"({target}) needs CUDA {fmt_version(need)} or newer.",
                    f"Install a torch build for CUDA {fmt_version(need)}+ (cu128 or cu130 wheels).",
                )
            )
        try:
            entries = parse_arch_list(torch.arch_list)
        except ValueError:
            entries = []
        if torch.arch_list and not covering(entries, judged):
            flags.append(
                Flag(
                    ERROR,
                    "torch",
                    f"torch's arch list ({' '.join(torch.arch_list)}) has no code that runs "
                    f"on {label}: every torch kernel would fail with 'no kernel image is available'.",
                    f"Install a torch build whose arch list includes sm_{judged[0]}{judged[1]} "
                    "(torch.cuda.get_arch_list()).",
                )
            )
        if driver.cuda_version and cuda and driver.cuda_version < cuda:
            flags.append(
                Flag(
                    ERROR,
                    "driver",
                    f"The driver supports CUDA up to {fmt_version(driver.cuda_version)}, "
                    f"older than the CUDA {torch.cuda} torch was built with.",
                    "Update the NVIDIA driver (or install a torch build for an older CUDA).",
                )
            )

    # Triton and its assembler
    if not triton.installed:
        severity = ERROR if sglang.installed else WARNING
        flags.append(
            Flag(
                severity,
                "triton",
                "triton is not installed: SGLang's attention and MoE kernels are Triton kernels.",
                "Install the triton release your torch pins.",
            )
        )
    elif triton_ptxas.error or triton_ptxas.release is None:
        flags.append(
            Flag(
                ERROR,
                "triton",
                f"The ptxas Triton would use is not usable: {triton_ptxas.error or 'no version'}.",
                "Reinstall triton, or point TRITON_PTXAS_PATH at a CUDA 12.8+ ptxas.",
            )
        )
    elif triton_ptxas.release < need:
        flags.append(
            Flag(
                ERROR,
                "triton",
                f"Triton assembles with ptxas {triton_ptxas.version} "
                f"({triton_ptxas.source}); {target} needs ptxas {fmt_version(need)} or newer.",
                f"Upgrade triton (>= 3.3 bundles a new enough ptxas) or set TRITON_PTXAS_PATH to a "
                f"CUDA {fmt_version(need)}+ ptxas.",
            )
        )
    for key in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        value = env.get(key)
        if value and not os.access(value, os.X_OK):
            flags.append(
                Flag(
                    WARNING,
                    "triton",
                    f"{key}={value} is not a runnable file; Triton ignores it and uses its bundled ptxas.",
                    f"Fix or unset {key}.",
                )
            )

    # nvcc: JIT builds (FlashInfer, SGLang's JIT kernels, torch extensions)
    if nvcc.found and nvcc.release < need:
        flags.append(
            Flag(
                ERROR if flashinfer.installed else WARNING,
                "nvcc",
                f"nvcc {nvcc.version} cannot target {target} (needs CUDA {fmt_version(need)}+); JIT-compiled "
                "kernels (FlashInfer, SGLang's JIT kernels) cannot be built for this GPU.",
                f"Install CUDA {fmt_version(need)}+ and put its bin/ first on PATH (or set CUDA_HOME).",
            )
        )
    if (
        sm12x
        and flashinfer.installed
        and nvcc.found
        and nvcc.release < arch.FLASHINFER_JIT_MIN_CUDA_SM12X
        and nvcc.release >= need
    ):
        flags.append(
            Flag(
                ERROR,
                "flashinfer",
                f"FlashInfer compiles JIT kernels for SM12x only with CUDA "
                f"{fmt_version(arch.FLASHINFER_JIT_MIN_CUDA_SM12X)}+; nvcc here is {nvcc.version}.",
                f"Install CUDA {fmt_version(arch.FLASHINFER_JIT_MIN_CUDA_SM12X)}+ (or set "
                "FLASHINFER_CUDA_ARCH_LIST=12.0a, which FlashInfer takes as is).",
            )
        )
    if not nvcc.found and flashinfer.installed and not flashinfer.prebuilt:
        flags.append(
            Flag(
                WARNING,
                "nvcc",
                "nvcc was not found and no prebuilt FlashInfer kernels "
                "(flashinfer-cubin / flashinfer-jit-cache) are installed: FlashInfer's JIT cannot build "
                "its kernels.",
                f"Install the CUDA toolkit ({fmt_version(arch.FLASHINFER_JIT_MIN_CUDA_SM12X)}+ for "
                "SM12x) or flashinfer-jit-cache.",
            )
        )

    # sgl_kernel
    if not sgl_kernel.installed:
        if sglang.installed:
            flags.append(
                Flag(
                    WARNING,
                    "sgl_kernel",
                    "SGLang is installed but sgl_kernel (sglang-kernel / sgl-kernel) "
                    "is not: SGLang's CUDA model runner imports it.",
                    "Install the sglang-kernel release your SGLang pins.",
                )
            )
    else:
        flags.extend(_assess_sgl_kernel(sgl_kernel, judged, label))

    # FlashInfer
    if flashinfer.installed and flashinfer.jit_archs:
        try:
            entries = parse_arch_list(flashinfer.jit_archs, kind="sass")
        except ValueError:
            entries = []
        if not covering(entries, judged):
            flags.append(
                Flag(
                    ERROR,
                    "flashinfer",
                    f"FlashInfer's JIT arch list ({' '.join(flashinfer.jit_archs)}) "
                    f"has no target that runs on {label}.",
                    f"Set FLASHINFER_CUDA_ARCH_LIST to include {judged[0]}.{judged[1]}"
                    f"{'a' if judged[0] >= 9 else ''} (or unset it to target the visible GPU).",
                )
            )

    # the versions this SGLang release pins
    if sglang.installed and sglang.pins:
        installed = {
            "torch": torch.version,
            "triton": triton.version,
            "sglang-kernel": sgl_kernel.version,
            "sgl-kernel": sgl_kernel.version,
            "flashinfer-python": flashinfer.version,
        }
        for name, spec, version in pin_mismatches(sglang.pins, installed):
            flags.append(
                Flag(
                    WARNING,
                    "versions",
                    f"SGLang {sglang.version} pins {name}{spec}; {version} is installed. "
                    "SGLang was not released with this combination: compiled kernels built for another "
                    "torch can fail to load, and a different kernel library can lack ops SGLang calls.",
                    f"Install {name}{spec}, or the SGLang release built against {name} {version}.",
                )
            )

    # environment
    arch_list = env.get("TORCH_CUDA_ARCH_LIST")
    if arch_list:
        try:
            entries = parse_arch_list(arch_list)
        except ValueError:
            entries = []
            flags.append(
                Flag(
                    WARNING,
                    "env",
                    f"TORCH_CUDA_ARCH_LIST={arch_list!r} is not a list of archs.",
                    "Use e.g. TORCH_CUDA_ARCH_LIST=12.0a.",
                )
            )
        if entries and not covering(entries, judged):
            flags.append(
                Flag(
                    WARNING,
                    "env",
                    f"TORCH_CUDA_ARCH_LIST={arch_list!r} does not cover {label}: torch "
                    "extensions built here (JIT or from source) would not run on this GPU.",
                    f"Add {judged[0]}.{judged[1]}{'a' if judged[0] >= 9 else ''} to it.",
                )
            )
    mla_defines = env.get(mla_kernels.DEFINES_ENV, "").strip()
    if mla_defines:
        problem = _mla_defines_problem(mla_defines)
        if problem is not None:
            flags.append(
                Flag(
                    WARNING,
                    "env",
                    f"{mla_kernels.DEFINES_ENV}={mla_defines!r} cannot be taken ({problem}): a patched SGLang ignores it "
                    "and builds the MLA kernels as shipped.",
                    "Give NAME=VALUE items of the kernels' TUNABLES (docs/cli.md), or unset it; "
                    "sm120kit tune-mla prints a value measured on this GPU.",
                )
            )
    if sm12x and env.get("SGLANG_ENABLE_JIT_DEEPGEMM", "").lower() in ("1", "true"):
        flags.append(
            Flag(
                WARNING,
                "env",
                "SGLANG_ENABLE_JIT_DEEPGEMM is on; DeepGEMM's kernels are for sm_90/sm_100, not SM12x.",
                "Set SGLANG_ENABLE_JIT_DEEPGEMM=0.",
            )
        )
    return tuple(flags)


def _assess_sgl_kernel(info: SglKernelInfo, judged: tuple[int, int], label: str) -> list[Flag]:
    flags: list[Flag] = []
    if info.variant_library is None:
        flags.append(
            Flag(
                ERROR,
                "sgl_kernel",
                f"sgl_kernel at {info.location} holds no common_ops library for its "
                f"loader to load ({info.variant_reason}).",
                "Reinstall sglang-kernel.",
            )
        )
        return flags
    for lib in info.libraries:
        if lib.error or not (lib.sass or lib.ptx):
            continue
        entries = parse_arch_list(lib.sass, kind="sass") + parse_arch_list(lib.ptx, kind="ptx")
        if covering(entries, judged):
            continue
        have = " ".join(lib.sass) or "no SASS"
        if lib.loaded_by_loader:
            flags.append(
                Flag(
                    ERROR,
                    "sgl_kernel",
                    f"sgl_kernel/{lib.path} (the library its loader picks on {label}) "
                    f"holds {have} and no code that runs on {label}: its kernels fail with 'no kernel image'.",
                    f"Install an sglang-kernel build for {judged[0]}.{judged[1]} (sm120kit build) or a "
                    "wheel that lists it.",
                )
            )
        elif not lib.path.startswith(("sm90/", "sm100/")):
            flags.append(
                Flag(
                    INFO, "sgl_kernel", f"sgl_kernel/{lib.path} holds {have}: the ops it serves cannot run on {label}."
                )
            )
    return flags


# -- entry point ---------------------------------------------------------------------------------------------


def judged_capability(gpu: TorchGpu | None, override: tuple[int, int] | None) -> tuple[tuple[int, int], str]:
    """The capability the findings are judged against, and why that one."""
    if override is not None:
        return override, "given with --arch"
    if gpu is not None and gpu.platform == "cuda":
        return gpu.capability, f"the GPU present ({gpu.name})"
    return (12, 0), "no NVIDIA GPU present: judged for SM120 (12.0), the GPU family sm120kit targets"


def collect_report(
    *,
    arch_override: tuple[int, int] | None = None,
    sglang_path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> EnvironmentReport:
    """Probe this machine and judge it (see the module docstring)."""
    environ = os.environ if environ is None else environ
    torch_info, torch_module = probe_torch()
    gpu, gpu_note = probe_gpu(torch_module)
    judged, reason = judged_capability(gpu, arch_override)
    sm = judged[0] * 10 + judged[1]
    driver = probe_driver()
    nvcc = probe_tool("nvcc")
    ptxas = probe_tool("ptxas")
    triton_pkg, triton_ptxas = probe_triton(sm)
    sglang = probe_sglang(sglang_path)
    sgl_kernel = probe_sgl_kernel(judged)
    flashinfer = probe_flashinfer()
    env = relevant_env(environ)
    flags = assess(
        judged=judged,
        gpu=gpu,
        driver=driver,
        nvcc=nvcc,
        triton_ptxas=triton_ptxas,
        torch=torch_info,
        triton=triton_pkg,
        sglang=sglang,
        sgl_kernel=sgl_kernel,
        flashinfer=flashinfer,
        env=env,
    )
    from sm120kit.verify import topology  # the multi-GPU part, in its own module (it imports Flag from here)

    multi_gpu = topology.collect(
        torch_module, sglang.path, sglang.version, flashinfer.location, flashinfer.version, env
    )
    flags += tuple(topology.assess(multi_gpu, judged))
    return EnvironmentReport(
        judged,
        reason,
        gpu,
        gpu_note,
        driver,
        nvcc,
        ptxas,
        triton_ptxas,
        torch_info,
        triton_pkg,
        sglang,
        sgl_kernel,
        flashinfer,
        env,
        flags,
        multi_gpu,
    )
