"""The state record a patched tree carries: what sm120kit changed, so apply is idempotent and revert exact.

Everything lives in one hidden folder inside the package, ``sglang/.sm120kit/``:

- ``state.json``: the patches applied (id, variant, base), and per file the SHA-256 of its content before
  sm120kit first changed it and after the last apply. Written last, after every file is in place.
- ``blobs/<sha256>``: the original content of each changed file (and, while a write is under way, the
  content it is replacing), so revert restores the exact bytes even if the series has changed since.
- ``journal.json``: written (and flushed to disk) before the first file is replaced and removed after the
  state record is saved. Found on a later run, it means a run was killed mid-write; every file it lists
  is wholly old or wholly new (writes are atomic renames), and :func:`sm120kit.patching.engine.repair` puts the
  listed files back to their ``from`` content. Its ``token`` names the run's temporary files
  (:func:`temp_path`), which the repair removes.

Nothing read back from this folder is trusted: entries whose path would leave the tree, whose mode is not
plain permission bits, or whose hash is malformed are :class:`Untrusted` (reported as state-damaged), and
the folder itself, or anything in it, being a symbolic link stops every command
(:meth:`StateStore.check_folder`).
- ``lock``: held (``flock``) while a run writes; it names the holder.
- ``kept/<time>/sglang/...``: copies of files edited after apply that a forced revert replaced.
- ``.gitignore`` (``*``): keeps the folder out of ``git status`` in a clone.

A revert removes the folder, so a reverted tree is byte-identical to the original, file list included;
``.gitignore`` goes last, so a folder left by a run killed while removing it stays out of ``git status``
(``status`` names it, the next ``apply`` or ``revert`` removes it).

The record and the journal also list the folders sm120kit created for new files (``dirs``), so that revert
and a roll-back remove those and no folder that was there before (an empty one included); a record
without that list (older versions) removes every folder its removed files leave empty, as before.

Everything is read as a regular file only (a FIFO is refused, not waited on); JSON nested too deeply
for the parser, or a path that cannot be a file name (a lone surrogate), is damage like any other.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import __version__
from sm120kit.errors import IOFailure, StateDamagedError
from sm120kit.patching import treepath
from sm120kit.util import regularfile
from sm120kit.util.atomicfile import fault_point, write_atomic
from sm120kit.util.lock import TreeLock

STATE_DIR = treepath.STATE_DIR
FORMAT = 1
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class Untrusted(ValueError):
    """An entry of the state record or the journal that is not safe to act on (the message names it)."""


def _entry(data: object, where: str) -> dict:
    if not isinstance(data, dict):
        raise Untrusted(f"{where} is not an object but {type(data).__name__}")
    return data


def _path_field(data: dict, where: str) -> str:
    value = data.get("path")
    why = treepath.problem(value)
    if why:
        raise Untrusted(f"{where}.path = {value!r} {why}")
    return value


def _hash_field(data: dict, key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not (isinstance(value, str) and _HASH_RE.match(value)):
        raise Untrusted(f"{where}.{key} = {value!r} is not a SHA-256 hex digest")
    return value


def _mode_field(data: dict, where: str) -> int | None:
    raw = data.get("mode")
    if raw is None:
        return None
    value = raw
    if isinstance(raw, str):
        try:
            value = int(raw, 8)
        except ValueError:
            raise Untrusted(f"{where}.mode = {raw!r} is not an octal number") from None
    why = treepath.mode_problem(value)
    if why:
        raise Untrusted(f"{where}.mode = {raw!r}: {why}")
    return value


def _dirs_field(data: dict, where: str) -> tuple[str, ...] | None:
    """The ``dirs`` list (folders sm120kit created), ``None`` when absent (a record of an older version)."""
    if data.get("dirs") is None:
        return None
    dirs = _list_field(data, "dirs", where)
    for i, value in enumerate(dirs):
        why = treepath.problem(value)
        if why:
            raise Untrusted(f"{where}.dirs[{i}] = {value!r} {why}")
    return tuple(dirs)


def _list_field(data: dict, key: str, where: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise Untrusted(f"{where}.{key} is not a list but {type(value).__name__}")
    return value


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# The bytecode Python writes for a module: ``__pycache__/<name>.<tag>[.opt-N].pyc``.
_PYC_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}\.pyc$")
MAX_BYTECODE_NAMES = 64


@dataclass(frozen=True)
class Bytecode:
    """What the ``__pycache__`` folder beside a module the series creates held when it was created, so that
    revert removes only the bytecode written since: whether the folder existed, and the names of the module's
    ``.pyc`` files already in it (left by an earlier tree; kept)."""

    cache_existed: bool
    present: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"cache_existed": self.cache_existed, "present": list(self.present)}

    @classmethod
    def from_json(cls, data: object, where: str) -> Bytecode:
        data = _entry(data, where)
        existed, present = data.get("cache_existed"), data.get("present", [])
        if not isinstance(existed, bool):
            raise Untrusted(f"{where}.cache_existed = {existed!r} is not true or false")
        if (
            not isinstance(present, list)
            or len(present) > MAX_BYTECODE_NAMES
            or not all(isinstance(n, str) and _PYC_RE.match(n) for n in present)
        ):
            raise Untrusted(f"{where}.present is not a list of at most {MAX_BYTECODE_NAMES} .pyc file names")
        return cls(cache_existed=existed, present=tuple(present))


def bytecode_of(root: Path, path: str) -> Bytecode:
    """The :class:`Bytecode` beside ``root/path`` now (read before the series creates that module)."""
    cache = (Path(root) / path).parent / "__pycache__"
    try:
        if not stat.S_ISDIR(os.lstat(cache).st_mode):
            return Bytecode(cache_existed=False)
        names = os.listdir(cache)
    except OSError:
        return Bytecode(cache_existed=False)
    prefix = path.rsplit("/", 1)[-1][:-3] + "."
    present = sorted(n for n in names if n.startswith(prefix) and _PYC_RE.match(n))
    return Bytecode(cache_existed=True, present=tuple(present[:MAX_BYTECODE_NAMES]))


@dataclass(frozen=True)
class FileRecord:
    path: str  # relative to the folder holding sglang/ ("sglang/srt/utils.py")
    before: str | None  # sha256 before sm120kit first changed it; None: the file did not exist
    after: str | None  # sha256 after the last apply; None: the series deleted it
    mode: int | None  # permission bits before (None for a file the series created)
    patches: tuple[str, ...] = ()
    bytecode: Bytecode | None = None  # for a module the series created: its __pycache__ before (None: unknown)

    def to_json(self) -> dict:
        data = {
            "path": self.path,
            "before": self.before,
            "after": self.after,
            "mode": None if self.mode is None else oct(self.mode),
            "patches": list(self.patches),
        }
        if self.bytecode is not None:
            data["bytecode"] = self.bytecode.to_json()
        return data

    @classmethod
    def from_json(cls, data: object, where: str = "files[]") -> FileRecord:
        """Read one entry; :class:`Untrusted` (naming ``where``) for a path outside the tree, a mode that
        is not plain permission bits or a malformed hash."""
        data = _entry(data, where)
        patches = _list_field(data, "patches", where)
        if not all(isinstance(p, str) for p in patches):
            raise Untrusted(f"{where}.patches = {patches!r} is not a list of patch ids")
        bytecode = data.get("bytecode")
        return cls(
            path=_path_field(data, where),
            before=_hash_field(data, "before", where),
            after=_hash_field(data, "after", where),
            mode=_mode_field(data, where),
            patches=tuple(patches),
            bytecode=None if bytecode is None else Bytecode.from_json(bytecode, f"{where}.bytecode"),
        )


@dataclass(frozen=True)
class PatchRecord:
    id: str
    variant: str  # diff file name
    base: str
    applied_at: str

    def to_json(self) -> dict:
        return {"id": self.id, "variant": self.variant, "base": self.base, "applied_at": self.applied_at}

    @classmethod
    def from_json(cls, data: dict) -> PatchRecord:
        return cls(
            id=data["id"],
            variant=data.get("variant", ""),
            base=data.get("base", ""),
            applied_at=data.get("applied_at", ""),
        )


@dataclass(frozen=True)
class StateRecord:
    series: str
    release: str | None
    commit: str | None
    created: str
    updated: str
    patches: tuple[PatchRecord, ...]
    files: tuple[FileRecord, ...]
    sm120kit_version: str = __version__
    format: int = FORMAT
    dirs: tuple[str, ...] | None = ()  # folders sm120kit created for new files; None: not recorded (older)

    @property
    def patch_ids(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.patches)

    def file(self, path: str) -> FileRecord | None:
        for record in self.files:
            if record.path == path:
                return record
        return None

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "sm120kit_version": self.sm120kit_version,
            "series": self.series,
            "release": self.release,
            "commit": self.commit,
            "created": self.created,
            "updated": self.updated,
            "patches": [p.to_json() for p in self.patches],
            "files": [f.to_json() for f in self.files],
            **({"dirs": list(self.dirs)} if self.dirs is not None else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> StateRecord:
        data = _entry(data, "the record")
        patches = []
        for i, p in enumerate(_list_field(data, "patches", "the record")):
            p = _entry(p, f"patches[{i}]")
            if not isinstance(p.get("id"), str):
                raise Untrusted(f"patches[{i}].id = {p.get('id')!r} is not a patch id")
            patches.append(PatchRecord.from_json(p))
        files = tuple(
            FileRecord.from_json(f, f"files[{i}]") for i, f in enumerate(_list_field(data, "files", "the record"))
        )
        seen: set[str] = set()
        for i, f in enumerate(files):
            if f.path in seen:
                raise Untrusted(f"files[{i}].path = {f.path!r} is listed twice")
            seen.add(f.path)
        return cls(
            series=data.get("series", ""),
            release=data.get("release"),
            commit=data.get("commit"),
            created=data.get("created", ""),
            updated=data.get("updated", ""),
            patches=tuple(patches),
            files=files,
            sm120kit_version=data.get("sm120kit_version", ""),
            format=data.get("format", FORMAT),
            dirs=_dirs_field(data, "the record"),
        )


@dataclass(frozen=True)
class JournalEntry:
    path: str
    from_hash: str | None  # content before this run (None: absent)
    to_hash: str | None  # content this run writes (None: removed)
    mode: int | None  # mode to give the file when it is put back

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "from": self.from_hash,
            "to": self.to_hash,
            "mode": None if self.mode is None else oct(self.mode),
        }

    @classmethod
    def from_json(cls, data: object, where: str = "entries[]") -> JournalEntry:
        data = _entry(data, where)
        return cls(
            path=_path_field(data, where),
            from_hash=_hash_field(data, "from", where),
            to_hash=_hash_field(data, "to", where),
            mode=_mode_field(data, where),
        )


_TOKEN_RE = re.compile(r"^[0-9a-f]{8,32}$")


def temp_path(path: str, token: str) -> str:
    """The temporary file a journaled write of ``path`` goes through: beside it, named by the journal's
    token, so a repair after a kill knows every temporary file the killed run may have left."""
    folder, _, name = path.rpartition("/")
    return f"{folder}/.{name}.sm120kit-{token}.tmp"


@dataclass(frozen=True)
class Journal:
    operation: str  # "apply" | "revert"
    started: str
    pid: int
    host: str
    entries: tuple[JournalEntry, ...] = field(default=())
    state_before: str | None = None  # sha256 of state.json when the run began (None: there was none)
    token: str = ""  # names the run's temporary files (see temp_path); "" in journals of older versions
    dirs: tuple[str, ...] | None = None  # folders a roll-back may remove (an apply's new ones); None: any

    def temp_paths(self) -> tuple[str, ...]:
        return tuple(temp_path(e.path, self.token) for e in self.entries) if self.token else ()

    def to_json(self) -> dict:
        return {
            "operation": self.operation,
            "started": self.started,
            "pid": self.pid,
            "host": self.host,
            "state_before": self.state_before,
            "token": self.token,
            "entries": [e.to_json() for e in self.entries],
            **({"dirs": list(self.dirs)} if self.dirs is not None else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> Journal:
        data = _entry(data, "the journal")
        if data.get("operation") not in ("apply", "revert"):
            raise Untrusted(f"operation = {data.get('operation')!r} is neither 'apply' nor 'revert'")
        if "entries" not in data:
            raise Untrusted("it has no 'entries'")
        entries = tuple(
            JournalEntry.from_json(e, f"entries[{i}]")
            for i, e in enumerate(_list_field(data, "entries", "the journal"))
        )
        token = data.get("token", "")
        if token and not (isinstance(token, str) and _TOKEN_RE.match(token)):
            raise Untrusted(f"token = {token!r} is not a hex run token")
        return cls(
            operation=data["operation"],
            started=str(data.get("started", "")),
            pid=data.get("pid", 0),
            host=str(data.get("host", "")),
            entries=entries,
            state_before=_hash_field(data, "state_before", "the journal"),
            token=token,
            dirs=_dirs_field(data, "the journal"),
        )


class StateStore:
    """The ``.sm120kit`` folder of one tree. Reading never creates it; :meth:`ensure` does."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)  # the folder holding sglang/
        self.dir = self.root / "sglang" / STATE_DIR
        self.state_path = self.dir / "state.json"
        self.journal_path = self.dir / "journal.json"
        self.lock_path = self.dir / "lock"
        self.blobs_dir = self.dir / "blobs"
        self.kept_dir = self.dir / "kept"

    # -- folder ------------------------------------------------------------------------------------------
    def check_folder(self) -> None:
        """Refuse a state folder that is, or holds, a symbolic link or anything sm120kit does not write
        there: writes and clean-ups through it could leave the tree. :class:`StateDamagedError`."""
        layout = (
            (self.dir, True),
            (self.blobs_dir, True),
            (self.kept_dir, True),
            (self.state_path, False),
            (self.journal_path, False),
            (self.lock_path, False),
            (self.dir / ".gitignore", False),
        )
        for path, folder in layout:
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise IOFailure(f"Cannot examine {path}: {exc.strerror or exc}.") from None
            if stat.S_ISLNK(info.st_mode):
                why = f"{path} is a symbolic link (to {os.readlink(path)})"
            elif folder and not stat.S_ISDIR(info.st_mode):
                why = f"{path} is not a folder"
            elif not folder and not stat.S_ISREG(info.st_mode):
                why = f"{path} is {regularfile.kind_of(info.st_mode)}, not a regular file"
            elif not folder and info.st_nlink != 1:
                why = (
                    f"{path} has {info.st_nlink} names (a hard link: a file elsewhere shares its content, and "
                    "sm120kit would write into it)"
                )
            else:
                continue
            raise StateDamagedError(
                f"sm120kit's state folder is not trusted: {why}. Nothing was changed.",
                hint=f"sm120kit never follows links in {self.dir}. Look at what it points to (or what shares it), "
                "remove it, and run the command again (restore the tree from its original if its record is "
                "gone).",
            )

    def ensure(self) -> None:
        self.check_folder()
        try:
            self.blobs_dir.mkdir(parents=True, exist_ok=True)
            ignore = self.dir / ".gitignore"
            if not ignore.exists():
                ignore.write_text("*\n", encoding="utf-8")
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise IOFailure(
                f"Cannot create sm120kit's state folder {self.dir}: {exc.strerror or exc}. Nothing was changed.",
                hint="Free some disk space and run the command again."
                if full
                else "The tree must be writable by you (is it a read-only or system install?); "
                "use a virtual environment you own, or run sm120kit as the tree's owner.",
            ) from None

    @contextlib.contextmanager
    def locked(self, command: str) -> Iterator[None]:
        """Hold the tree lock, with the folder complete (``.gitignore``, ``blobs/``) once it is held: the
        run that held it before may have removed the whole folder (a finished revert). On the way out a
        folder with nothing to keep (no record, no journal, no kept edits) is removed, so a refused or
        no-op run leaves no trace."""
        lock = TreeLock(self.lock_path, command=command, prepare=self.ensure)
        made = not os.path.lexists(self.dir)
        try:
            self.ensure()
            lock.acquire()
        except BaseException as exc:
            # A refused or interrupted start (a full disk, Ctrl-C) leaves no folder it made; one another run
            # holds stays.
            if made and not getattr(exc, "lock_held", False):
                self._remove_made_folder()
            raise
        try:
            self.ensure()
            yield
        finally:
            try:
                self.discard_if_unused()
            finally:
                lock.release()

    def _remove_made_folder(self) -> None:
        """Remove the folder this run made before it held the lock: only sm120kit's own empty layout."""
        try:
            if self.dir.is_symlink() or not self.dir.is_dir():
                return
            names = set(os.listdir(self.dir))
            if names <= {".gitignore", "blobs", "lock"} and not (
                self.blobs_dir.is_dir() and os.listdir(self.blobs_dir)
            ):
                shutil.rmtree(self.dir, ignore_errors=True)
        except OSError:
            pass

    def discard_if_unused(self) -> None:
        try:
            if self.dir.is_symlink() or not self.dir.is_dir():
                return
            if not any(p.exists() for p in (self.state_path, self.journal_path, self.kept_dir)):
                shutil.rmtree(self.dir, ignore_errors=True)
        except OSError:
            pass

    def remove(self) -> None:
        """Remove the folder (after a complete revert); copies of kept edits, if any, stay. ``.gitignore``
        is removed last, so a run stopped half way leaves a folder git still ignores (and ``status``
        names). Errors are ignored: what is left is removed by the next run."""
        self.check_folder()
        keep = self.kept_dir.exists()
        for path in sorted(self.dir.iterdir()):
            if path.name == ".gitignore" or (keep and path.name == "kept"):
                continue
            _remove_tree(path)
        if not keep:
            with contextlib.suppress(OSError):
                (self.dir / ".gitignore").unlink(missing_ok=True)
                self.dir.rmdir()

    def leftover(self) -> bool:
        """Whether the folder is there with nothing in it to act on: no record, no journal, no kept edits
        (a run killed while removing it, or before it held the lock). A refused or finished run leaves no such
        folder."""
        if self.dir.is_symlink() or not self.dir.is_dir():
            return False
        return not any(os.path.lexists(p) for p in (self.state_path, self.journal_path, self.kept_dir))

    # -- state record ------------------------------------------------------------------------------------
    def load(self) -> StateRecord | None:
        self.check_folder()
        if not self.state_path.exists():
            return None
        try:
            data = json.loads(regularfile.read_text(self.state_path, follow=False))
            record = StateRecord.from_json(data)
        except Untrusted as exc:
            raise StateDamagedError(
                f"The state record {self.state_path} is not trusted: {exc}. Nothing was changed.",
                hint="sm120kit only restores files inside the tree with plain permission bits. Restore the "
                "tree from its original (reinstall the package or 'git checkout' the files), then delete "
                f"{self.dir}.",
            ) from None
        except RecursionError:
            raise StateDamagedError(
                f"The state record {self.state_path} cannot be read: its JSON is nested too deeply (sm120kit "
                "never writes it so).",
                hint="Restore the tree from its original (reinstall the package or 'git checkout' the files), "
                f"then delete {self.dir}.",
            ) from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateDamagedError(
                f"The state record {self.state_path} cannot be read ({type(exc).__name__}: {exc}).",
                hint="Restore the tree from its original (reinstall the package or 'git checkout' the files), "
                f"then delete {self.dir}.",
            ) from None
        if record.format != FORMAT:
            raise StateDamagedError(
                f"The state record {self.state_path} has format {record.format}; this sm120kit reads format {FORMAT}.",
                hint="Use the sm120kit version that wrote it to revert the tree.",
            )
        return record

    def load_quietly(self) -> StateRecord | None:
        try:
            return self.load()
        except StateDamagedError:
            return None

    def save(self, record: StateRecord) -> None:
        data = (json.dumps(record.to_json(), indent=2) + "\n").encode()
        write_atomic(self.state_path, data, 0o644, fsync=True)

    def clear_state(self) -> None:
        self.state_path.unlink(missing_ok=True)

    # -- content blobs -----------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.blobs_dir / digest

    def put_blob(self, data: bytes) -> str:
        digest = sha256(data)
        path = self.blob_path(digest)
        if not path.is_file() or path.is_symlink():
            write_atomic(path, data, 0o644, fsync=True)
        return digest

    def blob(self, digest: str) -> bytes:
        path = self.blob_path(digest)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise OSError("not a regular file")
                data = handle.read()
        except OSError:
            raise StateDamagedError(
                f"The saved original {path} is missing, so sm120kit cannot restore that file exactly.",
                hint="Restore the tree from its original (reinstall the package or 'git checkout' the files), "
                f"then delete {self.dir}.",
            ) from None
        if sha256(data) != digest:
            raise StateDamagedError(
                f"The saved original {path} is damaged (its hash does not match its name).",
                hint=f"Restore the tree from its original, then delete {self.dir}.",
            )
        return data

    def prune_blobs(self, keep: set[str]) -> None:
        if not self.blobs_dir.is_dir():
            return
        for path in self.blobs_dir.iterdir():
            if path.name not in keep and (path.is_symlink() or not path.is_dir()):
                path.unlink(missing_ok=True)

    # -- journal -----------------------------------------------------------------------------------------
    def write_journal(
        self, operation: str, entries: list[JournalEntry], dirs: tuple[str, ...] | None = None
    ) -> Journal:
        """Record what a run is about to write (flushed to disk before the first file is replaced); ``dirs``:
        the folders it creates, which a roll-back removes (``None``: any its removals leave empty)."""
        state_before = (
            sha256(regularfile.read_bytes(self.state_path, follow=False)) if self.state_path.exists() else None
        )
        journal = Journal(
            operation=operation,
            started=now(),
            pid=os.getpid(),
            host=socket.gethostname(),
            entries=tuple(entries),
            state_before=state_before,
            token=secrets.token_hex(6),
            dirs=dirs,
        )
        write_atomic(self.journal_path, (json.dumps(journal.to_json(), indent=2) + "\n").encode(), 0o644, fsync=True)
        return journal

    def load_journal(self) -> Journal | None:
        self.check_folder()
        if not self.journal_path.exists():
            return None
        try:
            return Journal.from_json(json.loads(regularfile.read_text(self.journal_path, follow=False)))
        except Untrusted as exc:
            raise StateDamagedError(
                f"The write journal {self.journal_path} is not trusted: {exc}. Nothing was changed.",
                hint="sm120kit only restores files inside the tree with plain permission bits. Restore the "
                f"tree from its original, then delete {self.dir}.",
            ) from None
        except RecursionError:
            raise StateDamagedError(
                f"The write journal {self.journal_path} cannot be read: its JSON is nested "
                "too deeply (sm120kit never writes it so).",
                hint=f"Restore the tree from its original, then delete {self.dir}.",
            ) from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateDamagedError(
                f"The write journal {self.journal_path} cannot be read ({exc}).",
                hint=f"Restore the tree from its original, then delete {self.dir}.",
            ) from None

    def clear_journal(self) -> None:
        self.journal_path.unlink(missing_ok=True)

    def clear_stray_temp_files(self) -> None:
        """Remove temporary files a killed run left in the state folder (``.NAME.XXXX.tmp``)."""
        for folder in (self.dir, self.blobs_dir):
            if not folder.is_dir() or folder.is_symlink():
                continue
            for path in folder.iterdir():
                if path.name.startswith(".") and path.name.endswith(".tmp") and not path.is_dir():
                    path.unlink(missing_ok=True)

    # -- kept edits --------------------------------------------------------------------------------------
    def keep_copy(self, path: str, data: bytes, stamp: str) -> Path:
        dest = self.kept_dir / stamp / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, data, 0o644, fsync=True)
        return dest


def read_recorded(root: Path) -> frozenset[str]:
    """Ids of the patches the tree's state record lists (empty when there is none or it is unreadable)."""
    record = StateStore(root).load_quietly()
    return frozenset(record.patch_ids) if record else frozenset()


def _remove_tree(path: Path) -> None:
    """Remove ``path`` (a file, or a folder and what it holds) one entry at a time, never following a link;
    each removal is a fault point (``SM120KIT_FAULT_IN_CLEANUP``). Errors are ignored."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode):
        try:
            children = sorted(os.listdir(path))
        except OSError:
            children = []
        for name in children:
            _remove_tree(path / name)
        with contextlib.suppress(OSError):
            os.rmdir(path)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)
    fault_point("cleanup")
