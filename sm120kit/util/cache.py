"""Where sm120kit keeps what it downloads and builds (releases, work copies, overlays, compiler caches).

:func:`cache_dir` names the folder and refuses one that cannot be a folder (a regular file, a device, no
home folder to put it in); :func:`writable_dir` makes a folder inside it and checks that sm120kit may
write there. Both raise :class:`~sm120kit.errors.IOFailure` (exit 7) naming the path and what to do.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from sm120kit.errors import IOFailure
from sm120kit.util.regularfile import kind_of

ENV = "SM120KIT_CACHE_DIR"
_HINT = f"Set {ENV} to a folder you can write (it is created if missing)."


def _home() -> Path:
    home = os.environ.get("HOME")
    if home:
        return Path(home)
    try:
        import pwd

        entry = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        entry = ""
    if not entry:
        raise IOFailure(
            f"sm120kit has no cache folder: HOME is not set and user id {os.getuid()} has no home "
            f"folder, and neither {ENV} nor XDG_CACHE_HOME is set.",
            hint=_HINT,
        )
    return Path(entry)


def cache_dir() -> Path:
    """``$SM120KIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/sm120kit``, else ``~/.cache/sm120kit`` (absolute).

    :class:`IOFailure` when there is no home folder to put it in, or when something other than a folder
    (a regular file, ``/dev/null``) is at that path."""
    env = os.environ.get(ENV)
    if env:
        path = Path(env).expanduser()
        where = f"{ENV}={env}"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else _home() / ".cache"  # XDG: relative values are ignored
        path = base / "sm120kit"
        where = "the cache folder"
    path = path.absolute()
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise IOFailure(f"Cannot use {where} ({path}): {exc.strerror or exc}.", hint=_HINT) from None
    if not os.path.isdir(path):
        raise IOFailure(f"Cannot use {where}: {path} is {kind_of(mode)}, not a folder.", hint=_HINT)
    return path


def writable_dir(path: Path) -> Path:
    """Create ``path`` (a folder in the cache) with its parents if needed, and check that this user may
    write in it; :class:`IOFailure` naming the path otherwise. Returns ``path``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cache_error(path, exc) from None
    if not os.path.isdir(path):
        raise IOFailure(f"Cannot use the cache folder {path}: it is not a folder.", hint=_HINT)
    if not os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise cache_error(path, OSError(errno.EACCES, "not writable by this user (or on a read-only file system)"))
    return path


def cache_error(path: Path, exc: OSError) -> IOFailure:
    """The :class:`IOFailure` for an ``OSError`` on ``path`` in the cache (disk full said as such)."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return IOFailure(
        f"Cannot write the cache folder {path}: {exc.strerror or exc}.",
        hint=f"Free some disk space and run the command again (or set {ENV} to a folder on another disk)."
        if full
        else _HINT,
    )
