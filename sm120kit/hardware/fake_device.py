"""Stand-ins for a CUDA GPU this machine lacks: a faked torch device and a faked Triton target.

Static audits need SGLang's own Python code to believe it runs on, say, an RTX PRO 6000 Blackwell
(compute capability 12.0) when the machine has no GPU at all. Two context managers do that, and nothing
else in sm120kit fakes hardware:

* :func:`faked_cuda` patches ``torch`` so that ``torch.cuda`` reports one device with the capability,
  name, memory and shared-memory figures of a :class:`FakeDevice` (``torch.version.cuda``/``hip`` too).
  Nothing runs on that device; it only answers questions about it. Everything patched is restored on exit.
* :func:`faked_triton_target` installs a Triton driver whose current target is the faked device's
  architecture (``GPUTarget("cuda", 120, 32)`` for 12.0) and whose torch device is ``meta``. Every kernel
  launch becomes a compile (``JITFunction.run`` with ``warmup=True``): Triton really compiles the kernel
  for that target with its bundled ptxas, and each compiled kernel is recorded (name, constexprs,
  warps, stages, ``metadata.shared``, the cubin) so callers can compare it with the hardware limit.

Both stand in for hardware this machine lacks; the compiles are real, the device is not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK

GiB = 1024**3


@dataclass(frozen=True)
class FakeDevice:
    """What a faked GPU reports. ``shared_memory_per_block`` is the opt-in figure per block
    (``CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``, Triton's launch limit)."""

    capability: tuple[int, int]
    name: str
    cuda_version: str | None = "13.0"
    hip_version: str | None = None
    _: dataclasses.KW_ONLY
    shared_memory_per_block: int
    multi_processor_count: int
    total_memory: int
    shared_memory_per_multiprocessor: int | None = None
    l2_cache_size: int = 64 * 1024 * 1024
    gcn_arch_name: str | None = None  # HIP devices only, e.g. "gfx1201"

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    @property
    def label(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"

    @property
    def is_hip(self) -> bool:
        return self.hip_version is not None

    def triton_target(self):
        """The ``GPUTarget`` Triton compiles for on this device."""
        from triton.backends.compiler import GPUTarget

        if self.is_hip:
            return GPUTarget("hip", self.gcn_arch_name or "gfx1201", 32)
        return GPUTarget("cuda", self.sm, 32)


PRESETS: dict[str, FakeDevice] = {
    "12.0": FakeDevice(
        (12, 0),
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        shared_memory_per_block=SM120_SHARED_MEMORY_PER_BLOCK,
        multi_processor_count=188,
        total_memory=96 * GiB,
        shared_memory_per_multiprocessor=102400,
        l2_cache_size=128 * 1024 * 1024,
    ),
    "12.1": FakeDevice(
        (12, 1),
        "NVIDIA GB10",
        shared_memory_per_block=SM120_SHARED_MEMORY_PER_BLOCK,
        multi_processor_count=48,
        total_memory=128 * GiB,
        shared_memory_per_multiprocessor=102400,
        l2_cache_size=24 * 1024 * 1024,
    ),
    "10.0": FakeDevice(
        (10, 0),
        "NVIDIA B200",
        shared_memory_per_block=232448,
        multi_processor_count=148,
        total_memory=180 * GiB,
        shared_memory_per_multiprocessor=233472,
        l2_cache_size=126 * 1024 * 1024,
    ),
    "9.0": FakeDevice(
        (9, 0),
        "NVIDIA H200",
        shared_memory_per_block=232448,
        multi_processor_count=132,
        total_memory=141 * GiB,
        shared_memory_per_multiprocessor=233472,
        l2_cache_size=60 * 1024 * 1024,
    ),
    "8.9": FakeDevice(
        (8, 9),
        "NVIDIA L40S",
        shared_memory_per_block=101376,
        multi_processor_count=142,
        total_memory=48 * GiB,
        shared_memory_per_multiprocessor=102400,
        l2_cache_size=96 * 1024 * 1024,
    ),
    # AMD RDNA4 reports capability major 12 through HIP (sglang PR #13844): a ``major == 12`` test that
    # does not also check ``torch.version.cuda`` mistakes it for SM120.
    "hip-12": FakeDevice(
        (12, 0),
        "AMD Radeon AI PRO R9700",
        cuda_version=None,
        hip_version="6.4.43482",
        shared_memory_per_block=65536,
        multi_processor_count=64,
        total_memory=32 * GiB,
        shared_memory_per_multiprocessor=65536,
        l2_cache_size=8 * 1024 * 1024,
        gcn_arch_name="gfx1201",
    ),
}


# The names torch reports (``torch.cuda.get_device_name()``) for GPUs of compute capability 12.x that
# SGLang's tuned fused-MoE config files (``device_name=...``, spaces as underscores) or the series' own
# files are named after; the audit runs SGLang's config choice under each name its tree ships files for.
# Read from the config file names of SGLang 0.5.2-0.5.23 and NVIDIA's product names for these cards.
SM12X_DEVICE_NAMES: dict[str, str] = {
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "12.0",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "12.0",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "12.0",
    "NVIDIA GeForce RTX 5090": "12.0",
    "NVIDIA GB10": "12.1",
}


def preset(key: str) -> FakeDevice:
    """``preset("12.0")``; a KeyError naming the known keys otherwise."""
    try:
        return PRESETS[key]
    except KeyError:
        raise KeyError(f"no fake device preset {key!r}; known: {', '.join(PRESETS)}") from None


# -- torch ------------------------------------------------------------------------------------------------


def device_properties(device: FakeDevice) -> SimpleNamespace:
    """An object shaped like ``torch.cuda.get_device_properties(i)`` for ``device``."""
    major, minor = device.capability
    return SimpleNamespace(
        name=device.name,
        major=major,
        minor=minor,
        total_memory=device.total_memory,
        multi_processor_count=device.multi_processor_count,
        shared_memory_per_block=48 * 1024,
        shared_memory_per_block_optin=device.shared_memory_per_block,
        shared_memory_per_multiprocessor=device.shared_memory_per_multiprocessor or device.shared_memory_per_block,
        max_threads_per_multi_processor=1536 if major in (8, 12) else 2048,
        max_threads_per_block=1024,
        regs_per_multiprocessor=65536,
        warp_size=32,
        L2_cache_size=device.l2_cache_size,
        is_integrated=device.name == "NVIDIA GB10",
        is_multi_gpu_board=False,
        gcnArchName=device.gcn_arch_name or "",
        uuid="00000000-0000-0000-0000-000000000000",
        pci_bus_id=0,
        pci_device_id=0,
        pci_domain_id=0,
    )


class _Patcher:
    """setattr with a record, undone in reverse order by :meth:`restore`."""

    _MISSING = object()

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name, self._MISSING)))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, old in reversed(self._saved):
            if old is self._MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
        self._saved.clear()


def _check_index(device: FakeDevice, index: Any) -> int:
    if index is None:
        return 0
    if isinstance(index, str):  # "cuda" or "cuda:0" (a str has an .index method too: test it first)
        kind, _, number = index.partition(":")
        if kind != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {index}")
        index = int(number) if number else 0
    elif hasattr(index, "index"):  # torch.device
        if getattr(index, "type", "cuda") not in ("cuda",):
            raise ValueError(f"Expected a cuda device, but got: {index}")
        index = index.index or 0
    if not 0 <= int(index) < 1:
        raise RuntimeError(f"invalid device ordinal {index}: the faked {device.name} is device 0")
    return int(index)


_lock = threading.RLock()


@contextlib.contextmanager
def faked_cuda(device: FakeDevice) -> Iterator[FakeDevice]:
    """Make ``torch`` report ``device`` as its one CUDA (or HIP) GPU; restore everything on exit.

    This stands in for hardware this machine lacks: queries (capability, name, properties, free memory)
    answer with the fake device's figures; calls that would touch the GPU (``set_device``,
    ``synchronize``, ``empty_cache``) do nothing. Tensors must be created on the ``meta`` device.
    """
    import torch

    props = device_properties(device)
    patch = _Patcher()
    with _lock:
        try:
            patch.set(torch.version, "cuda", device.cuda_version)
            patch.set(torch.version, "hip", device.hip_version)
            cuda = torch.cuda
            patch.set(cuda, "is_available", lambda: True)
            patch.set(cuda, "is_initialized", lambda: True)
            patch.set(cuda, "device_count", lambda: 1)
            patch.set(cuda, "current_device", lambda: 0)
            patch.set(cuda, "set_device", lambda d: _check_index(device, d) and None)
            patch.set(cuda, "get_device_capability", lambda d=None: (_check_index(device, d), device.capability)[1])
            patch.set(cuda, "get_device_name", lambda d=None: (_check_index(device, d), device.name)[1])
            patch.set(cuda, "get_device_properties", lambda d=None: (_check_index(device, d), props)[1])
            patch.set(cuda, "mem_get_info", lambda d=None: (device.total_memory, device.total_memory))
            patch.set(cuda, "synchronize", lambda d=None: None)
            patch.set(cuda, "empty_cache", lambda: None)
            patch.set(cuda, "is_bf16_supported", lambda including_emulation=True: True)
            patch.set(cuda, "get_arch_list", lambda: [device.gcn_arch_name] if device.is_hip else [f"sm_{device.sm}"])
            patch.set(cuda, "memory_allocated", lambda d=None: 0)
            patch.set(cuda, "max_memory_allocated", lambda d=None: 0)
            patch.set(cuda, "memory_reserved", lambda d=None: 0)
            yield device
        finally:
            patch.restore()


@contextlib.contextmanager
def faked_device(device: FakeDevice) -> Iterator[TritonRecorder]:
    """Both fakes at once: :func:`faked_cuda` and :func:`faked_triton_target`; yields the recorder."""
    with faked_cuda(device), faked_triton_target(device) as recorder:
        yield recorder


# -- triton -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledKernelRecord:
    """One kernel as Triton compiled it for the faked target (one entry per launch)."""

    name: str  # the kernel's function name, e.g. "_fwd_kernel"
    module: str  # the Python module that defines it
    constexprs: dict[str, Any]  # declared tl.constexpr arguments by name (block sizes, head dims ...)
    num_warps: int
    num_stages: int
    shared: int  # metadata.shared: the bytes Triton compares with the device limit at launch
    target: str  # "cuda:120"
    hash: str
    cubin: bytes = field(default=b"", repr=False, compare=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}"


def _plain(value: Any) -> Any:
    """A JSON-friendly form of a constexpr value (dtypes and functions become their names)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    inner = getattr(value, "value", None)
    if inner is not None and type(value).__name__ == "constexpr":
        return _plain(inner)
    fn = getattr(value, "fn", None)
    if fn is not None and hasattr(fn, "__name__"):
        return fn.__name__
    return str(value)


def _record_of(kernel: Any, jit_fn: Any) -> CompiledKernelRecord:
    meta = kernel.metadata
    params = list(getattr(jit_fn, "params", []))
    constexprs: dict[str, Any] = {}
    src_constants = getattr(getattr(kernel, "src", None), "constants", None) or {}
    for path, value in src_constants.items():
        index = path[0] if isinstance(path, tuple) and path else path
        # Only parameters declared tl.constexpr: Triton also folds integer arguments equal to 1.
        if isinstance(index, int) and index < len(params) and params[index].is_constexpr:
            key = params[index].name + "".join(f"[{p}]" for p in (path[1:] if isinstance(path, tuple) else ()))
            constexprs[key] = _plain(value)
    target = meta.target
    asm = getattr(kernel, "asm", {}) or {}
    cubin = asm.get("cubin", b"") if hasattr(asm, "get") else b""
    return CompiledKernelRecord(
        name=getattr(jit_fn, "__name__", None) or jit_fn.fn.__name__,
        module=getattr(jit_fn, "module", "") or "",
        constexprs=constexprs,
        num_warps=int(meta.num_warps),
        num_stages=int(meta.num_stages),
        shared=int(meta.shared),
        target=f"{target.backend}:{target.arch}",
        hash=str(getattr(kernel, "hash", "")),
        cubin=cubin if isinstance(cubin, bytes) else b"",
    )


@dataclass
class TritonRecorder:
    """What :func:`faked_triton_target` yields: the compiled kernels, in launch order."""

    device: FakeDevice
    kernels: list[CompiledKernelRecord] = field(default_factory=list)

    def take(self) -> list[CompiledKernelRecord]:
        """The kernels recorded since the last call (and forget them)."""
        taken, self.kernels = self.kernels, []
        return taken


def _fake_driver_class():
    from triton.backends.driver import DriverBase

    class FakeTritonDriver(DriverBase):
        """A Triton driver for a GPU this machine lacks: it names the target to compile for and refuses
        to load or launch anything."""

        def __init__(self, device: FakeDevice) -> None:
            super().__init__()
            self.device = device
            self.target = device.triton_target()
            props = device_properties(device)
            self.utils = SimpleNamespace(
                get_device_properties=lambda index=0: {
                    "max_shared_mem": device.shared_memory_per_block,
                    "multiprocessor_count": device.multi_processor_count,
                    "max_num_regs": props.regs_per_multiprocessor,
                    "warpSize": 32,
                    "sm_clock_rate": 0,
                    "mem_clock_rate": 0,
                    "mem_bus_width": 0,
                    "arch": device.gcn_arch_name or f"sm_{device.sm}",
                },
                load_binary=self._no_hardware,
                unload_module=lambda *a, **k: None,
                set_printf_fifo_size=lambda *a, **k: None,
            )
            self.launcher_cls = self._no_hardware

        @classmethod
        def is_active(cls) -> bool:
            return False  # never picked by Triton's own driver discovery

        def _no_hardware(self, *args, **kwargs):
            raise RuntimeError(
                f"the faked {self.device.name} cannot load or launch kernels: this machine "
                "has no such GPU (sm120kit's static audit only compiles)"
            )

        def map_python_to_cpp_type(self, ty: str) -> str:
            from triton.backends.nvidia.driver import ty_to_cpp

            return ty_to_cpp(ty)

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            import torch

            return torch.device("meta")

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, index: int) -> None:
            return None

        def get_current_stream(self, index: int | None = None) -> int:
            return 0

        def get_device_capability(self, index: int | None = None) -> tuple[int, int]:
            return self.device.capability

        def get_benchmarker(self):
            def bench(kernel_call, quantiles=None, **kwargs):
                kernel_call()  # compiles; nothing is timed on a faked device
                return [1.0] * len(quantiles) if quantiles else 1.0

            return bench

    return FakeTritonDriver


def _jit_registry() -> dict:
    from triton.runtime import jit as jit_module

    return getattr(jit_module, "_triton_jit_function_registry", {})


@contextlib.contextmanager
def faked_triton_target(device: FakeDevice) -> Iterator[TritonRecorder]:
    """Compile, never launch, every Triton kernel for ``device``'s architecture; record each one.

    This stands in for hardware this machine lacks. Inside the block, Triton's active driver reports
    ``device.triton_target()`` (``GPUTarget("cuda", 120, 32)`` for 12.0) and the ``meta`` torch device;
    ``JITFunction.run`` always runs with ``warmup=True``, so ``kernel[grid](...)`` compiles the kernel with
    exactly the specialisation a launch would use (meta tensors report ``data_ptr() == 0``, i.e. 16-byte
    aligned) and returns without running anything. Each compiled kernel is appended to the yielded
    :class:`TritonRecorder`. Triton's per-function caches of compiled kernels are swapped out on entry and
    put back on exit, so kernels compiled for the faked target never leak into later real launches.
    """
    from triton.runtime.driver import driver as driver_config
    from triton.runtime.jit import JITFunction

    recorder = TritonRecorder(device)
    fake = _fake_driver_class()(device)
    original_run = JITFunction.run

    def compile_only_run(self, *args, grid, warmup, **kwargs):
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None and hasattr(kernel, "metadata"):
            recorder.kernels.append(_record_of(kernel, self))
        return kernel

    with _lock:
        previous_active = driver_config._active
        registry = _jit_registry()
        saved_caches = {key: fn.device_caches for key, fn in registry.items()}
        for fn in registry.values():
            fn.device_caches = defaultdict(fn.create_binder)
        driver_config.set_active(fake)
        JITFunction.run = compile_only_run
        try:
            yield recorder
        finally:
            JITFunction.run = original_run
            driver_config._active = previous_active
            for key, fn in list(registry.items()):
                # Functions defined inside the block get a fresh cache too: theirs holds faked-target binders.
                fn.device_caches = saved_caches.get(key) or defaultdict(fn.create_binder)


# -- CUDA-only Python packages ------------------------------------------------------------------------------

STAND_IN_PACKAGES = ("sgl_kernel", "torchvision")
"""Packages that cannot be imported without a CUDA installation: ``sgl_kernel`` (SGLang's compiled CUDA
ops; no CPU build exists) and ``torchvision`` (PyPI's Linux wheel loads CUDA libraries and fails against
a CPU build of torch)."""


class StandInCalled(RuntimeError):
    """Code under audit called something from a stand-in package: it needs the real GPU library."""


class _StandInMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_subclassed"):
            return super().__call__()
        raise StandInCalled(
            f"{cls.__qualname__}() was called, but it belongs to a package this machine can only "
            "stand in for (it needs a CUDA GPU); the audit does not run it"
        )

    def __iter__(cls):
        return iter(())

    def __bool__(cls) -> bool:
        return True

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, item):
        return cls

    def __mro_entries__(cls, bases):  # pragma: no cover - types are subclassable directly
        return (cls,)


def _stand_in_class(qualname: str) -> type:
    def init_subclass(sub, **kwargs):
        sub._subclassed = True

    return _StandInMeta(
        qualname.rsplit(".", 1)[-1],
        (),
        {"__qualname__": qualname, "__module__": qualname, "__init_subclass__": classmethod(init_subclass)},
    )


class _StandInModule(__import__("types").ModuleType):
    """A module whose every attribute is a placeholder: importable, subclassable, never runnable."""

    __stand_in__ = True

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stand_in_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInFinder:
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+stand-in"
        return module

    def exec_module(self, module) -> None:
        return None


def _real_import_works(name: str) -> bool:
    import importlib
    import importlib.util
    import sys

    if name in sys.modules:
        return not getattr(sys.modules[name], "__stand_in__", False)
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - e.g. torchvision's RuntimeError on a CPU torch
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        return False


@contextlib.contextmanager
def stand_in_packages(names: tuple[str, ...] = STAND_IN_PACKAGES) -> Iterator[tuple[str, ...]]:
    """Let SGLang import ``names`` where they cannot be imported for real (no CUDA here).

    This stands in for GPU libraries this machine lacks. A package that imports for real is left alone.
    The others become placeholder modules: every attribute exists and can be subclassed or used in a type
    hint, but calling one raises :class:`StandInCalled`, so nothing from them silently takes part in an
    audit. Yields the names that were stood in for; removes the modules again on exit.
    """
    import sys

    missing = tuple(n for n in names if not _real_import_works(n))
    finder = _StandInFinder(missing)
    patch = _Patcher()
    if missing:
        sys.meta_path.insert(0, finder)
        import torch.library

        real_register_fake = torch.library.register_fake

        def register_fake(op, *args, **kwargs):
            # SGLang registers meta implementations for the ops of its CUDA library; with that library stood
            # in for, the ops do not exist, so the registration is skipped.
            if isinstance(op, str) and op.split("::", 1)[0] in missing:
                return (lambda fn: fn) if not args else args[0]
            return real_register_fake(op, *args, **kwargs)

        patch.set(torch.library, "register_fake", register_fake)
    try:
        yield missing
    finally:
        patch.restore()
        if missing:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
            for key in [k for k in sys.modules if k.split(".", 1)[0] in missing]:
                if getattr(sys.modules[key], "__stand_in__", False):
                    del sys.modules[key]
