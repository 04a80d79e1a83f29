"""``sm120kit check-upstream / matrix / refresh``: upgrade checks of the patch series against new SGLang."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from sm120kit.cli import cli
from sm120kit.cli.common import (
    AppContext,
    emit,
    exit_with,
    fuzz_option,
    json_option,
    pass_app,
    print_hunk_conflict,
    series_option,
    shorten,
)
from sm120kit.errors import DownloadError, ToolFailed, UsageError
from sm120kit.patching import series as patchset
from sm120kit.patching.status import PatchStatus
from sm120kit.sglang import releases
from sm120kit.sglang.gitrepo import SglangClone
from sm120kit.ui import Console, render_markdown_table, render_table
from sm120kit.upstream import check as upstream
from sm120kit.upstream import matrix as upgrade_matrix
from sm120kit.upstream import refresh as refresher
from sm120kit.upstream.refresh import RefreshOutcome
from sm120kit.util.cache import cache_dir

_REPO = click.option(
    "--repo",
    "repo",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="The SGLang git clone that --ref names commits of (default: the current folder).",
)
_NO_FETCH = click.option("--no-fetch", is_flag=True, help="With --ref: do not fetch the clone's remotes first.")
_FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown"]),
    default="table",
    show_default=True,
    help="Human output: a terminal table, or Markdown for a CI comment.",
)
_ERROR_ON_WARN = click.option(
    "--error-on-warn",
    is_flag=True,
    help=f"Exit {upstream.EXIT_WARNINGS} when there are warnings (moved files, missing markers, ranges to widen).",
)

STATUS_WORDS = {
    PatchStatus.APPLIES: "applies",
    PatchStatus.PRESENT_UPSTREAM: "present upstream",
    PatchStatus.CONFLICT: "CONFLICT",
    PatchStatus.NOT_APPLICABLE: "not applicable",
    PatchStatus.ALREADY_APPLIED: "already applied",
}


# -- targets ---------------------------------------------------------------------------------------------


def _clone(repo: Path | None, fetch: bool, console: Console) -> SglangClone:
    clone = SglangClone(repo or Path.cwd())
    if fetch:
        with console.step(f"fetching the remotes of {clone.root}"):
            clone.fetch(on_debug=console.debug)
    return clone


@contextlib.contextmanager
def _open(
    path: Path | None, release: str | None, ref: str | None, repo: Path | None, fetch: bool, console: Console
) -> Iterator[upstream.CheckTarget]:
    given = [name for name, value in (("PATH", path), ("--release", release), ("--ref", ref)) if value]
    if len(given) != 1:
        raise UsageError(
            "Give exactly one target: PATH (an SGLang folder), --release X or --ref REF"
            + (f" (got {' and '.join(given)})." if given else ".")
        )
    if repo is not None and ref is None:
        raise UsageError("--repo only goes with --ref.")
    if release is not None:
        release = releases.check_version(release)
        with upstream.open_release(release, on_step=console.info) as target:
            yield target
    elif ref is not None:
        clone = _clone(repo, fetch, console)
        with contextlib.ExitStack() as stack:
            with console.step(f"checking out {ref} in a temporary worktree"):
                target = stack.enter_context(upstream.open_ref(clone, ref, on_debug=console.debug))
            yield target
    else:
        with upstream.open_folder(path) as target:
            yield target


def _describe(target: upstream.CheckTarget) -> str:
    if target.kind == "release":
        return f"SGLang {target.label} (PyPI release, {target.root})"
    if target.kind == "ref":
        rel = f"release {target.version}" if target.exact else f"after release {target.version or '?'}"
        return (
            f"SGLang {target.label} ({rel}, clone {target.clone.root if target.clone else '?'}; "
            f"{target.release_source})"
        )
    rel = target.version or "unknown release"
    if target.version and not target.exact:
        rel = f"after release {target.version}"
    return f"{target.label} ({rel}; {target.release_source})"


# -- check-upstream --------------------------------------------------------------------------------------


def _rows(result: upstream.SeriesCheck) -> list[list[str]]:
    return [
        [p.patch_id, STATUS_WORDS.get(p.status, p.status), p.variant or "-", shorten(p.detail)] for p in result.patches
    ]


def _print_check(console: Console, result: upstream.SeriesCheck) -> None:
    console.info(f"target: {_describe(result.target)}")
    console.info(f"series: {result.series} ({len(result.patches)} patches)")
    console.info("")
    console.table(["patch", "status", "variant", "detail"], _rows(result))
    for patch in result.conflicts:
        console.info("")
        title = f"conflict in {patch.patch_id} (variant {patch.variant}): {patch.detail}"
        console.info(console.style(title, "31"))
        for report in patch.hunks:
            if report.hunk.expected:
                print_hunk_conflict(console, report.hunk)
            else:
                console.info(f"  {report.hunk.file} hunk {report.hunk.index}: does not place")
            if report.commits:
                console.info(f"    upstream commits that changed these lines ({report.history}):")
                for commit in report.commits:
                    console.info(f"      {commit.describe()}")
            elif report.history:
                console.info(f"    upstream commits: none found ({report.history})")
    if result.warnings:
        console.info("")
        for warning in result.warnings:
            console.warn(warning)
    console.info("")
    console.info(f"SGLang {result.target.label}: {result.summary()} ({result.seconds:.1f} s).")


def markdown_check(result: upstream.SeriesCheck) -> str:
    out = [f"### sm120kit check-upstream: SGLang `{result.target.label}`", ""]
    version = result.target.version or "unknown"
    out.append(
        f"Release {'' if result.target.exact else 'after '}{version}; series `{result.series.name}` "
        f"({len(result.patches)} patches): **{result.summary()}**."
    )
    out.append("")
    rows = [
        [
            f"`{p.patch_id}`",
            f"**{STATUS_WORDS[p.status]}**"
            if p.status == PatchStatus.CONFLICT
            else STATUS_WORDS.get(p.status, p.status),
            p.variant or "",
            p.detail,
        ]
        for p in result.patches
    ]
    out.append(render_markdown_table(["patch", "status", "variant", "detail"], rows))
    for patch in result.conflicts:
        out += ["", f"<details><summary>conflict: <code>{patch.patch_id}</code> ({patch.variant})</summary>", ""]
        for report in patch.hunks:
            hunk = report.hunk
            out.append(
                f"- `{hunk.file}` hunk {hunk.index}: expected at line {hunk.line}"
                + (f", closest match at line {hunk.closest_line}" if hunk.closest_line else "")
            )
            if report.changed:
                out += ["", "  ```diff"] + [f"  {line}" for line in report.changed] + ["  ```", ""]
            for commit in report.commits:
                out.append(f"  - upstream `{commit.short}` {commit.date} {commit.subject} ({commit.author})")
            if report.history and not report.commits:
                out.append(f"  - upstream commits: none found ({report.history})")
        out += ["", "</details>"]
    if result.warnings:
        out += ["", "**Warnings**", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(out) + "\n"


@cli.command("check-upstream")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--release", default=None, metavar="X", help="Check SGLang release X from PyPI (cached).")
@click.option(
    "--ref",
    default=None,
    metavar="REF",
    help="Check REF (origin/main, a tag, a SHA) of the clone --repo in a temporary worktree.",
)
@_REPO
@_NO_FETCH
@series_option
@fuzz_option("Let hunks match with up to N context lines ignored (reported as a warning).")
@click.option("--no-history", is_flag=True, help="Do not search git history for the commits behind a conflict.")
@_FORMAT
@_ERROR_ON_WARN
@json_option
@pass_app
def check_upstream_cmd(
    app: AppContext,
    path: Path | None,
    release: str | None,
    ref: str | None,
    repo: Path | None,
    no_fetch: bool,
    series_dir: Path | None,
    fuzz: int,
    no_history: bool,
    fmt: str,
    error_on_warn: bool,
    json_mode: bool,
) -> None:
    """Dry-run the patch series on a new SGLang (PATH, --release X or --ref REF) and say, per patch, whether
    it applies, is present upstream, conflicts (which hunk, which upstream commits) or no longer applies
    (which file moved where). Exit 0: all apply or are present; 4: a conflict; 14: warnings with
    --error-on-warn."""
    console = app.console(json_mode or fmt == "markdown")
    series = patchset.load_series(series_dir)
    with _open(path, release, ref, repo, not no_fetch, console) as target:
        result = upstream.check_upstream(series, target, fuzz=fuzz, history=not no_history)
    if json_mode:
        emit(True, result.to_json(error_on_warn), lambda: None)
    elif fmt == "markdown":
        click.echo(markdown_check(result), nl=False)
    else:
        _print_check(console, result)
    exit_with(result.exit_code(error_on_warn), result.message(error_on_warn))


# -- matrix ----------------------------------------------------------------------------------------------


def _versions(ranges: tuple[str, ...], console: Console) -> list[str]:
    if not ranges:
        return []
    available: list[str] | None = None
    out: list[str] = []
    for text in ranges:
        releases.check_range(text)  # a malformed range is named before PyPI is asked for the release list
        if ".." in text and available is None:
            try:
                available = releases.available_releases()
            except (DownloadError, ToolFailed) as exc:
                cached = sorted(
                    p.name for p in (cache_dir() / "releases").glob("*") if (p / "sglang" / "__init__.py").is_file()
                )
                console.warn(
                    f"cannot list SGLang releases on PyPI ({exc.message}); using the {len(cached)} cached ones."
                )
                available = cached
        found = releases.parse_release_range(text, available or [])
        if not found:
            raise UsageError(
                f"--releases {text} names no SGLang release on PyPI.",
                hint="Write a range like 0.5.2..0.5.23 or a list like 0.5.2,0.5.23.",
            )
        out += found
    return out


def legend() -> str:
    return (
        "cells: a variant name = applies with that variant (+: some hunks at an offset); upstream = "
        "present upstream; CONFLICT = a hunk does not place; '-' = not applicable (outside every "
        "variant's range); moved / gone = a file the patch changes moved or was removed"
    )


@cli.command("matrix")
@click.option(
    "--releases",
    "ranges",
    multiple=True,
    metavar="RANGE",
    help="SGLang releases: a range 0.5.2..0.5.23 (every release on PyPI between, inclusive) or a "
    "list 0.5.2,0.5.23; repeatable.",
)
@click.option("--ref", "refs", multiple=True, metavar="REF", help="A ref of the clone --repo; repeatable.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@_REPO
@_NO_FETCH
@series_option
@click.option("--jobs", type=click.IntRange(1, 16), default=4, show_default=True, help="Releases downloaded at a time.")
@_FORMAT
@_ERROR_ON_WARN
@json_option
@pass_app
def matrix_cmd(
    app: AppContext,
    ranges: tuple[str, ...],
    refs: tuple[str, ...],
    paths: tuple[Path, ...],
    repo: Path | None,
    no_fetch: bool,
    series_dir: Path | None,
    jobs: int,
    fmt: str,
    error_on_warn: bool,
    json_mode: bool,
) -> None:
    """The whole series against many SGLang targets in one table: releases (--releases 0.5.2..0.5.23), refs
    of a clone (--ref), folders (PATHS). Same exit codes as check-upstream."""
    console = app.console(json_mode or fmt == "markdown")
    if not ranges and not refs and not paths:
        raise UsageError("Name some targets: --releases 0.5.2..0.5.23, --ref REF (with --repo) or PATHS.")
    if repo is not None and not refs:
        raise UsageError("--repo only goes with --ref.")
    series = patchset.load_series(series_dir)
    versions = _versions(ranges, console)
    clone = _clone(repo, not no_fetch, console) if refs else None
    matrix = upgrade_matrix.build_matrix(
        series,
        versions=versions,
        refs=refs,
        clone=clone,
        folders=paths,
        jobs=jobs,
        progress=console.progress,
        on_step=console.info,
        on_debug=console.debug,
    )
    headers = ["SGLang"] + matrix.columns()
    if json_mode:
        emit(True, matrix.to_json(error_on_warn), lambda: None)
    elif fmt == "markdown":
        lines = [
            f"### sm120kit matrix: {len(series.patches)} patches x {len(matrix.results)} targets",
            "",
            render_markdown_table(headers, matrix.rows()),
            "",
            legend() + ".",
            "",
        ]
        warnings = [f"{r.target.label}: {w}" for r in matrix.results for w in r.warnings]
        if warnings:
            lines += ["**Warnings**", ""] + [f"- {w}" for w in warnings] + [""]
        lines.append(
            f"{len(matrix.results)} targets in {matrix.seconds:.1f} s "
            f"(downloads {matrix.fetch_seconds:.1f} s, checks {matrix.check_seconds:.1f} s)."
        )
        click.echo("\n".join(lines))
    else:
        console.info(f"series: {series.path} ({len(series.patches)} patches)")
        console.info("")
        click.echo(render_table(headers, matrix.rows()))
        console.info("")
        console.info(legend() + ".")
        for result in matrix.results:
            for warning in result.warnings:
                console.warn(f"{result.target.label}: {warning}")
        console.info(
            f"{len(matrix.results)} targets in {matrix.seconds:.1f} s (downloads "
            f"{matrix.fetch_seconds:.1f} s, checks {matrix.check_seconds:.1f} s). Details of one: "
            "sm120kit check-upstream --release X."
        )
    exit_with(matrix.exit_code(error_on_warn), matrix.message(error_on_warn))


# -- refresh ---------------------------------------------------------------------------------------------


def _print_refresh(console: Console, result: refresher.RefreshResult, dry_run: bool) -> None:
    console.info(
        f"patch: {result.patch_id}, rebuilt from {result.from_variant} for SGLang {result.release} "
        f"({_describe(result.target)})"
    )
    if result.base_source:
        console.info(f"merge base: {result.base_source}")
    if result.files:
        console.info("")
        console.table(
            ["file", "action", "merge", "note"],
            [[f.path, f.action, str(f.merge), f.note or (f.moved.describe() if f.moved else "")] for f in result.files],
        )
    for conflict in result.conflicts:
        console.info("")
        console.info(console.style(f"needs a person: {conflict.file} line {conflict.line}", "31"))
        for title, lines in (
            ("upstream now", conflict.upstream),
            (f"base (SGLang {result.from_base})", conflict.base),
            (f"the patch ({result.from_variant})", conflict.patch),
        ):
            console.info(f"    {title}:")
            for line in lines or ["(nothing)"]:
                console.info(f"      | {line}")
    if result.new_diff and result.outcome in (RefreshOutcome.WRITTEN, RefreshOutcome.DRY_RUN):
        console.info("")
        old = f"; {result.from_variant} becomes '{result.old_releases_after}'" if result.old_releases_after else ""
        console.info(f"new variant: {result.new_diff} releases '{result.new_releases}' base {result.release}{old}")
        console.info(f"checked with the patch engine on {result.target.label}: {result.verified}")
    if dry_run and result.diff_text:
        console.info("")
        click.echo(result.diff_text, nl=False)
    console.info("")
    if result.outcome != RefreshOutcome.CONFLICT:
        console.info(result.message)


@cli.command("refresh")
@click.argument("patch_id", metavar="PATCH")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--release", default=None, metavar="X", help="Rebuild the patch for SGLang release X (PyPI).")
@click.option("--ref", default=None, metavar="REF", help="Rebuild it for REF of the clone --repo.")
@_REPO
@_NO_FETCH
@click.option(
    "--as-release",
    default=None,
    metavar="X",
    help="The release the new variant is for (needed when the target is not a tagged release).",
)
@series_option
@click.option("--dry-run", is_flag=True, help="Print the new diff and metadata change; write nothing.")
@click.option("--replace", is_flag=True, help="Rebuild the diff of an existing variant for that release.")
@click.option("--force", is_flag=True, help="Rebuild even when the current variant applies exactly.")
@click.option(
    "--resolved",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="Take the files a person resolved from DIR (the draft folder a conflicting "
    "refresh named) instead of the conflicting merge.",
)
@json_option
@pass_app
def refresh_cmd(
    app: AppContext,
    patch_id: str,
    path: Path | None,
    release: str | None,
    ref: str | None,
    repo: Path | None,
    no_fetch: bool,
    as_release: str | None,
    series_dir: Path | None,
    dry_run: bool,
    replace: bool,
    force: bool,
    resolved: Path | None,
    json_mode: bool,
) -> None:
    """Rebuild PATCH for a new SGLang by a three-way merge (git merge-file) of its variant onto the new
    files, with the variant's base release as the merge base. A clean merge is written as a new variant
    (diff file + [[variants]] entry from that release on; the old range is closed there); conflicts are
    shown for a person and nothing is written (exit 4)."""
    console = app.console(json_mode)
    series = patchset.load_series(series_dir)
    with _open(path, release, ref, repo, not no_fetch, console) as target:
        result = refresher.refresh_patch(
            series,
            patch_id,
            target,
            as_release=as_release,
            dry_run=dry_run,
            replace=replace,
            force=force,
            resolved=resolved,
            on_step=console.info,
        )
    emit(json_mode, result.to_json(), lambda: _print_refresh(console, result, dry_run))
    exit_with(result.exit_code, result.message)
