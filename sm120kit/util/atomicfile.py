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
- ``SM120KIT_FAULT_SIGNAL``: the signal sent, ``KILL`` (default), ``INT`` or ``TERM``.

They let tests prove that an interrupted run leaves every file whole, leaves no temporary file behind
after the next run, and that Ctrl-C rolls back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from sm120kit.errors import IOFailure

_FAULT_ENVS = {"replace": "SM120KIT_FAULT_AFTER_WRITES", "tmp": "SM120KIT_FAULT_IN_WRITE"}
_counts = {"replace": 0, "tmp": 0}


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
    return IOFailure(f"Cannot {doing} {path}: {exc.strerror or exc}.",
                     hint="Free some disk space and run the command again." if full else
                     "Check that the tree is writable by you and the disk is not full.")


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_atomic(path: Path, data: bytes, mode: int | None, *, fsync: bool = False,
                 fault_point: bool = False, tmp: Path | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; keep ``mode`` (permission
    bits) when given. ``tmp``: the temporary file's path (journaled by the caller; replaced if a killed
    run left it), else a fresh random name. Raises :class:`IOFailure` naming the path."""
    path = Path(path)
    try:
        if tmp is None:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        else:
            tmp_name = str(tmp)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            try:
                fd = os.open(tmp_name, flags, 0o600)
            except FileExistsError:
                os.unlink(tmp_name)
                fd = os.open(tmp_name, flags, 0o600)
    except OSError as exc:
        raise _io_error(path, exc, "write") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        if fault_point:
            _fault_point("tmp")
        os.replace(tmp_name, path)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
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


def _temp_dir_prefix(name: str) -> str:
    return f".{name}.tmp@"


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
    is gone (killed mid-copy); a folder of a live process or of another host is left alone."""
    removed = []
    host = socket.gethostname()
    try:
        entries = list(Path(parent).glob(f"{glob_escape(_temp_dir_prefix(name))}*"))
    except OSError:
        return removed
    for entry in entries:
        owner, _, rest = entry.name[len(_temp_dir_prefix(name)):].partition("@")
        pid, _, _ = rest.partition("@")
        if owner != host or not pid.isdigit() or _alive(int(pid)) or entry.is_symlink():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


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
