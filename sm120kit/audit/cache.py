"""The compile-result cache of the shared-memory audit.

One JSON file per (case, architecture), named by a key over everything that decides what Triton
compiles: the source of the files that define the kernel and its block-size policy, the shape, the
Triton and torch versions, the target architecture, the probe's own source and any policy override. A
warm re-run of an unchanged tree therefore starts no interpreter at all. Triton's own kernel cache for
the probes lives beside it (``triton/``), as do the cubins NVRTC compiles for the patch's CUDA MLA kernels
(``nvrtc/``, the kernels' own ``SGLANG_SM120_MLA_CACHE_DIR``) and per-release dependency overlays
(``overlays/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sm120kit.util.cache import cache_dir


def default_root() -> Path:
    return cache_dir() / "triton-audit"


class AuditCache:
    def __init__(self, root: Path | None = None, *, enabled: bool = True) -> None:
        """``enabled=False``: nothing is read or kept, and Triton compiles into a throwaway folder."""
        self.enabled = enabled
        if enabled:
            self.root = root or default_root()
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="sm120kit-audit-")
            self.root = Path(self._tmp.name)

    @property
    def results_dir(self) -> Path:
        return self.root / "results"

    @property
    def triton_dir(self) -> Path:
        return self.root / "triton"

    @property
    def nvrtc_dir(self) -> Path:
        return self.root / "nvrtc"

    @property
    def overlays_dir(self) -> Path:
        return self.root / "overlays"

    def _path(self, key: str) -> Path:
        return self.results_dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if not self.enabled:
            return None
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, data: dict) -> None:
        if not self.enabled:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        """Forget every result and the compiled kernels, Triton's and NVRTC's (overlays are kept)."""
        for folder in (self.results_dir, self.triton_dir, self.nvrtc_dir):
            shutil.rmtree(folder, ignore_errors=True)


def digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, bytes):
            h.update(part)
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def files_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()
