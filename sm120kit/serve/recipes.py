"""Serving recipes: a model on a set of SM120 GPUs -> the SGLang launch command and its environment.

A recipe is a TOML file under ``recipes/serve/`` (data, not code). Loading is strict: an unknown key, a
missing note or a malformed value is a :class:`RecipeError` naming the file and line. Before anything is
launched, every flag is checked against the argument parser of the SGLang that will run it: a small
probe runs in that Python (``PYTHONPATH`` at the tree when a tree is given), builds SGLang's own parser
with ``ServerArgs.add_cli_args`` and reports its options; an unknown or retired flag is an error naming
the release. Environment switches named ``SGLANG_*`` must be read somewhere in that release's source.

The flow is the usual one: :func:`load_recipe` -> :func:`plan_launch` (reads the parser, checks, builds
argv and environment; no side effects) -> :func:`launch` (``os.execvpe``), so ``--dry-run`` is the plan.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from packaging.version import InvalidVersion, Version

from sm120kit import runner
from sm120kit.hardware import arch
from sm120kit.util import tomldoc
from sm120kit.errors import MissingDependency, RecipeError, UsageError
from sm120kit.util.resources import patches_dir, recipes_dir
from sm120kit.util.suggest import did_you_mean

SERVE_SUBDIR = "serve"
LAUNCH_MODULE = "sglang.launch_server"

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
        return {"count": self.count, "names": list(self.names),
                "capability": f"{self.capability[0]}.{self.capability[1]}", "memory_gib": self.memory_gib}


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

    def to_json(self) -> dict:
        data = {"why": self.why, "sources": list(self.sources)}
        if self.slow is not None:
            data["slow"] = self.slow
        return data


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

    def where(self, line: int | None) -> str:
        return tomldoc.location(self.path, line)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "file": str(self.path),
            "sglang": list(self.sglang),
            "model": {"path": self.model, **self.model_info},
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


def _read(path: Path) -> tomldoc.Doc:
    return tomldoc.read(path, RecipeError, _WORDING)


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------
_TOP = {"name": (str,), "title": (str,), "description": (str,), "sglang": (list,), "model": (dict,),
        "gpus": (dict,), "flags": (dict,), "env": (dict,), "notes": (dict,)}
_MODEL = {"path": (str,), "architecture": (str,), "quantization": (str,)}
_GPUS = {"count": (int,), "names": (list,), "capability": (str,), "memory_gib": (int,)}
_NOTE = {"why": (str,), "sources": (list,), "slow": (str,)}
_FLAG_VALUE = (str, int, float, bool, list)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate one recipe file; :class:`RecipeError` (file:line) on anything wrong."""
    path = Path(path)
    doc = _read(path)
    data = doc.data
    tomldoc.check_keys(doc, data, (), _TOP, ("name", "title", "description", "sglang", "model", "gpus",
                                             "flags", "notes"))
    name = data["name"]
    if name != path.stem:
        raise doc.fail(("name",), f"name '{name}' differs from the file name '{path.stem}'.",
                       hint="A recipe is called by its file name; make them the same.")

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

    gpus = data["gpus"]
    tomldoc.check_keys(doc, gpus, ("gpus",), _GPUS, ("count", "names", "capability"))
    if gpus["count"] < 1:
        raise doc.fail(("gpus", "count"), f"gpus.count must be at least 1, not {gpus['count']}.")
    if not gpus["names"] or not all(isinstance(n, str) and n.strip() for n in gpus["names"]):
        raise doc.fail(("gpus", "names"), "gpus.names must list the card names as strings, e.g. [\"RTX 5090\"].")
    try:
        capability = arch.parse_capability(gpus["capability"])
    except ValueError:
        raise doc.fail(("gpus", "capability"), f"gpus.capability '{gpus['capability']}' is not a compute "
                       "capability like \"12.0\".")
    if arch.family(capability) is None:
        raise doc.fail(("gpus", "capability"), f"gpus.capability {gpus['capability']} is not a GPU family "
                       f"sm120kit knows ({', '.join(f.label for f in arch.FAMILIES.values())}).")

    flags: list[Setting] = []
    for key, value in data["flags"].items():
        where = ("flags", key)
        if key.startswith("-") or not _FLAG_NAME.match(key):
            raise doc.fail(where, f"flag '{key}' must be written without dashes in lower case, "
                           f"e.g. attention-backend = \"triton\".")
        if key in ("model-path", "model"):
            raise doc.fail(where, f"'{key}' does not belong in [flags]; the model is [model].path "
                           "(and `sm120kit serve --model PATH` replaces it).")
        if not isinstance(value, _FLAG_VALUE) or isinstance(value, dict):
            raise doc.fail(where, f"the value of flag '{key}' must be a string, number, true or an array.")
        if value is False:
            raise doc.fail(where, f"flag '{key}' is false: a switch is either given (true) or left out.",
                           hint="Remove the line, or set it to true.")
        if isinstance(value, list) and (not value or not all(isinstance(v, (str, int, float)) and
                                                             not isinstance(v, bool) for v in value)):
            raise doc.fail(where, f"flag '{key}' must be a non-empty array of strings or numbers.")
        flags.append(Setting(key, value, doc.lines.line_of(where)))

    env: list[Setting] = []
    for key, value in data.get("env", {}).items():
        where = ("env", key)
        if not _ENV_NAME.match(key):
            raise doc.fail(where, f"'{key}' is not an environment variable name (upper case, digits, _).")
        if not isinstance(value, str):
            raise doc.fail(where, f"environment variable {key} must be a string, "
                                  f"not {doc.wording.type_name(type(value))}.",
                           hint=f'Write it quoted: {key} = "{value}".')
        env.append(Setting(key, value, doc.lines.line_of(where)))

    notes: dict[str, Note] = {}
    settings = {s.name for s in flags} | {s.name for s in env} | {"model", "gpus"}
    for key, raw in data["notes"].items():
        where = ("notes", key)
        if key not in settings:
            raise doc.fail(where, f"the note '{key}' is about no setting of this recipe."
                           + did_you_mean(key, settings),
                           hint="A note's key is a flag name, an environment variable, 'model' or 'gpus'.")
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
        notes[key] = Note(raw["why"].strip(), tuple(sources), slow.strip() if slow is not None else None)
    for setting in flags + env:
        if setting.name not in notes:
            kind = "flag" if setting in flags else "environment variable"
            raise RecipeError(f"{tomldoc.location(path, setting.line)}: the {kind} '{setting.name}' has no "
                              "note saying why it is set.",
                              hint=f"Add a [notes.\"{setting.name}\"] table with 'why' and 'sources'.")

    tp = next((s for s in flags if s.name in ("tp-size", "tp", "tensor-parallel-size")), None)
    if tp is not None and isinstance(tp.value, int) and tp.value > gpus["count"]:
        raise RecipeError(f"{tomldoc.location(path, tp.line)}: tensor parallel size {tp.value} is more than "
                          f"the {gpus['count']} GPU(s) in [gpus].")
    if capability[0] == 12:
        for setting in flags:
            banned = NO_SM120_CODE.get(setting.name, frozenset())
            if isinstance(setting.value, str) and setting.value in banned:
                raise RecipeError(f"{tomldoc.location(path, setting.line)}: {setting.name} = "
                                  f"\"{setting.value}\" has no code for compute capability 12.x.",
                                  hint="Pick a backend that runs on SM120 (attention: triton or flashinfer).")

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
    )


def serve_dir(base: Path | None = None) -> Path:
    return (base or recipes_dir()) / SERVE_SUBDIR


def list_recipes(folder: Path | None = None) -> list[Recipe]:
    """Every recipe in ``folder`` (default: the shipped ``recipes/serve``), loaded strictly, by name."""
    folder = folder or serve_dir()
    if not folder.is_dir():
        raise RecipeError(f"The recipe folder {folder} does not exist.",
                          hint="Reinstall sm120kit, or run from a checkout that has recipes/serve/.")
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
        raise UsageError(f"There is no recipe called '{name_or_path}'.{did_you_mean(name_or_path, names)}",
                         hint=f"Recipes: {', '.join(names) or 'none'} (sm120kit recipes lists them).")
    return load_recipe(path)


# --------------------------------------------------------------------------------------------------------
# SGLang's own argument parser, read in the Python that will run the server
# --------------------------------------------------------------------------------------------------------
_PROBE = r'''
import argparse, json, os, sys, traceback
out_path, argvs = sys.argv[1], json.loads(sys.argv[2])
result = {"python": sys.executable, "argv_errors": []}
def dump():
    with open(out_path, "w") as fh:
        json.dump(result, fh)
try:
    import sglang
    result["package_dir"] = os.path.dirname(os.path.abspath(sglang.__file__))
    try:
        from sglang.version import __version__ as v
    except Exception:
        v = None
    result["version"] = v
    from sglang.srt.server_args import ServerArgs
except BaseException as exc:
    result["import_error"] = "%s: %s" % (type(exc).__name__, exc)
    result["traceback"] = traceback.format_exc()[-3000:]
    dump()
    sys.exit(0)

class Stop(Exception):
    pass

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Stop(message)
    def exit(self, status=0, message=None):
        raise Stop(message or "exit %s" % status)

parser = Parser(prog="python -m sglang.launch_server")
ServerArgs.add_cli_args(parser)
options = []
for a in parser._actions:
    if not a.option_strings or isinstance(a, argparse._HelpAction):
        continue
    kind = type(a).__name__
    options.append({
        "flags": list(a.option_strings),
        "dest": a.dest,
        "nargs": a.nargs if a.nargs is None or isinstance(a.nargs, int) else str(a.nargs),
        "required": bool(a.required),
        "choices": [str(c) for c in a.choices] if a.choices is not None else None,
        "type": a.type.__name__ if a.type in (int, float, str) else None,
        "deprecated": "Deprecat" in kind or bool(getattr(a, "deprecated", False)),
        "retired": getattr(a, "error_message", None),
        "replacement": getattr(a, "new_flag", None),
    })
result["options"] = options
result["argv_given"] = []
def plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, (str, int)) else str(v)
for argv in argvs:
    try:
        parser.parse_args(argv)
        result["argv_errors"].append(None)
    except Stop as exc:
        result["argv_errors"].append(str(exc))
    except BaseException as exc:
        result["argv_errors"].append("%s: %s" % (type(exc).__name__, exc))
    # what the line sets explicitly: the same parser with every default suppressed
    saved = [(a, a.default, a.required) for a in parser._actions]
    try:
        for a in parser._actions:
            a.default, a.required = argparse.SUPPRESS, False
        ns, _ = parser.parse_known_args(argv)
        result["argv_given"].append({k: plain(v) for k, v in vars(ns).items() if k != "model_path"})
    except BaseException:
        result["argv_given"].append(None)
    finally:
        for a, default, required in saved:
            a.default, a.required = default, required
dump()
'''


@dataclass(frozen=True)
class ServerOption:
    flags: tuple[str, ...]
    dest: str
    nargs: int | str | None
    choices: tuple[str, ...] | None
    type: str | None
    deprecated: bool
    retired: str | None
    replacement: str | None

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0

    @property
    def many(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)


@dataclass(frozen=True)
class ServerArgsSpec:
    """SGLang's launch flags as its own parser defines them, in one release."""

    version: str | None
    package_dir: Path
    python: str
    options: tuple[ServerOption, ...]
    argv_errors: tuple[str | None, ...] = ()
    argv_given: tuple[dict | None, ...] = ()  # per argv: {destination: value} it sets explicitly

    @property
    def label(self) -> str:
        return f"SGLang {self.version or '(unknown release)'}"

    def option(self, flag: str) -> ServerOption | None:
        return self._by_flag().get(flag)

    def _by_flag(self) -> dict[str, ServerOption]:
        cache = self.__dict__.get("_flag_cache")
        if cache is None:
            cache = {f: o for o in self.options for f in o.flags}
            object.__setattr__(self, "_flag_cache", cache)
        return cache

    def all_flags(self) -> list[str]:
        return sorted(self._by_flag())

    def expand(self, flag: str) -> str | None:
        """The full flag for an unambiguous prefix (argparse accepts those); None if none or several."""
        if flag in self._by_flag():
            return flag
        if not flag.startswith("--"):
            return None
        hits = {o.flags[0] for f, o in self._by_flag().items() if f.startswith(flag)}
        return hits.pop() if len(hits) == 1 else None


def read_server_args(python: str | None = None, sglang_root: Path | None = None,
                     argvs: Sequence[Sequence[str]] = (), console=None) -> ServerArgsSpec:
    """Build SGLang's argument parser in ``python`` (default: this interpreter) and describe its options.

    ``sglang_root`` is the folder holding ``sglang/`` (put first on ``PYTHONPATH``); without it, the sglang
    that ``python`` imports. Each argv in ``argvs`` is also parsed by that parser; its error (or None) is
    in ``argv_errors``.
    """
    python = python or sys.executable
    extra_env: dict[str, str] = {}
    if sglang_root is not None:
        old = os.environ.get("PYTHONPATH")
        extra_env["PYTHONPATH"] = str(sglang_root) + (os.pathsep + old if old else "")
    with tempfile.TemporaryDirectory(prefix="sm120kit-args-") as tmp:
        out = Path(tmp) / "args.json"
        where = f" at {sglang_root}" if sglang_root else ""
        title = f"reading SGLang's argument parser{where}"
        ctx = console.step(title) if console is not None else _null()
        with ctx:
            runner.run([python, "-c", _PROBE, str(out), json.dumps([list(a) for a in argvs])],
                       extra_env=extra_env, cwd=tmp, timeout=600, what="SGLang argument parser probe")
            try:
                data = json.loads(out.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise RecipeError(f"The SGLang argument parser probe in {python} wrote no result ({exc}).") \
                    from exc
            if "import_error" in data:
                raise MissingDependency(
                    f"{python} could not import SGLang's server arguments{where}: {data['import_error']}.",
                    hint="Install SGLang and its dependencies in that environment (for a bare release tree, "
                         "pip install 'sm120kit[audit]' brings what its argument parser imports), or pass "
                         "--python.",
                )
    options = tuple(
        ServerOption(tuple(o["flags"]), o["dest"], o["nargs"], tuple(o["choices"]) if o["choices"] else None,
                     o["type"], o["deprecated"], o["retired"], o["replacement"])
        for o in data["options"]
    )
    return ServerArgsSpec(version=data.get("version"), package_dir=Path(data["package_dir"]),
                          python=data["python"], options=options, argv_errors=tuple(data["argv_errors"]),
                          argv_given=tuple(data.get("argv_given", ())))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------------------------------------
# Flags: render, parse the extra ones, check against the parser
# --------------------------------------------------------------------------------------------------------
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


def _render(value: Any) -> tuple[str, ...]:
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
    return [FlagUse("--" + s.name, _render(s.value), recipe.where(s.line), True, s.value) for s in recipe.flags]


def parse_extra(tokens: Sequence[str], spec: ServerArgsSpec,
                abbreviations: list[str] | None = None) -> list[FlagUse]:
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
            raise UsageError(f"Unexpected argument '{token}' among the extra SGLang flags: every extra "
                             "argument must be a flag (--name) or the value of the flag before it.")
        flag, inline = (token.split("=", 1) + [None])[:2] if "=" in token else (token, None)
        full = spec.expand(flag)
        if full is None:
            raise _unknown_flag(flag, "the command line", spec, None)
        if full != flag:
            abbreviations.append(f"{flag} (command line) is read as {full}; write the full name, "
                                 "abbreviations change meaning when a release adds flags.")
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
    text = (f"{origin}: {flag} is not a flag of {spec.label}: its argument parser "
            f"({spec.package_dir}) has no such option.")
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
            raise err(f"{use.origin}: {use.flag} is a switch in {spec.label} and takes no value "
                      f"(given {' '.join(use.values)}).",
                      hint="In a recipe write `name = true`." if use.from_recipe else None)
        if option.takes_value and not use.values and option.nargs != "?":
            raise err(f"{use.origin}: {use.flag} needs a value in {spec.label}"
                      + (" (the recipe has `true`)." if use.from_recipe else "."))
        if len(use.values) > 1 and not option.many:
            raise err(f"{use.origin}: {use.flag} takes one value in {spec.label}, not a list of "
                      f"{len(use.values)}.")
        for value in use.values:
            if option.choices is not None and value not in option.choices:
                raise err(f"{use.origin}: {value!r} is not a choice of {use.flag} in {spec.label}. "
                          f"Choices: {', '.join(option.choices)}.")
            if option.type in ("int", "float"):
                try:
                    (int if option.type == "int" else float)(value)
                except ValueError:
                    raise err(f"{use.origin}: {use.flag} wants {'an integer' if option.type == 'int' else 'a number'}"
                              f" in {spec.label}, not {value!r}.")
    return warnings


def merge_flags(recipe_uses: Sequence[FlagUse], extra: Sequence[FlagUse],
                spec: ServerArgsSpec) -> tuple[list[FlagUse], list[str]]:
    """Recipe flags in file order, an extra flag replacing the recipe's flag with the same destination."""
    dest_of = {f: o.dest for o in spec.options for f in o.flags}
    extra_dests = {dest_of.get(u.flag): u for u in extra}
    merged: list[FlagUse] = []
    overrides: list[str] = []
    for use in recipe_uses:
        replaced = extra_dests.get(dest_of.get(use.flag))
        if replaced is not None:
            overrides.append(f"{' '.join(replaced.argv)} (command line) replaces {' '.join(use.argv)} "
                             f"({use.origin})")
            continue
        merged.append(use)
    return merged + list(extra), overrides


# --------------------------------------------------------------------------------------------------------
# Environment switches
# --------------------------------------------------------------------------------------------------------
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
                     "flags between releases. Update the recipe or run the release it names.")


# --------------------------------------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: tuple[int, int] | None
    memory_mib: int | None = None

    def to_json(self) -> dict:
        cap = f"{self.capability[0]}.{self.capability[1]}" if self.capability else None
        return {"name": self.name, "capability": cap, "memory_mib": self.memory_mib}


def detect_gpus() -> tuple[GpuInfo, ...] | None:
    """The NVIDIA GPUs ``nvidia-smi`` lists; None when nvidia-smi is absent or fails (no driver)."""
    if runner.which("nvidia-smi") is None:
        return None
    result = None
    # compute_cap is a query field of drivers from 510 on; older ones reject the whole query.
    for fields in ("name,compute_cap,memory.total", "name,memory.total"):
        result = runner.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                            check=False, timeout=60, what="nvidia-smi")
        if result.ok:
            break
    if result is None or not result.ok:
        return None
    with_cap = "compute_cap" in result.argv[1]
    gpus = []
    for line in result.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not parts or not parts[0]:
            continue
        cap = None
        if with_cap and len(parts) > 1:
            try:
                cap = arch.parse_capability(parts[1])
            except ValueError:
                cap = None
        mem_text = parts[2 if with_cap else 1] if len(parts) > (2 if with_cap else 1) else ""
        gpus.append(GpuInfo(parts[0], cap, int(mem_text) if mem_text.isdigit() else None))
    return tuple(gpus)


def check_gpus(spec: GpuSpec, found: Sequence[GpuInfo] | None) -> list[str]:
    """Warnings when the GPUs present do not match what the recipe was written for."""
    if found is None:
        return [f"no NVIDIA GPU found (nvidia-smi is not on PATH or failed); the recipe expects {spec.label}."]
    warnings = []
    if len(found) < spec.count:
        warnings.append(f"{len(found)} GPU(s) found, the recipe expects {spec.count} ({spec.label}).")
    for i, gpu in enumerate(found[: spec.count]):
        if not any(n.lower() in gpu.name.lower() for n in spec.names):
            warnings.append(f"GPU {i} is '{gpu.name}', the recipe was written for {' / '.join(spec.names)}.")
        if gpu.capability is not None and gpu.capability != spec.capability:
            have = f"{gpu.capability[0]}.{gpu.capability[1]}"
            want = f"{spec.capability[0]}.{spec.capability[1]}"
            warnings.append(f"GPU {i} has compute capability {have}, the recipe is for {want}.")
    return warnings


# --------------------------------------------------------------------------------------------------------
# The launch plan
# --------------------------------------------------------------------------------------------------------
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
    gpus: tuple[GpuInfo, ...] | None
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
            "sglang": {"version": self.sglang_version, "package_dir": str(self.sglang_dir),
                       "named_by_recipe": self.release_named, "recipe_releases": list(self.recipe.sglang)},
            "argv": list(self.argv),
            "env": self.env,
            "kept_env": self.kept_env,
            "command": self.command,
            "overrides": list(self.overrides),
            "warnings": list(self.warnings),
            "gpus": None if self.gpus is None else [g.to_json() for g in self.gpus],
            "expected_gpus": self.recipe.gpus.to_json(),
        }


def plan_launch(recipe: Recipe, *, model: str | None = None, extra: Sequence[str] = (),
                python: str | None = None, sglang_root: Path | None = None,
                gpus: Sequence[GpuInfo] | None | str = "detect", console=None) -> LaunchPlan:
    """Check ``recipe`` (and the ``extra`` flags) against the SGLang that will run it; build the command.

    No side effects: the result is what ``--dry-run`` prints and what :func:`launch` executes.
    """
    python = python or sys.executable
    base_argv = [python, "-m", LAUNCH_MODULE, "--model-path", model or recipe.model]
    rflags = recipe_flags(recipe)
    raw_argv = base_argv[3:] + [t for u in rflags for t in u.argv] + list(extra)
    spec = read_server_args(python, sglang_root, [raw_argv], console=console)

    warnings: list[str] = []
    if spec.version not in recipe.sglang:
        warnings.append(f"{spec.label} is installed; the recipe was written for SGLang "
                        f"{', '.join(recipe.sglang)}.")
    warnings += check_flags(rflags, spec, recipe)
    extra_uses = parse_extra(extra, spec, warnings)
    warnings += check_flags(extra_uses, spec, None)
    if recipe.gpus.capability[0] == 12:
        for use in extra_uses:
            banned = NO_SM120_CODE.get(use.flag.lstrip("-"), frozenset())
            if any(v in banned for v in use.values):
                warnings.append(f"{' '.join(use.argv)}: that backend has no code for compute capability 12.x.")
    check_env(recipe, spec)
    if spec.argv_errors and spec.argv_errors[0]:
        raise UsageError(f"{spec.label}'s argument parser rejects the command: {spec.argv_errors[0]}",
                         hint="Fix the recipe or the extra flags.")
    merged, overrides = merge_flags(rflags, extra_uses, spec)

    added: dict[str, str] = {}
    kept: dict[str, str] = {}
    for setting in recipe.env:
        current = os.environ.get(setting.name)
        if current is not None and current != setting.value:
            kept[setting.name] = current
            warnings.append(f"{setting.name}={current} from your environment is kept "
                            f"(the recipe sets {setting.value}).")
        elif current is None:
            added[setting.name] = setting.value
    if sglang_root is not None:
        old = os.environ.get("PYTHONPATH")
        added["PYTHONPATH"] = str(sglang_root) + (os.pathsep + old if old else "")

    found = detect_gpus() if gpus == "detect" else gpus
    warnings += check_gpus(recipe.gpus, found)  # type: ignore[arg-type]

    argv = tuple(base_argv + [t for u in merged for t in u.argv])
    return LaunchPlan(recipe=recipe, sglang_version=spec.version, sglang_dir=spec.package_dir, argv=argv,
                      env=added, kept_env=kept, overrides=tuple(overrides), warnings=tuple(warnings),
                      gpus=None if found is None else tuple(found),  # type: ignore[arg-type]
                      release_named=spec.version in recipe.sglang)


def launch(plan: LaunchPlan) -> None:  # pragma: no cover - replaces the process
    """Replace this process with the SGLang server (signals then reach SGLang directly)."""
    runner.log.info("+ %s", plan.command)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(plan.argv[0], list(plan.argv), plan.full_env())


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
        release=spec.version, capability=cap, package_dir=spec.package_dir, given=given,
        values=slow_settings.backend_values(given), env={s.name: s.value for s in recipe.env},
        attention=slow_settings.attention_kind_from_text(recipe.model_info.get("architecture", "")),
        sm_count=device.multi_processor_count if device else None)
    return list(slow_settings.find(ctx))


def check_slow(recipe: Recipe, spec: ServerArgsSpec, given: dict | None) -> list[str]:
    """A RecipeError for a slow setting without a note saying why it is there (a ``slow`` entry in the note of
    one of the settings involved) and for a hand-chosen backend with no SM120 code; the kept ones as warnings."""
    from sm120kit.audit import slow_settings

    kept: list[str] = []
    for finding in slow_settings_of(recipe, spec, given):
        line = next((s.line for s in (*recipe.flags, *recipe.env) if s.name in finding.recipe_keys
                     or "--" + s.name == finding.setting or s.name == finding.setting), None)
        excuse = next((recipe.notes[k].slow for k in finding.recipe_keys
                       if k in recipe.notes and recipe.notes[k].slow), None)
        if finding.severity == slow_settings.SLOW and excuse:
            kept.append(f"{recipe.where(line)}: {finding} runs slowly on 12.x in {spec.label}, kept: {excuse}")
            continue
        if finding.severity == slow_settings.SLOW:
            key = finding.recipe_keys[0] if finding.recipe_keys else finding.setting
            raise RecipeError(
                f"{recipe.where(line)}: {finding} runs on 12.x but slowly in {spec.label}: {finding.why} "
                f"[source: {finding.source}]",
                hint=f"{finding.fix} If the setting is deliberate, say why in [notes.\"{key}\"] slow = \"...\".")
        raise RecipeError(f"{recipe.where(line)}: {finding} has no SM120 code in {spec.label}: {finding.why}",
                          hint=finding.fix)
    return kept


def validate_against(recipe: Recipe, spec: ServerArgsSpec) -> list[str]:
    """Static check of a recipe against one release's parser (used by tests and `recipes --check`)."""
    warnings = check_flags(recipe_flags(recipe), spec, recipe)
    check_env(recipe, spec)
    return warnings


# --------------------------------------------------------------------------------------------------------
# Docker build arguments that record what the image carries
# --------------------------------------------------------------------------------------------------------
def patch_set(series_dir: Path | None = None) -> list[dict[str, str]]:
    """Each patch of the series in order, with a SHA-256 over its folder's files (metadata and diffs)."""
    series_dir = series_dir or patches_dir() / "sglang"
    series_file = series_dir / "series.toml"
    if not series_file.is_file():
        return []
    doc = _read(series_file)
    patches = doc.data.get("patches", [])
    if not isinstance(patches, list) or not all(isinstance(p, str) for p in patches):
        raise doc.fail(("patches",), "'patches' must be an array of patch ids.")
    out = []
    for patch_id in patches:
        folder = series_dir / patch_id
        digest = hashlib.sha256()
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
        out.append({"id": patch_id, "sha256": digest.hexdigest()})
    return out


def docker_build_args(series_dir: Path | None = None) -> dict[str, str]:
    """Build arguments for ``recipes/docker/Dockerfile`` that label the image with this checkout's series."""
    from sm120kit import __version__

    patches = patch_set(series_dir)
    whole = hashlib.sha256("".join(f"{p['id']}:{p['sha256']}\n" for p in patches).encode()).hexdigest()
    return {
        "SM120KIT_VERSION": __version__,
        "SM120KIT_PATCHSET": ",".join(f"{p['id']}@{p['sha256'][:12]}" for p in patches) or "none",
        "SM120KIT_PATCHSET_SHA256": whole,
    }
