"""The Python packages an SGLang release's argument resolution needs, beside the ones installed here.

Each SGLang release pins its own ``transformers``; a release imported with another major version fails
before it resolves anything (0.5.17 registers config names that transformers 5.19 already owns; 0.5.2
expects transformers 4). The ``audit`` extra installs the newest release's pins. For an older release,
:func:`dependency_overlay` builds, once, a folder holding the release's pinned version of each package in
:data:`OVERLAY_PACKAGES` plus whichever of their own requirements the installed ones do not satisfy, and
the resolution probe puts that folder on ``sys.path`` ahead of site-packages. The overlay is cached under
``<cache>/overlays/``; packages come from PyPI through ``pip install --target --no-deps``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sm120kit import runner
from sm120kit.errors import MissingDependency, ToolFailed
from sm120kit.sglang.metadata import dist_metadata_files, installed_version, read_dist_metadata
from sm120kit.util.atomicfile import make_temp_dir, replace_folder, sweep_temp_dirs
from sm120kit.util.cache import cache_dir
from sm120kit.util.report import Step, tell

# Packages whose version decides whether a release's server arguments import at all.
OVERLAY_PACKAGES = ("transformers",)
_MAX_ROUNDS = 5


@dataclass(frozen=True)
class Overlay:
    path: Path | None  # None: the installed packages satisfy the release
    packages: tuple[str, ...]  # "transformers==4.57.1", ... (what the overlay holds)
    reason: str  # why it was needed, or why none was

    def to_json(self) -> dict:
        return {"path": str(self.path) if self.path else None, "packages": list(self.packages), "reason": self.reason}


def release_requirements(root: Path, repo_root: Path | None = None) -> dict[str, Requirement]:
    """The release's requirements on :data:`OVERLAY_PACKAGES` (extras included: 0.5.2 puts transformers in
    its ``runtime-common`` extra), from its dist-info or, for a git clone, ``python/pyproject.toml``."""
    lines: list[str] = []
    for meta in dist_metadata_files(root, "sglang"):
        lines += read_dist_metadata(meta).get_all("Requires-Dist") or []
    if not lines:
        for pyproject in ([repo_root / "python" / "pyproject.toml"] if repo_root else []) + [
            root / "pyproject.toml",
            root.parent / "pyproject.toml",
        ]:
            if pyproject.is_file():
                lines += _pyproject_requirements(pyproject)
                break
    found: dict[str, Requirement] = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        if name in OVERLAY_PACKAGES and name not in found:
            req.marker = None
            found[name] = req
    return found


def _pyproject_requirements(path: Path) -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8", errors="replace"))
    project = data.get("project", {})
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines += list(extra)
    return lines


def _satisfied(req: Requirement, version: str | None) -> bool:
    return version is not None and (not req.specifier or req.specifier.contains(Version(version), prereleases=True))


def _overlay_name(reqs: list[Requirement]) -> str:
    return (
        "+".join(sorted(f"{canonicalize_name(r.name)}{r.specifier}" for r in reqs))
        .replace("=", "_")
        .replace("<", "lt")
        .replace(">", "gt")
        .replace(",", "_")
        .replace("!", "not")
    )


def dependency_overlay(root: Path, repo_root: Path | None = None, *, on_step: Step | None = None) -> Overlay:
    """The overlay folder the release at ``root`` needs (built once, cached), or ``Overlay(None, ...)``."""
    needed = []
    for name, req in release_requirements(root, repo_root).items():
        have = installed_version(name)
        if not _satisfied(req, have):
            needed.append(req)
    if not needed:
        return Overlay(None, (), "the installed packages satisfy this release's pins")
    folder = cache_dir() / "overlays" / _overlay_name(needed)
    if not (folder / ".complete").is_file():
        _build(folder, needed, on_step)
    packages = tuple(sorted((folder / ".complete").read_text().split()))
    why = ", ".join(f"{r} (installed: {installed_version(r.name) or 'none'})" for r in needed)
    return Overlay(folder, packages, f"the release pins {why}")


def _dists(folder: Path) -> dict[str, tuple[str, list[str]]]:
    found = {}
    for meta in dist_metadata_files(folder):
        headers = read_dist_metadata(meta)
        found[canonicalize_name(headers["Name"])] = (headers["Version"], headers.get_all("Requires-Dist") or [])
    return found


def _unmet(folder: Path) -> list[str]:
    """Requirements of the packages in ``folder`` that neither the folder nor this environment meets."""
    dists = _dists(folder)
    unmet: list[str] = []
    for _, (_, requires) in dists.items():
        for line in requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except UndefinedEnvironmentName:
                continue
            name = canonicalize_name(req.name)
            have = dists[name][0] if name in dists else installed_version(name)
            if not _satisfied(req, have) and str(req) not in unmet:
                req.marker = None
                unmet.append(str(req))
    return unmet


def _pip_target(folder: Path, specs: list[str]) -> None:
    argv = runner.python_argv(
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--upgrade",
        "--target",
        str(folder),
        *specs,
    )
    try:
        runner.run(argv, what="pip install of " + " ".join(specs), timeout=900)
    except ToolFailed as exc:
        last = (exc.output_tail.strip().splitlines() or ["pip gave no reason"])[-1]
        raise MissingDependency(
            f"SGLang's argument resolution for this release needs {' '.join(specs)}, and pip could not "
            f"install it into {folder}: {last}",
            hint="Check that PyPI is reachable, or install the release's pinned packages yourself.",
        ) from exc


def _build(folder: Path, needed: list[Requirement], on_step: Step | None) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    sweep_temp_dirs(folder.parent, folder.name)
    tmp = make_temp_dir(folder.parent, folder.name)
    try:
        specs = [str(r) for r in needed]
        tell(on_step, f"installing {' '.join(specs)} for this release's argument resolution (once) ...")
        _pip_target(tmp, specs)
        for _ in range(_MAX_ROUNDS):
            unmet = _unmet(tmp)
            if not unmet:
                break
            _pip_target(tmp, unmet)
        else:
            raise MissingDependency(
                f"Could not settle the requirements of {', '.join(specs)} in {tmp}: "
                f"still unmet: {', '.join(_unmet(tmp))}."
            )
        shutil.rmtree(tmp / "bin", ignore_errors=True)
        pins = sorted(f"{name}=={version}" for name, (version, _) in _dists(tmp).items())
        (tmp / ".complete").write_text("\n".join(pins) + "\n")
        if (folder / ".complete").is_file():  # another process finished the same overlay first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
