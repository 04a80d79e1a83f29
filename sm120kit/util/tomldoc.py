"""Strict TOML documents whose errors name ``file:line``.

:mod:`tomllib` gives the values of a document but keeps no positions. :class:`Lines` scans the text once
and records the line of every table header and key, so a check on a value can point at where it was
written. :func:`read` parses a file into a :class:`Doc`; ``doc.fail(path, message)`` builds the error class
the caller chose (``SeriesError`` for a patch series, ``RecipeError`` for a recipe), and :func:`check_keys`
rejects unknown keys (with a did-you-mean suggestion), values of the wrong type and missing keys. Each
family of documents keeps its own phrasing through a :class:`Wording`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit.errors import Sm120kitError
from sm120kit.util import regularfile
from sm120kit.util.suggest import did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KeyPath = tuple[str | int, ...]  # ("variants", 1, "diff"): an entry of an array of tables is its index


# -- where each key was written --------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


class Lines:
    """Where each table and key of a TOML document was written: ``line_of(("variants", 1, "diff"))``.

    Understands table headers, arrays of tables (``[[variants]]``: each entry is addressed by its index,
    and ``[variants.sub]`` by the entry it belongs to), dotted and quoted keys, single- and multi-line
    strings, arrays that span lines, and ``#``, ``=`` or brackets inside strings. Lines are numbered from 1,
    as :meth:`str.splitlines` splits them.
    """

    def __init__(self, text: str) -> None:
        self.where: dict[KeyPath, int] = {}
        self._entries: dict[KeyPath, int] = {}  # entries so far of each array of tables
        table: KeyPath = ()
        closing: str | None = None  # the delimiter that ends the multi-line string being read
        depth = 0  # brackets still open in a value that spans lines
        for number, line in enumerate(text.splitlines(), 1):
            pos = 0
            if closing is not None:
                pos = _multiline_end(line, 0, closing)
                if pos < 0:
                    continue
                closing = None
            elif depth == 0:
                pos = len(line) - len(line.lstrip())
                if pos == len(line) or line[pos] == "#":
                    continue
                if line[pos] == "[":
                    header = _header(line, pos)
                    if header is not None:
                        table = self._open(header[0], header[1], number)
                    continue
                key = _dotted_key(line, pos)
                if key is None or key[1] >= len(line) or line[key[1]] != "=":
                    continue
                self.where.setdefault(table + key[0], number)
                pos = key[1] + 1
            closing, depth = _scan_value(line, pos, depth)

    def _open(self, parts: tuple[str, ...], array: bool, number: int) -> KeyPath:
        path: KeyPath = ()
        for i, part in enumerate(parts):
            path += (part,)
            if array and i == len(parts) - 1:
                self.where.setdefault(path, number)  # the array itself, at its first entry
                index = self._entries.get(path, 0)
                self._entries[path] = index + 1
                path += (index,)
            elif path in self._entries:  # a table inside the latest entry of an array of tables
                path += (self._entries[path] - 1,)
        self.where.setdefault(path, number)
        return path

    def line_of(self, path: Sequence[str | int]) -> int | None:
        """The line of ``path``, else of its closest enclosing table or key that was written; else None."""
        path = tuple(path)
        while path:
            if path in self.where:
                return self.where[path]
            path = path[:-1]
        return None


def _header(line: str, pos: int) -> tuple[tuple[str, ...], bool] | None:
    """``[a."b.c"]`` -> (("a", "b.c"), False); ``[[a]]`` -> (("a",), True); None if not a header."""
    array = line.startswith("[[", pos)
    key = _dotted_key(line, pos + (2 if array else 1))
    if key is None:
        return None
    close = "]]" if array else "]"
    return (key[0], array) if line.startswith(close, key[1]) else None


def _dotted_key(line: str, pos: int) -> tuple[tuple[str, ...], int] | None:
    """The key at ``pos`` (bare, quoted, dotted, spaces around dots) and the index after it and its spaces."""
    parts: list[str] = []
    while True:
        pos = _skip_spaces(line, pos)
        if pos >= len(line):
            return None
        if line[pos] in "\"'":
            end = _string_end(line, pos + 1, line[pos])
            if end < 0:
                return None
            parts.append(_unquote(line[pos:end]))
            pos = end
        else:
            bare = _BARE.match(line, pos)
            if bare is None:
                return None
            parts.append(bare.group())
            pos = bare.end()
        pos = _skip_spaces(line, pos)
        if pos < len(line) and line[pos] == ".":
            pos += 1
            continue
        return tuple(parts), pos


def _skip_spaces(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _unquote(quoted: str) -> str:
    if quoted[0] == "'" or "\\" not in quoted:
        return quoted[1:-1]
    try:  # a basic string with escapes: let the TOML parser decode it
        return tomllib.loads(f"k = {quoted}")["k"]
    except tomllib.TOMLDecodeError:
        return quoted[1:-1]


def _string_end(line: str, pos: int, quote: str) -> int:
    """Index after the one-line string opened before ``pos``; -1 if the line ends first."""
    while pos < len(line):
        if quote == '"' and line[pos] == "\\":
            pos += 2
            continue
        if line[pos] == quote:
            return pos + 1
        pos += 1
    return -1


def _multiline_end(line: str, pos: int, delimiter: str) -> int:
    """Index after the ``\"\"\"`` or ``'''`` that closes a multi-line string; -1 if not on this line.

    Up to two quotes may stand just inside the delimiter, so a run of four or five ends there too.
    """
    quote = delimiter[0]
    while pos < len(line):
        if quote == '"' and line[pos] == "\\":
            pos += 2
            continue
        if line.startswith(delimiter, pos):
            end = pos + 3
            while end < len(line) and end - pos < 5 and line[end] == quote:
                end += 1
            return end
        pos += 1
    return -1


def _scan_value(line: str, pos: int, depth: int) -> tuple[str | None, int]:
    """Read a value (or the rest of one) from ``pos`` to the end of the line or a comment.

    Returns the delimiter of a multi-line string left open (else None) and the brackets still open.
    """
    while pos < len(line):
        char = line[pos]
        if char == "#":
            break
        if char in "\"'":
            delimiter = char * 3
            if line.startswith(delimiter, pos):
                pos = _multiline_end(line, pos + 3, delimiter)
                if pos < 0:
                    return delimiter, depth
            else:
                pos = _string_end(line, pos + 1, char)
                if pos < 0:
                    break
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(0, depth - 1)
        pos += 1
    return None, depth


# -- documents and their errors ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Wording:
    """How the errors about one family of documents are phrased.

    The read messages are ``str.format`` templates with ``{file}``, ``{exc}`` (the exception) and
    ``{reason}`` (its ``strerror`` when it has one). ``type_names`` names a TOML type in "must be X, not
    Y"; ``wanted_prefix`` goes before the wanted one ("a " when the names carry no article) and
    ``alternatives`` names a tuple of accepted types as a whole.
    """

    missing: str = "{file} does not exist."
    unreadable: str = "{file}: cannot be read ({exc})."
    syntax_hint: str = "Fix the syntax at the line named (https://toml.io)."
    position_first: bool = True  # "file:line:column: not valid TOML: reason" vs "file: ... (at line L, ...)"
    keys_hint: str = "Allowed keys: {keys}."
    sorted_keys: bool = False
    type_names: Mapping[type, str] = field(
        default_factory=lambda: {
            str: "a string",
            int: "an integer",
            float: "a number",
            bool: "true or false",
            list: "an array",
            dict: "a table",
        }
    )
    wanted_prefix: str = ""
    alternatives: Mapping[tuple[type, ...], str] = field(default_factory=dict)

    def type_name(self, t: type) -> str:
        return self.type_names.get(t, t.__name__)

    def wanted(self, types: tuple[type, ...]) -> str:
        names = self.alternatives.get(types) or " or ".join(self.type_name(t) for t in types)
        return self.wanted_prefix + names

    def allowed(self, keys: Mapping[str, object]) -> str:
        return self.keys_hint.format(keys=", ".join(sorted(keys) if self.sorted_keys else keys))


def location(file: Path, line: int | None) -> str:
    """``file:line``, or the file alone when the line is unknown."""
    return f"{file}:{line}" if line else str(file)


@dataclass(frozen=True)
class Doc:
    """A parsed TOML file: its values, where each key was written, and the error class for its faults."""

    file: Path
    data: dict
    lines: Lines
    error: type[Sm120kitError]
    wording: Wording = field(default_factory=Wording)

    def fail(self, path: Sequence[str | int], message: str, hint: str | None = None) -> Sm120kitError:
        """The error (to raise) for ``message`` about ``path``, located at the line that wrote it."""
        return self.error(f"{location(self.file, self.lines.line_of(path))}: {message}", hint=hint)


def read(file: Path, error: type[Sm120kitError], wording: Wording | None = None) -> Doc:
    """Parse ``file``; a missing, unreadable or malformed file raises ``error`` naming file, line and column."""
    wording = wording or Wording()
    try:
        text = regularfile.read_text(file, encoding="utf-8")  # a FIFO is refused, not waited on
    except (OSError, UnicodeDecodeError) as exc:
        template = wording.missing if isinstance(exc, FileNotFoundError) else wording.unreadable
        raise error(template.format(file=file, exc=exc, reason=getattr(exc, "strerror", None) or exc)) from exc
    try:
        data = tomllib.loads(text)
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise error(
            f"{file}: not valid TOML for sm120kit: its arrays or tables are nested too deeply for Python's parser.",
            hint="Such nesting is not part of any sm120kit format; check where the file came from.",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        at = re.search(r"\s*\(at line (\d+), column (\d+)\)", message)
        if wording.position_first and at:
            message = f"{file}:{at.group(1)}:{at.group(2)}: not valid TOML: {message.replace(at.group(0), '')}."
        else:
            message = f"{file}: not valid TOML: {message}."
        raise error(message, hint=wording.syntax_hint) from exc
    return Doc(file=file, data=data, lines=Lines(text), error=error, wording=wording)


def table_name(path: Sequence[str | int]) -> str:
    """``()`` -> "the top level"; ``("notes", "x")`` -> "[notes.x]"."""
    return "[" + ".".join(str(p) for p in path) + "]" if path else "the top level"


def check_keys(
    doc: Doc,
    table: dict,
    path: Sequence[str | int],
    known: Mapping[str, type | tuple[type, ...]],
    required: Sequence[str] = (),
    what: str | None = None,
) -> None:
    """Reject a key of ``table`` not in ``known`` (with a suggestion), a value whose type is not the one
    ``known`` gives (``bool`` passes for ``int`` only where listed), and a missing ``required`` key.

    ``what`` names the table in the messages (default: :func:`table_name` of ``path``).
    """
    path = tuple(path)
    what = what if what is not None else table_name(path)
    for key, value in table.items():
        if key not in known:
            raise doc.fail(
                path + (key,),
                f"unknown key '{key}' in {what}.{did_you_mean(key, known)}",
                hint=doc.wording.allowed(known),
            )
        want = known[key]
        types = want if isinstance(want, tuple) else (want,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise doc.fail(
                path + (key,),
                f"'{key}' in {what} must be {doc.wording.wanted(types)}, "
                f"not {doc.wording.type_name(type(value))} ({value!r}).",
            )
    for key in required:
        if key not in table:
            raise doc.fail(path, f"{what} lacks the required key '{key}'.")
