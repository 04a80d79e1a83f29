"""Helpers for the build-kernel, fetch-deps and inspect-so tests: tools on this machine, the fixture
kernel project and its dependency mirror, and the CLI as a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from prove_kernel_wheel import cuobjdump_targets
from prove_kernel_wheel import find_cuobjdump as cuobjdump
from repo_paths import PACKAGES_DIR as PACKAGES

FIXTURE = PACKAGES / "mini_kernel"
UNREACHABLE_URL = "https://sm120kit.invalid"  # the fixture's default MINI_DEPS_URL (.invalid never resolves)
FIXTURE_MAGIC = 4242 * 3  # MINIDEP_MAGIC * MINIDATA_SCALE, from the two dependencies' headers


def nvcc() -> str | None:
    return shutil.which("nvcc")


def cuobjdump_archs(path: Path) -> tuple[set[str], set[str]]:
    """(SASS archs, PTX archs) as ``cuobjdump --list-elf/--list-ptx`` name them (``sm_120a``)."""
    tool = cuobjdump()
    assert tool, "cuobjdump not found"
    return cuobjdump_targets(tool, path)


def cuobjdump_elf_arch_lines(path: Path) -> set[str]:
    """``arch = sm_120f`` lines of ``cuobjdump -elf`` (the exact target, suffix included)."""
    proc = subprocess.run([cuobjdump(), "-elf", str(path)], capture_output=True, text=True)
    return set(re.findall(r"^arch = (sm_\d+[a-z]?)$", proc.stdout, re.M))


def git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t.invalid",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_dependency_mirror(root: Path) -> Path:
    """A local stand-in for the fixture's download host: ``minidep.git`` (tag v1.0) and the archive."""
    mirror = root / "mirror"
    repo = mirror / "minidep.git"
    shutil.copytree(PACKAGES / "minidep", repo)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "minidep 1.0", cwd=repo)
    git("tag", "v1.0", cwd=repo)
    shutil.copy(PACKAGES / "minidata-1.0.tar.gz", mirror)
    return mirror


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m sm120kit ARGS`` in a subprocess, with this interpreter's scripts folder on PATH."""
    full = dict(os.environ)
    full["PATH"] = str(Path(sys.executable).parent) + os.pathsep + full.get("PATH", "")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "sm120kit", *args], capture_output=True, text=True, env=full, cwd=cwd)
