# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""NVRTC and the CUDA driver through ctypes: compile CUDA source to a cubin, load it, launch its kernels.

Added to SGLang by sm120kit's ``sm120-mla-attention`` patch beside ``sm120_mla_mma.py``, its one user. It needs
no CUDA toolkit: NVRTC comes from the loader's path, a toolkit, or the ``nvidia-cuda-nvrtc`` wheel that CUDA
builds of torch depend on; the driver is ``libcuda.so.1``. Every failure is a :class:`CompileError`.

Compiled cubins are kept on disk (:func:`cache_dir`), keyed by the source, its name, the target, the options and
NVRTC's version, each with the SHA-256 of its bytes, which is checked when it is read: a later process (each
tensor-parallel rank, each server start) loads the kernels instead of compiling them again, and processes that
start together compile once (a lock file per key; the others wait and read its result).
"""

import contextlib
import ctypes
import glob
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process compiles what it finds no file for
    fcntl = None

CACHE_ENV = "SGLANG_SM120_MLA_CACHE_DIR"
_CACHE_MAGIC = b"sm120-mla-cubin 1 "  # then the payload's SHA-256 in hex and a newline
_CACHE_MAX_BYTES = 64 << 20  # a cubin of these kernels is about 1 MB; anything larger is not ours


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


def cache_dir() -> str | None:
    """Where compiled cubins are kept: ``$SGLANG_SM120_MLA_CACHE_DIR``, else ``sglang/sm120_mla`` in
    ``$XDG_CACHE_HOME`` (``~/.cache``); None (compile every time) where the variable is empty, ``0`` or ``off``."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "0", "off", "false", "no") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang", "sm120_mla")


def nvrtc_version(lib) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)):
        return "unknown"
    return f"{major.value}.{minor.value}"


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile ``source`` (the program named ``name``) to a cubin for ``arch`` (``sm_120a``, ``sm_90a``) with
    NVRTC and ``options`` (``--std=c++17``, ``-DNAME=VALUE``, ...); no GPU needed. A cubin compiled before from
    the same inputs by the same NVRTC is read from :func:`cache_dir` instead."""
    lib = nvrtc_library()
    if lib is None:
        raise CompileError("NVRTC (libnvrtc) was not found")
    folder = cache_dir()
    if folder is None:
        return _compile(lib, source, name, arch, options)
    key = hashlib.sha256(
        "\0".join(["sm120-mla-nvrtc 1", nvrtc_version(lib), arch, name, *options, source]).encode()
    ).hexdigest()
    path = os.path.join(folder, key + ".cubin")
    cubin = _read_cached(path)
    if cubin is not None:
        return cubin
    with _key_lock(folder, key):  # another process compiling the same key: wait for it, then read its file
        cubin = _read_cached(path)
        if cubin is None:
            cubin = _compile(lib, source, name, arch, options)
            _write_cached(folder, path, cubin)
    return cubin


def _read_cached(path: str) -> bytes | None:
    """The cubin kept at ``path``, or None: no file, not a plain file, too large, or its bytes differ from the
    SHA-256 written with them (a torn or altered file is compiled again and replaced)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _CACHE_MAX_BYTES:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(_CACHE_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    head, _, payload = data.partition(b"\n")
    if not head.startswith(_CACHE_MAGIC) or head[len(_CACHE_MAGIC) :] != hashlib.sha256(payload).hexdigest().encode():
        return None
    return payload or None


def _write_cached(folder: str, path: str, cubin: bytes) -> None:
    """Keep ``cubin`` at ``path`` (written to a temporary file and renamed: readers see all of it or none); a
    folder that cannot be written only means the next process compiles again."""
    tmp = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(_CACHE_MAGIC + hashlib.sha256(cubin).hexdigest().encode() + b"\n" + cubin)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _key_lock(folder: str, key: str) -> Iterator[None]:
    """Hold the lock file of ``key`` in ``folder`` (none where the folder cannot be written or there is no
    ``fcntl``): processes that start together compile once."""
    fd = -1
    if fcntl is not None:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(
                os.path.join(folder, key + ".lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd >= 0:
                os.close(fd)
            fd = -1
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing releases the lock


def _compile(lib, source: str, name: str, arch: str, options: Sequence[str]) -> bytes:
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
