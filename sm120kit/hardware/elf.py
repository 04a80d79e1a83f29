"""The ELF section table of a library, read at random offsets from a file or a zip member.

:mod:`sm120kit.hardware.fatbin` (device code in ``.nv_fatbin``) and :mod:`sm120kit.hardware.dynlinks`
(``NEEDED`` libraries and undefined symbols) both read a library through one :class:`Reader` and one
:func:`read_sections`: ``build-kernel`` reads each library of its wheel once for both. 64-bit little-endian
files only (x86-64 and aarch64); every offset and size is checked against the file, as a wheel's members are
input like any other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

from sm120kit.errors import IOFailure, UsageError

ELF_MAGIC = b"\x7fELF"
SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 6, 8, 11
_TAIL_WINDOW = 1 << 20  # bytes before the section header table kept when reading a compressed member


def is_library_member(name: str) -> bool:
    """A shared library by its name (``x.so``, ``x.so.1``), the last path part of a file or wheel member."""
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".so") or ".so." in base


class Reader:
    """``read_at(offset, n)`` over a seekable stream, cheap for forward reads.

    A deflated zip member can only be read forwards (a backward seek decompresses again from the start),
    so callers order their reads: ELF header, section table (with a window before it kept in memory),
    then the sections they need in file order.
    """

    def __init__(self, stream: BinaryIO, size: int, label: str) -> None:
        self.stream = stream
        self.size = size
        self.label = label
        self.window_start = 0
        self.window = b""

    def keep_window(self, start: int, end: int) -> None:
        start, end = max(0, start), min(self.size, end)
        self.window_start = start
        self.window = self._raw(start, end - start)

    def read_at(self, offset: int, n: int) -> bytes:
        if self.window and self.window_start <= offset and offset + n <= self.window_start + len(self.window):
            rel = offset - self.window_start
            return self.window[rel : rel + n]
        return self._raw(offset, n)

    def _raw(self, offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > self.size:
            raise IOFailure(f"{self.label}: truncated file (wanted bytes {offset}..{offset + n} of {self.size}).")
        self.stream.seek(offset)
        data = self.stream.read(n)
        if len(data) != n:
            raise IOFailure(f"{self.label}: truncated file (read {len(data)} of {n} bytes at {offset}).")
        return data


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    offset: int
    size: int  # bytes in the file (0 for SHT_NOBITS, which occupies none)
    link: int  # the index of a related section (the string table of .dynamic and .dynsym)


def read_sections(reader: Reader) -> list[Section]:
    """The section table, in table order."""
    ident = reader.read_at(0, min(64, reader.size))
    if ident[:4] != ELF_MAGIC or len(ident) < 64:
        raise UsageError(
            f"{reader.label} is not an ELF file (a Linux shared library such as common_ops.abi3.so was expected)."
        )
    if ident[4] != 2 or ident[5] != 1:
        raise UsageError(
            f"{reader.label} is not a 64-bit little-endian ELF file; only x86-64 and aarch64 libraries are read."
        )
    (shoff,) = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if shoff == 0 or shnum == 0:
        return []
    if shentsize < 64:
        raise IOFailure(f"{reader.label}: unexpected ELF section header size {shentsize}.")
    if shoff + shnum * shentsize > reader.size:
        raise IOFailure(
            f"{reader.label}: truncated file: the ELF section table lies outside the file (bytes {shoff}.."
            f"{shoff + shnum * shentsize} of {reader.size})."
        )
    reader.keep_window(shoff - _TAIL_WINDOW, shoff + shnum * shentsize)
    table = reader.read_at(shoff, shnum * shentsize)
    raw = [struct.unpack_from("<IIQQQQI", table, i * shentsize) for i in range(shnum)]
    if shstrndx >= shnum:
        raise IOFailure(f"{reader.label}: ELF section-name table index {shstrndx} is out of range.")
    names = reader.read_at(raw[shstrndx][4], raw[shstrndx][5])
    out = []
    for index, (name_off, sh_type, _flags, _addr, offset, size, link) in enumerate(raw):
        end = names.find(b"\0", name_off)
        name = names[name_off : end if end >= 0 else None].decode("ascii", "replace")
        out.append(Section(index, name, sh_type, offset, 0 if sh_type == SHT_NOBITS else size, link))
    return out


def section_bytes(reader: Reader, sections: list[Section], index: int) -> bytes:
    """The bytes of section ``index`` (a link read from another section: checked against the table)."""
    if not 0 <= index < len(sections):
        raise IOFailure(f"{reader.label}: an ELF section link ({index}) is out of range.")
    section = sections[index]
    if section.offset + section.size > reader.size:
        raise IOFailure(f"{reader.label}: ELF section {index} runs past the end of the file.")
    return reader.read_at(section.offset, section.size)
