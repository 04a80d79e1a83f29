"""``sm120kit build-kernel``, ``sm120kit fetch-deps`` and ``sm120kit inspect-so``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, exit_with, json_option, pass_app
from sm120kit.errors import CheckFailed, UsageError
from sm120kit.hardware import fatbin
from sm120kit.hardware.arch import NotAnArch, parse_arch
from sm120kit.kernel import build as build_mod
from sm120kit.kernel import deps as deps_mod
from sm120kit.kernel.source import find_kernel_source


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _arch_rows(libraries) -> list[list[str]]:
    return [[lib.label, _size(lib.size), " ".join(lib.sass) or "-", " ".join(lib.ptx) or "-"] for lib in libraries]


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected NAME=VALUE (e.g. GITHUB_ARTIFACTORY=mirror.example.com).")
        name, value = item.split("=", 1)
        out[name.strip()] = value
    return out


def _sass_name(text: str) -> str:
    """``sm_120a``, ``12.0a`` or ``90a`` -> ``sm_120a`` / ``sm_90a``."""
    try:
        return parse_arch(text).sass
    except NotAnArch as exc:
        raise UsageError(f"--require {exc.message}") from None


@cli.command("build-kernel")
@click.argument("src", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--arch",
    "archs",
    multiple=True,
    default=("12.0a",),
    show_default=True,
    metavar="CC",
    help="Target to build for: 12.0a (RTX PRO 6000 Blackwell, RTX 5090) or 12.1a (DGX Spark). Repeatable.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the wheel, the build folder (reused between runs) and the log.",
)
@click.option("--jobs", type=int, default=None, help="Parallel compile jobs (default: from cores and memory).")
@click.option(
    "--deps-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Pre-fetched third-party sources (sm120kit fetch-deps); the build then needs no network.",
)
@click.option("--ccache/--no-ccache", default=None, help="Use ccache (default: when an nvcc-capable one is on PATH).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run the preflight and print the command and environment, then any preflight failures (exit "
    "code of the first); build nothing.",
)
@json_option
@pass_app
def build_kernel(
    app: AppContext,
    src: Path,
    archs: tuple[str, ...],
    out_dir: Path,
    jobs: int | None,
    deps_dir: Path | None,
    ccache: bool | None,
    dry_run: bool,
    json_mode: bool,
) -> None:
    """Build sgl-kernel from SRC (an SGLang clone or the kernel folder) for SM12x only, and verify it.

    Every nvcc command is restricted to the --arch targets, the parts without SM12x code are switched off,
    and after the build each library of the wheel is read to check it holds the requested SASS.
    """
    console = app.console(json_mode)
    source = find_kernel_source(src)
    parsed = tuple(build_mod.parse_build_arch(a) for a in archs)
    with console.step("preflight"):
        plan = build_mod.plan_build(
            source, parsed, out_dir, jobs=jobs, deps_dir=deps_dir, ccache=ccache, keep_going=dry_run
        )
    for warning in plan.warnings:
        console.warn(warning)
    tc = plan.toolchain
    console.info(f"source:  {source.label}")
    console.info(f"targets: {', '.join(plan.sass)}")
    console.info(
        f"nvcc {tc.cuda_version[0]}.{tc.cuda_version[1]} ({tc.nvcc}"
        f"{', found as ' + tc.nvcc_found if tc.nvcc_found and tc.nvcc_found != tc.nvcc else ''}); "
        f"cmake {tc.cmake_version}; "
        f"ninja {tc.ninja_version}; torch {tc.torch_version or 'not needed'}"
        f"{' (CUDA ' + tc.torch_cuda + ')' if tc.torch_cuda else ''}"
    )
    console.info(f"ccache:  {plan.ccache_text}")
    console.info(f"jobs:    {plan.jobs_reason}")
    for option, why in plan.switched_off:
        console.info(f"off:     {option} ({why})")
    if dry_run:

        def plan_text() -> None:
            console.info("environment:")
            for key, value in plan.env:
                console.info(f"  {key}={value}")
            console.info("command:")
            console.info("  " + build_mod.runner.quote(plan.argv))
            console.info(f"log file: {plan.log_file}")

        emit(
            json_mode,
            {"dry_run": True, "plan": plan.to_json(), "failures": [f.to_json() for f in plan.failures]},
            plan_text,
        )
        _dry_run_failures(plan.failures)
        return
    with console.step(f"building {source.name or 'kernel'} for {', '.join(plan.sass)} (log: {plan.log_file})"):
        result = build_mod.run_build(plan, on_progress=_build_progress(console), on_step=console.info)

    def human() -> None:
        console.info(f"wheel: {result.wheel} ({_size(result.wheel_size)}), built in {result.seconds:.0f} s")
        console.info("objects: " + ", ".join(f"{n} {what}" for what, n in result.launcher))
        for note in result.interpreter_bound:
            console.info(f"note: {note}; install the wheel where the build's interpreter runs")
        console.table(
            ["library", "size", "SASS", "PTX", "on 12.x", "check"],
            [
                row + ["yes" if c.loaded_on_sm12x else "no", c.status]
                for row, c in zip(_arch_rows([c.library for c in result.checks]), result.checks)
            ],
        )

    emit(json_mode, result.to_json(), human)
    if result.driver_unlinked:
        _fail_after_output(
            json_mode,
            CheckFailed(
                f"The wheel {result.wheel} would not import: {'; '.join(result.driver_unlinked)}. The link used a "
                "libcuda.so that defines none of these functions (an empty stub), so the linker left the driver "
                "out.",
                hint="Link against the toolkit's stub (lib64/stubs/libcuda.so) or a stub that defines the driver "
                "functions (docs/build-kernel.md, 'A compiler-only toolkit'), delete the .so files in the build "
                "folder and run build-kernel again: only the libraries are linked again.",
            ),
        )
    if not result.ok:
        bad = result.failures or result.checks
        names = ", ".join(f"{c.library.label} ({c.status})" for c in bad) or "no library loaded on 12.x was built"
        _fail_after_output(
            json_mode,
            CheckFailed(
                f"The wheel {result.wheel} lacks the requested SASS ({', '.join(plan.sass)}) in: {names}. "
                f"Full log: {plan.log_file}",
                hint=f"Check the objects in {plan.launcher_log} and the compile lines in the log.",
            ),
        )


@cli.command("fetch-deps")
@click.argument("src", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--into",
    "into",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to fetch the sources into (one subfolder per dependency); pass it to --deps-dir.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a CMake variable used in the declarations (e.g. GITHUB_ARTIFACTORY=mirror.host).",
)
@click.option(
    "--from-git",
    "from_git",
    multiple=True,
    metavar="URL=PATH",
    help="A local clone (or bare mirror) of the repository at URL: its archives (URL/archive/REF.tar.gz) are "
    "made from it with git archive and checked against URL_HASH; git dependencies are fetched from it. Repeatable.",
)
@json_option
@pass_app
def fetch_deps(
    app: AppContext, src: Path, into: Path, sets: tuple[str, ...], from_git: tuple[str, ...], json_mode: bool
) -> None:
    """Fetch the third-party sources SRC's CMake files declare (FetchContent), for an offline build.

    A dependency that cannot be fetched does not stop the others; the command then exits non-zero naming
    each one and how to provide it. A folder whose source was put there by hand is kept ("provided").
    """
    console = app.console(json_mode)
    source = find_kernel_source(src)
    git_sources = tuple(deps_mod.parse_git_source(item) for item in from_git)
    with console.step(f"fetching dependencies of {source.label}"):
        fetched = deps_mod.fetch_dependencies(
            source,
            into,
            progress=console.progress,
            on_step=console.info,
            overrides=_parse_sets(sets),
            git_sources=git_sources,
        )
    error = deps_mod.failure_error(fetched, into)

    def human() -> None:
        console.table(
            ["dependency", "status", "revision", "folder", "CMake variable"],
            [[f.dependency.name, f.status, (f.revision or "")[:12], f.folder, f.dependency.variable] for f in fetched],
        )
        if error is None:
            console.info(f"build offline with: sm120kit build-kernel {src} --deps-dir {into} --out DIR")

    emit(
        json_mode,
        {
            "source": source.to_json(),
            "into": str(into),
            "ok": error is None,
            "dependencies": [f.to_json() for f in fetched],
        },
        human,
    )
    if error is not None:
        if json_mode:
            exit_with(error.exit_code, error.render())
        raise error


@cli.command("inspect-so")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--require",
    "require",
    multiple=True,
    metavar="ARCH",
    help="Fail unless every library holds SASS for ARCH (e.g. sm_120a). Repeatable.",
)
@click.option(
    "--only-loaded",
    is_flag=True,
    help="Apply --require only to the libraries of an sgl-kernel wheel that SGLang loads on 12.x; the sm90/ "
    "copy of common_ops, FA3's flash_ops and FlashMLA's flashmla_ops (no 12.x code by design) are listed "
    "with the reason.",
)
@json_option
@pass_app
def inspect_so(
    app: AppContext, paths: tuple[Path, ...], require: tuple[str, ...], only_loaded: bool, json_mode: bool
) -> None:
    """List the GPU code (SASS and PTX per architecture) inside .so files, wheels or folders.

    Reads the CUDA fat binaries of each library in pure Python: no CUDA toolkit needed.
    """
    console = app.console(json_mode)
    libraries = []
    for path in paths:
        libraries.extend(fatbin.inspect_path(path))
    wanted = tuple(_sass_name(r) for r in require)
    skipped = {}
    if only_loaded:
        for lib in libraries:
            loaded, why = build_mod.loaded_on_sm12x(lib)
            if not loaded:
                skipped[lib.label] = why
    lacking = [lib for lib in libraries if lib.label not in skipped and any(a not in lib.sass for a in wanted)]

    def human() -> None:
        if not libraries:
            console.info("no shared libraries found")
            return
        if only_loaded:
            console.table(
                ["library", "size", "SASS", "PTX", "on 12.x"],
                [
                    row + [("no: " + skipped[lib.label]) if lib.label in skipped else "yes"]
                    for row, lib in zip(_arch_rows(libraries), libraries)
                ],
            )
        else:
            console.table(["library", "size", "SASS", "PTX"], _arch_rows(libraries))

    document = {
        "libraries": [lib.to_json() for lib in libraries],
        "require": list(wanted),
        "lacking": [lib.label for lib in lacking],
    }
    if only_loaded:
        document["not_loaded_on_sm12x"] = skipped
    emit(json_mode, document, human)
    if wanted and lacking:
        _fail_after_output(
            json_mode,
            CheckFailed(
                f"{len(lacking)} of {len(libraries)} libraries lack SASS for {', '.join(wanted)}: "
                + ", ".join(lib.label for lib in lacking)
                + "."
            ),
        )


LOG_LINE_EVERY_PERCENT = 5
LOG_LINE_EVERY_SECONDS = 600


def _build_progress(console, clock=time.monotonic):
    """ninja's ``[n/N]`` steps as a bar on a terminal; in a log (no terminal) one line each time the build
    passes another 5% of its steps, or 10 minutes after the last line if it moved at all, with the time
    since the start: a build of hours leaves a few dozen lines, each saying how far it got."""
    if console.tty:
        return console.progress
    start = clock()
    last = {"time": start, "bucket": -1, "done": 0, "total": 0}

    def progress(done: int, total: int, label: str) -> None:
        if total != last["total"]:  # a new ninja run (configure, then the build) counts anew
            last.update(total=total, bucket=-1, done=0)
        bucket = (100 * done // total) // LOG_LINE_EVERY_PERCENT if total else 0
        now = clock()
        moved = done > last["done"]
        if bucket > last["bucket"] or done >= total or (moved and now - last["time"] >= LOG_LINE_EVERY_SECONDS):
            minutes = (now - start) / 60
            console.info(f"[{done}/{total}] {100 * done / max(total, 1):.0f}% after {minutes:.0f} min: {label}")
            last.update(time=now, bucket=bucket, done=done)

    return progress


def _dry_run_failures(failures) -> None:
    """After a dry run's plan: each preflight failure as ``error: ...`` on stderr, then exit with the first
    one's code (a build would have stopped there)."""
    if not failures:
        return
    click.echo(f"the build would stop at the preflight: {len(failures)} failure(s)", err=True)
    exit_with(failures[0].exit_code, *(failure.render() for failure in failures))


def _fail_after_output(json_mode: bool, error: CheckFailed) -> None:
    """The result is printed: with --json stdout keeps that one document (its "ok"/"lacking" say what failed)
    and the exit code says the rest; without it the error is raised as usual."""
    if json_mode:
        exit_with(error.exit_code, error.render())
    raise error
