"""The driver-link check of build-kernel's wheels (sm120kit.hardware.dynlinks), on libraries linked here by gcc.

The full sglang-kernel 0.4.6.post1 build on a compiler-only toolkit linked its libraries against an empty
``libcuda.so`` stub: ``--as-needed`` dropped the driver from ``NEEDED`` and ``common_ops`` failed to import
(``undefined symbol: cuPointerGetAttribute``). These tests link the same way, with the empty stub and with a stub
that defines the function, and check that the reader and ``build.driver_unlinked`` (from the same pass over the
wheel as the architectures, ``fatbin.inspect_wheel``) tell the two apart.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sm120kit.errors import IOFailure, UsageError
from sm120kit.hardware import dynlinks, fatbin
from sm120kit.kernel import build

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (nvcc's host compiler)")

CALLER = """
typedef int CUresult;
CUresult cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr);
int ask(void *p) { return cuPointerGetAttribute(p, 1, 0ull); }
"""


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True, timeout=120)


def _link(tmp: Path, stub_body: str) -> Path:
    """A library calling the driver, linked with --as-needed against a libcuda.so holding ``stub_body``."""
    stubs = tmp / "stubs"
    stubs.mkdir()
    (stubs / "stub.c").write_text(stub_body)
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"), str(stubs / "stub.c"))
    (tmp / "caller.c").write_text(CALLER)
    lib = tmp / "common_ops.abi3.so"
    _gcc("-shared", "-fPIC", "-o", str(lib), str(tmp / "caller.c"), "-Wl,--as-needed", f"-L{stubs}", "-lcuda")
    return lib


def _wheel(tmp: Path, lib: Path) -> Path:
    wheel = tmp / "mini_kernel-0.1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(lib, "mini_kernel/sm100/common_ops.abi3.so")
        zf.writestr("mini_kernel/__init__.py", "")
    return wheel


def test_an_empty_driver_stub_leaves_the_driver_out_and_the_check_names_the_library(tmp_path):
    lib = _link(tmp_path, "int cuda_stub_placeholder;\n")
    links = dynlinks.read_links(lib.read_bytes(), lib.name)
    assert "cuPointerGetAttribute" in links.undefined and links.driver_calls == ("cuPointerGetAttribute",)
    assert dynlinks.DRIVER_LIBRARY not in links.needed and links.driver_unlinked
    (message,) = build.driver_unlinked(fatbin.inspect_wheel(_wheel(tmp_path, lib)))
    assert message.startswith("mini_kernel/sm100/common_ops.abi3.so calls 1 CUDA driver function(s)")
    assert "cuPointerGetAttribute" in message and "libcuda.so.1" in message


def test_a_stub_that_defines_the_function_links_the_driver(tmp_path):
    lib = _link(tmp_path, "int cuPointerGetAttribute(void) { return 999; }\n")
    links = dynlinks.read_links(lib.read_bytes(), lib.name)
    assert dynlinks.DRIVER_LIBRARY in links.needed and not links.driver_unlinked
    assert build.driver_unlinked(fatbin.inspect_wheel(_wheel(tmp_path, lib))) == ()


def test_damaged_libraries_are_errors_not_tracebacks(tmp_path):
    lib = _link(tmp_path, "int cuPointerGetAttribute(void) { return 999; }\n")
    data = lib.read_bytes()
    with pytest.raises(UsageError, match="not an ELF file"):
        dynlinks.read_links(b"#!/bin/sh\n" + data, "script")
    with pytest.raises(IOFailure, match="section table lies outside the file"):
        dynlinks.read_links(data[: len(data) // 2], "half")
