"""Paths inside an SGLang tree that sm120kit may write: the one rule for diffs, the state record and the
journal.

A path is relative to the folder that holds ``sglang/`` and is written ``sglang/...`` with ``/``. It is
accepted only when it is plain text (no control characters), relative, free of empty, ``.`` and ``..``
components, and outside sm120kit's own state folder ``sglang/.sm120kit/``. On disk, the folder it lies in
must resolve inside the package (a symbolic link out of the tree is never followed) and the file itself
must not be a symbolic link (a link is never patched, nor replaced by a regular file).

Modes read back from disk are plain permission bits: no setuid, setgid or sticky bit.
"""

from __future__ import annotations

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
