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
from sm120kit.errors import DownloadError, IOFailure, MissingDependency, Sm120kitError, ToolFailed, UsageError
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
    status: str  # "fetched" | "present" | "provided" | "failed"
    revision: str | None  # git commit or sha256 of the archive
    error: Sm120kitError | None = None  # why a "failed" one could not be fetched
    via: str | None = None  # the local repository it was made from (--from-git), if any

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        return {
            **self.dependency.to_json(),
            "folder": str(self.folder),
            "status": self.status,
            "revision": self.revision,
            "via": self.via,
            "error": self.error.to_json() if self.error else None,
        }


def _git_head(folder: Path) -> str | None:
    if not (folder / ".git").exists():
        return None
    result = runner.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=False, what="git rev-parse")
    return result.stdout.strip() if result.ok else None


def _fetch_git(dep: Dependency, folder: Path, log, git_source: GitSource | None = None) -> str:
    repo, tag = dep.git_repository, dep.git_tag
    assert repo
    if git_source is not None:  # a local clone stands in for the declared repository
        repo = str(git_source.repo)
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


def _fetch_url(dep: Dependency, folder: Path, git_source: GitSource | None = None) -> str:
    """Download ``dep.url`` (or make it from ``git_source``, :func:`_archive_from_git`), check its
    ``URL_HASH`` and unpack it into ``folder``; returns the SHA-256 of the archive."""
    assert dep.url
    _check_declaration(dep)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        sweep_temp_dirs(folder.parent, folder.name)
        tmp = make_temp_dir(folder.parent, folder.name)  # the download and the unpacked tree
    except OSError as exc:
        raise _disk_error(folder.parent, exc) from None
    try:
        if git_source is not None:
            archive_path = _archive_from_git(dep, git_source, tmp)
        else:
            archive_path = tmp / "archive"
            _download(dep, folder, archive_path)
        digest = _check_hash(dep, archive_path, made_from=git_source)
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
        return digest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _download(dep: Dependency, folder: Path, archive_path: Path) -> None:
    assert dep.url
    hint = (
        f"Check the network, or fetch it elsewhere and copy its source to {folder} ({dep.variable}; kept as "
        "'provided' by the next fetch-deps), or pass --from-git URL=CLONE for a local clone that holds it."
    )
    try:
        with urllib.request.urlopen(dep.url, timeout=120) as response, open(archive_path, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except (urllib.error.URLError, ValueError) as exc:
        raise DownloadError(f"Could not download '{dep.name}' from {dep.url}: {exc}.", hint=hint) from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_error(archive_path, exc) from None
        raise DownloadError(f"Could not download '{dep.name}' from {dep.url}: {exc}.", hint=hint) from exc


def _file_digest(path: Path, name: str) -> str:
    h = hashlib.new(name)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_hash(dep: Dependency, archive_path: Path, made_from: GitSource | None = None) -> str:
    """The archive's SHA-256; :class:`DownloadError` when it does not match the declared ``URL_HASH``."""
    sha256 = _file_digest(archive_path, "sha256")
    if not dep.url_hash:
        return sha256
    algo, _, expected = dep.url_hash.partition("=")
    name = _HASHES[algo.strip().upper()]
    actual = sha256 if name == "sha256" else _file_digest(archive_path, name)
    if actual.lower() != expected.strip().lower():
        if made_from is not None:
            raise DownloadError(
                f"'{dep.name}': the archive made from {made_from.repo} ({dep.url}) has {algo.upper()} {actual}, "
                f"but {dep.declared_in}:{dep.line} expects {expected.strip()}. Nothing was unpacked.",
                hint="The clone's commit does not give the archive the CMake files name (a different commit "
                "under that name, or an export rule in .gitattributes): check the clone, or drop --from-git "
                "for this URL.",
            )
        raise DownloadError(
            f"'{dep.name}' from {dep.url} has {algo.upper()} {actual}, but "
            f"{dep.declared_in}:{dep.line} expects {expected.strip()}. Nothing was unpacked.",
            hint="The download is not the file the CMake files name: check the URL (and any mirror set with --set).",
        )
    return sha256


# -- local clones instead of the network (--from-git) ------------------------------------------------------
_ARCHIVE_PATH_RE = re.compile(r"^/archive/(?:refs/(?:tags|heads)/)?([A-Za-z0-9_][A-Za-z0-9_.+-]*)\.tar\.gz$")


@dataclass(frozen=True)
class GitSource:
    """A local git repository (a clone or a bare mirror) standing in for the repository at ``prefix``:
    ``https://github.com/NVIDIA/cutlass`` -> ``/srv/mirrors/cutlass.git``."""

    prefix: str
    repo: Path

    @property
    def name(self) -> str:
        return self.prefix.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")

    def archive_ref(self, url: str) -> str | None:
        """The ref of a GitHub-style archive URL under ``prefix`` (``PREFIX/archive/<ref>.tar.gz``), else None."""
        base = self.prefix.rstrip("/").removesuffix(".git")
        if not url.startswith(base + "/"):
            return None
        m = _ARCHIVE_PATH_RE.match(url[len(base) :])
        return m.group(1) if m else None

    def serves_repository(self, git_repository: str) -> bool:
        def norm(u: str) -> str:
            return u.rstrip("/").removesuffix(".git")

        return norm(git_repository) == norm(self.prefix)


def parse_git_source(text: str) -> GitSource:
    """``URL=PATH`` (``--from-git``) -> :class:`GitSource`; the folder must be a git repository."""
    prefix, sep, path = text.partition("=")
    prefix, path = prefix.strip(), path.strip()
    if not sep or not prefix or not path or "://" not in prefix:
        raise UsageError(
            f"--from-git {text!r}: expected URL=PATH, the repository's URL as the CMake files name it and a "
            "local clone of it (e.g. https://github.com/NVIDIA/cutlass=~/mirrors/cutlass.git)."
        )
    repo = Path(path).expanduser().resolve()
    probe = runner.run(["git", "-C", str(repo), "rev-parse", "--git-dir"], check=False, what="git rev-parse")
    if not repo.is_dir() or not probe.ok:
        raise UsageError(f"--from-git {text!r}: {repo} is not a git repository (a clone or a bare mirror).")
    return GitSource(prefix, repo)


def _git_commit(repo: Path, ref: str) -> str | None:
    result = runner.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
        check=False,
        what="git rev-parse",
    )
    return result.stdout.strip() if result.ok and result.stdout.strip() else None


def _archive_from_git(dep: Dependency, source: GitSource, tmp: Path) -> Path:
    """GitHub's archive of ``ref`` made here, byte for byte: ``git archive --format=tar --prefix=NAME-REF/``
    compressed by ``gzip -n`` (checked against the published tarballs of CUTLASS, fmt and FlashInfer).
    GitHub drops a tag's leading ``v`` from the folder name (``triton-3.7.1/``); both are tried when the
    first does not give the declared hash. Returns the archive's path."""
    assert dep.url
    ref = source.archive_ref(dep.url)
    if ref is None or not _REF_RE.match(ref) or ".." in ref:
        raise UsageError(
            f"'{dep.name}': {dep.url} is not an archive URL (PREFIX/archive/REF.tar.gz) of {source.prefix}."
        )
    commit = _git_commit(source.repo, ref)
    if commit is None:
        raise DownloadError(
            f"'{dep.name}' ({dep.declared_in}:{dep.line}) needs {ref} of {source.prefix}, which the local "
            f"repository {source.repo} does not hold.",
            hint=f"Update the clone (git -C {source.repo} fetch origin {ref}), or put the source of that commit "
            f"in the dependency's folder by hand ({dep.variable}).",
        )
    gzip = runner.which("gzip")
    if gzip is None:
        raise MissingDependency("gzip is not on PATH; --from-git makes GitHub's archive with 'gzip -n'.")
    prefixes = [f"{source.name}-{ref}"]
    if re.match(r"^v\d", ref):
        prefixes.append(f"{source.name}-{ref[1:]}")
    archive_path = tmp / "archive.tar.gz"
    for i, prefix in enumerate(prefixes):
        tar = tmp / "archive.tar"
        archive_path.unlink(missing_ok=True)
        runner.run(
            ["git", "-C", str(source.repo), "archive", "--format=tar", f"--prefix={prefix}/", "-o", str(tar), commit],
            what=f"git archive of {dep.name}",
            timeout=3600,
        )
        runner.run([gzip, "-n", str(tar)], what=f"gzip of {dep.name}", timeout=3600)
        if i + 1 == len(prefixes) or not dep.url_hash:
            break
        try:
            _check_hash(dep, archive_path, made_from=source)
            break
        except DownloadError:
            continue
    return archive_path


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
    git_sources: tuple[GitSource, ...] = (),
) -> tuple[FetchedDependency, ...]:
    """Fetch every dependency of ``source`` (or only ``names``) into ``into/NAME``, skipping those already
    fetched from the same origin; ``overrides`` sets CMake variables used in the declarations;
    ``git_sources`` are local clones that stand in for the repositories they name.

    A folder that holds files but no record of this command (its source put there by hand) is kept as
    "provided", never replaced. A dependency that cannot be fetched (no network, a commit the clone lacks)
    does not stop the others: it comes back with status "failed" and its error (:func:`failures`).
    """
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
    failed_parents: set[str] = set()
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
        status = None
        if _is_populated(folder) and all(recorded.get(k) == v for k, v in wanted.items()):
            status, revision = "present", recorded.get("revision")
        elif _is_populated(folder) and not recorded:
            status, revision = "provided", None  # put there by hand: the user's, never replaced
        if status is not None:
            results.append(FetchedDependency(dep, folder, status, revision, via=recorded.get("via")))
            if progress is not None:
                progress(i, len(ordered), f"{dep.name} ({status})")
            continue
        git_source = _git_source_for(dep, git_sources)
        try:
            if dep.parent in failed_parents:
                raise MissingDependency(
                    f"'{dep.name}' lies inside '{dep.parent}', which could not be fetched.",
                    hint=f"Provide '{dep.parent}' first.",
                )
            if dep.git_repository:
                if dep.parent:  # nested inside a parent that may be a git checkout itself
                    folder.parent.mkdir(parents=True, exist_ok=True)
                revision = _fetch_git(dep, folder, log, git_source)
            elif dep.url:
                revision = _fetch_url(dep, folder, git_source)
            else:
                raise UsageError(
                    f"The dependency '{dep.name}' ({dep.declared_in}:{dep.line}) has neither "
                    "GIT_REPOSITORY nor URL; sm120kit cannot fetch it.",
                    hint=f"Put its source in {folder} ({dep.variable}).",
                )
        except (DownloadError, MissingDependency, ToolFailed) as exc:  # this one's failure, not the command's
            failed_parents.add(dep.name)
            results.append(FetchedDependency(dep, folder, "failed", None, error=exc))
            log(f"{dep.name}: {exc.message}")
            if progress is not None:
                progress(i, len(ordered), f"{dep.name} (failed)")
            continue
        via = str(git_source.repo) if git_source else None
        manifest[dep.name] = {**wanted, "revision": revision, "folder": str(folder.relative_to(into)), "via": via}
        _write_manifest(manifest_path, manifest)
        results.append(FetchedDependency(dep, folder, "fetched", revision, via=via))
        if progress is not None:
            progress(i, len(ordered), dep.name)
    return tuple(results)


def failures(results: tuple[FetchedDependency, ...]) -> tuple[FetchedDependency, ...]:
    return tuple(r for r in results if not r.ok)


def failure_error(results: tuple[FetchedDependency, ...], into: Path) -> Sm120kitError | None:
    """One error for every dependency that could not be fetched, each with why (a failed git command's last
    output lines included) and how to provide it; the exit code is the first one's. None when all are there."""
    failed = failures(results)
    if not failed:
        return None
    lines = [
        f"{len(failed)} of {len(results)} dependencies could not be fetched into {into} (the others are there). "
        "Provide each one as its line says and run fetch-deps again (a folder filled by hand is kept as "
        f"'provided'); build-kernel --deps-dir {into} needs every one:"
    ]
    for r in failed:
        text = r.error.render().replace("\n", "\n    ")
        lines.append(f"  {r.dependency.name} ({r.dependency.origin}): {text}")
    return type(failed[0].error)("\n".join(lines))


def _git_source_for(dep: Dependency, git_sources: tuple[GitSource, ...]) -> GitSource | None:
    for candidate in git_sources:
        if dep.url and candidate.archive_ref(dep.url) is not None:
            return candidate
        if dep.git_repository and candidate.serves_repository(dep.git_repository):
            return candidate
    return None


def _write_manifest(path: Path, manifest: dict) -> None:
    write_atomic(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 0o644)
