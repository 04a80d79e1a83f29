"""Where sm120kit keeps what it downloads and builds (releases, work copies, overlays, compiler caches)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SM120KIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/sm120kit``, else ``~/.cache/sm120kit``."""
    env = os.environ.get("SM120KIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sm120kit"
