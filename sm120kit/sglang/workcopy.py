"""Working copies of cached SGLang releases: ``<cache>/work/<release>/``, where ``apply --release`` patches.

The pristine unpacked release (:func:`sm120kit.sglang.releases.fetch_release`) is never written to; its working
copy is created from it on first use (copied to a temporary folder, then renamed into place, so a copy
is never half made) and can be recreated with ``fresh=True``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sm120kit.util.report import Step
from sm120kit.sglang import releases
from sm120kit.util.cache import cache_dir
from sm120kit.util.atomicfile import building_folder, current_umask, sweep_temp_dirs
from sm120kit.errors import IOFailure


def work_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "work" / releases.normalize(version)


def work_copy(version: str, *, fresh: bool = False, cache: Path | None = None,
              on_step: Step | None = None) -> Path:
    """The working copy of release ``version`` (downloaded and copied if needed); the folder holding
    ``sglang/``. Temporary copies a killed run left behind are removed first."""
    version = releases.normalize(version)
    dest = work_dir(version, cache)
    if dest.parent.is_dir():
        sweep_temp_dirs(dest.parent, version)
    if (dest / "sglang" / "__init__.py").is_file() and not fresh:
        return dest
    pristine = releases.fetch_release(version, cache=cache, on_step=on_step)
    try:
        with building_folder(dest) as tmp:
            shutil.copytree(pristine, tmp, dirs_exist_ok=True, symlinks=True)
            os.chmod(tmp, 0o777 & ~current_umask())  # copytree gave it the pristine folder's mode
    except OSError as exc:
        raise IOFailure(f"Cannot create the working copy {dest}: {exc.strerror or exc}.",
                        hint="Check that the cache folder is writable (SM120KIT_CACHE_DIR selects another).") \
            from None
    return dest
