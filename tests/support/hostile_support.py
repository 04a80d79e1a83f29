"""Running the CLI where permissions really bite, for the hostile-input tests, and a zip bomb
they feed to the readers of downloads.

The tests run as root, and root reads and writes any file. A user namespace (``unshare --user``, no
privilege needed) takes that away for real: with ``--map-root-user`` the process is root inside, but a
file owned by a user id the namespace does not map (``FOREIGN_UID``) is, for it, another user's file,
and permission bits apply (a 0600 file cannot be read, a 0755 folder cannot be written). With
``--map-user=UID`` the process runs as a user id that has no passwd entry (no home folder). Skipped,
with the reason, where the machine allows no user namespaces.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from repo_paths import REPO_ROOT

FOREIGN_UID = 12345  # owns files the namespace's root may not touch
NO_PASSWD_UID = 54321  # a user id with no passwd entry


def _namespace(flags: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: no user namespace to drop root's rights")
    probe = subprocess.run([unshare, *flags, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no user namespace (unshare {' '.join(flags)}: {probe.stderr.strip()})")
    return [unshare, *flags]


def run_cli_confined(
    *args: str,
    env: dict | None = None,
    user: str = "root",
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """``python -m sm120kit ARGS`` inside a user namespace: ``user="root"`` (namespace root, which cannot
    read or write files of ``FOREIGN_UID`` beyond their permission bits) or ``user="no-passwd"``."""
    flags = (
        ["--user", "--map-root-user"]
        if user == "root"
        else ["--user", f"--map-user={NO_PASSWD_UID}", f"--map-group={NO_PASSWD_UID}"]
    )
    full = dict(os.environ, NO_COLOR="1") if env is None else env
    return subprocess.run(
        [*_namespace(flags), sys.executable, "-m", "sm120kit", *args],
        cwd=REPO_ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def give_away(path: Path, mode: int) -> None:
    """Make ``path`` another user's (``FOREIGN_UID``) with permission bits ``mode``."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, FOREIGN_UID, FOREIGN_UID)
    os.chmod(path, mode)


def zip_bomb(members: int, member_size: int = 64 << 20, prefix: str = "bomb/") -> bytes:
    """A real zip whose ``members`` entries each inflate to ``member_size`` zero bytes (deflate, about 1:1000):
    written by hand so that the one compressed block is made once."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(member_size)) + compressor.flush()
    crc = zlib.crc32(bytes(member_size))
    out = io.BytesIO()
    central = io.BytesIO()
    for i in range(members):
        name = f"{prefix}part{i:03d}.bin".encode()
        offset = out.tell()
        out.write(
            struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(block), member_size, len(name), 0)
            + name
            + block
        )
        central.write(
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                0,
                8,
                0,
                0,
                crc,
                len(block),
                member_size,
                len(name),
                0,
                0,
                0,
                0,
                0o100644 << 16,
                offset,
            )
            + name
        )
    start = out.tell()
    out.write(central.getvalue())
    out.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, members, members, len(central.getvalue()), start, 0))
    return out.getvalue()
