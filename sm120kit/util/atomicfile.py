"""Atomic file writes: a temporary file in the same folder, flushed, then ``os.replace`` over the target.

A reader (or a process killed half way) sees the whole old file or the whole new one, never a mix. A
caller that journals its writes passes the temporary file's name (``tmp=``), so that a repair after a
kill can remove a temporary file the killed run left behind.

:func:`deferred_signals` holds SIGINT and SIGTERM back while a run writes a tree; the writer checks
between files and rolls back instead of stopping half way.

Test hooks (fault injection), read from the environment:

- ``SM120KIT_FAULT_AFTER_WRITES=N``: the process signals itself right after its N-th replace (or
  removal) of a file in a patched tree;
- ``SM120KIT_FAULT_IN_WRITE=N``: it signals itself at its N-th journaled write, after the temporary file
  is written and before it replaces the target;
- ``SM120KIT_FAULT_IN_PROBE=N``: at its N-th writability probe, while the probe file exists;
- ``SM120KIT_FAULT_IN_CLEANUP=N``: at the N-th entry a finished revert removes from the state folder;
- ``SM120KIT_FAULT_IN_LOCK=N``: as the N-th tree lock is about to be taken (its folder made, the lock not yet
  held);
- ``SM120KIT_FAULT_SIGNAL``: the signal sent, ``KILL`` (default), ``INT``, ``TERM`` or ``STOP`` (the process
  stops until a test has changed the tree under it and sends ``SIGCONT``).

They let tests prove that an interrupted run leaves every file whole, leaves no temporary file behind
after the next run, and that Ctrl-C rolls back.

Folders are replaced the same way (:func:`building_folder`, :func:`replace_folder`): the new folder is
built in a temporary sibling and renamed into place while the old one still exists (the old one is
renamed aside first and removed only once the new one is in place), so a failure or a kill at any point
leaves the old folder or the new one, never neither.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from sm120kit.errors import IOFailure

_FAULT_ENVS = {
    "replace": "SM120KIT_FAULT_AFTER_WRITES",
    "tmp": "SM120KIT_FAULT_IN_WRITE",
    "probe": "SM120KIT_FAULT_IN_PROBE",
    "cleanup": "SM120KIT_FAULT_IN_CLEANUP",
    "lock": "SM120KIT_FAULT_IN_LOCK",
}
_counts = {kind: 0 for kind in _FAULT_ENVS}


def fault_point(kind: str) -> None:
    """A named fault-injection point (see the module text); nothing unless its variable is set."""
    _fault_point(kind)


def _fault_point(kind: str = "replace") -> None:
    limit = os.environ.get(_FAULT_ENVS[kind])
    if not limit:
        return
    _counts[kind] += 1
    if _counts[kind] == int(limit):
        name = os.environ.get("SM120KIT_FAULT_SIGNAL", "KILL").upper()
        os.kill(os.getpid(), getattr(signal, f"SIG{name}", signal.SIGKILL))


def _io_error(path: Path, exc: OSError, doing: str) -> IOFailure:
    full = exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT
    return IOFailure(
        f"Cannot {doing} {path}: {exc.strerror or exc}.",
        hint="Free some disk space and run the command again."
        if full
        else "Check that the tree is writable by you and the disk is not full.",
    )


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_atomic(
    path: Path,
    data: bytes,
    mode: int | None,
    *,
    fsync: bool = False,
    fault_point: bool = False,
    tmp: Path | None = None,
    dir_fd: int | None = None,
) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; keep ``mode`` (permission
    bits) when given. ``tmp``: the temporary file's path (journaled by the caller; replaced if a killed
    run left it), else a fresh random name. ``dir_fd``: an open descriptor of the folder ``path`` lies in;
    then only the last parts of ``path`` and ``tmp`` are used, relative to it, so a folder swapped for a
    link after the caller opened it is not written through. Raises :class:`IOFailure` naming the path."""
    path = Path(path)
    target = path.name if dir_fd is not None else path
    try:
        if tmp is None and dir_fd is None:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        else:
            tmp_name = Path(tmp).name if tmp is not None else f".{path.name}.{os.urandom(6).hex()}.tmp"
            if dir_fd is None:
                tmp_name = str(tmp)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            try:
                fd = os.open(tmp_name, flags, 0o600, dir_fd=dir_fd)
            except FileExistsError:
                os.unlink(tmp_name, dir_fd=dir_fd)
                fd = os.open(tmp_name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise _io_error(path, exc, "write") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
        if fault_point:
            _fault_point("tmp")
        os.replace(tmp_name, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp_name, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _io_error(path, exc, "write") from None
        raise
    if fault_point:
        _fault_point("replace")


def remove(path: Path, *, fault_point: bool = False) -> None:
    try:
        Path(path).unlink(missing_ok=True)
    except OSError as exc:
        raise _io_error(Path(path), exc, "remove") from None
    if fault_point:
        _fault_point("replace")


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- folders -----------------------------------------------------------------------------------------------


def current_umask() -> int:
    """The process umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _short(name: str) -> str:
    """``name`` cut to leave room for the temporary suffixes within a file name's 255 bytes (a long name
    keeps its start and gets a digest of the whole, so it stays recognisable and distinct)."""
    if len(name.encode()) <= 120:
        return name
    return name.encode()[:80].decode(errors="ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _temp_dir_prefix(name: str) -> str:
    return f".{_short(name)}.tmp@"


def make_temp_dir(parent: Path, name: str) -> Path:
    """A new folder in ``parent`` that becomes ``parent/name`` once complete (renamed into place).

    Its name says which process made it (``.NAME.tmp@HOST@PID@XXXX``), so :func:`sweep_temp_dirs` can
    remove it if that process was killed. It gets the permissions an ordinary ``mkdir`` would give under
    the umask, not mkdtemp's 0700: a cache folder made by root in a Docker build must stay readable by
    the user the image runs as."""
    prefix = f"{_temp_dir_prefix(name)}{socket.gethostname()}@{os.getpid()}@"
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(folder, 0o777 & ~current_umask())
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def sweep_temp_dirs(parent: Path, name: str) -> list[Path]:
    """Remove the temporary folders for ``name`` in ``parent`` that a process of this host made and that
    is gone (killed mid-copy); a folder of a live process or of another host is left alone. An old
    folder such a process had set aside (:func:`replace_folder`) is put back if ``parent/name`` is
    missing, else removed."""
    removed = _sweep_old_dirs(parent, name)
    host = socket.gethostname()
    try:
        entries = list(Path(parent).glob(f"{glob_escape(_temp_dir_prefix(name))}*"))
    except OSError:
        return removed
    for entry in entries:
        if not _owner_gone(entry, _temp_dir_prefix(name), host):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _old_dir_prefix(name: str) -> str:
    return f".{_short(name)}.old@"


def _owner_gone(entry: Path, prefix: str, host: str) -> bool:
    owner, _, rest = entry.name[len(prefix) :].partition("@")
    pid, _, _ = rest.partition("@")
    return owner == host and pid.isdigit() and not _alive(int(pid)) and not entry.is_symlink()


def _sweep_old_dirs(parent: Path, name: str) -> list[Path]:
    """The old folders that :func:`replace_folder` set aside for a process that is gone: put back as
    ``parent/name`` when that is missing (killed between the two renames), else removed."""
    done = []
    host = socket.gethostname()
    prefix = _old_dir_prefix(name)
    try:
        entries = sorted(Path(parent).glob(f"{glob_escape(prefix)}*"))
    except OSError:
        return done
    dest = Path(parent) / name
    for entry in entries:
        if not _owner_gone(entry, prefix, host):
            continue
        if not dest.exists() and not dest.is_symlink():
            try:
                os.replace(entry, dest)
                done.append(entry)
                continue
            except OSError:
                pass
        shutil.rmtree(entry, ignore_errors=True)
        done.append(entry)
    return done


def _discard(path: Path) -> None:
    if path.is_symlink():
        path.unlink(missing_ok=True)  # a link that stood at the destination: its target is not ours
    else:
        shutil.rmtree(path, ignore_errors=True)


def replace_folder(new: Path, dest: Path) -> None:
    """Put the complete folder ``new`` (on the same filesystem, best a sibling from
    :func:`make_temp_dir`) at ``dest``. An existing ``dest`` is renamed aside
    (``.NAME.old@HOST@PID@XXXX``) first, ``new`` renamed into place, and only then the old one removed;
    if the second rename fails the old one is put back. A kill between the two renames leaves the old
    folder aside, and :func:`sweep_temp_dirs` puts it back. Raises the ``OSError`` of a failed rename
    (``new`` is left for the caller to remove)."""
    new, dest = Path(new), Path(dest)
    aside = None
    if dest.exists() or dest.is_symlink():
        suffix = os.urandom(4).hex()
        aside = dest.parent / f"{_old_dir_prefix(dest.name)}{socket.gethostname()}@{os.getpid()}@{suffix}"
        os.replace(dest, aside)
    try:
        os.replace(new, dest)
    except BaseException:
        if aside is not None:
            try:
                os.replace(aside, dest)
            except OSError:
                pass  # left aside under a name the next sweep recognises and puts back
        raise
    if aside is not None:
        _discard(aside)
    fsync_dir(dest.parent)


@contextlib.contextmanager
def building_folder(dest: Path) -> Iterator[Path]:
    """Yield a new empty folder beside ``dest`` (permissions from the umask) to build into; when the block
    ends normally it replaces ``dest`` (:func:`replace_folder`), when it raises it is removed and ``dest``
    is left as it was. Leftovers of a killed earlier run for ``dest`` are cleaned up first."""
    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep_temp_dirs(dest.parent, dest.name)
        tmp = make_temp_dir(dest.parent, dest.name)
    except OSError as exc:
        raise _io_error(dest.parent, exc, "create a folder in") from None
    try:
        yield tmp
        replace_folder(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


# -- signals ----------------------------------------------------------------------------------------------


class DeferredSignals:
    """Which of SIGINT / SIGTERM arrived while held back (see :func:`deferred_signals`)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    @property
    def pending(self) -> bool:
        return bool(self.received)

    @property
    def name(self) -> str:
        return signal.Signals(self.received[0]).name if self.received else ""


@contextlib.contextmanager
def deferred_signals() -> Iterator[DeferredSignals]:
    """Hold SIGINT and SIGTERM back for the block: they are recorded, not raised, so a file write is
    never cut short; the caller checks :attr:`DeferredSignals.pending` between files. Outside the main
    thread (where handlers cannot be set) signals are left as they are."""
    state = DeferredSignals()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = {}

    def hold(signum, _frame) -> None:
        state.received.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, hold)
    try:
        yield state
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
