"""Writing measured environment settings into a recipe file, keeping everything else in it as it was.

``bench-allreduce --write-recipe`` hands over what it measured: for each setting it varies, the value to
set (with a note: why, sources, and ``measured``, where and how it was measured) or None (NCCL's own
default measured fastest: the setting and its note go). :func:`plan_env_update` edits the recipe's TOML
through tomlkit (comments, order and quoting of the rest stay) and loads the result strictly, as any recipe
is loaded, before anything is written; :func:`write_env_update` then keeps the old file as ``FILE.bak`` and
replaces the recipe atomically.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from sm120kit.errors import IOFailure, RecipeError
from sm120kit.serve.recipe import Recipe, load_recipe
from sm120kit.util.atomicfile import write_atomic

BACKUP_SUFFIX = ".bak"


@dataclass(frozen=True)
class EnvUpdate:
    recipe: Recipe
    text: str  # the new recipe file
    set: dict[str, str]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "file": str(self.recipe.path),
            "set": self.set,
            "removed": list(self.removed),
            "unchanged": list(self.unchanged),
        }


def plan_env_update(recipe: Recipe, settings: Mapping[str, str | None], notes: Mapping[str, Mapping]) -> EnvUpdate:
    """The recipe with ``settings`` applied to its [env] (None removes a variable and its note) and ``notes``
    (``why``, ``sources``, ``measured``) for each variable set; loaded strictly before it is returned."""
    try:
        original = recipe.path.read_text(encoding="utf-8")
        doc = tomlkit.parse(original)
    except (OSError, UnicodeDecodeError, TOMLKitError) as exc:
        raise RecipeError(f"Cannot read the recipe {recipe.path} to update it: {exc}.") from None
    if "env" not in doc:
        doc["env"] = tomlkit.table()
    env, all_notes = doc["env"], doc["notes"]
    current = {s.name: s.value for s in recipe.env}
    changed: dict[str, str] = {}
    removed: list[str] = []
    unchanged: list[str] = []
    for name, value in settings.items():
        if value is None:
            if name in env:
                del env[name]
                removed.append(name)
                if name in all_notes:
                    del all_notes[name]
            continue
        note = notes.get(name)
        if note is None:
            raise RecipeError(f"No note was given for {name}={value}; a recipe setting needs one.")
        if current.get(name) == value:
            unchanged.append(name)
        else:
            changed[name] = value
        env[name] = value
        table = tomlkit.table()
        table["why"] = note["why"]
        table["sources"] = list(note["sources"])
        table["measured"] = note["measured"]
        all_notes[name] = table
    text = tomlkit.dumps(doc)
    with tempfile.TemporaryDirectory(prefix="sm120kit-recipe-") as tmp:
        check = Path(tmp) / recipe.path.name
        check.write_text(text, encoding="utf-8")
        try:
            load_recipe(check)
        except RecipeError as exc:
            raise RecipeError(
                f"Updating {recipe.path} would leave a recipe that does not load ({exc.message}); nothing was written."
            ) from None
    return EnvUpdate(recipe, text, changed, tuple(removed), tuple(unchanged))


def write_env_update(update: EnvUpdate) -> Path:
    """Write the updated recipe; the previous file is kept as ``FILE.bak``. Returns the backup's path."""
    path = update.recipe.path
    if path.is_symlink():
        raise RecipeError(
            f"{path} is a symbolic link; sm120kit writes only plain recipe files.",
            hint="Copy the recipe to a file of its own and pass that with --recipe.",
        )
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    try:
        old = path.read_bytes()
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        raise IOFailure(f"Cannot read {path}: {exc.strerror or exc}.") from None
    write_atomic(backup, old, mode)
    write_atomic(path, update.text.encode("utf-8"), mode)
    return backup
