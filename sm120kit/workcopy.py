"""Working copies of cached SGLang releases: ``<cache>/work/<release>/``, where ``apply --release`` patches.

The pristine unpacked release (:func:`sm120kit.releases.fetch_release`) is never written to; its working
copy is created from it on first use (copied to a temporary folder, then renamed into place, so a copy
is never half made) and can be recreated with ``fresh=True``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sm120kit import releases
from sm120kit.errors import IOFailure


def work_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or releases.cache_dir()) / "work" / version


def work_copy(version: str, *, fresh: bool = False, cache: Path | None = None, console=None) -> Path:
    """The working copy of release ``version`` (downloaded and copied if needed); the folder holding
    ``sglang/``."""
    releases.check_version(version)
    dest = work_dir(version, cache)
    if (dest / "sglang" / "__init__.py").is_file() and not fresh:
        return dest
    pristine = releases.fetch_release(version, cache=cache, console=console)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=dest.parent))
        try:
            shutil.copytree(pristine, tmp, dirs_exist_ok=True, symlinks=True)
            if dest.exists():
                old = dest.with_name(f".{version}-old-{os.getpid()}")
                os.replace(dest, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as exc:
        raise IOFailure(f"Cannot create the working copy {dest}: {exc.strerror or exc}.",
                        hint="Check that the cache folder is writable (SM120KIT_CACHE_DIR selects another).") \
            from None
    return dest
