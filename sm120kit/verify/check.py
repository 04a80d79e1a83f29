"""What a numeric check is: its result types, the comparison with a float32 reference, and the helpers
the checks of every backend family share.

Each :class:`Check` imports one backend and runs it on small inputs against a torch reference computed
in float32; every case states its error metric and tolerance. A check ends ``ok`` (every case within
tolerance), ``fail`` (an error, or an error over tolerance: the case says which) or ``skipped`` (why:
no GPU, not installed, the GPU lacks the feature). An import is not a test; only a comparison counts.

The checks live in one module per backend family (:mod:`.check_sglang`, :mod:`.check_sgl_kernel`,
:mod:`.check_flashinfer`), which import this module; :mod:`.checks` is the registry and the runner.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OK, FAIL, SKIPPED = "ok", "fail", "skipped"

# Why a check (or a case) was skipped: the cause names the kind, the reason says the rest.
NO_GPU = "no-gpu"  # no GPU can run kernels here
NOT_INSTALLED = "not-installed"  # the library under test is not installed
MISSING_PACKAGE = "missing-package"  # the library is there, but a Python package its import needs is not
ABSENT = "absent"  # the installed release has no such module or op (a release without the patch, an old library)
GPU_LACKS_FEATURE = "gpu-lacks-feature"  # the GPU has no unit the check needs (FP8, FP4 MMA)
SKIP_CAUSES = (NO_GPU, NOT_INSTALLED, MISSING_PACKAGE, ABSENT, GPU_LACKS_FEATURE)


class Skip(Exception):
    """Raised inside a check: it cannot run here, for the reason given. ``cause`` is one of
    :data:`SKIP_CAUSES`; ``package`` names the missing Python package when the cause is MISSING_PACKAGE."""

    def __init__(self, reason: str, *, cause: str = ABSENT, package: str | None = None) -> None:
        super().__init__(reason)
        self.cause = cause
        self.package = package


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
    skip_cause: str | None = None  # one of SKIP_CAUSES when skipped
    package: str | None = None  # the missing Python package (skip_cause MISSING_PACKAGE)

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
    skip_cause: str | None = None  # one of SKIP_CAUSES when skipped
    packages: tuple[str, ...] = ()  # the missing Python packages (skip_cause MISSING_PACKAGE)

    @property
    def worst(self) -> CaseResult | None:
        """The case with the largest error relative to its tolerance (a raising case counts as worst)."""
        ranked = [c for c in self.cases if c.error and not c.skipped] or sorted(
            (c for c in self.cases if c.tolerance and not c.skipped), key=lambda c: -(_ratio(c))
        )
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
            "skip_cause": self.skip_cause,
            "missing_packages": list(self.packages),
            "cases": [
                {
                    "label": c.label,
                    "ok": c.ok,
                    "max_error": c.max_error,
                    "tolerance": c.tolerance,
                    "metric": c.metric,
                    "error": c.error,
                    "note": c.note or None,
                    "skipped": c.skipped,
                    "skip_cause": c.skip_cause,
                    "missing_package": c.package,
                }
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
            return [
                CaseResult(
                    label,
                    False,
                    skipped=f"needs the Python package '{top}', which is not installed",
                    skip_cause=MISSING_PACKAGE,
                    package=top,
                )
            ]
        return [CaseResult(label, False, error=describe_exception(exc))]
    except Exception as exc:  # the backend failed: that is the finding
        return [CaseResult(label, False, error=describe_exception(exc))]
    return result if isinstance(result, list) else [result]


def hint_for(cases: Iterable[CaseResult], capability: tuple[int, int]) -> str:
    text = " ".join(c.error or "" for c in cases)
    if "out of resource: shared memory" in text or "OutOfResources" in text:
        return (
            "The kernel's block sizes need more shared memory per block than this GPU has "
            f"({capability[0]}.{capability[1]}); SGLang picked sizes for a larger GPU. The sm120kit patch "
            "series carries SM120 block sizes for SGLang's Triton kernels."
        )
    if "no kernel image is available" in text:
        return (
            "The library holds no machine code for this GPU; run `sm120kit verify` without --backend to see "
            "which library lacks it in the environment report."
        )
    return ""


# -- importing the things under test ----------------------------------------------------------------------------


def module_file(name: str) -> Path | None:
    """Where the module ``name`` (``sglang.kernels.ops.attention.sm120_mla``) lies in the installed package,
    found on disk without importing anything: its ``.py`` file or package folder; None when the package
    or the module is not there."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin else None
    parts = rest.split(".")
    for location in spec.submodule_search_locations or ():
        base = Path(location).joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py", base):
            if candidate.is_file() or (candidate == base and base.is_dir()):
                return candidate
    return None


def _forget_orphans(top: str) -> None:
    """After a failed import of ``top`` (or of one of its modules), drop the submodules Python left in
    ``sys.modules`` without their parent: they would make the next import of the package fail with a
    different error (KeyError in the namespace-path machinery) instead of the same ImportError."""
    if top in sys.modules:
        return
    for key in [k for k in sys.modules if k.startswith(top + ".")]:
        sys.modules.pop(key, None)


def import_sglang_module(*names: str):
    """Import the first of ``names`` that this SGLang release has (modules move between releases).

    Which candidate exists is decided on disk, before importing. :class:`Skip` when SGLang is not installed
    (cause NOT_INSTALLED), when no candidate is in this release (ABSENT), or when the module is there but its
    import needs a third-party Python package that is not installed (MISSING_PACKAGE, with the package
    named: the module is not called absent). Any other import error propagates: SGLang is installed and
    broken, which the check reports as a failure.
    """
    if importlib.util.find_spec("sglang") is None:
        raise Skip("SGLang is not installed", cause=NOT_INSTALLED)
    for name in names:
        path = module_file(name)
        if path is None:
            continue  # this release keeps it elsewhere, or lacks it
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            _forget_orphans("sglang")
            top = (exc.name or "").split(".")[0]
            if not top or top == "sglang":
                raise  # an SGLang module missing from an SGLang tree: a broken install, not a skip
            raise Skip(
                f"{name} is in this SGLang ({path}), but importing it needs the Python package "
                f"'{top}', which is not installed",
                cause=MISSING_PACKAGE,
                package=top,
            ) from exc
        except BaseException:
            _forget_orphans("sglang")
            raise
    raise Skip(f"this SGLang release has none of: {', '.join(names)}", cause=ABSENT)


def import_installed(module: str, what: str):
    """Import ``module`` if it is installed (:class:`Skip` if not); a broken install raises (a failure)."""
    if importlib.util.find_spec(module) is None:
        raise Skip(f"{what} is not installed", cause=NOT_INSTALLED)
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
    missing = [
        n
        for n, p in params.items()
        if n not in kwargs
        and p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if missing:
        raise RuntimeError(
            f"{what} of this SGLang release wants parameters sm120kit's check does not provide: {', '.join(missing)}"
        )
    return func(**kwargs)


# -- float32 references shared by the checks -------------------------------------------------------------

ATTN_TOL_BF16 = 2e-2
"""max |Δ| for bf16 attention outputs (inputs ~N(0,1)): bf16 keeps 8 bits, so outputs of magnitude up to 2
round by up to 2^-8 = 0.0039 and the P·V product adds the rounding of P."""


def ref_attention(torch, q, k, v, scale: float, causal_offset: int | None = None, mask=None):
    """Float32 attention. ``q`` [Lq, Hq, D], ``k`` [Lk, Hkv, D], ``v`` [Lk, Hkv, Dv] -> [Lq, Hq, Dv].

    Query ``i`` sits at position ``causal_offset + i`` and sees keys ``0 .. causal_offset + i`` when
    ``causal_offset`` is given; the keys ``mask[i]`` allows when a [Lq, Lk] boolean ``mask`` is given; every
    key otherwise. Query heads map to KV heads in groups (GQA/MQA).
    """
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if causal_offset is not None:
        lq, lk = q.shape[0], k.shape[0]
        pos_q = torch.arange(lq, device=q.device)[:, None] + causal_offset
        pos_k = torch.arange(lk, device=q.device)[None, :]
        scores = scores.masked_fill((pos_k > pos_q)[None], float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vf)
