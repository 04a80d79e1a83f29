"""``sm120kit audit``: prove on any machine what SGLang would compile for SM120 (static, faked device)."""

from __future__ import annotations

import importlib
import importlib.util

import click

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, exit_with, json_option, pass_app
from sm120kit.errors import CheckFailed, MissingDependency
from sm120kit.sglang.launchers import LAUNCHERS
from sm120kit.ui import Console


@cli.command("audit")
@click.argument("path", required=False)
@click.option("--release", metavar="VERSION", help="Audit this SGLang release from PyPI (cached) instead of PATH.")
@click.option(
    "--arch",
    "archs",
    multiple=True,
    metavar="CC",
    help="Target compute capability, repeatable (default: 12.0 and 12.1).",
)
@click.option(
    "--matrix",
    "matrix_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A TOML file of more [[attention]] / [[moe]] shapes (see sm120kit/audit/audit_matrix.toml).",
)
@click.option("--only", "only", multiple=True, metavar="NAME", help="Audit only these matrix entries.")
@click.option(
    "--launcher", "launchers", multiple=True, type=click.Choice(list(LAUNCHERS)), help="Audit only these launchers."
)
@click.option(
    "--tuned-moe-configs/--no-tuned-moe-configs",
    default=None,
    help="Also load every fused-MoE config file the tree ships for a 12.x GPU name, under that name "
    "(default: on unless --only or --launcher narrows the run to other launchers).",
)
@click.option(
    "--compare-unpatched",
    is_flag=True,
    help="Also audit the pristine PyPI release of PATH's version and show what changed.",
)
@click.option("--findings-only", is_flag=True, help="List only kernels over the limit and failed launchers.")
@click.option("--no-cache", is_flag=True, help="Compile everything again (results are not read or written).")
@click.option("--jobs", type=click.IntRange(1), help="Probe interpreters run at once (default: CPU count).")
@click.option(
    "--backends", is_flag=True, help="Audit the backends SGLang picks on 12.x instead of Triton shared memory."
)
@json_option
@pass_app
def audit(
    app: AppContext,
    path: str | None,
    release: str | None,
    archs: tuple[str, ...],
    matrix_files: tuple[str, ...],
    only: tuple[str, ...],
    launchers: tuple[str, ...],
    tuned_moe_configs: bool | None,
    compare_unpatched: bool,
    findings_only: bool,
    no_cache: bool,
    jobs: int | None,
    backends: bool,
    json_mode: bool,
) -> int:
    """Compile, for sm_120/sm_121, every Triton kernel SGLang's attention and fused-MoE launchers would
    launch for the shape matrix, and fail (exit 13) on any kernel over the 12.x shared-memory limit or any
    launcher that fails to compile. PATH is an SGLang git clone or installed package. No GPU is needed:
    the device is faked, the compiles are real."""
    console = app.console(json_mode)
    if backends:
        return _backends(console, path, release, archs, json_mode)
    from sm120kit.audit import shapes
    from sm120kit.audit import smem as smem_audit
    from sm120kit.audit.cache import AuditCache

    matrix = shapes.select(shapes.load_matrix(matrix_files), only)
    result = smem_audit.audit(
        path,
        release=release,
        compare_unpatched=compare_unpatched,
        progress=console.progress,
        on_step=console.info,
        archs=archs or smem_audit.DEFAULT_ARCHS,
        matrix=matrix,
        launchers=launchers or None,
        cache=AuditCache(enabled=not no_cache),
        jobs=jobs,
        tuned_moe_configs=(not only and (not launchers or "moe" in launchers))
        if tuned_moe_configs is None
        else tuned_moe_configs,
    )
    emit(json_mode, result.to_json(), lambda: _print(console, result, findings_only))
    if not result.ok and json_mode:
        return CheckFailed.exit_code  # the JSON above says why; keep stdout one document
    if not result.ok:
        patched = getattr(result, "patched", result)
        raise CheckFailed(
            f"The shared-memory audit failed: {len(patched.over_limit)} kernel(s) over the limit, "
            f"{len(patched.errors)} launcher call(s) failed to compile or import.",
            hint="See the table above (or --json 'findings').",
        )
    return 0


def _print(console: Console, result, findings_only: bool) -> None:
    from sm120kit.audit import smem as smem_audit
    from sm120kit.ui import render_table

    comparison = result if isinstance(result, smem_audit.SmemComparison) else None
    main = comparison.patched if comparison else result
    rows = smem_audit.table_rows(main, findings_only=findings_only)
    console.info(f"Shared-memory audit of {main.target}")
    console.info(smem_audit.METHOD + ".")
    if rows:
        print(render_table(smem_audit.TABLE_HEADERS, rows), flush=True)
    if comparison:
        console.info("")
        console.info(f"Compared with the unpatched release ({comparison.pristine.target}):")
        if comparison.changes:
            print(
                render_table(
                    ("arch", "case", "kernel", "unpatched", "patched", "change"),
                    [
                        [
                            c.arch,
                            c.case_id,
                            c.kernel,
                            c.before,
                            c.after,
                            "fixed" if c.fixed else "BROKE" if c.broke else "",
                        ]
                        for c in comparison.changes
                    ],
                ),
                flush=True,
            )
        else:
            console.info("no kernel differs.")
        console.info("unpatched: " + smem_audit.summary_line(comparison.pristine))
    if main.overlay:
        console.info(f"this release's imports needed its own pinned packages: {main.overlay}")
    if main.register_reader is None:
        console.info("registers: not shown (no cuobjdump found; pip install nvidia-cuda-cuobjdump).")
    print(("patched: " if comparison else "") + smem_audit.summary_line(main), flush=True)


def _backends(console: Console, path, release, archs, json_mode: bool) -> int:
    if importlib.util.find_spec("sm120kit.audit.backends") is None:
        raise MissingDependency(
            "The backend-choice audit is not part of this sm120kit (no sm120kit.audit.backends module).",
            hint="Upgrade sm120kit, or run the shared-memory audit without --backends.",
        )
    from sm120kit.sglang import releases

    module = importlib.import_module("sm120kit.audit.backends")
    root = releases.fetch_release(releases.check_version(release), on_step=console.info) if release else path
    kwargs = {"capabilities": archs} if archs else {}
    result = module.audit_backends(root, progress=console.progress, on_step=console.info, **kwargs)
    from sm120kit.cli import explain as explain_cli  # the backend audit's own table and verdict

    emit(json_mode, result.to_json(), lambda: explain_cli._print(console, result))
    try:
        explain_cli._verdict(result)
    except (CheckFailed, MissingDependency) as exc:
        if json_mode:  # stdout keeps one document (the result, "ok": false), as `explain --json` does
            exit_with(exc.exit_code, exc.render())
        raise
    return 0
