"""``sm120kit serve`` and ``sm120kit recipes``: start SGLang with a serving recipe; list and check recipes."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from packaging.version import Version

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, exit_with, json_option, pass_app
from sm120kit.errors import CheckFailed, RecipeError
from sm120kit.serve import checks, docker, flags, launch, server_args
from sm120kit.serve import recipe as recipe_mod
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target
from sm120kit.ui import print_json


@cli.command("serve", context_settings={"allow_interspersed_args": False})
@click.option(
    "--recipe",
    "recipe_name",
    required=True,
    metavar="NAME|FILE",
    help="A recipe name (see `sm120kit recipes`) or the path of a recipe .toml file.",
)
@click.option("--model", metavar="PATH", help="Model path or Hugging Face id instead of the recipe's.")
@click.option("--dry-run", is_flag=True, help="Check everything and print the command; start nothing.")
@click.option(
    "--sglang",
    "sglang_path",
    metavar="PATH",
    type=click.Path(),
    help="Run this SGLang tree (git clone, installed package or the folder holding sglang/) through "
    "PYTHONPATH, instead of the sglang the Python imports.",
)
@click.option("--python", "python", metavar="EXE", help="The Python that runs SGLang (default: this one).")
@json_option
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SGLANG FLAGS...]")
@pass_app
def serve(
    app: AppContext,
    recipe_name: str,
    model: str | None,
    dry_run: bool,
    sglang_path: str | None,
    python: str | None,
    json_mode: bool,
    sglang_args: tuple[str, ...],
) -> None:
    """Start SGLang's server with a recipe's flags and environment.

    Every flag (the recipe's and the extra ones after --) is first checked against the argument parser of
    the SGLang that will run; the GPUs found are compared with the recipe's. Extra flags replace the
    recipe's flag of the same name.
    """
    # stdout carries only the result (the command, or the JSON plan), so that
    # eval "$(sm120kit serve ... --dry-run)" works; progress, overrides and warnings go to stderr.
    console = app.console(json_mode, stream=sys.stderr)
    recipe = recipe_mod.find_recipe(recipe_name)
    root = find_target(sglang_path).root if sglang_path else None
    plan = launch.plan_launch(
        recipe, model=model, extra=sglang_args, python=python, sglang_root=root, on_step=console.info
    )
    for line in plan.overrides:
        console.info(f"override: {line}")
    for warning in plan.warnings:
        console.warn(warning)
    if json_mode:
        print_json({**plan.to_json(), "dry_run": dry_run})
    elif dry_run:
        click.echo(plan.command)
    if dry_run:
        return
    if not json_mode:
        console.info(f"starting SGLang {plan.sglang_version} with recipe {recipe.name} ...")
    launch.launch(plan)


@cli.command("recipes")
@click.argument("name", required=False)
@click.option(
    "--check",
    is_flag=True,
    help="Check every recipe against the argument parser of each SGLang release it names "
    "(downloads those releases into the cache).",
)
@click.option(
    "--docker-args",
    is_flag=True,
    help="Print the docker build arguments that label an image with this sm120kit and its patch set.",
)
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="Read recipes from this folder instead of the shipped ones.",
)
@json_option
@pass_app
def recipes_command(
    app: AppContext, name: str | None, check: bool, docker_args: bool, folder: Path | None, json_mode: bool
) -> None:
    """List the serving recipes, show one (NAME), or check them against SGLang releases."""
    console = app.console(json_mode)
    if docker_args:
        args = docker.docker_build_args()
        emit(
            json_mode,
            {"build_args": args},
            lambda: [click.echo(f"--build-arg {key}={value}") for key, value in args.items()],
        )
        return
    chosen = [recipe_mod.find_recipe(name, folder)] if name else recipe_mod.list_recipes(folder)
    if check:
        _check(console, chosen, json_mode)
        return
    if name:
        recipe = chosen[0]
        emit(json_mode, recipe.to_json(), lambda: _show(console, recipe))
        return
    rows = [[r.name, r.gpus.label, r.model, ", ".join(r.sglang)] for r in chosen]
    emit(
        json_mode,
        {"recipes": [r.to_json() for r in chosen]},
        lambda: console.table(["recipe", "GPUs", "model", "SGLang"], rows),
    )


def _show(console, recipe: recipe_mod.Recipe) -> None:
    console.info(f"{recipe.name}: {recipe.title}")
    console.info(f"  file: {recipe.path}")
    console.info(f"  model: {recipe.model} ({recipe.model_info['architecture']}; {recipe.model_info['quantization']})")
    console.info(f"  GPUs: {recipe.gpus.label}")
    console.info(f"  written for SGLang {', '.join(recipe.sglang)}")
    console.info("")
    console.info(recipe.description)
    console.info("")
    rows = []
    for setting in recipe.flags:
        rows.append(
            [
                "--" + setting.name,
                " ".join(flags.render(setting.value)) or "(switch)",
                recipe.notes[setting.name].why.replace("\n", " "),
            ]
        )
    for setting in recipe.env:
        rows.append([setting.name, setting.value, recipe.notes[setting.name].why.replace("\n", " ")])
    console.table(["setting", "value", "why"], rows)
    measured = [(key, note.measured) for key, note in recipe.notes.items() if note.measured]
    if measured:
        console.info("")
        console.info("measured:")
        for key, text in measured:
            console.info(f"  {key}: {text}")
    console.info("")
    console.info("sources:")
    for key, note in recipe.notes.items():
        for src in note.sources:
            console.info(f"  {key}: {src}")


def _check(console, chosen: list[recipe_mod.Recipe], json_mode: bool) -> None:
    wanted = sorted({v for r in chosen for v in r.sglang}, key=Version)
    results = []
    for i, version in enumerate(wanted, 1):
        root = releases.fetch_release(version, on_step=console.info)
        named = [r for r in chosen if version in r.sglang]
        argvs = [["--model-path", r.model, *[t for u in flags.recipe_flags(r) for t in u.argv]] for r in named]
        spec = server_args.read_server_args(sglang_root=root, argvs=argvs, on_step=console.info)
        given = list(spec.argv_given) + [None] * (len(named) - len(spec.argv_given))
        for recipe, parse_error, recipe_given in zip(named, spec.argv_errors, given):
            try:
                warnings = checks.validate_against(recipe, spec)
                if parse_error:
                    raise RecipeError(
                        f"{recipe.path}: {spec.label}'s argument parser rejects the recipe: {parse_error}"
                    )
                warnings += checks.check_slow(recipe, spec, recipe_given)
                results.append(
                    {"recipe": recipe.name, "sglang": version, "ok": True, "warnings": warnings, "error": None}
                )
            except RecipeError as exc:
                results.append(
                    {"recipe": recipe.name, "sglang": version, "ok": False, "warnings": [], "error": exc.render()}
                )
        console.progress(i, len(wanted), f"SGLang {version}")
    rows = [
        [r["recipe"], r["sglang"], "ok" if r["ok"] else "FAIL", r["error"] or "; ".join(r["warnings"])] for r in results
    ]
    emit(json_mode, {"checked": results}, lambda: console.table(["recipe", "SGLang", "result", "detail"], rows))
    failed = [r for r in results if not r["ok"]]
    if failed:
        # The result (with each error) is already printed; say it failed on stderr and exit with the code
        # of CheckFailed, without a second JSON document on stdout.
        error = CheckFailed(
            f"{len(failed)} of {len(results)} recipe/release checks failed: "
            + "; ".join(f"{r['recipe']} on {r['sglang']}" for r in failed)
            + "."
        )
        exit_with(error.exit_code, error.render())
