"""Find an SGLang tree and describe it: where the ``sglang`` package lies, its release, and git state.

Accepted paths: a git clone of SGLang (``python/sglang/``), its ``python/`` folder, an installed package
folder (``.../site-packages/sglang``), the folder that holds it, or nothing (the ``sglang`` that this
interpreter would import, found with importlib's finder without importing it).
"""

from __future__ import annotations

import importlib.machinery
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120kit.errors import NotSglangTree
from sm120kit.sglang.gitrepo import release_of_commit, tag_exists
from sm120kit.sglang.metadata import read_stated_version, version_from_git_tags


@dataclass(frozen=True)
class Target:
    kind: str  # "git-clone" | "python-folder" | "installed" | "importable"
    package_dir: Path  # .../sglang
    version: str | None
    repo_root: Path | None = None  # git working tree root, for a clone
    commit: str | None = None
    dirty_files: tuple[str, ...] = field(default=())  # paths relative to package_dir.parent
    version_source: str | None = None  # the file that states ``version``, relative to the clone or site folder

    @property
    def root(self) -> Path:
        """The folder that holds ``sglang/``: diffs (``sglang/...``) apply relative to it."""
        return self.package_dir.parent

    @property
    def label(self) -> str:
        what = self.version or "unknown release"
        if self.commit:
            what += f" @ {self.commit[:12]}"
        return f"{self.package_dir} ({what})"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "package_dir": str(self.package_dir),
            "version": self.version,
            "version_source": self.version_source,
            "repo_root": str(self.repo_root) if self.repo_root else None,
            "commit": self.commit,
            "dirty_files": list(self.dirty_files),
        }


def _looks_like_package(path: Path) -> bool:
    return path.name == "sglang" and (path / "__init__.py").is_file() and (path / "srt").is_dir()


def _importable_package() -> Path | None:
    spec = importlib.machinery.PathFinder.find_spec("sglang", sys.path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _git_state(package_dir: Path) -> tuple[Path | None, str | None, tuple[str, ...]]:
    try:
        import git  # gitpython
    except ImportError:  # pragma: no cover - a core dependency
        return None, None, ()
    try:
        repo = git.Repo(package_dir, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None, None, ()
    root = Path(repo.working_tree_dir).resolve()
    try:
        commit = repo.head.commit.hexsha
    except ValueError:  # no commit yet
        commit = None
    base = package_dir.parent.resolve()
    dirty: list[str] = []
    changed = [d.a_path for d in repo.index.diff(None)]
    if commit:
        changed += [d.a_path for d in repo.index.diff("HEAD")]
    changed += repo.untracked_files
    for rel in sorted(set(changed)):
        full = (root / rel).resolve()
        if full.is_relative_to(base):
            dirty.append(full.relative_to(base).as_posix())
    return root, commit, tuple(dirty)


def find_target(path: str | Path | None = None) -> Target:
    """Resolve ``path`` (or the importable sglang) to a :class:`Target`; :class:`NotSglangTree` if none."""
    if path is None:
        package = _importable_package()
        if package is None or not _looks_like_package(package):
            raise NotSglangTree(
                f"No PATH was given and this Python interpreter cannot import an SGLang package ({sys.executable}).",
                hint="Pass the path of an SGLang git clone or installed sglang package, or install SGLang "
                "into this environment.",
            )
        kind = "importable"
    else:
        given = Path(path).expanduser()
        if not given.exists():
            raise NotSglangTree(
                f"The path {given} does not exist.",
                hint="Pass an SGLang git clone or an installed sglang package folder.",
            )
        given = given.resolve()
        candidates = [
            (given, "installed"),
            (given / "sglang", "installed"),
            (given / "python" / "sglang", "git-clone"),
        ]
        if given.name == "python":
            candidates.insert(1, (given / "sglang", "python-folder"))
        for package, kind in candidates:
            if _looks_like_package(package):
                break
        else:
            raise NotSglangTree(
                f"{given} is not an SGLang tree: looked for an 'sglang' package (a folder with __init__.py "
                "and srt/) at PATH itself, at PATH/sglang and at PATH/python/sglang.",
                hint="Pass an SGLang git clone, its python/ folder, or an installed .../site-packages/sglang.",
            )
    repo_root, commit, dirty = _git_state(package)
    if kind == "installed" and repo_root is not None and package.parent.name == "python":
        kind = "git-clone"
    version, source = read_stated_version(package)
    if source is not None and repo_root is not None:
        source = (package.parent / source).resolve().relative_to(repo_root).as_posix()
    return Target(
        kind=kind,
        package_dir=package,
        version=version,
        version_source=source,
        repo_root=repo_root,
        commit=commit,
        dirty_files=dirty,
    )


def _plain_release(version: str) -> bool:
    """A published kind of version (final, post or pre-release): not a dev build, no local part."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return parsed.dev is None and parsed.local is None


def release_and_source(target: Target) -> tuple[str | None, bool, str]:
    """The tree's SGLang release, whether the tree is exactly that release, and where that was read, in words.

    An installed package (or any tree outside git) is the release it states. In a git clone:

    - HEAD tagged ``v<release>``: exactly that release (the tag wins over no stated version; a stated
      version the tags at HEAD do not name makes the tree "near" it);
    - a stated version and no tag at HEAD: exactly that release when the clone has no ``v<release>`` tag
      to be after (a release's files committed to a repository of their own); near it when it has one,
      and for a dev build (``0.5.24.dev12+g...``, what setuptools-scm writes into ``_version.py``);
    - no stated version (main from 0.5.10 on: ``version.py`` imports ``_version.py``, which setuptools-scm
      writes at install time from git tags): near the release HEAD follows (:func:`release_of_commit`).
    """
    version = target.version
    stated = f"stated by {target.version_source}" if target.version_source else "stated by the tree"
    if target.commit is None or target.repo_root is None:
        return version, version is not None, stated if version else "unknown: the tree states none"
    found = release_of_commit(target.repo_root, "HEAD", follow=version is None)
    if not found.readable:  # tags unreadable: a commit between releases
        return version, False, stated if version else "unknown: the tree states none, its tags are unreadable"
    if version is not None:
        if found.tagged:
            return version, version in {r for _, r in found.tagged}, stated
        if _plain_release(version) and not tag_exists(target.repo_root, f"v{version}"):
            return version, True, f"{stated} (the clone has no v{version} tag that HEAD could be after)"
        return version, False, stated
    if found.exact:
        tag = found.tagged[0][0] if len(found.tagged) == 1 else f"v{found.release}"
        return found.release, True, f"from the tag at HEAD ({tag})"
    scm = version_from_git_tags(target.package_dir)
    states = (
        "the tree states none: its version comes from git tags (setuptools-scm, python/pyproject.toml)"
        if scm
        else "the tree states none"
    )
    if found.nearest is None:
        return None, False, f"unknown: {states} and no release tag precedes HEAD"
    return found.release, False, f"from {found.describe()}; {states}"
