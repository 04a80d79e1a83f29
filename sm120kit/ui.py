"""Terminal output: steps with timing and a mark, progress for long work, tables, JSON.

Human output goes to stderr when a command prints JSON, so ``--json`` output on stdout stays parseable.
Colour follows ``NO_COLOR`` (any non-empty value turns it off) and whether the stream is a terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import click


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def no_color() -> bool:
    """``NO_COLOR`` set to anything but the empty string turns every colour off (https://no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def _use_color(stream) -> bool:
    return not no_color() and _isatty(stream)


def style(text: str, **styles: Any) -> str:
    """``click.style`` unless ``NO_COLOR`` is set; ``click.echo`` still drops it when the stream is no terminal."""
    return text if no_color() else click.style(text, **styles)


def echo_error(message: str, prefix: str = "error: ") -> None:
    """The one form of an error line on stderr: a red ``prefix`` (plain under ``NO_COLOR``), then ``message``."""
    click.echo(style(prefix, fg="red") + message, err=True)


def _terminal_columns() -> int:
    return max(20, shutil.get_terminal_size((80, 24)).columns)


def _bar_width() -> int:
    return max(10, min(30, _terminal_columns() // 4))


def _fit(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters; a long path keeps its end (``...`` where cut)."""
    text = " ".join(str(text).split())
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return "..." + text[len(text) - width + 3 :] if width > 3 else text[:width]


@dataclass
class Console:
    verbose: bool = False
    quiet: bool = False
    json_mode: bool = False
    stream: Any = field(default=None)
    # Progress goes to stderr (it is not a result) and is drawn as a bar only when that is a terminal;
    # a console given its own stream reports progress there.
    progress_stream: Any = field(default=None)

    def __post_init__(self) -> None:
        if self.progress_stream is None:
            self.progress_stream = sys.stderr if self.stream is None else self.stream
        if self.stream is None:
            self.stream = sys.stderr if self.json_mode else sys.stdout
        self.color = _use_color(self.stream)
        self.tty = _isatty(self.progress_stream)
        self._bar: Any = None  # the click progress bar being drawn (terminal only)
        self._plain: int | None = None  # total of a long step reported without a terminal (start line printed)

    # -- text -------------------------------------------------------------------------------------------
    _STYLES = {"2": {"dim": True}, "31": {"fg": "red"}, "32": {"fg": "green"}, "33": {"fg": "yellow"}}

    def style(self, text: str, code: str) -> str:
        return click.style(text, **self._STYLES.get(code, {})) if self.color else text

    def for_results(self) -> Console:
        """The same console for a command's result, which ``-q`` keeps (it silences only steps, progress
        and hints)."""
        return dataclasses.replace(self, quiet=False)

    def info(self, text: str = "") -> None:
        if not self.quiet:
            self.end_progress()
            print(text, file=self.stream, flush=True)

    def debug(self, text: str) -> None:
        if self.verbose:
            print(self.style(text, "2"), file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        click.echo(style("warning: ", fg="yellow") + text, err=True)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        """``title ... ✓ (1.2 s)`` around a block; ``✕`` when it raises."""
        start = time.perf_counter()
        if not self.quiet:
            self.end_progress()
            print(f"{title} ...", file=self.stream, flush=True)
        try:
            yield
        except BaseException:
            if not self.quiet:
                self.end_progress()
                print(
                    self.style(f"✕ {title} ({time.perf_counter() - start:.1f} s)", "31"), file=self.stream, flush=True
                )
            raise
        if not self.quiet:
            self.end_progress()
            print(self.style(f"✓ {title} ({time.perf_counter() - start:.1f} s)", "32"), file=self.stream, flush=True)

    def progress(self, done: int, total: int, label: str = "") -> None:
        """Progress of a long step, ``done`` of ``total``: a bar redrawn in place on a terminal; without one, a
        start line and an end line only; nothing with ``-q``."""
        if self.quiet:
            return
        if not self.tty:
            started = self._plain != total
            if started:
                self._plain = total
                print(f"[{done}/{total}] {label}", file=self.progress_stream, flush=True)
            if done >= total:
                if not started:
                    print(f"[{done}/{total}] {label}", file=self.progress_stream, flush=True)
                self._plain = None
            return
        if self._bar is None or self._bar.length != total:
            self.end_progress()
            self._bar = click.progressbar(
                length=total,
                file=self.progress_stream,
                color=_use_color(self.progress_stream),
                show_pos=True,
                show_eta=False,
                width=_bar_width(),
                item_show_func=lambda item: item,
            )
        bar = self._bar
        bar.current_item = ""
        # the item follows the info separator; the position may still grow by a digit or more
        room = _terminal_columns() - len(bar.format_progress_line()) - len(bar.info_sep) - len(str(total)) - 1
        bar.current_item = _fit(label, room)
        if done > bar.pos:
            bar.update(done - bar.pos)
        else:
            bar.render_progress()
        if done >= total:
            self.end_progress()

    def end_progress(self) -> None:
        """Finish a bar left on the line (the next line then starts on its own)."""
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.render_finish()

    # -- structured -------------------------------------------------------------------------------------
    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if not self.quiet:
            self.end_progress()
            print(render_table(headers, rows), file=self.stream, flush=True)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def esc(c: Any) -> str:
        return ("" if c is None else str(c)).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def print_json(data: Any) -> None:
    """The one place JSON reaches stdout."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str), flush=True)
