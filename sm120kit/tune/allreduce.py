"""``sm120kit bench-allreduce``: time a model's decode all-reduces on this machine's GPUs and pick the fastest.

With tensor parallelism each decode step makes two all-reduces a layer of ``tokens x hidden`` bf16 values:
small and latency-bound. Which NCCL protocol, algorithm, channel count and thread count serve them fastest
depends on the box (NVLink or PCIe, switches, NUMA split), and SGLang may serve them itself (its custom
all-reduce; FlashInfer's PCIe-IPC all-reduce from 0.5.21). This module plans and runs the measurement:

* :func:`plan_bench` asks the serving Python what it sees (:mod:`sm120kit.tune.allreduce_worker` ``probe``)
  and fixes the sizes, the base environment and the variants; nothing runs on a GPU yet;
* :func:`run_bench` times the variants, each in fresh processes (one per GPU) with its own environment
  (``allreduce_worker measure`` through :func:`sm120kit.runner.run`), and picks the fastest per size and
  the NCCL setting for a recipe (the lowest geometric mean of the medians over the sizes).

The search is staged so that it ends in about two minutes on two GPUs: NCCL's defaults and each protocol;
then the algorithms on the best so far; then the channel cap; then the thread count and, over PCIe, the
peer-to-peer level; then SGLang's own all-reduces where the environment has them. A variant whose quick
look (the first samples) is more than :data:`DROP_FACTOR` times the best median at every size stops there.
``exhaustive`` runs every combination of the settings afterwards, to check the staged pick against it.
``NCCL_NVLS_ENABLE=0`` is set in every process.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sm120kit import __version__, runner
from sm120kit.errors import MissingDependency, Sm120kitError, UsageError
from sm120kit.hardware.topology import probe_topology
from sm120kit.util.report import Progress, Step, tell
from sm120kit.util.resources import package_path

WORKER = "sm120kit.tune.allreduce_worker"
ALWAYS = {"NCCL_NVLS_ENABLE": "0"}  # NVLink SHARP multicast stays off in every process
# The settings the search varies, with the values tried (NCCL's own default is always a candidate too).
# NCCL_BUFFSIZE is not among them: it sizes the Simple protocol's buffers, and a decode all-reduce (at most
# a few hundred KiB) fits one buffer of the default 4 MiB.
PROTOS = ("LL", "LL128", "Simple")
ALGOS = ("Ring", "Tree")
CHANNELS = ("2", "16")
THREADS = ("256",)
P2P_LEVELS = ("SYS",)
KNOBS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS", "NCCL_P2P_LEVEL")
DROP_FACTOR = 2.0
DEFAULT_TOKENS = (1, 8, 64)
DEFAULT_BUDGET_S = 120.0
NCCL_ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
KNOB_WHY = {
    "NCCL_PROTO": "Protocol {value}: of NCCL's protocols (LL, LL128, Simple) and its own choice, the lowest decode "
    "all-reduce times on the measured machine.",
    "NCCL_ALGO": "Algorithm {value}: of Ring, Tree and NCCL's own choice, the lowest decode all-reduce times on the "
    "measured machine.",
    "NCCL_MAX_NCHANNELS": "At most {value} channels: faster for decode all-reduces than NCCL's own channel count on "
    "the measured machine, and fewer SMs taken from the model's kernels.",
    "NCCL_NTHREADS": "{value} threads per NCCL block: faster for decode all-reduces than NCCL's default on the "
    "measured machine.",
    "NCCL_P2P_LEVEL": "Peer-to-peer copies up to path level {value}: faster for decode all-reduces than NCCL's "
    "default level on the measured machine.",
}


@dataclass(frozen=True)
class AllReduceVariant:
    """One way to all-reduce: an implementation and the NCCL variables set for it."""

    name: str
    impl: str  # "nccl" | "sglang-custom" | "pcie-ipc"
    env: tuple[tuple[str, str], ...] = ()
    stage: str = ""

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def to_json(self) -> dict:
        return {"name": self.name, "impl": self.impl, "env": self.env_dict(), "stage": self.stage}


def nccl_variant(settings: Mapping[str, str], stage: str) -> AllReduceVariant:
    """The NCCL variant setting ``settings`` (knobs not named keep NCCL's default)."""
    env = tuple((k, settings[k]) for k in KNOBS if settings.get(k))
    name = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in env) or "NCCL defaults"
    return AllReduceVariant(name, "nccl", env, stage)


@dataclass(frozen=True)
class BenchPlan:
    python: str
    world: int
    gpus: tuple[dict, ...]  # what the serving Python's torch sees: index, name, capability
    probe: dict  # the worker's probe result
    hidden: int
    tokens: tuple[int, ...]
    dtype: str
    base_env: dict[str, str]  # the environment every variant starts from (sweep knobs removed, ALWAYS added)
    removed_env: dict[str, str]  # NCCL settings of this shell the sweep controls instead
    peer_disabled: bool  # NCCL_P2P_DISABLE in the base environment: a stand-in for GPUs without peer access
    extra: tuple[AllReduceVariant, ...]  # the recipe's current NCCL setting, SGLang's own all-reduces
    skipped: tuple[tuple[str, str], ...]  # (variant, why it is not run)
    problem: str | None  # why nothing can run (fewer than two GPUs), None when it can
    topology: dict | None = None
    exhaustive: bool = False
    budget_s: float = DEFAULT_BUDGET_S
    backend: str = "nccl"
    device: str = "cuda"
    warmup: int = 20
    samples: int = 100
    inner: int = 20
    quick_samples: int = 10
    variant_timeout_s: float = 180.0
    notes: tuple[str, ...] = ()

    def sizes_bytes(self) -> dict[int, int]:
        element = 4 if self.dtype == "float32" else 2
        return {t: t * self.hidden * element for t in self.tokens}

    def spec(self, variant: AllReduceVariant, thresholds: Mapping[int, float] | None) -> dict:
        """The worker's SPEC.json for one variant."""
        quick = None
        if thresholds:
            quick = {"samples": self.quick_samples, "thresholds_us": {str(t): v for t, v in thresholds.items()}}
        return {
            "impl": variant.impl,
            "backend": self.backend,
            "device": self.device,
            "world": self.world,
            "hidden": self.hidden,
            "tokens": list(self.tokens),
            "dtype": self.dtype,
            "warmup": self.warmup,
            "samples": self.samples,
            "inner": self.inner,
            "quick": quick,
            "graph": True,
            "timeout": self.variant_timeout_s,
        }

    def to_json(self) -> dict:
        return {
            "python": self.python,
            "world": self.world,
            "gpus": list(self.gpus),
            "hidden": self.hidden,
            "tokens": list(self.tokens),
            "bytes": {str(k): v for k, v in self.sizes_bytes().items()},
            "dtype": self.dtype,
            "base_env": self.base_env,
            "removed_env": self.removed_env,
            "peer_disabled": self.peer_disabled,
            "extra": [v.to_json() for v in self.extra],
            "skipped": [{"variant": v, "why": w} for v, w in self.skipped],
            "problem": self.problem,
            "topology": self.topology,
            "exhaustive": self.exhaustive,
            "budget_s": self.budget_s,
            "backend": self.backend,
            "device": self.device,
            "iterations": {
                "warmup": self.warmup,
                "samples": self.samples,
                "per_sample": self.inner,
                "quick_samples": self.quick_samples,
                "drop_factor": DROP_FACTOR,
            },
            "versions": {k: self.probe.get(k) for k in ("torch", "cuda", "nccl", "sglang", "flashinfer")},
            "notes": list(self.notes),
        }


# -- the serving Python --------------------------------------------------------------------------------------


def _worker_env(tmp: Path) -> dict[str, str]:
    """PYTHONPATH reaching this sm120kit (the worker module) and nothing else of its environment, ahead of what
    the shell has."""
    old = os.environ.get("PYTHONPATH")
    here = package_path(tmp)
    return {"PYTHONPATH": here + (os.pathsep + old if old else "")}


def probe(python: str, timeout: float = 300) -> dict:
    """What ``python`` sees: torch, CUDA, NCCL, the GPUs and peer access, SGLang's and FlashInfer's
    all-reduces (the worker's ``probe``)."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-allreduce-") as tmp:
        out = Path(tmp) / "probe.json"
        result = runner.run(
            [python, "-m", WORKER, "probe", str(out)],
            check=False,
            timeout=timeout,
            extra_env={**ALWAYS, **_worker_env(Path(tmp))},
            cwd=tmp,
            what="all-reduce probe",
        )
        if not out.is_file():
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"the probe in {python} wrote no result (exit {result.returncode}: {tail[0]})", "gpus": []}
        return json.loads(out.read_text(encoding="utf-8"))


def _true(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "y")


def plan_bench(
    *,
    hidden: int,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    python: str | None = None,
    world: int | None = None,
    recipe_env: Mapping[str, str] | None = None,
    exhaustive: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    sglang: bool = True,
    dtype: str = "bfloat16",
    backend: str = "nccl",
    device: str = "cuda",
    environ: Mapping[str, str] | None = None,
    topology: dict | None = None,
    probe_result: dict | None = None,
    **iterations,
) -> BenchPlan:
    """Everything the run will do, decided without running it (the serving Python is asked what it sees).
    ``backend="gloo", device="cpu"`` measures on CPU processes instead (the tests)."""
    if hidden < 1:
        raise UsageError(f"--hidden must be a positive number of elements (got {hidden}).")
    tokens = tuple(sorted(set(int(t) for t in tokens)))
    if not tokens or tokens[0] < 1:
        raise UsageError("--tokens must list positive token counts, e.g. --tokens 1,8,64.")
    if budget_s <= 0:
        raise UsageError(f"--budget must be positive (got {budget_s}).")
    python = python or sys.executable
    environ = dict(os.environ if environ is None else environ)
    info = probe_result if probe_result is not None else probe(python)
    if topology is None and device == "cuda":
        found, why = probe_topology()
        topology = found.to_json() if found else {"summary": None, "note": why, "all_nvlink": False}
    gpus = tuple(info.get("gpus") or ())
    problem = None
    if device == "cuda":
        if info.get("error"):
            problem = f"the probe failed: {info['error']}"
        elif len(gpus) < 2:
            why = info.get("why_no_gpu") or f"torch sees {len(gpus)} CUDA GPU(s)"
            problem = f"{len(gpus)} CUDA GPU(s) visible to {python} ({why})"
        available = len(gpus)
    else:
        available = world or 2
    world = world or available
    if problem is None and world < 2:
        problem = f"--gpus {world}: an all-reduce needs at least two GPUs"
    if problem is None and world > available:
        raise UsageError(f"--gpus {world}: only {available} GPU(s) are visible to {python}.")
    removed = {k: v for k, v in environ.items() if k in KNOBS}
    base = {k: v for k, v in environ.items() if k not in KNOBS}
    base.update(ALWAYS)
    peer_disabled = _true(base.get("NCCL_P2P_DISABLE"))
    extra: list[AllReduceVariant] = []
    skipped: list[tuple[str, str]] = []
    recipe_nccl = {k: v for k, v in (recipe_env or {}).items() if k.startswith("NCCL_")}
    if recipe_nccl:
        extra.append(
            AllReduceVariant("the recipe's NCCL settings", "nccl", tuple(sorted(recipe_nccl.items())), "recipe")
        )
    for impl, label, why in (
        ("sglang-custom", "SGLang's custom all-reduce", info.get("sglang_custom_ar")),
        ("pcie-ipc", "FlashInfer's PCIe-IPC all-reduce", info.get("pcie_ipc")),
    ):
        if not sglang:
            skipped.append((label, "--no-sglang"))
        elif peer_disabled:
            skipped.append(
                (
                    label,
                    "it needs peer access between the GPUs, and NCCL_P2P_DISABLE is set (the "
                    "stand-in for a box without peer access)",
                )
            )
        elif why:
            skipped.append((label, why))
        elif impl == "pcie-ipc" and (world not in (2, 4, 8) or dtype not in ("bfloat16", "float16")):
            skipped.append((label, f"it serves 2, 4 or 8 ranks and bf16/fp16 (here {world} ranks, {dtype})"))
        else:
            extra.append(AllReduceVariant(label, impl, (), "sglang"))
    notes = []
    if removed:
        notes.append(
            "Settings of this shell the search varies itself (not passed on): "
            + ", ".join(f"{k}={v}" for k, v in sorted(removed.items()))
            + "."
        )
    if peer_disabled:
        notes.append(
            "NCCL_P2P_DISABLE is set: NCCL copies through host memory, as on a PCIe box without peer "
            "access between the GPUs (a stand-in, labelled as such)."
        )
    return BenchPlan(
        python=python,
        world=world,
        gpus=gpus,
        probe=info,
        hidden=hidden,
        tokens=tokens,
        dtype=dtype,
        base_env=base,
        removed_env=removed,
        peer_disabled=peer_disabled,
        extra=tuple(extra),
        skipped=tuple(skipped),
        problem=problem,
        topology=topology,
        exhaustive=exhaustive,
        budget_s=budget_s,
        backend=backend,
        device=device,
        notes=tuple(notes),
        **iterations,
    )


def refuse_without_gpus(plan: BenchPlan) -> None:
    if plan.problem is not None:
        raise MissingDependency(
            f"bench-allreduce times all-reduces between two or more CUDA GPUs, one process per GPU; "
            f"{plan.problem}. Nothing was run.",
            hint="Run it on the multi-GPU machine that will serve (with --python naming an interpreter whose "
            "torch sees the GPUs); --dry-run prints the plan anywhere.",
        )


# -- one variant ----------------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    variant: AllReduceVariant
    status: str  # "measured" | "dropped" | "failed"
    sizes: list[dict] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    timing: str | None = None
    impl_info: dict = field(default_factory=dict)

    def p50(self, tokens: int) -> float | None:
        for entry in self.sizes:
            if entry.get("tokens") == tokens and entry.get("served") and entry.get("p50_us") is not None:
                return float(entry["p50_us"])
        return None

    def geomean(self, tokens: Sequence[int]) -> float | None:
        """The geometric mean of the medians over ``tokens``; None unless measured at every one."""
        values = [self.p50(t) for t in tokens]
        if self.status != "measured" or any(v is None or v <= 0 for v in values):
            return None
        return math.exp(sum(math.log(v) for v in values) / len(values))

    def to_json(self) -> dict:
        return {
            "variant": self.variant.to_json(),
            "status": self.status,
            "sizes": self.sizes,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "timing": self.timing,
            "impl_info": self.impl_info,
        }


def run_variant(
    plan: BenchPlan, variant: AllReduceVariant, thresholds: Mapping[int, float] | None = None
) -> VariantResult:
    """Time ``variant`` in fresh processes with its own environment (the worker's ``measure``)."""
    start = time.monotonic()
    env = dict(plan.base_env)
    env.update(variant.env_dict())
    with tempfile.TemporaryDirectory(prefix="sm120kit-allreduce-") as tmp:
        env.update(_worker_env(Path(tmp)))
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(plan.spec(variant, thresholds)), encoding="utf-8")
        try:
            proc = runner.run(
                [plan.python, "-m", WORKER, "measure", str(spec_path), str(out)],
                env=env,
                cwd=tmp,
                check=False,
                timeout=plan.variant_timeout_s,
                what=f"all-reduce variant {variant.name}",
            )
        except Sm120kitError as exc:
            return VariantResult(variant, "failed", error=exc.message, seconds=time.monotonic() - start)
        if not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:] or ["no output"]
            return VariantResult(
                variant, "failed", error=f"exit {proc.returncode}: {' | '.join(tail)}", seconds=time.monotonic() - start
            )
        data = json.loads(out.read_text(encoding="utf-8"))
    status = "failed" if data.get("error") else "dropped" if data.get("dropped") else "measured"
    bad = [e for e in data.get("sizes", []) if e.get("check") not in (None, "ok")]
    error = data.get("error")
    if bad and not error:
        status, error = "failed", f"wrong sum at {bad[0]['tokens']} tokens: {bad[0]['check']}"
    return VariantResult(
        variant,
        status,
        data.get("sizes", []),
        error,
        time.monotonic() - start,
        data.get("timing"),
        data.get("impl_info") or {},
    )


# -- the search ---------------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    plan: BenchPlan
    results: list[VariantResult]
    seconds: float
    stopped_at_budget: bool
    exhaustive: dict | None = None  # the exhaustive sweep's best and how the staged pick compares
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d", time.gmtime()))

    def measured(self, impl: str | None = None) -> list[VariantResult]:
        return [r for r in self.results if r.status == "measured" and (impl is None or r.variant.impl == impl)]

    def best_per_size(self) -> dict[int, tuple[VariantResult, float]]:
        best: dict[int, tuple[VariantResult, float]] = {}
        for r in self.measured():
            for t in self.plan.tokens:
                value = r.p50(t)
                if value is not None and (t not in best or value < best[t][1]):
                    best[t] = (r, value)
        return best

    def pick(self) -> VariantResult | None:
        """The NCCL variant for a recipe: the lowest geometric mean of the medians over the sizes."""
        scored = [
            (r.geomean(self.plan.tokens), i, r)
            for i, r in enumerate(self.measured("nccl"))
            if r.geomean(self.plan.tokens) is not None
        ]
        return min(scored)[2] if scored else None

    def recipe_settings(self) -> dict[str, str | None]:
        """What a recipe's environment should hold for the knobs the search varies: the pick's value, or None
        (NCCL's own default measured fastest: the setting goes)."""
        pick = self.pick()
        if pick is None:
            return {}
        chosen = pick.variant.env_dict()
        return {k: chosen.get(k) for k in KNOBS}

    def recipe_notes(self) -> dict[str, dict]:
        """A recipe note for each setting :meth:`recipe_settings` sets: why, sources, and where it was measured."""
        provenance = self.provenance()
        return {
            k: {"why": KNOB_WHY[k].format(value=v), "sources": [NCCL_ENV_DOC], "measured": provenance}
            for k, v in self.recipe_settings().items()
            if v is not None
        }

    def machine(self) -> str:
        names = [g.get("name", "?") for g in self.plan.gpus[: self.plan.world]] or [f"{self.plan.world} CPU ranks"]
        counted = {n: names.count(n) for n in names}
        text = ", ".join(f"{c}x {n}" for n, c in counted.items())
        if self.plan.topology and self.plan.topology.get("summary"):
            text += f" ({self.plan.topology['summary']})"
        return text

    def provenance(self) -> str:
        """One line for a recipe note: where, when, with what, and the medians of the pick."""
        pick = self.pick()
        probe = self.plan.probe
        versions = ", ".join(
            f"{label} {probe.get(key)}"
            for key, label in (("nccl", "NCCL"), ("torch", "torch"), ("sglang", "SGLang"), ("flashinfer", "FlashInfer"))
            if probe.get(key)
        )
        medians = ", ".join(f"{pick.p50(t):.1f}" for t in self.plan.tokens) if pick else "-"
        base = ", ".join(f"{k}={v}" for k, v in sorted(self.plan.base_env.items()) if k.startswith("NCCL_"))
        sizes = ", ".join(map(str, self.plan.tokens))
        return (
            f"measured by sm120kit {__version__} bench-allreduce on {self.date} on {self.machine()}; "
            f"{versions}; decode all-reduces of {sizes} tokens x {self.plan.hidden} "
            f"({self.plan.dtype}): p50 {medians} us with '{pick.variant.name if pick else '-'}', the lowest "
            f"geometric mean of {len(self.measured('nccl'))} NCCL settings timed (base environment: {base})"
        )

    def to_json(self) -> dict:
        pick = self.pick()
        return {
            "plan": self.plan.to_json(),
            "results": [r.to_json() for r in self.results],
            "best_per_size": [
                {
                    "tokens": t,
                    "bytes": self.plan.sizes_bytes()[t],
                    "variant": r.variant.name,
                    "impl": r.variant.impl,
                    "p50_us": v,
                }
                for t, (r, v) in sorted(self.best_per_size().items())
            ],
            "pick": None
            if pick is None
            else {"variant": pick.variant.to_json(), "geomean_p50_us": pick.geomean(self.plan.tokens)},
            "recipe_settings": self.recipe_settings(),
            "provenance": self.provenance() if pick else None,
            "seconds": round(self.seconds, 1),
            "stopped_at_budget": self.stopped_at_budget,
            "exhaustive": self.exhaustive,
            "date": self.date,
        }


Runner = Callable[[BenchPlan, AllReduceVariant, "Mapping[int, float] | None"], VariantResult]


def exhaustive_variants() -> list[AllReduceVariant]:
    """Every combination of the settings the search knows (NCCL's default included for each)."""
    out = []
    for proto, algo, channels, threads, level in itertools.product(
        (None,) + PROTOS, (None,) + ALGOS, (None,) + CHANNELS, (None,) + THREADS, (None,) + P2P_LEVELS
    ):
        settings = {
            "NCCL_PROTO": proto,
            "NCCL_ALGO": algo,
            "NCCL_MAX_NCHANNELS": channels,
            "NCCL_NTHREADS": threads,
            "NCCL_P2P_LEVEL": level,
        }
        out.append(nccl_variant({k: v for k, v in settings.items() if v}, "exhaustive"))
    return out


def run_bench(
    plan: BenchPlan, *, progress: Progress | None = None, on_step: Step | None = None, run: Runner | None = None
) -> BenchResult:
    """The staged search (and, with ``plan.exhaustive``, the full sweep after it)."""
    refuse_without_gpus(plan)
    run = run or run_variant
    start = time.monotonic()
    results: list[VariantResult] = []
    done: dict[tuple, VariantResult] = {}
    over_p2p = not plan.peer_disabled and not (plan.topology or {}).get("all_nvlink", False)
    planned = 4 + 2 + len(CHANNELS) + len(THREADS) + (len(P2P_LEVELS) if over_p2p else 0) + len(plan.extra)
    state = {"stopped": False}

    def best_by_size() -> dict[int, float]:
        best: dict[int, float] = {}
        for r in results:
            if r.status != "measured":
                continue
            for t in plan.tokens:
                v = r.p50(t)
                if v is not None and v < best.get(t, math.inf):
                    best[t] = v
        return best

    def time_it(variant: AllReduceVariant, quick: bool = True) -> VariantResult | None:
        key = (variant.impl, variant.env)
        if key in done:
            return done[key]
        if results and time.monotonic() - start > plan.budget_s and variant.stage != "exhaustive":
            state["stopped"] = True
            return None
        best = best_by_size()
        thresholds = {t: DROP_FACTOR * v for t, v in best.items()} if quick and len(best) == len(plan.tokens) else None
        tell(on_step, f"timing {variant.name} ...")
        result = run(plan, variant, thresholds)
        results.append(result)
        done[key] = result
        if progress:
            progress(len(results), max(planned, len(results)), variant.name)
        return result

    def best_nccl() -> dict[str, str]:
        scored = [
            (r.geomean(plan.tokens), i, r)
            for i, r in enumerate(results)
            if r.variant.impl == "nccl" and r.variant.stage != "recipe" and r.geomean(plan.tokens)
        ]
        return min(scored)[2].variant.env_dict() if scored else {}

    time_it(nccl_variant({}, "defaults"))
    for proto in PROTOS:
        time_it(nccl_variant({"NCCL_PROTO": proto}, "protocol"))
    for variant in plan.extra:
        time_it(variant)
    for algo in ALGOS:
        time_it(nccl_variant({**best_nccl(), "NCCL_ALGO": algo}, "algorithm"))
    chosen = best_nccl()
    for channels in CHANNELS:
        time_it(nccl_variant({**chosen, "NCCL_MAX_NCHANNELS": channels}, "channels"))
    chosen = best_nccl()
    for threads in THREADS:
        time_it(nccl_variant({**chosen, "NCCL_NTHREADS": threads}, "threads"))
    if over_p2p:
        for level in P2P_LEVELS:
            time_it(nccl_variant({**chosen, "NCCL_P2P_LEVEL": level}, "p2p-level"))
    staged_seconds = time.monotonic() - start
    staged = BenchResult(plan, list(results), staged_seconds, state["stopped"])
    summary = None
    if plan.exhaustive:
        full = [v for v in exhaustive_variants() if over_p2p or not dict(v.env).get("NCCL_P2P_LEVEL")]
        planned = len(results) + sum(1 for v in full if (v.impl, v.env) not in done)
        for variant in full:
            if (variant.impl, variant.env) not in done:
                time_it(replace(variant, stage="exhaustive"), quick=False)
        swept = [done[(v.impl, v.env)] for v in full]
        scored = [(r.geomean(plan.tokens), i, r) for i, r in enumerate(swept) if r.geomean(plan.tokens)]
        best = min(scored)[2] if scored else None
        pick = staged.pick()
        ratio = (pick.geomean(plan.tokens) / best.geomean(plan.tokens)) if pick and best else None
        summary = {
            "variants": len(full),
            "best": best.variant.to_json() if best else None,
            "best_geomean_p50_us": best.geomean(plan.tokens) if best else None,
            "staged_pick": pick.variant.to_json() if pick else None,
            "staged_geomean_p50_us": pick.geomean(plan.tokens) if pick else None,
            "staged_over_best": ratio,
            "within_5_percent": ratio is not None and ratio <= 1.05,
            "staged_seconds": round(staged_seconds, 1),
            "staged_variants": len(staged.results),
        }
    return BenchResult(plan, results, time.monotonic() - start, state["stopped"], summary)
