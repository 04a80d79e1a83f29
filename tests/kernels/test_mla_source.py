"""The files of the ``sm120-mla-attention`` kernels (kernels/sm120_attention/): their names, their format, the
figures the CUDA source takes from the launcher, and how they import each other. No compile here (the NVRTC
compiles are in tests/kernels/test_mla_kernels.py)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

KERNEL_DIR = REPO_ROOT / "kernels" / "sm120_attention"
CUDA_SOURCE = KERNEL_DIR / "sm120_mla_mma.cu"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_files() -> tuple[str, ...]:
    """The generator's list of the files the patch ships (scripts/gen_mla_patch.py, a script)."""
    return _load(REPO_ROOT / "scripts" / "gen_mla_patch.py", "gen_mla_patch").KERNEL_FILES


def clang_format() -> str:
    """The clang-format of the test extra (constraints/ci.txt pins it): beside this Python, else on PATH."""
    here = Path(sys.executable).parent / "clang-format"
    found = str(here) if here.is_file() else shutil.which("clang-format")
    assert found, "clang-format is missing: pip install -c constraints/ci.txt -e '.[test]'"
    return found


def format_violations(path: Path) -> str:
    """clang-format's complaints about ``path`` under the repository's .clang-format (empty: none)."""
    proc = subprocess.run(
        [clang_format(), f"--style=file:{REPO_ROOT / '.clang-format'}", "--dry-run", "--Werror", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stderr if proc.returncode else ""


def test_the_cuda_source_is_clang_formatted():
    problems = format_violations(CUDA_SOURCE)
    assert not problems, f"run: clang-format -i {CUDA_SOURCE.relative_to(REPO_ROOT)}\n{problems[:3000]}"


def test_the_format_check_fails_on_a_violation(tmp_path):
    bad = tmp_path / "sm120_mla_mma.cu"
    bad.write_text(CUDA_SOURCE.read_text(encoding="utf-8").replace("    __syncthreads();\n", "  __syncthreads();\n", 1))
    assert "sm120_mla_mma.cu" in format_violations(bad)


def test_every_shipped_file_is_named_sm120_mla_and_every_such_file_is_shipped():
    """Inside SGLang the files sit among its own attention kernels: the sm120_mla prefix keeps them apart, and
    a new kernel file cannot be left out of the patch."""
    shipped = kernel_files()
    assert all(name.startswith("sm120_mla") for name in shipped), shipped
    assert shipped[0] == "sm120_mla.py"  # the module the backend hook imports
    assert {p.name for p in KERNEL_DIR.iterdir() if p.name.startswith("sm120_mla")} == set(shipped)


def test_the_cuda_source_names_the_launcher_figures_and_defines_none_of_them():
    from sm120_attention import sm120_mla_mma as mma

    source = CUDA_SOURCE.read_text(encoding="utf-8")
    defined = set(re.findall(r"^\s*#\s*define\s+(\w+)", source, re.MULTILINE))
    assert not defined & set(mma.FIGURES), defined & set(mma.FIGURES)
    for name in mma.FIGURES:
        assert re.search(rf"\b{name}\b", source.split("typedef", 1)[1]), f"{name} is passed but not used"


def test_the_shared_memory_figures_are_the_hardware_ones():
    from sm120_attention import sm120_mla
    from sm120_attention import sm120_mla_mma as mma
    from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK

    assert mma.SMEM_LIMIT == sm120_mla.SMEM_LIMIT_SM120 == SM120_SHARED_MEMORY_PER_BLOCK
    assert max(mma.SMEM_BYTES.values()) <= mma.SMEM_LIMIT
    assert mma.FIGURES["SMEM_BYTES_BF16"] == 91904 and mma.FIGURES["SMEM_BYTES_FP8"] == 92416  # the cubins' figures


@pytest.mark.parametrize("module", ["sm120_mla", "sm120_mla_mma"])
def test_a_copy_loaded_from_its_file_finds_its_sibling_files(tmp_path, module):
    """Another revision of the kernels (bench_mla.py --baseline) is loaded from its files, not as a package:
    each module then loads the siblings it imports from beside itself, never the package's."""
    for name in kernel_files():
        shutil.copy(KERNEL_DIR / name, tmp_path / name)
    loaded = _load(tmp_path / f"{module}.py", f"{module}_copy")
    siblings = [loaded.cuda_prefix, loaded.routes] if module == "sm120_mla" else [loaded.nvrtc]
    for sibling in siblings:
        assert Path(sibling.__file__).parent == tmp_path
    mma = loaded.cuda_prefix if module == "sm120_mla" else loaded
    assert mma.SOURCE_PATH == str(tmp_path / "sm120_mla_mma.cu")


def test_the_package_imports_its_siblings_relatively():
    from sm120_attention import sm120_mla

    assert sm120_mla.cuda_prefix.__name__ == "sm120_attention.sm120_mla_mma"
    assert sm120_mla.routes.__name__ == "sm120_attention.sm120_mla_route"
    assert sm120_mla.cuda_prefix.nvrtc.__name__ == "sm120_attention.sm120_mla_nvrtc"


@pytest.mark.parametrize("kind", ["tree-verify", "mla-decode"])
def test_the_audit_keys_its_cache_on_every_shipped_file(tmp_path, kind):
    """`sm120kit audit` caches its compile results by the source of each launcher's files: for the two launchers
    of this patch those are every file it ships (an edit of the .cu alone must compile again)."""
    from sm120kit.sglang import launchers

    package = tmp_path / "sglang" / "kernels" / "ops" / "attention"
    package.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    for name in kernel_files():
        shutil.copy(KERNEL_DIR / name, package / name)
    resolved = launchers.resolve(tmp_path, kind)
    assert resolved.module == "sglang.kernels.ops.attention.sm120_mla"
    assert sorted(path.name for path in resolved.files) == sorted(kernel_files())


def test_the_patch_ships_every_kernel_file_in_both_packages():
    """patch.toml's [[files]] entries: each of KERNEL_FILES into the old and the new attention package."""
    from sm120kit.patching.series import load_series

    patch = load_series(REPO_ROOT / "patches" / "sglang").get("sm120-mla-attention")
    shipped = {(entry.source, entry.dest, str(entry.releases)) for entry in patch.shipped}
    want = {
        (f"kernels/sm120_attention/{name}", f"{package}/{name}", releases)
        for name in kernel_files()
        for package, releases in (
            ("sglang/srt/layers/attention/triton_ops", "<0.5.16"),
            ("sglang/kernels/ops/attention", ">=0.5.16"),
        )
    }
    assert shipped == want
