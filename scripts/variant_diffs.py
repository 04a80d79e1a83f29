"""What the series' diff generators (scripts/gen_*_patch.py) share: a unified diff of one file, and the
command line that writes each variant's diff or, with ``--check``, reports the ones that are out of date."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path


def file_diff(original: str, patched: str, path: str) -> str:
    """The unified diff (3 lines of context) that turns ``original`` into ``patched`` at ``path``."""
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True), patched.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
        )
    )


def main(
    argv: list[str] | None,
    description: str,
    patch_dir: Path,
    bases: Iterable[str],
    render: Callable[[str], str],
    script: str,
) -> int:
    """Write ``patch_dir/BASE.diff`` = ``render(BASE)`` for every base, or with --check exit 1 naming the
    diffs that differ from what ``render`` gives."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    stale = []
    for base in bases:
        path = patch_dir / f"{base}.diff"
        text = render(base)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.name} in {patch_dir.name}/")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python {script})", file=sys.stderr)
        return 1
    return 0
