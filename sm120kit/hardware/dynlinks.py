"""What a shared library asks the dynamic loader for: its ``NEEDED`` libraries and its undefined symbols.

``build-kernel`` checks with it that a library that calls the CUDA driver (``cuPointerGetAttribute``,
``cuGreenCtxCreate``, ...) names ``libcuda.so.1``. A link against a ``libcuda.so`` that defines none of those
functions (an empty stub) drops the driver from ``NEEDED`` under ``--as-needed``, and the library then fails
to import with ``undefined symbol: cu...`` unless something else loaded the driver into the global scope first.

Read through :mod:`sm120kit.hardware.elf` (the section table, then ``.dynamic``, ``.dynsym`` and their string
tables), beside the fat binaries :mod:`sm120kit.hardware.fatbin` reads in the same pass.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass

from sm120kit.errors import IOFailure
from sm120kit.hardware import elf

_DT_NEEDED = 1
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
    reader = elf.Reader(io.BytesIO(data), len(data), label)
    return links_of(reader, elf.read_sections(reader))


def links_of(reader: elf.Reader, sections: list[elf.Section]) -> DynamicLinks:
    """:func:`read_links` through a reader whose section table is read already; each section it needs is read
    once, in file order, so a compressed zip member is read forwards."""
    label = reader.label
    tables = [s for s in sections if s.type in (elf.SHT_DYNAMIC, elf.SHT_DYNSYM)]
    wanted = {s.index for s in tables} | {s.link for s in tables}
    body = {
        index: elf.section_bytes(reader, sections, index)
        for index in sorted(wanted, key=lambda i: sections[i].offset if 0 <= i < len(sections) else -1)
    }
    needed: list[str] = []
    undefined: list[str] = []
    for section in tables:
        table, strings = body[section.index], body[section.link]
        if section.type == elf.SHT_DYNAMIC:
            for pos in range(0, len(table) - 15, 16):
                tag, value = struct.unpack_from("<qQ", table, pos)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(_string(strings, value, label))
        else:
            for pos in range(24, len(table) - 23, 24):  # entry 0 is the null symbol
                st_name, _st_info, _st_other, st_shndx = struct.unpack_from("<IBBH", table, pos)
                if st_shndx == 0 and st_name:
                    undefined.append(_string(strings, st_name, label).split("@", 1)[0])
    return DynamicLinks(label, tuple(needed), tuple(sorted(set(undefined))))
