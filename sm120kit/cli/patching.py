"""``sm120kit apply / revert / status / patches``: the patch manager's commands."""

from __future__ import annotations

from collections.abc import Callable
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
)
from sm120kit.cli.common import shorten as _short
from sm120kit.errors import NotSglangTree, UsageError
from sm120kit.patching import engine
from sm120kit.patching import series as patchset
from sm120kit.patching.plan import PatchPlan
from sm120kit.patching.status import HunkStatus, PatchStatus
from sm120kit.sglang import releases, workcopy
from sm120kit.sglang.target import Target, find_target
from sm120kit.ui import Console

_PATH = click.argument("path", required=False, type=click.Path(path_type=Path))


def _release_option(what: str) -> Callable:
    """``--release [X]``: the cached working copy of release X instead of PATH; ``what`` says what the command
    does to it."""
    return click.option(
        "--release",
        "release",
        is_flag=False,
        flag_value=releases.DEFAULT_RELEASE,
        default=None,
        metavar="X",
        help=f"{what} the cached working copy of SGLang release X (the folder `apply --release X` patches; "
        f"downloaded from PyPI if needed) instead of PATH; '--release' alone means "
        f"{releases.DEFAULT_RELEASE}.",
    )


def _target(
    path: Path | None, release: str | None, *, create: bool, fresh: bool = False, console: Console | None = None
) -> Target:
    if path is not None and release is not None:
        raise UsageError("Give either PATH or --release, not both.")
    if release is None:
        return find_target(path)
    release = releases.check_version(release)
    if create:
        return find_target(workcopy.work_copy(release, fresh=fresh, on_step=console.info if console else None))
    folder = workcopy.work_dir(release)
    if not (folder / "sglang").is_dir():
        raise NotSglangTree(
            f"There is no working copy of SGLang {release} yet ({folder}).",
            hint=f"Create and patch it with 'sm120kit apply --release {release}'.",
        )
    return find_target(folder)


def _describe_target(target: Target, release: str | None, exact: bool, source: str = "") -> str:
    what = release or "unknown release"
    if target.commit:
        what += f" @ {target.commit[:12]}" + ("" if exact else " (between releases)")
    return f"{target.package_dir} ({what}, {target.kind})" + (f"; release {source}" if source else "")


def _status_rows(patches: list[dict]) -> list[list[str]]:
    return [[p["id"], p["status"], p.get("variant") or "-", _short(p["reason"])] for p in patches]


def _print_conflicts(console: Console, plans: tuple[PatchPlan, ...]) -> None:
    for plan in plans:
        if plan.status != PatchStatus.CONFLICT:
            continue
        console.info("")
        variant = f" (variant {plan.variant.name})" if plan.variant else ""
        console.info(console.style(f"conflict in {plan.patch_id}{variant}: {plan.reason}", "31"))
        for hunk in plan.hunks:
            if hunk.status != HunkStatus.CONFLICT or not hunk.expected:
                continue
            print_hunk_conflict(console, hunk)


def _fail(console: Console, code: int, message: str) -> None:
    exit_with(code, message)


@cli.command("apply")
@_PATH
@_release_option("Patch")
@series_option
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@fuzz_option("Let hunks match with up to N lines of leading/trailing context ignored (reported).")
@click.option("--allow-dirty", is_flag=True, help="Patch files that have uncommitted git changes.")
@click.option("--strict", is_flag=True, help="Fail (and write nothing) when a patch is not applicable.")
@click.option("--fresh", is_flag=True, help="With --release: recreate the working copy from the release first.")
@json_option
@pass_app
def apply_cmd(
    app: AppContext,
    path: Path | None,
    release: str | None,
    series_dir: Path | None,
    dry_run: bool,
    fuzz: int,
    allow_dirty: bool,
    strict: bool,
    fresh: bool,
    json_mode: bool,
) -> None:
    """Apply the patch series to an SGLang tree: PATH (a git clone, its python/ folder or an installed
    sglang package), the working copy of --release X, or the sglang this Python would import."""
    console = app.console(json_mode)
    if fresh and release is None:
        raise UsageError("--fresh only works with --release.")
    series = patchset.load_series(series_dir)
    target = _target(path, release, create=True, fresh=fresh, console=console)
    if not series.patches:
        console.warn(f"the series at {series.path} lists no patches yet; nothing to apply.")
    result = engine.apply_series(
        target,
        series,
        dry_run=dry_run,
        fuzz=fuzz,
        allow_dirty=allow_dirty,
        strict=strict,
        progress=console.progress,
        on_debug=console.debug,
    )

    def human() -> None:
        for warning in result.warnings:
            console.warn(warning)
        console.info("target: " + _describe_target(target, result.release, result.exact_release, result.release_source))
        console.info(f"series: {series.path} ({len(series.patches)} patches)")
        data = result.to_json()
        if data["patches"]:
            console.info("")
            console.table(["patch", "status", "variant", "detail"], _status_rows(data["patches"]))
        _print_conflicts(console, result.plan.patches)
        console.info("")
        counts = {}
        for row in data["patches"]:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no patches"
        if result.dry_run:
            changed = f"dry run: would change {len(result.plan.changes)} file(s), nothing written"
        elif result.written:
            changed = f"changed {len(result.written)} file(s); state record {result.state_file}"
        else:
            changed = "nothing changed"
        console.info(
            f"{target.package_dir} ({result.release or 'unknown release'}"
            f"{' @ ' + target.commit[:12] if target.commit else ''}): {summary}; {changed}."
        )

    emit(json_mode, result.to_json(), human)
    _fail(console, result.exit_code, result.message)


@cli.command("revert")
@_PATH
@_release_option("Restore the original files of")
@click.option("--dry-run", is_flag=True, help="Print what would be restored; change nothing.")
@click.option(
    "--force", is_flag=True, help="Revert files edited after apply too (the edited versions are kept as copies)."
)
@json_option
@pass_app
def revert_cmd(
    app: AppContext, path: Path | None, release: str | None, dry_run: bool, force: bool, json_mode: bool
) -> None:
    """Restore the exact original bytes of every file sm120kit patched in the tree, and drop its record."""
    console = app.console(json_mode)
    target = _target(path, release, create=False)
    result = engine.revert_series(
        target, force=force, dry_run=dry_run, progress=console.progress, on_debug=console.debug
    )

    def human() -> None:
        for warning in result.warnings:
            console.warn(warning)
        console.info(f"target: {target.package_dir}")
        if result.files:
            console.table(
                ["file", "action", "kept copy of your edit"],
                [[f.path, f.action, str(f.kept_copy) if f.kept_copy else ""] for f in result.files],
            )
        for copy in result.kept_copies:
            console.info(f"kept your edited version: {copy}")
        if result.dry_run and result.exit_code == 0 and result.files:
            console.info(f"dry run: would revert {len(result.patches)} patch(es); nothing changed.")
        elif result.message and result.exit_code == 0:
            console.info(result.message)

    emit(json_mode, result.to_json(), human)
    _fail(console, result.exit_code, result.message)


@cli.command("status")
@_PATH
@_release_option("Show the patch states of")
@series_option
@json_option
@pass_app
def status_cmd(
    app: AppContext, path: Path | None, release: str | None, series_dir: Path | None, json_mode: bool
) -> None:
    """Show each patch's state on the tree (applied, not-applied, present-upstream, not-applicable,
    conflict, file-missing) and any problem: an interrupted run, files edited or deleted after apply, a
    damaged record."""
    console = app.console(json_mode)
    series = patchset.load_series(series_dir)
    target = _target(path, release, create=False)
    result = engine.series_status(target, series)

    def human() -> None:
        out = console.for_results()  # -q keeps the result
        out.info("target: " + _describe_target(target, result.release, result.exact_release, result.release_source))
        out.info(f"series: {series.path} ({len(series.patches)} patches)")
        rows = result.rows()
        if rows:
            out.info("")
            out.table(["patch", "status", "variant", "detail"], _status_rows(rows))
        if result.files:
            out.info("")
            unusual = [f for f in result.files if f.condition != "patched"]
            shown = result.files if app.verbose else unusual
            if shown:
                out.table(["patched file", "condition"], [[f.path, f.condition] for f in shown])
            clean = len(result.files) - len(unusual)
            out.info(
                f"{clean} of {len(result.files)} recorded file(s) are as sm120kit left them"
                + ("" if app.verbose or not clean else " (-v lists them)")
                + "."
            )
        for problem in result.problems:
            console.warn(problem)

    emit(json_mode, result.to_json(), human)
    exit_with(result.exit_code)


@cli.command("patches")
@series_option
@click.option(
    "--release",
    "release",
    default=None,
    metavar="X",
    help="Also show which variant each patch uses on SGLang release X.",
)
@json_option
@pass_app
def patches_cmd(app: AppContext, series_dir: Path | None, release: str | None, json_mode: bool) -> None:
    """List the patch series: each patch's id, title, upstream reference and variants."""
    console = app.console(json_mode)
    if release is not None:
        release = releases.check_version(release)
    series = patchset.load_series(series_dir)
    data = series.to_json()
    for patch, row in zip(series.patches, data["patches"]):
        if release is not None:
            chosen = patch.variant_for(release)
            row["variant_for_release"] = chosen.name if chosen else None
    if release is not None:
        data["release"] = release

    def human() -> None:
        out = console.for_results()  # -q keeps the result
        if not series.patches:
            out.info(f"The series at {series.path} lists no patches yet.")
            return
        headers = ["#", "patch", "title", "variants", "upstream"]
        if release is not None:
            headers.append(f"variant for {release}")
        rows = []
        for i, (patch, row) in enumerate(zip(series.patches, data["patches"]), 1):
            names = [v.name.removesuffix(".diff") for v in patch.variants_newest_first()][::-1]
            variants = ", ".join(names) if len(names) <= 3 else f"{len(names)}: {names[0]} ... {names[-1]}"
            upstream = patch.upstream.reference if patch.upstream.forwarded else "not forwarded"
            line = [str(i), patch.id, _short(patch.title, 60), variants, upstream]
            if release is not None:
                line.append(row["variant_for_release"] or "none (outside every range)")
            rows.append(line)
        out.info(f"series: {series.path}")
        out.table(headers, rows)
        if app.verbose:
            for patch in series.patches:
                out.info(f"\n{patch.id}: {patch.title}")
                for label, text in (
                    ("problem", patch.problem),
                    ("change", patch.description),
                    ("upstream", patch.upstream.reference or patch.upstream.reason),
                ):
                    out.info(f"  {label}: {' '.join(text.split())}")
                for v in patch.variants:
                    out.info(f"  variant {v.name}: releases {v.releases}, base {v.base}, {len(v.files)} file(s)")
        else:
            console.info("(-v shows each patch's problem, change, upstream note and variants)")

    emit(json_mode, data, human)
