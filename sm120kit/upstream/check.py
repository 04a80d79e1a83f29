"""Upgrade checks: the patch series against a new SGLang (a release, a git ref, a folder), classified.

:func:`check_upstream` dry-runs the whole series on one target with the patch engine
(:func:`sm120kit.patching.plan.plan_series`; nothing is written) and explains each patch:

- ``applies``: which variant, and the hunks that needed an offset (or fuzz).
- ``present-upstream``: a marker of the patch matches, or the patch reverse-applies (upstream carries the
  same change; then a warning asks for a marker).
- ``conflict``: which hunk, the lines it expected and what is there now, and, on a git clone holding the
  variant's base tag, the upstream commits that changed those lines since that release (``git log -L``).
- ``not-applicable``: the release is outside every variant's range (expected), or a file the patch
  changes is gone; a moved file is found again by content similarity (:func:`sm120kit.upstream.moved.find_moved`).
- ``already-applied``: only in a folder whose own sm120kit state record lists the patch.

The matrix over many targets is :mod:`sm120kit.upstream.matrix`; finding a file that moved is
:mod:`sm120kit.upstream.moved`.
"""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit.errors import ConflictError, DownloadError, WarningsAsErrors
from sm120kit.patching.hunks import HunkResult
from sm120kit.patching.plan import APPLIED_FOUND as APPLIED_WITHOUT_RECORD  # "already-applied", found by reverse-apply
from sm120kit.patching.plan import PatchPlan, SeriesPlan, plan_series
from sm120kit.patching.series import Patch, Series, Variant
from sm120kit.patching.status import HunkStatus, PatchStatus, TreeStatus
from sm120kit.sglang import releases
from sm120kit.sglang.gitrepo import Commit, SglangClone
from sm120kit.sglang.metadata import read_stated_version
from sm120kit.sglang.target import Target, find_target, release_and_source
from sm120kit.upstream import gating
from sm120kit.upstream.moved import MovedFile, find_moved
from sm120kit.util.report import Step, tell

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
    release_source: str = ""  # where ``version`` was read, in words

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "root": str(self.root),
            "version": self.version,
            "exact_release": self.exact,
            "release_source": self.release_source,
            "ref": self.ref,
            "commit": self.commit,
            "repo": str(self.clone.root) if self.clone else None,
        }


@contextlib.contextmanager
def open_release(version: str, *, on_step: Step | None = None) -> Iterator[CheckTarget]:
    """SGLang ``version`` from PyPI (downloaded into the cache once); read in place, never written."""
    root = releases.fetch_release(version, on_step=on_step)
    yield CheckTarget(
        kind="release", label=version, root=root, version=version, exact=True, release_source="the PyPI release"
    )


@contextlib.contextmanager
def open_ref(clone: SglangClone, ref: str, *, on_debug: Step | None = None) -> Iterator[CheckTarget]:
    """``ref`` of an SGLang clone, checked out in a temporary worktree removed afterwards."""
    sha = clone.resolve(ref)
    with clone.worktree(sha) as tree:
        prefix = clone.package_prefix(tree)
        package = (tree / prefix if prefix else tree) / "sglang"
        stated, source = read_stated_version(package)
        version, exact, how = release_and_source(
            Target(
                kind="git-clone", package_dir=package, version=stated, version_source=source, repo_root=tree, commit=sha
            )
        )
        label = f"{ref} @ {sha[:12]}" if ref != sha else sha[:12]
        near = "" if exact else "after "
        tell(on_debug, f"{label}: {near}release {version or 'unknown'} ({how})")
        yield CheckTarget(
            kind="ref",
            label=label,
            root=tree / prefix if prefix else tree,
            version=version,
            exact=exact,
            ref=ref,
            commit=sha,
            clone=clone,
            prefix=prefix,
            release_source=how,
        )


@contextlib.contextmanager
def open_folder(path: Path) -> Iterator[CheckTarget]:
    """An SGLang tree on disk (a clone, its python/ folder, an installed package); read only."""
    target = find_target(path)
    version, exact, how = release_and_source(target)
    clone = None
    prefix = ""
    if target.repo_root is not None:
        clone = SglangClone(target.repo_root)
        rel = target.root.resolve().relative_to(clone.root)
        prefix = "" if str(rel) == "." else rel.as_posix()
    yield CheckTarget(
        kind="folder",
        label=str(target.package_dir),
        root=target.root,
        version=version,
        exact=exact,
        commit=target.commit,
        clone=clone,
        prefix=prefix,
        release_source=how,
    )


# -- the files of a variant's base ------------------------------------------------------------------------


class BaseFiles:
    """Files as they were in a release: from the clone's ``v<release>`` tag when there is one, else from
    the cached PyPI release (downloaded when ``download``); ``None`` when neither is reachable."""

    def __init__(
        self,
        clone: SglangClone | None = None,
        prefix: str = "python",
        *,
        download: bool = True,
        on_step: Step | None = None,
    ) -> None:
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
        data.update(changed=list(self.changed), commits=[c.to_json() for c in self.commits], history=self.history)
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
        return {
            "id": self.patch_id,
            "title": self.title,
            "status": str(self.status),
            "variant": self.variant,
            "variant_releases": self.variant_releases,
            "detail": self.detail,
            "offsets": [
                {"file": h.file, "hunk": h.index, "offset": h.offset, "fuzz": h.fuzz, "line": h.line}
                for h in self.offsets
            ],
            "hunks": [h.to_json() for h in self.hunks],
            "moved": [m.to_json() for m in self.moved],
            "warnings": list(self.warnings),
        }


STATUS_ORDER = (
    PatchStatus.APPLIES,
    PatchStatus.PRESENT_UPSTREAM,
    PatchStatus.ALREADY_APPLIED,
    PatchStatus.NOT_APPLICABLE,
    PatchStatus.CONFLICT,
)


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
            return (
                f"{len(self.conflicts)} patch(es) conflict with SGLang {self.target.label}: {ids}. "
                f"Rebuild a variant with 'sm120kit refresh PATCH' (same target options)."
            )
        if code == EXIT_WARNINGS:
            return f"{len(self.warnings)} warning(s) with --error-on-warn."
        return ""

    def summary(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in self.counts().items() if n) or "no patches"

    def to_json(self, error_on_warn: bool = False) -> dict:
        return {
            "command": "check-upstream",
            "target": self.target.to_json(),
            "series": str(self.series),
            "fuzz": self.fuzz,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "patches": [p.to_json() for p in self.patches],
            "warnings": list(self.warnings),
            "exit_code": self.exit_code(error_on_warn),
            "message": self.message(error_on_warn),
        }


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
        return HunkReport(
            hunk=hunk, changed=changed, history=f"the clone has no tag {tag} (the variant's base); history not searched"
        )
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


def _classify(
    patch: Patch,
    plan: PatchPlan,
    target: CheckTarget,
    *,
    alternative: PatchPlan | None,
    base_files: BaseFiles | None,
    history: bool,
    find_moves: bool,
) -> PatchCheck:
    variant = plan.variant
    common = dict(
        patch_id=patch.id,
        title=patch.title,
        variant=variant.name if variant else None,
        variant_releases=str(variant.releases) if variant else None,
    )
    warnings: list[str] = list(plan.warnings)
    if plan.status in (PatchStatus.APPLIES, PatchStatus.ALREADY_APPLIED):
        gate = gating.gate_text(plan.new_files, target.root, plan.status == PatchStatus.ALREADY_APPLIED)
        if gate is not None:
            warnings += gating.mismatches(gate, target.root)
    if (
        alternative is not None
        and alternative.status == PatchStatus.APPLIES
        and alternative.variant is not None
        and alternative.variant is not variant
    ):
        warnings.append(
            f"variant {alternative.variant.name} ('{alternative.variant.releases}') applies to "
            f"{target.label}; widen its release range or refresh the patch"
        )

    if plan.status == PatchStatus.APPLIES:
        offsets = tuple(h for h in plan.hunks if h.offset or h.fuzz)
        if any(h.fuzz for h in plan.hunks):
            warnings.append("applies only with fuzz (context lines ignored); refresh the variant")
        return PatchCheck(
            status=PatchStatus.APPLIES, detail=plan.reason, offsets=offsets, warnings=tuple(warnings), **common
        )
    if plan.status == PatchStatus.PRESENT_UPSTREAM:
        return PatchCheck(status=PatchStatus.PRESENT_UPSTREAM, detail=plan.reason, warnings=tuple(warnings), **common)
    if plan.status == PatchStatus.ALREADY_APPLIED:
        if plan.reason == APPLIED_WITHOUT_RECORD:
            warnings.append(
                "the change is upstream but no marker of the patch matches; add a [[markers]] entry naming it"
            )
            return PatchCheck(
                status=PatchStatus.PRESENT_UPSTREAM,
                detail=f"the patch reverse-applies (variant {variant.name if variant else '?'}): "
                "upstream carries the same change",
                warnings=tuple(warnings),
                **common,
            )
        return PatchCheck(status=PatchStatus.ALREADY_APPLIED, detail=plan.reason, warnings=tuple(warnings), **common)
    if plan.status == PatchStatus.CONFLICT:
        reports = (
            tuple(_hunk_report(target, variant, h, history) for h in plan.hunks if h.status == HunkStatus.CONFLICT)
            if variant is not None
            else ()
        )
        return PatchCheck(
            status=PatchStatus.CONFLICT, detail=plan.reason, hunks=reports, warnings=tuple(warnings), **common
        )

    # not-applicable
    if _OUT_OF_RANGE in plan.reason or plan.warnings or not find_moves:
        return PatchCheck(status=PatchStatus.NOT_APPLICABLE, detail=plan.reason, warnings=tuple(warnings), **common)
    if not target.exact and target.version and patch.before_every_range(target.version):
        # A commit after a release older than every range: the files the patch needs are not there yet.
        detail = (
            f"{plan.reason}; the tree follows release {target.version}, before every variant's range: "
            "the code the patch changes is not there yet"
        )
        return PatchCheck(status=PatchStatus.NOT_APPLICABLE, detail=detail, warnings=tuple(warnings), **common)
    moved = []
    for chosen, path in _absent_files(
        patch, patch.variant_for(target.version) if target.version else None, target.root
    ):
        reference = base_files.text(chosen.base, path) if base_files is not None else None
        moved.append(find_moved(target.root, path, reference, _hunk_lines(chosen, path)))
    detail = "; ".join(m.describe() for m in moved) or plan.reason
    for m in moved:
        if m.new:
            warnings.append(f"{m.old} moved to {m.new}: rebuild the variant with 'sm120kit refresh {patch.id}'")
        else:
            warnings.append(f"{m.old} is gone: check whether the fix is still needed and where")
    return PatchCheck(
        status=PatchStatus.NOT_APPLICABLE, detail=detail, moved=tuple(moved), warnings=tuple(warnings), **common
    )


def check_upstream(
    series: Series,
    target: CheckTarget,
    *,
    fuzz: int = 0,
    base_files: BaseFiles | None = None,
    history: bool = True,
    find_moves: bool = True,
) -> SeriesCheck:
    """Classify every patch of ``series`` on ``target``; reads files, writes nothing."""
    start = time.perf_counter()
    if base_files is None:
        base_files = BaseFiles(target.clone, target.prefix)
    plan = plan_series(target.root, series, version=target.version, fuzz=fuzz, exact=target.exact)
    alternatives = _alternatives(series, target, plan, fuzz)
    checks = tuple(
        _classify(
            patch,
            patch_plan,
            target,
            alternative=alternatives.get(patch.id),
            base_files=base_files,
            history=history,
            find_moves=find_moves,
        )
        for patch, patch_plan in zip(series.patches, plan.patches)
    )
    return SeriesCheck(
        target=target, series=series.path, patches=checks, seconds=time.perf_counter() - start, fuzz=fuzz
    )


def _alternatives(series: Series, target: CheckTarget, plan: SeriesPlan, fuzz: int) -> dict[str, PatchPlan]:
    """For an exact release where a patch conflicts or lost its files: what trying every variant gives."""
    if not target.exact:
        return {}
    troubled = [
        p
        for p in plan.patches
        if p.status == PatchStatus.CONFLICT
        or (p.status == PatchStatus.NOT_APPLICABLE and _OUT_OF_RANGE not in p.reason)
    ]
    if not troubled:
        return {}
    loose = plan_series(target.root, series, version=target.version, fuzz=fuzz, exact=False)
    wanted = {p.patch_id for p in troubled}
    return {p.patch_id: p for p in loose.patches if p.patch_id in wanted}
