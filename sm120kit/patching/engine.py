"""Applying, reverting and reporting a patch series on an SGLang tree.

The work is planned in memory first (:func:`sm120kit.patching.plan.plan_series`); files are written only when every
patch applies cleanly, is already applied, is present upstream or is not applicable. Writes go through a
temporary file and ``os.replace`` (mode kept); the originals, a write journal and, last, the state record
live in ``sglang/.sm120kit/`` (see :mod:`sm120kit.patching.state`). A lock keeps two runs off one tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120kit import __version__
from sm120kit.errors import (
    ConflictError,
    DirtyTreeError,
    Interrupted,
    IOFailure,
    Sm120kitError,
    StateDamagedError,
    WarningsAsErrors,
)
from sm120kit.patching import treepath
from sm120kit.patching.hunks import HunkResult
from sm120kit.patching.plan import FileChange, PatchPlan, SeriesPlan, plan_series
from sm120kit.patching.series import Series
from sm120kit.patching.state import (
    FileRecord,
    Journal,
    JournalEntry,
    PatchRecord,
    StateRecord,
    StateStore,
    bytecode_of,
    now,
    sha256,
    temp_path,
)
from sm120kit.patching.status import PatchStatus, TreeStatus, tree_status
from sm120kit.sglang.target import Target, find_target
from sm120kit.sglang.target import release_and_source as tree_release
from sm120kit.util import regularfile
from sm120kit.util.atomicfile import deferred_signals, fault_point, fsync_dir, remove, write_atomic
from sm120kit.util.lock import describe_holder, reading
from sm120kit.util.report import Progress, Step, tell

__all__ = [
    "ApplyResult",
    "FileChange",
    "HunkResult",
    "PatchPlan",
    "RevertResult",
    "SeriesPlan",
    "StatusResult",
    "apply_series",
    "plan_series",
    "release_and_source",
    "release_of",
    "repair",
    "revert_series",
    "series_status",
]

EXIT_OK = 0
EXIT_CONFLICT = ConflictError.exit_code  # 4
EXIT_STATE = StateDamagedError.exit_code  # 6
EXIT_STRICT = WarningsAsErrors.exit_code  # 14
_ERROR_KIND = {
    EXIT_CONFLICT: ConflictError.kind,
    EXIT_STATE: StateDamagedError.kind,
    EXIT_STRICT: WarningsAsErrors.kind,
}


# -- the tree's release ----------------------------------------------------------------------------------


def release_of(target: Target) -> tuple[str | None, bool]:
    """The target's SGLang release and whether the tree is exactly that release.

    An installed package is its release. A git clone is exactly a release when HEAD carries the tag
    ``v<release>``, or when its files state a release the clone has no tag of. Any other commit is "near"
    a release: the one its files state (``version.py``, ``_version.py``, a static ``pyproject.toml``
    version), or else the release it follows by the tags (:func:`sm120kit.sglang.gitrepo.release_of_commit`);
    the variant for that release is tried first, then the others, newest first (none for a patch retired
    before it). With neither, the release is unknown (``None``) and every variant is tried.
    """
    version, exact, _ = release_and_source(target)
    return version, exact


def release_and_source(target: Target) -> tuple[str | None, bool, str]:
    """:func:`release_of` and where the release was read, in words (printed beside the label):
    :func:`sm120kit.sglang.target.release_and_source`."""
    return tree_release(target)


# -- results ---------------------------------------------------------------------------------------------


def _patch_rows(plan: SeriesPlan, written: bool) -> list[dict]:
    rows = []
    for p in plan.patches:
        data = p.to_json()
        if written and p.status == PatchStatus.APPLIES:
            data["status"] = str(TreeStatus.APPLIED)
        rows.append(data)
    return rows


@dataclass(frozen=True)
class ApplyResult:
    target: Target
    release: str | None
    exact_release: bool
    series: Path
    plan: SeriesPlan
    dry_run: bool
    release_source: str = ""  # where ``release`` was read, in words
    written: tuple[FileChange, ...] = ()
    repaired: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    state_file: Path | None = None
    exit_code: int = EXIT_OK
    message: str = ""

    @property
    def statuses(self) -> dict[str, str]:
        return {row["id"]: row["status"] for row in _patch_rows(self.plan, bool(self.written))}

    def to_json(self) -> dict:
        return {
            "command": "apply",
            "target": self.target.to_json(),
            "release": self.release,
            "exact_release": self.exact_release,
            "release_source": self.release_source,
            "series": str(self.series),
            "dry_run": self.dry_run,
            "fuzz": self.plan.fuzz,
            "patches": _patch_rows(self.plan, bool(self.written)),
            "changes": [c.to_json() for c in self.plan.changes],
            "written": [c.path for c in self.written],
            "repaired": list(self.repaired),
            "warnings": list(self.warnings),
            "state_file": str(self.state_file) if self.state_file else None,
            "exit_code": self.exit_code,
            "error": _ERROR_KIND.get(self.exit_code),
            "message": self.message,
        }


@dataclass(frozen=True)
class RevertedFile:
    path: str
    action: str  # "restored" | "removed" | "unchanged" (already original) | "edited" | "deleted" (refused)
    kept_copy: Path | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "action": self.action, "kept_copy": str(self.kept_copy) if self.kept_copy else None}


@dataclass(frozen=True)
class RevertResult:
    target: Target
    dry_run: bool
    patches: tuple[str, ...]
    files: tuple[RevertedFile, ...]
    repaired: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    exit_code: int = EXIT_OK
    message: str = ""

    @property
    def kept_copies(self) -> tuple[Path, ...]:
        return tuple(f.kept_copy for f in self.files if f.kept_copy)

    def to_json(self) -> dict:
        return {
            "command": "revert",
            "target": self.target.to_json(),
            "dry_run": self.dry_run,
            "patches": list(self.patches),
            "files": [f.to_json() for f in self.files],
            "kept_copies": [str(p) for p in self.kept_copies],
            "repaired": list(self.repaired),
            "warnings": list(self.warnings),
            "exit_code": self.exit_code,
            "error": _ERROR_KIND.get(self.exit_code),
            "message": self.message,
        }


@dataclass(frozen=True)
class FileState:
    path: str
    condition: str  # "patched" | "original" | "edited" | "missing"
    patches: tuple[str, ...] = ()  # the recorded patches that changed it

    def to_json(self) -> dict:
        return {"path": self.path, "condition": self.condition}


@dataclass(frozen=True)
class StatusResult:
    target: Target
    release: str | None
    exact_release: bool
    series: Path
    plan: SeriesPlan
    recorded: tuple[str, ...]
    files: tuple[FileState, ...]
    problems: tuple[str, ...] = ()
    state_file: Path | None = None
    release_source: str = ""  # where ``release`` was read, in words

    @property
    def exit_code(self) -> int:
        return EXIT_STATE if self.problems else EXIT_OK

    def rows(self) -> list[dict]:
        deleted: dict[str, list[str]] = {}
        for f in self.files:
            if f.condition == "missing":
                for patch_id in f.patches:
                    deleted.setdefault(patch_id, []).append(f.path)
        rows = []
        for p in self.plan.patches:
            data = p.to_json()
            data["status"] = str(tree_status(p.status))
            data["recorded"] = p.patch_id in self.recorded
            if data["recorded"] and p.patch_id in deleted:
                data["status"] = str(TreeStatus.FILE_MISSING)
                data["reason"] = (
                    f"{', '.join(deleted[p.patch_id])} (patched by sm120kit) was deleted after "
                    "apply; 'sm120kit revert --force' puts the original back"
                )
            rows.append(data)
        return rows

    def to_json(self) -> dict:
        return {
            "command": "status",
            "target": self.target.to_json(),
            "release": self.release,
            "exact_release": self.exact_release,
            "release_source": self.release_source,
            "series": str(self.series),
            "patches": self.rows(),
            "recorded": list(self.recorded),
            "files": [f.to_json() for f in self.files],
            "problems": list(self.problems),
            "state_file": str(self.state_file) if self.state_file else None,
            "exit_code": self.exit_code,
            "error": _ERROR_KIND.get(self.exit_code),
        }


# -- helpers ---------------------------------------------------------------------------------------------


def _read(path: Path) -> bytes | None:
    """The bytes of the regular file at ``path`` (never through a final link, never waiting on a FIFO),
    ``None`` when absent. :class:`IOFailure` naming it when it cannot be read or is something else."""
    try:
        return regularfile.read_bytes(path, follow=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise IOFailure(
            f"Cannot read {path}: {exc.strerror or exc}. Nothing was changed.",
            hint="sm120kit must be able to read every file it patched or restores (run it as the "
            "tree's owner), and reads regular files only.",
        ) from None


_NOT_A_FILE = "not-a-regular-file"  # never equal to a SHA-256 digest


def _hash_of(path: Path) -> str | None:
    """SHA-256 of a regular file, ``None`` when absent; a link, folder, FIFO or device is never read."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise IOFailure(f"Cannot examine {path}: {exc.strerror or exc}.") from None
    if not stat.S_ISREG(info.st_mode):
        return _NOT_A_FILE
    try:
        data = regularfile.read_bytes(path, follow=False)
    except regularfile.NotRegularFile:
        return _NOT_A_FILE  # swapped since the lstat
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise IOFailure(
            f"Cannot read {path}: {exc.strerror or exc}. Nothing was changed.",
            hint="sm120kit must be able to read every file it patched or restores (run it as the tree's owner).",
        ) from None
    return sha256(data)


def _unsafe_target(root: Path, path: str, mode: int | None) -> str | None:
    """Why restoring ``path`` with ``mode`` (read from the state record or journal) is not allowed."""
    why = treepath.problem(path)
    if why is None:
        why = treepath.on_disk_problem(root, path)
    if why:
        return f"{path} {why}"
    if mode is not None:
        why = treepath.mode_problem(mode)
        if why:
            return f"the mode of {path} {why}"
        try:
            current = os.lstat(root / path).st_mode & treepath.PLAIN_MODE_BITS
        except OSError:
            current = 0
        if mode & 0o002 and not current & 0o002:
            return f"the mode {oct(mode)} of {path} would make it writable by everyone, which it is not now"
    return None


def _check_targets(root: Path, items: list[tuple[str, int | None]], source: Path, store: StateStore) -> None:
    """Refuse, before anything is written, a restore that would leave the tree, follow or replace a link,
    or give a file a mode it should not have."""
    for path, mode in items:
        why = _unsafe_target(root, path, mode)
        if why:
            raise StateDamagedError(
                f"{source} asks to write {why}. sm120kit does not follow links, leave the tree or set such "
                "modes; nothing was changed.",
                hint="Check that file by hand (restore it from the original package or git), then delete "
                f"{store.dir} and run the command again.",
            )


def _hash(data: bytes | None) -> str | None:
    return None if data is None else sha256(data)


_PROBE_PREFIX = ".sm120kit-probe-"


def _check_writable(root: Path, paths: list[str]) -> None:
    """Refuse before the first write when a folder that must change is not writable (names it).

    Each folder is probed by creating and removing a temporary file: permission bits alone do not tell
    (root ignores them; read-only mounts and immutable folders refuse root too). SIGINT and SIGTERM wait
    until the probe file is gone (then :class:`Interrupted`, nothing changed); a probe file a killed run
    left (``.sm120kit-probe-HOST@PID@...``, that process gone) is removed by the next probe there."""
    probed: set[Path] = set()
    host = socket.gethostname()
    with deferred_signals() as signals:
        for rel in paths:
            folder = (root / rel).parent
            while not folder.exists():
                folder = folder.parent
            if folder in probed:
                continue
            probed.add(folder)
            _sweep_probes(folder, host)
            try:
                fd, probe = tempfile.mkstemp(prefix=f"{_PROBE_PREFIX}{host}@{os.getpid()}@", dir=folder)
                os.close(fd)
                try:
                    fault_point("probe")
                finally:
                    os.unlink(probe)
            except OSError as exc:
                raise IOFailure(
                    f"The tree is not writable: cannot write in {folder} (needed for {rel}): "
                    f"{exc.strerror or exc}. Nothing was changed.",
                    hint="Free some disk space and run the command again."
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    else "Run as the owner of the tree, or use a copy you own.",
                ) from None
    if signals.pending:
        raise Interrupted(
            f"Interrupted ({signals.name}) before anything in the tree was written; nothing was changed.",
            hint="Run the command again.",
        )


def _sweep_probes(folder: Path, host: str) -> None:
    try:
        names = [n for n in os.listdir(folder) if n.startswith(f"{_PROBE_PREFIX}{host}@")]
    except OSError:
        return
    for name in names:
        pid = name[len(_PROBE_PREFIX) + len(host) + 1 :].partition("@")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(folder / name).st_mode):
                os.unlink(folder / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S")


def _restore(
    root: Path, path: str, data: bytes | None, mode: int | None, token: str = "", prunable: frozenset[str] | None = None
) -> None:
    """Write ``data`` to ``root/path`` (or remove it when ``None``, then the folders that leaves empty: only
    those in ``prunable`` when given). The folder is opened one part at a time at write time, never through
    a link: a folder swapped for a link after the plan is a :class:`ConflictError` and nothing is written."""
    folder, _, name = path.rpartition("/")
    try:
        fd, _made = treepath.open_folder(root, folder, create=data is not None)
    except treepath.LinkInTheWay as exc:
        raise ConflictError(
            f"{root / exc.filename} is a symbolic link or not a folder now (it was a folder when "
            f"the plan was made); sm120kit does not write {path} through it.",
            hint="Something changed the tree while sm120kit wrote it: look at that folder, put "
            "it back, and run the command again.",
        ) from None
    except FileNotFoundError:
        if data is None:
            return  # its folder is gone: nothing to remove
        raise
    except OSError as exc:
        raise IOFailure(f"Cannot open the folder of {root / path}: {exc.strerror or exc}.") from None
    try:
        if data is None:
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise IOFailure(f"Cannot remove {root / path}: {exc.strerror or exc}.") from None
            fault_point("replace")
        else:
            tmp = root / temp_path(path, token) if token else None
            write_atomic(root / path, data, mode, fault_point=True, tmp=tmp, dir_fd=fd)
    finally:
        os.close(fd)
    if data is None:
        _prune_empty_dirs((root / path).parent, root / "sglang", root, prunable)


def _remove_bytecode(root: Path, created: list[FileRecord], prune: Callable[[Path], None]) -> None:
    """Delete the bytecode Python wrote for modules the series created (``__pycache__/<name>.*.pyc``) once
    they are gone, and the ``__pycache__`` folder if that leaves it empty and it was not there before the
    module was created; nothing else (bytecode that was there before stays), and nothing through a link.
    ``prune(folder)`` then removes the module's folder if the series created it and it is now empty."""
    for record in created:
        if not record.path.endswith(".py") or os.path.lexists(root / record.path):
            continue
        cache = (root / record.path).parent / "__pycache__"
        try:
            if not stat.S_ISDIR(os.lstat(cache).st_mode):
                continue
            names = os.listdir(cache)
        except OSError:
            continue
        keep = set(record.bytecode.present) if record.bytecode is not None else set()
        prefix = record.path.rsplit("/", 1)[-1][:-3] + "."
        for name in names:
            if not (name.startswith(prefix) and name.endswith(".pyc")) or name in keep:
                continue
            try:
                if stat.S_ISREG(os.lstat(cache / name).st_mode):
                    os.unlink(cache / name)
            except OSError:
                continue
        if record.bytecode is not None and record.bytecode.cache_existed:
            continue
        try:
            cache.rmdir()
        except OSError:
            continue
        prune(cache.parent)


def _prune_empty_dirs(
    folder: Path, stop: Path, root: Path | None = None, prunable: frozenset[str] | None = None
) -> None:
    """Remove the folders a removed file leaves empty, up to (not including) ``stop``; with ``prunable``
    only those it lists (paths relative to ``root``): a folder that was there before apply stays."""
    while folder != stop and stop in folder.parents:
        if prunable is not None and root is not None and folder.relative_to(root).as_posix() not in prunable:
            return
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


# -- repair after an interrupted run ---------------------------------------------------------------------


def describe_journal(store: StateStore, journal: Journal) -> str:
    written = sum(1 for e in journal.entries if _hash_of(store.root / e.path) == e.to_hash and e.to_hash != e.from_hash)
    return (
        f"an interrupted '{journal.operation}' (pid {journal.pid} on {journal.host}, started "
        f"{journal.started}) wrote {written} of {len(journal.entries)} files; every file is whole. "
        f"Run 'sm120kit apply' or 'sm120kit revert' to repair it"
    )


def _remove_temp_files(store: StateStore, journal: Journal) -> None:
    """Remove the temporary files the journal's run may have left (never a folder, never through a link)."""
    for rel in journal.temp_paths():
        full = store.root / rel
        try:
            info = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            remove(full)
    store.clear_stray_temp_files()


def repair(
    store: StateStore, on_debug: Step | None = None, *, hold_signals: bool = True, only: set[str] | None = None
) -> tuple[str, ...]:
    """Undo the half of an interrupted run: files it replaced go back to their content before that run,
    and the temporary files it may have left are removed.

    If the run had already saved its state record (only removing its journal was left), its writes are
    kept. Returns the paths put back. Caller holds the lock. Ctrl-C during the repair is held back until
    it is done (then :class:`Interrupted`). ``only``: the paths the run is known to have written (a roll-back
    within the run itself); the journal's other entries were not touched and are left alone.
    """
    journal = store.load_journal()
    if journal is None:
        return ()
    held = deferred_signals() if hold_signals else contextlib.nullcontext()
    with held as signals:
        finished = journal.state_before != _hash_of(store.state_path)
        repaired: list[str] = []
        if not finished:
            entries = [e for e in journal.entries if only is None or e.path in only]
            _check_targets(store.root, [(e.path, e.mode) for e in entries], store.journal_path, store)
            for entry in entries:
                current = _hash_of(store.root / entry.path)
                if current == entry.from_hash:
                    continue
                if current != entry.to_hash:
                    raise StateDamagedError(
                        f"{store.root / entry.path} matches neither its content before nor after the "
                        f"interrupted '{journal.operation}' recorded in {store.journal_path}; it was changed "
                        "since.",
                        hint="Check that file by hand (restore it from the original package or git), then "
                        f"delete {store.journal_path} and run the command again.",
                    )
            prunable = frozenset(journal.dirs) if journal.dirs is not None else None
            # Files the run created go first: removing them frees the space that putting back the files it
            # replaced may need (a full disk is a common reason to be here).
            order = sorted(entries, key=lambda e: e.from_hash is not None)
            for entry in order:
                if _hash_of(store.root / entry.path) == entry.from_hash:
                    continue
                data = None if entry.from_hash is None else store.blob(entry.from_hash)
                _restore(store.root, entry.path, data, entry.mode, journal.token, prunable)
                repaired.append(entry.path)
            tell(on_debug, f"repaired {len(repaired)} files of an interrupted {journal.operation}")
        _remove_temp_files(store, journal)
        store.clear_journal()
    if hold_signals and signals.pending:
        raise Interrupted(
            f"Interrupted ({signals.name}) while repairing an interrupted run; the repair was "
            f"finished first: {len(repaired)} file(s) put back, every file is as before that run.",
            hint="Run the command again.",
        )
    return tuple(repaired)


def _journaled(
    store: StateStore,
    operation: str,
    entries: list[JournalEntry],
    writes: list[tuple[str, bytes | None, int | None]],
    finish,
    progress: Progress | None = None,
    *,
    dirs: tuple[str, ...] | None = None,
    prunable: frozenset[str] | None = None,
    after=None,
) -> None:
    """Write ``writes`` (path, content or ``None`` to remove, mode) under a journal flushed to disk first,
    then call ``finish`` (which records the result). On any error, Ctrl-C or SIGTERM before ``finish`` is
    done, the files this run wrote are put back from the journal and the error says so; when even that
    fails the journal stays, and the error says which command finishes the job. ``dirs``: the folders the
    writes create (a roll-back removes those); ``prunable``: the folders a removal may remove when it
    leaves them empty (``None``: any); ``after``: a clean-up run once the journal is gone, with signals
    still held (its errors are ignored: what it leaves, the next run removes)."""
    with deferred_signals() as signals:
        try:
            journal = store.write_journal(operation, entries, dirs)
            fsync_dir(store.dir)
        except Sm120kitError as exc:
            raise type(exc)(f"{exc.message} Nothing in the tree was changed.", hint=exc.hint) from None
        written: set[str] = set()  # a write that raised changed nothing (the rename is its last step)
        try:
            for i, (path, data, mode) in enumerate(writes, 1):
                _restore(store.root, path, data, mode, journal.token, prunable)
                written.add(path)
                if progress is not None and len(writes) > 3:
                    progress(i, len(writes), path)
                if signals.pending:
                    raise Interrupted(f"Interrupted ({signals.name}) after {i} of {len(writes)} file(s).")
            finish()
        except (Sm120kitError, OSError, Interrupted) as exc:
            _roll_back(store, operation, exc, signals, written)
        try:
            store.clear_journal()
        except OSError:
            pass  # the record is saved: a later repair sees the run finished and only drops the journal
        if after is not None:
            with contextlib.suppress(OSError, Sm120kitError):
                after()
    if signals.pending:
        raise Interrupted(
            f"Interrupted ({signals.name}) as '{operation}' finished; it was completed first.",
            hint="Nothing is left to do.",
        )


def _roll_back(store: StateStore, operation: str, exc: BaseException, signals, written: set[str] | None = None) -> None:
    message = exc.message if isinstance(exc, (Sm120kitError, Interrupted)) else f"{exc.strerror or exc}."
    try:
        put_back = repair(store, hold_signals=False, only=written)
    except Sm120kitError as second:
        raise IOFailure(
            f"{message} Putting back what this '{operation}' had written failed too: {second.message} The "
            f"journal {store.journal_path} is kept; every file is whole, some old and some new.",
            hint=f"Fix the cause (free disk space), then run 'sm120kit {operation}' on this tree again: it "
            "first puts the half-done run's files back, then does its job.",
        ) from None
    what = (
        f"the {len(put_back)} file(s) it had written were put back" if put_back else "it had not changed any file yet"
    )
    state = f"{what}, so the tree is exactly as it was before this '{operation}'"
    if isinstance(exc, Interrupted):
        raise Interrupted(
            f"{message.rstrip('.')}; {state}.", hint=f"Run 'sm120kit {operation}' again to do it."
        ) from None
    kind = type(exc) if isinstance(exc, Sm120kitError) else IOFailure
    raise kind(f"{message} Then {state}.", hint=getattr(exc, "hint", None)) from None


# -- apply -----------------------------------------------------------------------------------------------


def _dirty_blockers(target: Target, plan: SeriesPlan, record: StateRecord | None) -> list[str]:
    dirty = set(target.dirty_files)
    blocked = []
    for change in plan.changes:
        if change.path not in dirty:
            continue
        known = record.file(change.path) if record else None
        if known is not None and known.after == _hash(change.before):
            continue  # dirty only because sm120kit patched it
        blocked.append(change.path)
    return blocked


def _edited_since_apply(plan: SeriesPlan, record: StateRecord | None) -> list[str]:
    """Files the plan would write that the state record lists and that someone changed since."""
    if record is None:
        return []
    out = []
    for change in plan.changes:
        known = record.file(change.path)
        if known is not None and _hash(change.before) not in (known.after, known.before):
            out.append(change.path)
    return out


def _repo_path(target: Target, path: str) -> str:
    if target.repo_root is None:
        return path
    try:
        return (target.root / path).resolve().relative_to(target.repo_root).as_posix()
    except ValueError:
        return path


def _new_record(
    old: StateRecord | None, plan: SeriesPlan, target: Target, series: Series, release: str | None
) -> StateRecord:
    stamp = now()
    files: dict[str, FileRecord] = {f.path: f for f in (old.files if old else ())}
    for change in plan.changes:
        previous = files.get(change.path)
        before = previous.before if previous else _hash(change.before)
        mode = previous.mode if previous else (change.mode if change.before is not None else None)
        patches = tuple(dict.fromkeys((previous.patches if previous else ()) + change.patches))
        bytecode = (
            previous.bytecode
            if previous
            else (
                bytecode_of(target.root, change.path) if change.before is None and change.path.endswith(".py") else None
            )
        )
        files[change.path] = FileRecord(
            path=change.path, before=before, after=_hash(change.after), mode=mode, patches=patches, bytecode=bytecode
        )
    patches: dict[str, PatchRecord] = {p.id: p for p in (old.patches if old else ())}
    for p in plan.patches:
        if p.status == PatchStatus.APPLIES and p.variant is not None:
            patches[p.patch_id] = PatchRecord(
                id=p.patch_id, variant=p.variant.name, base=p.variant.base, applied_at=stamp
            )
    order = {p.id: i for i, p in enumerate(series.patches)}
    ordered = tuple(sorted(patches.values(), key=lambda r: order.get(r.id, len(order))))
    return StateRecord(
        series=str(series.path),
        release=release,
        commit=target.commit,
        created=old.created if old else stamp,
        updated=stamp,
        patches=ordered,
        files=tuple(sorted(files.values(), key=lambda f: f.path)),
        sm120kit_version=__version__,
        dirs=old.dirs if old else (),
    )


def _write_changes(
    store: StateStore, changes: tuple[FileChange, ...], new_record: StateRecord, progress: Progress | None = None
) -> None:
    try:
        for change in changes:
            if change.before is not None:
                store.put_blob(change.before)
    except Sm120kitError as exc:
        raise type(exc)(f"{exc.message} Nothing in the tree was changed.", hint=exc.hint) from None
    entries = [
        JournalEntry(path=c.path, from_hash=_hash(c.before), to_hash=_hash(c.after), mode=c.mode) for c in changes
    ]
    made = _folders_to_create(store.root, [c.path for c in changes if c.before is None and c.after is not None])
    if new_record.dirs is not None:
        new_record = dataclasses.replace(new_record, dirs=tuple(sorted(set(new_record.dirs) | set(made))))
    _journaled(
        store,
        "apply",
        entries,
        [(c.path, c.after, c.mode) for c in changes],
        lambda: store.save(new_record),
        progress,
        dirs=made,
    )
    store.prune_blobs({f.before for f in new_record.files if f.before})


def _folders_to_create(root: Path, paths: list[str]) -> tuple[str, ...]:
    """The folders below ``sglang/`` that writing the new files ``paths`` creates (absent now), sorted."""
    made: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(2, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder in made or not os.path.lexists(root / folder):
                made.add(folder)
    return tuple(sorted(made))


def apply_series(
    target: Target,
    series: Series,
    *,
    dry_run: bool = False,
    fuzz: int = 0,
    allow_dirty: bool = False,
    strict: bool = False,
    progress: Progress | None = None,
    on_debug: Step | None = None,
) -> ApplyResult:
    """Apply ``series`` to ``target``. Nothing is written unless every patch applies, is already applied,
    is present upstream or (unless ``strict``) is not applicable; a conflict is reported in the result
    (``exit_code`` 4) with the hunk, the expected lines and the closest match."""
    release, exact, source = release_and_source(target)
    result = _apply_series(
        target,
        series,
        release,
        exact,
        dry_run=dry_run,
        fuzz=fuzz,
        allow_dirty=allow_dirty,
        strict=strict,
        progress=progress,
        on_debug=on_debug,
    )
    return dataclasses.replace(result, release_source=source)


def _apply_series(
    target: Target,
    series: Series,
    release: str | None,
    exact: bool,
    *,
    dry_run: bool,
    fuzz: int,
    allow_dirty: bool,
    strict: bool,
    progress: Progress | None,
    on_debug: Step | None,
) -> ApplyResult:
    root = target.root
    store = StateStore(root)
    warnings: list[str] = []

    if dry_run:
        journal = store.load_journal()
        if journal is not None:
            warnings.append(describe_journal(store, journal))
        record = store.load()
        plan = plan_series(
            root, series, version=release, fuzz=fuzz, exact=exact, recorded=record.patch_ids if record else ()
        )
        return _finish_result(
            target, release, exact, series, plan, record, store, dry_run=True, strict=strict, warnings=warnings
        )

    with store.locked("apply"):
        repaired = repair(store, on_debug)
        if repaired:
            warnings.append(f"repaired an interrupted run: put back {len(repaired)} file(s): " + ", ".join(repaired))
            if target.repo_root is not None:  # the repair changed which files git sees as dirty
                target = dataclasses.replace(target, dirty_files=find_target(target.package_dir).dirty_files)
        record = store.load()
        plan = plan_series(
            root, series, version=release, fuzz=fuzz, exact=exact, recorded=record.patch_ids if record else ()
        )
        result = _finish_result(
            target,
            release,
            exact,
            series,
            plan,
            record,
            store,
            dry_run=False,
            strict=strict,
            warnings=warnings,
            repaired=repaired,
        )
        if result.exit_code != EXIT_OK or not plan.changes:
            return result  # store.locked leaves no trace on a tree sm120kit did not change
        blocked = _dirty_blockers(target, plan, record)
        if blocked and not allow_dirty:
            shown = [_repo_path(target, p) for p in blocked]
            raise DirtyTreeError(
                f"The git tree {target.repo_root} has uncommitted changes in files the series would patch: "
                f"{', '.join(shown)}. Nothing was changed.",
                hint="Commit or stash those changes first, or pass --allow-dirty to patch on top of them "
                "(revert then restores your edited versions).",
            )
        edited = _edited_since_apply(plan, record)
        if edited:
            raise StateDamagedError(
                f"{', '.join(edited)} changed after sm120kit patched {'it' if len(edited) == 1 else 'them'}, "
                "and the series would now write to it again; a later revert could not give your edit back. "
                "Nothing was changed.",
                hint="Run 'sm120kit revert --force' (it keeps a copy of your edit and says where), then apply.",
            )
        _check_writable(root, [c.path for c in plan.changes])
        new_record = _new_record(record, plan, target, series, release)
        _write_changes(store, plan.changes, new_record, progress)
        return ApplyResult(
            target=target,
            release=release,
            exact_release=exact,
            series=series.path,
            plan=plan,
            dry_run=False,
            written=plan.changes,
            repaired=repaired,
            warnings=result.warnings,
            state_file=store.state_path,
            exit_code=EXIT_OK,
            message=result.message,
        )


def _finish_result(
    target,
    release,
    exact,
    series,
    plan: SeriesPlan,
    record,
    store,
    *,
    dry_run: bool,
    strict: bool,
    warnings: list[str],
    repaired: tuple[str, ...] = (),
) -> ApplyResult:
    warnings = list(warnings) + [f"{p.patch_id}: {w}" for p in plan.patches for w in p.warnings]
    if record is not None:
        gone = [pid for pid in record.patch_ids if series.get(pid) is None]
        if gone:
            warnings.append(
                f"the state record lists patches no longer in the series: {', '.join(gone)}; "
                "their changes stay until 'sm120kit revert'"
            )
    code, message = EXIT_OK, ""
    if plan.conflicts:
        code = EXIT_CONFLICT
        message = (
            f"{len(plan.conflicts)} patch(es) do not apply: "
            f"{', '.join(p.patch_id for p in plan.conflicts)}. Nothing was written."
        )
    elif strict and plan.with_status(PatchStatus.NOT_APPLICABLE):
        skipped = plan.with_status(PatchStatus.NOT_APPLICABLE)
        code = EXIT_STRICT
        message = (
            f"--strict: {len(skipped)} patch(es) are not applicable: "
            f"{', '.join(p.patch_id for p in skipped)}. Nothing was written."
        )
    return ApplyResult(
        target=target,
        release=release,
        exact_release=exact,
        series=series.path,
        plan=plan,
        dry_run=dry_run,
        repaired=repaired,
        warnings=tuple(warnings),
        state_file=store.state_path if record is not None else None,
        exit_code=code,
        message=message,
    )


# -- revert ----------------------------------------------------------------------------------------------


def revert_series(
    target: Target,
    *,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
    on_debug: Step | None = None,
) -> RevertResult:
    """Put every file the state record lists back to its exact original bytes and remove the record.

    A file edited after apply is refused (exit code 6, nothing changed) unless ``force``; then the edited
    version is kept as a copy under ``sglang/.sm120kit/kept/`` and its path is in the result.
    """
    root = target.root
    store = StateStore(root)
    if dry_run:
        warnings = []
        journal = store.load_journal()
        if journal is not None:
            warnings.append(describe_journal(store, journal))
        record = store.load()
        return _revert_plan(target, store, record, force=force, dry_run=True, warnings=warnings)
    if not os.path.lexists(store.dir):
        return RevertResult(
            target=target,
            dry_run=False,
            patches=(),
            files=(),
            message="No sm120kit state record in this tree: nothing to revert.",
        )
    with store.locked("revert"):
        repaired = repair(store, on_debug)
        record = store.load()
        warnings = [f"repaired an interrupted run: put back {len(repaired)} file(s)"] if repaired else []
        result = _revert_plan(target, store, record, force=force, dry_run=False, warnings=warnings, repaired=repaired)
        if result.exit_code != EXIT_OK:
            return result
        if record is None:
            if not store.kept_dir.exists():
                store.remove()
            return result
        _check_writable(root, [f.path for f in result.files if f.action in ("restored", "removed")])
        stamp = _stamp()
        kept: dict[str, Path] = {}
        entries = []
        for f in result.files:
            if f.action not in ("restored", "removed"):
                continue
            current = _read(root / f.path)
            if current is not None:
                store.put_blob(current)
            fr = record.file(f.path)
            entries.append(
                JournalEntry(path=f.path, from_hash=_hash(current), to_hash=fr.before, mode=_mode_of(root / f.path))
            )
            if f.kept_copy is not None and current is not None:
                kept[f.path] = store.keep_copy(f.path, current, stamp)
        originals = {f.path: store.blob(record.file(f.path).before) for f in result.files if f.action == "restored"}
        writes = [
            (f.path, originals[f.path], record.file(f.path).mode) if f.action == "restored" else (f.path, None, None)
            for f in result.files
            if f.action in ("restored", "removed")
        ]
        prunable = frozenset(record.dirs) if record.dirs is not None else None
        _journaled(store, "revert", entries, writes, store.clear_state, progress, prunable=prunable, after=store.remove)
        _remove_bytecode(
            root,
            [fr for fr in record.files if fr.before is None],
            lambda folder: _prune_empty_dirs(folder, root / "sglang", root, prunable),
        )
        files = tuple(RevertedFile(path=f.path, action=f.action, kept_copy=kept.get(f.path)) for f in result.files)
        return RevertResult(
            target=target,
            dry_run=False,
            patches=result.patches,
            files=files,
            repaired=repaired,
            warnings=result.warnings,
            exit_code=EXIT_OK,
            message=f"Reverted {len(result.patches)} patch(es); "
            f"{sum(1 for f in files if f.action in ('restored', 'removed'))} file(s) "
            "restored to their original bytes.",
        )


def _mode_of(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return None


def _revert_plan(
    target: Target,
    store: StateStore,
    record: StateRecord | None,
    *,
    force: bool,
    dry_run: bool,
    warnings: list[str],
    repaired: tuple[str, ...] = (),
) -> RevertResult:
    if record is None:
        return RevertResult(
            target=target,
            dry_run=dry_run,
            patches=(),
            files=(),
            warnings=tuple(warnings),
            repaired=repaired,
            message="No sm120kit state record in this tree: nothing to revert.",
        )
    _check_targets(
        store.root, [(fr.path, fr.mode) for fr in record.files if fr.before is not None], store.state_path, store
    )
    _check_targets(store.root, [(fr.path, None) for fr in record.files if fr.before is None], store.state_path, store)
    files: list[RevertedFile] = []
    edited: list[str] = []
    deleted: list[str] = []  # edited too, but there is nothing to keep a copy of
    for fr in record.files:
        current = _hash_of(store.root / fr.path)
        if current == fr.before:
            files.append(RevertedFile(fr.path, "unchanged"))
        elif current == fr.after:
            files.append(RevertedFile(fr.path, "removed" if fr.before is None else "restored"))
        else:
            (edited if current is not None else deleted).append(fr.path)
            if force:
                kept_copy = store.kept_dir / "<time>" / fr.path if current is not None else None
                files.append(RevertedFile(fr.path, "removed" if fr.before is None else "restored", kept_copy=kept_copy))
            else:
                files.append(RevertedFile(fr.path, "edited" if current is not None else "deleted"))
    exit_code, message = EXIT_OK, ""
    if (edited or deleted) and not force:
        what = []
        if edited:
            what.append(f"{len(edited)} file(s) changed after sm120kit patched them: {', '.join(edited)}")
        if deleted:
            what.append(f"{len(deleted)} file(s) deleted after sm120kit patched them: {', '.join(deleted)}")
        exit_code = EXIT_STATE
        message = (
            "; ".join(what) + ". Nothing was reverted. Pass --force to revert anyway: every file gets "
            "its original bytes back"
            + (f", and the edited versions are kept as copies under {store.kept_dir}." if edited else ".")
        )
    else:
        if edited:
            warnings = list(warnings) + [f"edited after apply (a copy is kept): {', '.join(edited)}"]
        if deleted:
            warnings = list(warnings) + [
                f"deleted after apply (no copy to keep; the original is put back): {', '.join(deleted)}"
            ]
    return RevertResult(
        target=target,
        dry_run=dry_run,
        patches=record.patch_ids,
        files=tuple(files),
        warnings=tuple(warnings),
        repaired=repaired,
        exit_code=exit_code,
        message=message,
    )


# -- status ----------------------------------------------------------------------------------------------


def series_status(target: Target, series: Series) -> StatusResult:
    """What the series looks like on ``target`` now; reads only. Problems (an interrupted run, a damaged
    record, files edited after apply) are listed and make ``exit_code`` 6.

    A run that holds the tree lock is waited for (``SM120KIT_LOCK_WAIT``); if it still holds it, that is an
    :class:`IOFailure` saying a run is in progress, not an interrupted run. While status reads, it holds
    the lock shared, so no run starts writing under it."""
    store = StateStore(target.root)
    with reading(store.lock_path) as holder:
        if holder is not None:
            raise IOFailure(
                f"An sm120kit run is in progress on {target.package_dir} "
                f"({describe_holder(holder)}); its files are being written, so their state is not "
                "reported now.",
                hint="Run 'sm120kit status' again when that run has finished (it holds the lock "
                f"{store.lock_path} until then; SM120KIT_LOCK_WAIT sets how long status waits).",
            )
        return _series_status(target, series, store)


def _series_status(target: Target, series: Series, store: StateStore) -> StatusResult:
    root = target.root
    release, exact, source = release_and_source(target)
    problems: list[str] = []
    journal = None
    try:
        journal = store.load_journal()
    except StateDamagedError as exc:
        problems.append(exc.render())
    if journal is not None:
        problems.append(describe_journal(store, journal))
    record = None
    try:
        record = store.load()
    except StateDamagedError as exc:
        problems.append(exc.render())
    if not problems and store.leftover():
        problems.append(
            f"{store.dir} is left from a run that was stopped while it removed the folder (after a "
            "complete revert) or before it changed anything: it holds no record and no journal; "
            "'sm120kit revert' removes it"
        )
    files: list[FileState] = []
    if record is not None:
        for fr in record.files:
            why = _unsafe_target(root, fr.path, fr.mode if fr.before is not None else None)
            if why:
                problems.append(f"the state record {store.state_path} asks to write {why}; revert will refuse it")
    if record is not None:
        for fr in record.files:
            current = _hash_of(root / fr.path)
            if current == fr.after:
                condition = "patched"
            elif current == fr.before:
                condition = "original"
            elif current is None:
                condition = "missing"
            else:
                condition = "edited"
            files.append(FileState(fr.path, condition, fr.patches))
        edited = [f.path for f in files if f.condition == "edited"]
        deleted = [f.path for f in files if f.condition == "missing"]
        if edited and journal is None:
            problems.append(
                f"the state record no longer matches {', '.join(edited)} (changed after apply); "
                "'sm120kit revert --force' restores the originals and keeps a copy of the edits"
            )
        if deleted and journal is None:
            problems.append(
                f"{', '.join(deleted)} (patched by sm120kit) no longer exist(s): deleted after apply; "
                "'sm120kit revert --force' puts the originals back (there is no edit to keep)"
            )
    plan = plan_series(root, series, version=release, exact=exact, recorded=record.patch_ids if record else ())
    return StatusResult(
        target=target,
        release=release,
        exact_release=exact,
        series=series.path,
        plan=plan,
        recorded=record.patch_ids if record else (),
        files=tuple(files),
        problems=tuple(problems),
        state_file=store.state_path if record else None,
        release_source=source,
    )
