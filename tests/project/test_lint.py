"""ruff's lint and format checks over the repository ([tool.ruff] in pyproject.toml): CI fails on a violation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT


def _ruff() -> str:
    here = Path(sys.executable).parent / "ruff"
    found = str(here) if here.is_file() else shutil.which("ruff")
    assert found, "ruff is missing: pip install -c constraints/ci.txt -e '.[test]'"
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_ruff(), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean():
    proc = _run("check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_is_clean():
    proc = _run("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_lint_check_fails_on_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx=1\n")
    config = f"--config={REPO_ROOT / 'pyproject.toml'}"
    assert subprocess.run([_ruff(), "check", "--no-cache", config, str(bad)], capture_output=True).returncode == 1
    assert (
        subprocess.run([_ruff(), "format", "--check", "--no-cache", config, str(bad)], capture_output=True).returncode
        == 1
    )
