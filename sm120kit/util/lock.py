"""The tree lock: one sm120kit run writes to a tree at a time.

An exclusive ``flock`` on ``sglang/.sm120kit/lock``; the kernel drops it when its holder exits, even when
killed, so a lock is never left stale. The holder writes its pid, host, start time and command into the
file; a second run waits briefly (``SM120KIT_LOCK_WAIT`` seconds, default 5) and then names the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from sm120kit.errors import IOFailure

DEFAULT_WAIT = 5.0


def _wait_seconds() -> float:
    try:
        return float(os.environ.get("SM120KIT_LOCK_WAIT", DEFAULT_WAIT))
    except ValueError:
        return DEFAULT_WAIT


def _hint(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The disk is full: free some space and run the command again."
    return "The tree must be writable by you."


def read_holder(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None


class TreeLock:
    """``with TreeLock(path, command="apply"):`` -- raises :class:`IOFailure` when another run holds it."""

    def __init__(self, path: Path, *, command: str = "", wait: float | None = None,
                 prepare: Callable[[], None] | None = None) -> None:
        self.path = Path(path)
        self.command = command
        self.wait = _wait_seconds() if wait is None else wait
        self._fd: int | None = None
        # Makes the lock's folder when it is missing (a run that held the lock removed it: a finished revert).
        self._prepare = prepare or (lambda: self.path.parent.mkdir(parents=True, exist_ok=True))

    def _open(self) -> int:
        for attempt in range(20):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except FileNotFoundError:
                if attempt == 19:
                    raise IOFailure(f"Cannot create the lock file {self.path}: its folder keeps disappearing.",
                                    hint="Another program is removing it; stop that and try again.") from None
                self._prepare()
            except OSError as exc:
                raise IOFailure(f"Cannot create the lock file {self.path}: {exc.strerror or exc}.",
                                hint=_hint(exc)) from None
        raise AssertionError("unreachable")

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if not isinstance(exc, BlockingIOError):
                    os.close(fd)
                    raise IOFailure(f"Cannot lock {self.path}: {exc.strerror or exc}.",
                                    hint="The file system must support flock (a local disk does).") from None
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
            info = {"pid": os.getpid(), "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": self.command}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode(), 0)
            except OSError as exc:
                self.release()
                raise IOFailure(f"Cannot write the lock file {self.path}: {exc.strerror or exc}. Nothing was "
                                "changed.", hint=_hint(exc)) from None
            return

    def _held_error(self) -> IOFailure:
        holder = read_holder(self.path) or {}
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, running "
               f"'{holder.get('command') or '?'}' since {holder.get('since', '?')}")
        return IOFailure(
            f"The tree is locked by another sm120kit run ({who}); waited {self.wait:.0f} s.",
            hint=f"Wait for that run to finish and try again. The lock is {self.path}; it is released "
                 "automatically when that process ends.")

    def release(self) -> None:
        if self._fd is not None:
            try:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)  # no holder any more
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "TreeLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
