"""Finding the file a patched file became in a new SGLang: content similarity over the package's files.

Used by the upgrade check (a file a patch changes is gone from its path) and by refresh (the new variant
is made against the file where it went).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MOVE_SIMILARITY = 0.6
"""A file counts as moved to the candidate whose content is at least this similar to the file at the
variant's base (``difflib.SequenceMatcher.ratio`` over lines; with only the hunks' lines to go by, the
share of those lines found in the candidate). Candidates with the same file name are tried first. Measured
on the real moves between SGLang releases (docs/upstream.md): 0.92 to 1.0 from one release to the next.
Files that merely share a name scored at least 0.6 in 12 of 3223 pairs in SGLang 0.5.23 (near-copies),
and a file rewritten over many releases falls below it (the extend-attention kernel, 0.5.2 to 0.5.23:
0.30); such a file is reported gone with its nearest candidate named."""


# -- moved files -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MovedFile:
    """Where a file a patch changes went: ``new`` is ``None`` when nothing is similar enough (gone)."""

    old: str
    new: str | None
    similarity: float
    compared: str  # "file" (whole base file) | "hunks" (only the lines the hunks carry)
    nearest: str | None = None  # the best candidate below the threshold

    def describe(self) -> str:
        if self.new:
            return f"{self.old} moved to {self.new} (similarity {self.similarity:.2f})"
        near = f"; nearest {self.nearest} at {self.similarity:.2f}" if self.nearest else ""
        return f"{self.old} is gone (no file similar enough{near})"

    def to_json(self) -> dict:
        return {
            "old": self.old,
            "new": self.new,
            "similarity": round(self.similarity, 4),
            "compared": self.compared,
            "nearest": self.nearest,
        }


def _score(
    reference: Sequence[str] | None, fragment: set[str], candidate: Path, floor: float, exact: bool = False
) -> float:
    """Similarity of ``candidate``; below ``floor`` it may be an upper bound (difflib's quick ratios),
    unless ``exact``."""
    try:
        text = candidate.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0.0
    lines = text.splitlines()
    if reference is not None:
        matcher = difflib.SequenceMatcher(None, reference, lines, autojunk=False)
        if not exact:
            bound = matcher.real_quick_ratio()
            if bound >= floor:
                bound = matcher.quick_ratio()
            if bound < floor:
                return bound
        return matcher.ratio()
    if not fragment:
        return 0.0
    present = {line.strip() for line in lines}
    return len(fragment & present) / len(fragment)


def find_moved(root: Path, old: str, reference: str | None, fragment: Sequence[str] = ()) -> MovedFile:
    """Search ``root/sglang`` for the file ``old`` became, compared with ``reference`` (the file at the
    base) or, lacking it, the hunk lines: files with the same name first, then every file with the same
    suffix; the first group with a file at least :data:`MOVE_SIMILARITY` similar gives the answer. Else
    the file is gone, and the nearest candidate (the same-name file or the best of the others) is named."""
    package = root / "sglang"
    old_name = PurePosixPath(old).name
    suffix = PurePosixPath(old).suffix or ".py"
    ref_lines = reference.splitlines() if reference is not None else None
    frag = {line.strip() for line in fragment if line.strip()}
    files = [p for p in package.rglob(f"*{suffix}") if p.is_file() and ".sm120kit" not in p.parts]
    compared = "file" if reference is not None else "hunks"
    near: list[tuple[float, Path]] = []
    for group in ([p for p in files if p.name == old_name], [p for p in files if p.name != old_name]):
        scored = sorted(
            ((_score(ref_lines, frag, p, MOVE_SIMILARITY), p) for p in sorted(group)), key=lambda sp: -sp[0]
        )
        if scored and scored[0][0] >= MOVE_SIMILARITY:
            best, path = scored[0]
            return MovedFile(old=old, new=path.relative_to(root).as_posix(), similarity=best, compared=compared)
        near += scored[:5]
    exact = [(_score(ref_lines, frag, p, 1.0, exact=True), p) for _, p in near]
    if not exact:
        return MovedFile(old=old, new=None, similarity=0.0, compared=compared)
    best, path = max(exact, key=lambda sp: sp[0])
    return MovedFile(old=old, new=None, similarity=best, compared=compared, nearest=path.relative_to(root).as_posix())
