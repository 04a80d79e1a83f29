"""Package metadata, read one way each.

Two questions, two kinds of reader:

* "what version of package X is installed in this interpreter": :func:`installed_version`
  (``importlib.metadata``, nothing else);
* "what release does this tree on disk state": :func:`read_stated_version` for an SGLang tree
  (``version.py`` / ``_version.py``, a static ``pyproject.toml`` version, a ``dist-info`` beside it),
  built on :func:`version_in_file` (a literal ``__version__``) and :func:`read_dist_metadata`
  (a ``*.dist-info/METADATA`` file), which other packages' trees (sgl-kernel) use too.

The files of a tree are read as regular files only (a FIFO named ``version.py`` is passed over, not
waited on) and at most :data:`_MAX_BYTES` of each.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

from sm120kit.util import regularfile

_MAX_BYTES = 1 << 20  # a version.py, pyproject.toml or METADATA is a few KiB

# `__version__ = "0.5.2"` (version.py up to 0.5.9) or `__version__ = version = '0.5.23'` (the _version.py
# that setuptools-scm / vcs-versioning writes from 0.5.10 on).
_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def installed_version(*names: str) -> str | None:
    """The version of the first of ``names`` installed in this interpreter (``importlib.metadata``), or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_in_file(path: Path) -> str | None:
    """The literal ``__version__`` of a ``version.py`` / ``_version.py``; None when absent or not literal."""
    try:
        text = regularfile.read_text(path, errors="replace", limit=_MAX_BYTES)
    except OSError:
        return None
    match = _VERSION_RE.search(text)
    return match.group(1) if match else None


def dist_metadata_files(folder: Path, name: str | None = None) -> list[Path]:
    """The ``METADATA`` files of the ``*.dist-info`` folders in ``folder`` (of package ``name`` only, when
    given), sorted."""
    pattern = f"{name}-*.dist-info/METADATA" if name else "*.dist-info/METADATA"
    return sorted(Path(folder).glob(pattern))


def read_dist_metadata(path: Path) -> Message:
    """The headers of one ``METADATA`` file (``Name``, ``Version``, ``Requires-Dist`` ...); empty when
    unreadable."""
    try:
        text = regularfile.read_text(path, errors="replace", limit=_MAX_BYTES)
    except OSError:
        text = ""
    return HeaderParser().parsestr(text)


def read_version(package_dir: Path) -> str | None:
    """The release the tree states (see :func:`read_stated_version`), or ``None``."""
    return read_stated_version(package_dir)[0]


def _pyproject(path: Path) -> dict | None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    if not path.is_file():
        return None
    try:
        return tomllib.loads(regularfile.read_text(path, errors="replace", limit=_MAX_BYTES))
    except (OSError, tomllib.TOMLDecodeError, RecursionError):
        return None


def _pyproject_version(path: Path) -> str | None:
    """A static ``[project] version`` (SGLang's ``python/pyproject.toml`` up to 0.5.9; later ones are
    dynamic, from git tags)."""
    data = _pyproject(path)
    if data is None:
        return None
    project = data.get("project")
    if not isinstance(project, dict) or project.get("name") != "sglang":
        return None
    version = project.get("version")
    return version if isinstance(version, str) and version.strip() else None


def version_from_git_tags(package_dir: Path) -> bool:
    """Whether the ``pyproject.toml`` beside the package takes its version from git tags: ``dynamic =
    ["version"]`` with a ``[tool.setuptools_scm]`` table (SGLang's ``python/pyproject.toml`` from 0.5.10 on)."""
    data = _pyproject(package_dir.parent / "pyproject.toml")
    project = data.get("project") if data else None
    tool = data.get("tool") if data else None
    return (
        isinstance(project, dict)
        and "version" in (project.get("dynamic") or ())
        and isinstance(tool, dict)
        and isinstance(tool.get("setuptools_scm"), dict)
    )


def read_stated_version(package_dir: Path) -> tuple[str | None, str | None]:
    """(release, the file that states it): ``sglang/version.py`` or ``sglang/_version.py`` (a literal
    ``__version__``), else a static version in the ``pyproject.toml`` beside the package (a clone's
    ``python/`` folder), else a ``sglang-*.dist-info`` beside it. ``(None, None)`` when none states one."""
    for name in ("version.py", "_version.py"):
        version = version_in_file(package_dir / name)
        if version:
            return version, f"{package_dir.name}/{name}"
    pyproject = package_dir.parent / "pyproject.toml"
    if pyproject.is_file():
        version = _pyproject_version(pyproject)
        if version:
            return version, "pyproject.toml"
    for meta in dist_metadata_files(package_dir.parent, "sglang"):
        headers = read_dist_metadata(meta)
        if headers.get("Version"):
            return headers["Version"], f"{meta.parent.name}/METADATA"
    return None, None
