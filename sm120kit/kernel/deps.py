"""Third-party sources a kernel build pulls in with CMake FetchContent, read, fetched and mapped offline.

sgl-kernel declares CUTLASS, FlashInfer, flash-attention, fmt, Triton, FlashMLA ... with
``FetchContent_Declare(NAME GIT_REPOSITORY .. GIT_TAG ..)`` (up to SGLang 0.5.10) or ``URL .. URL_HASH ..``
(later), and CMake downloads them at configure time. For a build without network, each one is fetched
beforehand into ``DIR/NAME`` (:func:`fetch_dependencies`, ``sm120kit fetch-deps``) and handed to CMake as
``FETCHCONTENT_SOURCE_DIR_<NAME>`` with ``FETCHCONTENT_FULLY_DISCONNECTED=ON`` (:func:`cmake_defines`).
A declaration whose ``SOURCE_DIR`` lies inside another dependency (FlashMLA's CUTLASS) is placed there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sm120kit.util.report import Progress, Step
from sm120kit import runner
from sm120kit.errors import DownloadError, MissingDependency, UsageError
from sm120kit.kernel.source import KernelSource
from sm120kit.util.atomicfile import building_folder, make_temp_dir, replace_folder, sweep_temp_dirs

MANIFEST = "sm120kit-deps.json"

_DECLARE_RE = re.compile(r"FetchContent_Declare\s*\(", re.I)
_SET_RE = re.compile(r"^\s*set\s*\(\s*([A-Za-z0-9_]+)\s+(\"[^\"]*\"|[^\s)]+)", re.M | re.I)
_VAR_RE = re.compile(r"\$\{([A-Za-z0-9_.+-]+)\}")
_SOURCE_DIR_REF_RE = re.compile(r"^\$\{([A-Za-z0-9_.+-]+)_SOURCE_DIR\}/?(.*)$")


@dataclass(frozen=True)
class Dependency:
    name: str  # as declared: "repo-cutlass"
    declared_in: Path
    line: int
    git_repository: str | None = None
    git_tag: str | None = None
    url: str | None = None
    url_hash: str | None = None  # "SHA256=..."
    parent: str | None = None  # SOURCE_DIR inside another dependency's source ...
    subdir: str | None = None  # ... at this relative path
    submodules: tuple[str, ...] | None = None  # None: all (FetchContent's default); () none
    unresolved: tuple[str, ...] = ()  # ${VARS} that could not be resolved from the CMake files

    @property
    def variable(self) -> str:
        """The cache variable CMake reads for a local copy (FetchContent upper-cases the name)."""
        return f"FETCHCONTENT_SOURCE_DIR_{self.name.upper()}"

    @property
    def origin(self) -> str:
        if self.git_repository:
            return f"{self.git_repository} @ {self.git_tag or 'default branch'}"
        return self.url or "(no GIT_REPOSITORY or URL)"

    def folder(self, deps_dir: Path) -> Path:
        if self.parent:
            return deps_dir / self.parent / (self.subdir or "")
        return deps_dir / self.name

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "variable": self.variable,
            "git_repository": self.git_repository,
            "git_tag": self.git_tag,
            "url": self.url,
            "url_hash": self.url_hash,
            "parent": self.parent,
            "subdir": self.subdir,
            "declared_in": f"{self.declared_in}:{self.line}",
        }


def _strip_comments(text: str) -> str:
    """Drop ``# ...`` comments (outside double-quoted strings), keep line numbers."""
    out = []
    for line in text.splitlines():
        quoted = False
        for i, ch in enumerate(line):
            if ch == '"':
                quoted = not quoted
            elif ch == "#" and not quoted:
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def _call_body(text: str, start: int) -> str:
    depth, i = 1, start
    while i < len(text) and depth:
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        i += 1
    return text[start:i - 1]


def _tokens(body: str) -> list[str]:
    return [t[1:-1] if t.startswith('"') else t for t in re.findall(r'"[^"]*"|[^\s"]+', body)]


def _variables(texts: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for text in texts:
        for match in _SET_RE.finditer(text):
            name, value = match.group(1), match.group(2).strip('"')
            values.setdefault(name, value)  # the first assignment: the default
    return values


def _resolve(value: str, variables: dict[str, str], missing: list[str]) -> str:
    def repl(match: re.Match) -> str:
        name = match.group(1)
        if name in variables:
            return variables[name]
        missing.append(name)
        return match.group(0)

    for _ in range(5):
        new = _VAR_RE.sub(repl, value)
        if new == value:
            break
        value = new
    return value


def read_dependencies(source: KernelSource,
                      overrides: dict[str, str] | None = None) -> tuple[Dependency, ...]:
    """Every ``FetchContent_Declare`` in the kernel's CMake files, in declaration order.

    ``${VAR}`` references are resolved from the files' ``set()`` defaults, or from ``overrides`` (a mirror
    host for sgl-kernel's ``GITHUB_ARTIFACTORY``, say).
    """
    texts = [_strip_comments(f.read_text(encoding="utf-8", errors="replace")) for f in source.cmake_files]
    variables = {**_variables(texts), **(overrides or {})}
    found: list[Dependency] = []
    seen: set[str] = set()
    for path, text in zip(source.cmake_files, texts):
        for match in _DECLARE_RE.finditer(text):
            tokens = _tokens(_call_body(text, match.end()))
            if not tokens:
                continue
            name, args = tokens[0], tokens[1:]
            fields: dict[str, list[str]] = {}
            key = None
            for token in args:
                if re.fullmatch(r"[A-Z][A-Z0-9_]+", token):
                    key = token
                    fields.setdefault(key, [])
                elif key:
                    fields[key].append(token)
            missing: list[str] = []
            get = lambda k: _resolve(fields[k][0], variables, missing) if fields.get(k) else None  # noqa: E731
            parent = subdir = None
            raw_source_dir = fields.get("SOURCE_DIR", [None])[0]
            if raw_source_dir:
                ref = _SOURCE_DIR_REF_RE.match(raw_source_dir)
                if ref:
                    parent, subdir = ref.group(1), ref.group(2) or None
            submodules = tuple(fields["GIT_SUBMODULES"]) if "GIT_SUBMODULES" in fields else None
            if name in seen:  # FetchContent keeps the first declaration of a name
                continue
            seen.add(name)
            dep = Dependency(
                name=name, declared_in=path, line=text.count("\n", 0, match.start()) + 1,
                git_repository=get("GIT_REPOSITORY"), git_tag=get("GIT_TAG"), url=get("URL"),
                url_hash=get("URL_HASH"), parent=parent, subdir=subdir, submodules=submodules,
            )
            found.append(_with_unresolved(dep, missing))
    return tuple(found)


def _with_unresolved(dep: Dependency, missing: list[str]) -> Dependency:
    if not missing:
        return dep
    return Dependency(**{**dep.__dict__, "unresolved": tuple(dict.fromkeys(missing))})


def _is_populated(folder: Path) -> bool:
    return folder.is_dir() and any(p.name != ".git" for p in folder.iterdir())


def cmake_defines(deps: tuple[Dependency, ...], deps_dir: Path) -> tuple[tuple[str, str], ...]:
    """``FETCHCONTENT_SOURCE_DIR_<NAME>`` for each dependency and ``FETCHCONTENT_FULLY_DISCONNECTED=ON``.

    Raises :class:`MissingDependency` naming the first dependency whose folder is absent or empty.
    """
    deps_dir = Path(deps_dir).resolve()
    if not deps_dir.is_dir():
        raise UsageError(f"--deps-dir {deps_dir} does not exist.",
                         hint="Create it with: sm120kit fetch-deps SRC --into DIR")
    defines = []
    for dep in deps:
        folder = dep.folder(deps_dir)
        if not _is_populated(folder):
            raise MissingDependency(
                f"The dependency '{dep.name}' ({dep.origin}, declared in {dep.declared_in}:{dep.line}) is not in "
                f"{deps_dir}: {folder} is missing or empty, so CMake cannot be given {dep.variable}.",
                hint=f"Fetch it with 'sm120kit fetch-deps {dep.declared_in.parent} --into {deps_dir}' where a "
                f"network exists, or put a copy of its source there (or pass -D{dep.variable}=PATH yourself).",
            )
        defines.append((dep.variable, str(folder)))
    defines.append(("FETCHCONTENT_FULLY_DISCONNECTED", "ON"))
    return tuple(defines)


# -- fetching -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FetchedDependency:
    dependency: Dependency
    folder: Path
    status: str  # "fetched" | "present"
    revision: str | None  # git commit or sha256 of the archive

    def to_json(self) -> dict:
        return {**self.dependency.to_json(), "folder": str(self.folder), "status": self.status,
                "revision": self.revision}


def _git_head(folder: Path) -> str | None:
    if not (folder / ".git").exists():
        return None
    result = runner.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=False, what="git rev-parse")
    return result.stdout.strip() if result.ok else None


def _fetch_git(dep: Dependency, folder: Path, log) -> str:
    repo, tag = dep.git_repository, dep.git_tag
    assert repo
    with building_folder(folder) as tmp:
        runner.run(["git", "init", "-q", str(tmp)], what=f"git init for {dep.name}")
        runner.run(["git", "-C", str(tmp), "remote", "add", "origin", repo], what=f"git remote for {dep.name}")
        ref = tag or "HEAD"
        shallow = runner.run(["git", "-C", str(tmp), "fetch", "-q", "--depth", "1", "origin", ref], check=False,
                             what=f"git fetch of {dep.name}", timeout=3600)
        if not shallow.ok:  # a server (or local path) that refuses a shallow fetch of this ref
            log(f"{dep.name}: shallow fetch of {ref} refused, fetching the full history")
            runner.run(["git", "-C", str(tmp), "fetch", "-q", "--tags", "origin"],
                       what=f"git fetch of {dep.name} from {repo}", timeout=3600)
            runner.run(["git", "-C", str(tmp), "checkout", "-q", "--detach", ref],
                       what=f"git checkout of {dep.name} {ref}")
        else:
            runner.run(["git", "-C", str(tmp), "checkout", "-q", "--detach", "FETCH_HEAD"],
                       what=f"git checkout of {dep.name} {ref}")
        if dep.submodules != () and (tmp / ".gitmodules").is_file():
            argv = ["git", "-C", str(tmp), "submodule", "update", "--init", "--recursive", "--depth", "1"]
            if dep.submodules:
                argv += ["--", *dep.submodules]
            runner.run(argv, what=f"git submodules of {dep.name}", timeout=3600)
        revision = _git_head(tmp)
    return revision or ""


def _fetch_url(dep: Dependency, folder: Path) -> str:
    assert dep.url
    folder.parent.mkdir(parents=True, exist_ok=True)
    sweep_temp_dirs(folder.parent, folder.name)
    tmp = make_temp_dir(folder.parent, folder.name)  # the download and the unpacked tree
    try:
        archive = tmp / "archive"
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(dep.url, timeout=120) as response, open(archive, "wb") as out:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DownloadError(f"Could not download '{dep.name}' from {dep.url}: {exc}.",
                                hint="Check the network, or fetch it elsewhere and copy it to "
                                f"{folder} ({dep.variable}).") from exc
        if dep.url_hash:
            algo, _, expected = dep.url_hash.partition("=")
            if algo.upper() == "SHA256" and digest.hexdigest().lower() != expected.lower():
                raise DownloadError(f"'{dep.name}' from {dep.url} has SHA256 {digest.hexdigest()}, but "
                                    f"{dep.declared_in}:{dep.line} expects {expected}.")
        unpacked = tmp / "src"
        unpacked.mkdir()
        _extract(archive, unpacked, dep)
        entries = list(unpacked.iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked  # like FetchContent
        replace_folder(root, folder)
        return digest.hexdigest()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(archive: Path, dest: Path, dep: Dependency) -> None:
    dest_resolved = dest.resolve()
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if not target.is_relative_to(dest_resolved):
                    raise DownloadError(f"'{dep.name}': the archive from {dep.url} has an unsafe path {member.name}.")
            _extract_tar(tar, dest, dep)
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if not (dest / name).resolve().is_relative_to(dest_resolved):
                    raise DownloadError(f"'{dep.name}': the archive from {dep.url} has an unsafe path {name}.")
            zf.extractall(dest)
    else:
        raise DownloadError(f"'{dep.name}': {dep.url} is neither a tar nor a zip archive.")


def _extract_tar(tar: tarfile.TarFile, dest: Path, dep: Dependency) -> None:
    """Unpack with tarfile's "data" filter: no link that leaves dest, no absolute, device or setuid entry.
    Without it a symlink member could let a later member write through it outside dest."""
    def unsafe(what: str) -> DownloadError:
        return DownloadError(f"'{dep.name}': the archive from {dep.url} has an unsafe entry: {what}. Check the "
                             "URL, or unpack the source yourself and pass its folder with --deps-dir.")

    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as e:
            raise unsafe(str(e)) from None
        return
    # Pythons before the filter (3.10.11 and older): regular files and folders only.
    odd = [m.name for m in tar.getmembers() if not (m.isfile() or m.isdir())]
    if odd:
        raise unsafe(f"{odd[0]} is a link or special file")
    tar.extractall(dest)


def _order(deps: tuple[Dependency, ...]) -> list[Dependency]:
    """Parents before the dependencies placed inside them."""
    return sorted(deps, key=lambda d: d.parent is not None)


def fetch_dependencies(source: KernelSource, into: Path, *, progress: Progress | None = None,
                       on_step: Step | None = None,
                       overrides: dict[str, str] | None = None,
                       names: tuple[str, ...] | None = None) -> tuple[FetchedDependency, ...]:
    """Fetch every dependency of ``source`` (or only ``names``) into ``into/NAME``, skipping those already
    fetched from the same origin; ``overrides`` sets CMake variables used in the declarations."""
    deps = read_dependencies(source, overrides)
    if names is not None:
        unknown = sorted(set(names) - {d.name for d in deps})
        if unknown:
            raise UsageError(f"{source.path} declares no dependency named {', '.join(unknown)}; it declares "
                             f"{', '.join(d.name for d in deps) or 'none'}.")
        deps = tuple(d for d in deps if d.name in names)
    into = Path(into).expanduser().resolve()
    into.mkdir(parents=True, exist_ok=True)
    manifest_path = into / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    except (OSError, ValueError):
        manifest = {}
    log = on_step or (lambda text: None)
    results = []
    ordered = _order(deps)
    for i, dep in enumerate(ordered, 1):
        if dep.unresolved:
            raise UsageError(
                f"The dependency '{dep.name}' ({dep.declared_in}:{dep.line}) uses "
                f"{', '.join('${' + v + '}' for v in dep.unresolved)}, which no set() in the kernel's CMake "
                "files defines.",
                hint=f"Fetch it by hand into {dep.folder(into)} ({dep.variable}).")
        folder = dep.folder(into)
        recorded = manifest.get(dep.name, {})
        wanted = {"origin": dep.origin, "url_hash": dep.url_hash}
        if _is_populated(folder) and all(recorded.get(k) == v for k, v in wanted.items()):
            results.append(FetchedDependency(dep, folder, "present", recorded.get("revision")))
            if progress is not None:
                progress(i, len(ordered), f"{dep.name} (present)")
            continue
        if dep.git_repository:
            if dep.parent:  # nested inside a parent that may be a git checkout itself
                folder.parent.mkdir(parents=True, exist_ok=True)
            revision = _fetch_git(dep, folder, log)
        elif dep.url:
            revision = _fetch_url(dep, folder)
        else:
            raise UsageError(f"The dependency '{dep.name}' ({dep.declared_in}:{dep.line}) has neither "
                             "GIT_REPOSITORY nor URL; sm120kit cannot fetch it.",
                             hint=f"Put its source in {folder} ({dep.variable}).")
        manifest[dep.name] = {**wanted, "revision": revision, "folder": str(folder.relative_to(into))}
        _write_manifest(manifest_path, manifest)
        results.append(FetchedDependency(dep, folder, "fetched", revision))
        if progress is not None:
            progress(i, len(ordered), dep.name)
    return tuple(results)


def _write_manifest(path: Path, manifest: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
