"""Patch series: ``series.toml``, each patch's ``patch.toml`` and its version-ranged diffs.

:func:`load_series` reads and validates a whole series (format: ``docs/series-format.md``). Validation is
strict: an unknown key is rejected with a did-you-mean suggestion, a wrong type or value names the file
and line, and every diff is parsed with :mod:`unidiff` up front, so a series that loads is usable.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import unidiff
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sm120kit.errors import SeriesError
from sm120kit.patching import ranges, treepath
from sm120kit.patching.hunks import ADDED, DiffFormatError, FileDiff, HunkSpec, file_diffs, split_lines
from sm120kit.util import resources, tomldoc
from sm120kit.util.suggest import did_you_mean

SERIES_FILE = "series.toml"
PATCH_FILE = "patch.toml"

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


# -- the data --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    reference: str  # PR or issue URL ("" when not forwarded)
    forwarded: bool
    reason: str  # why not forwarded (required when forwarded is false)

    def to_json(self) -> dict:
        return {"reference": self.reference, "forwarded": self.forwarded, "reason": self.reason}


@dataclass(frozen=True)
class ShippedFile:
    """A ``[[files]]`` entry: a whole file of this repository (``source``, relative to the data root that
    holds ``patches/`` and ``kernels/``) written to ``dest`` in the SGLang tree, with the variants whose
    base release lies in ``releases``. ``sources`` lists the files it stands for (one, or every regular
    file of a source folder) as (source path, destination path, mode)."""

    source: str
    dest: str
    releases: SpecifierSet
    sources: tuple[tuple[Path, str, int], ...] = field(compare=False, hash=False, repr=False)
    created: tuple[FileDiff, ...] = field(default=(), compare=False, hash=False, repr=False)

    def contains(self, version: str) -> bool:
        try:
            return self.releases.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def diffs(self) -> tuple[FileDiff, ...]:
        """The files as created-file diffs, which the planner, the engine and the upstream checks treat
        exactly like a ``--- /dev/null`` section of a variant diff (read once, when the series is loaded)."""
        return self.created

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "dest": self.dest,
            "releases": str(self.releases),
            "files": [dest for _, dest, _ in self.sources],
        }


@dataclass(frozen=True)
class Variant:
    diff: Path
    releases: SpecifierSet
    base: str
    patch_set: unidiff.PatchSet = field(compare=False, hash=False, repr=False)
    files: tuple[FileDiff, ...] = field(default=(), compare=False, hash=False, repr=False)
    shipped: tuple[ShippedFile, ...] = field(default=(), compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.files and self.patch_set is not None:  # built by hand from a PatchSet
            object.__setattr__(self, "files", file_diffs(self.patch_set))

    @property
    def name(self) -> str:
        return self.diff.name

    def contains(self, version: str) -> bool:
        """Whether the range holds ``version`` as written (:func:`sm120kit.patching.ranges.in_range`)."""
        try:
            return ranges.in_range(self.releases, Version(version))
        except InvalidVersion:
            return False

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    @property
    def diff_files(self) -> tuple[FileDiff, ...]:
        """The file sections written in the variant's diff (its hooks), without the shipped whole files."""
        shipped = {f.path for entry in self.shipped for f in entry.diffs()}
        return tuple(f for f in self.files if f.path not in shipped)

    def to_json(self) -> dict:
        return {
            "diff": self.diff.name,
            "releases": str(self.releases),
            "base": self.base,
            "files": list(self.paths),
            "shipped": [entry.to_json() for entry in self.shipped],
        }


class BoundedPattern:
    """An upstream marker's regular expression, matched in time linear in the text (RE2: no
    backtracking), so a pattern from a series of unknown origin cannot hang a run. The syntax is
    Python's ``re`` without back-references and look-arounds; ``^`` and ``$`` match at every line."""

    def __init__(self, text: str) -> None:
        import re2  # google-re2

        options = re2.Options()
        options.log_errors = False
        self.pattern = text
        try:
            self._compiled = re2.compile(b"(?m)" + text.encode("utf-8", "surrogateescape"), options)
        except re2.error as exc:
            raise ValueError(
                exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            ) from None

    def search(self, text: str) -> int | None:
        """The 1-based line where the pattern first matches ``text``, or ``None``."""
        data = text.encode("utf-8", "surrogateescape")
        match = self._compiled.search(data)
        return None if match is None else data.count(b"\n", 0, match.start()) + 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoundedPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"BoundedPattern({self.pattern!r})"


@dataclass(frozen=True)
class Marker:
    files: tuple[str, ...]  # alternatives: the first that exists is searched
    pattern: BoundedPattern

    def to_json(self) -> dict:
        return {"files": list(self.files), "pattern": self.pattern.pattern}


@dataclass(frozen=True)
class Patch:
    id: str
    title: str
    description: str
    problem: str
    upstream: Upstream
    variants: tuple[Variant, ...]
    markers: tuple[Marker, ...]
    folder: Path
    audit: tuple[str, ...] = ()  # "launcher/entry" cases of the shared-memory audit that prove the patch
    shipped: tuple[ShippedFile, ...] = ()  # the [[files]] entries

    def variants_newest_first(self) -> tuple[Variant, ...]:
        return tuple(sorted(self.variants, key=lambda v: Version(v.base), reverse=True))

    def variant_for(self, version: str) -> Variant | None:
        """The variant whose release range holds ``version`` (newest base first), else ``None``; a
        pre-release of F falls to the range that starts at F (:mod:`sm120kit.patching.ranges`)."""
        found = ranges.select([v.releases for v in self.variants_newest_first()], version)
        return None if found is None else self.variants_newest_first()[found]

    def gap_around(self, version: str) -> tuple[Variant, Variant] | None:
        """(the nearest variant below, the nearest above) when ``version`` lies in a hole between two
        variants' ranges, else ``None``."""
        found = ranges.hole([v.releases for v in self.variants], version)
        return None if found is None else (self.variants[found[0]], self.variants[found[1]])

    def past_every_range(self, version: str) -> bool:
        """Whether ``version`` is above the end of every variant's range (the patch was retired before it)."""
        return ranges.past_all([v.releases for v in self.variants], version)

    def before_every_range(self, version: str) -> bool:
        """Whether ``version`` is below the start of every variant's range (the patch is for later releases)."""
        return ranges.before_all([v.releases for v in self.variants], version)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "description": self.description,
            "problem": self.problem,
            "upstream": self.upstream.to_json(),
            "variants": [v.to_json() for v in self.variants],
            "markers": [m.to_json() for m in self.markers],
            "audit": list(self.audit),
            "files": [f.to_json() for f in self.shipped],
            "folder": str(self.folder),
        }


@dataclass(frozen=True)
class Series:
    path: Path
    patches: tuple[Patch, ...]

    def get(self, patch_id: str) -> Patch | None:
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        return None

    def to_json(self) -> dict:
        return {"path": str(self.path), "patches": [p.to_json() for p in self.patches]}


def default_series_dir() -> Path:
    return resources.patches_dir() / "sglang"


def source_root(series_folder: Path) -> Path:
    """The data root a series' ``[[files]]`` sources are relative to: the folder two levels above the
    series (``patches/sglang`` -> the repository root in a checkout, ``sm120kit/_data`` in a wheel)."""
    return Path(series_folder).parent.parent


# -- TOML with line numbers (sm120kit.util.tomldoc) -----------------------------------------------------------

_WORDING = tomldoc.Wording(
    syntax_hint="Fix the syntax (see docs/series-format.md for an example).",
    type_names={str: "string", bool: "boolean (true/false)", list: "array", dict: "table", int: "integer"},
    wanted_prefix="a ",
    alternatives={(str, list): "string or array of strings"},
)


def _read_toml(file: Path) -> tomldoc.Doc:
    return tomldoc.read(file, SeriesError, _WORDING)


# -- loading ---------------------------------------------------------------------------------------------


def load_series(path: Path | None = None) -> Series:
    """Read the series in ``path`` (default: the bundled ``patches/sglang``); :class:`SeriesError` if bad."""
    folder = Path(path) if path is not None else default_series_dir()
    folder = folder.expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        parent = f" (the folder that holds it: --series {folder.parent})" if folder.name == SERIES_FILE else ""
        raise SeriesError(
            f"The patch series {folder} is a file, not a folder: --series takes the folder that "
            f"holds {SERIES_FILE} and the patches{parent}.",
            hint="Pass --series DIR with a folder holding series.toml (docs/series-format.md).",
        )
    if not folder.is_dir():
        raise SeriesError(
            f"The patch series folder {folder} does not exist.",
            hint="Pass --series DIR with a folder holding series.toml (docs/series-format.md).",
        )
    series_file = folder / SERIES_FILE
    if not series_file.is_file():
        raise SeriesError(
            f"The patch series folder {folder} has no {SERIES_FILE} yet, so there is nothing to list or apply.",
            hint="Add series.toml naming the patches in order (docs/series-format.md), or pass --series DIR.",
        )
    doc = _read_toml(series_file)
    tomldoc.check_keys(doc, doc.data, (), {"patches": list}, (), "series.toml")
    ids = doc.data.get("patches", [])
    seen: set[str] = set()
    patches: list[Patch] = []
    for i, patch_id in enumerate(ids):
        if not isinstance(patch_id, str) or not _ID_RE.match(patch_id):
            raise doc.fail(
                ("patches",),
                f"entry {i + 1} of 'patches' ({patch_id!r}) is not a patch id "
                "(lower-case letters, digits, '.', '_' and '-').",
            )
        if patch_id in seen:
            raise doc.fail(("patches",), f"patch '{patch_id}' is listed twice in 'patches'.")
        seen.add(patch_id)
        patch_folder = folder / patch_id
        if not (patch_folder / PATCH_FILE).is_file():
            present = sorted(p.name for p in folder.iterdir() if (p / PATCH_FILE).is_file())
            raise doc.fail(
                ("patches",),
                f"patch '{patch_id}' has no folder {patch_folder.name}/ with "
                f"{PATCH_FILE}.{did_you_mean(patch_id, present)}",
            )
        patches.append(load_patch(patch_folder))
    listed = set(ids)
    for extra in sorted(p for p in folder.iterdir() if (p / PATCH_FILE).is_file() and p.name not in listed):
        raise doc.fail(
            ("patches",),
            f"the folder {extra.name}/ holds a patch that series.toml does not list.",
            hint="Add its id to 'patches' (in order of application) or remove the folder.",
        )
    return Series(path=folder, patches=tuple(patches))


_PATCH_KEYS = {
    "id": str,
    "title": str,
    "description": str,
    "problem": str,
    "upstream": dict,
    "variants": list,
    "markers": list,
    "audit": list,
    "files": list,
}
_REQUIRED_PATCH_KEYS = ("id", "title", "description", "problem", "upstream", "variants", "markers")
_AUDIT_RE = re.compile(r"^([a-z0-9-]+)/([A-Za-z0-9][A-Za-z0-9._-]*)$")
_UPSTREAM_KEYS = {"reference": str, "forwarded": bool, "reason": str}
_VARIANT_KEYS = {"diff": str, "releases": str, "base": str}
_MARKER_KEYS = {"file": (str, list), "pattern": str}
_FILE_KEYS = {"source": str, "dest": str, "releases": str}
# A source folder ships at most this many files, each at most this large: a series is untrusted input.
MAX_FOLDER_FILES = 512
MAX_SOURCE_BYTES = 8 << 20


def load_patch(folder: Path) -> Patch:
    """Read one patch folder (``patch.toml`` and its diffs)."""
    doc = _read_toml(folder / PATCH_FILE)
    data = doc.data
    tomldoc.check_keys(doc, data, (), _PATCH_KEYS, _REQUIRED_PATCH_KEYS, "patch.toml")
    if data["id"] != folder.name:
        raise doc.fail(
            ("id",),
            f"id '{data['id']}' differs from its folder name '{folder.name}'.",
            hint="The id, the folder and the entry in series.toml must be the same.",
        )
    for key in ("title", "problem", "description"):
        if not data[key].strip():
            raise doc.fail((key,), f"'{key}' is empty.")

    up = data["upstream"]
    tomldoc.check_keys(doc, up, ("upstream",), _UPSTREAM_KEYS, ("forwarded",), "[upstream]")
    reference, reason = up.get("reference", "").strip(), up.get("reason", "").strip()
    if up["forwarded"]:
        if not re.match(r"^https?://\S+$", reference):
            raise doc.fail(
                ("upstream", "reference"),
                f"a forwarded patch needs 'reference' set to the URL of its pull request or issue (got {reference!r}).",
            )
    elif not reason:
        raise doc.fail(
            ("upstream", "forwarded"), "'forwarded = false' needs a 'reason' saying why the patch is not sent upstream."
        )
    upstream = Upstream(reference=reference, forwarded=up["forwarded"], reason=reason)

    if not data["variants"]:
        raise doc.fail(("variants",), "a patch needs at least one [[variants]] entry.")
    variants = tuple(_variant(doc, folder, i, v) for i, v in enumerate(data["variants"]))
    _check_overlap(doc, variants)
    shipped = tuple(_shipped(doc, folder, i, f) for i, f in enumerate(data.get("files", [])))
    variants = _with_shipped(doc, variants, shipped)

    if not data["markers"]:
        raise doc.fail(
            ("markers",),
            "a patch needs at least one [[markers]] entry (a pattern that shows an upstream tree already has the fix).",
        )
    markers = tuple(_marker(doc, i, m) for i, m in enumerate(data["markers"]))
    audit = _audit_entries(doc, data["audit"]) if "audit" in data else ()
    return Patch(
        id=data["id"],
        title=data["title"].strip(),
        description=data["description"].strip(),
        problem=data["problem"].strip(),
        upstream=upstream,
        variants=variants,
        markers=markers,
        folder=folder,
        audit=audit,
        shipped=shipped,
    )


def _audit_entries(doc: tomldoc.Doc, raw: list) -> tuple[str, ...]:
    """``audit = ["extend/deepseek-v3-mla", ...]``: the launcher and the shape-matrix entry of each audit
    case that proves the patch's kernel changes (docs/series-format.md)."""
    from sm120kit.sglang.launchers import LAUNCHERS  # reads no SGLang and no torch

    if not raw:
        raise doc.fail(
            ("audit",),
            "'audit' is empty; name the audit entries that prove the patch (\"launcher/entry\") or leave the key out.",
        )
    seen: list[str] = []
    for index, item in enumerate(raw):
        match = _AUDIT_RE.match(item) if isinstance(item, str) else None
        if match is None:
            raise doc.fail(
                ("audit",),
                f"entry {index + 1} of 'audit' ({item!r}) is not \"launcher/entry\" "
                "(a launcher of the shared-memory audit and an entry of its shape matrix, "
                'e.g. "extend/deepseek-v3-mla").',
            )
        if match.group(1) not in LAUNCHERS:
            raise doc.fail(
                ("audit",),
                f"entry {index + 1} of 'audit' ({item!r}) names the launcher "
                f"'{match.group(1)}', which the audit does not run."
                f"{did_you_mean(match.group(1), list(LAUNCHERS))}",
                hint=f"Launchers: {', '.join(LAUNCHERS)}.",
            )
        if item in seen:
            raise doc.fail(("audit",), f"'audit' lists {item!r} twice.")
        seen.append(item)
    return tuple(seen)


def _table(doc: tomldoc.Doc, value: Any, path: tuple, what: str) -> dict:
    if not isinstance(value, dict):
        raise doc.fail(path, f"each {what} entry must be a table ([[{path[0]}]]), not {value!r}.")
    return value


def _releases(doc: tomldoc.Doc, raw: dict, path: tuple, example: str) -> SpecifierSet:
    """The entry's ``releases`` as a specifier set; refused when it does not parse or is empty."""
    try:
        releases = SpecifierSet(raw["releases"])
    except InvalidSpecifier:
        raise doc.fail(
            path + ("releases",),
            f"releases = {raw['releases']!r} is not a PEP 440 specifier set.",
            hint=f'Write something like "{example}".',
        ) from None
    if not str(releases):
        raise doc.fail(path + ("releases",), 'releases is empty; give the range, e.g. ">=0.5.2".')
    return releases


def _variant(doc: tomldoc.Doc, folder: Path, index: int, raw: Any) -> Variant:
    path = ("variants", index)
    raw = _table(doc, raw, path, "variants")
    tomldoc.check_keys(doc, raw, path, _VARIANT_KEYS, tuple(_VARIANT_KEYS), f"[[variants]] entry {index + 1}")
    releases = _releases(doc, raw, path, ">=0.5.2,<0.5.7")
    try:
        Version(raw["base"])
    except InvalidVersion:
        raise doc.fail(path + ("base",), f"base = {raw['base']!r} is not a release version.") from None
    if not ranges.in_range(releases, Version(raw["base"])):
        raise doc.fail(path + ("base",), f"base {raw['base']} lies outside its own releases range '{releases}'.")
    diff_path = folder / raw["diff"]
    if "/" in raw["diff"] or not diff_path.is_file():
        present = sorted(p.name for p in folder.glob("*.diff"))
        raise doc.fail(
            path + ("diff",), f"diff file '{raw['diff']}' is not in {folder}.{did_you_mean(raw['diff'], present)}"
        )
    patch_set = parse_diff(diff_path)
    files = _files(diff_path, patch_set)
    return Variant(diff=diff_path, releases=releases, base=raw["base"], patch_set=patch_set, files=files)


def _created(text: str, dest: str, mode: int) -> FileDiff:
    lines = tuple((ADDED, line) for line in split_lines(text))
    hunk = HunkSpec(
        index=1,
        source_start=0,
        source_length=0,
        target_start=1 if lines else 0,
        target_length=len(lines),
        section="",
        lines=lines,
        diff_line=0,
    )
    return FileDiff(path=dest, action="create", hunks=(hunk,), mode=mode, diff_line=0)


class _SourceProblem(Exception):
    """Why a ``[[files]]`` source cannot be shipped (one clause, naming the file or folder)."""


def _examine(dir_fd: int, name: str, shown: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise _SourceProblem(f"{shown} does not exist") from None
    except OSError as exc:
        raise _SourceProblem(f"{shown} cannot be examined ({exc.strerror or exc})") from None


def _open_at(dir_fd: int, name: str, shown: str, *, folder: bool) -> int:
    """Open ``name`` in the folder ``dir_fd`` without following a link: a folder, or a regular file."""
    info = _examine(dir_fd, name, shown)
    if stat.S_ISLNK(info.st_mode):
        raise _SourceProblem(f"{shown} is a symbolic link; shipped files are never read through a link")
    if folder and not stat.S_ISDIR(info.st_mode):
        raise _SourceProblem(f"{shown} is not a folder")
    if not folder and not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise _SourceProblem(f"{shown} is neither a regular file nor a folder")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if folder else 0)
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _SourceProblem(f"{shown} cannot be opened ({exc.strerror or exc})") from None


def _read_open(fd: int, shown: str) -> tuple[str, int]:
    """The text and the mode of the regular file open at ``fd`` (UTF-8, at most MAX_SOURCE_BYTES)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _SourceProblem(f"{shown} is not a regular file")
    if info.st_size > MAX_SOURCE_BYTES:
        raise _SourceProblem(
            f"{shown} holds {info.st_size} bytes, more than the {MAX_SOURCE_BYTES} a shipped file may have"
        )
    chunks, size = [], 0
    while size <= MAX_SOURCE_BYTES:
        chunk = os.read(fd, min(1 << 20, MAX_SOURCE_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_SOURCE_BYTES:
        raise _SourceProblem(f"{shown} grew past the {MAX_SOURCE_BYTES} bytes a shipped file may have")
    try:
        return b"".join(chunks).decode("utf-8"), _mode(info.st_mode)
    except UnicodeDecodeError as exc:
        raise _SourceProblem(f"{shown} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_sources(root: Path, source: str, dest: str) -> list[tuple[Path, str, int, str]]:
    """(source path, destination, mode, text) of every file a ``[[files]]`` entry ships: ``source`` (relative,
    already checked) is walked from the data root one folder at a time, each opened without following a
    link, so nothing outside the root is read even if the tree changes meanwhile."""
    parts = source.split("/")
    try:
        fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    except OSError as exc:
        raise _SourceProblem(f"the data root cannot be opened ({exc.strerror or exc})") from None
    try:
        for depth, part in enumerate(parts[:-1]):
            fds.append(_open_at(fds[-1], part, "/".join(parts[: depth + 1]), folder=True))
        fd = _open_at(fds[-1], parts[-1], source, folder=False)
        fds.append(fd)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            text, mode = _read_open(fd, source)
            return [(root / source, dest, mode, text)]
        out = []
        for name in sorted(os.listdir(fd)):
            shown = f"{source}/{name}"
            if stat.S_ISDIR(_examine(fd, name, shown).st_mode):
                continue  # a folder entry ships the files directly inside it
            why = treepath.problem(f"{dest}/{name}")
            if why:
                raise _SourceProblem(f"{shown} cannot be shipped: its destination {dest}/{name} {why}")
            if len(out) == MAX_FOLDER_FILES:
                raise _SourceProblem(f"{source} holds more than the {MAX_FOLDER_FILES} files a folder entry may ship")
            child = _open_at(fd, name, shown, folder=False)
            try:
                text, mode = _read_open(child, shown)
            finally:
                os.close(child)
            out.append((root / shown, f"{dest}/{name}", mode, text))
        if not out:
            raise _SourceProblem(f"{source} is a folder without files to ship")
        return out
    except OSError as exc:
        raise _SourceProblem(f"{source} cannot be read ({exc.strerror or exc})") from None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _relative_problem(text: str) -> str | None:
    if not text or text.startswith("/") or "\\" in text:
        return "is not a relative path written with '/'"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return "holds a control character"
    if any(part in ("", ".", "..") for part in text.split("/")):
        return "has an empty, '.' or '..' component"
    return None


def _shipped(doc: tomldoc.Doc, folder: Path, index: int, raw: Any) -> ShippedFile:
    """One ``[[files]]`` entry; its source must be a regular file (or a folder of regular files) inside the
    data root, reached without following a symbolic link."""
    path = ("files", index)
    raw = _table(doc, raw, path, "files")
    tomldoc.check_keys(doc, raw, path, _FILE_KEYS, tuple(_FILE_KEYS), f"[[files]] entry {index + 1}")
    why = _relative_problem(raw["source"])
    if why:
        raise doc.fail(
            path + ("source",),
            f"source = {raw['source']!r} {why}; it names a file or folder "
            "relative to the data root (the folder holding patches/).",
        )
    dest = raw["dest"].rstrip("/")
    why = treepath.problem(dest)
    if why:
        raise doc.fail(
            path + ("dest",), f"dest = {raw['dest']!r} {why}; write the destination in the SGLang tree as 'sglang/...'."
        )
    releases = _releases(doc, raw, path, ">=0.5.16")
    root = source_root(folder.parent)
    try:
        entries = _read_sources(root, raw["source"], dest)
    except _SourceProblem as exc:
        raise doc.fail(
            path + ("source",),
            f"the source of [[files]] entry {index + 1} cannot be shipped: {exc} (under the data root {root}).",
            hint="A [[files]] source is a regular UTF-8 file, or a folder of them, inside the data root, "
            "reached without a symbolic link (docs/series-format.md).",
        ) from None
    return ShippedFile(
        source=raw["source"],
        dest=dest,
        releases=releases,
        sources=tuple((p, d, m) for p, d, m, _ in entries),
        created=tuple(_created(text, d, m) for _, d, m, text in entries),
    )


def _mode(st_mode: int) -> int:
    """Shipped files are created 0644, or 0755 when the source is executable by its owner."""
    return 0o755 if st_mode & stat.S_IXUSR else 0o644


def _with_shipped(
    doc: tomldoc.Doc, variants: tuple[Variant, ...], shipped: tuple[ShippedFile, ...]
) -> tuple[Variant, ...]:
    """Each variant gains the files of the entries whose range holds its base release, after its own diff's
    sections; a destination the diff also writes is an error."""
    if not shipped:
        return variants
    out = []
    for variant in variants:
        mine = tuple(entry for entry in shipped if entry.contains(variant.base))
        files = list(variant.files)
        seen = {f.path for f in files}
        for entry in mine:
            for diff in entry.diffs():
                if diff.path in seen:
                    raise doc.fail(
                        ("files",),
                        f"{diff.path} is written twice for variant {variant.name} "
                        f"(by its diff or by another [[files]] entry).",
                    )
                seen.add(diff.path)
                files.append(diff)
        out.append(
            Variant(
                diff=variant.diff,
                releases=variant.releases,
                base=variant.base,
                patch_set=variant.patch_set,
                files=tuple(files),
                shipped=mine,
            )
        )
    for index, entry in enumerate(shipped):
        if not any(entry in v.shipped for v in out):
            raise doc.fail(
                ("files", index, "releases"),
                f"no variant's base release lies in releases "
                f"'{entry.releases}' of [[files]] entry {index + 1}, so "
                "it would never be shipped.",
            )
    return tuple(out)


def _probe_versions(variants: tuple[Variant, ...]) -> list[str]:
    """Versions at and just past every range boundary and base: two ranges overlap iff one of them is in
    both (for the interval-shaped ranges a series uses)."""
    points: set[str] = set()
    for variant in variants:
        texts = [variant.base] + [s.version.rstrip(".*") for s in variant.releases]
        for text in texts:
            try:
                version = Version(text)
            except InvalidVersion:
                continue
            release = list(version.release)
            points.add(str(version))
            points.add(".".join(map(str, release + [1])))
            release[-1] += 1
            points.add(".".join(map(str, release)))
    return sorted(points, key=Version)


def _check_overlap(doc: tomldoc.Doc, variants: tuple[Variant, ...]) -> None:
    probes = _probe_versions(variants)
    for i, a in enumerate(variants):
        for j in range(i + 1, len(variants)):
            b = variants[j]
            both = [v for v in probes if a.contains(v) and b.contains(v)]
            if both:
                raise doc.fail(
                    ("variants", j, "releases"),
                    f"the release ranges of variants {a.name} ('{a.releases}') and {b.name} "
                    f"('{b.releases}') overlap: {both[0]} is in both.",
                    hint="Each release must select exactly one variant.",
                )


def _marker(doc: tomldoc.Doc, index: int, raw: Any) -> Marker:
    path = ("markers", index)
    raw = _table(doc, raw, path, "markers")
    tomldoc.check_keys(doc, raw, path, _MARKER_KEYS, tuple(_MARKER_KEYS), f"[[markers]] entry {index + 1}")
    files = (raw["file"],) if isinstance(raw["file"], str) else tuple(raw["file"])
    if not files or not all(isinstance(f, str) and f.startswith("sglang/") and ".." not in f for f in files):
        raise doc.fail(
            path + ("file",), f"file = {raw['file']!r} must be a path (or list of paths) starting with 'sglang/'."
        )
    try:
        pattern = BoundedPattern(raw["pattern"])
    except ValueError as exc:
        raise doc.fail(
            path + ("pattern",),
            f"pattern {raw['pattern']!r} is not a valid regular expression for "
            f"a marker (matched in bounded time): {exc}.",
            hint="Markers use Python 're' syntax without back-references or look-arounds (they are "
            "matched by RE2, in time linear in the file).",
        ) from None
    return Marker(files=files, pattern=pattern)


class _CountingLines:
    """Feeds a diff to unidiff line by line and remembers the number of the last line read."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines
        self.line = 0

    def __iter__(self) -> Iterator[str]:
        for self.line, text in enumerate(self._lines, 1):
            yield text


def parse_diff(diff_path: Path) -> unidiff.PatchSet:
    """Parse a unified diff; :class:`SeriesError` naming ``file:line`` if unidiff rejects it."""
    try:
        with open(diff_path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SeriesError(f"{diff_path}: cannot be read as UTF-8 text ({exc}).") from None
    lines = re.findall(r"[^\n]*\n|[^\n]+", text)
    for number, line in enumerate(lines, 1):
        if line.endswith("\r\n") and line.startswith(("diff ", "--- ", "+++ ", "@@ ", "index ")):
            raise SeriesError(
                f"{diff_path}:{number}: the diff has Windows (CRLF) line endings; sm120kit reads diffs with "
                "LF line endings only (a CR that belongs to a changed line is kept).",
                hint="Convert the diff with 'dos2unix' (or 'git config core.autocrlf false' and regenerate it "
                "with 'git diff').",
            )
    feed = _CountingLines(lines)
    try:
        patch_set = unidiff.PatchSet(feed)
    except unidiff.UnidiffParseError as exc:
        raise SeriesError(
            f"{diff_path}:{feed.line}: not a valid unified diff: {exc}.",
            hint="Regenerate the diff with 'git diff' or 'diff -u' rather than editing hunks "
            "by hand (hunk headers count lines).",
        ) from None
    if not len(patch_set):
        raise SeriesError(
            f"{diff_path}: holds no file changes (expected '--- a/sglang/...' and "
            "'+++ b/sglang/...' headers followed by hunks)."
        )
    return patch_set


def _files(diff_path: Path, patch_set: unidiff.PatchSet) -> tuple[FileDiff, ...]:
    try:
        return file_diffs(patch_set)
    except DiffFormatError as exc:
        where = f"{diff_path}:{exc.line}" if exc.line else str(diff_path)
        raise SeriesError(f"{where}: {exc}.") from None
