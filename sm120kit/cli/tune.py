"""``sm120kit tune-moe``, ``tune-mla`` and ``bench-allreduce``: measured fused-MoE configs for the 12.x GPU present;
the MLA kernels' build choices timed on it; the fastest all-reduce settings for tensor-parallel decode on the GPUs
present."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, json_option, pass_app
from sm120kit.errors import CheckFailed, UsageError
from sm120kit.serve import recipe as recipe_mod
from sm120kit.serve import recipe_edit
from sm120kit.sglang.target import find_target
from sm120kit.tune import allreduce as bench
from sm120kit.tune import mla as tune_mla
from sm120kit.tune import moe as tune_moe
from sm120kit.tune.allreduce import DEFAULT_BUDGET_S


def _block_shape(ctx, param, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    parts = value.replace("x", ",").split(",")
    try:
        n, k = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--block-shape {value!r}: expected N,K (e.g. 128,128).") from None
    if n < 1 or k < 1:
        raise UsageError(f"--block-shape {value!r}: both sizes must be positive.")
    return n, k


def _dry_run_or_refuse(json_mode: bool, dry_run: bool, plan, show_plan: Callable[[], None], refuse) -> bool:
    """With ``--dry-run``: print the plan (as JSON, or ``show_plan()``) and return True, the command is done.
    Otherwise ``refuse(plan)`` raises where the GPUs here cannot run it, then a person (no --json) sees the plan."""
    if dry_run:
        emit(json_mode, {"dry_run": True, "plan": plan.to_json()}, show_plan)
        return True
    refuse(plan)
    if not json_mode:
        show_plan()
    return False


@cli.command("tune-moe")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option(
    "--script",
    type=click.Path(path_type=Path),
    default=None,
    help=f"SGLang's tuning script, or an SGLang clone holding {tune_moe.SCRIPT_IN_REPO} "
    "(default: the one in PATH when PATH is a clone).",
)
@click.option(
    "--experts",
    "-E",
    type=int,
    required=True,
    help="Experts per GPU as the config file name counts them (a fused shared expert included).",
)
@click.option(
    "--intermediate-size",
    type=int,
    required=True,
    help="The model's MoE intermediate size (all GPUs); N of the file name is this over --tp.",
)
@click.option("--topk", type=int, required=True, help="Experts per token.")
@click.option("--hidden-size", type=int, default=None, help="The model's hidden size (needed without --model).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size the model is served with.")
@click.option(
    "--dtype",
    type=click.Choice(tune_moe.DTYPES),
    default="auto",
    show_default=True,
    help="The tuning script's --dtype (auto: the model's bf16/fp16).",
)
@click.option(
    "--block-shape",
    callback=_block_shape,
    default=None,
    metavar="N,K",
    help="Block-wise quantization block (e.g. 128,128 for DeepSeek-style FP8).",
)
@click.option("--per-channel-quant", is_flag=True, help="Per-channel quantization (the script's flag).")
@click.option(
    "--model",
    default=None,
    help="Hugging Face model id or folder for the script to read (default: a config.json sm120kit "
    "writes from the shape options).",
)
@click.option(
    "--batch-size",
    "batch_sizes",
    type=int,
    multiple=True,
    help="Tune these batch sizes only (repeatable; default: the script's 18 sizes).",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter that runs the script (needs torch with CUDA, triton, ray; default: this one).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the script's output, the search space and the log (default: a new temporary one).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan (command, search space, destination); run nothing.")
@json_option
@pass_app
def tune_moe_command(
    app: AppContext,
    path: Path | None,
    script: Path | None,
    experts: int,
    intermediate_size: int,
    topk: int,
    hidden_size: int | None,
    tp: int,
    dtype: str,
    block_shape,
    per_channel_quant: bool,
    model: str | None,
    batch_sizes: tuple[int, ...],
    python: str | None,
    work_dir: Path | None,
    dry_run: bool,
    json_mode: bool,
) -> None:
    """Measure fused-MoE configs on this 12.x GPU with SGLang's own tuning script and write them where the
    sm120-moe-configs patch puts its rule-derived ones.

    PATH is the SGLang to write into (git clone or installed package; default: the sglang this Python
    imports). The search space is SGLang's, less every config whose pipelined tiles need more shared
    memory than an SM120 block may use. The file gets a sidecar FILE.provenance saying its values are measured.
    """
    console = app.console(json_mode)
    target = find_target(path)
    shape = tune_moe.MoeShape(
        experts=experts,
        intermediate_size=intermediate_size,
        topk=topk,
        hidden_size=hidden_size,
        tp=tp,
        dtype=dtype,
        block_shape=block_shape,
        per_channel_quant=per_channel_quant,
    )
    with console.step("planning"):
        plan = tune_moe.plan_tuning(
            target, script=script, shape=shape, model=model, batch_sizes=batch_sizes, python=python
        )

    def show_plan() -> None:
        console.info(f"target:       {target.label}")
        console.info(
            f"GPU:          {plan.gpu.label if plan.gpu else 'none'}"
            f"{'  (the run would refuse: ' + plan.gpu_problem + ')' if plan.gpu_problem else ''}"
        )
        console.info(
            f"search space: {len(plan.search_space)} configs within {plan.limit} B "
            f"({plan.excluded_over_limit} over it left out; {tune_moe.SHARED_MEMORY_FORMULA})"
            + ("" if plan.search_space_file else " -- not passed: the script lacks --search-space-file")
        )
        console.info(
            f"writes:       {plan.destination}"
            + (" (replaces the series' rule-derived file)" if plan.replaces_series_file else "")
        )
        console.info("command:")
        console.info("  " + plan.to_json()["command"])
        for key, value in plan.env().items():
            console.info(f"  env {key}={value}")
        for note in plan.notes:
            console.info(f"note: {note}")

    if _dry_run_or_refuse(json_mode, dry_run, plan, show_plan, tune_moe.refuse_without_sm12x):
        return
    with console.step(f"tuning on {plan.gpu.label if plan.gpu else 'the GPU'}"):
        result = tune_moe.run_tuning(plan, work_dir=work_dir, on_line=console.debug)

    def human() -> None:
        console.info(
            f"wrote {result.written} ({len(result.batch_sizes)} batch sizes, measured) in {result.seconds:.0f} s"
        )
        console.info(f"provenance: {result.provenance}; log: {result.log_file}")
        if result.over_limit:
            console.warn(
                f"batch sizes {', '.join(result.over_limit)} got configs the estimate puts over "
                f"{plan.limit} B; the patched SGLang fits them at load."
            )

    emit(json_mode, {"dry_run": False, **result.to_json()}, human)


# -- bench-allreduce -----------------------------------------------------------------------------------------


def _int_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    flag = param.opts[0] if param is not None and param.opts else "the value"
    try:
        numbers = tuple(int(part) for part in value.replace(" ", "").split(",") if part)
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected positive integers separated by commas, e.g. 1,8,64.") from None
    if not numbers or min(numbers) < 1:
        raise UsageError(f"{flag} {value!r}: expected positive integers separated by commas, e.g. 1,8,64.")
    return numbers


def _recipe_tokens(recipe) -> tuple[int, ...]:
    """1, 8 and the recipe's largest captured decode batch (64 when it names none)."""
    flags = {s.name: s.value for s in recipe.flags}
    largest = flags.get("cuda-graph-max-bs-decode", flags.get("cuda-graph-max-bs", 64))
    largest = largest if isinstance(largest, int) and largest > 0 else 64
    return tuple(sorted({t for t in (1, 8, largest) if t <= largest}))


@cli.command("bench-allreduce")
@click.option(
    "--recipe",
    "recipe_name",
    metavar="NAME|FILE",
    help="Time the decode all-reduces of this recipe's model (its [model].hidden_size and largest "
    "captured decode batch) and its own NCCL settings too.",
)
@click.option(
    "--hidden",
    type=int,
    default=None,
    help="Hidden size: elements per token of each all-reduce (default: the recipe's).",
)
@click.option(
    "--tokens",
    callback=_int_list,
    default=None,
    metavar="N,N,...",
    help="Tokens per all-reduce (decode batch sizes); default 1, 8 and the recipe's largest captured "
    "decode batch (64 without a recipe).",
)
@click.option(
    "--gpus",
    "world",
    type=click.IntRange(2),
    default=None,
    help="How many GPUs (one process each; default: every GPU visible).",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter that runs the measurement (needs torch with CUDA and NCCL; SGLang and FlashInfer "
    "there are timed too; default: this one).",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=1),
    default=DEFAULT_BUDGET_S,
    show_default=True,
    help="Seconds after which the staged search starts no further variant.",
)
@click.option(
    "--exhaustive",
    is_flag=True,
    help="Then time every combination of the settings the search knows and say how close the staged "
    "pick came (takes minutes).",
)
@click.option("--no-sglang", is_flag=True, help="Leave out SGLang's custom and FlashInfer's PCIe-IPC all-reduce.")
@click.option(
    "--write-recipe",
    is_flag=True,
    help="Write the pick into the recipe's [env] with where, when and with what it was measured "
    "(the previous file stays as FILE.bak).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan (sizes, variants, environment); run nothing.")
@json_option
@pass_app
def bench_allreduce(
    app: AppContext,
    recipe_name: str | None,
    hidden: int | None,
    tokens: tuple[int, ...] | None,
    world: int | None,
    python: str | None,
    budget: float,
    exhaustive: bool,
    no_sglang: bool,
    write_recipe: bool,
    dry_run: bool,
    json_mode: bool,
) -> None:
    """Time the all-reduces of tensor-parallel decode on this machine's GPUs, one process per GPU: NCCL's
    protocols, algorithms, channel and thread counts, and SGLang's custom and PCIe-IPC all-reduce where the
    environment has them, each in fresh processes with its own environment (NCCL_NVLS_ENABLE=0 in all).
    Prints the median and p99 latency and bus bandwidth per size, the fastest per size and the NCCL setting
    for a recipe. Exits 9 without two GPUs."""
    console = app.console(json_mode)
    recipe = recipe_mod.find_recipe(recipe_name) if recipe_name else None
    if write_recipe and recipe is None:
        raise UsageError("--write-recipe needs --recipe (the recipe file to write the measured settings into).")
    hidden = hidden or (recipe.hidden_size if recipe else None)
    if not hidden:
        raise UsageError(
            "The hidden size is not known: give --hidden N"
            + (
                f", or add hidden_size to [model] of {recipe.path}."
                if recipe
                else " (or --recipe NAME of a recipe whose [model] has hidden_size)."
            )
        )
    tokens = tokens or (_recipe_tokens(recipe) if recipe else bench.DEFAULT_TOKENS)
    with console.step("asking the serving Python what it sees"):
        plan = bench.plan_bench(
            hidden=hidden,
            tokens=tokens,
            python=python,
            world=world,
            recipe_env={s.name: s.value for s in recipe.env} if recipe else None,
            exhaustive=exhaustive,
            budget_s=budget,
            sglang=not no_sglang,
        )

    def show_plan() -> None:
        sizes = ", ".join(
            f"{t} ({b // 1024 if b >= 1024 else b} {'KiB' if b >= 1024 else 'B'})"
            for t, b in plan.sizes_bytes().items()
        )
        console.info(
            f"GPUs:      {plan.world} of {len(plan.gpus)}: "
            + (", ".join(g.get("name", "?") for g in plan.gpus[: plan.world]) or "none")
            + (f"  (the run would refuse: {plan.problem})" if plan.problem else "")
        )
        if plan.topology and plan.topology.get("summary"):
            console.info(f"topology:  {plan.topology['summary']}")
        console.info(f"sizes:     tokens x {plan.hidden} {plan.dtype}: {sizes}")
        console.info("versions:  " + ", ".join(f"{k} {v}" for k, v in plan.to_json()["versions"].items() if v))
        console.info(
            "base env:  "
            + (", ".join(f"{k}={v}" for k, v in sorted(plan.base_env.items()) if k.startswith("NCCL_")) or "-")
        )
        for variant in plan.extra:
            console.info(f"also:      {variant.name}")
        for name, why in plan.skipped:
            console.info(f"skipped:   {name}: {why}")
        for note in plan.notes:
            console.info(f"note:      {note}")

    if _dry_run_or_refuse(json_mode, dry_run, plan, show_plan, bench.refuse_without_gpus):
        return
    result = bench.run_bench(plan, progress=console.progress, on_step=console.debug)
    update = backup = None
    if write_recipe:
        if result.pick() is None:
            raise CheckFailed(
                "No NCCL setting was measured at every size, so nothing was written to the recipe.",
                hint="Run without --write-recipe to see why each variant failed.",
            )
        update = recipe_edit.plan_env_update(recipe, result.recipe_settings(), result.recipe_notes())
        backup = recipe_edit.write_env_update(update)
    doc = {
        "dry_run": False,
        **result.to_json(),
        "recipe_update": None if update is None else {**update.to_json(), "backup": str(backup)},
    }
    emit(json_mode, doc, lambda: _show_bench(console, result, update, backup))


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _show_bench(console, result, update, backup) -> None:
    plan = result.plan
    headers = ["variant", "status"] + [f"{t} tok p50/p99 us" for t in plan.tokens] + [f"busbw GB/s ({plan.tokens[-1]})"]
    rows = []
    for r in result.results:
        cells = []
        for t in plan.tokens:
            entry = next((e for e in r.sizes if e.get("tokens") == t), {})
            cells.append(
                "not served"
                if entry and not entry.get("served")
                else f"{_us(entry.get('p50_us'))}/{_us(entry.get('p99_us'))}"
                if entry
                else "-"
            )
        last = next((e for e in r.sizes if e.get("tokens") == plan.tokens[-1]), {})
        busbw = last.get("busbw_gbps")
        rows.append(
            [
                r.variant.name,
                r.status if not r.error else f"failed: {r.error[:60]}",
                *cells,
                "-" if busbw is None else f"{busbw:.2f}",
            ]
        )
    console.table(headers, rows)
    console.info("")
    for t, (r, value) in sorted(result.best_per_size().items()):
        console.info(f"fastest at {t} token(s): {r.variant.name} ({value:.1f} us)")
    pick = result.pick()
    if pick is not None:
        settings = ", ".join(f"{k}={v}" for k, v in result.recipe_settings().items() if v) or "NCCL's defaults"
        console.info(
            f"NCCL setting for a recipe: {settings} (geometric mean of the medians {pick.geomean(plan.tokens):.1f} us)"
        )
    if result.exhaustive:
        ex = result.exhaustive
        ratio = ex.get("staged_over_best")
        console.info(
            f"exhaustive sweep: {ex['variants']} settings; best {ex['best']['name'] if ex['best'] else '-'}; "
            f"the staged pick ({ex['staged_seconds']} s) is "
            + (f"{(ratio - 1) * 100:+.1f} % from it" if ratio else "not comparable")
        )
    if result.stopped_at_budget:
        console.warn(f"the search stopped at its budget ({plan.budget_s:.0f} s); later stages were not timed.")
    if update is not None:
        console.info(
            f"wrote {update.recipe.path} (set {', '.join(update.set) or 'nothing new'}; removed "
            f"{', '.join(update.removed) or 'nothing'}); the previous file is {backup}"
        )
    console.info(f"{len(result.results)} variants in {result.seconds:.0f} s")


# -- tune-mla -------------------------------------------------------------------------------------------------


@cli.command("tune-mla")
@click.option(
    "--heads",
    type=int,
    multiple=True,
    required=True,
    help="Attention heads one GPU runs: the model's heads over the tensor-parallel size (Kimi-K2 at TP8: 8; "
    "DeepSeek-V3 at TP8: 16). Repeat for several.",
)
@click.option(
    "--kv-dtype",
    "kv",
    type=click.Choice(tune_mla.KV_DTYPES),
    default="fp8",
    show_default=True,
    help="The KV cache's dtype (SGLang's --kv-cache-dtype fp8_e4m3, or bf16).",
)
@click.option(
    "--lengths",
    callback=_int_list,
    default=None,
    metavar="N,N,...",
    help="Prefix tokens a request holds (default 8192,32768,131072).",
)
@click.option(
    "--batch",
    "batches",
    callback=_int_list,
    default=None,
    metavar="N,N,...",
    help="Requests decoded together (default 1,4).",
)
@click.option(
    "--drafts",
    callback=_int_list,
    default=None,
    metavar="N,N,...",
    help="Also time target verify with this many draft tokens a request (speculative decoding: EAGLE, MTP), "
    "where the fp8-mma path's e4m3 scores count most.",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter that runs the timing (needs torch with CUDA and Triton; SGLang there gives the fp8 "
    "kernel's error the fp8-mma path is weighed against; default: this one).",
)
@click.option("--any-gpu", is_flag=True, help="Time on a GPU that is not 12.x too (its answer is not an SM120 card's).")
@click.option("--dry-run", is_flag=True, help="Print the plan (cases, candidates); run nothing.")
@json_option
@pass_app
def tune_mla_cmd(
    app: AppContext,
    heads: tuple[int, ...],
    kv: str,
    lengths: tuple[int, ...] | None,
    batches: tuple[int, ...] | None,
    drafts: tuple[int, ...] | None,
    python: str | None,
    any_gpu: bool,
    dry_run: bool,
    json_mode: bool,
) -> None:
    """Time the CUDA MLA kernels' build choices on this 12.x GPU (the decode bodies' split limits, the bodies
    themselves, and for fp8 KV the fp8-mma path) on decode, and with --drafts on target verify too, against the
    build as shipped, each checked against a float32
    reference, and say what to set: SGLANG_SM120_MLA_DEFINES or SGLANG_SM120_MLA_FP8_MMA, or nothing. The shipped
    defaults were measured on an H200 standing in for SM120. Exits 9 without a 12.x GPU (unless --any-gpu)."""
    console = app.console(json_mode)
    plan = tune_mla.plan_tune(
        kv=kv,
        heads=heads,
        lengths=lengths or tune_mla.DEFAULT_LENGTHS,
        batches=batches or tune_mla.DEFAULT_BATCHES,
        drafts=drafts or (),
        python=python,
        any_gpu=any_gpu,
    )

    def show_plan() -> None:
        console.info(f"python:     {plan.python}")
        console.info(
            f"cases:      {len(plan.cases)} {kv} calls (decode; d N: verify with N drafts a request): "
            + ", ".join(f"{c.label} {c.heads}h" for c in plan.cases)
        )
        for cand in plan.candidates:
            how = (
                "fp8 KV on the fp8-mma path"
                if cand.fp8_mma
                else (" ".join(f"-D{d}" for d in cand.defines) or "as shipped")
            )
            console.info(f"candidate:  {cand.name}: {how}")

    if dry_run:
        emit(json_mode, {"dry_run": True, "plan": plan.to_json()}, show_plan)
        return
    if not json_mode:
        show_plan()
    result = tune_mla.run_tune(plan, progress=console.progress, on_step=console.debug)
    emit(json_mode, {"dry_run": False, **result.to_json()}, lambda: _show_tune_mla(console, result))


def _show_tune_mla(console, result: tune_mla.MlaTuneResult) -> None:
    plan = result.plan
    where = result.device
    if not result.sm120_card:
        mode = "; Triton on mma.sync as on SM120, DISABLE_MMA_V3=1" if result.sm120_mode else ""
        where += f" (not an SM120 card: --any-gpu{mode})"
    console.info(f"GPU: {where}")
    verdicts = {v.name: v for v in result.verdicts()}
    headers = ["candidate"] + [f"{c.label} {c.heads}h ms" for c in plan.cases] + ["max err", "verdict"]
    rows = []
    for r in result.results:
        cells = []
        for c in plan.cases:
            m = r.cases.get(c.key)
            ratio = verdicts[r.candidate.name].ratios.get(c.key) if r.candidate.name in verdicts else None
            cells.append("-" if not m else f"{m['ms']:.4f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        errs = [m["max_abs_err"] for m in r.cases.values() if m.get("max_abs_err") is not None]
        v = verdicts.get(r.candidate.name)
        verdict = "baseline" if v is None and r.error is None else (f"failed: {r.error[:60]}" if v is None else v.why)
        rows.append([r.candidate.name, *cells, f"{max(errs):.5f}" if errs else "-", verdict])
    if plan.kv == "fp8":
        errs = [e["max_abs_err"] for e in result.sglang.values() if e.get("max_abs_err") is not None]
        rows.append(
            ["SGLang's fp8 kernel", *["" for _ in plan.cases], f"{max(errs):.5f}" if errs else "-", "errors only"]
        )
    console.table(headers, rows)
    pick = result.pick()
    if pick is None:
        console.info("The shipped build stays: no candidate was faster by the margin without a slower case.")
    else:
        console.info(f"Set for a patched SGLang ({pick.name}: {pick.why}):")
        for key, value in result.env().items():
            console.info(f"  {key}={value}")
