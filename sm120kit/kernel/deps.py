"""Third-party sources a kernel build pulls in with CMake FetchContent, read, fetched and mapped offline.

sgl-kernel declares CUTLASS, FlashInfer, flash-attention, fmt, Triton, FlashMLA ... with
``FetchContent_Declare(NAME GIT_REPOSITORY .. GIT_TAG ..)`` (up to SGLang 0.5.10) or ``URL .. URL_HASH ..``
(later), and CMake downloads them at configure time. For a build without network, each one is fetched
beforehand into ``DIR/NAME`` (:func:`fetch_dependencies`, ``sm120kit fetch-deps``) and handed to CMake as
``FETCHCONTENT_SOURCE_DIR_<NAME>`` with ``FETCHCONTENT_FULLY_DISCONNECTED=ON`` (:func:`cmake_defines`).
A declaration whose ``SOURCE_DIR`` lies inside another dependency (FlashMLA's CUTLASS) is placed there.

The CMake files come from an SGLang tree and are untrusted input: a dependency name is a plain name (no
``/``, no ``..``; it names a folder in ``DIR``), a ``SOURCE_DIR`` inside another dependency is a relative
path without ``..``, every folder written is checked to lie inside ``DIR``, a ``GIT_TAG`` or
``GIT_REPOSITORY`` that git could take as an option (``--upload-pack=...``) is refused, a ``URL_HASH`` is
checked with the algorithm it names (MD5, SHA1, SHA224, SHA256, SHA384, SHA512, SHA3_*; another one is
an error), and a downloaded archive is unpacked with the bounds and checks of :mod:`sm120kit.util.archive`.
Such a problem is a :class:`UsageError` naming the file and line of the declaration.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import DownloadError, IOFailure, MissingDependency, UsageError
from sm120kit.kernel.source import KernelSource
from sm120kit.util import archive, regularfile
from sm120kit.util.atomicfile import building_folder, make_temp_dir, replace_folder, sweep_temp_dirs, write_atomic
from sm120kit.util.report import Progress, Step

MANIFEST = "sm120kit-deps.json"

_DECLARE_RE = re.compile(r"FetchContent_Declare\s*\(", re.I)
_SET_RE = re.compile(r"^\s*set\s*\(\s*([A-Za-z0-9_]+)\s+(\"[^\"]*\"|[^\s)]+)", re.M | re.I)
_VAR_RE = re.compile(r"\$\{([A-Za-z0-9_.+-]+)\}")
_SOURCE_DIR_REF_RE = re.compile(r"^\$\{([A-Za-z0-9_.+-]+)_SOURCE_DIR\}/?(.*)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")  # a folder name: no '/', never '.' or '..'
_SUBDIR_PART_RE = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9_.+-]*$")
_REF_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./+-]*$")  # a tag, branch or commit; never an option
# URL_HASH algorithms CMake accepts (file(<HASH>)), as hashlib names them.
_HASHES = {
    "MD5": "md5",
    "SHA1": "sha1",
    "SHA224": "sha224",
    "SHA256": "sha256",
    "SHA384": "sha384",
    "SHA512": "sha512",
    "SHA3_224": "sha3_224",
    "SHA3_256": "sha3_256",
    "SHA3_384": "sha3_384",
    "SHA3_512": "sha3_512",
}


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
    return text[start : i - 1]


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


def read_dependencies(source: KernelSource, overrides: dict[str, str] | None = None) -> tuple[Dependency, ...]:
    """Every ``FetchContent_Declare`` in the kernel's CMake files, in declaration order.

    ``${VAR}`` references are resolved from the files' ``set()`` defaults, or from ``overrides`` (a mirror
    host for sgl-kernel's ``GITHUB_ARTIFACTORY``, say).
    """
    texts = [_strip_comments(_read_cmake(f)) for f in source.cmake_files]
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
                name=name,
                declared_in=path,
                line=text.count("\n", 0, match.start()) + 1,
                git_repository=get("GIT_REPOSITORY"),
                git_tag=get("GIT_TAG"),
                url=get("URL"),
                url_hash=get("URL_HASH") if fields.get("URL_HASH") or "URL_HASH" not in fields else "",
                parent=parent,
                subdir=subdir,
                submodules=submodules,
            )
            dep = _with_unresolved(dep, missing)
            _check_location(dep)
            found.append(dep)
    return tuple(found)


def _read_cmake(path: Path) -> str:
    try:
        return regularfile.read_text(path, errors="replace")
    except OSError as exc:
        raise UsageError(
            f"Cannot read the CMake file {path}: {exc.strerror or exc}.",
            hint="Pass the kernel source folder of an SGLang tree (its CMake files must be regular, readable files).",
        ) from None


def _declaration_error(dep: Dependency, what: str) -> UsageError:
    return UsageError(
        f"{dep.declared_in}:{dep.line}: the FetchContent declaration of {dep.name!r} {what}; "
        "sm120kit does not fetch it.",
        hint="The CMake files of the source are read as untrusted input: check where this tree "
        "came from, or fetch that dependency by hand and pass -DFETCHCONTENT_SOURCE_DIR_...",
    )


def _check_location(dep: Dependency) -> None:
    """Refuse a name or ``SOURCE_DIR`` that would let the CMake files choose a folder outside ``--into``
    (checked for every declaration read: the build hands these folders to CMake too)."""
    if not _NAME_RE.match(dep.name):
        raise _declaration_error(
            dep, "has a name that is not a plain folder name (letters, digits, '_', '.', '+', '-'; no '/' and not '..')"
        )
    if dep.parent is not None and not _NAME_RE.match(dep.parent):
        raise _declaration_error(dep, f"has a SOURCE_DIR inside {dep.parent!r}, which is not a plain name")
    if dep.subdir is not None and not all(_SUBDIR_PART_RE.match(part) for part in dep.subdir.split("/")):
        raise _declaration_error(
            dep,
            f"has a SOURCE_DIR whose path {dep.subdir!r} is not a plain relative path "
            "(no '..', '.', empty or absolute part)",
        )


def _check_declaration(dep: Dependency) -> None:
    """Before fetching ``dep``: its folder (:func:`_check_location`), a ``GIT_TAG`` or ``GIT_REPOSITORY``
    that git could take as an option, and a ``URL_HASH`` sm120kit cannot check."""
    _check_location(dep)
    if dep.unresolved:
        return  # the values hold ${VARS}: fetching stops on those first
    if dep.git_tag is not None and not (_REF_RE.match(dep.git_tag) and ".." not in dep.git_tag):
        raise _declaration_error(
            dep,
            f"has GIT_TAG {dep.git_tag!r}, which is not a tag, branch or commit name "
            "(one starting with '-' would be an option of git)",
        )
    if dep.git_repository is not None and (
        dep.git_repository.startswith("-") or re.search(r"[\x00-\x20\x7f]", dep.git_repository)
    ):
        raise _declaration_error(
            dep,
            f"has GIT_REPOSITORY {dep.git_repository!r}, which git would take as an "
            "option or which holds a space or control character",
        )
    if dep.url_hash is not None:
        algo, sep, expected = dep.url_hash.partition("=")
        name = _HASHES.get(algo.strip().upper())
        if not sep or name is None:
            raise _declaration_error(
                dep, f"has URL_HASH {dep.url_hash!r}: sm120kit checks {', '.join(_HASHES)} (ALGO=hex digest)"
            )
        if (
            not re.fullmatch(r"[0-9A-Fa-f]+", expected.strip())
            or len(expected.strip()) != 2 * hashlib.new(name).digest_size
        ):
            raise _declaration_error(
                dep,
                f"has URL_HASH {dep.url_hash!r}, whose digest is not "
                f"{2 * hashlib.new(name).digest_size} hex digits for {algo.upper()}",
            )


def _inside(into: Path, folder: Path, dep: Dependency) -> Path:
    """``folder`` if it lies strictly inside ``into`` once links are resolved; else :class:`UsageError`."""
    resolved = folder.resolve()
    if resolved == into or not resolved.is_relative_to(into):
        raise _declaration_error(dep, f"would be written to {resolved}, outside {into}")
    return folder


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
        raise UsageError(
            f"--deps-dir {deps_dir} does not exist.", hint="Create it with: sm120kit fetch-deps SRC --into DIR"
        )
    defines = []
    for dep in deps:
        folder = _inside(deps_dir, dep.folder(deps_dir), dep)
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
        return {
            **self.dependency.to_json(),
            "folder": str(self.folder),
            "status": self.status,
            "revision": self.revision,
        }


def _git_head(folder: Path) -> str | None:
    if not (folder / ".git").exists():
        return None
    result = runner.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=False, what="git rev-parse")
    return result.stdout.strip() if result.ok else None


def _fetch_git(dep: Dependency, folder: Path, log) -> str:
    repo, tag = dep.git_repository, dep.git_tag
    assert repo
    _check_declaration(dep)  # also for a Dependency built by hand: the tag and URL must not be options
    with building_folder(folder) as tmp:
        git = ["git", "-c", "protocol.ext.allow=never", "-C", str(tmp)]  # no "ext::" command transport
        runner.run(["git", "init", "-q", str(tmp)], what=f"git init for {dep.name}")
        runner.run([*git, "remote", "add", "origin", "--", repo], what=f"git remote for {dep.name}")
        ref = tag or "HEAD"
        shallow = runner.run(
            [*git, "fetch", "-q", "--depth", "1", "origin", ref],
            check=False,
            what=f"git fetch of {dep.name}",
            timeout=3600,
        )
        if not shallow.ok:  # a server (or local path) that refuses a shallow fetch of this ref
            log(f"{dep.name}: shallow fetch of {ref} refused, fetching the full history")
            runner.run(
                [*git, "fetch", "-q", "--tags", "origin"], what=f"git fetch of {dep.name} from {repo}", timeout=3600
            )
            runner.run([*git, "checkout", "-q", "--detach", ref, "--"], what=f"git checkout of {dep.name} {ref}")
        else:
            runner.run(
                [*git, "checkout", "-q", "--detach", "FETCH_HEAD", "--"], what=f"git checkout of {dep.name} {ref}"
            )
        if dep.submodules != () and (tmp / ".gitmodules").is_file():
            argv = [*git, "submodule", "update", "--init", "--recursive", "--depth", "1"]
            if dep.submodules:
                argv += ["--", *dep.submodules]
            runner.run(argv, what=f"git submodules of {dep.name}", timeout=3600)
        revision = _git_head(tmp)
    return revision or ""


def _fetch_url(dep: Dependency, folder: Path) -> str:
    """Download ``dep.url``, check its ``URL_HASH`` and unpack it into ``folder``; returns the SHA-256."""
    assert dep.url
    _check_declaration(dep)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        sweep_temp_dirs(folder.parent, folder.name)
        tmp = make_temp_dir(folder.parent, folder.name)  # the download and the unpacked tree
    except OSError as exc:
        raise _disk_error(folder.parent, exc) from None
    try:
        archive_path = tmp / "archive"
        digest = hashlib.sha256()
        algo, _, expected = (dep.url_hash or "").partition("=")
        checked = hashlib.new(_HASHES[algo.strip().upper()]) if dep.url_hash else None
        try:
            with urllib.request.urlopen(dep.url, timeout=120) as response, open(archive_path, "wb") as out:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    if checked is not None:
                        checked.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, ValueError) as exc:
            raise DownloadError(
                f"Could not download '{dep.name}' from {dep.url}: {exc}.",
                hint=f"Check the network, or fetch it elsewhere and copy it to {folder} ({dep.variable}).",
            ) from exc
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_error(archive_path, exc) from None
            raise DownloadError(
                f"Could not download '{dep.name}' from {dep.url}: {exc}.",
                hint=f"Check the network, or fetch it elsewhere and copy it to {folder} ({dep.variable}).",
            ) from exc
        if checked is not None and checked.hexdigest().lower() != expected.strip().lower():
            raise DownloadError(
                f"'{dep.name}' from {dep.url} has {algo.upper()} {checked.hexdigest()}, but "
                f"{dep.declared_in}:{dep.line} expects {expected.strip()}. Nothing was unpacked.",
                hint="The download is not the file the CMake files name: check the URL (and any "
                "mirror set with --set).",
            )
        unpacked = tmp / "src"
        unpacked.mkdir()
        _extract(archive_path, unpacked, dep)
        entries = list(unpacked.iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked  # like FetchContent
        try:
            replace_folder(root, folder)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_error(folder, exc) from None
            raise
        return digest.hexdigest()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _disk_error(path: Path, exc: OSError) -> IOFailure:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return IOFailure(
        f"Cannot write {path}: {exc.strerror or exc}.",
        hint="Free some disk space and run the command again."
        if full
        else "Check that the --into folder is writable by you.",
    )


def _extract(archive_path: Path, dest: Path, dep) -> None:
    """Unpack the downloaded archive of ``dep`` into ``dest`` (:func:`sm120kit.util.archive.unpack`): a
    damaged, unsafe or oversized archive is a :class:`DownloadError` naming the dependency and its URL."""
    try:
        archive.unpack(archive_path, dest)
    except archive.BadArchive as exc:
        reason = str(exc)
        if "unsafe entry" in reason or "outside the folder" in reason:
            reason = f"it has an unsafe entry: {reason}"
        raise DownloadError(
            f"'{dep.name}': the archive from {dep.url} cannot be unpacked: {reason}.",
            hint="Check the URL, or unpack the source yourself and pass its folder with --deps-dir.",
        ) from None
    except OSError as exc:
        raise _disk_error(dest, exc) from None


def _order(deps: tuple[Dependency, ...]) -> list[Dependency]:
    """Parents before the dependencies placed inside them."""
    return sorted(deps, key=lambda d: d.parent is not None)


def fetch_dependencies(
    source: KernelSource,
    into: Path,
    *,
    progress: Progress | None = None,
    on_step: Step | None = None,
    overrides: dict[str, str] | None = None,
    names: tuple[str, ...] | None = None,
) -> tuple[FetchedDependency, ...]:
    """Fetch every dependency of ``source`` (or only ``names``) into ``into/NAME``, skipping those already
    fetched from the same origin; ``overrides`` sets CMake variables used in the declarations."""
    deps = read_dependencies(source, overrides)
    if names is not None:
        unknown = sorted(set(names) - {d.name for d in deps})
        if unknown:
            raise UsageError(
                f"{source.path} declares no dependency named {', '.join(unknown)}; it declares "
                f"{', '.join(d.name for d in deps) or 'none'}."
            )
        deps = tuple(d for d in deps if d.name in names)
    into = Path(into).expanduser().resolve()
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _disk_error(into, exc) from None
    manifest_path = into / MANIFEST
    try:
        manifest = json.loads(regularfile.read_text(manifest_path, follow=False))
    except (OSError, ValueError, RecursionError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    log = on_step or (lambda text: None)
    results = []
    ordered = _order(deps)
    for dep in ordered:  # every declaration is checked before anything is fetched
        _check_declaration(dep)
    for i, dep in enumerate(ordered, 1):
        if dep.unresolved:
            raise UsageError(
                f"The dependency '{dep.name}' ({dep.declared_in}:{dep.line}) uses "
                f"{', '.join('${' + v + '}' for v in dep.unresolved)}, which no set() in the kernel's CMake "
                "files defines.",
                hint=f"Fetch it by hand into {dep.folder(into)} ({dep.variable}).",
            )
        folder = _inside(into, dep.folder(into), dep)
        recorded = manifest.get(dep.name)
        recorded = recorded if isinstance(recorded, dict) else {}
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
            raise UsageError(
                f"The dependency '{dep.name}' ({dep.declared_in}:{dep.line}) has neither "
                "GIT_REPOSITORY nor URL; sm120kit cannot fetch it.",
                hint=f"Put its source in {folder} ({dep.variable}).",
            )
        manifest[dep.name] = {**wanted, "revision": revision, "folder": str(folder.relative_to(into))}
        _write_manifest(manifest_path, manifest)
        results.append(FetchedDependency(dep, folder, "fetched", revision))
        if progress is not None:
            progress(i, len(ordered), dep.name)
    return tuple(results)


def _write_manifest(path: Path, manifest: dict) -> None:
    write_atomic(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 0o644)
