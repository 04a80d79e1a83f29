#!/usr/bin/env python3
"""Write docs/series.md: what each patch of the SM120 series does on each SGLang release.

The table is not written by hand. For every release (default: every PyPI release from 0.5.2 to 0.5.23),
the release is downloaded into sm120kit's cache, copied (hard links; the patch manager replaces files
instead of editing them) and the series is applied to the copy with ``sm120kit.patching.engine.apply_series``, the
same call as ``sm120kit apply``. Each cell is that run's status for the patch (``applied`` with the
variant used, ``present-upstream``, ``not-applicable``, or a failure). The patch descriptions above the
table come from each patch's ``patch.toml``.

    python scripts/gen_series_table.py                         # all releases -> docs/series.md
    python scripts/gen_series_table.py --releases 0.5.2,0.5.23 --check   # compare those rows, exit 1 if stale
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import Series, load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target
from sm120kit.ui import render_markdown_table

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "series.md"
DEFAULT_RELEASES = "0.5.2..0.5.23"
TABLE_START = "<!-- release table: generated -->"
TABLE_END = "<!-- end of release table -->"


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a release with hard links where the file system allows (apply replaces, never edits)."""
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


def release_row(series: Series, version: str, workdir: Path) -> list[str]:
    """Apply ``series`` to a copy of ``version``; one cell per patch."""
    source = releases.fetch_release(version)
    copy = workdir / version
    _copy_tree(source, copy)
    try:
        result = apply_series(find_target(copy / "sglang"), series)
        cells = []
        for plan in result.plan.patches:
            status = result.statuses[plan.patch_id]
            if status in ("applied", "applies") and plan.variant is not None:
                cells.append(f"applied ({plan.variant.name.removesuffix('.diff')})")
            elif status == "conflict":
                cells.append(f"CONFLICT: {plan.reason}")
            else:
                cells.append(status)
        return cells
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def table(series: Series, versions: list[str], *, progress=None) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="sm120kit-series-table-") as tmp:
        for i, version in enumerate(versions, 1):
            if progress:
                progress(i, len(versions), version)
            rows.append([version] + release_row(series, version, Path(tmp)))
    return rows


def _patch_section(series: Series) -> str:
    lines = ["| # | patch | what it fixes on SM120 | upstream | variants (diff: releases) |", "|---|---|---|---|---|"]
    for i, patch in enumerate(series.patches, 1):
        variants = "<br>".join(f"`{v.name}`: `{_releases_text(v.releases)}`" for v in patch.variants)
        upstream = patch.upstream.reference or "not forwarded"
        if patch.upstream.reference and not patch.upstream.forwarded:
            upstream += " (this patch: not sent upstream)"
        lines.append(f"| {i} | `{patch.id}` | {patch.title} | {upstream} | {variants} |")
    return "\n".join(lines)


def _releases_text(spec) -> str:
    """``>=0.5.2,<0.5.4`` (lower bound first) for a SpecifierSet."""
    order = {">=": 0, ">": 1, "==": 2, "!=": 3, "<=": 4, "<": 5}
    return ",".join(str(s) for s in sorted(spec, key=lambda s: (order.get(s.operator, 9), s.version)))


def _files_section(series: Series) -> str:
    """The [[files]] entries of each patch: source, destination, releases, number of files."""
    rows = [
        [f"`{p.id}`", f"`{e.source}`", f"`{e.dest}`", f"`{e.releases}`", str(len(e.sources))]
        for p in series.patches
        for e in p.shipped
    ]
    spec = importlib.util.spec_from_file_location("gen_moe_configs", Path(__file__).with_name("gen_moe_configs.py"))
    gen_moe_configs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_moe_configs)
    dropped = [f"| {model} | {tp} | `{name}` |" for model, tp, name in gen_moe_configs.rejected()]
    note = (
        "`sm120-moe-configs` ships no config file for a shape SGLang's FP8 block-quant MoE loader rejects:\n"
        "`Fp8MoEMethod.create_weights` (`srt/layers/quantization/fp8.py`, every release 0.5.2-0.5.23) raises\n"
        "unless the intermediate size per partition (the file name's `N`) is a multiple of block_n and, at\n"
        "TP > 1, of block_k (128 and 128 for these checkpoints), so no server could load such a model and the\n"
        "file would never be read. Earlier versions of the series shipped these files; they are no longer\n"
        "written (`scripts/gen_moe_configs.py`, `loadable`):\n\n"
        "| model | TP | file not shipped |\n|---|---|---|\n" + "\n".join(dropped)
    )
    return render_markdown_table(["patch", "source", "destination", "releases", "files"], rows) + "\n\n" + note


def render(series: Series, rows: list[list[str]]) -> str:
    headers = ["release"] + [p.id.removeprefix("sm120-") for p in series.patches]
    return "\n".join(
        [
            "# The SM120 patch series, release by release",
            "",
            "Generated by `scripts/gen_series_table.py` from the patch metadata (`patches/sglang/*/patch.toml`)",
            "and a real run: each SGLang release from PyPI was copied and the whole series applied to the copy",
            "with `sm120kit.patching.engine.apply_series`. Do not edit by hand; re-run the script after changing",
            "the series. `applied (X)`: the patch was applied with its variant `X.diff` (zero fuzz, every patched",
            "Python file compiles); `present-upstream`: the release already carries the fix (the patch's",
            "upstream markers match); `not-applicable`: the code the patch changes is not in that release.",
            "",
            "## Patches",
            "",
            _patch_section(series),
            "",
            "## Whole files the patches ship",
            "",
            _files_section(series),
            "",
            "## Status per release",
            "",
            TABLE_START,
            render_markdown_table(headers, rows),
            TABLE_END,
            "",
        ]
    )


def parse_rows(text: str) -> dict[str, list[str]]:
    """The release rows of a generated file: {release: cells}."""
    if TABLE_START not in text or TABLE_END not in text:
        return {}
    body = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip().splitlines()[2:]
    out = {}
    for line in body:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        out[cells[0]] = cells[1:]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=Path, default=REPO / "patches" / "sglang")
    parser.add_argument(
        "--releases",
        default=DEFAULT_RELEASES,
        help="a range A..B of PyPI releases or a comma-separated list (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--check", action="store_true", help="compare the rows of these releases with --out instead of writing it"
    )
    args = parser.parse_args(argv)

    series = load_series(args.series)
    spec = args.releases
    available = releases.available_releases() if ".." in spec else []
    versions = sorted(releases.parse_release_range(spec, available), key=Version)
    started = time.perf_counter()
    rows = table(series, versions, progress=lambda i, n, v: print(f"[{i}/{n}] {v}", file=sys.stderr, flush=True))
    seconds = time.perf_counter() - started

    if args.check:
        recorded = parse_rows(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
        stale = []
        for row in rows:
            if recorded.get(row[0]) != [c.replace("|", "\\|") for c in row[1:]]:
                stale.append(f"{row[0]}: file says {recorded.get(row[0])}, the run gives {row[1:]}")
        text = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if render(series, rows).split(TABLE_START)[0] != text.split(TABLE_START)[0]:
            stale.append("the sections above the release table (patches, whole files) differ from the series")
        expected_columns = [p.id.removeprefix("sm120-") for p in series.patches]
        if f"| release | {' | '.join(expected_columns)} |" not in args.out.read_text(encoding="utf-8"):
            stale.append("the table's columns are not the series' patches in order")
        if stale:
            print(f"{args.out} is out of date:\n  " + "\n  ".join(stale), file=sys.stderr)
            print("Re-run: python scripts/gen_series_table.py", file=sys.stderr)
            return 1
        print(f"{args.out}: the rows of {len(rows)} release(s) match a fresh run")
        return 0

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(series, rows), encoding="utf-8")
    print(f"wrote {args.out} ({len(rows)} releases, {len(series.patches)} patches, {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
