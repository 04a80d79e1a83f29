# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""NVRTC and the CUDA driver through ctypes: compile CUDA source to a cubin, load it, launch its kernels.

Added to SGLang by sm120kit's ``sm120-mla-attention`` patch beside ``sm120_mla_mma.py``, its one user. It needs
no CUDA toolkit: NVRTC comes from the loader's path, a toolkit, or the ``nvidia-cuda-nvrtc`` wheel that CUDA
builds of torch depend on; the driver is ``libcuda.so.1``. Every failure is a :class:`CompileError`.
"""

import ctypes
import glob
import os
import sys
from collections.abc import Sequence


class CompileError(RuntimeError):
    """NVRTC or the driver is missing, or refused the source, the cubin or a call."""


def _load(path: str):
    """Load a library; NVRTC's builtins library beside it first, which NVRTC opens by name and which a
    wheel's folder is not on the loader's path for."""
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*"))):
        if ".alt." not in builtins:
            try:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
    return ctypes.CDLL(path)


def nvrtc_library():
    """NVRTC: from the loader's path, a CUDA toolkit, or an NVIDIA wheel on sys.path (CUDA builds of torch
    depend on ``nvidia-cuda-nvrtc``); None if there is none."""
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates = sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so.*")), reverse=True)
    for root in sys.path:
        for pattern in ("nvidia/cu13/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
            candidates += sorted(glob.glob(os.path.join(root, pattern)), reverse=True)
    for path in candidates:
        if ".alt." in path:
            continue
        try:
            return _load(path)
        except OSError:
            pass
    return None


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile ``source`` (the program named ``name``) to a cubin for ``arch`` (``sm_120a``, ``sm_90a``) with
    NVRTC and ``options`` (``--std=c++17``, ``-DNAME=VALUE``, ...); no GPU needed."""
    lib = nvrtc_library()
    if lib is None:
        raise CompileError("NVRTC (libnvrtc) was not found")
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc:
        raise CompileError(f"nvrtcCreateProgram returned {rc}")
    try:
        opts = [f"--gpu-architecture={arch}".encode()] + [option.encode() for option in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if rc:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC could not compile for {arch}: {log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)):
            raise CompileError(f"NVRTC gave no cubin for {arch}")
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(rc: int, what: str) -> None:
    if rc:
        raise CompileError(f"{what} returned CUDA error {rc}")


class Module:
    """A cubin loaded into the current CUDA context, and its kernels."""

    def __init__(self, cubin: bytes):
        self.driver = ctypes.CDLL("libcuda.so.1")
        self.handle = ctypes.c_void_p()
        self.image = ctypes.create_string_buffer(cubin, len(cubin))  # kept while the module lives
        _check(self.driver.cuModuleLoadData(ctypes.byref(self.handle), self.image), "cuModuleLoadData")
        self.driver.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.driver.cuLaunchCooperativeKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 2

    def function(self, name: str, dynamic_shared: int) -> ctypes.c_void_p:
        """The kernel ``name``, allowed ``dynamic_shared`` bytes of dynamic shared memory (past 48 KB a kernel
        must be allowed them before its launch)."""
        function = ctypes.c_void_p()
        _check(
            self.driver.cuModuleGetFunction(ctypes.byref(function), self.handle, name.encode()), "cuModuleGetFunction"
        )
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(self.driver.cuFuncSetAttribute(function, 8, dynamic_shared), "cuFuncSetAttribute")
        return function

    def resident(self, function: ctypes.c_void_p, threads: int, dynamic_shared: int) -> int:
        """Programs of ``function`` one SM holds at once (a cooperative launch's limit)."""
        per_sm = ctypes.c_int()
        _check(
            self.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(per_sm), function, threads, ctypes.c_size_t(dynamic_shared)
            ),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )
        return per_sm.value

    def global_address(self, name: str) -> tuple[int, int]:
        """(device address, bytes) of the ``__device__`` variable ``name``."""
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        _check(
            self.driver.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), self.handle, name.encode()),
            "cuModuleGetGlobal",
        )
        return ptr.value, size.value

    def launch(
        self,
        function: ctypes.c_void_p,
        grid: tuple[int, int, int],
        threads: int,
        dynamic_shared: int,
        stream: int,
        args,
        cooperative: bool = False,
    ) -> None:
        """Launch ``function`` on ``stream`` with ``args`` (ctypes values, in the kernel's order); a cooperative
        launch where the programs wait for each other (all of them must be resident at once)."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        if cooperative:
            _check(
                self.driver.cuLaunchCooperativeKernel(
                    function, grid[0], grid[1], grid[2], threads, 1, 1, dynamic_shared, ctypes.c_void_p(stream), params
                ),
                "cuLaunchCooperativeKernel",
            )
            return
        _check(
            self.driver.cuLaunchKernel(
                function,
                grid[0],
                grid[1],
                grid[2],
                threads,
                1,
                1,
                dynamic_shared,
                ctypes.c_void_p(stream),
                params,
                None,
            ),
            "cuLaunchKernel",
        )
