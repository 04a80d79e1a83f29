"""Serving recipes: the TOML model of a model on a set of SM120 GPUs, loaded strictly.

A recipe is a TOML file under ``recipes/serve/`` (data, not code). Loading is strict: an unknown key, a
missing note or a malformed value is a :class:`RecipeError` naming the file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from sm120kit.errors import RecipeError, UsageError
from sm120kit.hardware import arch
from sm120kit.util import tomldoc
from sm120kit.util.resources import recipes_dir
from sm120kit.util.suggest import did_you_mean

SERVE_SUBDIR = "serve"

# Backends that hold no SM120 code (sources in the recipe notes and docs/sm120-facts): choosing one on a
# 12.x GPU fails at start or inside a kernel. A recipe may not pick them; an extra flag that does is
# warned about.
NO_SM120_CODE: dict[str, frozenset[str]] = {
    "attention-backend": frozenset({"fa3", "trtllm_mla", "cutlass_mla", "flashmla"}),
    "prefill-attention-backend": frozenset({"fa3", "trtllm_mla", "cutlass_mla", "flashmla"}),
    "decode-attention-backend": frozenset({"fa3", "trtllm_mla", "cutlass_mla", "flashmla"}),
    "fp4-gemm-backend": frozenset({"flashinfer_trtllm"}),
}

_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


# --------------------------------------------------------------------------------------------------------
# The recipe model
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuSpec:
    count: int
    names: tuple[str, ...]  # what nvidia-smi calls the card, matched as a case-insensitive substring
    capability: tuple[int, int]
    memory_gib: int | None = None

    @property
    def label(self) -> str:
        return f"{self.count}× {' / '.join(self.names)} ({self.capability[0]}.{self.capability[1]})"

    def to_json(self) -> dict:
        return {
            "count": self.count,
            "names": list(self.names),
            "capability": f"{self.capability[0]}.{self.capability[1]}",
            "memory_gib": self.memory_gib,
        }


@dataclass(frozen=True)
class Setting:
    """One SGLang flag (``name`` without dashes) or one environment variable, with its line in the file."""

    name: str
    value: Any
    line: int | None


@dataclass(frozen=True)
class Note:
    why: str
    sources: tuple[str, ...]
    slow: str | None = None  # why the setting stays although `sm120kit explain` reports it slow on 12.x
    # whether the value was measured, where and how ("not measured: ..." or what `bench-allreduce` wrote)
    measured: str | None = None

    def to_json(self) -> dict:
        data = {"why": self.why, "sources": list(self.sources)}
        if self.slow is not None:
            data["slow"] = self.slow
        if self.measured is not None:
            data["measured"] = self.measured
        return data


MEASURED_PREFIXES = ("NCCL_",)
"""Environment variables whose note must say whether their value was measured (``measured = "..."``): NCCL's
tuning knobs differ by machine, and a value copied from elsewhere must say so."""


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    description: str
    path: Path
    sglang: tuple[str, ...]  # the releases it was written for and is tested against
    model: str
    model_info: dict[str, str]
    gpus: GpuSpec
    flags: tuple[Setting, ...]
    env: tuple[Setting, ...]
    notes: dict[str, Note]
    hidden_size: int | None = None  # [model].hidden_size: the width of each tensor-parallel all-reduce
    layers: int | None = None  # [model].layers: decoder layers (two all-reduces each per decode step)

    def where(self, line: int | None) -> str:
        return tomldoc.location(self.path, line)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "file": str(self.path),
            "sglang": list(self.sglang),
            "model": {
                "path": self.model,
                **self.model_info,
                **({"hidden_size": self.hidden_size} if self.hidden_size else {}),
                **({"layers": self.layers} if self.layers else {}),
            },
            "gpus": self.gpus.to_json(),
            "flags": {s.name: s.value for s in self.flags},
            "env": {s.name: s.value for s in self.env},
            "notes": {k: v.to_json() for k, v in self.notes.items()},
        }


# --------------------------------------------------------------------------------------------------------
# Strict TOML reading with line numbers (sm120kit.util.tomldoc)
# --------------------------------------------------------------------------------------------------------
_WORDING = tomldoc.Wording(
    missing="Cannot read the recipe {file}: {reason}.",
    unreadable="Cannot read the recipe {file}: {reason}.",
    position_first=False,
    keys_hint="Keys allowed there: {keys}.",
    sorted_keys=True,
)


def read_toml(path: Path) -> tomldoc.Doc:
    """A TOML file of recipe data, read strictly (errors worded as for a recipe)."""
    return tomldoc.read(path, RecipeError, _WORDING)


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------
_TOP = {
    "name": (str,),
    "title": (str,),
    "description": (str,),
    "sglang": (list,),
    "model": (dict,),
    "gpus": (dict,),
    "flags": (dict,),
    "env": (dict,),
    "notes": (dict,),
}
_MODEL = {"path": (str,), "architecture": (str,), "quantization": (str,), "hidden_size": (int,), "layers": (int,)}
_GPUS = {"count": (int,), "names": (list,), "capability": (str,), "memory_gib": (int,)}
_NOTE = {"why": (str,), "sources": (list,), "slow": (str,), "measured": (str,)}
_FLAG_VALUE = (str, int, float, bool, list)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate one recipe file; :class:`RecipeError` (file:line) on anything wrong."""
    path = Path(path)
    doc = read_toml(path)
    data = doc.data
    tomldoc.check_keys(
        doc, data, (), _TOP, ("name", "title", "description", "sglang", "model", "gpus", "flags", "notes")
    )
    name = data["name"]
    if name != path.stem:
        raise doc.fail(
            ("name",),
            f"name '{name}' differs from the file name '{path.stem}'.",
            hint="A recipe is called by its file name; make them the same.",
        )

    releases: list[str] = []
    if not data["sglang"]:
        raise doc.fail(("sglang",), "'sglang' must list at least one SGLang release the recipe was written for.")
    for item in data["sglang"]:
        try:
            if not isinstance(item, str):
                raise InvalidVersion(str(item))
            Version(item)
        except InvalidVersion:
            raise doc.fail(("sglang",), f"'{item}' in 'sglang' is not a release version (like \"0.5.23\").")
        releases.append(item)

    model = data["model"]
    tomldoc.check_keys(doc, model, ("model",), _MODEL, ("path", "architecture", "quantization"))
    for key in ("hidden_size", "layers"):
        if key in model and (isinstance(model[key], bool) or model[key] < 1):
            raise doc.fail(("model", key), f"model.{key} must be a positive integer, not {model[key]!r}.")

    gpus = data["gpus"]
    tomldoc.check_keys(doc, gpus, ("gpus",), _GPUS, ("count", "names", "capability"))
    if gpus["count"] < 1:
        raise doc.fail(("gpus", "count"), f"gpus.count must be at least 1, not {gpus['count']}.")
    if not gpus["names"] or not all(isinstance(n, str) and n.strip() for n in gpus["names"]):
        raise doc.fail(("gpus", "names"), 'gpus.names must list the card names as strings, e.g. ["RTX 5090"].')
    try:
        capability = arch.parse_capability(gpus["capability"])
    except ValueError:
        raise doc.fail(
            ("gpus", "capability"), f"gpus.capability '{gpus['capability']}' is not a compute capability like \"12.0\"."
        )
    if arch.family(capability) is None:
        raise doc.fail(
            ("gpus", "capability"),
            f"gpus.capability {gpus['capability']} is not a GPU family "
            f"sm120kit knows ({', '.join(f.label for f in arch.FAMILIES.values())}).",
        )

    flags: list[Setting] = []
    for key, value in data["flags"].items():
        where = ("flags", key)
        if key.startswith("-") or not _FLAG_NAME.match(key):
            raise doc.fail(
                where,
                f"flag '{key}' must be written without dashes in lower case, e.g. attention-backend = \"triton\".",
            )
        if key in ("model-path", "model"):
            raise doc.fail(
                where,
                f"'{key}' does not belong in [flags]; the model is [model].path "
                "(and `sm120kit serve --model PATH` replaces it).",
            )
        if not isinstance(value, _FLAG_VALUE) or isinstance(value, dict):
            raise doc.fail(where, f"the value of flag '{key}' must be a string, number, true or an array.")
        if value is False:
            raise doc.fail(
                where,
                f"flag '{key}' is false: a switch is either given (true) or left out.",
                hint="Remove the line, or set it to true.",
            )
        if isinstance(value, list) and (
            not value or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
        ):
            raise doc.fail(where, f"flag '{key}' must be a non-empty array of strings or numbers.")
        flags.append(Setting(key, value, doc.lines.line_of(where)))

    env: list[Setting] = []
    for key, value in data.get("env", {}).items():
        where = ("env", key)
        if not _ENV_NAME.match(key):
            raise doc.fail(where, f"'{key}' is not an environment variable name (upper case, digits, _).")
        if not isinstance(value, str):
            raise doc.fail(
                where,
                f"environment variable {key} must be a string, not {doc.wording.type_name(type(value))}.",
                hint=f'Write it quoted: {key} = "{value}".',
            )
        env.append(Setting(key, value, doc.lines.line_of(where)))

    notes: dict[str, Note] = {}
    settings = {s.name for s in flags} | {s.name for s in env} | {"model", "gpus"}
    for key, raw in data["notes"].items():
        where = ("notes", key)
        if key not in settings:
            raise doc.fail(
                where,
                f"the note '{key}' is about no setting of this recipe." + did_you_mean(key, settings),
                hint="A note's key is a flag name, an environment variable, 'model' or 'gpus'.",
            )
        if not isinstance(raw, dict):
            raise doc.fail(where, f"notes.{key} must be a table with 'why' and 'sources'.")
        tomldoc.check_keys(doc, raw, where, _NOTE, ("why", "sources"))
        sources = raw["sources"]
        if not sources:
            raise doc.fail(where + ("sources",), f"notes.{key}.sources is empty: cite at least one URL.")
        for src in sources:
            if not isinstance(src, str) or not src.startswith("https://"):
                raise doc.fail(where + ("sources",), f"source {src!r} of notes.{key} is not an https:// URL.")
        slow = raw.get("slow")
        if slow is not None and not slow.strip():
            raise doc.fail(where + ("slow",), f"notes.{key}.slow is empty: say why the slow setting stays.")
        measured = raw.get("measured")
        if measured is not None and not measured.strip():
            raise doc.fail(
                where + ("measured",), f"notes.{key}.measured is empty: say whether and where the value was measured."
            )
        if measured is None and key.startswith(MEASURED_PREFIXES) and key in {s.name for s in env}:
            raise doc.fail(
                where,
                f"the note of {key} does not say whether its value was measured.",
                hint=f'Add measured = "not measured: ..." (where the value comes from) to '
                f"[notes.{key}], or let `sm120kit bench-allreduce --write-recipe` measure it.",
            )
        notes[key] = Note(
            raw["why"].strip(),
            tuple(sources),
            slow.strip() if slow is not None else None,
            measured.strip() if measured is not None else None,
        )
    for setting in flags + env:
        if setting.name not in notes:
            kind = "flag" if setting in flags else "environment variable"
            raise RecipeError(
                f"{tomldoc.location(path, setting.line)}: the {kind} '{setting.name}' has no "
                "note saying why it is set.",
                hint=f"Add a [notes.\"{setting.name}\"] table with 'why' and 'sources'.",
            )

    tp = next((s for s in flags if s.name in ("tp-size", "tp", "tensor-parallel-size")), None)
    if tp is not None and isinstance(tp.value, int) and tp.value > gpus["count"]:
        raise RecipeError(
            f"{tomldoc.location(path, tp.line)}: tensor parallel size {tp.value} is more than "
            f"the {gpus['count']} GPU(s) in [gpus]."
        )
    if arch.is_sm12x(capability):
        for setting in flags:
            banned = NO_SM120_CODE.get(setting.name, frozenset())
            if isinstance(setting.value, str) and setting.value in banned:
                raise RecipeError(
                    f"{tomldoc.location(path, setting.line)}: {setting.name} = "
                    f'"{setting.value}" has no code for compute capability 12.x.',
                    hint="Pick a backend that runs on SM120 (attention: triton or flashinfer).",
                )

    return Recipe(
        name=name,
        title=data["title"].strip(),
        description=data["description"].strip(),
        path=path,
        sglang=tuple(releases),
        model=model["path"],
        model_info={"architecture": model["architecture"], "quantization": model["quantization"]},
        gpus=GpuSpec(gpus["count"], tuple(gpus["names"]), capability, gpus.get("memory_gib")),
        flags=tuple(flags),
        env=tuple(env),
        notes=notes,
        hidden_size=model.get("hidden_size"),
        layers=model.get("layers"),
    )


def serve_dir(base: Path | None = None) -> Path:
    return (base or recipes_dir()) / SERVE_SUBDIR


def list_recipes(folder: Path | None = None) -> list[Recipe]:
    """Every recipe in ``folder`` (default: the shipped ``recipes/serve``), loaded strictly, by name."""
    folder = folder or serve_dir()
    if not folder.is_dir():
        raise RecipeError(
            f"The recipe folder {folder} does not exist.",
            hint="Reinstall sm120kit, or run from a checkout that has recipes/serve/.",
        )
    return [load_recipe(p) for p in sorted(folder.glob("*.toml"))]


def find_recipe(name_or_path: str, folder: Path | None = None) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    given = Path(name_or_path).expanduser()
    if given.suffix == ".toml" or os.sep in name_or_path:
        if not given.is_file():
            raise UsageError(f"The recipe file {given} does not exist.")
        return load_recipe(given)
    folder = folder or serve_dir()
    path = folder / f"{name_or_path}.toml"
    if not path.is_file():
        names = sorted(p.stem for p in folder.glob("*.toml"))
        raise UsageError(
            f"There is no recipe called '{name_or_path}'.{did_you_mean(name_or_path, names)}",
            hint=f"Recipes: {', '.join(names) or 'none'} (sm120kit recipes lists them).",
        )
    return load_recipe(path)
