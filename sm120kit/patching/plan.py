"""Planning a series on a tree: what each patch would do, computed wholly in memory.

:func:`plan_series` reads files and writes nothing, so it serves ``--dry-run``, ``status`` and any tool
that wants to know how a series fits a tree (a release, a git worktree of a main commit). Each patch gets
one status:

- ``applies``: every hunk places (exactly, at an offset, or within ``fuzz``) and the Python it leaves
  compiles.
- ``already-applied``: the patch's result is already in the files. Found like quilt pops a stack: from
  the last patch to the first, a patch whose diff reverse-applies is undone in memory; without a state
  record listing it, its upstream markers must also stop matching once it is undone (else upstream has
  the fix on its own and the patch is ``present-upstream``).
- ``present-upstream``: the patch's upstream markers match, so the tree carries an equivalent fix.
- ``not-applicable``: the release is outside every variant's range, or the files it changes are absent.
- ``conflict``: a hunk does not place, or the result would not compile; the hunk results say where.

Patches are planned in series order on the result of the ones before them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit.errors import IOFailure
from sm120kit.patching import treepath
from sm120kit.patching.hunks import HunkResult, decode, encode, place_hunks, split_lines
from sm120kit.patching.series import Marker, Patch, Series, Variant
from sm120kit.patching.state import read_recorded
from sm120kit.patching.status import HunkStatus, PatchStatus
from sm120kit.util import regularfile

STATUSES = tuple(PatchStatus)
DEFAULT_FILE_MODE = 0o644

__all__ = ["STATUSES", "FileChange", "HunkResult", "PatchPlan", "SeriesPlan", "plan_series"]


@dataclass(frozen=True)
class PatchPlan:
    """One patch on one tree. ``new_files``: content after this patch of each file it changes (``None``
    for a file it deletes); filled only when ``status == "applies"``."""

    patch_id: str
    status: PatchStatus
    variant: Variant | None
    reason: str
    hunks: tuple[HunkResult, ...] = ()
    new_files: dict[str, bytes | None] = field(default_factory=dict, compare=False, repr=False)
    title: str = ""
    warnings: tuple[str, ...] = ()  # e.g. the release falls in a hole between two variants' ranges

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", PatchStatus(self.status))

    def to_json(self) -> dict:
        return {
            "id": self.patch_id,
            "title": self.title,
            "status": str(self.status),
            "variant": self.variant.name if self.variant else None,
            "variant_releases": str(self.variant.releases) if self.variant else None,
            "reason": self.reason,
            "hunks": [h.to_json() for h in self.hunks],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class FileChange:
    """A file the whole plan changes: its content before and after (``None``: absent)."""

    path: str
    before: bytes | None = field(repr=False)
    after: bytes | None = field(repr=False)
    mode: int  # permission bits to keep (of the existing file, or for a created one)
    patches: tuple[str, ...]

    @property
    def action(self) -> str:
        if self.before is None:
            return "create"
        if self.after is None:
            return "delete"
        return "modify"

    def to_json(self) -> dict:
        return {"path": self.path, "action": self.action, "patches": list(self.patches)}


@dataclass(frozen=True)
class SeriesPlan:
    root: Path
    version: str | None
    exact_release: bool
    fuzz: int
    patches: tuple[PatchPlan, ...]
    changes: tuple[FileChange, ...] = ()

    @property
    def conflicts(self) -> tuple[PatchPlan, ...]:
        return tuple(p for p in self.patches if p.status == PatchStatus.CONFLICT)

    @property
    def ok(self) -> bool:
        return not self.conflicts

    def with_status(self, status: PatchStatus) -> tuple[PatchPlan, ...]:
        return tuple(p for p in self.patches if p.status == status)

    def counts(self) -> dict[str, int]:
        return {str(s): len(self.with_status(s)) for s in STATUSES}

    def to_json(self) -> dict:
        return {
            "root": str(self.root),
            "version": self.version,
            "exact_release": self.exact_release,
            "fuzz": self.fuzz,
            "patches": [p.to_json() for p in self.patches],
            "changes": [c.to_json() for c in self.changes],
            "counts": self.counts(),
        }


class _Tree:
    """Files under ``root`` as text, read on first use; changes stay in memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._original: dict[str, bytes | None] = {}
        self._text: dict[str, str | None] = {}
        self._lines: dict[str, tuple[str, ...] | None] = {}
        self.modes: dict[str, int] = {}
        self.touched_by: dict[str, list[str]] = {}
        self.refused: dict[str, str] = {}

    def _load(self, path: str) -> None:
        if path in self._original:
            return
        full = self.root / path
        why = treepath.on_disk_problem(self.root, path)
        data = None
        if why:
            self.refused[path] = why  # never read through a link, never planned as a write
        else:
            try:
                fd = regularfile.open_regular(full, follow=False)  # never waits on a FIFO swapped in
                with os.fdopen(fd, "rb") as handle:
                    data = handle.read()
                    self.modes[path] = os.fstat(handle.fileno()).st_mode & treepath.PLAIN_MODE_BITS
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                data = None
            except OSError as exc:
                raise IOFailure(
                    f"Cannot read {full}: {exc.strerror or exc}. Nothing was changed.",
                    hint="sm120kit reads every file the series patches to plan the change: run it as "
                    "a user who can read the tree (its owner), or fix that file's "
                    "permissions.",
                ) from None
        self._original[path] = data
        self._text[path] = None if data is None else decode(data)

    def refusal(self, path: str) -> str | None:
        """Why the file at ``path`` must not be written (a link, a folder, behind a link out of the tree)."""
        self._load(path)
        return self.refused.get(path)

    def text(self, path: str) -> str | None:
        self._load(path)
        return self._text[path]

    def lines(self, path: str) -> tuple[str, ...] | None:
        if path not in self._lines:
            text = self.text(path)
            self._lines[path] = None if text is None else tuple(split_lines(text))
        return self._lines[path]

    def set(self, path: str, text: str | None, patch_id: str, mode: int | None = None) -> None:
        self._load(path)
        self._text[path] = text
        self._lines.pop(path, None)
        if mode is not None and path not in self.modes:
            self.modes[path] = mode
        self.touched_by.setdefault(path, []).append(patch_id)

    def changes(self) -> tuple[FileChange, ...]:
        out = []
        for path in sorted(self.touched_by):
            before = self._original[path]
            text = self._text[path]
            after = None if text is None else encode(text)
            if before == after:
                continue
            out.append(
                FileChange(
                    path=path,
                    before=before,
                    after=after,
                    mode=self.modes.get(path, DEFAULT_FILE_MODE),
                    patches=tuple(dict.fromkeys(self.touched_by[path])),
                )
            )
        return tuple(out)


# -- one variant against the tree ------------------------------------------------------------------------


@dataclass
class _Attempt:
    variant: Variant
    ok: bool
    absent: list[str]
    contents: dict[str, str | None]  # new text per file (ok only)
    modes: dict[str, int]
    hunks: list[HunkResult]
    notes: list[str]


def _run_variant(
    get_lines: Callable[[str], tuple[str, ...] | None],
    variant: Variant,
    *,
    fuzz: int,
    reverse: bool,
    describe: bool = True,
    refuse: Callable[[str], str | None] | None = None,
) -> _Attempt:
    ok = True
    absent: list[str] = []
    contents: dict[str, str | None] = {}
    modes: dict[str, int] = {}
    results: list[HunkResult] = []
    notes: list[str] = []
    for diff in variant.files:
        why = refuse(diff.path) if refuse is not None else None
        if why:
            ok = False
            notes.append(f"{diff.path} {why}")
            results.extend(
                HunkResult(file=diff.path, index=h.index, status=HunkStatus.CONFLICT, line=1) for h in diff.hunks
            )
            continue
        lines = get_lines(diff.path)
        creates = (diff.action == "create") != reverse  # the file must not exist before this direction
        removes = (diff.action == "delete") != reverse
        if diff.action != "modify":
            whole = diff.target_text if diff.action == "create" else diff.source_text
            if creates:
                if lines is None:
                    contents[diff.path] = whole
                    if diff.mode is not None:
                        modes[diff.path] = diff.mode
                    results.extend(
                        HunkResult(file=diff.path, index=h.index, status=HunkStatus.APPLIES, line=1) for h in diff.hunks
                    )
                else:
                    ok = False
                    notes.append(f"{diff.path} already exists")
                    results.extend(
                        HunkResult(
                            file=diff.path,
                            index=h.index,
                            status=HunkStatus.CONFLICT,
                            line=1,
                            expected=[],
                            found=[line.rstrip("\r\n") for line in lines[:5]],
                            closest_line=None,
                        )
                        for h in diff.hunks
                    )
            else:
                assert removes
                if lines is None:
                    ok = False
                    absent.append(diff.path)
                elif "".join(lines) == whole:
                    contents[diff.path] = None
                    results.extend(
                        HunkResult(file=diff.path, index=h.index, status=HunkStatus.APPLIES, line=1) for h in diff.hunks
                    )
                else:
                    ok = False
                    notes.append(f"{diff.path} differs from the content the diff removes")
                    results.extend(
                        HunkResult(file=diff.path, index=h.index, status=HunkStatus.CONFLICT, line=1)
                        for h in diff.hunks
                    )
            continue
        if lines is None:
            ok = False
            absent.append(diff.path)
            continue
        placed = place_hunks(lines, diff, fuzz=fuzz, reverse=reverse, describe_failures=describe)
        results.extend(placed.results)
        if placed.ok:
            contents[diff.path] = "".join(placed.lines)
        else:
            ok = False
    return _Attempt(variant=variant, ok=ok, absent=absent, contents=contents, modes=modes, hunks=results, notes=notes)


def _markers_match(markers: tuple[Marker, ...], text_of: Callable[[str], str | None]) -> str | None:
    """A description of where every marker matched, or ``None`` when one does not."""
    found = []
    for marker in markers:
        for path in marker.files:
            text = text_of(path)
            if text is not None:
                break
        else:
            return None
        line = marker.pattern.search(text)
        if line is None:
            return None
        found.append(f"{path}:{line}")
    return ", ".join(found)


# -- syntax check ---------------------------------------------------------------------------------------

_compile_cache: dict[str, str | None] = {}


def _syntax_error(path: str, text: str) -> str | None:
    """``None`` if ``text`` compiles as Python (what py_compile checks), else ``"line N: message"``."""
    key = hashlib.blake2b(encode(text), digest_size=16).hexdigest()
    if key in _compile_cache:
        return _compile_cache[key]
    try:
        compile(text, path, "exec", dont_inherit=True)
        error = None
    except SyntaxError as exc:
        error = f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # source holds a null byte
        error = str(exc)
    if len(_compile_cache) > 256:
        _compile_cache.clear()
    _compile_cache[key] = error
    return error


def _check_syntax(tree: _Tree, attempt: _Attempt) -> tuple[str | None, list[str]]:
    """A syntax error the patch would introduce, and notes about files that did not compile before."""
    notes = []
    for path, text in attempt.contents.items():
        if text is None or not path.endswith(".py"):
            continue
        error = _syntax_error(path, text)
        if error is None:
            continue
        before = tree.text(path)
        if before is not None and _syntax_error(path, before) is not None:
            notes.append(f"{path} does not compile with this Python before the patch either; not checked")
            continue
        return f"{path} {error}", notes
    return None, notes


# -- one patch ------------------------------------------------------------------------------------------


def _candidates(patch: Patch, version: str | None, exact: bool) -> list[Variant]:
    newest = list(patch.variants_newest_first())
    if version is None:
        return newest
    preferred = patch.variant_for(version)
    if exact:
        return [preferred] if preferred else []
    if preferred is None and patch.past_every_range(version):
        return []  # a tree after a release past every range: the patch was retired before it
    return ([preferred] if preferred else []) + [v for v in newest if v is not preferred]


def _ranges(patch: Patch) -> str:
    return "; ".join(f"{v.name}: {v.releases}" for v in patch.variants)


def _summary(hunks: list[HunkResult]) -> str:
    moved = [f"{h.file} hunk {h.index} at offset {h.offset:+d}" for h in hunks if h.offset]
    fuzzed = [f"{h.file} hunk {h.index} with fuzz {h.fuzz}" for h in hunks if h.fuzz]
    files = len({h.file for h in hunks})
    text = f"{len(hunks)} hunk{'s' * (len(hunks) != 1)} in {files} file{'s' * (files != 1)}"
    if moved or fuzzed:
        text += " (" + "; ".join(moved + fuzzed) + ")"
    return text


def _conflict_reason(attempt: _Attempt) -> str:
    bad = [h for h in attempt.hunks if h.status == HunkStatus.CONFLICT]
    if attempt.notes:
        return "; ".join(attempt.notes)
    if not bad:
        return "does not apply"
    first = bad[0]
    where = f"closest match at line {first.closest_line}" if first.closest_line else "no similar lines found"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{first.file} hunk {first.index} does not match ({where}){more}"


def _mark_already_present(get_lines, attempt: _Attempt, fuzz: int, refuse=None) -> list[HunkResult]:
    """For a conflict: tell hunks whose result is already in the file from the ones that do not fit."""
    reverse = _run_variant(get_lines, attempt.variant, fuzz=fuzz, reverse=True, describe=False, refuse=refuse)
    present = {(h.file, h.index) for h in reverse.hunks if h.status == HunkStatus.APPLIES}
    out = []
    for h in attempt.hunks:
        if h.status == HunkStatus.CONFLICT and (h.file, h.index) in present:
            h = HunkResult(file=h.file, index=h.index, status=HunkStatus.ALREADY_APPLIED, line=h.line)
        out.append(h)
    return out


_APPLIED_RECORDED = "recorded in the state record; its changes are in the files"
# Public: the reason of an "already-applied" patch that no state record lists (callers tell it apart).
APPLIED_FOUND = "its changes are in the files (the diff reverse-applies; no state record lists it)"


def _as_applied(hunks) -> tuple[HunkResult, ...]:
    return tuple(
        HunkResult(
            file=h.file, index=h.index, status=HunkStatus.ALREADY_APPLIED, offset=h.offset, fuzz=h.fuzz, line=h.line
        )
        for h in hunks
    )


def _unwind(
    tree: _Tree, series: Series, *, version: str | None, exact: bool, fuzz: int, recorded: Collection[str]
) -> dict[str, tuple[Variant, str, tuple[HunkResult, ...]]]:
    """Which patches are already in the files, found as quilt pops a stack: from the last patch to the
    first, each is undone in memory if its diff reverse-applies, so a patch whose lines a later patch
    changed is still recognised. A patch whose upstream markers still match once it is undone is left
    for the forward pass to call present-upstream (unless the state record lists it)."""
    overrides: dict[str, str | None] = {}
    split: dict[str, tuple[str, ...] | None] = {}

    def text(path: str) -> str | None:
        return overrides[path] if path in overrides else tree.text(path)

    def lines(path: str) -> tuple[str, ...] | None:
        if path not in overrides:
            return tree.lines(path)
        if path not in split:
            value = overrides[path]
            split[path] = None if value is None else tuple(split_lines(value))
        return split[path]

    applied: dict[str, tuple[Variant, str, tuple[HunkResult, ...]]] = {}
    for patch in reversed(series.patches):
        is_recorded = patch.id in recorded
        marker_hit = None if is_recorded else _markers_match(patch.markers, text)
        for variant in _candidates(patch, version, exact) or list(patch.variants_newest_first()):
            undo = _run_variant(lines, variant, fuzz=fuzz, reverse=True, describe=False, refuse=tree.refusal)
            if not undo.ok:
                continue
            if marker_hit and _markers_match(patch.markers, lambda p: undo.contents.get(p, text(p))) is not None:
                continue
            applied[patch.id] = (variant, _APPLIED_RECORDED if is_recorded else APPLIED_FOUND, _as_applied(undo.hunks))
            for path, value in undo.contents.items():
                overrides[path] = value
                split.pop(path, None)
            break
    return applied


def _plan_patch(
    tree: _Tree,
    patch: Patch,
    *,
    version: str | None,
    exact: bool,
    fuzz: int,
    recorded: bool,
    applied: tuple[Variant, str, tuple[HunkResult, ...]] | None,
) -> tuple[PatchPlan, _Attempt | None]:
    def plan(status: PatchStatus, variant: Variant | None, reason: str, hunks=(), new_files=None) -> PatchPlan:
        return PatchPlan(
            patch_id=patch.id,
            status=status,
            variant=variant,
            reason=reason,
            hunks=tuple(hunks),
            new_files=new_files or {},
            title=patch.title,
        )

    if applied is not None:
        variant, reason, hunks = applied
        return plan(PatchStatus.ALREADY_APPLIED, variant, reason, hunks), None
    candidates = _candidates(patch, version, exact)
    marker_hit = _markers_match(patch.markers, tree.text)
    if marker_hit and (not recorded or not candidates):
        return plan(PatchStatus.PRESENT_UPSTREAM, None, f"upstream marker found: {marker_hit}"), None
    if not candidates:
        gap = patch.gap_around(version) if exact and version else None
        if gap is not None:
            below, above = gap
            text = (
                f"release {version} falls in a hole of the series: above {below.name} ('{below.releases}') "
                f"and below {above.name} ('{above.releases}'); no variant was tried"
            )
            return PatchPlan(
                patch_id=patch.id,
                status=PatchStatus.NOT_APPLICABLE,
                variant=None,
                reason=text,
                title=patch.title,
                warnings=(text + "; give the release a range",),
            ), None
        after = "" if exact else " (the tree follows it: the patch was retired before it)"
        return plan(
            PatchStatus.NOT_APPLICABLE,
            None,
            f"release {version} is outside every variant's range ({_ranges(patch)}){after}",
        ), None

    first_conflict: _Attempt | None = None
    absent_reasons: list[str] = []
    for variant in candidates:
        attempt = _run_variant(tree.lines, variant, fuzz=fuzz, reverse=False, refuse=tree.refusal)
        if attempt.absent and not attempt.ok:
            absent_reasons.append(f"{variant.name}: file absent: {', '.join(attempt.absent)}")
            continue
        if attempt.ok:
            error, notes = _check_syntax(tree, attempt)
            if error:
                reason = f"would leave a syntax error in {error}; nothing written"
                return plan(PatchStatus.CONFLICT, variant, reason, attempt.hunks), None
            reason = _summary(attempt.hunks) + ("; " + "; ".join(notes) if notes else "")
            new_files = {p: (None if t is None else encode(t)) for p, t in attempt.contents.items()}
            return plan(PatchStatus.APPLIES, variant, reason, attempt.hunks, new_files), attempt
        undo = _run_variant(tree.lines, variant, fuzz=fuzz, reverse=True, describe=False, refuse=tree.refusal)
        if undo.ok:
            return plan(PatchStatus.ALREADY_APPLIED, variant, APPLIED_FOUND, _as_applied(undo.hunks)), None
        if first_conflict is None:
            first_conflict = attempt
    if first_conflict is None:
        return plan(PatchStatus.NOT_APPLICABLE, None, "; ".join(absent_reasons)), None
    hunks = _mark_already_present(tree.lines, first_conflict, fuzz, tree.refusal)
    reason = _conflict_reason(first_conflict)
    if recorded:
        reason += " (the state record lists it as applied: the file was edited or the series changed since)"
    return plan(PatchStatus.CONFLICT, first_conflict.variant, reason, hunks), None


def plan_series(
    root: Path,
    series: Series,
    *,
    version: str | None,
    fuzz: int = 0,
    exact: bool = True,
    recorded: Collection[str] | None = None,
) -> SeriesPlan:
    """Plan ``series`` on the tree whose ``sglang/`` lies in ``root``; reads files, writes nothing.

    ``version``: the tree's SGLang release (``None``: unknown; every variant is tried, newest first).
    ``exact=False`` says the tree is near that release but not exactly it (a git commit past a tag): the
    variant for the release is tried first, then the others, newest first. ``recorded``: ids of patches
    the state record lists (default: read from the tree's state record, if any).
    """
    root = Path(root)
    if recorded is None:
        recorded = read_recorded(root)
    tree = _Tree(root)
    applied = _unwind(tree, series, version=version, exact=exact, fuzz=fuzz, recorded=recorded)
    plans = []
    for patch in series.patches:
        result, attempt = _plan_patch(
            tree,
            patch,
            version=version,
            exact=exact,
            fuzz=fuzz,
            recorded=patch.id in recorded,
            applied=applied.get(patch.id),
        )
        if attempt is not None:
            for path, text in attempt.contents.items():
                tree.set(path, text, patch.id, attempt.modes.get(path))
        plans.append(result)
    return SeriesPlan(
        root=root, version=version, exact_release=exact, fuzz=fuzz, patches=tuple(plans), changes=tree.changes()
    )
