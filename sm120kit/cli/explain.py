"""``sm120kit explain``: which backends SGLang would choose on 12.x (and 9.0/10.0), and why some cannot run."""

from __future__ import annotations

import click

from sm120kit.audit import backends as backend_audit
from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, json_option, pass_app
from sm120kit.errors import CheckFailed, MissingDependency, UsageError
from sm120kit.sglang import releases
from sm120kit.ui import Console, render_table

_FLASHINFER = {"yes": (True,), "no": (False,), "both": (True, False)}


@cli.command("explain", context_settings={"ignore_unknown_options": True})
@click.argument("items", nargs=-1, type=click.UNPROCESSED, metavar="[PATH] [-- SGLANG_ARGS...]")
@click.option("--release", metavar="VERSION", help="Explain this SGLang release from PyPI (cached) instead of PATH.")
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME|DIR",
    help="A bundled model (" + ", ".join(backend_audit.BUNDLED_MODELS) + ") or a folder holding a "
    "config.json; repeatable (default: all bundled models).",
)
@click.option(
    "--arch",
    "capabilities",
    multiple=True,
    metavar="CC",
    help="Faked compute capability, repeatable (default: 12.0 12.1 9.0 10.0).",
)
@click.option(
    "--capability", "capability_alias", multiple=True, metavar="CC", hidden=True, help="The old spelling of --arch."
)
@click.option(
    "--flashinfer",
    "flashinfer",
    type=click.Choice(sorted(_FLASHINFER)),
    default="both",
    show_default=True,
    help="Whether flashinfer counts as installed (it changes SGLang's choice).",
)
@click.option(
    "--deep-gemm/--no-deep-gemm", default=True, show_default=True, help="Whether DeepGEMM counts as installed."
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    help="An environment variable for SGLang (SGLANG_* variables are otherwise not passed on).",
)
@click.option("--jobs", type=click.IntRange(1), help="Probe interpreters run at once (default: CPU count).")
@click.option(
    "--release-pins/--no-release-pins",
    default=True,
    show_default=True,
    help="Resolve with the transformers version the release pins (installed once into the cache).",
)
@click.option(
    "--error-on-slow",
    is_flag=True,
    help="Fail (exit 13) when a setting runs on 12.x but slowly; without it such settings are warnings.",
)
@json_option
@pass_app
def explain(
    app: AppContext,
    items: tuple[str, ...],
    release: str | None,
    models: tuple[str, ...],
    capabilities: tuple[str, ...],
    capability_alias: tuple[str, ...],
    flashinfer: str,
    deep_gemm: bool,
    env: tuple[str, ...],
    jobs: int | None,
    release_pins: bool,
    error_on_slow: bool,
    json_mode: bool,
) -> int:
    """Run SGLang's own server-argument resolution for each model on faked 12.0/12.1 (and 9.0/10.0) devices
    and show the attention, MoE, sampling and GEMM backends it picks. Exits 13 when a choice on 12.x has no
    SM120 code, SGLang rejects the arguments on 12.x, or a resolution could not be run.

    It also reports settings that run on 12.x but slowly (a low --triton-attention-num-kv-splits, an fp8 KV
    cache with the FlashInfer MLA backend, SGLANG_* variables that force slow paths, trtllm backends chosen
    by hand), each with the measured reason and the fix: warnings, or exit 13 with --error-on-slow. Settings
    under which a kernel does not fit 12.x's shared memory (--max-lora-chunk-size above 64 with the csgmv LoRA
    backend, --max-lora-rank above 21 with SGLANG_EXPERIMENTAL_LORA_OPTI) exit 13 and name the largest value
    that fits.

    PATH is an SGLang git clone or installed package (default: the sglang this Python imports). Arguments
    after -- go to SGLang as `sglang serve` options, e.g. `-- --attention-backend fa3`."""
    console = app.console(json_mode)
    capabilities = capabilities + capability_alias
    path, sglang_args = _split(items)
    if path and release:
        raise UsageError(f"Give either PATH ({path}) or --release {release}, not both.")
    root = releases.fetch_release(releases.check_version(release), on_step=console.info) if release else path
    result = backend_audit.audit_backends(
        root,
        models=list(models) or None,
        capabilities=capabilities or backend_audit.DEFAULT_CAPABILITIES,
        args=sglang_args,
        flashinfer=_FLASHINFER[flashinfer],
        deep_gemm=deep_gemm,
        env=_env(env),
        jobs=jobs,
        release_pins=release_pins,
        progress=console.progress,
        on_step=console.info,
    )
    doc = result.to_json()
    doc["error_on_slow"] = error_on_slow
    if error_on_slow and result.slow_on_12x:
        doc["ok"] = False
    emit(json_mode, doc, lambda: _print(console, result))
    for line in _slow_warnings(result):
        console.warn(line)
    try:
        _verdict(result, error_on_slow)
    except (CheckFailed, MissingDependency) as exc:
        if json_mode:  # stdout keeps one document (the result, "ok": false); the code says what failed
            console.warn(exc.render())
            raise click.exceptions.Exit(exc.exit_code) from exc
        raise
    return 0


def _split(items: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """``PATH --attention-backend fa3`` (click drops the ``--``) -> (PATH, the SGLang arguments)."""
    if items and not items[0].startswith("-"):
        return items[0], tuple(items[1:])
    return None, tuple(items)


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r} is not KEY=VALUE (for example --env SGLANG_ENABLE_JIT_DEEPGEMM=0).")
        env[key] = value
    return env


def _print(console: Console, result: backend_audit.BackendAuditResult) -> None:
    console.info(f"Backend choice of SGLang {result.release or '(unknown release)'} at {result.root}")
    print(render_table(result.HEADERS, result.rows()), flush=True)
    console.info("")
    for line in result.notes():
        console.info(line)
    for line in result.slow_notes():
        console.info(line)
    print(result.summary(), flush=True)


def _slow_warnings(result: backend_audit.BackendAuditResult) -> list[str]:
    found = sorted({str(f) for r in result.slow_on_12x for f in r.slow_only})
    if not found:
        return []
    return [
        f"{len(result.slow_on_12x)} resolution(s) on 12.x run slowly because of: {', '.join(found)} "
        "(why and the fix are in the notes, or 'slow' in --json)."
    ]


def _verdict(result: backend_audit.BackendAuditResult, error_on_slow: bool = False) -> None:
    missing = sorted({r.missing_module for r in result.not_run if r.missing_module})
    if missing:
        raise MissingDependency(
            f"SGLang's argument resolution could not run: the Python module(s) {', '.join(missing)} are missing.",
            hint="pip install 'sm120kit[audit]' installs what SGLang's argument code imports.",
        )
    problems = []
    if result.flagged:
        problems.append(f"{len(result.flagged)} resolution(s) on 12.x chose a backend with no SM120 code")
    if result.rejected_on_12x:
        problems.append(f"SGLang rejected the arguments in {len(result.rejected_on_12x)} resolution(s) on 12.x")
    if result.not_run:
        problems.append(f"{len(result.not_run)} resolution(s) could not be run")
    if result.over_smem_on_12x:
        settings = sorted(
            {f"{f} (largest that fits: {f.largest_fitting})" for r in result.over_smem_on_12x for f in r.over_smem}
        )
        problems.append(
            f"{len(result.over_smem_on_12x)} resolution(s) on 12.x have a setting under which a kernel "
            f"SGLang launches needs more shared memory than the GPU has: {', '.join(settings)}"
        )
    if error_on_slow and result.slow_on_12x:
        problems.append(
            f"{len(result.slow_on_12x)} resolution(s) on 12.x have settings that run slowly (--error-on-slow)"
        )
    if problems:
        raise CheckFailed(
            "The backend-choice audit failed: " + "; ".join(problems) + ".",
            hint="The notes under the table say why and where each fact comes from.",
        )
