"""``sm120kit verify`` as one core call: the environment report, the static SM120 audits, and the numeric
backend checks, gathered into a :class:`VerifyResult` that the CLI prints as text or JSON.

The result says plainly which parts ran on a GPU and which were static: with no GPU, no kernel runs and
every check is ``skipped`` with that reason; the static audits (faked device, real Triton compiles and
SGLang's real argument resolution) run instead when their modules and an SGLang tree are present.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120kit.errors import Sm120kitError
from sm120kit.util.report import Progress, Step
from sm120kit.verify import checks as checks_mod
from sm120kit.verify.report import ERROR, EnvironmentReport, collect_report, probe_torch


@dataclass(frozen=True)
class VerifyPlan:
    backends: tuple[str, ...] = ()  # check or backend names; empty: all
    arch: tuple[int, int] | None = None  # judge the environment for this capability instead of the GPU's
    sglang: str | None = None  # an SGLang tree to report on and import from
    audits: bool | None = None  # None: run the static audits only when no kernel can run


@dataclass(frozen=True)
class AuditOutcome:
    name: str  # "backend choice" | "shared memory"
    status: str  # "ok" | "flagged" | "not-run"
    summary: str
    seconds: float = 0.0
    data: Any = None  # the audit's own JSON
    details: tuple[str, ...] = ()  # one line per finding (or per model), for people

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "seconds": round(self.seconds, 2),
            "details": list(self.details),
            "result": self.data,
        }


@dataclass(frozen=True)
class VerifyResult:
    report: EnvironmentReport
    checks: tuple[checks_mod.CheckResult, ...]
    kernels_ran: bool
    no_kernel_reason: str
    audits: tuple[AuditOutcome, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def failed_checks(self) -> list[checks_mod.CheckResult]:
        return [c for c in self.checks if c.status == checks_mod.FAIL]

    @property
    def ran_checks(self) -> list[checks_mod.CheckResult]:
        """The checks that ran a comparison (ok or fail); a skipped check verified nothing."""
        return [c for c in self.checks if c.status != checks_mod.SKIPPED]

    @property
    def ran_audits(self) -> list[AuditOutcome]:
        return [a for a in self.audits if a.status != "not-run"]

    @property
    def verified(self) -> bool:
        """Something was verified: a check ran, or a static audit ran. The environment report alone is not
        a verification (it reads versions and files; it runs no kernel and compiles nothing)."""
        return bool(self.ran_checks or self.ran_audits)

    @property
    def problems(self) -> bool:
        return bool(self.failed_checks or self.report.errors or any(a.status == "flagged" for a in self.audits))

    @property
    def ok(self) -> bool:
        """No check failed, no finding is an error, no audit flagged anything, and something ran: a run in
        which every check was skipped and no static audit ran is not a pass."""
        return not self.problems and self.verified

    @property
    def verdict(self) -> str:
        """``ok``, ``problems`` (a failure, an error finding or a flagged audit) or ``nothing-verified``."""
        if self.problems:
            return "problems"
        return "ok" if self.verified else "nothing-verified"

    def skip_causes(self) -> dict[str, int]:
        """How many checks were skipped for each cause (no-gpu, missing-package, ...; "other" when mixed)."""
        out: dict[str, int] = {}
        for c in self.checks:
            if c.status == checks_mod.SKIPPED:
                key = c.skip_cause or "other"
                out[key] = out.get(key, 0) + 1
        return out

    def missing_packages(self) -> list[str]:
        """The Python packages whose absence skipped a check, in the order first met."""
        return list(dict.fromkeys(p for c in self.checks if c.status == checks_mod.SKIPPED for p in c.packages))

    def nothing_verified_reason(self) -> str | None:
        """One sentence on why nothing ran, naming the causes; None when something ran."""
        if self.verified:
            return None
        parts = []
        for cause, count in self.skip_causes().items():
            if cause == checks_mod.MISSING_PACKAGE:
                parts.append(
                    f"{count} because a Python package that SGLang's (or the library's) modules import "
                    f"is not installed: {', '.join(self.missing_packages())}"
                )
            elif cause == checks_mod.NO_GPU:
                parts.append(f"{count} because no kernel can run here: {self.no_kernel_reason or 'no GPU'}")
            else:
                parts.append(f"{count} as {cause}")
        checks_text = (
            f"every one of the {len(self.checks)} check(s) was skipped ({'; '.join(parts)})"
            if self.checks
            else "no check was selected"
        )
        audits_text = (
            "no static audit ran (" + "; ".join(f"{a.name}: {a.summary}" for a in self.audits) + ")"
            if self.audits
            else "the static audits were not run"
        )
        return f"Nothing was verified: {checks_text}, and {audits_text}."

    def counts(self) -> dict[str, int]:
        out = {checks_mod.OK: 0, checks_mod.FAIL: 0, checks_mod.SKIPPED: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "verified": self.verified,
            "nothing_verified_reason": self.nothing_verified_reason(),
            "kernels_ran": self.kernels_ran,
            "no_kernel_reason": self.no_kernel_reason or None,
            "summary": {
                **self.counts(),
                "errors_in_report": len(self.report.errors),
                "audits_flagged": sum(a.status == "flagged" for a in self.audits),
                "audits_ran": len(self.ran_audits),
                "skip_causes": self.skip_causes(),
                "missing_packages": self.missing_packages(),
            },
            "report": self.report.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "audits": [a.to_json() for a in self.audits],
            "notes": list(self.notes),
            "seconds": round(self.seconds, 2),
        }


def _use_sglang_tree(path: str | None) -> str | None:
    """Put the tree's folder holding ``sglang/`` first on ``sys.path`` so the checks import that SGLang."""
    if not path:
        return None
    import sys

    from sm120kit.sglang.target import find_target

    target = find_target(path)
    root = str(target.root)
    if root not in sys.path:
        sys.path.insert(0, root)
    return root


def run_static_audits(
    report: EnvironmentReport, sglang_path: str | None, *, progress: Progress | None = None, on_step: Step | None = None
) -> tuple[AuditOutcome, ...]:
    """The static audits for the judged capability, each one only where its module exists."""
    outcomes: list[AuditOutcome] = []
    cap = f"{report.judged_for[0]}.{report.judged_for[1]}"
    if not report.sglang.installed:
        reason = "no SGLang tree to audit (install SGLang or pass --sglang PATH)"
        return (AuditOutcome("backend choice", "not-run", reason), AuditOutcome("shared memory", "not-run", reason))
    root = report.sglang.path and str(Path(report.sglang.path).parent)
    outcomes.append(_backend_audit(root, cap, report.flashinfer.installed, progress, on_step))
    outcomes.append(_smem_audit(root, cap, progress, on_step))
    return tuple(outcomes)


def _backend_audit(
    root: str, cap: str, flashinfer: bool, progress: Progress | None, on_step: Step | None
) -> AuditOutcome:
    try:
        mod = importlib.import_module("sm120kit.audit.backends")
        audit = getattr(mod, "audit_backends")
    except (ImportError, AttributeError):
        return AuditOutcome(
            "backend choice", "not-run", "not available: this sm120kit has no backend audit (sm120kit.audit.backends)"
        )
    start = time.perf_counter()
    try:
        result = audit(root, capabilities=(cap,), flashinfer=(flashinfer,), progress=progress, on_step=on_step)
    except Sm120kitError as exc:
        return AuditOutcome("backend choice", "not-run", f"could not run: {exc.message}", time.perf_counter() - start)
    data = result.to_json() if hasattr(result, "to_json") else None
    flagged = list(getattr(result, "flagged", ()))
    not_run = list(getattr(result, "not_run", ()))
    total = len(getattr(result, "resolutions", ()))
    if flagged:
        names = ", ".join(f"{r.model}: {', '.join(r.flagged)}" for r in flagged)
        status, summary = (
            "flagged",
            f"{len(flagged)} of {total} model(s) on {cap} would pick a backend with no SM120 code ({names})",
        )
    elif not_run and len(not_run) == total:
        status, summary = "not-run", f"SGLang's argument resolution did not run ({not_run[0].error or 'no reason'})"
    else:
        status = "ok"
        summary = f"{total - len(not_run)} of {total} model(s) resolved on a faked {cap}: no unsupported choice"
    details = []
    for r in getattr(result, "resolutions", ()):
        b = r.backends
        if r.status == "resolved":
            verdict = "FLAGGED " + ", ".join(r.flagged) if r.flagged else "ok"
            details.append(
                f"{r.model}: attention {r.attention}, moe {b.get('moe_runner') or '-'}, "
                f"fp8 gemm {b.get('fp8_gemm') or '-'}, fp4 gemm {b.get('fp4_gemm') or '-'}: {verdict}"
            )
        else:
            details.append(f"{r.model}: {r.status}: {(r.error or '').strip().splitlines()[0] if r.error else '-'}")
    return AuditOutcome("backend choice", status, summary, time.perf_counter() - start, data, tuple(details))


def _smem_audit(root: str, cap: str, progress: Progress | None, on_step: Step | None) -> AuditOutcome:
    if importlib.util.find_spec("sm120kit.audit.smem") is None:
        return AuditOutcome(
            "shared memory", "not-run", "not available: this sm120kit has no shared-memory audit (sm120kit.audit.smem)"
        )
    mod = importlib.import_module("sm120kit.audit.smem")
    audit = getattr(mod, "audit_smem", None)
    if audit is None:
        return AuditOutcome("shared memory", "not-run", "not available: sm120kit.audit.smem has no audit_smem")
    start = time.perf_counter()
    try:
        result = audit(root, capabilities=(cap,), progress=progress, on_step=on_step)
    except Sm120kitError as exc:
        return AuditOutcome("shared memory", "not-run", f"could not run: {exc.message}", time.perf_counter() - start)
    data = result.to_json() if hasattr(result, "to_json") else None
    over = list(getattr(result, "over_limit", ()))
    errors = list(getattr(result, "errors", ()))
    summary_line = getattr(mod, "summary_line", None)
    summary = summary_line(result) if summary_line else f"{len(over)} kernel(s) over the limit of {cap}"
    status = "flagged" if over or errors else "ok"
    details = [
        f"{case.case.launcher} ({case.case.model}, {case.case.shape}): {k.name} "
        f"[{k.block_text}, {k.num_warps} warps, {k.num_stages} stages] needs {k.shared} B > {k.limit} B"
        for case, k in over
    ]
    details += [
        f"{case.case.launcher} ({case.case.model}, {case.case.shape}): {case.status}: {case.error}" for case in errors
    ]
    return AuditOutcome("shared memory", status, summary, time.perf_counter() - start, data, tuple(details))


def run_verify(plan: VerifyPlan, *, progress: Progress | None = None, on_step: Step | None = None) -> VerifyResult:
    start = time.perf_counter()
    selected = checks_mod.select_checks(plan.backends)  # bad --backend fails before any work
    _use_sglang_tree(plan.sglang)
    report = collect_report(arch_override=plan.arch, sglang_path=plan.sglang)
    _torch_info, torch_module = probe_torch()
    ctx, reason = checks_mod.gpu_context(torch_module)
    notes: list[str] = []
    if ctx is not None and plan.arch is not None and plan.arch != ctx.capability:
        notes.append(
            f"The report is judged for {plan.arch[0]}.{plan.arch[1]} (--arch); the checks ran on the GPU "
            f"present ({ctx.gpu_name}, {ctx.capability[0]}.{ctx.capability[1]})."
        )
    results = checks_mod.run_checks(selected, ctx, reason, progress=progress)
    run_audits = plan.audits if plan.audits is not None else ctx is None
    audits = run_static_audits(report, plan.sglang, progress=progress, on_step=on_step) if run_audits else ()
    if ctx is None:
        ran = [a for a in audits if a.status != "not-run"]
        notes.append(
            f"No kernel ran: {reason}. Findings come from the environment report"
            + (" and the static audits (a faked device; real Triton compiles)." if ran else " only.")
        )
    return VerifyResult(
        report, tuple(results), ctx is not None, reason, audits, time.perf_counter() - start, tuple(notes)
    )


def exit_code(result: VerifyResult) -> int:
    """0 when something was verified and everything passed; the CheckFailed code (13) otherwise, including a
    run that verified nothing (``verdict`` "nothing-verified")."""
    from sm120kit.errors import CheckFailed

    return 0 if result.ok else CheckFailed.exit_code


__all__ = ["VerifyPlan", "VerifyResult", "AuditOutcome", "run_verify", "exit_code", "ERROR"]
