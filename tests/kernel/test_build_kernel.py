"""build-kernel and fetch-deps for real: the fixture kernel project (tests/packages/mini_kernel, with
sgl-kernel's build interface) is compiled by nvcc for 12.0a, its dependencies come from --deps-dir, the
wheel is installed and imported (no GPU is touched: the import only registers the fat binaries)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_support import FIXTURE_MAGIC, copy_fixture, cuobjdump, cuobjdump_archs, make_dependency_mirror, nvcc, run_cli

from sm120kit.hardware import fatbin

pytestmark = [pytest.mark.slow, pytest.mark.skipif(nvcc() is None, reason="nvcc (CUDA >= 12.8) is not on PATH")]


def _json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel-build")
    mirror = make_dependency_mirror(root)
    src = copy_fixture(root / "src")
    env = {"CCACHE_DIR": str(root / "ccache")}
    fetched = _json(
        run_cli(
            "fetch-deps", str(src), "--into", str(root / "deps"), "--set", f"MINI_DEPS_URL={mirror.as_uri()}", "--json"
        )
    )
    built = _json(
        run_cli(
            "build-kernel",
            str(src),
            "--arch",
            "12.0a",
            "--out",
            str(root / "out"),
            "--deps-dir",
            str(root / "deps"),
            "--json",
            env=env,
        )
    )
    return {"root": root, "src": src, "env": env, "fetched": fetched, "built": built, "mirror": mirror}


def test_fetch_deps_fetches_git_and_archive_dependencies(workspace):
    deps = {d["name"]: d for d in workspace["fetched"]["dependencies"]}
    assert deps["repo-minidep"]["status"] == "fetched" and len(deps["repo-minidep"]["revision"]) == 40
    assert deps["repo-minidata"]["revision"] == "b449faae6f5de342e0f0b9a5132eb5a1ea5f8ea27faf50626cadc00f3d964bc8"
    root = workspace["root"]
    assert (root / "deps" / "repo-minidep" / "include" / "minidep" / "minidep.h").is_file()
    assert (root / "deps" / "repo-minidata" / "minidata.h").is_file()  # the archive's top folder is stripped
    again = _json(
        run_cli(
            "fetch-deps",
            str(workspace["src"]),
            "--into",
            str(root / "deps"),
            "--set",
            f"MINI_DEPS_URL={workspace['mirror'].as_uri()}",
            "--json",
        )
    )
    assert {d["status"] for d in again["dependencies"]} == {"present"}


def test_wheel_holds_only_sm120a_in_every_library_loaded_on_12x(workspace):
    built = workspace["built"]
    assert built["ok"] is True
    libs = {lib["path"]: lib for lib in built["libraries"]}
    common = libs[next(p for p in libs if p.startswith("mini_kernel/sm100/common_ops"))]
    assert common["sass"] == ["sm_120a"] and common["ptx"] == [] and common["loaded_on_sm12x"]
    sm90 = libs[next(p for p in libs if p.startswith("mini_kernel/sm90/common_ops"))]
    assert sm90["sass"] == ["sm_120a"] and not sm90["loaded_on_sm12x"]
    # FA3-like flash_ops switched off by SGL_KERNEL_ENABLE_FA3=OFF
    assert not any("flash_ops" in p for p in libs)
    # FlashMLA-like library (no switch; its code does not assemble for sm_120a): PTX of its own target only
    mla = libs[next(p for p in libs if "flashmla_ops" in p)]
    assert mla["sass"] == [] and mla["ptx"] == ["sm_90a"] and not mla["loaded_on_sm12x"]
    assert built["launcher"] == {"foreign-ptx": 1, "replaced": 2}
    assert built["steps"][0] == built["steps"][1] > 0
    launcher_log = Path(built["plan"]["out_dir"]) / "sm120kit-launcher.log"
    lines = launcher_log.read_text().splitlines()
    assert any(
        line.startswith(
            "replaced\tsm_90,sm_100f,sm_120a\tarch=compute_120a,code=sm_120a"
        )  # 80/89: ENABLE_BELOW_SM90=OFF
        for line in lines
    ), lines


@pytest.mark.skipif(cuobjdump() is None, reason="cuobjdump not installed (build extra)")
def test_reader_agrees_with_cuobjdump_on_the_built_wheel(workspace, tmp_path):
    wheel = Path(workspace["built"]["wheel"])
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".so")]
        zf.extractall(tmp_path, members)
    assert members
    for member in members:
        lib = fatbin.inspect_library(tmp_path / member)
        assert (set(lib.sass), set(lib.ptx)) == cuobjdump_archs(tmp_path / member), member


def test_wheel_installs_and_imports(workspace, tmp_path):
    wheel = workspace["built"]["wheel"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(tmp_path / "site"),
            wheel,
        ],
        check=True,
    )
    code = "import mini_kernel; m = mini_kernel.load_common_ops(); print(m.magic(), m.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    assert proc.returncode == 0, proc.stderr
    magic, path = proc.stdout.split()
    assert int(magic) == FIXTURE_MAGIC  # both dependencies' headers were compiled in
    assert "/sm100/common_ops" in path


def test_dependencies_came_from_deps_dir_without_network(workspace, tmp_path):
    cache = (Path(workspace["built"]["plan"]["build_dir"]) / "CMakeCache.txt").read_text()
    deps = workspace["root"] / "deps"
    assert re.search(r"^FETCHCONTENT_FULLY_DISCONNECTED:\w+=ON$", cache, re.M)
    assert re.search(
        rf"^FETCHCONTENT_SOURCE_DIR_REPO-MINIDEP:\w+={re.escape(str(deps / 'repo-minidep'))}$", cache, re.M
    )
    # without --deps-dir, CMake would have to reach the declared (unresolvable) host: the build fails,
    # and the error names the log file
    proc = run_cli("build-kernel", str(workspace["src"]), "--out", str(tmp_path / "out"), "--no-ccache")
    assert proc.returncode == 12, proc.stderr
    log = tmp_path / "out" / "sm120kit-build.log"
    assert f"Full log: {log}" in proc.stderr
    assert "sm120kit.invalid" in log.read_text()


def test_build_folder_reuse_arch_change_and_ccache(workspace, tmp_path):
    root, env = workspace["root"], workspace["env"]
    args = [
        "build-kernel",
        str(workspace["src"]),
        "--out",
        str(root / "out"),
        "--deps-dir",
        str(root / "deps"),
        "--json",
    ]
    again = _json(run_cli(*args, env=env))
    assert again["reused_build_dir"] is True and again["cleared_build_dir"] is None and again["ok"]
    start = again["build_dir_at_start"]
    assert start["reused"] and start["objects_total"] >= 3 and start["objects_built"] == start["objects_total"]

    # an interrupted build: one object missing from the folder; the next run says how far it had got
    objects = sorted((root / "out" / "build").rglob("*.cu.o"))
    assert objects, "the build folder holds no CUDA objects"
    objects[0].unlink()
    proc = run_cli(*args[:-1], env=env)  # without --json: the statement on the console
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = start["objects_total"]
    assert f"resuming in {root / 'out' / 'build'}: {total - 1} of {total} objects already built" in (
        proc.stdout + proc.stderr
    )
    assert objects[0].is_file()  # ninja built it again

    spark = _json(run_cli(*args, "--arch", "12.1a", env=env))
    assert spark["cleared_build_dir"] == "the arch list changed (sm_120a -> sm_121a)"
    common = next(lib for lib in spark["libraries"] if lib["path"].startswith("mini_kernel/sm100/"))
    assert common["sass"] == ["sm_121a"]

    if spark["plan"]["toolchain"]["ccache"] is None:
        pytest.skip("no ccache on PATH")
    # a fresh output folder compiles nothing new: every object comes from ccache
    ccache = spark["plan"]["toolchain"]["ccache"]
    before = _ccache_hits(ccache, env)
    fresh = _json(
        run_cli(
            "build-kernel",
            str(workspace["src"]),
            "--out",
            str(tmp_path / "fresh"),
            "--deps-dir",
            str(root / "deps"),
            "--json",
            env=env,
        )
    )
    assert fresh["ok"] and fresh["reused_build_dir"] is False
    assert _ccache_hits(ccache, env) - before >= 3  # the three CUDA objects (and the C++ ones)


def _ccache_hits(ccache: str, env: dict) -> int:
    proc = subprocess.run(
        [ccache, "--print-stats"], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    stats = dict(line.split("\t") for line in proc.stdout.splitlines() if "\t" in line)
    return int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))


@pytest.mark.parametrize("link_target", ["/tmp", "../.."])
def test_archive_with_a_link_out_of_the_folder_is_refused(tmp_path, link_target):
    """A symlink entry that points out of the unpack folder, followed by an entry written through it, is
    refused before anything lands outside (tarfile's "data" filter)."""
    import io
    import tarfile
    from types import SimpleNamespace

    from sm120kit.errors import DownloadError
    from sm120kit.kernel import deps

    outside = tmp_path / "outside"
    outside.mkdir()
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("src/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = str(outside) if link_target == "/tmp" else link_target
        tar.addfile(link)
        payload = b"owned\n"
        member = tarfile.TarInfo("src/escape/planted.txt")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    dest = tmp_path / "dest"
    dest.mkdir()
    dep = SimpleNamespace(name="evil", url="https://example.invalid/evil.tar.gz")
    with pytest.raises(DownloadError) as err:
        deps._extract(archive, dest, dep)
    assert "unsafe entry" in str(err.value) and "'evil'" in str(err.value)
    assert not (outside / "planted.txt").exists()
    assert not any(p.name == "planted.txt" for p in tmp_path.rglob("*"))
