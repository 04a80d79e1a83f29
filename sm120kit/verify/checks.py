"""Numeric smoke tests of every backend SGLang can use on the GPU present.

Each :class:`Check` imports one backend and runs it on small inputs against a torch reference computed
in float32; every case states its error metric and tolerance. A check ends ``ok`` (every case within
tolerance), ``fail`` (an error, or an error over tolerance: the case says which) or ``skipped`` (why:
no GPU, not installed, the GPU lacks the feature). An import is not a test; only a comparison counts.

The checks themselves live in one module per backend family (:mod:`.check_sglang`,
:mod:`.check_sgl_kernel`, :mod:`.check_flashinfer`); this module holds the registry, the comparison
functions and the runner.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from sm120kit.errors import UsageError

OK, FAIL, SKIPPED = "ok", "fail", "skipped"


class Skip(Exception):
    """Raised inside a check: it cannot run here, for the reason given."""


@dataclass(frozen=True)
class CaseResult:
    """One input shape/dtype of a check, compared with its reference."""

    label: str
    ok: bool
    max_error: float | None = None
    tolerance: float | None = None
    metric: str = ""  # "max|Δ|", "max|Δ|/max|ref|", "‖Δ‖/‖ref‖"
    error: str | None = None  # the exception, when the case raised
    note: str = ""
    skipped: str | None = None  # why this case could not run (a package it needs is not installed)

    def describe(self) -> str:
        if self.skipped:
            return f"{self.label}: skipped ({self.skipped})"
        if self.error:
            return f"{self.label}: {self.error}"
        text = f"{self.label}: {self.metric} {fmt_err(self.max_error)} "
        text += ("<= " if self.ok else "> ") + fmt_err(self.tolerance)
        return text + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class CheckResult:
    name: str
    backend: str
    title: str
    status: str  # ok | fail | skipped
    detail: str
    seconds: float
    cases: tuple[CaseResult, ...] = ()
    hint: str = ""

    @property
    def worst(self) -> CaseResult | None:
        """The case with the largest error relative to its tolerance (a raising case counts as worst)."""
        ranked = [c for c in self.cases if c.error and not c.skipped] or sorted(
            (c for c in self.cases if c.tolerance and not c.skipped), key=lambda c: -(_ratio(c)))
        return ranked[0] if ranked else None

    def to_json(self) -> dict:
        worst = self.worst
        return {
            "name": self.name,
            "backend": self.backend,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
            "max_error": None if worst is None or worst.max_error is None else worst.max_error,
            "tolerance": None if worst is None else worst.tolerance,
            "hint": self.hint or None,
            "cases": [
                {"label": c.label, "ok": c.ok, "max_error": c.max_error, "tolerance": c.tolerance,
                 "metric": c.metric, "error": c.error, "note": c.note or None, "skipped": c.skipped}
                for c in self.cases
            ],
        }


def _ratio(case: CaseResult) -> float:
    if case.max_error is None or not case.tolerance:
        return math.inf
    if math.isnan(case.max_error):
        return math.inf
    return case.max_error / case.tolerance


def fmt_err(value: float | None) -> str:
    if value is None:
        return "?"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.2e}" if value and (value < 1e-3 or value >= 1e3) else f"{value:.4f}"


@dataclass(frozen=True)
class CheckContext:
    """What a check runs with: torch, the CUDA device and its capability."""

    torch: Any
    device: Any
    capability: tuple[int, int]
    gpu_name: str

    def seed(self, value: int = 0) -> None:
        self.torch.manual_seed(value)


@dataclass(frozen=True)
class Check:
    name: str  # "triton-extend"
    backend: str  # "triton" | "torch_native" | "sgl_kernel" | "flashinfer"
    title: str
    run: Callable[[CheckContext], list[CaseResult]] = field(repr=False, compare=False)


# -- comparison -----------------------------------------------------------------------------------------------

ABS, REL_MAX, REL_FRO = "max|Δ|", "max|Δ|/max|ref|", "‖Δ‖/‖ref‖"


def compare(label: str, out, ref, *, tol: float, metric: str = ABS, note: str = "") -> CaseResult:
    """``out`` (any dtype) against ``ref`` (float32) with ``metric``; NaN/Inf or all-zero output fails."""
    out32 = out.float()
    ref32 = ref.float()
    if tuple(out32.shape) != tuple(ref32.shape):
        return CaseResult(label, False, error=f"output shape {tuple(out32.shape)} != reference {tuple(ref32.shape)}")
    if not bool(out32.isfinite().all()):
        bad = int((~out32.isfinite()).sum())
        return CaseResult(label, False, math.nan, tol, metric, note=f"{bad} non-finite values in the output")
    diff = (out32 - ref32).abs()
    ref_scale = float(ref32.abs().max()) if ref32.numel() else 0.0
    if metric == ABS:
        err = float(diff.max()) if diff.numel() else 0.0
    elif metric == REL_MAX:
        err = (float(diff.max()) if diff.numel() else 0.0) / max(ref_scale, 1e-12)
    elif metric == REL_FRO:
        err = float((out32 - ref32).norm()) / max(float(ref32.norm()), 1e-12)
    else:  # pragma: no cover - a programming error
        raise ValueError(metric)
    if ref_scale > 0 and out32.numel() and float(out32.abs().max()) == 0.0:
        note = (note + "; " if note else "") + "the output is all zeros"
        return CaseResult(label, False, err, tol, metric, note=note)
    return CaseResult(label, err <= tol, err, tol, metric, note=note)


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    if len(text) > 400:
        text = text[:400] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_case(label: str, func: Callable[[], CaseResult | list[CaseResult]]) -> list[CaseResult]:
    """Run one case; an exception becomes a failed case (a :class:`Skip` skips the whole check)."""
    try:
        result = func()
    except Skip:
        raise
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top and top != "sglang":
            return [CaseResult(label, False, skipped=f"needs the Python package '{top}', which is not installed")]
        return [CaseResult(label, False, error=describe_exception(exc))]
    except Exception as exc:  # the backend failed: that is the finding
        return [CaseResult(label, False, error=describe_exception(exc))]
    return result if isinstance(result, list) else [result]


def hint_for(cases: Iterable[CaseResult], capability: tuple[int, int]) -> str:
    text = " ".join(c.error or "" for c in cases)
    if "out of resource: shared memory" in text or "OutOfResources" in text:
        return ("The kernel's block sizes need more shared memory per block than this GPU has "
                f"({capability[0]}.{capability[1]}); SGLang picked sizes for a larger GPU. The sm120kit patch "
                "series carries SM120 block sizes for SGLang's Triton kernels.")
    if "no kernel image is available" in text:
        return ("The library holds no machine code for this GPU; run `sm120kit verify` without --backend to see "
                "which library lacks it in the environment report.")
    return ""


# -- importing the things under test ----------------------------------------------------------------------------


def import_sglang_module(*names: str):
    """Import the first of ``names`` that this SGLang release has (modules move between releases).

    :class:`Skip` when SGLang is not installed, when no candidate exists in this release, or when the
    module needs a third-party package that is not installed (named in the reason). Any other import
    error propagates: SGLang is installed and broken, which the check reports as a failure.
    """
    if importlib.util.find_spec("sglang") is None:
        raise Skip("SGLang is not installed")
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing.startswith("sglang") and (name == missing or name.startswith(missing + ".")):
                continue  # this release keeps it elsewhere
            raise Skip(f"{name} needs the Python package '{missing.split('.')[0]}', which is not installed") from exc
    raise Skip(f"this SGLang release has none of: {', '.join(names)}")


def import_installed(module: str, what: str):
    """Import ``module`` if it is installed (:class:`Skip` if not); a broken install raises (a failure)."""
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{what} is not installed")
    return importlib.import_module(module)


def call_with_known_params(func: Callable, what: str, values: dict[str, Any]) -> Any:
    """Call ``func`` with the entries of ``values`` its signature names.

    SGLang's kernel entry points gain parameters between releases (``k_scale``/``v_scale``,
    ``sm_scale`` ...); this passes what the installed release accepts and refuses clearly when the
    release wants a required parameter the check does not know.
    """
    import inspect

    params = inspect.signature(func).parameters
    kwargs = {k: v for k, v in values.items() if k in params}
    missing = [n for n, p in params.items()
               if n not in kwargs and p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise RuntimeError(f"{what} of this SGLang release wants parameters sm120kit's check does not provide: "
                           f"{', '.join(missing)}")
    return func(**kwargs)


# -- registry and runner ----------------------------------------------------------------------------------------


def all_checks() -> tuple[Check, ...]:
    from sm120kit.verify import check_flashinfer, check_sgl_kernel, check_sglang

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
                f"checks: {', '.join(c.name for c in checks)}.")
        chosen += [c for c in matched if c not in chosen]
    return chosen


def skipped_all(checks: Sequence[Check], reason: str) -> list[CheckResult]:
    return [CheckResult(c.name, c.backend, c.title, SKIPPED, f"{reason}: no kernel ran", 0.0) for c in checks]


def run_check(check: Check, ctx: CheckContext) -> CheckResult:
    torch = ctx.torch
    start = time.perf_counter()
    try:
        ctx.seed()
        cases = check.run(ctx)
        torch.cuda.synchronize()
    except Skip as exc:
        return CheckResult(check.name, check.backend, check.title, SKIPPED, str(exc), time.perf_counter() - start)
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
        return CheckResult(check.name, check.backend, check.title, SKIPPED,
                           "; ".join(c.describe() for c in skipped), seconds, cases)
    if failed:
        detail = "; ".join(c.describe() for c in failed + skipped)
        return CheckResult(check.name, check.backend, check.title, FAIL, detail, seconds, cases,
                           hint_for(failed, capability))
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
    return CheckContext(torch_module, torch_module.device("cuda", index), (int(capability[0]), int(capability[1])),
                        torch_module.cuda.get_device_name(index)), ""


def run_checks(checks: Sequence[Check], ctx: CheckContext | None, no_gpu_reason: str = "",
               progress: Callable[[int, int, str], None] | None = None) -> list[CheckResult]:
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
