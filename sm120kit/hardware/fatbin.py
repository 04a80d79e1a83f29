"""Read which GPU architectures a compiled library carries: the CUDA fat binaries of an ELF ``.so``.

A library built by nvcc keeps its device code in the ``.nv_fatbin`` section: one fat-binary container per
translation unit, each holding entries of machine code (an ELF "cubin", SASS) or PTX text for one
architecture. This module reads the container and entry headers in pure Python (no cuobjdump needed: a
runtime image rarely has it), from a file, from a ``.so`` inside a wheel without unpacking it, or from every
library under a folder.

Layout (little endian; checked byte by byte against nvcc 13.0 output and against ``cuobjdump
--list-elf/--list-ptx`` in the tests; field names follow public fat-binary readers):

container header, 16 bytes
    ``u32 magic`` (0xBA55ED50), ``u16 version`` (1), ``u16 header size`` (16), ``u64 size of the entries``
entry header, 64 bytes (80 for PTX and 112 for cubins of sm_100 and later: an extension follows)
    +0 ``u16 kind`` (1 PTX, 2 ELF cubin), +2 ``u16`` (0x0101), +4 ``u32 header size``,
    +8 ``u64 payload size`` (padded to 8), +16 ``u32 compressed size`` (0 when stored plain),
    +24 ``u16 minor, u16 major`` (cubin code version or PTX ISA version), +28 ``u32 SM number`` (120),
    +40 ``u64 flags``, +56 ``u64 uncompressed size`` (0 when stored plain); the payload follows the header.
flags
    0x1 64-bit, 0x10 Linux host, 0x2000 compressed (CUDA 11/12), 0x8000 compressed with zstd (CUDA 13
    ``--compress-mode``), **0x100000 architecture-specific target ("a": sm_90a, sm_120a)**, **0x200000
    family-specific target ("f": sm_100f, sm_120f)**, 0x1000000 extended header present.

So ``sm_120``, ``sm_120a`` and ``sm_120f`` are told apart from the entry flags alone, also when the payload
is compressed. (``cuobjdump --list-elf`` names an ``f`` cubin without its suffix, ``sm_120``; its
``--dump-elf`` header says ``arch = sm_120f``. This reader keeps the suffix.)
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sm120kit.errors import IOFailure, UsageError
from sm120kit.hardware import dynlinks, elf

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

KIND_PTX = 1
KIND_ELF = 2
KIND_ELF_ALT = 0x10  # reported by public readers as a second cubin kind; treated as SASS

FLAG_64BIT = 0x1
FLAG_LINUX = 0x10
FLAG_COMPRESSED_LEGACY = 0x2000
FLAG_COMPRESSED_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

_ENTRY_MIN = 64


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of a fat binary: SASS (a cubin) or PTX for one architecture."""

    kind: str  # "sass" | "ptx" | "other"
    sm: int  # 120
    variant: str  # "" | "a" | "f"
    flags: int
    stored_size: int  # bytes the payload takes in the file (padded)
    uncompressed_size: int | None  # None when stored plain

    @property
    def arch(self) -> str:
        """``sm_120a`` (for SASS and PTX alike, as cuobjdump names them)."""
        return f"sm_{self.sm}{self.variant}"

    @property
    def compressed(self) -> bool:
        return bool(self.flags & (FLAG_COMPRESSED_LEGACY | FLAG_COMPRESSED_ZSTD))


@dataclass(frozen=True)
class LibraryArchs:
    """The architectures one library carries.

    ``sass`` and ``ptx`` are sorted, de-duplicated arch names such as ``"sm_90a"``, ``"sm_120a"``,
    ``"sm_100f"``, ``"sm_80"``. The suffix is exact: an arch-specific target (``a``), a family target
    (``f``) and a plain one are distinct names, read from each entry's flags (see the module docstring),
    so ``"sm_120"`` here really means plain sm_120 code, which is not the same thing as ``"sm_120a"``.
    ``path`` is the file, or for a library inside a wheel the member path with ``wheel`` set.
    """

    path: Path
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    wheel: Path | None = None
    size: int = 0  # bytes of the library (uncompressed)
    containers: int = 0  # fat-binary containers (about one per CUDA translation unit)
    entries: int = 0
    compressed_entries: int = 0
    sass_counts: tuple[tuple[str, int], ...] = field(default=())  # (arch, number of cubins)
    sass_bytes: tuple[tuple[str, int], ...] = field(default=())  # (arch, bytes its cubins take in the file)
    ptx_bytes: tuple[tuple[str, int], ...] = field(default=())
    fatbin_bytes: int = 0  # size of the .nv_fatbin section(s): all device code, headers included
    links: dynlinks.DynamicLinks | None = field(default=None, compare=False)  # NEEDED libraries, undefined symbols

    @property
    def name(self) -> str:
        """``common_ops`` for ``.../sm100/common_ops.abi3.so``."""
        return self.path.name.split(".", 1)[0]

    @property
    def label(self) -> str:
        """The path as shown in tables: the member path inside a wheel, else the file path."""
        return self.path.as_posix()

    def has_sass(self, arch: str) -> bool:
        return arch in self.sass

    def to_json(self) -> dict:
        return {
            "path": self.label,
            "wheel": str(self.wheel) if self.wheel else None,
            "name": self.name,
            "size": self.size,
            "sass": list(self.sass),
            "ptx": list(self.ptx),
            "containers": self.containers,
            "entries": self.entries,
            "compressed_entries": self.compressed_entries,
            "sass_counts": dict(self.sass_counts),
            "sass_bytes": dict(self.sass_bytes),
            "ptx_bytes": dict(self.ptx_bytes),
            "fatbin_bytes": self.fatbin_bytes,
        }


def _parse_fatbin(reader: elf.Reader, section: elf.Section) -> Iterator[tuple[int, FatbinEntry | None]]:
    """Yield ``(container_index, entry)`` for every entry; ``(index, None)`` for an empty container."""
    pos, end = section.offset, section.offset + section.size
    index = 0
    while pos + 16 <= end:
        head = reader.read_at(pos, 16)
        if head[:4] != _MAGIC_BYTES:
            # containers are 8-byte aligned; skip zero padding, stop at anything else
            if head[:8] == b"\0" * 8:
                pos += 8
                continue
            raise IOFailure(
                f"{reader.label}: unexpected bytes {head[:4].hex()} at offset {pos} in .nv_fatbin "
                f"(expected the fat-binary magic {FATBIN_MAGIC:#x})."
            )
        _magic, _version, header_size, body_size = struct.unpack("<IHHQ", head)
        if header_size < 16:
            raise IOFailure(f"{reader.label}: fat-binary container at offset {pos} has header size {header_size}.")
        entry_pos = pos + header_size
        container_end = entry_pos + body_size
        if container_end > end:
            raise IOFailure(f"{reader.label}: fat-binary container at offset {pos} runs past the end of .nv_fatbin.")
        seen = False
        while entry_pos + _ENTRY_MIN <= container_end:
            raw = reader.read_at(entry_pos, _ENTRY_MIN)
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", raw, 0)
            if entry_header < _ENTRY_MIN:
                break
            _minor, _major, sm = struct.unpack_from("<HHI", raw, 24)
            (flags,) = struct.unpack_from("<Q", raw, 40)
            (uncompressed,) = struct.unpack_from("<Q", raw, 56)
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            kind_name = "ptx" if kind == KIND_PTX else "sass" if kind in (KIND_ELF, KIND_ELF_ALT) else "other"
            compressed = bool(flags & (FLAG_COMPRESSED_LEGACY | FLAG_COMPRESSED_ZSTD))
            yield (
                index,
                FatbinEntry(
                    kind_name, sm, variant, flags, payload, uncompressed if compressed and uncompressed else None
                ),
            )
            seen = True
            entry_pos += entry_header + payload
        if not seen:
            yield index, None
        index += 1
        pos = container_end


def _read_library(stream: BinaryIO, size: int, label: str, path: Path, wheel: Path | None) -> LibraryArchs:
    reader = elf.Reader(stream, size, label)
    table = elf.read_sections(reader)
    links = dynlinks.links_of(reader, table)  # .dynamic and .dynsym lie before .nv_fatbin: one forward pass
    sections = [s for s in table if s.name == ".nv_fatbin" and s.size > 0]
    sass: dict[str, int] = {}
    ptx: set[str] = set()
    sass_bytes: dict[str, int] = {}
    ptx_bytes: dict[str, int] = {}
    containers: set[tuple[int, int]] = set()
    entries = compressed = 0
    for number, section in enumerate(sorted(sections, key=lambda s: s.offset)):
        for index, entry in _parse_fatbin(reader, section):
            containers.add((number, index))
            if entry is None:
                continue
            entries += 1
            compressed += entry.compressed
            if entry.kind == "sass":
                sass[entry.arch] = sass.get(entry.arch, 0) + 1
                sass_bytes[entry.arch] = sass_bytes.get(entry.arch, 0) + entry.stored_size
            elif entry.kind == "ptx":
                ptx.add(entry.arch)
                ptx_bytes[entry.arch] = ptx_bytes.get(entry.arch, 0) + entry.stored_size
    return LibraryArchs(
        path=path,
        sass=tuple(sorted(sass, key=arch_sort_key)),
        ptx=tuple(sorted(ptx, key=arch_sort_key)),
        wheel=wheel,
        size=size,
        containers=len(containers),
        entries=entries,
        compressed_entries=compressed,
        sass_counts=tuple(sorted(sass.items(), key=lambda kv: arch_sort_key(kv[0]))),
        sass_bytes=tuple(sorted(sass_bytes.items(), key=lambda kv: arch_sort_key(kv[0]))),
        ptx_bytes=tuple(sorted(ptx_bytes.items(), key=lambda kv: arch_sort_key(kv[0]))),
        fatbin_bytes=sum(s.size for s in sections),
        links=links,
    )


def arch_sort_key(arch: str) -> tuple[int, str]:
    """``sm_80`` < ``sm_90`` < ``sm_90a`` < ``sm_100f`` < ``sm_120`` < ``sm_120a``."""
    body = arch.removeprefix("sm_").removeprefix("compute_")
    digits = "".join(c for c in body if c.isdigit())
    return (int(digits) if digits else 0, body[len(digits) :])


# -- public entry points ---------------------------------------------------------------------------------
def inspect_library(path: Path) -> LibraryArchs:
    """Architectures carried by one ELF file (``.so`` or ``.o``)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            return _read_library(handle, size, str(path), path, None)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder; use inspect_path for folders.") from None
    except PermissionError as exc:
        raise IOFailure(f"Cannot read {path}: {exc.strerror}.") from exc


def inspect_wheel(path: Path) -> tuple[LibraryArchs, ...]:
    """Every shared library inside a wheel, read from the zip without unpacking it to disk."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist.") from None
    except zipfile.BadZipFile:
        raise UsageError(f"{path} is not a wheel (not a zip archive).") from None
    results = []
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.is_dir() or not elf.is_library_member(info.filename):
                continue
            with archive.open(info) as member:
                head = member.read(4)
            if head != elf.ELF_MAGIC:
                continue
            with archive.open(info) as member:
                stream = member if member.seekable() else io.BytesIO(member.read())
                results.append(
                    _read_library(stream, info.file_size, f"{path}!{info.filename}", Path(info.filename), path)
                )
    return tuple(results)


def inspect_path(path: Path) -> tuple[LibraryArchs, ...]:
    """A library, a wheel, or a folder (every ``.so`` below it and every wheel directly in it)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.", hint="Pass a .so file, a .whl file, or a folder holding them.")
    if path.is_dir():
        found: list[LibraryArchs] = []
        for item in sorted(path.rglob("*")):
            if item.is_file() and elf.is_library_member(item.name) and _looks_like_elf(item):
                found.append(inspect_library(item))
        for wheel in sorted(path.glob("*.whl")):
            found.extend(inspect_wheel(wheel))
        return tuple(found)
    if path.suffix == ".whl":
        return inspect_wheel(path)
    return (inspect_library(path),)


def _looks_like_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == elf.ELF_MAGIC
    except OSError:
        return False
