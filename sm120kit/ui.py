"""Terminal output: steps with timing and a mark, progress for long work, tables, JSON.

Human output goes to stderr when a command prints JSON, so ``--json`` output on stdout stays parseable.
Colour follows ``NO_COLOR`` and whether the stream is a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence


def _use_color(stream) -> bool:
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


@dataclass
class Console:
    verbose: bool = False
    quiet: bool = False
    json_mode: bool = False
    stream: Any = field(default=None)

    def __post_init__(self) -> None:
        if self.stream is None:
            self.stream = sys.stderr if self.json_mode else sys.stdout
        self.color = _use_color(self.stream)

    # -- text -------------------------------------------------------------------------------------------
    def style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def info(self, text: str = "") -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def debug(self, text: str) -> None:
        if self.verbose:
            print(self.style(text, "2"), file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        print(self.style("warning: ", "33") + text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        """``title ... ✓ (1.2 s)`` around a block; ``✕`` when it raises."""
        start = time.perf_counter()
        if not self.quiet:
            print(f"{title} ...", file=self.stream, flush=True)
        try:
            yield
        except BaseException:
            if not self.quiet:
                print(self.style(f"✕ {title} ({time.perf_counter() - start:.1f} s)", "31"),
                      file=self.stream, flush=True)
            raise
        if not self.quiet:
            print(self.style(f"✓ {title} ({time.perf_counter() - start:.1f} s)", "32"),
                  file=self.stream, flush=True)

    def progress(self, done: int, total: int, label: str = "") -> None:
        """One progress line per call (rewritten in place on a terminal)."""
        if self.quiet:
            return
        width = 24
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        text = f"[{bar}] {done}/{total} {label}"
        if self.color:
            end = "\n" if done >= total else ""
            print("\r\x1b[2K" + text, end=end, file=self.stream, flush=True)
        else:
            print(text, file=self.stream, flush=True)

    # -- structured -------------------------------------------------------------------------------------
    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if not self.quiet:
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
