"""``sm120kit verify``: the environment report, the static SM120 audits and numeric backend checks."""

from __future__ import annotations

import click

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, json_option, pass_app
from sm120kit.errors import UsageError
from sm120kit.hardware.arch import NotAnArch, parse_capability
from sm120kit.ui import Console, print_json
from sm120kit.verify import checks as checks_mod
from sm120kit.verify.report import EnvironmentReport, fmt_version
from sm120kit.verify.verifier import VerifyPlan, VerifyResult, exit_code, run_verify

MARKS = {"ok": "ok", "fail": "FAIL", "skipped": "skipped"}


def _arch(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    try:
        return parse_capability(value)
    except NotAnArch as exc:
        raise UsageError(f"--arch {exc.message}") from None


@cli.command("verify")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="NAME",
    help="Run only this check or backend family (repeatable): triton, torch_native, sgl_kernel, "
    "flashinfer, or a check name such as triton-extend. See --list.",
)
@click.option(
    "--arch",
    "arch_text",
    metavar="CC",
    help="Judge the environment for this compute capability (e.g. 12.0) instead of the GPU present.",
)
@click.option(
    "--sglang",
    "sglang_path",
    type=click.Path(),
    metavar="PATH",
    help="The SGLang tree to report on and import (git clone, its python/ folder or an installed "
    "package); default: the sglang this Python imports.",
)
@click.option(
    "--audits/--no-audits",
    default=None,
    help="Run the static SM120 audits (default: only when no GPU can run the checks).",
)
@click.option("--list", "list_checks", is_flag=True, help="List the checks and exit.")
@json_option
@pass_app
def verify(
    app: AppContext,
    backends: tuple[str, ...],
    arch_text: str | None,
    sglang_path: str | None,
    audits: bool | None,
    list_checks: bool,
    json_mode: bool,
) -> int:
    """Report the environment, then run every backend SGLang can use on this GPU against a torch reference.

    Exits 13 when a check fails, the report finds a mismatch that breaks the judged GPU, an audit flags
    a problem, or nothing was verified (every check skipped and no static audit ran); 0 otherwise. Without a
    GPU no kernel runs: the report and the static audits do the work.
    """
    console = app.console(json_mode)
    if list_checks:
        rows = [(c.name, c.backend, c.title) for c in checks_mod.all_checks()]
        if json_mode:
            print_json({"checks": [dict(zip(("name", "backend", "title"), r)) for r in rows]})
        else:
            console.table(("check", "backend", "what it runs"), rows)
        return 0
    plan = VerifyPlan(backends=tuple(backends), arch=_arch(arch_text), sglang=sglang_path, audits=audits)
    checks_mod.select_checks(plan.backends)  # a bad --backend fails before any work
    if not json_mode:
        console.info("sm120kit verify: collecting the environment report ...")
    result = run_verify(plan, progress=console.progress, on_step=console.info)
    if json_mode:
        data = result.to_json()
        data["exit_code"] = exit_code(result)
        print_json(data)
    else:
        render(result, console)
    return exit_code(result)


# -- human output ----------------------------------------------------------------------------------------------


def _gib(n: int | None) -> str:
    return f"{n / 1024**3:.1f} GiB" if n else "?"


def _tool(t) -> str:
    if t.path is None:
        return f"not found ({t.error})" if t.error else "not found"
    if t.error:
        return f"{t.path}: {t.error}"
    where = f" ({t.source})" if t.source and t.source != "PATH" else ""
    return f"{t.version} at {t.path}{where}"


def report_rows(r: EnvironmentReport) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    g = r.gpu
    if g:
        rows.append(
            (
                "GPU",
                f"{g.name}, capability {g.label}{' (' + g.family + ')' if g.family else ''}, "
                f"{g.sm_count} SMs, {_gib(g.total_memory)}" + (" [ROCm/HIP]" if g.platform == "hip" else ""),
            )
        )
        known = (
            f"{g.known_shared_memory_per_block} B known for the family"
            if g.known_shared_memory_per_block
            else "no known figure for this capability"
        )
        rows.append(("shared memory", f"{g.shared_memory_per_block_optin} B opt-in per block (device); {known}"))
    else:
        rows.append(("GPU", r.gpu_note))
    d = r.driver
    drv = d.version or "not found"
    if d.cuda_version:
        drv += f" (supports CUDA up to {fmt_version(d.cuda_version)})"
    if d.error and not d.version:
        drv = d.error
    rows.append(("driver", drv))
    t = r.torch
    rows.append(
        (
            "CUDA runtime",
            f"{t.cuda} (the CUDA torch is built with)"
            if t.cuda
            else (f"HIP {t.hip}" if t.hip else "none (no CUDA torch)"),
        )
    )
    rows.append(("nvcc", _tool(r.nvcc)))
    rows.append(("ptxas", _tool(r.ptxas)))
    rows.append(
        (
            "Triton's ptxas",
            _tool(r.triton_ptxas) + f" [assembles sm_{r.judged_for[0]}{r.judged_for[1]}"
            f"{'a' if r.judged_for[0] >= 9 else ''}]",
        )
    )
    if t.installed:
        archs = " ".join(t.arch_list) if t.arch_list else "(none)"
        rows.append(("torch", f"{t.version}, CUDA {t.cuda or '-'}, archs {archs}"))
    else:
        rows.append(("torch", t.error or "not installed"))
    rows.append(("triton", r.triton.version or ("installed" if r.triton.installed else "not installed")))
    s = r.sglang
    if s.installed:
        rows.append(("SGLang", f"{s.version or '?'} at {s.path} ({s.kind})"))
        rows.append(("sm120kit patches", s.patch_summary or "-"))
        if s.pins:
            rows.append(("  release pins", ", ".join(f"{k}{v}" for k, v in s.pins.items())))
    else:
        rows.append(("SGLang", s.error or "not installed"))
    k = r.sgl_kernel
    if k.installed:
        rows.append(("sgl_kernel", f"{k.version or '?'} at {k.location}"))
        pick = f"{k.variant_library}" if k.variant_library else "nothing"
        rows.append(("  loader picks", f"{pick} on {r.judged_for[0]}.{r.judged_for[1]} ({k.variant_reason})"))
        for lib in k.libraries:
            if lib.error:
                rows.append((f"  {lib.path}", f"unreadable: {lib.error}"))
            elif lib.sass or lib.ptx:
                rows.append((f"  {lib.path}", f"SASS {' '.join(lib.sass) or '-'}; PTX {' '.join(lib.ptx) or '-'}"))
            else:
                rows.append((f"  {lib.path}", k.archs_note or "no CUDA code"))
    else:
        rows.append(("sgl_kernel", "not installed"))
    f = r.flashinfer
    if f.installed:
        archs = " ".join(f.jit_archs) or "(none)"
        text = f"{f.version or '?'}; JIT archs {archs}" + (f" ({f.jit_archs_source})" if f.jit_archs_source else "")
        if f.error:
            text += f"; {f.error}"
        if f.prebuilt:
            text += f"; prebuilt: {', '.join(f.prebuilt)}"
        rows.append(("FlashInfer", text))
    else:
        rows.append(("FlashInfer", "not installed"))
    if r.multi_gpu is not None:
        rows.extend(r.multi_gpu.rows())
    if r.env:
        for key, value in r.env.items():
            rows.append((f"env {key}", value))
    else:
        rows.append(
            (
                "environment",
                "no SGLANG_*, NCCL_*, TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST, TRITON_PTXAS_PATH set",
            )
        )
    return rows


def render(result: VerifyResult, console: Console) -> None:
    r = result.report
    console.info("")
    console.info(f"Environment (judged for {r.judged_for[0]}.{r.judged_for[1]}: {r.judged_reason})")
    width = max(len(k) for k, _ in report_rows(r))
    for key, value in report_rows(r):
        console.info(f"  {key.ljust(width)}  {value}")
    console.info("")
    if r.flags:
        console.info("Findings")
        for flag in r.flags:
            mark = {"error": "ERROR", "warning": "warning", "info": "info"}[flag.severity]
            console.info(f"  [{mark}] {flag.component}: {flag.message}")
            if flag.fix:
                console.info(f"      fix: {flag.fix}")
    else:
        console.info("Findings: none; nothing in this environment breaks the judged GPU.")
    console.info("")
    where = "on the GPU present" if result.kernels_ran else "NOT run: " + result.no_kernel_reason
    console.info(f"Backend checks ({where})")
    rows = []
    for c in result.checks:
        rows.append((c.name, MARKS[c.status], f"{c.seconds:.1f} s" if c.status != "skipped" else "-", c.detail))
    console.table(("check", "status", "time", "detail"), rows)
    for c in result.checks:
        if c.hint:
            console.info(f"  {c.name}: {c.hint}")
    if result.audits:
        console.info("")
        console.info("Static audits (faked device, real compiles and SGLang's own argument resolution)")
        for a in result.audits:
            console.info(f"  {a.name}: {a.status} - {a.summary}")
            for line in a.details:
                console.info(f"      {line}")
    for note in result.notes:
        console.info("")
        console.info(note)
    n = result.counts()
    console.info("")
    verdict = {"ok": "OK", "problems": "PROBLEMS FOUND", "nothing-verified": "NOTHING VERIFIED"}[result.verdict]
    console.info(
        f"Result: {verdict}: {n['ok']} ok, {n['fail']} failed, {n['skipped']} skipped; "
        f"{len(r.errors)} error finding(s) in the report; {result.seconds:.1f} s."
    )
    reason = result.nothing_verified_reason()
    if reason:
        console.info(reason)
