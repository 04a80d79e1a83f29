"""Upgrade checks: the patch series against a new SGLang (a release, a git ref, a folder), classified.

:func:`check_upstream` dry-runs the whole series on one target with the patch engine
(:func:`sm120kit.patching.plan.plan_series`; nothing is written) and explains each patch:

- ``applies``: which variant, and the hunks that needed an offset (or fuzz).
- ``present-upstream``: a marker of the patch matches, or the patch reverse-applies (upstream carries the
  same change; then a warning asks for a marker).
- ``conflict``: which hunk, the lines it expected and what is there now, and, on a git clone holding the
  variant's base tag, the upstream commits that changed those lines since that release (``git log -L``).
- ``not-applicable``: the release is outside every variant's range (expected), or a file the patch
  changes is gone; a moved file is found again by content similarity (:data:`MOVE_SIMILARITY`).
- ``already-applied``: only in a folder whose own sm120kit state record lists the patch.

:func:`build_matrix` runs the same check over many releases and refs (downloads in parallel, each
release unpacked once in the cache and read in place) and returns one table of series x targets.
"""

from __future__ import annotations

import contextlib
import difflib
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator, Sequence

from packaging.version import Version

from sm120kit.util.report import Progress, Step, tell
from sm120kit.sglang import releases
from sm120kit.errors import ConflictError, DownloadError, WarningsAsErrors
from sm120kit.sglang.gitrepo import Commit, SglangClone
from sm120kit.patching.hunks import HunkResult
from sm120kit.patching.status import HunkStatus, PatchStatus, TreeStatus
from sm120kit.patching.series import Patch, Series, Variant
from sm120kit.patching.plan import APPLIED_FOUND as APPLIED_WITHOUT_RECORD  # "already-applied", found by reverse-apply
from sm120kit.patching.plan import PatchPlan, SeriesPlan, plan_series
from sm120kit.sglang.target import find_target

MOVE_SIMILARITY = 0.6
"""A file counts as moved to the candidate whose content is at least this similar to the file at the
variant's base (``difflib.SequenceMatcher.ratio`` over lines; with only the hunks' lines to go by, the
share of those lines found in the candidate). Candidates with the same file name are tried first. Measured
on the real moves between SGLang releases (docs/upstream.md): 0.92 to 1.0 from one release to the next.
Files that merely share a name scored at least 0.6 in 12 of 3223 pairs in SGLang 0.5.23 (near-copies),
and a file rewritten over many releases falls below it (the extend-attention kernel, 0.5.2 to 0.5.23:
0.30); such a file is reported gone with its nearest candidate named."""

EXIT_OK = 0
EXIT_CONFLICT = ConflictError.exit_code
EXIT_WARNINGS = WarningsAsErrors.exit_code

_OUT_OF_RANGE = "is outside every variant's range"


# -- targets ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckTarget:
    """One SGLang tree to check: ``root`` holds ``sglang/``."""

    kind: str  # "release" | "ref" | "folder"
    label: str
    root: Path
    version: str | None
    exact: bool  # exactly that release (variant ranges decide) or near it (every variant is tried)
    ref: str | None = None
    commit: str | None = None
    clone: SglangClone | None = field(default=None, compare=False, repr=False)
    prefix: str = ""  # folder of the clone that holds sglang/ ("python")

    def to_json(self) -> dict:
        return {"kind": self.kind, "label": self.label, "root": str(self.root), "version": self.version,
                "exact_release": self.exact, "ref": self.ref, "commit": self.commit,
                "repo": str(self.clone.root) if self.clone else None}


@contextlib.contextmanager
def open_release(version: str, *, on_step: Step | None = None) -> Iterator[CheckTarget]:
    """SGLang ``version`` from PyPI (downloaded into the cache once); read in place, never written."""
    root = releases.fetch_release(version, on_step=on_step)
    yield CheckTarget(kind="release", label=version, root=root, version=version, exact=True)


@contextlib.contextmanager
def open_ref(clone: SglangClone, ref: str, *, on_debug: Step | None = None) -> Iterator[CheckTarget]:
    """``ref`` of an SGLang clone, checked out in a temporary worktree removed afterwards."""
    sha = clone.resolve(ref)
    with clone.worktree(sha) as tree:
        prefix = clone.package_prefix(tree)
        version, exact = clone.release_at(sha)
        if version is None:
            version = find_target(tree / prefix if prefix else tree).version
        label = f"{ref} @ {sha[:12]}" if ref != sha else sha[:12]
        near = "" if exact else "after "
        tell(on_debug, f"{label}: {near}release {version or 'unknown'}")
        yield CheckTarget(kind="ref", label=label, root=tree / prefix if prefix else tree, version=version,
                          exact=exact, ref=ref, commit=sha, clone=clone, prefix=prefix)


@contextlib.contextmanager
def open_folder(path: Path) -> Iterator[CheckTarget]:
    """An SGLang tree on disk (a clone, its python/ folder, an installed package); read only."""
    from sm120kit.patching.engine import release_of

    target = find_target(path)
    version, exact = release_of(target)
    clone = None
    prefix = ""
    if target.repo_root is not None:
        clone = SglangClone(target.repo_root)
        rel = target.root.resolve().relative_to(clone.root)
        prefix = "" if str(rel) == "." else rel.as_posix()
    yield CheckTarget(kind="folder", label=str(target.package_dir), root=target.root, version=version,
                      exact=exact, commit=target.commit, clone=clone, prefix=prefix)


# -- the files of a variant's base ------------------------------------------------------------------------

class BaseFiles:
    """Files as they were in a release: from the clone's ``v<release>`` tag when there is one, else from
    the cached PyPI release (downloaded when ``download``); ``None`` when neither is reachable."""

    def __init__(self, clone: SglangClone | None = None, prefix: str = "python", *, download: bool = True,
                 on_step: Step | None = None) -> None:
        self.clone = clone
        self.prefix = prefix
        self.download = download
        self.on_step = on_step
        self._cache: dict[tuple[str, str], str | None] = {}
        self.sources: dict[str, str] = {}

    def text(self, release: str, path: str) -> str | None:
        key = (release, path)
        if key not in self._cache:
            self._cache[key] = self._read(release, path)
        return self._cache[key]

    def _read(self, release: str, path: str) -> str | None:
        tag = f"v{release}"
        if self.clone is not None and self.clone.has_tag(tag):
            self.sources[release] = f"tag {tag} of {self.clone.root}"
            return self.clone.show(tag, f"{self.prefix}/{path}" if self.prefix else path)
        folder = releases.release_dir(release)
        if not (folder / "sglang" / "__init__.py").is_file():
            if not self.download:
                return None
            try:
                folder = releases.fetch_release(release, on_step=self.on_step)
            except DownloadError:
                return None
        self.sources[release] = f"SGLang {release} from PyPI"
        try:
            return (folder / path).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            return None


# -- moved files -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MovedFile:
    """Where a file a patch changes went: ``new`` is ``None`` when nothing is similar enough (gone)."""

    old: str
    new: str | None
    similarity: float
    compared: str  # "file" (whole base file) | "hunks" (only the lines the hunks carry)
    nearest: str | None = None  # the best candidate below the threshold

    def describe(self) -> str:
        if self.new:
            return f"{self.old} moved to {self.new} (similarity {self.similarity:.2f})"
        near = f"; nearest {self.nearest} at {self.similarity:.2f}" if self.nearest else ""
        return f"{self.old} is gone (no file similar enough{near})"

    def to_json(self) -> dict:
        return {"old": self.old, "new": self.new, "similarity": round(self.similarity, 4),
                "compared": self.compared, "nearest": self.nearest}


def _score(reference: Sequence[str] | None, fragment: set[str], candidate: Path, floor: float,
           exact: bool = False) -> float:
    """Similarity of ``candidate``; below ``floor`` it may be an upper bound (difflib's quick ratios),
    unless ``exact``."""
    try:
        text = candidate.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0.0
    lines = text.splitlines()
    if reference is not None:
        matcher = difflib.SequenceMatcher(None, reference, lines, autojunk=False)
        if not exact:
            bound = matcher.real_quick_ratio()
            if bound >= floor:
                bound = matcher.quick_ratio()
            if bound < floor:
                return bound
        return matcher.ratio()
    if not fragment:
        return 0.0
    present = {line.strip() for line in lines}
    return len(fragment & present) / len(fragment)


def find_moved(root: Path, old: str, reference: str | None, fragment: Sequence[str] = ()) -> MovedFile:
    """Search ``root/sglang`` for the file ``old`` became, compared with ``reference`` (the file at the
    base) or, lacking it, the hunk lines: files with the same name first, then every file with the same
    suffix; the first group with a file at least :data:`MOVE_SIMILARITY` similar gives the answer. Else
    the file is gone, and the nearest candidate (the same-name file or the best of the others) is named."""
    package = root / "sglang"
    old_name = PurePosixPath(old).name
    suffix = PurePosixPath(old).suffix or ".py"
    ref_lines = reference.splitlines() if reference is not None else None
    frag = {line.strip() for line in fragment if line.strip()}
    files = [p for p in package.rglob(f"*{suffix}") if p.is_file() and ".sm120kit" not in p.parts]
    compared = "file" if reference is not None else "hunks"
    near: list[tuple[float, Path]] = []
    for group in ([p for p in files if p.name == old_name], [p for p in files if p.name != old_name]):
        scored = sorted(((_score(ref_lines, frag, p, MOVE_SIMILARITY), p) for p in sorted(group)),
                        key=lambda sp: -sp[0])
        if scored and scored[0][0] >= MOVE_SIMILARITY:
            best, path = scored[0]
            return MovedFile(old=old, new=path.relative_to(root).as_posix(), similarity=best, compared=compared)
        near += scored[:5]
    exact = [(_score(ref_lines, frag, p, 1.0, exact=True), p) for _, p in near]
    if not exact:
        return MovedFile(old=old, new=None, similarity=0.0, compared=compared)
    best, path = max(exact, key=lambda sp: sp[0])
    return MovedFile(old=old, new=None, similarity=best, compared=compared,
                     nearest=path.relative_to(root).as_posix())


# -- results ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HunkReport:
    """A hunk that does not place: the engine's :class:`HunkResult`, what changed, and who changed it."""

    hunk: HunkResult
    changed: tuple[str, ...] = ()  # unified diff from the lines expected to the lines found
    commits: tuple[Commit, ...] = ()
    history: str = ""  # how the commits were found, or why none were searched

    def to_json(self) -> dict:
        data = self.hunk.to_json()
        data.update(changed=list(self.changed), commits=[c.to_json() for c in self.commits],
                    history=self.history)
        return data


@dataclass(frozen=True)
class PatchCheck:
    patch_id: str
    title: str
    status: PatchStatus
    variant: str | None
    variant_releases: str | None
    detail: str
    offsets: tuple[HunkResult, ...] = ()
    hunks: tuple[HunkReport, ...] = ()
    moved: tuple[MovedFile, ...] = ()
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", PatchStatus(self.status))

    @property
    def cell(self) -> str:
        """The short form a matrix shows."""
        if self.status == PatchStatus.APPLIES:
            name = (self.variant or "").removesuffix(".diff")
            return name + ("+" if self.offsets else "")
        if self.status == PatchStatus.PRESENT_UPSTREAM:
            return "upstream"
        if self.status == PatchStatus.ALREADY_APPLIED:
            return str(TreeStatus.APPLIED)
        if self.status == PatchStatus.CONFLICT:
            return "CONFLICT"
        if any(m.new for m in self.moved):
            return "moved"
        if self.moved:
            return "gone"
        return "-"

    def to_json(self) -> dict:
        return {"id": self.patch_id, "title": self.title, "status": str(self.status), "variant": self.variant,
                "variant_releases": self.variant_releases, "detail": self.detail,
                "offsets": [{"file": h.file, "hunk": h.index, "offset": h.offset, "fuzz": h.fuzz,
                             "line": h.line} for h in self.offsets],
                "hunks": [h.to_json() for h in self.hunks], "moved": [m.to_json() for m in self.moved],
                "warnings": list(self.warnings)}


STATUS_ORDER = (PatchStatus.APPLIES, PatchStatus.PRESENT_UPSTREAM, PatchStatus.ALREADY_APPLIED,
                PatchStatus.NOT_APPLICABLE, PatchStatus.CONFLICT)


@dataclass(frozen=True)
class SeriesCheck:
    """How each patch of a series applies to one target (a release or a ref)."""

    target: CheckTarget
    series: Path
    patches: tuple[PatchCheck, ...]
    seconds: float
    fuzz: int = 0

    @property
    def conflicts(self) -> tuple[PatchCheck, ...]:
        return tuple(p for p in self.patches if p.status == PatchStatus.CONFLICT)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{p.patch_id}: {w}" for p in self.patches for w in p.warnings)

    def counts(self) -> dict[str, int]:
        return {str(s): sum(1 for p in self.patches if p.status == s) for s in STATUS_ORDER}

    def exit_code(self, error_on_warn: bool = False) -> int:
        if self.conflicts:
            return EXIT_CONFLICT
        if error_on_warn and self.warnings:
            return EXIT_WARNINGS
        return EXIT_OK

    def message(self, error_on_warn: bool = False) -> str:
        code = self.exit_code(error_on_warn)
        if code == EXIT_CONFLICT:
            ids = ", ".join(p.patch_id for p in self.conflicts)
            return (f"{len(self.conflicts)} patch(es) conflict with SGLang {self.target.label}: {ids}. "
                    f"Rebuild a variant with 'sm120kit refresh PATCH' (same target options).")
        if code == EXIT_WARNINGS:
            return f"{len(self.warnings)} warning(s) with --error-on-warn."
        return ""

    def summary(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in self.counts().items() if n) or "no patches"

    def to_json(self, error_on_warn: bool = False) -> dict:
        return {"command": "check-upstream", "target": self.target.to_json(), "series": str(self.series),
                "fuzz": self.fuzz, "seconds": round(self.seconds, 3), "counts": self.counts(),
                "patches": [p.to_json() for p in self.patches], "warnings": list(self.warnings),
                "exit_code": self.exit_code(error_on_warn), "message": self.message(error_on_warn)}


# -- classification --------------------------------------------------------------------------------------

def _changed(expected: Sequence[str], found: Sequence[str]) -> tuple[str, ...]:
    lines = list(difflib.unified_diff(list(expected), list(found), "expected", "found", lineterm="", n=1))
    return tuple(lines[2:])


def _file_lines(root: Path, path: str) -> int:
    try:
        with open(root / path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


def _hunk_report(target: CheckTarget, variant: Variant, hunk: HunkResult, history: bool) -> HunkReport:
    changed = _changed(hunk.expected, hunk.found) if hunk.expected else ()
    if target.clone is None or not history:
        note = "" if target.clone is None else "history not searched"
        return HunkReport(hunk=hunk, changed=changed, history=note)
    tag = f"v{variant.base}"
    if not target.clone.has_tag(tag):
        return HunkReport(hunk=hunk, changed=changed,
                          history=f"the clone has no tag {tag} (the variant's base); history not searched")
    path = f"{target.prefix}/{hunk.file}" if target.prefix else hunk.file
    until = target.commit or "HEAD"
    total = _file_lines(target.root, hunk.file)
    if hunk.closest_line and hunk.expected and total:
        first = min(hunk.closest_line, total)
        last = min(total, hunk.closest_line + len(hunk.expected) - 1)
        commits = target.clone.line_history(tag, until, path, first, last)
        how = f"git log -L{first},{last}:{path} {tag}..{until[:12]}"
        if commits:
            return HunkReport(hunk=hunk, changed=changed, commits=tuple(commits), history=how)
    commits = target.clone.line_history(tag, until, path)
    how = f"git log {tag}..{until[:12]} -- {path} (commits touching the file)"
    return HunkReport(hunk=hunk, changed=changed, commits=tuple(commits), history=how)


def _absent_files(patch: Patch, variant: Variant | None, root: Path) -> list[tuple[Variant, str]]:
    chosen = variant or (patch.variants_newest_first()[0] if patch.variants else None)
    if chosen is None:
        return []
    return [(chosen, f.path) for f in chosen.files if f.action != "create" and not (root / f.path).exists()]


def _hunk_lines(variant: Variant, path: str) -> list[str]:
    for diff in variant.files:
        if diff.path == path:
            return [text for h in diff.hunks for text in h.source]
    return []


def _classify(patch: Patch, plan: PatchPlan, target: CheckTarget, *, alternative: PatchPlan | None,
              base_files: BaseFiles | None, history: bool, find_moves: bool) -> PatchCheck:
    variant = plan.variant
    common = dict(patch_id=patch.id, title=patch.title, variant=variant.name if variant else None,
                  variant_releases=str(variant.releases) if variant else None)
    warnings: list[str] = []
    if alternative is not None and alternative.status == PatchStatus.APPLIES and alternative.variant is not None \
            and alternative.variant is not variant:
        warnings.append(f"variant {alternative.variant.name} ('{alternative.variant.releases}') applies to "
                        f"{target.label}; widen its release range or refresh the patch")

    if plan.status == PatchStatus.APPLIES:
        offsets = tuple(h for h in plan.hunks if h.offset or h.fuzz)
        if any(h.fuzz for h in plan.hunks):
            warnings.append("applies only with fuzz (context lines ignored); refresh the variant")
        return PatchCheck(status=PatchStatus.APPLIES, detail=plan.reason, offsets=offsets, warnings=tuple(warnings),
                          **common)
    if plan.status == PatchStatus.PRESENT_UPSTREAM:
        return PatchCheck(status=PatchStatus.PRESENT_UPSTREAM, detail=plan.reason, warnings=tuple(warnings), **common)
    if plan.status == PatchStatus.ALREADY_APPLIED:
        if plan.reason == APPLIED_WITHOUT_RECORD:
            warnings.append("the change is upstream but no marker of the patch matches; add a [[markers]] "
                            "entry naming it")
            return PatchCheck(status=PatchStatus.PRESENT_UPSTREAM,
                              detail=f"the patch reverse-applies (variant {variant.name if variant else '?'}): "
                                     "upstream carries the same change", warnings=tuple(warnings), **common)
        return PatchCheck(status=PatchStatus.ALREADY_APPLIED, detail=plan.reason, warnings=tuple(warnings), **common)
    if plan.status == PatchStatus.CONFLICT:
        reports = tuple(_hunk_report(target, variant, h, history) for h in plan.hunks
                        if h.status == HunkStatus.CONFLICT) if variant is not None else ()
        return PatchCheck(status=PatchStatus.CONFLICT, detail=plan.reason, hunks=reports, warnings=tuple(warnings),
                          **common)

    # not-applicable
    if _OUT_OF_RANGE in plan.reason or not find_moves:
        return PatchCheck(status=PatchStatus.NOT_APPLICABLE, detail=plan.reason, warnings=tuple(warnings), **common)
    moved = []
    for chosen, path in _absent_files(patch, patch.variant_for(target.version) if target.version else None,
                                      target.root):
        reference = base_files.text(chosen.base, path) if base_files is not None else None
        moved.append(find_moved(target.root, path, reference, _hunk_lines(chosen, path)))
    detail = "; ".join(m.describe() for m in moved) or plan.reason
    for m in moved:
        if m.new:
            warnings.append(f"{m.old} moved to {m.new}: rebuild the variant with 'sm120kit refresh {patch.id}'")
        else:
            warnings.append(f"{m.old} is gone: check whether the fix is still needed and where")
    return PatchCheck(status=PatchStatus.NOT_APPLICABLE, detail=detail, moved=tuple(moved), warnings=tuple(warnings),
                      **common)


def check_upstream(series: Series, target: CheckTarget, *, fuzz: int = 0, base_files: BaseFiles | None = None,
                   history: bool = True, find_moves: bool = True) -> SeriesCheck:
    """Classify every patch of ``series`` on ``target``; reads files, writes nothing."""
    start = time.perf_counter()
    if base_files is None:
        base_files = BaseFiles(target.clone, target.prefix)
    plan = plan_series(target.root, series, version=target.version, fuzz=fuzz, exact=target.exact)
    alternatives = _alternatives(series, target, plan, fuzz)
    checks = tuple(
        _classify(patch, patch_plan, target, alternative=alternatives.get(patch.id), base_files=base_files,
                  history=history, find_moves=find_moves)
        for patch, patch_plan in zip(series.patches, plan.patches))
    return SeriesCheck(target=target, series=series.path, patches=checks,
                       seconds=time.perf_counter() - start, fuzz=fuzz)


def _alternatives(series: Series, target: CheckTarget, plan: SeriesPlan, fuzz: int) -> dict[str, PatchPlan]:
    """For an exact release where a patch conflicts or lost its files: what trying every variant gives."""
    if not target.exact:
        return {}
    troubled = [p for p in plan.patches
                if p.status == PatchStatus.CONFLICT
                or (p.status == PatchStatus.NOT_APPLICABLE and _OUT_OF_RANGE not in p.reason)]
    if not troubled:
        return {}
    loose = plan_series(target.root, series, version=target.version, fuzz=fuzz, exact=False)
    wanted = {p.patch_id for p in troubled}
    return {p.patch_id: p for p in loose.patches if p.patch_id in wanted}


# -- the matrix ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class UpgradeMatrix:
    """The upgrade check of a series against several targets: one row per release (or ref), one column per
    patch."""

    series: Path
    patch_ids: tuple[str, ...]
    results: tuple[SeriesCheck, ...]
    seconds: float
    fetch_seconds: float
    check_seconds: float

    def columns(self) -> list[str]:
        prefix = _common_prefix(self.patch_ids)
        return [pid[len(prefix):] or pid for pid in self.patch_ids]

    def rows(self) -> list[list[str]]:
        rows = []
        for result in self.results:
            cells = {p.patch_id: p.cell for p in result.patches}
            rows.append([result.target.label] + [cells.get(pid, "") for pid in self.patch_ids])
        return rows

    def exit_code(self, error_on_warn: bool = False) -> int:
        codes = [r.exit_code(error_on_warn) for r in self.results]
        if EXIT_CONFLICT in codes:
            return EXIT_CONFLICT
        return EXIT_WARNINGS if EXIT_WARNINGS in codes else EXIT_OK

    def message(self, error_on_warn: bool = False) -> str:
        code = self.exit_code(error_on_warn)
        if code == EXIT_CONFLICT:
            bad = [f"{r.target.label} ({', '.join(p.patch_id for p in r.conflicts)})" for r in self.results
                   if r.conflicts]
            return f"conflicts on {len(bad)} target(s): {'; '.join(bad)}."
        if code == EXIT_WARNINGS:
            return f"{sum(len(r.warnings) for r in self.results)} warning(s) with --error-on-warn."
        return ""

    def to_json(self, error_on_warn: bool = False) -> dict:
        return {"command": "matrix", "series": str(self.series), "patches": list(self.patch_ids),
                "columns": self.columns(), "seconds": round(self.seconds, 3),
                "fetch_seconds": round(self.fetch_seconds, 3), "check_seconds": round(self.check_seconds, 3),
                "rows": [{"target": r.target.to_json(),
                          "cells": {p.patch_id: p.cell for p in r.patches},
                          "statuses": {p.patch_id: str(p.status) for p in r.patches},
                          "variants": {p.patch_id: p.variant for p in r.patches},
                          "warnings": list(r.warnings)} for r in self.results],
                "results": [r.to_json(error_on_warn) for r in self.results],
                "exit_code": self.exit_code(error_on_warn), "message": self.message(error_on_warn)}


def _common_prefix(ids: Sequence[str]) -> str:
    if len(ids) < 2:
        return ""
    prefix = ids[0]
    for other in ids[1:]:
        while not other.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind("-"), prefix.rfind("_"))
    return prefix[:cut + 1] if cut >= 0 else ""


def fetch_releases(versions: Sequence[str], *, jobs: int = 4, progress: Progress | None = None,
                   on_step: Step | None = None) -> float:
    """Download and unpack every release not yet cached, ``jobs`` at a time; the seconds it took."""
    start = time.perf_counter()
    missing = [v for v in versions if not (releases.release_dir(v) / "sglang" / "__init__.py").is_file()]
    if not missing:
        return 0.0
    done = 0
    tell(on_step, f"downloading {len(missing)} SGLang release(s) from PyPI ({jobs} at a time) ...")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(releases.fetch_release, v): v for v in missing}
        for future in as_completed(futures):
            future.result()
            done += 1
            if progress is not None:
                progress(done, len(missing), f"downloaded {futures[future]}")
    return time.perf_counter() - start


def build_matrix(series: Series, *, versions: Sequence[str] = (), refs: Sequence[str] = (),
                 clone: SglangClone | None = None, folders: Sequence[Path] = (), fuzz: int = 0, jobs: int = 4,
                 history: bool = True, progress: Progress | None = None, on_step: Step | None = None,
                 on_debug: Step | None = None) -> UpgradeMatrix:
    """The series on every release in ``versions`` and every ref of ``clone`` in ``refs``, in that order."""
    start = time.perf_counter()
    versions = sorted(dict.fromkeys(versions), key=Version)
    fetch_seconds = fetch_releases(versions, jobs=jobs, progress=progress, on_step=on_step)
    checked = time.perf_counter()
    base_files = BaseFiles(clone)
    total = len(versions) + len(refs) + len(folders)
    results: list[SeriesCheck] = []

    def note(label: str) -> None:
        if progress is not None:
            progress(len(results), total, f"checked {label}")

    for version in versions:
        with open_release(version, on_step=on_step) as target:
            results.append(check_upstream(series, target, fuzz=fuzz, base_files=base_files, history=history))
        note(version)
    for ref in refs:
        assert clone is not None, "refs need a clone"
        with open_ref(clone, ref, on_debug=on_debug) as target:
            results.append(check_upstream(series, target, fuzz=fuzz,
                                          base_files=BaseFiles(clone, target.prefix), history=history))
        note(ref)
    for folder in folders:
        with open_folder(folder) as target:
            results.append(check_upstream(series, target, fuzz=fuzz, history=history))
        note(str(folder))
    end = time.perf_counter()
    return UpgradeMatrix(series=series.path, patch_ids=tuple(p.id for p in series.patches),
                         results=tuple(results), seconds=end - start, fetch_seconds=fetch_seconds,
                         check_seconds=end - checked)
