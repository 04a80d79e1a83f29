"""Import single SGLang modules from an unpacked (possibly patched) tree without SGLang's dependencies.

SGLang's package ``__init__`` files and its utility modules import dozens of packages (fastapi,
torchvision, transformers, ...) that the kernels and helpers under test never use, and the set changes
from release to release. :class:`LightTree` loads the real source files of the tree instead:

* a package's ``__init__.py`` runs only when code asks the package for a name that is not one of its
  submodules (``from sglang.srt.layers.moe.fused_moe_triton import get_config``), so importing
  ``sglang.srt.layers.attention.triton_ops.extend_attention`` runs that file and what it imports, not the
  server behind ``sglang/__init__.py``; the two top-level package files never run;
* every module runs its own top-level statements one by one, in order, with its real file name and line
  numbers (so Triton can read the source of ``@triton.jit`` functions). A statement that fails because an
  optional package is missing (or because of what follows from that) is skipped and recorded in
  :attr:`LightTree.skipped`; everything else runs exactly as written;
* modules named in ``blocked`` (e.g. ``sglang.srt.server_args``, which pulls in transformers and the
  whole server) are not loaded: importing them fails like a missing package would;
* ``sglang.srt.utils`` is the tree's ``srt/utils.py`` (0.5.2) or ``srt/utils/common.py`` (0.5.3 on),
  which is what the package's ``__init__`` re-exports.

Nothing of SGLang is replaced or imitated: a name whose defining statement was skipped is simply
absent, and code that needs it fails with a NameError/ImportError that the test reports.
"""

from __future__ import annotations
import __future__ as future_module

import ast
import hashlib
import importlib
import importlib.abc
import importlib.util
import sys
import types
from pathlib import Path

# The top-level package files import the whole server; they never run.
_SKIPPED_INITS = frozenset({"sglang", "sglang.srt"})
_FUTURE_FLAGS = {name: getattr(future_module, name).compiler_flag for name in future_module.all_feature_names}


class LightTree(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``with LightTree(site) as tree: mod = tree.load("sglang.srt.utils")`` where ``site/sglang`` exists.

    Inside the block, ``import sglang...`` resolves to this tree only; on exit every ``sglang`` module is
    removed from ``sys.modules`` again, so the next tree starts clean.
    """

    def __init__(self, site: Path, *, blocked: tuple[str, ...] = ()) -> None:
        self.site = Path(site)
        self.blocked = tuple(blocked)
        if not (self.site / "sglang").is_dir():
            raise FileNotFoundError(f"{self.site} holds no sglang/ folder")
        self.skipped: dict[str, list[str]] = {}
        self._saved: dict[str, types.ModuleType] = {}

    # -- context ---------------------------------------------------------------------------------------
    def __enter__(self) -> LightTree:
        self._saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
        for name in self._saved:
            del sys.modules[name]
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(self._saved)

    def load(self, name: str) -> types.ModuleType:
        return importlib.import_module(name)

    # -- finder ----------------------------------------------------------------------------------------
    def _source_of(self, fullname: str) -> tuple[Path | None, Path | None]:
        """(module file or None, package folder or None) for ``fullname``; (None, None) if absent.
        For a package the file is its ``__init__.py`` (run lazily), or None for the skipped ones."""
        base = self.site.joinpath(*fullname.split("."))
        package = base if base.is_dir() else None
        if fullname == "sglang.srt.utils":
            common = base / "common.py"
            return (common if common.is_file() else base.with_suffix(".py")), package
        if package is not None:
            init = base / "__init__.py"
            return (init if fullname not in _SKIPPED_INITS and init.is_file() else None), package
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), None
        return None, None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        if any(fullname == b or fullname.startswith(b + ".") for b in self.blocked):
            raise ModuleNotFoundError(f"{fullname} is not loaded in these tests", name=fullname)
        source, package = self._source_of(fullname)
        if source is None and package is None:
            return None
        spec = importlib.util.spec_from_loader(
            fullname, self, origin=str(source) if source else None, is_package=package is not None
        )
        if package is not None:
            spec.submodule_search_locations = [str(package)]
        return spec

    # -- loader ----------------------------------------------------------------------------------------
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        source, package = self._source_of(module.__name__)
        if source is None:
            return
        if package is not None and source.name == "__init__.py":
            module.__getattr__ = self._lazy_init(module, source, package)
            return
        self._run(module, source)

    def _lazy_init(self, module: types.ModuleType, init: Path, package: Path):
        """A module ``__getattr__`` that runs the package's ``__init__.py`` the first time a name that is
        not a submodule is asked for."""
        state = {"ran": False}

        def getattr_hook(name: str):
            if name.startswith("__") or (package / name).is_dir() or (package / f"{name}.py").is_file():
                raise AttributeError(name)  # dunders and submodules: the import system handles them
            if not state["ran"]:
                state["ran"] = True
                del module.__dict__["__getattr__"]
                self._run(module, init)
                if name in module.__dict__:
                    return module.__dict__[name]
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        return getattr_hook

    def _run(self, module: types.ModuleType, source: Path) -> None:
        module.__file__ = str(source)
        skipped = self.skipped.setdefault(module.__name__, [])
        for lineno, code in _statements(source):
            try:
                exec(code, module.__dict__)
            except Exception as exc:  # an optional dependency (or something built on it) is missing
                skipped.append(f"line {lineno}: {type(exc).__name__}: {exc}")


# (file, content digest) -> its top-level statements, compiled one by one. A tree is loaded afresh for each
# faked device; its files are parsed and compiled once per process (the code objects carry the file's own
# name and lines, and running one again runs exactly what a fresh compile would).
_COMPILED: dict[tuple[str, str], list[tuple[int, types.CodeType]]] = {}


def _statements(source: Path) -> list[tuple[int, types.CodeType]]:
    data = source.read_bytes()
    key = (str(source), hashlib.sha256(data).hexdigest())
    if key not in _COMPILED:
        tree = ast.parse(data.decode("utf-8"), filename=str(source))
        flags = 0
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for alias in node.names:
                    flags |= _FUTURE_FLAGS.get(alias.name, 0)
        _COMPILED[key] = [
            (
                node.lineno,
                compile(ast.Module(body=[node], type_ignores=[]), str(source), "exec", flags=flags, dont_inherit=True),
            )
            for node in tree.body
        ]
    return _COMPILED[key]
