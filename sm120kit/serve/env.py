"""Environment switches: the ``SGLANG_*`` variables of a recipe must be read somewhere in the release's source.

A switch no file of the release reads does nothing there (switches are replaced by flags between releases),
so :func:`check_env` makes it a :class:`RecipeError` naming the recipe's line and the release.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from sm120kit.errors import RecipeError
from sm120kit.serve.recipe import Recipe
from sm120kit.serve.server_args import ServerArgsSpec


def env_names_read(package_dir: Path, names: Iterable[str]) -> set[str]:
    """Which of ``names`` occur in the Python source of the SGLang package at ``package_dir``."""
    wanted = set(names)
    found: set[str] = set()
    if not wanted:
        return found
    pattern = re.compile("|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True)))
    for path in package_dir.rglob("*.py"):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for match in pattern.finditer(text):
            name = match.group(0)
            end = match.end()
            if end < len(text) and (text[end].isalnum() or text[end] == "_"):
                continue  # a longer name that starts with this one
            found.add(name)
        if found == wanted:
            break
    return found


def check_env(recipe: Recipe, spec: ServerArgsSpec) -> None:
    """Every ``SGLANG_*`` variable of the recipe must be read by the release; else a RecipeError."""
    sglang_vars = [s for s in recipe.env if s.name.startswith("SGLANG_")]
    read = env_names_read(spec.package_dir, (s.name for s in sglang_vars))
    for setting in sglang_vars:
        if setting.name not in read:
            raise RecipeError(
                f"{recipe.where(setting.line)}: no file of {spec.label} ({spec.package_dir}) reads the "
                f"environment variable {setting.name}, so setting it does nothing there.",
                hint=f"The recipe was written for SGLang {', '.join(recipe.sglang)}; switches are replaced by "
                "flags between releases. Update the recipe or run the release it names.",
            )
