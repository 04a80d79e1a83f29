"""The numeric checks of ``sm120kit verify``: the registry of every backend family's checks, and the runner.

What a check is and how it compares with its reference is :mod:`.check`; the checks themselves are
:mod:`.check_sglang`, :mod:`.check_sgl_kernel` and :mod:`.check_flashinfer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sm120kit.errors import UsageError
from sm120kit.verify import check_flashinfer, check_sgl_kernel, check_sglang
from sm120kit.verify.check import (
    FAIL,
    MISSING_PACKAGE,
    NO_GPU,
    OK,
    SKIPPED,
    CaseResult,
    Check,
    CheckContext,
    CheckResult,
    Skip,
    _ratio,
    describe_exception,
    hint_for,
)

__all__ = [
    "OK",
    "FAIL",
    "SKIPPED",
    "NO_GPU",
    "MISSING_PACKAGE",
    "Check",
    "CheckContext",
    "CheckResult",
    "all_checks",
    "select_checks",
    "run_checks",
    "gpu_context",
    "skipped_all",
]


# -- registry and runner ----------------------------------------------------------------------------------------


def all_checks() -> tuple[Check, ...]:
    return check_sglang.CHECKS + check_sgl_kernel.CHECKS + check_flashinfer.CHECKS


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def select_checks(names: Sequence[str] | None, checks: Sequence[Check] | None = None) -> list[Check]:
    """The checks named (a check's name or a backend family); all of them when ``names`` is empty."""
    checks = list(checks if checks is not None else all_checks())
    if not names:
        return checks
    chosen: list[Check] = []
    for raw in names:
        key = _norm(raw)
        matched = [c for c in checks if _norm(c.name) == key or _norm(c.backend) == key]
        if not matched:
            backends = sorted({c.backend for c in checks})
            raise UsageError(
                f"--backend {raw!r} names no check. Backends: {', '.join(backends)}; "
                f"checks: {', '.join(c.name for c in checks)}."
            )
        chosen += [c for c in matched if c not in chosen]
    return chosen


def skipped_all(checks: Sequence[Check], reason: str) -> list[CheckResult]:
    return [
        CheckResult(c.name, c.backend, c.title, SKIPPED, f"{reason}: no kernel ran", 0.0, skip_cause=NO_GPU)
        for c in checks
    ]


def run_check(check: Check, ctx: CheckContext) -> CheckResult:
    torch = ctx.torch
    start = time.perf_counter()
    try:
        ctx.seed()
        cases = check.run(ctx)
        torch.cuda.synchronize()
    except Skip as exc:
        return CheckResult(
            check.name,
            check.backend,
            check.title,
            SKIPPED,
            str(exc),
            time.perf_counter() - start,
            skip_cause=exc.cause,
            packages=(exc.package,) if exc.package else (),
        )
    except Exception as exc:  # import or set-up failure: the backend does not work here
        cases = [CaseResult("set-up", False, error=describe_exception(exc))]
    finally:
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass
    seconds = time.perf_counter() - start
    return summarize(check, cases, seconds, ctx.capability)


def summarize(check: Check, cases: Sequence[CaseResult], seconds: float, capability: tuple[int, int]) -> CheckResult:
    """A check's status from its cases: any failed case fails it; only skipped cases skip it."""
    cases = tuple(cases)
    skipped = [c for c in cases if c.skipped]
    ran = [c for c in cases if not c.skipped]
    failed = [c for c in ran if not c.ok]
    if not cases:
        return CheckResult(check.name, check.backend, check.title, FAIL, "the check produced no comparison", seconds)
    if not ran:
        causes = list(dict.fromkeys(c.skip_cause for c in skipped if c.skip_cause))
        return CheckResult(
            check.name,
            check.backend,
            check.title,
            SKIPPED,
            "; ".join(c.describe() for c in skipped),
            seconds,
            cases,
            skip_cause=causes[0] if len(causes) == 1 else None,
            packages=tuple(dict.fromkeys(c.package for c in skipped if c.package)),
        )
    if failed:
        detail = "; ".join(c.describe() for c in failed + skipped)
        return CheckResult(
            check.name, check.backend, check.title, FAIL, detail, seconds, cases, hint_for(failed, capability)
        )
    worst = max(ran, key=_ratio)
    detail = f"{len(ran)} case{'s' if len(ran) != 1 else ''} within tolerance; worst {worst.describe()}"
    if skipped:
        detail += "; " + "; ".join(c.describe() for c in skipped)
    return CheckResult(check.name, check.backend, check.title, OK, detail, seconds, cases)


def gpu_context(torch_module: Any) -> tuple[CheckContext | None, str]:
    """The context for running checks on the current CUDA GPU, or None and why no kernel can run."""
    if torch_module is None:
        return None, "torch is not installed"
    try:
        available = torch_module.cuda.is_available()
    except Exception as exc:
        return None, f"torch cannot query CUDA ({describe_exception(exc)})"
    if not available:
        return None, "no GPU (torch.cuda.is_available() is False)"
    if getattr(torch_module.version, "hip", None):
        return None, "a ROCm/HIP GPU: these checks are for NVIDIA GPUs"
    index = torch_module.cuda.current_device()
    capability = tuple(torch_module.cuda.get_device_capability(index))
    return CheckContext(
        torch_module,
        torch_module.device("cuda", index),
        (int(capability[0]), int(capability[1])),
        torch_module.cuda.get_device_name(index),
    ), ""


def run_checks(
    checks: Sequence[Check],
    ctx: CheckContext | None,
    no_gpu_reason: str = "",
    progress: Callable[[int, int, str], None] | None = None,
) -> list[CheckResult]:
    if ctx is None:
        return skipped_all(checks, no_gpu_reason or "no GPU")
    results = []
    for i, check in enumerate(checks, 1):
        if progress:
            progress(i - 1, len(checks), check.name)
        results.append(run_check(check, ctx))
    if progress:
        progress(len(checks), len(checks), "done")
    return results
