"""Helpers shared by the patch manager's tests: tree hashes, the CLI as a subprocess, small series."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from repo_paths import DATA_DIR, REPO_ROOT

DEMO_SERIES = DATA_DIR / "demo-series"

# What the demonstration series does on each core release (checked against the real files).
DEMO_EXPECTED = {
    "0.5.2": {
        "demo-capability-helper": "applies",
        "demo-extend-attention-note": "applies",
        "demo-new-module": "applies",
    },
    **{
        v: {
            "demo-capability-helper": "present-upstream",
            "demo-extend-attention-note": "applies",
            "demo-new-module": "applies",
        }
        for v in ("0.5.6", "0.5.10", "0.5.17", "0.5.23")
    },
}
DEMO_FILES = {
    "0.5.2": {
        "sglang/srt/utils.py",
        "sglang/srt/layers/attention/triton_ops/extend_attention.py",
        "sglang/srt/sm120kit_demo.py",
    },
    **{
        v: {"sglang/srt/layers/attention/triton_ops/extend_attention.py", "sglang/srt/sm120kit_demo.py"}
        for v in ("0.5.6", "0.5.10")
    },
    **{
        v: {"sglang/kernels/ops/attention/extend_attention.py", "sglang/srt/sm120kit_demo.py"}
        for v in ("0.5.17", "0.5.23")
    },
}


def tree_hashes(root: Path, skip: tuple[str, ...] = (".git",)) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: relative path -> (sha256, permission bits)."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            path = Path(dirpath) / name
            data = path.read_bytes()
            out[path.relative_to(root).as_posix()] = (hashlib.sha256(data).hexdigest(), path.stat().st_mode & 0o7777)
    return out


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m sm120kit ARGS`` in a subprocess (the real entry point, exit codes included)."""
    full_env = dict(os.environ)
    full_env.setdefault("NO_COLOR", "1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO_ROOT,
        timeout=300,
    )


def run_json(*args: str, env: dict | None = None) -> tuple[int, dict]:
    proc = run_cli(*args, "--json", env=env)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"not JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from exc


def make_diff(root: Path, rel: str, edit) -> str:
    """A unified diff (a/sglang/... b/sglang/...) of ``edit(text) -> text`` applied to ``root/rel``."""
    old = (root / rel).read_text(encoding="utf-8")
    new = edit(old)
    assert new != old, f"the edit changed nothing in {rel}"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{rel}", tofile=f"b/{rel}"
    )
    return "".join(lines)


def write_series(folder: Path, patches: list[dict]) -> Path:
    """Write a series: each dict has id, diffs {name: text}, variants [(diff, releases, base)], markers."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = ", ".join(f'"{p["id"]}"' for p in patches)
    (folder / "series.toml").write_text(f"patches = [{ids}]\n")
    for p in patches:
        pdir = folder / p["id"]
        pdir.mkdir()
        for name, text in p["diffs"].items():
            (pdir / name).write_text(text)
        variants = "".join(
            f'\n[[variants]]\ndiff = "{d}"\nreleases = "{r}"\nbase = "{b}"\n' for d, r, b in p["variants"]
        )
        markers = "".join(
            f"\n[[markers]]\nfile = \"{f}\"\npattern = '{pat}'\n"
            for f, pat in p.get("markers", [("sglang/srt/never.py", "never")])
        )
        (pdir / "patch.toml").write_text(
            textwrap.dedent(f"""\
            id = "{p["id"]}"
            title = "{p.get("title", "test patch")}"
            description = "A patch written by a test."
            problem = "None; it exercises the patch manager."

            [upstream]
            forwarded = false
            reason = "test data"
            """)
            + variants
            + markers
        )
    return folder


SMALL_UTILS = "".join(f"def helper_{i}():\n    return {i}\n\n\n" for i in range(40))


def small_tree(folder: Path, version: str = "0.5.2", utils: str = SMALL_UTILS) -> Path:
    """A minimal SGLang-shaped package (``folder/sglang`` with ``srt/utils.py``) that ``find_target`` accepts;
    for tests that need many trees or a tree on a small file system. Returns the package folder."""
    package = folder / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "utils.py").write_text(utils)
    return package


def utils_series(folder: Path, root: Path, *, extra_diff: str = "", markers=None) -> Path:
    """A one-patch series on ``small_tree``: edits ``sglang/srt/utils.py`` (plus ``extra_diff`` appended)."""
    diff = make_diff(root, "sglang/srt/utils.py", lambda t: t.replace("return 3\n", "return 3  # sm120\n"))
    patch = {"id": "edit-utils", "diffs": {"a.diff": diff + extra_diff}, "variants": [("a.diff", ">=0.5", "0.5.2")]}
    if markers is not None:
        patch["markers"] = markers
    return write_series(folder, [patch])
