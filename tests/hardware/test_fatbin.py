"""The pure-Python fat-binary reader, checked against real nvcc output and cuobjdump, and on the published
sgl-kernel wheel that SGLang 0.5.23 pins."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_support import cuobjdump, cuobjdump_archs, cuobjdump_elf_arch_lines, nvcc, run_cli

from sm120kit.errors import IOFailure, UsageError
from sm120kit.hardware import fatbin
from sm120kit.sglang.releases import pip_download_argv
from sm120kit.util.cache import cache_dir

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc (CUDA >= 12.9) is not on PATH")
needs_cuobjdump = pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump not installed (build extra)")

KERNEL = """
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void scale(float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] *= 2.0f; }
"""


def _compile(tmp: Path, name: str, gencodes: list[str], *, shared: bool = False, extra=()) -> Path:
    src = tmp / f"{name}.cu"
    src.write_text(KERNEL)
    out = tmp / (f"lib{name}.so" if shared else f"{name}.o")
    argv = [nvcc(), "-Xcompiler", "-fPIC", *(f"-gencode=arch={g}" for g in gencodes), *extra, str(src), "-o", str(out)]
    argv.insert(1, "-shared" if shared else "-c")
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """Objects and libraries compiled for real for several targets (about 10 s)."""
    if nvcc() is None:
        pytest.skip("nvcc is not on PATH")
    tmp = tmp_path_factory.mktemp("fatbin")
    made = {
        "sm_120a": _compile(tmp, "a120", ["compute_120a,code=sm_120a"]),
        "sm_120": _compile(tmp, "p120", ["compute_120,code=sm_120"]),
        "sm_120f": _compile(tmp, "f120", ["compute_120f,code=sm_120f"]),
        "sm_121a": _compile(tmp, "a121", ["compute_121a,code=sm_121a"]),
        "sm_90a": _compile(tmp, "a90", ["compute_90a,code=sm_90a"]),
        "ptx_80": _compile(tmp, "ptx80", ["compute_80,code=compute_80"]),
        # a fat library like sgl-kernel's, compressed as CUDA 13 builds of it are (--compress-mode=size)
        "fat_compressed": _compile(
            tmp,
            "fatc",
            [
                "compute_90,code=sm_90",
                "compute_100f,code=sm_100f",
                "compute_120a,code=sm_120a",
                "compute_80,code=compute_80",
            ],
            shared=True,
            extra=["--compress-mode=size"],
        ),
        "fat_plain": _compile(tmp, "fatp", ["compute_90a,code=sm_90a", "compute_120a,code=sm_120a"], shared=True),
    }
    return made


@pytest.mark.slow
@needs_nvcc
def test_reader_names_each_target_with_its_suffix(objects):
    """sm_120, sm_120a and sm_120f are told apart from the entry flags alone."""
    for arch in ("sm_120a", "sm_120", "sm_120f", "sm_121a", "sm_90a"):
        lib = fatbin.inspect_library(objects[arch])
        assert lib.sass == (arch,), (arch, lib)
        assert lib.ptx == ()
    ptx = fatbin.inspect_library(objects["ptx_80"])
    assert ptx.sass == () and ptx.ptx == ("sm_80",)
    fat = fatbin.inspect_library(objects["fat_compressed"])
    assert fat.sass == ("sm_90", "sm_100f", "sm_120a")
    assert fat.ptx == ("sm_80",)
    assert fat.compressed_entries == fat.entries > 0  # the flags were read without decompressing
    assert set(dict(fat.sass_bytes)) == set(fat.sass) and dict(fat.ptx_bytes)["sm_80"] > 0
    assert fat.fatbin_bytes > sum(dict(fat.sass_bytes).values()) > 0
    plain = fatbin.inspect_library(objects["fat_plain"])
    assert plain.sass == ("sm_90a", "sm_120a") and plain.compressed_entries == 0


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_reader_agrees_with_cuobjdump(objects):
    for path in objects.values():
        lib = fatbin.inspect_library(path)
        sass, ptx = cuobjdump_archs(path)
        # cuobjdump --list-elf drops the family suffix in its file names (sm_100f -> sm_100) ...
        assert {a.removesuffix("f") if a.endswith("0f") or a.endswith("1f") else a for a in lib.sass} == sass, path
        assert set(lib.ptx) == ptx, path
        # ... while its ELF dump names the exact target, as the reader does
        if lib.sass:
            assert cuobjdump_elf_arch_lines(path) == set(lib.sass) | set(lib.ptx), path


@pytest.mark.slow
@needs_nvcc
def test_library_inside_a_wheel_reads_like_the_file(objects, tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(objects["fat_compressed"], "demo/sm100/libfatc.so")
        zf.write(objects["fat_plain"], "demo/libfatp.so")
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo/not_elf.so", b"not an ELF file")
    libs = {lib.label: lib for lib in fatbin.inspect_wheel(wheel)}
    assert set(libs) == {"demo/sm100/libfatc.so", "demo/libfatp.so"}
    on_disk = fatbin.inspect_library(objects["fat_compressed"])
    inside = libs["demo/sm100/libfatc.so"]
    assert (inside.sass, inside.ptx, inside.entries, inside.containers) == (
        on_disk.sass,
        on_disk.ptx,
        on_disk.entries,
        on_disk.containers,
    )
    assert inside.wheel == wheel and inside.name == "libfatc"
    # a folder holding the wheel and a library
    shutil.copy(objects["fat_plain"], tmp_path / "libextra.so")
    found = fatbin.inspect_path(tmp_path)
    assert {lib.label for lib in found} >= {"demo/libfatp.so", (tmp_path / "libextra.so").as_posix()}


def test_bad_inputs_give_clear_errors(tmp_path):
    text = tmp_path / "notes.so"
    text.write_text("hello")
    with pytest.raises(UsageError, match="not an ELF file"):
        fatbin.inspect_library(text)
    with pytest.raises(UsageError, match="does not exist"):
        fatbin.inspect_path(tmp_path / "missing.so")
    with pytest.raises(UsageError, match="not a wheel"):
        fatbin.inspect_wheel(text)
    # an ELF header whose section table lies past the end of the file
    broken = tmp_path / "broken.so"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, 10_000)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    broken.write_bytes(bytes(header))
    with pytest.raises(IOFailure, match="truncated"):
        fatbin.inspect_library(broken)
    # a host library with no device code: no archs, no error
    host_lib = Path(sys.executable).resolve()
    lib = fatbin.inspect_library(host_lib)
    assert lib.sass == () and lib.ptx == () and lib.containers == 0


# -- the published wheel ------------------------------------------------------------------------------------
PINNED_KERNEL = "sglang-kernel==0.4.10"  # what sglang 0.5.23 requires


@pytest.fixture(scope="session")
def published_wheel() -> Path:
    """The sglang-kernel wheel SGLang 0.5.23 pins (373 MB), downloaded once into the sm120kit cache."""
    folder = cache_dir() / "kernel-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("sglang_kernel-0.4.10-*.whl"))
    if not found:
        platforms = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
        subprocess.run(pip_download_argv(PINNED_KERNEL, folder, platforms), check=True, timeout=1200)
        found = sorted(folder.glob("sglang_kernel-0.4.10-*.whl"))
    assert found, f"pip download {PINNED_KERNEL} left no wheel in {folder}"
    return found[0]


@pytest.mark.slow
def test_published_wheel_carries_sm120a_in_common_ops_only(published_wheel, tmp_path):
    libs = {lib.label: lib for lib in fatbin.inspect_wheel(published_wheel)}
    common = libs["sgl_kernel/sm100/common_ops.abi3.so"]
    assert "sm_120a" in common.sass
    assert "sm_120a" in libs["sgl_kernel/sm90/common_ops.abi3.so"].sass
    flash = libs["sgl_kernel/flash_ops.abi3.so"]
    assert flash.sass and not any(a.startswith("sm_12") for a in flash.sass + flash.ptx)
    assert not any(a.startswith("sm_12") for a in libs["sgl_kernel/flashmla_ops.abi3.so"].sass)
    assert all(lib.ptx == () for lib in libs.values())  # no PTX a 12.x driver could fall back to
    if cuobjdump():  # cross-check one library extracted from the wheel
        with zipfile.ZipFile(published_wheel) as zf:
            zf.extract("sgl_kernel/sm100/common_ops.abi3.so", tmp_path)
        sass, ptx = cuobjdump_archs(tmp_path / "sgl_kernel/sm100/common_ops.abi3.so")
        assert {a[:-1] if a.endswith("0f") else a for a in common.sass} == sass and ptx == set()
    # the CLI: table, JSON, and --require failing on the libraries without sm_120a
    proc = run_cli("inspect-so", str(published_wheel), "--json", "--require", "12.0a")
    assert proc.returncode == 13, proc.stderr
    data = json.loads(proc.stdout.split('\n{\n  "error"')[0] if '"error"' in proc.stdout else proc.stdout)
    assert set(data["lacking"]) == {"sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so"}
    assert "flash_ops.abi3.so" in proc.stderr and "sm_120a" in proc.stderr
