"""Unpacking zip and tar archives sm120kit downloaded (SGLang wheels, kernel dependencies) into a new folder.

An archive is untrusted input, even one in sm120kit's own cache: it may be damaged (a bad CRC, a
truncated member or stream), built to fill the disk (a zip bomb: a few MB that unpack to GBs), or hold
names and links that lead out of the folder. :func:`unpack` therefore

- bounds what is unpacked: at most :data:`MAX_ENTRIES` entries and :func:`size_limit` bytes (the sizes
  the archive declares are summed before anything is written, and the bytes written are counted too);
- writes every entry below ``dest`` only (no absolute name, no ``..``; tar links through tarfile's
  "data" filter; a zip never creates links), never through a symbolic link;
- keeps the executable bits a zip member carries (as pip does: executable by whom the umask allows);
- raises :class:`BadArchive` (the reason in words) for a damaged, unsafe or oversized archive, whatever
  the decompressor raised (``zipfile.BadZipFile``, ``zlib.error``, ``EOFError``, ``gzip.BadGzipFile``
  ...), and lets an ``OSError`` of the disk (full, read-only) through for the caller to name.

``SM120KIT_UNPACK_LIMIT`` (bytes) replaces the size bound for an archive that is genuinely larger.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from sm120kit.errors import UsageError
from sm120kit.util import regularfile
from sm120kit.util.atomicfile import current_umask

MAX_ENTRIES = 200_000
MIN_LIMIT = 1 << 30  # 1 GiB: what any archive may unpack to, whatever its size
RATIO = 100  # ... or this many times its own size (real source archives and wheels unpack to 3-12 times)
LIMIT_ENV = "SM120KIT_UNPACK_LIMIT"
_CHUNK = 1 << 20


class BadArchive(ValueError):
    """The archive is damaged, unsafe or too large; ``str()`` says which entry and why."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.too_large = too_large


def size_limit(archive_size: int) -> int:
    """How many bytes an archive of ``archive_size`` bytes may unpack to (``SM120KIT_UNPACK_LIMIT`` if set)."""
    text = os.environ.get(LIMIT_ENV)
    if text:
        try:
            value = int(text.strip())
        except ValueError:
            value = 0
        if value <= 0:
            raise UsageError(
                f"{LIMIT_ENV}={text!r} is not a positive number of bytes.",
                hint=f"Unset it, or set it to the largest size an archive may unpack to (e.g. {4 << 30} for 4 GiB).",
            )
        return value
    return max(MIN_LIMIT, RATIO * archive_size)


def _safe_name(name: str) -> PurePosixPath:
    """The member name as a relative path below the folder; :class:`BadArchive` if it would leave it."""
    if "\0" in name or "\\" in name:
        raise BadArchive(f"the entry {name!r} has a NUL or backslash in its name")
    path = PurePosixPath(name)
    if path.is_absolute() or any(part in ("..",) for part in path.parts) or not path.parts:
        raise BadArchive(f"the entry {name!r} would be written outside the folder")
    return path


def _too_large(total: int, limit: int, what: str) -> BadArchive:
    return BadArchive(
        f"it unpacks to {what} {total:,} bytes, over the bound of {limit:,} bytes (a zip bomb, or "
        f"an archive larger than expected; {LIMIT_ENV}=BYTES raises the bound)",
        too_large=True,
    )


def _decode_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the compressed data is damaged (as opposed to a disk error)."""
    return isinstance(
        exc,
        (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            lzma.LZMAError,
            gzip.BadGzipFile,
            tarfile.TarError,
            NotImplementedError,
            RuntimeError,
            UnicodeDecodeError,
        ),
    )


def unpack(
    archive: BinaryIO | Path,
    dest: Path,
    *,
    select: Callable[[str], bool] | None = None,
    archive_size: int | None = None,
    digests: dict[str, str] | None = None,
) -> int:
    """Unpack the zip or tar (plain, gz, bz2, xz) ``archive`` (a path or an open binary file) into the
    existing folder ``dest``; only the members ``select(name)`` accepts when given. Returns the bytes
    written. ``digests``, for a zip: filled with the SHA-256 (hex) of each file member written, by name.
    :class:`BadArchive` for a damaged, unsafe or oversized archive; ``OSError`` for the disk."""
    if isinstance(archive, (str, os.PathLike)):
        with os.fdopen(regularfile.open_regular(archive), "rb") as handle:
            return unpack(handle, dest, select=select, archive_size=archive_size, digests=digests)
    if archive_size is None:
        archive_size = os.fstat(archive.fileno()).st_size
    limit = size_limit(archive_size)
    try:
        archive.seek(0)
        if zipfile.is_zipfile(archive):
            archive.seek(0)
            return _unpack_zip(archive, Path(dest), select, limit, digests)
        archive.seek(0)
        try:
            tar = tarfile.open(fileobj=archive, mode="r:*")
        except tarfile.ReadError:
            raise BadArchive("it is neither a zip nor a tar archive (or it is damaged)") from None
        with tar:
            return _unpack_tar(tar, Path(dest), select, limit)
    except BadArchive:
        raise
    except OSError as exc:
        if isinstance(exc, gzip.BadGzipFile):
            raise BadArchive(f"the compressed data is damaged ({exc})") from None
        raise
    except Exception as exc:
        if _decode_error(exc):
            raise BadArchive(f"it is damaged or truncated ({type(exc).__name__}: {exc})") from None
        raise


def _unpack_zip(handle: BinaryIO, dest: Path, select, limit: int, digests: dict[str, str] | None) -> int:
    with zipfile.ZipFile(handle) as zf:
        infos = [i for i in zf.infolist() if select is None or select(i.filename)]
        if len(infos) > MAX_ENTRIES:
            raise BadArchive(f"it has {len(infos):,} entries, over the bound of {MAX_ENTRIES:,}", too_large=True)
        declared = sum(i.file_size for i in infos)
        if declared > limit:
            raise _too_large(declared, limit, "a declared")
        umask = current_umask()
        written = 0
        for info in infos:
            rel = _safe_name(info.filename)
            target = dest.joinpath(*rel.parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            unix = info.external_attr >> 16
            executable = stat.S_ISREG(unix) and bool(unix & 0o111)  # pip's rule for a wheel's scripts
            fd = os.open(
                target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, (0o777 if executable else 0o666) & ~umask
            )
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:  # zipfile checks each member's CRC
                while chunk := src.read(_CHUNK):
                    written += len(chunk)
                    if written > limit:
                        raise _too_large(written, limit, "more than")
                    digest.update(chunk)
                    out.write(chunk)
            if digests is not None:
                digests[info.filename] = digest.hexdigest()
            if executable:
                os.chmod(target, 0o777 & ~umask)
        return written


def _unpack_tar(tar: tarfile.TarFile, dest: Path, select, limit: int) -> int:
    members = []
    total = 0
    for member in tar:  # reads the whole stream once: a truncated archive fails here, before any write
        if select is not None and not select(member.name):
            continue
        _safe_name(member.name)
        members.append(member)
        if len(members) > MAX_ENTRIES:
            raise BadArchive(f"it has more than {MAX_ENTRIES:,} entries", too_large=True)
        if member.isfile():
            total += member.size
            if total > limit:
                raise _too_large(total, limit, "a declared")
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise BadArchive(f"it has an unsafe entry: {exc}") from None
        return total
    # Pythons before the filter (3.10.11 and older): regular files and folders only.
    odd = [m.name for m in members if not (m.isfile() or m.isdir())]
    if odd:
        raise BadArchive(f"it has an unsafe entry: {odd[0]} is a link or special file")
    tar.extractall(dest, members=members)
    return total
