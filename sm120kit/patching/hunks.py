"""Hunks: the parsed form of a unified diff and the placing of its hunks in a file's lines.

A diff is parsed by :mod:`unidiff` (see :func:`file_diffs`); this module turns each parsed file into a
:class:`FileDiff` of :class:`HunkSpec` and places hunks in memory. Placing is exact by default: a hunk's
lines must match the file exactly, at the line the diff names or at an offset (searched nearest first).
``fuzz=N`` lets up to N lines of leading and trailing context be ignored, as GNU patch's fuzz factor does.
A hunk that cannot be placed is described by the closest place it nearly matches.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import unidiff

from sm120kit.patching import treepath
from sm120kit.patching.status import HunkStatus

CONTEXT, ADDED, REMOVED = " ", "+", "-"

_LINE_RE = re.compile(r"[^\n]*\n|[^\n]+")


def split_lines(text: str) -> list[str]:
    """Lines of ``text``, each keeping its ``\\n``; only ``\\n`` ends a line (not form feeds or ``\\r``)."""
    return _LINE_RE.findall(text)


def decode(data: bytes) -> str:
    """File bytes to text; undecodable bytes survive the round trip through :func:`encode`."""
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class HunkSpec:
    """One hunk of a file diff. ``lines`` holds ``(kind, text)`` with kind in ``' ', '+', '-'``; ``text``
    keeps its line ending, which is absent where the diff says ``\\ No newline at end of file``."""

    index: int  # 1-based within its file
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    section: str
    lines: tuple[tuple[str, str], ...]
    diff_line: int  # line of the ``@@`` header in the diff file

    @property
    def source(self) -> tuple[str, ...]:
        return tuple(text for kind, text in self.lines if kind != ADDED)

    @property
    def target(self) -> tuple[str, ...]:
        return tuple(text for kind, text in self.lines if kind != REMOVED)

    def context_edges(self) -> tuple[int, int]:
        """Number of context lines before the first and after the last change."""
        lead = 0
        for kind, _ in self.lines:
            if kind != CONTEXT:
                break
            lead += 1
        trail = 0
        for kind, _ in reversed(self.lines):
            if kind != CONTEXT:
                break
            trail += 1
        if lead == len(self.lines):  # context only (not produced by diff tools)
            trail = 0
        return lead, trail


@dataclass(frozen=True)
class FileDiff:
    """The hunks for one file. ``path`` is relative to the package root's parent (``sglang/...``)."""

    path: str
    action: str  # "modify" | "create" | "delete"
    hunks: tuple[HunkSpec, ...]
    mode: int | None  # file mode for a created file, from a git header (else None)
    diff_line: int

    @property
    def source_text(self) -> str:
        """Whole content before, for a deleted file."""
        return "".join("".join(h.source) for h in self.hunks)

    @property
    def target_text(self) -> str:
        """Whole content after, for a created file."""
        return "".join("".join(h.target) for h in self.hunks)


class DiffFormatError(ValueError):
    """A diff that unidiff parsed but that the patch manager cannot use; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


# Git writes a path holding unusual bytes in C style: "a/caf\303\251.py", "a/tab\there.py".
_C_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}
_OCTAL_RE = re.compile(r"[0-3][0-7]{2}")
# Regular-file modes git writes; anything else (setuid, symlink 120000, gitlink 160000) is refused.
REGULAR_MODES = {"100644": 0o644, "100755": 0o755}


def unquote_path(name: str) -> str:
    """A diff path as git quotes it (``"a/x\\ty.py"``) to its text; an unquoted name is returned as is.
    :class:`ValueError` for a malformed quoted name."""
    if not name.startswith('"'):
        return name
    if len(name) < 2 or not name.endswith('"'):
        raise ValueError(f"the quoted path {name} has no closing quote")
    body, out, i = name[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char == '"':
            raise ValueError(f"the quoted path {name} holds an unescaped quote")
        if char != "\\":
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _C_ESCAPES:
            out.append(_C_ESCAPES[code])
            i += 2
        elif _OCTAL_RE.fullmatch(body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            raise ValueError(f"the quoted path {name} holds an unknown escape '\\{code}'")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the quoted path {name} is not UTF-8") from None


def _strip_prefix(name: str) -> str:
    name = unquote_path(name)
    if name[:2] in ("a/", "b/"):
        return name[2:]
    return name


def _mode_line(patched: unidiff.PatchedFile, line: int | None, value: str) -> int | None:
    """Line of the diff that carries the mode ``value`` (for the error message)."""
    if line is None:
        return None
    for i, text in enumerate(patched.patch_info):
        if value in text and "mode" in text:
            return line + i
    return line


def file_diffs(patch_set: unidiff.PatchSet) -> tuple[FileDiff, ...]:
    """Convert a parsed diff to :class:`FileDiff` objects; :class:`DiffFormatError` for what is unusable."""
    out: list[FileDiff] = []
    seen: set[str] = set()
    for patched in patch_set:
        line = getattr(patched, "diff_line_no", None)
        if patched.is_binary_file:
            raise DiffFormatError(f"binary diff for {patched.path} is not supported", line)
        if patched.is_rename:
            raise DiffFormatError(
                f"renames are not supported ({patched.source_file} -> {patched.target_file}); "
                "write a deletion and a creation instead",
                line,
            )
        source = patched.source_file or ""
        target = patched.target_file or ""
        try:
            if patched.is_added_file and source == "/dev/null":
                action, path = "create", _strip_prefix(target)
            elif target == "/dev/null":
                action, path = "delete", _strip_prefix(source)
            else:
                action, path = "modify", _strip_prefix(target)
        except ValueError as exc:
            raise DiffFormatError(str(exc), line) from None
        why = treepath.problem(path)
        if why:
            raise DiffFormatError(
                f"path {path!r} {why}, so it is not inside the package: diff paths must look like "
                "a/sglang/... and b/sglang/... (relative to the folder that holds sglang/), outside "
                "sglang/.sm120kit/",
                line,
            )
        if path in seen:
            raise DiffFormatError(f"{path} appears twice in one diff; merge its hunks into one file section", line)
        seen.add(path)
        if not len(patched):
            raise DiffFormatError(f"{path} has no hunks (mode-only changes are not supported)", line)
        hunks = tuple(_hunk(h, i) for i, h in enumerate(patched, 1))
        for value in (patched.source_mode, patched.target_mode):
            if value and value not in REGULAR_MODES:
                raise DiffFormatError(
                    f"{path} has mode {value}; only regular files (100644 or 100755) are supported",
                    _mode_line(patched, line, value),
                )
        if (
            action == "modify"
            and patched.source_mode
            and patched.target_mode
            and patched.source_mode != patched.target_mode
        ):
            raise DiffFormatError(
                f"{path} changes mode {patched.source_mode} -> {patched.target_mode}; mode changes are not supported",
                _mode_line(patched, line, patched.target_mode),
            )
        mode = None
        if action == "create" and patched.target_mode:
            mode = REGULAR_MODES[patched.target_mode]
        out.append(FileDiff(path=path, action=action, hunks=hunks, mode=mode, diff_line=line or 0))
    return tuple(out)


def _hunk(hunk: unidiff.Hunk, index: int) -> HunkSpec:
    lines: list[list[str]] = []
    first_line = None
    for line in hunk:
        if first_line is None and getattr(line, "diff_line_no", None):
            first_line = line.diff_line_no
        if line.line_type == "\\":
            if lines:
                lines[-1][1] = lines[-1][1].removesuffix("\n").removesuffix("\r")
            continue
        if line.line_type not in (CONTEXT, ADDED, REMOVED):
            continue  # a trailing empty line unidiff attaches after the hunk
        lines.append([line.line_type, line.value])
    header_line = (first_line - 1) if first_line else 0
    return HunkSpec(
        index=index,
        source_start=hunk.source_start,
        source_length=hunk.source_length,
        target_start=hunk.target_start,
        target_length=hunk.target_length,
        section=(hunk.section_header or "").strip(),
        lines=tuple((k, t) for k, t in lines),
        diff_line=header_line,
    )


# -- placing hunks -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HunkResult:
    """Where one hunk went, or why it did not.

    ``status``: ``applies`` (placed), ``already-applied`` (its result is already there), ``conflict``.
    ``offset``: lines between where the diff said and where it was placed. ``expected``/``found``: for a
    conflict, the lines the hunk needs and the lines at ``closest_line`` (1-based), the nearest near-match.
    """

    file: str
    index: int
    status: HunkStatus
    offset: int = 0
    fuzz: int = 0
    expected: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    closest_line: int | None = None
    line: int | None = None  # 1-based line where it was placed (or expected, for a conflict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", HunkStatus(self.status))

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "index": self.index,
            "status": str(self.status),
            "offset": self.offset,
            "fuzz": self.fuzz,
            "line": self.line,
            "closest_line": self.closest_line,
            "expected": list(self.expected),
            "found": list(self.found),
        }


@dataclass(frozen=True)
class _Placement:
    start: int  # index in the file of the first matched line
    length: int  # number of file lines replaced
    replacement: tuple[str, ...]
    offset: int
    fuzz: int


def _expected_index(start: int, length: int) -> int:
    # "@@ -5,0 ..." inserts after line 5; "@@ -5,3 ..." starts at line 5.
    return start if length == 0 else max(start - 1, 0)


def _matches_at(lines: Sequence[str], needle: Sequence[str], pos: int) -> bool:
    n = len(needle)
    if pos < 0 or pos + n > len(lines):
        return False
    if n and lines[pos] != needle[0]:
        return False
    for i in range(1, n):
        if lines[pos + i] != needle[i]:
            return False
    return True


def _search(lines: Sequence[str], needle: Sequence[str], expected: int, lo: int) -> int | None:
    """The position nearest ``expected`` (not before ``lo``) where ``needle`` matches exactly."""
    hi = len(lines) - len(needle)
    if hi < lo:
        return None
    if not needle:
        return min(max(expected, lo), len(lines))
    expected = min(max(expected, lo), hi)
    if _matches_at(lines, needle, expected):
        return expected
    first = needle[0]
    for step in range(1, max(expected - lo, hi - expected) + 1):
        for pos in (expected - step, expected + step):
            if lo <= pos <= hi and lines[pos] == first and _matches_at(lines, needle, pos):
                return pos
    return None


def _place(lines: Sequence[str], hunk: HunkSpec, *, reverse: bool, lo: int, carry: int, fuzz: int) -> _Placement | None:
    kinds = [k for k, _ in hunk.lines]
    texts = [t for _, t in hunk.lines]
    drop, keep = (REMOVED, ADDED) if not reverse else (ADDED, REMOVED)
    start = hunk.target_start if reverse else hunk.source_start
    length = hunk.target_length if reverse else hunk.source_length
    base = _expected_index(start, length)
    lead, trail = hunk.context_edges()
    tried: set[tuple[int, int]] = set()
    for level in range(0, fuzz + 1):
        top, bottom = min(level, lead), min(level, trail)
        if (top, bottom) in tried:
            continue
        tried.add((top, bottom))
        sel = range(top, len(kinds) - bottom)
        needle = [texts[i] for i in sel if kinds[i] != keep]
        replacement = tuple(texts[i] for i in sel if kinds[i] != drop)
        if not needle and (top or bottom):
            continue  # nothing left to anchor on
        pos = _search(lines, needle, base + top + carry, lo)
        if pos is not None:
            return _Placement(
                start=pos, length=len(needle), replacement=replacement, offset=pos - (base + top), fuzz=max(top, bottom)
            )
    return None


def _closest(lines: Sequence[str], needle: Sequence[str], expected: int) -> tuple[int | None, float]:
    """Start index where most of ``needle`` matches (exact lines count 1, whitespace-only differences
    0.5), nearest ``expected`` on ties; ``None`` when no line matches at all."""
    if not needle or not lines:
        return None, 0.0
    stripped = [line.strip() for line in needle]
    file_stripped = [line.strip() for line in lines]
    best, best_score, best_dist = None, 0.0, 0
    n = len(needle)
    for pos in range(-n + 1, len(lines)):
        score = 0.0
        for i in range(n):
            j = pos + i
            if 0 <= j < len(lines):
                if lines[j] == needle[i]:
                    score += 1.0
                elif stripped[i] and file_stripped[j] == stripped[i]:
                    score += 0.5
        if score <= 0:
            continue
        dist = abs(pos - expected)
        if score > best_score or (score == best_score and dist < best_dist):
            best, best_score, best_dist = pos, score, dist
    if best is not None and best < 0:
        best = 0
    return best, best_score


def _show(lines: Sequence[str]) -> list[str]:
    return [line.rstrip("\r\n") for line in lines]


@dataclass(frozen=True)
class FilePlacement:
    """The outcome of placing every hunk of one file diff: ``ok`` and the new lines, or the failures."""

    ok: bool
    lines: tuple[str, ...]
    results: tuple[HunkResult, ...]


def place_hunks(
    lines: Sequence[str], diff: FileDiff, *, fuzz: int = 0, reverse: bool = False, describe_failures: bool = True
) -> FilePlacement:
    """Place every hunk of ``diff`` in ``lines`` (hunks in order, never overlapping) and splice them in.

    With ``reverse`` the diff is undone: the hunk's result is searched and replaced by its source.
    """
    placements: list[_Placement] = []
    results: list[HunkResult] = []
    lo = 0
    carry = 0
    ok = True
    for hunk in diff.hunks:
        placed = _place(lines, hunk, reverse=reverse, lo=lo, carry=carry, fuzz=fuzz)
        if placed is None:
            ok = False
            if not describe_failures:
                results.append(HunkResult(file=diff.path, index=hunk.index, status=HunkStatus.CONFLICT))
                continue
            needle = hunk.target if reverse else hunk.source
            start = hunk.target_start if reverse else hunk.source_start
            length = hunk.target_length if reverse else hunk.source_length
            expected = _expected_index(start, length) + carry
            closest, _ = _closest(lines, needle, expected)
            found = (
                list(lines[closest : closest + len(needle)])
                if closest is not None
                else list(lines[max(expected, 0) : max(expected, 0) + len(needle)])
            )
            results.append(
                HunkResult(
                    file=diff.path,
                    index=hunk.index,
                    status=HunkStatus.CONFLICT,
                    expected=_show(needle),
                    found=_show(found),
                    closest_line=None if closest is None else closest + 1,
                    line=expected + 1,
                )
            )
            continue
        placements.append(placed)
        results.append(
            HunkResult(
                file=diff.path,
                index=hunk.index,
                status=HunkStatus.APPLIES,
                offset=placed.offset,
                fuzz=placed.fuzz,
                line=placed.start + 1,
            )
        )
        lo = placed.start + placed.length
        carry = placed.offset
    if not ok:
        return FilePlacement(ok=False, lines=tuple(lines), results=tuple(results))
    new: list[str] = []
    cursor = 0
    for p in placements:
        new.extend(lines[cursor : p.start])
        new.extend(p.replacement)
        cursor = p.start + p.length
    new.extend(lines[cursor:])
    return FilePlacement(ok=True, lines=tuple(new), results=tuple(results))
