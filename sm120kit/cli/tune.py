"""``sm120kit tune-moe``: measured fused-MoE configs for the 12.x GPU present."""

from __future__ import annotations

from pathlib import Path

import click

from sm120kit.tune import moe as tune_moe
from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, json_option, pass_app
from sm120kit.errors import UsageError
from sm120kit.sglang.target import find_target


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


@cli.command("tune-moe")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--script", type=click.Path(path_type=Path), default=None,
              help=f"SGLang's tuning script, or an SGLang clone holding {tune_moe.SCRIPT_IN_REPO} "
                   "(default: the one in PATH when PATH is a clone).")
@click.option("--experts", "-E", type=int, required=True,
              help="Experts per GPU as the config file name counts them (a fused shared expert included).")
@click.option("--intermediate-size", type=int, required=True,
              help="The model's MoE intermediate size (all GPUs); N of the file name is this over --tp.")
@click.option("--topk", type=int, required=True, help="Experts per token.")
@click.option("--hidden-size", type=int, default=None, help="The model's hidden size (needed without --model).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size the model is served with.")
@click.option("--dtype", type=click.Choice(tune_moe.DTYPES), default="auto", show_default=True,
              help="The tuning script's --dtype (auto: the model's bf16/fp16).")
@click.option("--block-shape", callback=_block_shape, default=None, metavar="N,K",
              help="Block-wise quantization block (e.g. 128,128 for DeepSeek-style FP8).")
@click.option("--per-channel-quant", is_flag=True, help="Per-channel quantization (the script's flag).")
@click.option("--model", default=None,
              help="Hugging Face model id or folder for the script to read (default: a config.json sm120kit "
                   "writes from the shape options).")
@click.option("--batch-size", "batch_sizes", type=int, multiple=True,
              help="Tune these batch sizes only (repeatable; default: the script's 18 sizes).")
@click.option("--python", "python", default=None,
              help="Interpreter that runs the script (needs torch with CUDA, triton, ray; default: this one).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the script's output, the search space and the log (default: a new temporary one).")
@click.option("--dry-run", is_flag=True, help="Print the plan (command, search space, destination); run nothing.")
@json_option
@pass_app
def tune_moe_command(app: AppContext, path: Path | None, script: Path | None, experts: int, intermediate_size: int,
                     topk: int, hidden_size: int | None, tp: int, dtype: str, block_shape, per_channel_quant: bool,
                     model: str | None, batch_sizes: tuple[int, ...], python: str | None, work_dir: Path | None,
                     dry_run: bool, json_mode: bool) -> None:
    """Measure fused-MoE configs on this 12.x GPU with SGLang's own tuning script and write them where the
    sm120-moe-configs patch puts its rule-derived ones.

    PATH is the SGLang to write into (git clone or installed package; default: the sglang this Python
    imports). The search space is SGLang's, less every config whose pipelined tiles need more shared
    memory than an SM120 block may use. The file gets a sidecar FILE.provenance saying its values are measured.
    """
    console = app.console(json_mode)
    target = find_target(path)
    shape = tune_moe.MoeShape(experts=experts, intermediate_size=intermediate_size, topk=topk,
                              hidden_size=hidden_size, tp=tp, dtype=dtype, block_shape=block_shape,
                              per_channel_quant=per_channel_quant)
    with console.step("planning"):
        plan = tune_moe.plan_tuning(target, script=script, shape=shape, model=model, batch_sizes=batch_sizes,
                                    python=python)

    def show_plan() -> None:
        console.info(f"target:       {target.label}")
        console.info(f"GPU:          {plan.gpu.label if plan.gpu else 'none'}"
                     f"{'  (the run would refuse: ' + plan.gpu_problem + ')' if plan.gpu_problem else ''}")
        console.info(f"search space: {len(plan.search_space)} configs within {plan.limit} B "
                     f"({plan.excluded_over_limit} over it left out; {tune_moe.SHARED_MEMORY_FORMULA})"
                     + ("" if plan.search_space_file else " -- not passed: the script lacks --search-space-file"))
        console.info(f"writes:       {plan.destination}"
                     + (" (replaces the series' rule-derived file)" if plan.replaces_series_file else ""))
        console.info("command:")
        console.info("  " + plan.to_json()["command"])
        for key, value in plan.env().items():
            console.info(f"  env {key}={value}")
        for note in plan.notes:
            console.info(f"note: {note}")

    if dry_run:
        emit(json_mode, {"dry_run": True, "plan": plan.to_json()}, show_plan)
        return
    tune_moe.refuse_without_sm12x(plan)
    if not json_mode:
        show_plan()
    with console.step(f"tuning on {plan.gpu.label if plan.gpu else 'the GPU'}"):
        result = tune_moe.run_tuning(plan, work_dir=work_dir, on_line=console.debug)

    def human() -> None:
        console.info(f"wrote {result.written} ({len(result.batch_sizes)} batch sizes, measured) in "
                     f"{result.seconds:.0f} s")
        console.info(f"provenance: {result.provenance}; log: {result.log_file}")
        if result.over_limit:
            console.warn(f"batch sizes {', '.join(result.over_limit)} got configs the estimate puts over "
                         f"{plan.limit} B; the patched SGLang fits them at load.")

    emit(json_mode, {"dry_run": False, **result.to_json()}, human)
