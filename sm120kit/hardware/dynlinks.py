"""What a shared library asks the dynamic loader for: its ``NEEDED`` libraries and its undefined symbols.

``build-kernel`` checks with it that a library that calls the CUDA driver (``cuPointerGetAttribute``,
``cuGreenCtxCreate``, ...) names ``libcuda.so.1``. A link against a ``libcuda.so`` that defines none of those
functions (an empty stub) drops the driver from ``NEEDED`` under ``--as-needed``, and the library then fails
to import with ``undefined symbol: cu...`` unless something else loaded the driver into the global scope first.

Pure Python over the ELF section table (64-bit little-endian, as ``fatbin`` reads), with every offset and count
checked against the file: a wheel's members are input like any other.
"""

from __future__ import annotations

import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sm120kit.errors import IOFailure, UsageError
from sm120kit.hardware import fatbin

_SHT_DYNAMIC, _SHT_DYNSYM = 6, 11
_DT_NEEDED = 1
_MAX_LIBRARY_BYTES = 4 << 30  # a wheel member larger than this is not read
DRIVER_LIBRARY = "libcuda.so.1"
_DRIVER_SYMBOL = re.compile(r"^cu[A-Z][A-Za-z0-9_]{0,80}$")


@dataclass(frozen=True)
class DynamicLinks:
    label: str
    needed: tuple[str, ...]
    undefined: tuple[str, ...]

    @property
    def driver_calls(self) -> tuple[str, ...]:
        """The CUDA driver functions the library leaves to the loader."""
        return tuple(s for s in self.undefined if _DRIVER_SYMBOL.match(s))

    @property
    def driver_unlinked(self) -> bool:
        return bool(self.driver_calls) and DRIVER_LIBRARY not in self.needed


def _string(table: bytes, offset: int, label: str) -> str:
    if not 0 <= offset < len(table):
        raise IOFailure(f"{label}: an ELF string offset ({offset}) lies outside its string table.")
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else None].decode("ascii", "replace")


def read_links(data: bytes, label: str) -> DynamicLinks:
    """``NEEDED`` entries and undefined dynamic symbols of the ELF shared library ``data``."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise UsageError(f"{label} is not an ELF file.")
    if data[4] != 2 or data[5] != 1:
        raise UsageError(f"{label} is not a 64-bit little-endian ELF file.")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shnum == 0:
        return DynamicLinks(label, (), ())
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise IOFailure(f"{label}: the ELF section table lies outside the file.")
    sections = [struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize) for i in range(shnum)]

    def body(index: int) -> bytes:
        if not 0 <= index < shnum:
            raise IOFailure(f"{label}: an ELF section link ({index}) is out of range.")
        offset, size = sections[index][4], sections[index][5]
        if offset + size > len(data):
            raise IOFailure(f"{label}: ELF section {index} runs past the end of the file.")
        return data[offset : offset + size]

    needed: list[str] = []
    undefined: list[str] = []
    for index, (_name, sh_type, _flags, _addr, _offset, _size, link, _info) in enumerate(sections):
        if sh_type == _SHT_DYNAMIC:
            table, strings = body(index), body(link)
            for pos in range(0, len(table) - 15, 16):
                tag, value = struct.unpack_from("<qQ", table, pos)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(_string(strings, value, label))
        elif sh_type == _SHT_DYNSYM:
            table, strings = body(index), body(link)
            for pos in range(24, len(table) - 23, 24):  # entry 0 is the null symbol
                st_name, _st_info, _st_other, st_shndx = struct.unpack_from("<IBBH", table, pos)
                if st_shndx == 0 and st_name:
                    undefined.append(_string(strings, st_name, label).split("@", 1)[0])
    return DynamicLinks(label, tuple(needed), tuple(sorted(set(undefined))))


def wheel_links(wheel: Path) -> tuple[DynamicLinks, ...]:
    """:func:`read_links` of every ELF shared library in a wheel (``.so`` members), read from the zip."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{wheel} is not a readable wheel ({exc}).") from None
    out = []
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.is_dir() or not fatbin.is_library_member(info.filename):
                continue
            if info.file_size > _MAX_LIBRARY_BYTES:
                raise IOFailure(
                    f"{wheel}!{info.filename} is {info.file_size} bytes; libraries over 4 GiB are not read."
                )
            data = archive.read(info)
            if data[:4] == b"\x7fELF":
                out.append(read_links(data, info.filename))
    return tuple(out)
