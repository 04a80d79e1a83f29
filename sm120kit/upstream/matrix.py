"""The upgrade matrix: the series checked on many releases, refs and folders, one row per target.

Releases are downloaded in parallel and unpacked once in the cache, then read in place; each row is
:func:`sm120kit.upstream.check.check_upstream` on one target.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sm120kit.patching.series import Series
from sm120kit.sglang import releases
from sm120kit.sglang.gitrepo import SglangClone
from sm120kit.upstream.check import (
    EXIT_CONFLICT,
    EXIT_OK,
    EXIT_WARNINGS,
    BaseFiles,
    SeriesCheck,
    check_upstream,
    open_folder,
    open_ref,
    open_release,
)
from sm120kit.util.report import Progress, Step, tell


@dataclass(frozen=True)
class UpgradeMatrix:
    """The upgrade check of a series against several targets: one row per release (or ref), one column per
    patch."""

    series: Path
    patch_ids: tuple[str, ...]
    results: tuple[SeriesCheck, ...]
    seconds: float
    fetch_seconds: float
    check_seconds: float

    def columns(self) -> list[str]:
        prefix = _common_prefix(self.patch_ids)
        return [pid[len(prefix) :] or pid for pid in self.patch_ids]

    def rows(self) -> list[list[str]]:
        rows = []
        for result in self.results:
            cells = {p.patch_id: p.cell for p in result.patches}
            rows.append([result.target.label] + [cells.get(pid, "") for pid in self.patch_ids])
        return rows

    def exit_code(self, error_on_warn: bool = False) -> int:
        codes = [r.exit_code(error_on_warn) for r in self.results]
        if EXIT_CONFLICT in codes:
            return EXIT_CONFLICT
        return EXIT_WARNINGS if EXIT_WARNINGS in codes else EXIT_OK

    def message(self, error_on_warn: bool = False) -> str:
        code = self.exit_code(error_on_warn)
        if code == EXIT_CONFLICT:
            bad = [
                f"{r.target.label} ({', '.join(p.patch_id for p in r.conflicts)})" for r in self.results if r.conflicts
            ]
            return f"conflicts on {len(bad)} target(s): {'; '.join(bad)}."
        if code == EXIT_WARNINGS:
            return f"{sum(len(r.warnings) for r in self.results)} warning(s) with --error-on-warn."
        return ""

    def to_json(self, error_on_warn: bool = False) -> dict:
        return {
            "command": "matrix",
            "series": str(self.series),
            "patches": list(self.patch_ids),
            "columns": self.columns(),
            "seconds": round(self.seconds, 3),
            "fetch_seconds": round(self.fetch_seconds, 3),
            "check_seconds": round(self.check_seconds, 3),
            "rows": [
                {
                    "target": r.target.to_json(),
                    "cells": {p.patch_id: p.cell for p in r.patches},
                    "statuses": {p.patch_id: str(p.status) for p in r.patches},
                    "variants": {p.patch_id: p.variant for p in r.patches},
                    "warnings": list(r.warnings),
                }
                for r in self.results
            ],
            "results": [r.to_json(error_on_warn) for r in self.results],
            "exit_code": self.exit_code(error_on_warn),
            "message": self.message(error_on_warn),
        }


def _common_prefix(ids: Sequence[str]) -> str:
    if len(ids) < 2:
        return ""
    prefix = ids[0]
    for other in ids[1:]:
        while not other.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind("-"), prefix.rfind("_"))
    return prefix[: cut + 1] if cut >= 0 else ""


def fetch_releases(
    versions: Sequence[str], *, jobs: int = 4, progress: Progress | None = None, on_step: Step | None = None
) -> float:
    """Download and unpack every release not yet cached, ``jobs`` at a time; the seconds it took."""
    start = time.perf_counter()
    missing = [v for v in versions if not (releases.release_dir(v) / "sglang" / "__init__.py").is_file()]
    if not missing:
        return 0.0
    done = 0
    tell(on_step, f"downloading {len(missing)} SGLang release(s) from PyPI ({jobs} at a time) ...")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(releases.fetch_release, v): v for v in missing}
        for future in as_completed(futures):
            future.result()
            done += 1
            if progress is not None:
                progress(done, len(missing), f"downloaded {futures[future]}")
    return time.perf_counter() - start


def build_matrix(
    series: Series,
    *,
    versions: Sequence[str] = (),
    refs: Sequence[str] = (),
    clone: SglangClone | None = None,
    folders: Sequence[Path] = (),
    fuzz: int = 0,
    jobs: int = 4,
    history: bool = True,
    progress: Progress | None = None,
    on_step: Step | None = None,
    on_debug: Step | None = None,
) -> UpgradeMatrix:
    """The series on every release in ``versions`` and every ref of ``clone`` in ``refs``, in that order."""
    start = time.perf_counter()
    versions = sorted(dict.fromkeys(versions), key=Version)
    fetch_seconds = fetch_releases(versions, jobs=jobs, progress=progress, on_step=on_step)
    checked = time.perf_counter()
    base_files = BaseFiles(clone)
    total = len(versions) + len(refs) + len(folders)
    results: list[SeriesCheck] = []

    def note(label: str) -> None:
        if progress is not None:
            progress(len(results), total, f"checked {label}")

    for version in versions:
        with open_release(version, on_step=on_step) as target:
            results.append(check_upstream(series, target, fuzz=fuzz, base_files=base_files, history=history))
        note(version)
    for ref in refs:
        assert clone is not None, "refs need a clone"
        with open_ref(clone, ref, on_debug=on_debug) as target:
            results.append(
                check_upstream(series, target, fuzz=fuzz, base_files=BaseFiles(clone, target.prefix), history=history)
            )
        note(ref)
    for folder in folders:
        with open_folder(folder) as target:
            results.append(check_upstream(series, target, fuzz=fuzz, history=history))
        note(str(folder))
    end = time.perf_counter()
    return UpgradeMatrix(
        series=series.path,
        patch_ids=tuple(p.id for p in series.patches),
        results=tuple(results),
        seconds=end - start,
        fetch_seconds=fetch_seconds,
        check_seconds=end - checked,
    )
