"""``sm120kit tune-mla``: time the CUDA MLA kernels' build choices on this 12.x GPU and say which to set.

The kernels the ``sm120-mla-attention`` patch adds choose between code paths by build flags (``TUNABLES`` in
``sm120_attention/sm120_mla_mma.py``, which a patched SGLang takes from ``SGLANG_SM120_MLA_DEFINES``), and fp8 KV
runs the exact path unless ``SGLANG_SM120_MLA_FP8_MMA=1`` asks for the fp8-mma one. Each default was measured on
an H200 standing in for SM120 (docs/benchmarks.md), which emulates the e4m3 instruction and reads three times the
bytes an SM that an RTX PRO 6000 does. This module measures them on the card:

* :func:`plan_tune` fixes the decode cases (prefix lengths x batches x heads per GPU, for one KV dtype) and the
  candidates: the build as shipped, then one change each (:data:`CANDIDATES`);
* :func:`run_tune` runs them in the serving Python (:mod:`sm120kit.tune.mla_worker`, one process: each candidate
  is a build of the kernels, then every case through the decode call SGLang makes, checked against a float32
  reference and timed in CUDA-graph replay);
* :meth:`MlaTuneResult.pick` takes the candidate to set, if any: faster than the shipped build by :data:`MARGIN` on
  the geometric mean of the cases, slower on none by more than :data:`MARGIN`, and with errors no larger than the
  rule of its kind allows (:meth:`MlaTuneResult.verdicts`); :meth:`MlaTuneResult.env` is what to set.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import MissingDependency, ToolFailed, UsageError
from sm120kit.hardware.arch import SM12X_CAPABILITIES, is_sm12x
from sm120kit.sglang.mla_kernels import DEFINES_ENV, FP8_MMA_ENV
from sm120kit.tune.mla_worker import DONE_MARK, case_key
from sm120kit.util.report import Progress, Step
from sm120kit.util.resources import data_dir, package_path

WORKER = "sm120kit.tune.mla_worker"
KV_DTYPES = ("fp8", "bf16")
DEFAULT_LENGTHS = (8192, 32768, 131072)
DEFAULT_BATCHES = (1, 4)
MAX_PREFIX = 1 << 20
MAX_BATCH = 256
MAX_DRAFTS = 64
MARGIN = 0.02  # a candidate is set where it is 2 % faster on the geometric mean, and 2 % slower on no case
# The flags change only the order of the kernels' sums: an error past this multiple of the shipped build's (or past
# it plus half a bf16 step at 0.5) is a defect of the build, not a trade, and the candidate is not set.
EXACT_ERROR_FACTOR = 2.0
EXACT_ERROR_SLACK = 0.001
TIMEOUT_S = 3600

# (name, -D flags, fp8-mma, fewest heads it concerns) by KV dtype: the shipped build first, then the choices
# docs/benchmarks.md leaves to a card. fp8: the two-block body's split limit (512 shipped; the H100 gained up to
# 1408-token splits, the H200 lost from 1024) and the body off, which concern programs of 9-16 rows (more than 8
# heads), and the fp8-mma path (e4m3 scores: native on 12.x, emulated on the H200). bf16: the two-block body's
# limit (2048 shipped) and the body off (more than 8 heads), and the transposed bodies off.
CANDIDATES: dict[str, tuple[tuple[str, tuple[str, ...], bool, int], ...]] = {
    "fp8": (
        ("shipped", (), False, 1),
        ("DECODE16_MAX_SPLIT=2048", ("DECODE16_MAX_SPLIT=2048",), False, 9),
        ("DECODE16=0", ("DECODE16=0",), False, 9),
        ("fp8-mma path", (), True, 1),
    ),
    "bf16": (
        ("shipped", (), False, 1),
        ("DECODE16_BF16_MAX_SPLIT=8192", ("DECODE16_BF16_MAX_SPLIT=8192",), False, 9),
        ("DECODE16_BF16=0", ("DECODE16_BF16=0",), False, 9),
        ("DECODE8_BF16=0", ("DECODE8_BF16=0",), False, 1),
    ),
}


@dataclass(frozen=True)
class Candidate:
    name: str
    defines: tuple[str, ...]
    fp8_mma: bool

    def to_json(self) -> dict:
        return {"name": self.name, "defines": list(self.defines), "fp8_mma": self.fp8_mma}


@dataclass(frozen=True)
class Case:
    prefix: int
    batch: int
    heads: int
    kv: str
    drafts: int = 0  # draft tokens a request: 0 for decode, else target verify under a tree mask

    @property
    def key(self) -> str:  # the worker's name of the case
        return case_key(self.prefix, self.batch, self.heads, self.kv, self.drafts)

    @property
    def label(self) -> str:
        prefix = f"{self.prefix // 1024}k" if self.prefix % 1024 == 0 else str(self.prefix)
        return f"{prefix} b{self.batch}" + (f" d{self.drafts}" if self.drafts else "")


@dataclass
class MlaTunePlan:
    python: str
    kv: str
    heads: tuple[int, ...]
    cases: tuple[Case, ...]
    candidates: tuple[Candidate, ...]
    any_gpu: bool = False
    rep_ms: int = 200

    def spec(self) -> dict:
        return {
            "cases": [[c.prefix, c.batch, c.heads, c.kv, c.drafts] for c in self.cases],
            "candidates": [c.to_json() for c in self.candidates],
            "kv_scale": 0.5,
            "rep_ms": self.rep_ms,
            "any_gpu": self.any_gpu,
            # the capabilities the worker times on without any_gpu: the 12.x family's (hardware.arch)
            "capabilities": [list(c) for c in SM12X_CAPABILITIES],
        }

    def to_json(self) -> dict:
        return {"python": self.python, "kv": self.kv, "heads": list(self.heads), **self.spec()}


def plan_tune(
    *,
    kv: str,
    heads: Sequence[int],
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    drafts: Sequence[int] = (),
    python: str | None = None,
    any_gpu: bool = False,
) -> MlaTunePlan:
    """The cases and candidates of a run; nothing runs yet: decode at every length, batch and head count, and
    target verify with each of ``drafts`` draft tokens a request as well. UsageError for values the kernels do not
    serve."""
    if kv not in KV_DTYPES:
        raise UsageError(f"--kv-dtype {kv!r}: expected one of {', '.join(KV_DTYPES)}.")
    for what, values, low, high in (
        ("--heads", heads, 1, 128),
        ("--lengths", lengths, 1, MAX_PREFIX),
        ("--batch", batches, 1, MAX_BATCH),
        ("--drafts", drafts, 1, MAX_DRAFTS),
    ):
        bad = [v for v in values if not low <= v <= high]
        if (not values and what != "--drafts") or bad:
            raise UsageError(
                f"{what} {','.join(map(str, values)) or '(none)'}: each value must be a whole number from {low} to "
                f"{high}.",
                hint="For heads, give the attention heads one GPU runs: the model's heads over the tensor-parallel "
                "size (Kimi-K2 at TP8: 8; DeepSeek-V3 at TP8: 16).",
            )
    cases = tuple(
        Case(p, b, h, kv, d)
        for d in (0, *dict.fromkeys(drafts))
        for h in dict.fromkeys(heads)
        for b in dict.fromkeys(batches)
        for p in dict.fromkeys(lengths)
    )
    candidates = tuple(Candidate(n, d, q) for n, d, q, fewest in CANDIDATES[kv] if max(heads) >= fewest)
    return MlaTunePlan(python or sys.executable, kv, tuple(dict.fromkeys(heads)), cases, candidates, any_gpu)


# -- the result ----------------------------------------------------------------------------------------------


@dataclass
class CandidateResult:
    candidate: Candidate
    error: str | None
    cases: dict[str, dict] = field(default_factory=dict)  # case key -> {"ms", "max_abs_err"}

    def complete(self, plan: MlaTunePlan) -> bool:
        return self.error is None and all(
            c.key in self.cases and self.cases[c.key].get("ms") and self.cases[c.key].get("max_abs_err") is not None
            for c in plan.cases
        )


@dataclass
class Verdict:
    name: str
    ratios: dict[str, float]  # case key -> shipped ms / candidate ms
    geomean: float | None
    ok: bool
    why: str


@dataclass
class MlaTuneResult:
    plan: MlaTunePlan
    device: str
    capability: tuple[int, ...]
    versions: dict
    sglang: dict[str, dict]  # fp8 case key -> {"max_abs_err"} or {"error"}
    results: list[CandidateResult]
    sm120_mode: bool = False  # the worker held Triton to mma.sync (DISABLE_MMA_V3=1) on a GPU that is not 12.x

    @property
    def sm120_card(self) -> bool:
        """Whether the GPU timed is a 12.x card (not one --any-gpu let in)."""
        return len(self.capability) == 2 and is_sm12x(tuple(self.capability))

    @property
    def shipped(self) -> CandidateResult | None:
        return self.results[0] if self.results and self.results[0].candidate.name == "shipped" else None

    def _error_problem(self, r: CandidateResult) -> str | None:
        """Why ``r``'s errors rule it out, or None: a build flag may not grow the error past
        EXACT_ERROR_FACTOR times the shipped build's plus EXACT_ERROR_SLACK; the fp8-mma path (e4m3 queries) may
        not exceed SGLang's own fp8 decode kernel's error on the same inputs (the issue's rule for its default)."""
        base = self.shipped
        for case in self.plan.cases:
            err = r.cases[case.key]["max_abs_err"]
            if r.candidate.fp8_mma:
                theirs = self.sglang.get(case.key, {})
                if theirs.get("max_abs_err") is None:
                    why = theirs.get("error", "not measured")
                    return (
                        f"SGLang's fp8 kernel's error at {case.label} is unknown ({why}), so its own cannot be weighed"
                    )
                if err > theirs["max_abs_err"]:
                    return f"its error at {case.label} ({err:.4f}) is above SGLang's fp8 kernel's ({theirs['max_abs_err']:.4f})"
            else:
                limit = base.cases[case.key]["max_abs_err"] * EXACT_ERROR_FACTOR + EXACT_ERROR_SLACK
                if err > limit:
                    return f"its error at {case.label} ({err:.5f}) is above the shipped build's bound ({limit:.5f})"
        return None

    def verdicts(self) -> list[Verdict]:
        """Each candidate but the shipped build, against it."""
        base = self.shipped
        out = []
        for r in self.results[1:]:
            name = r.candidate.name
            if base is None or not base.complete(self.plan):
                out.append(Verdict(name, {}, None, False, "the shipped build was not measured on every case"))
                continue
            if not r.complete(self.plan):
                out.append(Verdict(name, {}, None, False, r.error or "not measured on every case"))
                continue
            ratios = {c.key: base.cases[c.key]["ms"] / r.cases[c.key]["ms"] for c in self.plan.cases}
            geo = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
            problem = self._error_problem(r)
            worst = min(ratios, key=ratios.get)
            if problem is not None:
                out.append(Verdict(name, ratios, geo, False, problem))
            elif geo < 1 + MARGIN:
                out.append(
                    Verdict(name, ratios, geo, False, f"{geo:.3f}x on the geometric mean, under {1 + MARGIN:.2f}x")
                )
            elif ratios[worst] < 1 - MARGIN:
                label = next(c.label for c in self.plan.cases if c.key == worst)
                out.append(
                    Verdict(name, ratios, geo, False, f"{ratios[worst]:.3f}x at {label}, slower than the shipped build")
                )
            else:
                out.append(
                    Verdict(name, ratios, geo, True, f"{geo:.3f}x on the geometric mean, {ratios[worst]:.3f}x at worst")
                )
        return out

    def pick(self) -> Verdict | None:
        """The accepted candidate with the best geometric mean, or None (the shipped build stays)."""
        accepted = [v for v in self.verdicts() if v.ok]
        return max(accepted, key=lambda v: v.geomean) if accepted else None

    def env(self) -> dict[str, str]:
        """The environment a patched SGLang needs for the pick (empty where the shipped build stays)."""
        pick = self.pick()
        if pick is None:
            return {}
        cand = next(r.candidate for r in self.results if r.candidate.name == pick.name)
        return {FP8_MMA_ENV: "1"} if cand.fp8_mma else {DEFINES_ENV: ",".join(cand.defines)}

    def to_json(self) -> dict:
        pick = self.pick()
        return {
            "plan": self.plan.to_json(),
            "device": self.device,
            "capability": list(self.capability),
            "sm120_card": self.sm120_card,
            "sm120_mode": self.sm120_mode,
            "versions": self.versions,
            "sglang_fp8_errors": self.sglang,
            "candidates": [
                {"name": r.candidate.name, **r.candidate.to_json(), "error": r.error, "cases": r.cases}
                for r in self.results
            ],
            "verdicts": [
                {"name": v.name, "ratios": v.ratios, "geomean": v.geomean, "ok": v.ok, "why": v.why}
                for v in self.verdicts()
            ],
            "pick": None if pick is None else pick.name,
            "env": self.env(),
        }


def result_from(plan: MlaTunePlan, data: dict) -> MlaTuneResult:
    """The worker's RESULT.json as a :class:`MlaTuneResult`; MissingDependency where the worker could not run at all
    (no CUDA GPU, not a 12.x card without --any-gpu, the kernels' package or Triton missing), ToolFailed where it
    could not build the cases."""
    if data.get("error") and data.get("error_kind") == "cases":
        raise ToolFailed(
            f"The MLA timing program in {plan.python} stopped before timing anything: {data['error']}.",
            hint="Fewer or shorter cases (--lengths, --batch, --heads) need less GPU memory; the inputs and the "
            "float32 references of every case are held at once.",
        )
    if data.get("error"):
        raise MissingDependency(
            f"tune-mla times the SM120 MLA kernels on a 12.x CUDA GPU in the serving Python ({plan.python}); "
            f"{data['error']}. Nothing was timed.",
            hint="Run it on the machine that will serve, with --python naming the interpreter that runs SGLang "
            "(--any-gpu times another GPU, whose answer is not an SM120 card's); --dry-run prints the plan anywhere.",
        )
    results = [
        CandidateResult(
            Candidate(c["name"], tuple(c.get("defines", ())), bool(c.get("fp8_mma"))),
            entry.get("error"),
            {case["case"]: case for case in entry.get("cases", [])},
        )
        for c, entry in zip(plan.spec()["candidates"], data.get("candidates", []))
    ]
    return MlaTuneResult(
        plan,
        data.get("device") or "?",
        tuple(data.get("capability") or ()),
        data.get("versions") or {},
        data.get("sglang") or {},
        results,
        bool(data.get("sm120_mode")),
    )


# -- the run -------------------------------------------------------------------------------------------------


def _worker_env(tmp: Path) -> dict[str, str]:
    """PYTHONPATH reaching this sm120kit (the worker) and the kernels' package it times, ahead of the shell's."""
    parts = [package_path(tmp)]
    kernels = data_dir("kernels")
    link = Path(parts[0]) / "sm120_attention"
    try:
        if not link.is_symlink():
            link.symlink_to(kernels / "sm120_attention", target_is_directory=True)
    except OSError:
        parts.append(str(kernels))
    old = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(parts + ([old] if old else []))}


def run_tune(plan: MlaTunePlan, *, progress: Progress | None = None, on_step: Step | None = None) -> MlaTuneResult:
    """Run the plan's candidates in the serving Python and read what they measured; ``progress`` hears of each
    candidate's end, ``on_step`` of the worker's other lines."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-tune-mla-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(plan.spec()))
        env = _worker_env(Path(tmp))
        # the worker sets the fp8-mma switch itself for each candidate; the shell's build flags would change
        # every candidate's build, the shipped one's included
        env[DEFINES_ENV] = ""

        done = 0
        if progress is not None:
            progress(0, len(plan.candidates), "building the shipped kernels")

        def on_line(line: str) -> None:
            nonlocal done
            if line.startswith(DONE_MARK):
                done += 1
                if progress is not None:
                    progress(done, len(plan.candidates), line[len(DONE_MARK) :])
            elif on_step is not None:
                on_step(line)

        proc = runner.run(
            [plan.python, "-m", WORKER, str(spec), str(out)],
            check=False,
            timeout=TIMEOUT_S,
            extra_env=env,
            cwd=tmp,
            on_line=on_line,
            what="MLA kernel timing",
        )
        if proc.returncode != 0 or not out.is_file():
            raise ToolFailed(
                f"The MLA timing program stopped with exit code {proc.returncode} before writing its results.",
                argv=list(proc.argv),
                returncode=proc.returncode,
                output_tail=runner._tail(proc.stdout),
                hint="Run with -v to see the command; the output above shows where it stopped.",
            )
        return result_from(plan, json.loads(out.read_text()))
