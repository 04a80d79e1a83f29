"""``sm120kit tune-moe``: measured fused-MoE configs for the 12.x GPU present, from SGLang's own tuning script.

The ``sm120-moe-configs`` patch ships config files whose values are derived by a rule
(``scripts/gen_moe_configs.py``), under the real device names. This module plans and runs SGLang's tuning
script (``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py``, which lives in the SGLang
repository, not in the wheel) on the GPU present, with a search space restricted to the configs whose
pipelined Triton tiles fit the shared memory an SM120 block may use (``hardware.arch``), and writes its output where the series
puts its config files: ``configs/triton_3_3_1/`` beside ``fused_moe_triton_config.py``, under the file
name SGLang's ``get_config_file_name()`` builds. A sidecar ``<file>.provenance`` (not ``*.json``: SGLang and
the audit read every ``*.json`` there as a config table, whose keys must all be batch sizes) says the
values are measured, on which GPU, with which script and search space.

Plan first (:func:`plan_tuning`, no writes; ``--dry-run`` prints it), then :func:`run_tuning`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import __version__, runner
from sm120kit.errors import CheckFailed, IOFailure, MissingDependency, UsageError
from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK, is_sm12x
from sm120kit.patching.series import Series, load_series
from sm120kit.sglang.target import Target
from sm120kit.util.atomicfile import write_atomic

PATCH_ID = "sm120-moe-configs"
SCRIPT_IN_REPO = "benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py"
# The folder the series writes its config files into: the one every release reaches whatever Triton is
# installed (see the patch's description). Used only when the series names no config file for the release.
TRITON_FOLDER = "triton_3_3_1"
# Where fused_moe_triton_config.py lives: from 0.5.11 / before (the patch's markers name the same files).
CONFIG_MODULES = (
    "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
    "sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py",
)
PROVENANCE_SUFFIX = ".provenance"

# --dtype choices of the tuning script; "auto" tunes the model's own dtype (bf16 or fp16 here).
DTYPES = ("auto", "fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")

# SGLang's CUDA search space (common_utils.get_configs_compute_bound, every release 0.5.2 to 0.5.23):
# the full product of these values, 1920 configs.
SEARCH_GRID = {
    "num_stages": (2, 3, 4, 5),
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_K": (64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "num_warps": (4, 8),
    "GROUP_SIZE_M": (1, 16, 32, 64),
}
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

SHARED_MEMORY_FORMULA = "(num_stages - 1) * BLOCK_SIZE_K * (BLOCK_SIZE_M + BLOCK_SIZE_N) * element_bytes"


# -- the shared-memory bound (the same estimate as the sm120-moe-configs clamp) ------------------------------


def element_bytes(dtype: str | None) -> int:
    """Bytes per element of the A tile for SGLang's config dtype string, as the clamp counts them:
    1 for fp8_w8a8 / int8_w8a8, 4 for float32, else 2."""
    return 1 if dtype in ("fp8_w8a8", "int8_w8a8") else 4 if dtype == "float32" else 2


def pipelined_shared_memory(config: dict, dtype: str | None) -> int:
    """Shared memory of the fused-MoE kernel's pipelined A and B tiles: Triton keeps ``num_stages - 1``
    copies (the clamp's ``shared_memory()``; equal to the compiled kernels' ``metadata.shared`` for
    sm_120 on every config SGLang ships tuned on SM120 cards)."""
    copies = max(config.get("num_stages", 3) - 1, 1)
    return copies * config["BLOCK_SIZE_K"] * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * element_bytes(dtype)


def config_dtype(dtype: str) -> str | None:
    """The dtype string SGLang's file names and clamp use (``get_config_dtype_str``): None for bf16/fp16."""
    return None if dtype == "auto" else dtype


def search_space(
    dtype: str, block_shape: tuple[int, int] | None, limit: int = SM120_SHARED_MEMORY_PER_BLOCK
) -> tuple[list[dict], int]:
    """(configs of SGLang's search space that fit ``limit``, number left out for shared memory). Configs
    whose BLOCK_SIZE_K does not divide the quantization block are left to the script, which drops them."""
    kept, over = [], 0
    g = SEARCH_GRID
    for stages in g["num_stages"]:
        for block_m in g["BLOCK_SIZE_M"]:
            for block_k in g["BLOCK_SIZE_K"]:
                for block_n in g["BLOCK_SIZE_N"]:
                    for warps in g["num_warps"]:
                        for group in g["GROUP_SIZE_M"]:
                            config = {
                                "BLOCK_SIZE_M": block_m,
                                "BLOCK_SIZE_N": block_n,
                                "BLOCK_SIZE_K": block_k,
                                "GROUP_SIZE_M": group,
                                "num_warps": warps,
                                "num_stages": stages,
                            }
                            if pipelined_shared_memory(config, config_dtype(dtype)) > limit:
                                over += 1
                            else:
                                kept.append(config)
    if block_shape:
        kept = [c for c in kept if block_shape[1] % c["BLOCK_SIZE_K"] == 0]
    return kept, over


# -- names and places ------------------------------------------------------------------------------------------


def config_file_name(
    experts: int, n: int, device_name: str, dtype: str, block_shape: tuple[int, int] | None, per_channel_quant: bool
) -> str:
    """The name SGLang's ``get_config_file_name()`` gives the up-projection config file."""
    name = f"E={experts},N={n},device_name={device_name.replace(' ', '_')}"
    if config_dtype(dtype):
        name += f",dtype={config_dtype(dtype)}"
    if block_shape and all(block_shape):
        name += f",block_shape={list(block_shape)}"
    if per_channel_quant:
        name += ",per_channel_quant=True"
    return name + ".json"


def configs_folder(target: Target, series: Series | None = None) -> str:
    """The folder, relative to the tree's root (``sglang/...``), where the series puts its config files for
    this release: the folder of the config files in the patch's variant, else ``configs/triton_3_3_1``
    beside the release's ``fused_moe_triton_config.py``."""
    try:
        series = series or load_series()
        patch = series.get(PATCH_ID)
    except Exception:  # a broken series still leaves the fixed layout below
        patch = None
    variant = patch.variant_for(target.version) if patch and target.version else None
    if variant is not None:
        for path in variant.paths:
            if path.endswith(".json") and f"/configs/{TRITON_FOLDER}/" in path:
                return path.rsplit("/", 1)[0]
    for module in CONFIG_MODULES:
        if (target.root / module).is_file():
            return module.rsplit("/", 1)[0] + f"/configs/{TRITON_FOLDER}"
    raise UsageError(
        f"{target.package_dir} has no fused_moe_triton_config.py (looked for {', '.join(CONFIG_MODULES)}), "
        "so it has no fused-MoE config folder to write into.",
        hint="Point PATH at an SGLang release with the Triton fused-MoE runner (0.5.2 or newer).",
    )


def find_script(given: Path | None, target: Target) -> Path:
    """The tuning script: ``given`` (the file, or an SGLang clone holding it), else the target clone's own."""
    candidates: list[Path] = []
    if given is not None:
        given = given.expanduser()
        candidates = [given] if given.is_file() else [given / SCRIPT_IN_REPO, given.parent / SCRIPT_IN_REPO]
    elif target.repo_root is not None:
        candidates = [target.repo_root / SCRIPT_IN_REPO]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    where = ", ".join(str(c) for c in candidates) or "nowhere (no --script, and the target is not a git clone)"
    raise UsageError(
        f"SGLang's fused-MoE tuning script was not found; looked at {where}.",
        hint=f"It is in the SGLang repository, not in the wheel: pass --script with a clone of "
        f"the release you run (git clone https://github.com/sgl-project/sglang) or the "
        f"path of its {SCRIPT_IN_REPO}.",
    )


# -- the GPU present ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetGpu:
    """The first CUDA GPU that the tuning target's Python (its torch) sees, and how many there are."""

    name: str
    capability: tuple[int, int]
    count: int = 1

    @property
    def label(self) -> str:
        return f"{self.name} ({self.capability[0]}.{self.capability[1]})"

    def to_json(self) -> dict:
        return {"name": self.name, "capability": f"{self.capability[0]}.{self.capability[1]}", "count": self.count}


_PROBE = r"""
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": "torch cannot be imported (%s: %s)" % (type(exc).__name__, exc)})); raise SystemExit
if torch.version.cuda is None or not torch.cuda.is_available():
    why = "torch %s is not a CUDA build" % torch.__version__ if torch.version.cuda is None else \
        "torch.cuda.is_available() is False"
    print(json.dumps({"error": why})); raise SystemExit
print(json.dumps({"name": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
                  "count": torch.cuda.device_count()}))
"""


def probe_gpu(python: str) -> tuple[TargetGpu | None, str | None]:
    """(the first CUDA GPU ``python``'s torch sees, None) or (None, why there is none)."""
    result = runner.run([python, "-c", _PROBE], check=False, timeout=300, what="GPU probe")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not result.ok or not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"the GPU probe with {python} failed (exit {result.returncode}: {tail[0]})"
    data = json.loads(lines[-1])
    if "error" in data:
        return None, data["error"]
    return TargetGpu(data["name"], tuple(data["capability"]), int(data.get("count", 1))), None


# -- the plan -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MoeShape:
    experts: int  # E as the file name carries it (routed experts per GPU, plus a fused shared expert if any)
    intermediate_size: int  # the model's MoE intermediate size (all GPUs)
    topk: int
    hidden_size: int | None
    tp: int = 1
    dtype: str = "auto"
    block_shape: tuple[int, int] | None = None
    per_channel_quant: bool = False

    @property
    def n(self) -> int:
        """N of the file name: the intermediate size per GPU (halved again for int4_w4a16, as SGLang does)."""
        n = self.intermediate_size // self.tp
        return n // 2 if self.dtype == "int4_w4a16" else n

    def to_json(self) -> dict:
        return {
            "experts": self.experts,
            "intermediate_size": self.intermediate_size,
            "n": self.n,
            "topk": self.topk,
            "hidden_size": self.hidden_size,
            "tp": self.tp,
            "dtype": self.dtype,
            "config_dtype": config_dtype(self.dtype),
            "block_shape": list(self.block_shape) if self.block_shape else None,
            "per_channel_quant": self.per_channel_quant,
        }


@dataclass(frozen=True, kw_only=True)
class TunePlan:
    target: Target
    script: Path
    python: str
    shape: MoeShape
    model: str | None  # --model as given; None: sm120kit writes a Mixtral-style config.json with the shape
    batch_sizes: tuple[int, ...]
    gpu: TargetGpu | None
    gpu_problem: str | None  # why the run is refused (no GPU, not 12.x); None when it can run
    search_space_file: bool  # the script takes --search-space-file (SGLang 0.5.16 on)
    search_space: tuple[dict, ...]
    excluded_over_limit: int
    limit: int
    folder: str  # relative to target.root
    file_name: str  # with the GPU's name, or "<GPU name>" when none is present
    replaces_series_file: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def destination(self) -> Path:
        return self.target.root / self.folder / self.file_name

    def argv(self, model: str, search_space_path: str | None) -> list[str]:
        args = [self.python, str(self.script), "--model", model, "--tp-size", str(self.shape.tp), "--tune"]
        if self.shape.dtype != "auto":
            args += ["--dtype", self.shape.dtype]
        if self.shape.per_channel_quant:
            args.append("--per-channel-quant")
        if len(self.batch_sizes) == 1:
            args += ["--batch-size", str(self.batch_sizes[0])]
        elif self.batch_sizes:
            args += ["--batch-sizes", *map(str, self.batch_sizes)]
        if search_space_path:
            args += ["--search-space-file", search_space_path]
        return args

    def env(self) -> dict[str, str]:
        """The script imports ``sglang``: the target's, ahead of any other."""
        path = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": str(self.target.root) + (os.pathsep + path if path else "")}

    def to_json(self) -> dict:
        model = self.model or "<work folder>/model (config.json written from the shape)"
        space = "<work folder>/search_space.json" if self.search_space_file else None
        return {
            "target": self.target.to_json(),
            "script": str(self.script),
            "python": self.python,
            "shape": self.shape.to_json(),
            "model": self.model,
            "batch_sizes": list(self.batch_sizes) or None,
            "gpu": self.gpu.to_json() if self.gpu else None,
            "gpu_problem": self.gpu_problem,
            "command": runner.quote(self.argv(model, space)),
            "env": self.env(),
            "search_space": {
                "restricted": self.search_space_file,
                "limit_bytes": self.limit,
                "formula": SHARED_MEMORY_FORMULA,
                "element_bytes": element_bytes(config_dtype(self.shape.dtype)),
                "size": len(self.search_space),
                "excluded_over_limit": self.excluded_over_limit,
                "configs": list(self.search_space),
            },
            "folder": self.folder,
            "file_name": self.file_name,
            "destination": str(self.destination),
            "replaces_series_file": self.replaces_series_file,
            "notes": list(self.notes),
        }


def _supports(script: Path, flag: str) -> bool:
    try:
        return flag in script.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise IOFailure(f"Cannot read {script}: {exc.strerror or exc}.") from None


def plan_tuning(
    target: Target,
    *,
    script: Path | None,
    shape: MoeShape,
    model: str | None = None,
    batch_sizes: tuple[int, ...] = (),
    python: str | None = None,
    series: Series | None = None,
    probe: Callable[[str], tuple[TargetGpu | None, str | None]] | None = None,
) -> TunePlan:
    """Everything the run will do, computed without writing anything (the GPU is queried, not used).
    ``probe`` (default :func:`probe_gpu`) tells which GPU ``python`` sees."""
    if shape.dtype not in DTYPES:
        raise UsageError(f"--dtype {shape.dtype!r} is not one of {', '.join(DTYPES)}.")
    for name, value in (
        ("--experts", shape.experts),
        ("--intermediate-size", shape.intermediate_size),
        ("--topk", shape.topk),
        ("--tp", shape.tp),
    ):
        if value < 1:
            raise UsageError(f"{name} must be at least 1 (got {value}).")
    if shape.intermediate_size % shape.tp:
        raise UsageError(f"--intermediate-size {shape.intermediate_size} is not divisible by --tp {shape.tp}.")
    if model is None and not shape.hidden_size:
        raise UsageError(
            "--hidden-size is needed to describe the model (or pass --model with a Hugging Face "
            "model id or folder the script can read)."
        )
    if shape.topk > shape.experts:
        raise UsageError(f"--topk {shape.topk} is more than --experts {shape.experts}.")
    script_path = find_script(script, target)
    python = python or sys.executable
    folder = configs_folder(target, series)
    supports_space = _supports(script_path, "--search-space-file")
    if len(batch_sizes) > 1 and not _supports(script_path, "--batch-sizes"):
        raise UsageError(f"{script_path} takes one --batch-size, not a list; give one batch size or none (all).")
    space, over = search_space(shape.dtype, shape.block_shape)
    gpu, why = (probe or probe_gpu)(python)
    problem = None
    if gpu is None:
        problem = why or "no CUDA GPU found"
    elif not is_sm12x(gpu.capability):
        problem = (
            f"the GPU present is {gpu.label}, not an SM120-family GPU (compute capability 12.x); configs "
            "measured on it would be wrong for a 12.x card"
        )
    device = gpu.name if gpu is not None and problem is None else "<GPU name>"
    file_name = config_file_name(
        shape.experts, shape.n, device, shape.dtype, shape.block_shape, shape.per_channel_quant
    )
    notes = []
    if not supports_space:
        notes.append(
            "This tuning script has no --search-space-file (SGLang before 0.5.16): it tries its whole "
            f"space; the {over} configs over the limit fail to compile on the card and the script skips "
            "them, so the result fits, but tuning takes longer. A script from SGLang 0.5.16 or newer "
            "is restricted to the fitting configs."
        )
    if model is None:
        notes.append(
            "No --model: the script reads a Mixtral-style config.json that sm120kit writes from the "
            "shape (experts, intermediate size, top-k, hidden size, dtype, block shape)."
        )
    return TunePlan(
        target=target,
        script=script_path,
        python=python,
        shape=shape,
        model=model,
        batch_sizes=tuple(batch_sizes),
        gpu=gpu,
        gpu_problem=problem,
        search_space_file=supports_space,
        search_space=tuple(space),
        excluded_over_limit=over,
        limit=SM120_SHARED_MEMORY_PER_BLOCK,
        folder=folder,
        file_name=file_name,
        replaces_series_file=(target.root / folder / file_name).is_file(),
        notes=tuple(notes),
    )


# -- the run ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    plan: TunePlan
    written: Path
    provenance: Path
    work_dir: Path
    log_file: Path
    batch_sizes: tuple[int, ...]
    over_limit: tuple[str, ...]  # batch sizes whose measured config the estimate puts over the limit
    seconds: float

    def to_json(self) -> dict:
        return {
            "plan": self.plan.to_json(),
            "written": str(self.written),
            "provenance": str(self.provenance),
            "work_dir": str(self.work_dir),
            "log_file": str(self.log_file),
            "batch_sizes": list(self.batch_sizes),
            "over_limit": list(self.over_limit),
            "seconds": round(self.seconds, 1),
        }


def refuse_without_sm12x(plan: TunePlan) -> None:
    if plan.gpu_problem is not None:
        raise MissingDependency(
            f"tune-moe measures fused-MoE configs on the GPU it runs on and needs a CUDA GPU of compute "
            f"capability 12.x (RTX PRO 6000 Blackwell, RTX 5090, DGX Spark), seen through the torch of "
            f"{plan.python}; {plan.gpu_problem}. Nothing was run or written.",
            hint="Run it on the SM120 machine that will serve the model (with --python naming an interpreter "
            "whose torch sees the GPU); --dry-run prints the plan anywhere.",
        )


def model_config(shape: MoeShape) -> dict:
    """A Mixtral-style config.json the tuning script reads E, top-k, sizes, dtype and block shape from."""
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": shape.experts,
        "num_experts_per_tok": shape.topk,
        "intermediate_size": shape.intermediate_size,
        "hidden_size": shape.hidden_size,
        "torch_dtype": "bfloat16",
    }
    if shape.block_shape:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": list(shape.block_shape),
        }
    return config


def read_tuning_output(path: Path) -> dict[str, dict]:
    """The script's output: {batch size: config}; a :class:`CheckFailed` when it is not that."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"The tuning script's output {path} cannot be read as JSON: {exc}.") from None
    if not isinstance(data, dict) or not data:
        raise CheckFailed(f"The tuning script's output {path} is not a table of batch sizes.")
    for key, config in data.items():
        if (
            not str(key).isdigit()
            or not isinstance(config, dict)
            or not all(isinstance(config.get(k), int) for k in CONFIG_KEYS)
        ):
            raise CheckFailed(
                f"The tuning script's output {path} has an entry {key!r} that is not a batch size "
                f"with a config ({', '.join(CONFIG_KEYS)})."
            )
    return data


def run_tuning(
    plan: TunePlan, *, work_dir: Path | None = None, on_line: Callable[[str], None] | None = None
) -> TuneResult:
    """Run the tuning script on the GPU present and write its config file (and provenance) into the tree."""
    refuse_without_sm12x(plan)
    start = time.monotonic()
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="sm120kit-tune-moe-"))
    work.mkdir(parents=True, exist_ok=True)
    model = plan.model
    if model is None:
        (work / "model").mkdir(exist_ok=True)
        (work / "model" / "config.json").write_text(
            json.dumps(model_config(plan.shape), indent=2) + "\n", encoding="utf-8"
        )
        model = str(work / "model")
    space_path = None
    if plan.search_space_file:
        space_path = work / "search_space.json"
        space_path.write_text(json.dumps(list(plan.search_space)) + "\n", encoding="utf-8")
    out_dir = Path(tempfile.mkdtemp(prefix="out-", dir=work))  # the script writes its file into its working folder
    log_file = out_dir / "tune.log"
    runner.run(
        plan.argv(model, str(space_path) if space_path else None),
        cwd=out_dir,
        extra_env=plan.env(),
        on_line=on_line,
        log_file=log_file,
        what="SGLang's fused-MoE tuning script",
    )
    produced = sorted(p for p in out_dir.glob("E=*.json"))
    if not produced:
        raise CheckFailed(f"The tuning script finished but wrote no E=*.json file into {out_dir}. Log: {log_file}.")
    source = next((p for p in produced if p.name == plan.file_name), None)
    if source is None:
        raise CheckFailed(
            f"The tuning script wrote {', '.join(p.name for p in produced)}, not {plan.file_name}: the model it "
            "read has another shape than --experts / --intermediate-size / --tp / --dtype / --block-shape say.",
            hint=f"Make the shape options match the model, or copy the file from {out_dir} by hand.",
        )
    table = read_tuning_output(source)
    dtype = config_dtype(plan.shape.dtype)
    over = tuple(k for k, c in table.items() if pipelined_shared_memory(c, dtype) > plan.limit)
    destination = plan.destination
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IOFailure(f"Cannot create {destination.parent}: {exc.strerror or exc}.") from None
    write_atomic(destination, source.read_bytes(), 0o644)
    provenance = destination.with_name(destination.name + PROVENANCE_SUFFIX)
    write_atomic(provenance, (json.dumps(provenance_record(plan, table, over), indent=2) + "\n").encode(), 0o644)
    return TuneResult(
        plan=plan,
        written=destination,
        provenance=provenance,
        work_dir=work,
        log_file=log_file,
        batch_sizes=tuple(sorted(int(k) for k in table)),
        over_limit=over,
        seconds=time.monotonic() - start,
    )


def provenance_record(plan: TunePlan, table: dict, over: tuple[str, ...]) -> dict:
    return {
        "file": plan.file_name,
        "values": "measured",
        "note": (
            "Every config in this file was measured by SGLang's fused-MoE tuning script on the GPU named "
            "below (the fastest of the search space per batch size); none is derived by rule, unlike "
            "the config files the sm120-moe-configs patch ships."
        ),
        "written_by": f"sm120kit {__version__} tune-moe",
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": plan.gpu.to_json() if plan.gpu else None,
        "sglang": {"version": plan.target.version, "commit": plan.target.commit},
        "script": str(plan.script),
        "shape": plan.shape.to_json(),
        "search_space": {
            "restricted": plan.search_space_file,
            "limit_bytes": plan.limit,
            "formula": SHARED_MEMORY_FORMULA,
            "size": len(plan.search_space),
            "excluded_over_limit": plan.excluded_over_limit,
        },
        "batch_sizes": sorted(int(k) for k in table),
        "over_limit_by_estimate": list(over),
    }
