"""Which backend roles an SGLang tree runs on compute capability 12.x, read from the code the tree ships.

Upstream adds 12.x paths to a backend between releases, and SGLang main carries them before any release
does, so these facts are read from the tree rather than inferred from its release label. Each fact names the
file and the patterns that all have to be there; the gate module of the ``sm120-backend-gating`` patch
(``sglang/srt/sm12x_backend_gate.py``) reads the same patterns at run time, and
``tests/upstream/test_upstream_main.py`` checks that both readers agree on every release and on a main tree.

- ``trtllm_mha`` decode: ``srt/layers/attention/trtllm_mha_backend.py`` sets ``is_xqa_impl`` from a check
  that names SM120 (the XQA decode path; from 0.5.10).
- ``trtllm_mha`` prefill: the same file sets ``use_fmha_v2`` from a check that names SM120 and calls
  FlashInfer's ``trtllm_fmha_v2_prefill`` (sglang PR #23112, upstream commit 5d12280ae7 of 2026-08-18 on
  main after the 0.5.18 branch; first released in 0.5.19).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

TRTLLM_MHA_BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
_READ_LIMIT = 4 << 20  # bytes; SGLang's largest backend file is about 100 KB


@dataclass(frozen=True)
class Sm12xPath:
    backend: str
    role: str  # "prefill" | "decode"
    file: str  # relative to the folder that holds sglang/
    patterns: tuple[str, ...]  # every one must match (bounded: no nested repetition)
    what: str  # the patterns in words
    source: str  # where the fact comes from

    def describe(self) -> str:
        return f"{self.file} {self.what}"


PATHS: tuple[Sm12xPath, ...] = (
    Sm12xPath(
        "trtllm_mha",
        "prefill",
        TRTLLM_MHA_BACKEND,
        (r"use_fmha_v2\s*=[^\n]*sm120", r"trtllm_fmha_v2_prefill\("),
        "sets use_fmha_v2 from a check naming SM120 and calls trtllm_fmha_v2_prefill",
        "sglang PR #23112, upstream commit 5d12280ae7; released in 0.5.19",
    ),
    Sm12xPath(
        "trtllm_mha",
        "decode",
        TRTLLM_MHA_BACKEND,
        (r"is_xqa_impl\s*=[^\n]*sm120",),
        "sets is_xqa_impl (the XQA decode path) from a check naming SM120",
        "released in 0.5.10",
    ),
)


def _read_regular(path: Path) -> str | None:
    """The text of a regular file inside the tree (never through a symlink, never a FIFO), or ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(_READ_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def runs_on_12x(root: Path) -> dict[tuple[str, str], bool]:
    """``{(backend, role): whether the tree at root (the folder holding sglang/) has the 12.x path}``; a
    missing backend file means no path."""
    texts: dict[str, str] = {}
    found = {}
    for path in PATHS:
        if path.file not in texts:
            texts[path.file] = _read_regular(Path(root) / path.file) or ""
        found[(path.backend, path.role)] = all(re.search(p, texts[path.file]) for p in path.patterns)
    return found


def path_for(backend: str, role: str) -> Sm12xPath:
    return next(p for p in PATHS if (p.backend, p.role) == (backend, role))
