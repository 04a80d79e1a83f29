"""Launch: a recipe (and extra flags) -> the SGLang launch command and its environment, then the server.

The flow is :func:`sm120kit.serve.recipe.load_recipe` -> :func:`plan_launch` (reads the release's parser,
checks flags, environment switches and GPUs, builds argv and environment; no side effects) -> :func:`launch`
(``os.execvpe``), so ``--dry-run`` is the plan.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import UsageError
from sm120kit.hardware.arch import is_sm12x
from sm120kit.serve.env import check_env
from sm120kit.serve.flags import check_flags, merge_flags, parse_extra, recipe_flags
from sm120kit.serve.gpus import ListedGpu, check_gpus, detect_gpus
from sm120kit.serve.recipe import NO_SM120_CODE, Recipe
from sm120kit.serve.server_args import read_server_args
from sm120kit.util.report import Step

LAUNCH_MODULE = "sglang.launch_server"


@dataclass(frozen=True)
class LaunchPlan:
    recipe: Recipe
    sglang_version: str | None
    sglang_dir: Path
    argv: tuple[str, ...]
    env: dict[str, str]  # what the recipe (and PYTHONPATH for a tree) adds to the environment
    kept_env: dict[str, str]  # recipe variables left as the user's environment already had them
    overrides: tuple[str, ...]
    warnings: tuple[str, ...]
    gpus: tuple[ListedGpu, ...] | None
    release_named: bool  # the SGLang found is one the recipe names

    @property
    def command(self) -> str:
        """One shell line: the environment assignments, then the command."""
        assigns = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join(assigns + [shlex.join(self.argv)])

    def full_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        return env

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.name,
            "file": str(self.recipe.path),
            "sglang": {
                "version": self.sglang_version,
                "package_dir": str(self.sglang_dir),
                "named_by_recipe": self.release_named,
                "recipe_releases": list(self.recipe.sglang),
            },
            "argv": list(self.argv),
            "env": self.env,
            "kept_env": self.kept_env,
            "command": self.command,
            "overrides": list(self.overrides),
            "warnings": list(self.warnings),
            "gpus": None if self.gpus is None else [g.to_json() for g in self.gpus],
            "expected_gpus": self.recipe.gpus.to_json(),
        }


def plan_launch(
    recipe: Recipe,
    *,
    model: str | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
    sglang_root: Path | None = None,
    gpus: Sequence[ListedGpu] | None | str = "detect",
    on_step: Step | None = None,
) -> LaunchPlan:
    """Check ``recipe`` (and the ``extra`` flags) against the SGLang that will run it; build the command.

    No side effects: the result is what ``--dry-run`` prints and what :func:`launch` executes.
    """
    python = python or sys.executable
    base_argv = [python, "-m", LAUNCH_MODULE, "--model-path", model or recipe.model]
    rflags = recipe_flags(recipe)
    raw_argv = base_argv[3:] + [t for u in rflags for t in u.argv] + list(extra)
    spec = read_server_args(python, sglang_root, [raw_argv], on_step=on_step)

    warnings: list[str] = []
    if spec.version not in recipe.sglang:
        warnings.append(f"{spec.label} is installed; the recipe was written for SGLang {', '.join(recipe.sglang)}.")
    warnings += check_flags(rflags, spec, recipe)
    extra_uses = parse_extra(extra, spec, warnings)
    warnings += check_flags(extra_uses, spec, None)
    if is_sm12x(recipe.gpus.capability):
        for use in extra_uses:
            banned = NO_SM120_CODE.get(use.flag.lstrip("-"), frozenset())
            if any(v in banned for v in use.values):
                warnings.append(f"{' '.join(use.argv)}: that backend has no code for compute capability 12.x.")
    check_env(recipe, spec)
    if spec.argv_errors and spec.argv_errors[0]:
        raise UsageError(
            f"{spec.label}'s argument parser rejects the command: {spec.argv_errors[0]}",
            hint="Fix the recipe or the extra flags.",
        )
    merged, overrides = merge_flags(rflags, extra_uses, spec)

    added: dict[str, str] = {}
    kept: dict[str, str] = {}
    for setting in recipe.env:
        current = os.environ.get(setting.name)
        if current is not None and current != setting.value:
            kept[setting.name] = current
            warnings.append(
                f"{setting.name}={current} from your environment is kept (the recipe sets {setting.value})."
            )
        elif current is None:
            added[setting.name] = setting.value
    if sglang_root is not None:
        old = os.environ.get("PYTHONPATH")
        added["PYTHONPATH"] = str(sglang_root) + (os.pathsep + old if old else "")

    found = detect_gpus() if gpus == "detect" else gpus
    warnings += check_gpus(recipe.gpus, found)  # type: ignore[arg-type]

    argv = tuple(base_argv + [t for u in merged for t in u.argv])
    return LaunchPlan(
        recipe=recipe,
        sglang_version=spec.version,
        sglang_dir=spec.package_dir,
        argv=argv,
        env=added,
        kept_env=kept,
        overrides=tuple(overrides),
        warnings=tuple(warnings),
        gpus=None if found is None else tuple(found),  # type: ignore[arg-type]
        release_named=spec.version in recipe.sglang,
    )


def launch(plan: LaunchPlan) -> None:  # pragma: no cover - replaces the process
    """Replace this process with the SGLang server (signals then reach SGLang directly)."""
    runner.log.info("+ %s", plan.command)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(plan.argv[0], list(plan.argv), plan.full_env())
