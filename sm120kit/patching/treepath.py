"""Paths inside an SGLang tree that sm120kit may write: the one rule for diffs, the state record and the
journal.

A path is relative to the folder that holds ``sglang/`` and is written ``sglang/...`` with ``/``. It is
accepted only when it is plain text (no control characters), relative, free of empty, ``.`` and ``..``
components, and outside sm120kit's own state folder ``sglang/.sm120kit/``. On disk, the folder it lies in
must resolve inside the package (a symbolic link out of the tree is never followed) and the file itself
must not be a symbolic link (a link is never patched, nor replaced by a regular file).

Modes read back from disk are plain permission bits: no setuid, setgid or sticky bit.

At write time :func:`open_folder` opens the folder a file is written in one part at a time, never
following a link below ``sglang/``: a folder swapped for a link after the plan was made is found then,
and nothing is written through it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

STATE_DIR = ".sm120kit"
PLAIN_MODE_BITS = 0o777


def problem(path: object) -> str | None:
    """Why ``path`` is not a usable tree path (one clause), or ``None`` when it is."""
    if not isinstance(path, str):
        return f"is not a string but {type(path).__name__}"
    if not path:
        return "is empty"
    bad = next((c for c in path if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        return f"holds the control character {bad!r}"
    try:
        os.fsencode(path)
    except UnicodeError:
        return "holds a character that cannot be a file name here (a lone surrogate or invalid text)"
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if parts[0] != "sglang" or len(parts) < 2:
        return "does not start with 'sglang/'"
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' component"
    if parts[1] == STATE_DIR:
        return f"lies in sm120kit's own state folder sglang/{STATE_DIR}/"
    return None


def on_disk_problem(root: Path, path: str) -> str | None:
    """Why writing ``root/path`` would leave the tree or replace something that is not a regular file
    (one clause), or ``None``. ``path`` must already pass :func:`problem`."""
    root = Path(root)
    base = (root / "sglang").resolve()
    full = root / path
    parent = full.parent.resolve()
    if parent != base and base not in parent.parents:
        return f"lies behind a symbolic link that leads out of the tree (to {parent})"
    try:
        info = os.lstat(full)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "has a regular file where one of its folders should be"
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link (sm120kit patches regular files only and never replaces a link)"
    if stat.S_ISDIR(info.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    return None


def mode_problem(mode: object) -> str | None:
    """Why ``mode`` is not plain permission bits (one clause), or ``None``."""
    if isinstance(mode, bool) or not isinstance(mode, int):
        return f"is not a number but {type(mode).__name__}"
    if mode < 0 or mode & ~PLAIN_MODE_BITS:
        return f"{oct(mode)} is not plain permission bits (no setuid, setgid or sticky bit; at most 0o777)"
    return None


class LinkInTheWay(OSError):
    """A folder on the way to a file is a symbolic link (or not a folder) at write time."""


def open_folder(root: Path, folder: str, *, create: bool = False) -> tuple[int, list[str]]:
    """An open descriptor of ``root/folder`` (``folder`` is ``sglang`` or below it, as :func:`problem`
    accepts), reached one part at a time with ``O_NOFOLLOW`` below ``sglang/``: :class:`LinkInTheWay` when
    a part is a link or not a folder. ``create`` makes missing folders; the second value lists the ones
    it made (relative paths). ``FileNotFoundError`` when one is missing and ``create`` is false."""
    parts = folder.split("/")
    made: list[str] = []
    fd = os.open(Path(root) / parts[0], os.O_RDONLY | os.O_DIRECTORY)  # sglang/ itself, as planned
    try:
        for i, part in enumerate(parts[1:], 2):
            try:
                new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                    made.append("/".join(parts[:i]))
                except FileExistsError:
                    pass
                new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkInTheWay(exc.errno, "is a symbolic link or not a folder", "/".join(parts[:i])) from None
                raise
            os.close(fd)
            fd = new
    except BaseException:
        os.close(fd)
        raise
    return fd, made
