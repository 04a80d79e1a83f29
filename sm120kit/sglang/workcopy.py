"""Working copies of cached SGLang releases: ``<cache>/work/<release>/``, where ``apply --release`` patches.

The pristine unpacked release (:func:`sm120kit.sglang.releases.fetch_release`) is never written to; its working
copy is created from it on first use (copied to a temporary folder, then renamed into place, so a copy
is never half made) and can be recreated with ``fresh=True``: the new copy is swapped in while the old
one's tree lock is held, so a run patching the old copy is waited for (and named when it does not end).
A copy that fails (a full disk) is removed and reported in one paragraph: how many files failed and why,
the first of them named.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from sm120kit.errors import IOFailure, StateDamagedError
from sm120kit.sglang import releases
from sm120kit.util.atomicfile import building_folder, current_umask, sweep_temp_dirs
from sm120kit.util.cache import cache_dir, writable_dir
from sm120kit.util.lock import TreeLock
from sm120kit.util.report import Step

STATE_DIR = ".sm120kit"  # sm120kit.patching.state's folder in the package (the tree lock lives there)


def work_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "work" / releases.normalize(version)


def work_copy(version: str, *, fresh: bool = False, cache: Path | None = None, on_step: Step | None = None) -> Path:
    """The working copy of release ``version`` (downloaded and copied if needed); the folder holding
    ``sglang/``. Temporary copies a killed run left behind are removed first."""
    version = releases.normalize(version)
    dest = work_dir(version, cache)
    if dest.parent.is_dir():
        sweep_temp_dirs(dest.parent, version)
    if (dest / "sglang" / "__init__.py").is_file() and not fresh:
        return dest
    pristine = releases.fetch_release(version, cache=cache, on_step=on_step)
    writable_dir(dest.parent)
    with _tree_locked(dest, "apply --fresh"):
        try:
            with building_folder(dest) as tmp:
                shutil.copytree(pristine, tmp, dirs_exist_ok=True, symlinks=True)
                os.chmod(tmp, 0o777 & ~current_umask())  # copytree gave it the pristine folder's mode
        except OSError as exc:
            raise _copy_error(dest, pristine, exc) from None
    return dest


@contextlib.contextmanager
def _tree_locked(dest: Path, command: str) -> Iterator[None]:
    """Hold the tree lock of the working copy at ``dest`` (if there is one) while it is replaced; the lock
    folder is removed again if this call made it and the copy was not replaced."""
    package = dest / "sglang"
    if not (package / "__init__.py").is_file():
        yield
        return
    folder = package / STATE_DIR
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise StateDamagedError(
            f"{folder} is not a folder sm120kit made (a link or a file); the working copy "
            f"{dest} is not replaced through it. Nothing was changed.",
            hint=f"Look at {folder}, remove it, and run the command again.",
        )
    made = not folder.exists()
    try:
        with TreeLock(folder / "lock", command=command, prepare=lambda: folder.mkdir(parents=True, exist_ok=True)):
            yield
    finally:
        if made and folder.is_dir() and not folder.is_symlink() and os.listdir(folder) == ["lock"]:
            shutil.rmtree(folder, ignore_errors=True)


def _copy_error(dest: Path, pristine: Path, exc: OSError) -> IOFailure:
    """One paragraph for a failed copy: ``shutil.Error`` lists every file that failed (thousands on a full
    disk), so the count, the reason and the first file are given instead."""
    failures = exc.args[0] if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) else []
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT) or any(
        "[Errno 28]" in str(f) or "[Errno 122]" in str(f) for f in failures
    )
    if failures:
        first = failures[0]
        why = str(first[2]) if isinstance(first, (tuple, list)) and len(first) == 3 else str(first)
        where = first[0] if isinstance(first, (tuple, list)) and first else "?"
        reason = "No space left on device" if full else why
        detail = f"{len(failures)} file(s) of {pristine} could not be copied ({reason}); the first: {where}"
    else:
        detail = exc.strerror or str(exc)
    return IOFailure(
        f"Cannot create the working copy {dest}: {detail[:2000]}. The partial copy was removed.",
        hint="Free some disk space and run the command again (SM120KIT_CACHE_DIR selects another folder)."
        if full
        else "Check that the cache folder is writable (SM120KIT_CACHE_DIR selects another).",
    )
