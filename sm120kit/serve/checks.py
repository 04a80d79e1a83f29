"""Static checks of a recipe against one release: its flags and switches, and the slow-settings rules.

Used by ``sm120kit recipes --check`` and the tests; :func:`check_slow` applies
:mod:`sm120kit.audit.slow_settings` to the settings a recipe names.
"""

from __future__ import annotations

from sm120kit.errors import RecipeError
from sm120kit.serve.env import check_env
from sm120kit.serve.flags import check_flags, recipe_flags
from sm120kit.serve.recipe import Recipe
from sm120kit.serve.server_args import ServerArgsSpec


def slow_settings_of(recipe: Recipe, spec: ServerArgsSpec, given: dict | None) -> list:
    """The settings of ``recipe`` that run on its GPUs but slowly (or have no SM120 code) in ``spec``'s
    release, per :mod:`sm120kit.audit.slow_settings`. ``given`` is what the release's parser read from the
    recipe's command line (``ServerArgsSpec.argv_given``); the backends are the ones the recipe names (SGLang's
    own choices need the model's config: ``sm120kit explain``)."""
    from sm120kit.audit import slow_settings
    from sm120kit.hardware.fake_device import PRESETS

    cap = f"{recipe.gpus.capability[0]}.{recipe.gpus.capability[1]}"
    device = PRESETS.get(cap)
    given = dict(given or {})
    ctx = slow_settings.Context(
        release=spec.version,
        capability=cap,
        package_dir=spec.package_dir,
        given=given,
        values=slow_settings.backend_values(given),
        env={s.name: s.value for s in recipe.env},
        attention=slow_settings.attention_kind_from_text(recipe.model_info.get("architecture", "")),
        sm_count=device.multi_processor_count if device else None,
    )
    return list(slow_settings.find(ctx))


def check_slow(recipe: Recipe, spec: ServerArgsSpec, given: dict | None) -> list[str]:
    """A RecipeError for a slow setting without a note saying why it is there (a ``slow`` entry in the note of
    one of the settings involved) and for a hand-chosen backend with no SM120 code; the kept ones as warnings."""
    from sm120kit.audit import slow_settings

    kept: list[str] = []
    for finding in slow_settings_of(recipe, spec, given):
        line = next(
            (
                s.line
                for s in (*recipe.flags, *recipe.env)
                if s.name in finding.recipe_keys or "--" + s.name == finding.setting or s.name == finding.setting
            ),
            None,
        )
        excuse = next(
            (recipe.notes[k].slow for k in finding.recipe_keys if k in recipe.notes and recipe.notes[k].slow), None
        )
        if finding.severity == slow_settings.SLOW and excuse:
            kept.append(f"{recipe.where(line)}: {finding} runs slowly on 12.x in {spec.label}, kept: {excuse}")
            continue
        if finding.severity == slow_settings.SLOW:
            key = finding.recipe_keys[0] if finding.recipe_keys else finding.setting
            raise RecipeError(
                f"{recipe.where(line)}: {finding} runs on 12.x but slowly in {spec.label}: {finding.why} "
                f"[source: {finding.source}]",
                hint=f'{finding.fix} If the setting is deliberate, say why in [notes."{key}"] slow = "...".',
            )
        if finding.severity == slow_settings.OVER_SMEM:
            raise RecipeError(
                f"{recipe.where(line)}: {finding} makes a kernel of {spec.label} need more shared memory per block "
                f"than a {recipe.gpus.capability[0]}.{recipe.gpus.capability[1]} GPU has (the largest value that "
                f"fits: {finding.largest_fitting}): {finding.why} [source: {finding.source}]",
                hint=finding.fix,
            )
        raise RecipeError(
            f"{recipe.where(line)}: {finding} has no SM120 code in {spec.label}: {finding.why}", hint=finding.fix
        )
    return kept


def validate_against(recipe: Recipe, spec: ServerArgsSpec) -> list[str]:
    """Static check of a recipe against one release's parser (used by tests and `recipes --check`)."""
    warnings = check_flags(recipe_flags(recipe), spec, recipe)
    check_env(recipe, spec)
    return warnings
