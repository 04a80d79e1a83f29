"""Shared pieces of the CLI: the context object and the options every command takes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120kit.ui import Console, print_json

if TYPE_CHECKING:
    from sm120kit.patching.hunks import HunkResult


@dataclass
class AppContext:
    verbose: bool = False
    quiet: bool = False

    def console(self, json_mode: bool = False, stream: Any = None) -> Console:
        """Human output: stdout, or stderr with ``--json`` (or when ``stream`` says so)."""
        return Console(verbose=self.verbose, quiet=self.quiet, json_mode=json_mode, stream=stream)


def json_option(func: Callable) -> Callable:
    """Add ``--json`` to a command: JSON on stdout, human progress on stderr."""
    return click.option("--json", "json_mode", is_flag=True, help="JSON on stdout; schema: docs/json-schema.md")(func)


series_option = click.option(
    "--series",
    "series_dir",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="The patch series folder (default: the bundled patches/sglang).",
)
"""``--series DIR``: the commands that read the patch series."""


def fuzz_option(help: str) -> Callable:
    """``--fuzz N`` (0 to 3, default 0), in the words of the command that takes it."""
    return click.option("--fuzz", type=click.IntRange(0, 3), default=0, show_default=True, help=help)


def emit(json_mode: bool, data: Any, human: Callable[[], None]) -> None:
    """Print ``data`` as JSON, or call ``human()`` to print the table form."""
    if json_mode:
        print_json(data)
    else:
        human()


def pass_app(func: Callable) -> Callable:
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(app: AppContext, *args, **kwargs):
        return func(app, *args, **kwargs)

    return wrapper


def shorten(text: str, width: int = 110) -> str:
    """One line of at most ``width`` characters (``...`` where it was cut), for a table cell."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


class ExitAfterResult(Exception):
    """A command printed its result and fails with ``code``: :func:`sm120kit.cli.main`, the one exit path,
    prints ``error: message`` on stderr for each message and exits with ``code``; no second JSON document
    goes to stdout, unlike a raised :class:`~sm120kit.errors.Sm120kitError`."""

    def __init__(self, code: int, *messages: str | None) -> None:
        self.messages = tuple(m for m in messages if m)
        super().__init__(self.messages[0] if self.messages else f"exit code {code}")
        self.code = code

    @property
    def message(self) -> str | None:
        return self.messages[0] if self.messages else None


def exit_with(code: int, *messages: str | None) -> None:
    """After a result was printed: a non-zero ``code`` ends the command through :func:`sm120kit.cli.main`,
    which prints ``error: message`` for each message given and exits with ``code``."""
    if code:
        raise ExitAfterResult(code, *messages)


def print_hunk_conflict(console: Console, hunk: HunkResult, indent: str = "  ") -> None:
    """A hunk that does not place: where it was expected, the lines it needs and the closest lines found
    (``!`` marks lines that differ)."""
    where = f"closest match at line {hunk.closest_line}" if hunk.closest_line else "no similar lines"
    console.info(f"{indent}{hunk.file} hunk {hunk.index}: expected at line {hunk.line}, {where}")
    console.info(f"{indent}  expected:")
    for line in hunk.expected:
        console.info(f"{indent}    | {line}")
    console.info(
        f"{indent}  found{f' at line {hunk.closest_line}' if hunk.closest_line else ''} ('!' marks lines that differ):"
    )
    for i, line in enumerate(hunk.found or ["(end of file)"]):
        same = i < len(hunk.expected) and hunk.expected[i] == line
        console.info(f"{indent}  {' ' if same else '!'} | {line}")
