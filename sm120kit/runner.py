"""Every subprocess sm120kit starts goes through :func:`run`.

It logs the quoted command (``+ git status`` at ``-v``), never uses a shell, turns a missing program into
:class:`MissingDependency` and a non-zero exit into :class:`ToolFailed` carrying argv, exit code and the
tail of the output. Long commands can stream their output line by line to a callback and to a log file.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120kit.errors import MissingDependency, ToolFailed

log = logging.getLogger("sm120kit.runner")

TAIL_LINES = 30


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def quote(argv: Sequence[str | os.PathLike]) -> str:
    return shlex.join(str(a) for a in argv)


def which(program: str) -> str | None:
    return shutil.which(program)


def python_argv(*args: str) -> list[str]:
    """argv that runs the current interpreter with ``args`` (``python -m pip ...``)."""
    return [sys.executable, *args]


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(
    argv: Sequence[str | os.PathLike],
    *,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    input: str | None = None,
    on_line: Callable[[str], None] | None = None,
    log_file: Path | None = None,
    what: str | None = None,
) -> RunResult:
    """Run ``argv`` and return its result.

    ``env`` replaces the environment, ``extra_env`` adds to the current one. With ``on_line`` or
    ``log_file`` the combined output is streamed line by line (for builds); otherwise stdout and stderr
    are captured separately. ``what`` names the step in error messages ("git clone", "cmake configure").
    """
    args = [str(a) for a in argv]
    full_env = dict(os.environ if env is None else env)
    if extra_env:
        full_env.update(extra_env)
    log.info("+ %s%s", quote(args), f"  (in {cwd})" if cwd else "")
    label = what or Path(args[0]).name
    try:
        if on_line is None and log_file is None:
            proc = subprocess.run(
                args,
                cwd=cwd,
                env=full_env,
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                errors="replace",
            )
            result = RunResult(tuple(args), proc.returncode, proc.stdout, proc.stderr)
        else:
            result = _run_streaming(args, cwd, full_env, timeout, on_line, log_file)
    except FileNotFoundError as exc:
        if cwd is not None and not Path(cwd).is_dir():
            raise ToolFailed(f"{label}: working folder {cwd} does not exist.", argv=args) from exc
        raise MissingDependency(
            f"The program '{args[0]}' was not found on PATH (needed for {label}).",
            hint="Install it or put it on PATH, then run the command again.",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolFailed(f"{label} did not finish within {timeout:.0f} s: {quote(args)}", argv=args) from exc
    if check and result.returncode != 0:
        where = f" Full log: {log_file}." if log_file else ""
        raise ToolFailed(
            f"{label} failed with exit code {result.returncode}: {quote(args)}.{where}",
            argv=args,
            returncode=result.returncode,
            output_tail=_tail(result.stderr or result.stdout),
        )
    return result


def _run_streaming(args, cwd, env, timeout, on_line, log_file) -> RunResult:
    lines: list[str] = []
    # line-buffered: the log of a build of hours shows each line as it comes, and keeps it if the run is killed
    handle = open(log_file, "a", encoding="utf-8", buffering=1) if log_file else None
    try:
        if handle:
            handle.write(f"+ {quote(args)}\n")
        with subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if len(lines) > 4 * TAIL_LINES:
                    del lines[: len(lines) - 2 * TAIL_LINES]
                if handle:
                    handle.write(line)
                if on_line:
                    on_line(line.rstrip("\n"))
            returncode = proc.wait(timeout=timeout)
    finally:
        if handle:
            handle.close()
    return RunResult(tuple(args), returncode, "".join(lines), "")
