"""One error tree. Every class owns its exit code; the CLI maps an error to its code and message.

A user error prints its message as one paragraph and no traceback (``-v`` shows it). Codes are part of
the documented interface (docs/cli.md, "Exit codes"); never renumber one.
"""

from __future__ import annotations


class Sm120kitError(Exception):
    """Base class. ``message`` says what went wrong, ``hint`` what to do about it."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message

    def to_json(self) -> dict:
        return {"error": self.kind, "exit_code": self.exit_code, "message": self.message, "hint": self.hint}


class UsageError(Sm120kitError):
    """Bad command-line input (same code as click's own usage errors)."""

    exit_code = 2
    kind = "usage"


class NotSglangTree(Sm120kitError):
    exit_code = 3
    kind = "not-sglang-tree"


class ConflictError(Sm120kitError):
    """A patch does not apply to the target; nothing was written."""

    exit_code = 4
    kind = "conflict"


class DirtyTreeError(Sm120kitError):
    exit_code = 5
    kind = "dirty-tree"


class StateDamagedError(Sm120kitError):
    """The state record and the files on disk disagree."""

    exit_code = 6
    kind = "state-damaged"


class IOFailure(Sm120kitError):
    """Reading or writing a file failed (read-only tree, disk full, lock held)."""

    exit_code = 7
    kind = "io"


class SeriesError(Sm120kitError):
    """A patch series file (metadata or diff) is malformed."""

    exit_code = 8
    kind = "series"


class MissingDependency(Sm120kitError):
    """A Python package or program that this command needs is not installed."""

    exit_code = 9
    kind = "missing-dependency"


class DownloadError(Sm120kitError):
    exit_code = 10
    kind = "download"


class ToolFailed(Sm120kitError):
    """An external program (git, pip, cmake, nvcc ...) exited non-zero."""

    exit_code = 11
    kind = "tool-failed"

    def __init__(
        self,
        message: str,
        *,
        argv: list[str] | None = None,
        returncode: int | None = None,
        output_tail: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.argv = argv or []
        self.returncode = returncode
        self.output_tail = output_tail

    def render(self) -> str:
        text = super().render()
        if self.output_tail:
            tail = "\n".join("    " + line for line in self.output_tail.rstrip().splitlines())
            text = f"{text}\n  output (last lines):\n{tail}"
        return text

    def to_json(self) -> dict:
        data = super().to_json()
        data.update(argv=self.argv, returncode=self.returncode, output_tail=self.output_tail)
        return data


class BuildError(Sm120kitError):
    exit_code = 12
    kind = "build"


class CheckFailed(Sm120kitError):
    """A verification, audit or upstream check ran and found a problem."""

    exit_code = 13
    kind = "check-failed"


class WarningsAsErrors(Sm120kitError):
    """``--error-on-warn`` / ``--strict`` turned warnings into a failure."""

    exit_code = 14
    kind = "warnings"


class RecipeError(Sm120kitError):
    """A serving recipe is malformed, or asks for a flag or setting the SGLang release does not have."""

    exit_code = 15
    kind = "recipe"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped a run that was writing a tree; ``message`` says what state the
    tree was left in. Not an :class:`Sm120kitError`: like Ctrl-C it exits 130 and prints no JSON."""

    exit_code = 130

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message
