"""Patch series: ``series.toml``, each patch's ``patch.toml`` and its version-ranged diffs.

:func:`load_series` reads and validates a whole series (format: ``docs/series-format.md``). Validation is
strict: an unknown key is rejected with a did-you-mean suggestion, a wrong type or value names the file
and line, and every diff is parsed with :mod:`unidiff` up front, so a series that loads is usable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import unidiff
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from sm120kit.util import resources
from sm120kit.util import tomldoc
from sm120kit.errors import SeriesError
from sm120kit.patching.hunks import DiffFormatError, FileDiff, file_diffs
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
class Variant:
    diff: Path
    releases: SpecifierSet
    base: str
    patch_set: unidiff.PatchSet = field(compare=False, hash=False, repr=False)
    files: tuple[FileDiff, ...] = field(default=(), compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.files and self.patch_set is not None:  # built by hand from a PatchSet
            object.__setattr__(self, "files", file_diffs(self.patch_set))

    @property
    def name(self) -> str:
        return self.diff.name

    def contains(self, version: str) -> bool:
        try:
            return self.releases.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def to_json(self) -> dict:
        return {"diff": self.diff.name, "releases": str(self.releases), "base": self.base,
                "files": list(self.paths)}


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
            raise ValueError(exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes)
                             else str(exc)) from None

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

    def variants_newest_first(self) -> tuple[Variant, ...]:
        return tuple(sorted(self.variants, key=lambda v: Version(v.base), reverse=True))

    def variant_for(self, version: str) -> Variant | None:
        """The variant whose release range contains ``version`` (newest base first), else ``None``."""
        for variant in self.variants_newest_first():
            if variant.contains(version):
                return variant
        return None

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "description": self.description, "problem": self.problem,
                "upstream": self.upstream.to_json(), "variants": [v.to_json() for v in self.variants],
                "markers": [m.to_json() for m in self.markers], "audit": list(self.audit),
                "folder": str(self.folder)}


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
        raise SeriesError(f"The patch series {folder} is a file, not a folder: --series takes the folder that "
                          f"holds {SERIES_FILE} and the patches{parent}.",
                          hint="Pass --series DIR with a folder holding series.toml (docs/series-format.md).")
    if not folder.is_dir():
        raise SeriesError(f"The patch series folder {folder} does not exist.",
                          hint="Pass --series DIR with a folder holding series.toml (docs/series-format.md).")
    series_file = folder / SERIES_FILE
    if not series_file.is_file():
        raise SeriesError(
            f"The patch series folder {folder} has no {SERIES_FILE} yet, so there is nothing to list or apply.",
            hint="Add series.toml naming the patches in order (docs/series-format.md), or pass --series DIR.")
    doc = _read_toml(series_file)
    tomldoc.check_keys(doc, doc.data, (), {"patches": list}, (), "series.toml")
    ids = doc.data.get("patches", [])
    seen: set[str] = set()
    patches: list[Patch] = []
    for i, patch_id in enumerate(ids):
        if not isinstance(patch_id, str) or not _ID_RE.match(patch_id):
            raise doc.fail(("patches",), f"entry {i + 1} of 'patches' ({patch_id!r}) is not a patch id "
                                         "(lower-case letters, digits, '.', '_' and '-').")
        if patch_id in seen:
            raise doc.fail(("patches",), f"patch '{patch_id}' is listed twice in 'patches'.")
        seen.add(patch_id)
        patch_folder = folder / patch_id
        if not (patch_folder / PATCH_FILE).is_file():
            present = sorted(p.name for p in folder.iterdir() if (p / PATCH_FILE).is_file())
            raise doc.fail(("patches",), f"patch '{patch_id}' has no folder {patch_folder.name}/ with "
                                         f"{PATCH_FILE}.{did_you_mean(patch_id, present)}")
        patches.append(load_patch(patch_folder))
    listed = set(ids)
    for extra in sorted(p for p in folder.iterdir() if (p / PATCH_FILE).is_file() and p.name not in listed):
        raise doc.fail(("patches",), f"the folder {extra.name}/ holds a patch that series.toml does not list.",
                       hint="Add its id to 'patches' (in order of application) or remove the folder.")
    return Series(path=folder, patches=tuple(patches))


_PATCH_KEYS = {"id": str, "title": str, "description": str, "problem": str, "upstream": dict,
               "variants": list, "markers": list, "audit": list}
_REQUIRED_PATCH_KEYS = ("id", "title", "description", "problem", "upstream", "variants", "markers")
_AUDIT_RE = re.compile(r"^([a-z0-9-]+)/([A-Za-z0-9][A-Za-z0-9._-]*)$")
_UPSTREAM_KEYS = {"reference": str, "forwarded": bool, "reason": str}
_VARIANT_KEYS = {"diff": str, "releases": str, "base": str}
_MARKER_KEYS = {"file": (str, list), "pattern": str}


def load_patch(folder: Path) -> Patch:
    """Read one patch folder (``patch.toml`` and its diffs)."""
    doc = _read_toml(folder / PATCH_FILE)
    data = doc.data
    tomldoc.check_keys(doc, data, (), _PATCH_KEYS, _REQUIRED_PATCH_KEYS, "patch.toml")
    if data["id"] != folder.name:
        raise doc.fail(("id",), f"id '{data['id']}' differs from its folder name '{folder.name}'.",
                       hint="The id, the folder and the entry in series.toml must be the same.")
    for key in ("title", "problem", "description"):
        if not data[key].strip():
            raise doc.fail((key,), f"'{key}' is empty.")

    up = data["upstream"]
    tomldoc.check_keys(doc, up, ("upstream",), _UPSTREAM_KEYS, ("forwarded",), "[upstream]")
    reference, reason = up.get("reference", "").strip(), up.get("reason", "").strip()
    if up["forwarded"]:
        if not re.match(r"^https?://\S+$", reference):
            raise doc.fail(("upstream", "reference"),
                           f"a forwarded patch needs 'reference' set to the URL of its pull request or "
                           f"issue (got {reference!r}).")
    elif not reason:
        raise doc.fail(("upstream", "forwarded"), "'forwarded = false' needs a 'reason' saying why the patch "
                                                  "is not sent upstream.")
    upstream = Upstream(reference=reference, forwarded=up["forwarded"], reason=reason)

    if not data["variants"]:
        raise doc.fail(("variants",), "a patch needs at least one [[variants]] entry.")
    variants = tuple(_variant(doc, folder, i, v) for i, v in enumerate(data["variants"]))
    _check_overlap(doc, variants)

    if not data["markers"]:
        raise doc.fail(("markers",), "a patch needs at least one [[markers]] entry (a pattern that shows an "
                                     "upstream tree already has the fix).")
    markers = tuple(_marker(doc, i, m) for i, m in enumerate(data["markers"]))
    audit = _audit_entries(doc, data["audit"]) if "audit" in data else ()
    return Patch(id=data["id"], title=data["title"].strip(), description=data["description"].strip(),
                 problem=data["problem"].strip(), upstream=upstream, variants=variants, markers=markers,
                 folder=folder, audit=audit)


def _audit_entries(doc: tomldoc.Doc, raw: list) -> tuple[str, ...]:
    """``audit = ["extend/deepseek-v3-mla", ...]``: the launcher and the shape-matrix entry of each audit
    case that proves the patch's kernel changes (docs/series-format.md)."""
    from sm120kit.sglang.launchers import LAUNCHERS  # reads no SGLang and no torch

    if not raw:
        raise doc.fail(("audit",), "'audit' is empty; name the audit entries that prove the patch "
                                   "(\"launcher/entry\") or leave the key out.")
    seen: list[str] = []
    for index, item in enumerate(raw):
        match = _AUDIT_RE.match(item) if isinstance(item, str) else None
        if match is None:
            raise doc.fail(("audit",), f"entry {index + 1} of 'audit' ({item!r}) is not \"launcher/entry\" "
                                       "(a launcher of the shared-memory audit and an entry of its shape matrix, "
                                       "e.g. \"extend/deepseek-v3-mla\").")
        if match.group(1) not in LAUNCHERS:
            raise doc.fail(("audit",), f"entry {index + 1} of 'audit' ({item!r}) names the launcher "
                                       f"'{match.group(1)}', which the audit does not run."
                                       f"{did_you_mean(match.group(1), list(LAUNCHERS))}",
                           hint=f"Launchers: {', '.join(LAUNCHERS)}.")
        if item in seen:
            raise doc.fail(("audit",), f"'audit' lists {item!r} twice.")
        seen.append(item)
    return tuple(seen)


def _table(doc: tomldoc.Doc, value: Any, path: tuple, what: str) -> dict:
    if not isinstance(value, dict):
        raise doc.fail(path, f"each {what} entry must be a table ([[{path[0]}]]), not {value!r}.")
    return value


def _variant(doc: tomldoc.Doc, folder: Path, index: int, raw: Any) -> Variant:
    path = ("variants", index)
    raw = _table(doc, raw, path, "variants")
    tomldoc.check_keys(doc, raw, path, _VARIANT_KEYS, tuple(_VARIANT_KEYS), f"[[variants]] entry {index + 1}")
    try:
        releases = SpecifierSet(raw["releases"])
    except InvalidSpecifier:
        raise doc.fail(path + ("releases",), f"releases = {raw['releases']!r} is not a PEP 440 specifier set.",
                       hint="Write something like \">=0.5.2,<0.5.7\".") from None
    if not str(releases):
        raise doc.fail(path + ("releases",), "releases is empty; give the range, e.g. \">=0.5.2\".")
    try:
        Version(raw["base"])
    except InvalidVersion:
        raise doc.fail(path + ("base",), f"base = {raw['base']!r} is not a release version.") from None
    if not releases.contains(Version(raw["base"]), prereleases=True):
        raise doc.fail(path + ("base",), f"base {raw['base']} lies outside its own releases range "
                                         f"'{releases}'.")
    diff_path = folder / raw["diff"]
    if "/" in raw["diff"] or not diff_path.is_file():
        present = sorted(p.name for p in folder.glob("*.diff"))
        raise doc.fail(path + ("diff",), f"diff file '{raw['diff']}' is not in {folder}."
                                         f"{did_you_mean(raw['diff'], present)}")
    patch_set = parse_diff(diff_path)
    files = _files(diff_path, patch_set)
    return Variant(diff=diff_path, releases=releases, base=raw["base"], patch_set=patch_set, files=files)


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
                raise doc.fail(("variants", j, "releases"),
                               f"the release ranges of variants {a.name} ('{a.releases}') and {b.name} "
                               f"('{b.releases}') overlap: {both[0]} is in both.",
                               hint="Each release must select exactly one variant.")


def _marker(doc: tomldoc.Doc, index: int, raw: Any) -> Marker:
    path = ("markers", index)
    raw = _table(doc, raw, path, "markers")
    tomldoc.check_keys(doc, raw, path, _MARKER_KEYS, tuple(_MARKER_KEYS), f"[[markers]] entry {index + 1}")
    files = (raw["file"],) if isinstance(raw["file"], str) else tuple(raw["file"])
    if not files or not all(isinstance(f, str) and f.startswith("sglang/") and ".." not in f for f in files):
        raise doc.fail(path + ("file",), f"file = {raw['file']!r} must be a path (or list of paths) "
                                         "starting with 'sglang/'.")
    try:
        pattern = BoundedPattern(raw["pattern"])
    except ValueError as exc:
        raise doc.fail(path + ("pattern",), f"pattern {raw['pattern']!r} is not a valid regular expression for "
                                            f"a marker (matched in bounded time): {exc}.",
                       hint="Markers use Python 're' syntax without back-references or look-arounds (they are "
                            "matched by RE2, in time linear in the file).") from None
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
                     "with 'git diff').")
    feed = _CountingLines(lines)
    try:
        patch_set = unidiff.PatchSet(feed)
    except unidiff.UnidiffParseError as exc:
        raise SeriesError(f"{diff_path}:{feed.line}: not a valid unified diff: {exc}.",
                          hint="Regenerate the diff with 'git diff' or 'diff -u' rather than editing hunks "
                               "by hand (hunk headers count lines).") from None
    if not len(patch_set):
        raise SeriesError(f"{diff_path}: holds no file changes (expected '--- a/sglang/...' and "
                          "'+++ b/sglang/...' headers followed by hunks).")
    return patch_set


def _files(diff_path: Path, patch_set: unidiff.PatchSet) -> tuple[FileDiff, ...]:
    try:
        return file_diffs(patch_set)
    except DiffFormatError as exc:
        where = f"{diff_path}:{exc.line}" if exc.line else str(diff_path)
        raise SeriesError(f"{where}: {exc}.") from None
