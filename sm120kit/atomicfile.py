"""Atomic file writes: a temporary file in the same folder, flushed, then ``os.replace`` over the target.

A reader (or a process killed half way) sees the whole old file or the whole new one, never a mix.

``SM120KIT_FAULT_AFTER_WRITES=N`` is a test hook: the process kills itself with SIGKILL right after its
N-th replace of a file in a patched tree, so tests can prove that an interrupted run leaves every file
whole and that the next run repairs the tree.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from sm120kit.errors import IOFailure

_FAULT_ENV = "SM120KIT_FAULT_AFTER_WRITES"
_replaced = 0


def _fault_point() -> None:
    global _replaced
    limit = os.environ.get(_FAULT_ENV)
    if not limit:
        return
    _replaced += 1
    if _replaced >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


def _io_error(path: Path, exc: OSError, doing: str) -> IOFailure:
    return IOFailure(f"Cannot {doing} {path}: {exc.strerror or exc}.",
                     hint="Check that the tree is writable by you and the disk is not full; nothing "
                          "after this file was changed.")


def write_atomic(path: Path, data: bytes, mode: int | None, *, fsync: bool = False,
                 fault_point: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; keep ``mode`` (permission
    bits) when given. Raises :class:`IOFailure` naming the path."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _io_error(path, exc, "write") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _io_error(path, exc, "write") from None
    if fault_point:
        _fault_point()


def remove(path: Path, *, fault_point: bool = False) -> None:
    try:
        Path(path).unlink(missing_ok=True)
    except OSError as exc:
        raise _io_error(Path(path), exc, "remove") from None
    if fault_point:
        _fault_point()


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
