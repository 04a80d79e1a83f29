"""Releases with the whole series applied, for tests that read what one patch wrote."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from packaging.version import Version
from repo_paths import REPO_ROOT

from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target


def copy_series(root: Path) -> Path:
    """A copy of the real series at ``root/patches/sglang`` beside a copy of the sources its [[files]] entries
    ship (``root/kernels/``): the repository's layout, so the copy loads on its own. Returns the series folder."""
    series = root / "patches" / "sglang"
    shutil.copytree(REPO_ROOT / "patches" / "sglang", series)
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return series


def patched_file_reader(tmp_path_factory, label: str, patch_id: str, path: str) -> Callable[[str], str]:
    """``read(version)`` -> the text of ``path`` in that release after the whole series, checking that
    ``patch_id`` applied in the variant for that release with no fuzz. Each release is patched once."""
    series = load_series()
    base = tmp_path_factory.mktemp(label)
    done: dict[str, str] = {}

    def read(version: str) -> str:
        if version not in done:
            dest = base / version
            try:  # the patch manager replaces files (temporary file + rename), so hard links are safe
                shutil.copytree(releases.fetch_release(version), dest, copy_function=os.link)
            except OSError:
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(releases.fetch_release(version), dest)
            result = apply_series(find_target(dest / "sglang"), series)
            assert result.exit_code == 0, result.message
            assert result.statuses[patch_id] == "applied", result.statuses
            plan = {p.patch_id: p for p in result.plan.patches}[patch_id]
            assert plan.variant is not None and Version(version) in plan.variant.releases
            assert all(h.fuzz == 0 for h in plan.hunks)
            done[version] = (dest / path).read_text(encoding="utf-8")
        return done[version]

    return read
