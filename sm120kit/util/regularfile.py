"""Reading files sm120kit did not write: regular files only, opened without blocking.

A FIFO, socket or device where sm120kit expects a file (``version.py``, a patched file, the state record,
a cached wheel) would make a plain ``open`` wait forever for a writer, or read without end. Every reader
here opens with ``O_NONBLOCK`` (so a FIFO opens at once), checks the opened file with ``fstat`` (so a
file swapped after a check is still caught) and refuses anything that is not a regular file with
:class:`NotRegularFile`, an ``OSError`` whose ``strerror`` says what the file is. ``follow=False`` also
refuses a symbolic link as the last part of the path (``O_NOFOLLOW``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file (the message says what)."""


def kind_of(mode: int) -> str:
    """``"a FIFO (named pipe)"``, ``"a folder"`` ... for a ``st_mode``; ``"a regular file"`` for one."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike, *, follow: bool = True, dir_fd: int | None = None) -> int:
    """A read-only descriptor of the regular file at ``path``; :class:`NotRegularFile` for anything else,
    ``OSError`` as ``open`` raises it otherwise (``ELOOP`` for a final link when ``follow`` is false)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except IsADirectoryError:
        raise NotRegularFile(errno.EISDIR, "is a folder, not a regular file", str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"is {kind_of(mode)}, not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike, *, follow: bool = True, limit: int | None = None) -> bytes:
    """The content of the regular file at ``path`` (at most ``limit`` bytes when given)."""
    fd = open_regular(path, follow=follow)
    with os.fdopen(fd, "rb") as handle:
        return handle.read() if limit is None else handle.read(limit)


def read_text(
    path: str | os.PathLike,
    *,
    encoding: str = "utf-8",
    errors: str = "strict",
    follow: bool = True,
    limit: int | None = None,
) -> str:
    return read_bytes(path, follow=follow, limit=limit).decode(encoding, errors)


def is_regular(path: str | os.PathLike, *, follow: bool = True) -> bool:
    """Whether ``path`` is a regular file (following a final link when ``follow``), without opening it."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode)


def describe(path: Path) -> str:
    """What is at ``path`` (``"a FIFO (named pipe)"``), for a message; ``"nothing"`` when absent."""
    try:
        return kind_of(os.lstat(path).st_mode)
    except OSError:
        return "nothing"
