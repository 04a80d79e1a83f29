"""Refreshing a patch for a new SGLang: a new variant rebuilt by a three-way merge.

When a patch's variant no longer applies to a new release (or a ref of a clone), :func:`refresh_patch`
rebuilds it with git's merge machinery (``git merge-file``), file by file:

- base: the file as the old variant's ``base`` release has it (from the clone's ``v<base>`` tag when there
  is one, else the PyPI release), with the patches before this one in the series applied;
- ours: that file with the old variant applied;
- theirs: the file in the new target, again with the earlier patches applied (a file that moved is
  followed to its new path by content similarity, :func:`sm120kit.upstream.moved.find_moved`).

A clean merge becomes a new diff, checked by planning it on the target with the patch engine before
anything is written; then the diff file is added and ``patch.toml`` is edited through tomlkit (the new
``[[variants]]`` entry from the new release on, the old range closed at it), keeping the rest of the file,
comments and layout included, as it was, and the series is loaded again to validate it. Merge conflicts are reported hunk by hunk for
a person, and the merged files with conflict markers are saved beside a draft diff; the series is not
touched. An existing variant is never replaced unless ``replace`` says so.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import tomlkit
from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import Version
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Array, Comment, Whitespace

from sm120kit import runner
from sm120kit.errors import ConflictError, SeriesError, ToolFailed, UsageError
from sm120kit.patching.hunks import FileDiff, file_diffs, place_hunks, split_lines
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import PATCH_FILE, Patch, Series, Variant, load_series, parse_diff
from sm120kit.patching.status import PatchStatus, Word
from sm120kit.sglang import releases
from sm120kit.upstream.check import CheckTarget
from sm120kit.upstream.moved import MovedFile, find_moved
from sm120kit.util.atomicfile import write_atomic
from sm120kit.util.cache import cache_dir
from sm120kit.util.report import Step
from sm120kit.util.suggest import did_you_mean

EXIT_OK = 0
EXIT_CONFLICT = ConflictError.exit_code


class RefreshOutcome(Word):
    """What one refresh did (``outcome`` in ``refresh --json``)."""

    WRITTEN = "written"
    DRY_RUN = "dry-run"
    CONFLICT = "conflict"
    UP_TO_DATE = "up-to-date"
    PRESENT_UPSTREAM = "present-upstream"


class FileMerge(Word):
    """How one file of the variant merged onto the new release (``merge`` of each file)."""

    CLEAN = "clean"
    UPSTREAM = "upstream"  # the change is already there
    RESOLVED = "resolved"  # taken from the --resolved folder
    CONFLICT = "conflict"
    GONE = "gone"
    DUPLICATE = "duplicate"


NEEDS_PERSON = (FileMerge.CONFLICT, FileMerge.GONE, FileMerge.DUPLICATE)


@dataclass(frozen=True)
class MergeConflict:
    """One region git could not merge: the new upstream lines, the base lines and the patch's lines."""

    file: str
    line: int  # 1-based line of the ``<<<<<<<`` marker in the merged file
    upstream: tuple[str, ...]
    base: tuple[str, ...]
    patch: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "upstream": list(self.upstream),
            "base": list(self.base),
            "patch": list(self.patch),
        }


@dataclass(frozen=True)
class RefreshedFile:
    path: str  # in the new variant
    old_path: str  # in the old variant
    action: str  # modify | create | delete
    merge: FileMerge  # conflict, gone and duplicate need a person
    conflicts: tuple[MergeConflict, ...] = ()
    moved: MovedFile | None = None
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "merge", FileMerge(self.merge))

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "old_path": self.old_path,
            "action": self.action,
            "merge": str(self.merge),
            "conflicts": [c.to_json() for c in self.conflicts],
            "moved": self.moved.to_json() if self.moved else None,
            "note": self.note,
        }


@dataclass(frozen=True)
class RefreshResult:
    patch_id: str
    target: CheckTarget
    release: str  # the release the new variant is for
    outcome: RefreshOutcome
    from_variant: str | None
    new_diff: str | None
    new_releases: str | None
    from_base: str | None = None  # the base release of from_variant
    old_releases_before: str | None = None
    old_releases_after: str | None = None
    diff_text: str = ""
    files: tuple[RefreshedFile, ...] = ()
    base_source: str = ""
    verified: str = ""  # the engine's status for the new variant on the target
    written: tuple[str, ...] = ()
    draft_dir: Path | None = None
    replaced: bool = False
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", RefreshOutcome(self.outcome))

    @property
    def conflicts(self) -> tuple[MergeConflict, ...]:
        return tuple(c for f in self.files for c in f.conflicts)

    @property
    def needs_person(self) -> tuple[RefreshedFile, ...]:
        return tuple(f for f in self.files if f.merge in NEEDS_PERSON)

    @property
    def exit_code(self) -> int:
        return EXIT_CONFLICT if self.outcome == RefreshOutcome.CONFLICT else EXIT_OK

    def to_json(self) -> dict:
        return {
            "command": "refresh",
            "patch": self.patch_id,
            "target": self.target.to_json(),
            "release": self.release,
            "outcome": str(self.outcome),
            "from_variant": self.from_variant,
            "from_base": self.from_base,
            "new_variant": {"diff": self.new_diff, "releases": self.new_releases, "base": self.release}
            if self.new_diff
            else None,
            "old_variant_releases": {"before": self.old_releases_before, "after": self.old_releases_after},
            "files": [f.to_json() for f in self.files],
            "base_source": self.base_source,
            "verified": self.verified,
            "written": list(self.written),
            "draft_dir": str(self.draft_dir) if self.draft_dir else None,
            "replaced": self.replaced,
            "diff": self.diff_text,
            "exit_code": self.exit_code,
            "message": self.message,
        }


# -- helpers ---------------------------------------------------------------------------------------------


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    """A ``diff -u`` section for one file (``a/sglang/...``, ``b/sglang/...``; ``/dev/null`` for a side that
    does not exist), with ``\\ No newline at end of file`` where a last line has none."""
    old = split_lines(before or "")
    new = split_lines(after or "")
    fromfile = f"a/{path}" if before is not None else "/dev/null"
    tofile = f"b/{path}" if after is not None else "/dev/null"
    out = []
    for line in difflib.unified_diff(old, new, fromfile, tofile):
        if line.startswith("@@ ") and line.endswith("@@\n"):
            line = line[:-1] + _section(old, line) + "\n"
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


_HUNK_START = re.compile(r"^@@ -(\d+)")


def _section(old: list[str], header: str) -> str:
    """The text git's default function-name rule puts after a hunk header: the nearest line above the
    hunk that starts with a letter, ``_`` or ``$`` (cut to 80 characters), with a leading space."""
    start = int(_HUNK_START.match(header).group(1))
    for index in range(min(start, len(old) + 1) - 2, -1, -1):
        line = old[index]
        if line[:1].isalpha() or line[:1] in ("_", "$"):
            return " " + line.rstrip()[:80].rstrip()
    return ""


def merge_file(current: str, base: str, other: str, labels: tuple[str, str, str]) -> tuple[str, int]:
    """``git merge-file -p --diff3``: the changes from ``base`` to ``other`` merged into ``current``; the
    merged text and the number of conflicts."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-merge-") as tmp:
        paths = []
        for name, text in (("current", current), ("base", base), ("other", other)):
            path = Path(tmp) / name
            path.write_bytes(text.encode("utf-8", "surrogateescape"))
            paths.append(str(path))
        argv = ["git", "merge-file", "-p", "--diff3"]
        for label in labels:
            argv += ["-L", label]
        result = runner.run(argv + paths, check=False, what="git merge-file")
    if result.returncode < 0 or result.returncode > 127:
        raise ToolFailed(
            f"git merge-file failed with exit code {result.returncode}.",
            argv=list(result.argv),
            returncode=result.returncode,
            output_tail=result.stderr,
        )
    return result.stdout, result.returncode


def conflict_regions(path: str, merged: str) -> tuple[MergeConflict, ...]:
    """The ``<<<<<<<`` / ``|||||||`` / ``=======`` / ``>>>>>>>`` regions of a diff3-style merge."""
    regions = []
    state = None
    start = 0
    parts: dict[str, list[str]] = {}
    for number, line in enumerate(merged.splitlines(), 1):
        if line.startswith("<<<<<<< ") or line == "<<<<<<<":
            state, start, parts = "upstream", number, {"upstream": [], "base": [], "patch": []}
        elif state and (line.startswith("||||||| ") or line == "|||||||"):
            state = "base"
        elif state and line == "=======":
            state = "patch"
        elif state and (line.startswith(">>>>>>> ") or line == ">>>>>>>"):
            regions.append(
                MergeConflict(
                    file=path,
                    line=start,
                    upstream=tuple(parts["upstream"]),
                    base=tuple(parts["base"]),
                    patch=tuple(parts["patch"]),
                )
            )
            state = None
        elif state:
            parts[state].append(line)
    return tuple(regions)


def _bounds(spec: SpecifierSet) -> tuple[list[Specifier], list[Specifier], list[Specifier]]:
    lower = [s for s in spec if s.operator in (">=", ">")]
    upper = [s for s in spec if s.operator in ("<", "<=")]
    other = [s for s in spec if s.operator not in (">=", ">", "<", "<=")]
    return lower, upper, other


def _join(*groups: list) -> str:
    return ",".join(str(s) for group in groups for s in group)


def new_ranges(patch: Patch, source: Variant, release: str) -> tuple[str | None, str]:
    """(the source variant's range closed at ``release`` or ``None`` when it does not contain it, the new
    variant's range: from ``release`` up to where the source's range or the next variant begins)."""
    if source.contains(release):
        lower, upper, other = _bounds(source.releases)
        return _join(lower, other, [f"<{release}"]), _join([f">={release}"], upper)
    starts = []
    for variant in patch.variants:
        for spec in _bounds(variant.releases)[0]:
            if Version(spec.version) > Version(release):
                starts.append(Version(spec.version))
    upper = [f"<{min(starts)}"] if starts else []
    return None, _join([f">={release}"], upper)


def edit_metadata(
    text: str,
    source_index: int | None,
    source_range: str | None,
    new_diff: str,
    new_range: str,
    release: str,
    variant_count: int,
) -> str:
    """``patch.toml`` with the source variant's ``releases`` replaced and a variant entry added after the
    last one; every other line kept as it was (tomlkit keeps comments, quoting and layout). The comments
    that follow the last ``[[variants]]`` entry lead what comes next, so they stay after the new entry.
    ``variants = [{...}, ...]`` (an inline array) gets an inline table."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise SeriesError(f"{PATCH_FILE} is not valid TOML ({exc}); fix it before refreshing.") from exc
    if tomlkit.dumps(doc) != text:
        raise SeriesError(
            f"{PATCH_FILE} cannot be edited without reordering it (tomlkit cannot write back this "
            "layout, e.g. [[variants]] entries split by another table); put its [[variants]] "
            "entries together, or add the new variant by hand."
        )
    variants = doc.get("variants")
    if not isinstance(variants, (AoT, Array)) or len(variants) != variant_count:
        found = len(variants) if isinstance(variants, (AoT, Array)) else 0
        raise SeriesError(
            f"{PATCH_FILE} holds {found} variant entries where {variant_count} were loaded; edit it by hand."
        )
    if source_index is not None and source_range is not None:
        source = variants[source_index]
        # The quoting the file had, written explicitly: tomlkit releases differ in what a plain str assignment
        # keeps (0.15.2 writes "...", 0.15.3 keeps '...').
        literal = str(source["releases"].as_string()).startswith("'") and "'" not in source_range
        source["releases"] = tomlkit.string(source_range, literal=literal)
    entry = {"diff": new_diff, "releases": new_range, "base": release}
    if isinstance(variants, Array):
        table = tomlkit.inline_table()
        table.update(entry)
        variants.append(table)
        return tomlkit.dumps(doc)
    body = variants[-1].value.body
    end = len(body)
    while end and body[end - 1][0] is None and isinstance(body[end - 1][1], (Whitespace, Comment)):
        end -= 1
    first_comment = next((i for i in range(end, len(body)) if isinstance(body[i][1], Comment)), len(body))
    blank, moved = body[end:first_comment], body[first_comment:]
    del body[first_comment:]
    if not blank:  # a blank line between the entries, as between the others
        body.append((None, Whitespace("\n")))
    table = tomlkit.table()
    table.update(entry)
    for _, item in blank:
        table.add(Whitespace(item.s))
    for _, item in moved:
        table.add(item)
    variants.append(table)
    return tomlkit.dumps(doc)


@contextlib.contextmanager
def _base_tree(target: CheckTarget, release: str, on_step: Step | None = None) -> Iterator[tuple[Path, str]]:
    """The folder holding ``sglang/`` as release ``release`` has it, and where it came from."""
    tag = f"v{release}"
    if target.clone is not None and target.clone.has_tag(tag):
        with target.clone.worktree(tag) as tree:
            prefix = target.clone.package_prefix(tree)
            yield (tree / prefix if prefix else tree), f"tag {tag} of {target.clone.root}"
        return
    yield releases.fetch_release(release, on_step=on_step), f"SGLang {release} from PyPI"


def _state_reader(root: Path, series: Series, version: str | None, exact: bool):
    """File text after the patches of ``series`` (the ones before the refreshed patch) on ``root``."""
    plan = plan_series(root, series, version=version, exact=exact, recorded=())
    after = {c.path: c.after for c in plan.changes}

    def read(path: str) -> str | None:
        if path in after:
            data = after[path]
            return None if data is None else data.decode("utf-8", "surrogateescape")
        try:
            return (root / path).read_bytes().decode("utf-8", "surrogateescape")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    return read


def _release_for(target: CheckTarget, as_release: str | None) -> str:
    if as_release is not None:
        releases.check_version(as_release)
        return as_release
    if target.version and target.exact:
        return target.version
    near = f" (it follows {target.version})" if target.version else ""
    raise UsageError(
        f"{target.label} is not a tagged SGLang release{near}, so the new variant's first release is unknown.",
        hint="Name it with --as-release X (the release the variant is for, e.g. the next one).",
    )


def _source_variant(patch: Patch, release: str, skip: Variant | None) -> Variant:
    older = [v for v in patch.variants_newest_first() if Version(v.base) < Version(release) and v is not skip]
    holder = patch.variant_for(release)
    if holder is not None and holder is not skip and Version(holder.base) < Version(release):
        return holder
    if not older:
        raise UsageError(
            f"{patch.id} has no variant made for a release before {release} to rebuild from "
            f"(variants: {', '.join(f'{v.name} base {v.base}' for v in patch.variants)})."
        )
    return older[0]


def _draft_dir(patch_id: str, release: str) -> Path:
    return cache_dir() / "refresh" / f"{patch_id}-{release}"


# -- the refresh -----------------------------------------------------------------------------------------


def refresh_patch(
    series: Series,
    patch_id: str,
    target: CheckTarget,
    *,
    as_release: str | None = None,
    dry_run: bool = False,
    replace: bool = False,
    force: bool = False,
    resolved: Path | None = None,
    on_step: Step | None = None,
) -> RefreshResult:
    """Rebuild ``patch_id`` for ``target`` (see the module text); writes only when the merge is clean (or
    every conflicting file was resolved by hand in ``resolved``, a folder laid out like the draft one), the
    engine places the new diff, and ``dry_run`` is off."""
    patch = series.get(patch_id)
    if patch is None:
        close = did_you_mean(patch_id, [p.id for p in series.patches]).strip()
        hint = close or f"Patches: {', '.join(p.id for p in series.patches)}."
        raise UsageError(f"The series {series.path} has no patch '{patch_id}'.", hint=hint)
    release = _release_for(target, as_release)
    new_name = f"{release}.diff"
    existing = next((v for v in patch.variants if Version(v.base) == Version(release) or v.name == new_name), None)
    if existing is None and (patch.folder / new_name).exists():
        raise SeriesError(f"{patch.folder / new_name} exists but no variant names it; move it away first.")
    if existing is not None and not replace:
        raise SeriesError(
            f"{patch.folder / PATCH_FILE}: {patch.id} already has variant {existing.name} "
            f"(base {existing.base}, releases '{existing.releases}') for {release}; nothing was "
            "changed.",
            hint="Pass --replace to rebuild that variant's diff in place, or --as-release with another release.",
        )
    source = _source_variant(patch, release, existing)
    index = next(i for i, p in enumerate(series.patches) if p.id == patch.id)
    earlier = Series(path=series.path, patches=series.patches[:index])

    base = dict(patch_id=patch.id, target=target, release=release, from_variant=source.name, from_base=source.base)
    current = plan_series(target.root, series, version=target.version, exact=target.exact, recorded=())
    now = current.patches[index]
    if now.status == PatchStatus.PRESENT_UPSTREAM:
        return RefreshResult(
            outcome=RefreshOutcome.PRESENT_UPSTREAM,
            new_diff=None,
            new_releases=None,
            message=f"{patch.id} is present upstream in {target.label} ({now.reason}); no "
            "variant is needed there: close the last range instead.",
            **base,
        )
    if (
        not force
        and not replace
        and now.status == PatchStatus.APPLIES
        and now.variant is not None
        and not any(h.offset or h.fuzz for h in now.hunks)
        and patch.variant_for(release) is now.variant
    ):
        return RefreshResult(
            outcome=RefreshOutcome.UP_TO_DATE,
            new_diff=None,
            new_releases=None,
            message=f"{patch.id} variant {now.variant.name} applies to {target.label} exactly; "
            "nothing to refresh (--force rebuilds it anyway).",
            **base,
        )

    if existing is not None:
        old_after, new_range = None, str(existing.releases)
    else:
        old_after, new_range = new_ranges(patch, source, release)
    read_target = _state_reader(target.root, earlier, target.version, target.exact)
    labels = (f"sglang {target.label}", f"sglang {source.base}", f"{patch.id} {source.name}")
    done: list[tuple[RefreshedFile, str]] = []
    merged_texts: dict[str, str] = {}
    with _base_tree(target, source.base, on_step) as (base_root, base_source):
        read_base = _state_reader(base_root, earlier, source.base, True)
        moves: dict[str, str] = {}
        # Changed files first, so that the files the variant creates can follow a folder that moved.
        # The variant's own diff only: the whole files a patch ships ([[files]]) are not rewritten.
        for diff in sorted(source.diff_files, key=lambda d: d.action == "create"):
            result, section, merged = _refresh_file(
                diff, source, read_base, read_target, target.root, labels, moves, resolved
            )
            if result.moved is not None and result.moved.new:
                moves[str(PurePosixPath(result.old_path).parent)] = str(PurePosixPath(result.path).parent)
            done.append((result, section))
            if merged is not None:
                merged_texts[result.path] = merged
    order = {d.path: i for i, d in enumerate(source.diff_files)}
    done.sort(key=lambda pair: order[pair[0].old_path])
    files = [f for f, _ in done]
    sections = [s for _, s in done if s]
    diff_text = "".join(sections)
    common = dict(
        new_diff=new_name,
        new_releases=new_range,
        old_releases_before=str(source.releases),
        old_releases_after=old_after,
        files=tuple(files),
        base_source=base_source,
        replaced=bool(existing),
        **base,
    )

    if any(f.merge in NEEDS_PERSON for f in files):
        draft = _draft_dir(patch.id, release)
        if resolved is None or draft.resolve() != resolved.resolve():
            shutil.rmtree(draft, ignore_errors=True)
        for path, text in merged_texts.items():
            (draft / path).parent.mkdir(parents=True, exist_ok=True)
            (draft / path).write_bytes(text.encode("utf-8", "surrogateescape"))
        draft.mkdir(parents=True, exist_ok=True)
        (draft / new_name).write_text(diff_text, encoding="utf-8")
        people = [
            f"{f.path}: {len(f.conflicts)} conflict(s)" if f.merge == FileMerge.CONFLICT else f"{f.path}: {f.note}"
            for f in files
            if f.merge in NEEDS_PERSON
        ]
        return RefreshResult(
            outcome=RefreshOutcome.CONFLICT,
            diff_text=diff_text,
            draft_dir=draft,
            message=f"{patch.id}: the merge onto {target.label} needs a person "
            f"({'; '.join(people)}). The merged files with conflict markers and a "
            f"draft diff are in {draft}; the series was not changed. Resolve the files "
            f"there, then run the same command with --resolved {draft}.",
            **common,
        )
    if not diff_text:
        return RefreshResult(
            outcome=RefreshOutcome.PRESENT_UPSTREAM,
            diff_text="",
            message=f"every change of {patch.id} {source.name} is already in {target.label}; "
            "no new variant is needed (add a marker so the check sees it).",
            **common,
        )

    verified = _verify(series, patch, index, target, release, new_name, new_range, diff_text)
    if verified != PatchStatus.APPLIES:
        raise ConflictError(
            f"The rebuilt diff for {patch.id} does not place on {target.label} with the patch "
            f"engine ({verified}); nothing was written.",
            hint="Run with --dry-run to see the diff and fix it by hand.",
        )
    if dry_run:
        return RefreshResult(
            outcome=RefreshOutcome.DRY_RUN,
            diff_text=diff_text,
            verified=verified,
            message=f"dry run: would write {patch.folder / new_name} and edit {patch.folder / PATCH_FILE}.",
            **common,
        )
    written = _write(series, patch, source, existing, new_name, new_range, old_after, release, diff_text)
    return RefreshResult(
        outcome=RefreshOutcome.WRITTEN,
        diff_text=diff_text,
        verified=verified,
        written=written,
        message=f"wrote {patch.folder / new_name}"
        + ("" if existing else f" and a [[variants]] entry in {patch.folder / PATCH_FILE}")
        + ".",
        **common,
    )


def _follow_moves(path: str, moves: dict[str, str], target_root: Path) -> str:
    """A file the variant creates goes where the folder of a changed file it sits in moved to, when the
    target no longer has its own folder."""
    parent = PurePosixPath(path).parent
    if (target_root / parent).is_dir():
        return path
    for old_dir in sorted(moves, key=len, reverse=True):
        if parent == PurePosixPath(old_dir) or PurePosixPath(old_dir) in parent.parents:
            return str(PurePosixPath(moves[old_dir]) / PurePosixPath(path).relative_to(old_dir))
    return path


def _refresh_file(
    diff: FileDiff,
    source: Variant,
    read_base,
    read_target,
    target_root: Path,
    labels: tuple[str, str, str],
    moves: dict[str, str],
    resolved: Path | None,
) -> tuple[RefreshedFile, str, str | None]:
    if diff.action == "create":
        path = _follow_moves(diff.path, moves, target_root)
        note = (
            f"created in {PurePosixPath(path).parent}/ (the folder of {diff.path} moved)" if path != diff.path else ""
        )
        theirs = read_target(path)
        if theirs is None:
            return (
                RefreshedFile(path=path, old_path=diff.path, action="create", merge=FileMerge.CLEAN, note=note),
                unified_diff(path, None, diff.target_text),
                None,
            )
        merged, count = merge_file(theirs, "", diff.target_text, labels)
        return _merged(path, diff.path, "modify", theirs, merged, count, None, resolved)
    base_text = read_base(diff.path)
    if base_text is None:
        raise SeriesError(
            f"{source.diff}: {diff.path} is not in its base release {source.base}; the variant "
            "cannot be rebuilt from it."
        )
    if diff.action == "delete":
        theirs = read_target(diff.path)
        if theirs is None:
            return (
                RefreshedFile(path=diff.path, old_path=diff.path, action="delete", merge=FileMerge.UPSTREAM),
                "",
                None,
            )
        if theirs == base_text:
            return (
                RefreshedFile(path=diff.path, old_path=diff.path, action="delete", merge=FileMerge.CLEAN),
                unified_diff(diff.path, theirs, None),
                None,
            )
        return (
            RefreshedFile(
                path=diff.path,
                old_path=diff.path,
                action="delete",
                merge=FileMerge.GONE,
                note="changed upstream, and the variant deletes it",
            ),
            "",
            None,
        )
    placed = place_hunks(split_lines(base_text), diff)
    if not placed.ok:
        raise SeriesError(
            f"{source.diff}: does not apply to {diff.path} of its own base release {source.base}; "
            "fix the variant first."
        )
    ours = "".join(placed.lines)
    path = diff.path
    theirs = read_target(path)
    moved = None
    if theirs is None:
        moved = find_moved(target_root, path, base_text)
        if moved.new is None:
            return (
                RefreshedFile(
                    path=path, old_path=path, action="modify", merge=FileMerge.GONE, moved=moved, note=moved.describe()
                ),
                "",
                None,
            )
        path = moved.new
        theirs = read_target(path)
    merged, count = merge_file(theirs, base_text, ours, labels)
    return _merged(path, diff.path, "modify", theirs, merged, count, moved, resolved)


def _top_level_names(text: str) -> list[str] | None:
    """Names a module defines at its top level (functions, classes, simple assignments); ``None`` when it
    does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
    return names


def _new_duplicates(path: str, theirs: str, merged: str) -> list[str]:
    """Top-level functions or classes the merge defines twice where upstream defined them once: both
    sides added the same helper, which a text merge does not see."""
    if not path.endswith(".py"):
        return []
    after, before = _top_level_names(merged), _top_level_names(theirs)
    if after is None or before is None:
        return []
    return sorted({n for n in after if after.count(n) > 1 and before.count(n) < 2})


def _merged(
    path: str,
    old_path: str,
    action: str,
    theirs: str,
    merged: str,
    count: int,
    moved: MovedFile | None,
    resolved: Path | None = None,
) -> tuple[RefreshedFile, str, str | None]:
    if resolved is not None and (resolved / path).is_file():
        text = (resolved / path).read_bytes().decode("utf-8", "surrogateescape")
        markers = conflict_regions(path, text)
        if markers:
            raise UsageError(
                f"{resolved / path} still has conflict markers (line {markers[0].line}).",
                hint="Keep the lines you want between <<<<<<< and >>>>>>>, delete the markers, "
                "then run the command again.",
            )
        if text != merged:
            return (
                RefreshedFile(
                    path=path,
                    old_path=old_path,
                    action=action,
                    merge=FileMerge.RESOLVED,
                    moved=moved,
                    note=f"taken from {resolved / path}",
                ),
                unified_diff(path, theirs, text) if text != theirs else "",
                text,
            )
    if count:
        return (
            RefreshedFile(
                path=path,
                old_path=old_path,
                action=action,
                merge=FileMerge.CONFLICT,
                conflicts=conflict_regions(path, merged),
                moved=moved,
            ),
            unified_diff(path, theirs, merged),
            merged,
        )
    if merged == theirs:
        unchanged = RefreshedFile(path=path, old_path=old_path, action=action, merge=FileMerge.UPSTREAM, moved=moved)
        return unchanged, "", merged
    twice = _new_duplicates(path, theirs, merged)
    if twice:
        return (
            RefreshedFile(
                path=path,
                old_path=old_path,
                action=action,
                merge=FileMerge.DUPLICATE,
                moved=moved,
                note=f"the merge is clean as text but defines {', '.join(twice)} twice (upstream "
                "added its own); keep one by hand",
            ),
            unified_diff(path, theirs, merged),
            merged,
        )
    return (
        RefreshedFile(path=path, old_path=old_path, action=action, merge=FileMerge.CLEAN, moved=moved),
        unified_diff(path, theirs, merged),
        merged,
    )


def _verify(
    series: Series,
    patch: Patch,
    index: int,
    target: CheckTarget,
    release: str,
    name: str,
    new_range: str,
    diff_text: str,
) -> str:
    """Plan the series with the new variant alone standing for the patch; its status on the target."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-refresh-") as tmp:
        path = Path(tmp) / name
        path.write_text(diff_text, encoding="utf-8")
        patch_set = parse_diff(path)
        shipped = tuple(entry for entry in patch.shipped if entry.contains(release))
        variant = Variant(
            diff=path,
            releases=SpecifierSet(new_range),
            base=release,
            patch_set=patch_set,
            files=file_diffs(patch_set) + tuple(f for e in shipped for f in e.diffs()),
            shipped=shipped,
        )
        trial = dataclasses.replace(patch, variants=(variant,))
        patches = series.patches[:index] + (trial,) + series.patches[index + 1 :]
        plan = plan_series(
            target.root, Series(path=series.path, patches=patches), version=release, exact=True, recorded=()
        )
        result = plan.patches[index]
        return str(result.status) if result.status == PatchStatus.APPLIES else f"{result.status}: {result.reason}"


def _write(
    series: Series,
    patch: Patch,
    source: Variant,
    existing: Variant | None,
    new_name: str,
    new_range: str,
    old_after: str | None,
    release: str,
    diff_text: str,
) -> tuple[str, ...]:
    meta = patch.folder / PATCH_FILE
    diff_path = patch.folder / new_name
    old_meta = meta.read_bytes()
    old_diff = diff_path.read_bytes() if diff_path.exists() else None
    written = [str(diff_path)]
    if existing is None:
        text = old_meta.decode("utf-8")
        source_index = next(i for i, v in enumerate(patch.variants) if v is source)
        new_text = edit_metadata(
            text,
            source_index if old_after is not None else None,
            old_after,
            new_name,
            new_range,
            release,
            len(patch.variants),
        )
    else:
        new_text = None
    try:
        write_atomic(diff_path, diff_text.encode("utf-8"), 0o644)
        if new_text is not None:
            write_atomic(meta, new_text.encode("utf-8"), meta.stat().st_mode & 0o7777)
            written.append(str(meta))
        load_series(series.path)
    except Exception:
        write_atomic(meta, old_meta, meta.stat().st_mode & 0o7777)
        if old_diff is None:
            diff_path.unlink(missing_ok=True)
        else:
            write_atomic(diff_path, old_diff, 0o644)
        raise
    return tuple(written)
