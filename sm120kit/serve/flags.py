"""Launch flags: render a recipe's flags, parse the extra ones, check both against a release's parser.

A :class:`FlagUse` is one flag as it will be passed, with where it came from (the recipe's file and line,
or the command line); :func:`check_flags` rejects what the release's own parser
(:class:`sm120kit.serve.server_args.ServerArgsSpec`) would, naming the origin and the release.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sm120kit.errors import RecipeError, UsageError
from sm120kit.serve.recipe import Recipe
from sm120kit.serve.server_args import ServerArgsSpec


@dataclass(frozen=True)
class FlagUse:
    """One flag as it will be passed: ``--name`` and its value tokens; where it came from."""

    flag: str
    values: tuple[str, ...]
    origin: str  # "file:line" of the recipe, or "the command line"
    from_recipe: bool
    raw: Any = None  # the recipe's TOML value (True for a switch)

    @property
    def argv(self) -> list[str]:
        return [self.flag, *self.values]


def render(value: Any) -> tuple[str, ...]:
    """The argv tokens of a recipe value after its flag: none for a switch (true), one per array item."""
    if value is True:
        return ()
    if isinstance(value, list):
        return tuple(_render_scalar(v) for v in value)
    return (_render_scalar(value),)


def _render_scalar(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def recipe_flags(recipe: Recipe) -> list[FlagUse]:
    """The recipe's flags as they will be passed, in file order."""
    return [FlagUse("--" + s.name, render(s.value), recipe.where(s.line), True, s.value) for s in recipe.flags]


def parse_extra(tokens: Sequence[str], spec: ServerArgsSpec, abbreviations: list[str] | None = None) -> list[FlagUse]:
    """Split the flags given after ``--`` into uses, with the parser's arities; unknown flags are errors.

    An unambiguous prefix of a flag is expanded to the full flag (as SGLang's argparse would) and a
    warning is appended to ``abbreviations``.
    """
    abbreviations = [] if abbreviations is None else abbreviations
    uses: list[FlagUse] = []
    i = 0
    tokens = list(tokens)
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-") or _is_number(token):
            raise UsageError(
                f"Unexpected argument '{token}' among the extra SGLang flags: every extra "
                "argument must be a flag (--name) or the value of the flag before it."
            )
        flag, inline = (token.split("=", 1) + [None])[:2] if "=" in token else (token, None)
        full = spec.expand(flag)
        if full is None:
            raise _unknown_flag(flag, "the command line", spec, None)
        if full != flag:
            abbreviations.append(
                f"{flag} (command line) is read as {full}; write the full name, "
                "abbreviations change meaning when a release adds flags."
            )
            flag = full
        option = spec.option(flag)
        i += 1
        if inline is not None:
            values: tuple[str, ...] = (inline,)
        elif not option.takes_value:
            values = ()
        elif option.nargs in (None, "?") or option.nargs == 1:
            if i < len(tokens) and (not tokens[i].startswith("-") or _is_number(tokens[i])):
                values = (tokens[i],)
                i += 1
            elif option.nargs == "?":
                values = ()
            else:
                raise UsageError(f"The extra flag {flag} needs a value ({spec.label}).")
        else:
            collected = []
            while i < len(tokens) and (not tokens[i].startswith("-") or _is_number(tokens[i])):
                collected.append(tokens[i])
                i += 1
            if isinstance(option.nargs, int) and len(collected) != option.nargs:
                raise UsageError(f"The extra flag {flag} takes {option.nargs} values, got {len(collected)}.")
            values = tuple(collected)
        uses.append(FlagUse(flag, values, "the command line", False, True if not values else None))
    return uses


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _unknown_flag(flag: str, origin: str, spec: ServerArgsSpec, recipe: Recipe | None) -> Exception:
    close = [f for f in spec.all_flags() if f.startswith(flag)][:4] if flag.startswith("--") else []
    close = close if len(close) > 1 else difflib.get_close_matches(flag, spec.all_flags(), n=3, cutoff=0.7)
    text = (
        f"{origin}: {flag} is not a flag of {spec.label}: its argument parser ({spec.package_dir}) has no such option."
    )
    if close:
        text += " Flags there with a similar name: " + ", ".join(close) + "."
    hint = "Flags are renamed and removed between SGLang releases."
    if recipe is not None:
        hint += f" The recipe was written for SGLang {', '.join(recipe.sglang)}."
        return RecipeError(text, hint=hint + " Update the recipe, or run the release it names.")
    return UsageError(text, hint=hint + " Check `python -m sglang.launch_server --help` of that release.")


def check_flags(uses: Sequence[FlagUse], spec: ServerArgsSpec, recipe: Recipe | None = None) -> list[str]:
    """Raise on the first use the parser rejects (named by origin and release); return warnings."""
    warnings: list[str] = []
    for use in uses:
        option = spec.option(use.flag)
        owner = recipe if use.from_recipe else None
        err = RecipeError if use.from_recipe else UsageError
        if option is None:
            raise _unknown_flag(use.flag, use.origin, spec, owner)
        if option.retired:
            raise err(f"{use.origin}: {use.flag} was retired in {spec.label}: {option.retired}")
        if option.deprecated:
            instead = f"; use {option.replacement} instead" if option.replacement else ""
            warnings.append(f"{use.origin}: {use.flag} is deprecated in {spec.label}{instead}.")
        if not option.takes_value and use.values:
            raise err(
                f"{use.origin}: {use.flag} is a switch in {spec.label} and takes no value "
                f"(given {' '.join(use.values)}).",
                hint="In a recipe write `name = true`." if use.from_recipe else None,
            )
        if option.takes_value and not use.values and option.nargs != "?":
            raise err(
                f"{use.origin}: {use.flag} needs a value in {spec.label}"
                + (" (the recipe has `true`)." if use.from_recipe else ".")
            )
        if len(use.values) > 1 and not option.many:
            raise err(f"{use.origin}: {use.flag} takes one value in {spec.label}, not a list of {len(use.values)}.")
        for value in use.values:
            if option.choices is not None and value not in option.choices:
                raise err(
                    f"{use.origin}: {value!r} is not a choice of {use.flag} in {spec.label}. "
                    f"Choices: {', '.join(option.choices)}."
                )
            if option.type in ("int", "float"):
                try:
                    (int if option.type == "int" else float)(value)
                except ValueError:
                    raise err(
                        f"{use.origin}: {use.flag} wants {'an integer' if option.type == 'int' else 'a number'}"
                        f" in {spec.label}, not {value!r}."
                    )
    return warnings


def merge_flags(
    recipe_uses: Sequence[FlagUse], extra: Sequence[FlagUse], spec: ServerArgsSpec
) -> tuple[list[FlagUse], list[str]]:
    """Recipe flags in file order, an extra flag replacing the recipe's flag with the same destination."""
    dest_of = {f: o.dest for o in spec.options for f in o.flags}
    extra_dests = {dest_of.get(u.flag): u for u in extra}
    merged: list[FlagUse] = []
    overrides: list[str] = []
    for use in recipe_uses:
        replaced = extra_dests.get(dest_of.get(use.flag))
        if replaced is not None:
            overrides.append(f"{' '.join(replaced.argv)} (command line) replaces {' '.join(use.argv)} ({use.origin})")
            continue
        merged.append(use)
    return merged + list(extra), overrides
