"""The tree lock: one sm120kit run writes to a tree at a time.

An exclusive ``flock`` on ``sglang/.sm120kit/lock``; the kernel drops it when its holder exits, even when
killed, so a lock is never left stale. The holder writes its pid, host, start time and command into the
file; a second run waits briefly (``SM120KIT_LOCK_WAIT`` seconds, default 5) and then names the holder.

The lock file is untrusted like everything in the tree: it is opened without following a link, must be a
regular file with one name (a hard link to a file elsewhere would be truncated by the next run), and its
holder record is read as at most a few KiB of JSON whose fields are shown only when they are plain values.
:func:`reading` lets a reader (``status``) see a run in progress without creating anything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sm120kit.errors import IOFailure, UsageError
from sm120kit.util.atomicfile import fault_point

DEFAULT_WAIT = 5.0
WAIT_ENV = "SM120KIT_LOCK_WAIT"
_HOLDER_BYTES = 4096  # a holder record sm120kit writes is ~150 bytes


def _wait_seconds() -> float:
    """``SM120KIT_LOCK_WAIT`` (seconds, a finite number >= 0), else the default; :class:`UsageError` naming
    the variable for anything else (``nan`` would wait for ever, a word would be silently ignored)."""
    text = os.environ.get(WAIT_ENV)
    if text is None or not text.strip():
        return DEFAULT_WAIT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(
            f"{WAIT_ENV}={text!r} is not a number of seconds to wait for the tree lock.",
            hint=f"Set it to a number >= 0 (e.g. {WAIT_ENV}=30), or unset it for the default of {DEFAULT_WAIT:.0f} s.",
        )
    return value


def _hint(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The disk is full: free some space and run the command again."
    return "The tree must be writable by you."


def read_holder(path: Path) -> dict | None:
    """The holder record in the lock file: a dict of its plain (string, number) fields, or ``None`` when
    the file is absent, empty, not a regular file or not such a record."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8") or "null")
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return None
    return {
        k: v
        for k, v in data.items()
        if isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool)
    }


def _check_lock_file(path: Path, fd: int) -> None:
    """Refuse a lock file that is not a regular file with one name: writing the holder into it would
    change a file outside the tree that shares its inode."""
    info = os.fstat(fd)
    why = None
    if not stat.S_ISREG(info.st_mode):
        why = "is not a regular file"
    elif info.st_nlink != 1:
        why = f"has {info.st_nlink} names (a hard link: another file shares its content)"
    if why:
        os.close(fd)
        raise IOFailure(
            f"The lock file {path} {why}; sm120kit writes its holder into that file, so it does not "
            "use it. Nothing was changed.",
            hint=f"Remove {path} (sm120kit creates a new one) and run the command again.",
        )


@contextlib.contextmanager
def reading(path: Path, *, wait: float | None = None) -> Iterator[dict | None]:
    """For a reader (``status``): hold the lock at ``path`` shared for the block, so that no run starts
    writing meanwhile, and yield ``None``; when another run holds it for ``wait`` seconds (default
    ``SM120KIT_LOCK_WAIT``), yield that run's holder record (``{}`` if unreadable) instead. Creates and
    writes nothing; with no lock file there is nothing to hold and ``None`` is yielded."""
    deadline = time.monotonic() + (_wait_seconds() if wait is None else wait)
    fd = None
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            fd = None
            break
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            os.close(fd)
            fd = None
            if time.monotonic() >= deadline:
                yield read_holder(path) or {}
                return
            time.sleep(0.05)
        except OSError:
            os.close(fd)
            fd = None
            break
    try:
        yield None
    finally:
        if fd is not None:
            os.close(fd)


class TreeLock:
    """``with TreeLock(path, command="apply"):`` -- raises :class:`IOFailure` when another run holds it."""

    def __init__(
        self, path: Path, *, command: str = "", wait: float | None = None, prepare: Callable[[], None] | None = None
    ) -> None:
        self.path = Path(path)
        self.command = command
        self.wait = _wait_seconds() if wait is None else wait
        self._fd: int | None = None
        # Makes the lock's folder when it is missing (a run that held the lock removed it: a finished revert).
        self._prepare = prepare or (lambda: self.path.parent.mkdir(parents=True, exist_ok=True))

    def _open(self) -> int:
        for attempt in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
                _check_lock_file(self.path, fd)
                return fd
            except FileNotFoundError:
                if attempt == 19:
                    raise IOFailure(
                        f"Cannot create the lock file {self.path}: its folder keeps disappearing.",
                        hint="Another program is removing it; stop that and try again.",
                    ) from None
                self._prepare()
            except OSError as exc:
                raise IOFailure(
                    f"Cannot create the lock file {self.path}: {exc.strerror or exc}.", hint=_hint(exc)
                ) from None
        raise AssertionError("unreachable")

    def acquire(self) -> None:
        fault_point("lock")
        deadline = time.monotonic() + self.wait
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if not isinstance(exc, BlockingIOError):
                    os.close(fd)
                    raise IOFailure(
                        f"Cannot lock {self.path}: {exc.strerror or exc}.",
                        hint="The file system must support flock (a local disk does).",
                    ) from None
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise self._held_error() from None
                time.sleep(0.05)
                continue
            # The holder before us may have removed the folder (a finished revert): then our fd locks an
            # unlinked file and the lock must be taken again on the path that exists now.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._prepare()
                continue
            self._fd = fd
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "command": self.command,
            }
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode(), 0)
            except OSError as exc:
                self.release()
                raise IOFailure(
                    f"Cannot write the lock file {self.path}: {exc.strerror or exc}. Nothing was changed.",
                    hint=_hint(exc),
                ) from None
            return

    def _held_error(self) -> IOFailure:
        error = IOFailure(
            f"The tree is locked by another sm120kit run ({describe_holder(read_holder(self.path))}); waited "
            f"{self.wait:.0f} s.",
            hint=f"Wait for that run to finish and try again. The lock is {self.path}; it is released "
            "automatically when that process ends.",
        )
        error.lock_held = True  # type: ignore[attr-defined]  # not a disk problem: the caller keeps its folder
        return error

    def release(self) -> None:
        if self._fd is not None:
            try:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)  # no holder any more
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> TreeLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def describe_holder(holder: dict | None) -> str:
    """``pid 123 on host h, running 'apply' since ...`` from a holder record (``?`` for what it lacks)."""
    holder = holder or {}

    def field(key: str) -> str:
        return str(holder.get(key) or "?")[:200]

    return f"pid {field('pid')} on host {field('host')}, running '{field('command')}' since {field('since')}"
