"""The server-argument probe: which launch flags a release's own argument parser accepts.

The parser is read in the Python that will run the server: :mod:`sm120kit.serve.server_args_probe` runs
there (``PYTHONPATH`` at the tree when a tree is given), builds SGLang's own parser with
``ServerArgs.add_cli_args`` and reports its options; :func:`read_server_args` turns that into a
:class:`ServerArgsSpec`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import MissingDependency, RecipeError
from sm120kit.util.report import Step, tell

PROBE_MODULE = "sm120kit.serve.server_args_probe"
# The folder that holds this sm120kit package (a checkout, or the site-packages it is installed in).
_SM120KIT_PARENT = Path(__file__).resolve().parents[2]


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


def _sm120kit_path(tmp: Path) -> str:
    """A folder on which ``import sm120kit`` finds this sm120kit and nothing else.

    The probe may run in another interpreter (``--python``); putting the whole folder that holds sm120kit
    on its path could put another environment's site-packages in front of its own. A link to the package
    alone avoids that; where links cannot be made, the folder itself is used.
    """
    folder = tmp / "path"
    folder.mkdir()
    try:
        os.symlink(_SM120KIT_PARENT / "sm120kit", folder / "sm120kit", target_is_directory=True)
    except OSError:
        return str(_SM120KIT_PARENT)
    return str(folder)


def read_server_args(
    python: str | None = None,
    sglang_root: Path | None = None,
    argvs: Sequence[Sequence[str]] = (),
    on_step: Step | None = None,
) -> ServerArgsSpec:
    """Build SGLang's argument parser in ``python`` (default: this interpreter) and describe its options.

    ``sglang_root`` is the folder holding ``sglang/`` (put first on ``PYTHONPATH``); without it, the sglang
    that ``python`` imports. Each argv in ``argvs`` is also parsed by that parser; its error (or None) is
    in ``argv_errors``.
    """
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="sm120kit-args-") as tmp:
        out = Path(tmp) / "args.json"
        # The tree's sglang first (as the launch has it), then this sm120kit for the probe module itself.
        paths = ([str(sglang_root)] if sglang_root is not None else []) + [_sm120kit_path(Path(tmp))]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        extra_env = {"PYTHONPATH": os.pathsep.join(paths)}
        args = ("-m", PROBE_MODULE, str(out), json.dumps([list(a) for a in argvs]))
        argv = runner.python_argv(*args) if python == sys.executable else [python, *args]
        where = f" at {sglang_root}" if sglang_root else ""
        title = f"reading SGLang's argument parser{where}"
        tell(on_step, title)
        runner.run(argv, extra_env=extra_env, cwd=tmp, timeout=600, what="SGLang argument parser probe")
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RecipeError(f"The SGLang argument parser probe in {python} wrote no result ({exc}).") from exc
        if "import_error" in data:
            raise MissingDependency(
                f"{python} could not import SGLang's server arguments{where}: {data['import_error']}.",
                hint="Install SGLang and its dependencies in that environment (for a bare release tree, "
                "pip install 'sm120kit[audit]' brings what its argument parser imports), or pass "
                "--python.",
            )
    options = tuple(
        ServerOption(
            tuple(o["flags"]),
            o["dest"],
            o["nargs"],
            tuple(o["choices"]) if o["choices"] else None,
            o["type"],
            o["deprecated"],
            o["retired"],
            o["replacement"],
        )
        for o in data["options"]
    )
    return ServerArgsSpec(
        version=data.get("version"),
        package_dir=Path(data["package_dir"]),
        python=data["python"],
        options=options,
        argv_errors=tuple(data["argv_errors"]),
        argv_given=tuple(data.get("argv_given", ())),
    )
