"""A small ELF reader: segments, function symbols, interpreter, debug info presence."""

from __future__ import annotations

import bisect
import mmap
import os
import re
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property

from leaktrace.platform.target_files import open_regular

PT_LOAD, PT_INTERP, PT_NOTE, PT_TLS = 1, 3, 4, 7
PF_X = 1  # an executable segment
NT_GNU_BUILD_ID = 3
SHT_SYMTAB, SHT_NOBITS, SHT_DYNSYM, SHT_GNU_HASH = 2, 8, 11, 0x6FFFFFF6
STT_OBJECT, STT_FUNC, STT_TLS, STT_GNU_IFUNC = 1, 2, 6, 10
STB_LOCAL = 0
SHN_UNDEF = 0
FileIdentity = tuple[int, int, int, int]  # (device, inode, mtime in ns, size): one version of one file


class ElfError(ValueError):
    pass


@dataclass(frozen=True)
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int


def _defined(info: int, shndx: int, value: int, types: tuple[int, ...] = (STT_FUNC, STT_GNU_IFUNC)) -> bool:
    """A symbol table entry defines a symbol of one of these types (functions by default)."""
    return (info & 0xF) in types and shndx != SHN_UNDEF and value != 0


class ElfFile:
    """Parses an ELF file's headers and symbol tables from disk, lazily."""

    def __init__(self, path: str, fd: int | None = None):
        """path names the file, and is opened (a regular file only) unless fd is given: a
        descriptor the caller opened (with a target's rights), which the ElfFile owns from then on."""
        self.path = path
        self.fd = -1
        # A separate debug file whose symbols name this file's functions (a stripped program's).
        self.symbol_file: ElfFile | None = None
        try:  # paths come from targets' maps and dumps: a FIFO or a device is refused, never waited on
            self.fd = open_regular(path) if fd is None else fd
            st = os.fstat(self.fd)
            self.identity: FileIdentity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            self._data = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            self.close()
            raise ElfError(f"{path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from e
        if self._data[:4] != b"\x7fELF" or len(self._data) < 64:
            self.close()
            raise ElfError(f"{path}: not an ELF file")
        self.is_64 = self._data[4] == 2
        if self._data[5] != 1:
            self.close()
            raise ElfError(f"{path}: big-endian ELF is not supported")
        hdr = struct.unpack_from("<HHIQQQIHHHHHH" if self.is_64 else "<HHIIIIIHHHHHH", self._data, 16)
        (
            self.type,
            self.machine,
            _,
            self.entry,
            self._phoff,
            self._shoff,
            _,
            _,
            self._phentsize,
            self._phnum,
            self._shentsize,
            self._shnum,
            self._shstrndx,
        ) = hdr

    @property
    def descriptor(self) -> str:
        """A path to this very file, for this process and for the programs it starts with pass_fds=(fd,)."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()

    def _cstring(self, offset: int) -> str:
        end = self._data.find(b"\0", offset)
        return self._data[offset:end].decode("utf-8", "replace")

    @cached_property
    def segments(self) -> tuple[Segment, ...]:
        result = []
        for i in range(self._phnum):
            at = self._phoff + i * self._phentsize
            if self.is_64:
                p_type, p_flags, off, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", self._data, at)
            else:
                p_type, off, vaddr, _, filesz, memsz, p_flags, _ = struct.unpack_from("<IIIIIIII", self._data, at)
            result.append(Segment(p_type, p_flags, off, vaddr, filesz, memsz))
        return tuple(result)

    @cached_property
    def _sections(self) -> list[tuple[str, int, int, int, int, int]]:
        """(name, type, offset, size, link, entsize) for each section."""
        raw = []
        for i in range(self._shnum):
            at = self._shoff + i * self._shentsize
            if self.is_64:
                name, typ, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", self._data, at)
            else:
                name, typ, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIIIIIIIII", self._data, at)
            raw.append((name, typ, off, size, link, entsize))
        if not raw or self._shstrndx >= len(raw):
            return []
        names_at = raw[self._shstrndx][2]
        return [(self._cstring(names_at + r[0]), *r[1:]) for r in raw]

    def section_names(self) -> set[str]:
        return {s[0] for s in self._sections}

    def section_bytes(self, name: str) -> tuple[bytes, int] | None:
        """A section's bytes and the address they are loaded at (None: no such section in the file,
        or one outside every segment)."""
        for section, typ, offset, size, _, _ in self._sections:
            if section == name and typ != SHT_NOBITS and offset + size <= len(self._data):
                address = self.file_offset_to_vaddr(offset)
                return None if address is None else (bytes(self._data[offset : offset + size]), address)
        return None

    def file_section(self, name: str, limit: int) -> bytes | None:
        """The bytes of a section as the file holds them, loaded or not (.gnu_debugdata is not);
        None when there is none, or it is larger than limit."""
        for section, typ, offset, size, _, _ in self._sections:
            if section == name and typ != SHT_NOBITS and size <= limit and offset + size <= len(self._data):
                return bytes(self._data[offset : offset + size])
        return None

    @cached_property
    def build_id(self) -> str | None:
        """The GNU build-id note's bytes, in hexadecimal (as debug file names and tools spell it)."""
        for seg in self.segments:
            if seg.type != PT_NOTE:
                continue
            at, end = seg.offset, min(seg.offset + seg.filesz, len(self._data))
            while at + 12 <= end:
                name_size, desc_size, kind = struct.unpack_from("<III", self._data, at)
                name_at = at + 12
                desc_at = name_at + (name_size + 3) // 4 * 4
                at = desc_at + (desc_size + 3) // 4 * 4
                if at > end:
                    break
                if kind == NT_GNU_BUILD_ID and self._data[name_at : name_at + name_size] == b"GNU\0" and desc_size:
                    return self._data[desc_at : desc_at + desc_size].hex()
        return None

    @property
    def interpreter(self) -> str | None:
        for seg in self.segments:
            if seg.type == PT_INTERP:
                return self._data[seg.offset : seg.offset + seg.filesz].rstrip(b"\0").decode()
        return None

    def _symbols_of(
        self, section_type: int, types: tuple[int, ...] = (STT_FUNC, STT_GNU_IFUNC), linked_only: bool = False
    ) -> list[tuple[Symbol, int]]:
        """Defined symbols of one table (functions unless types says otherwise), with their
        section index; linked_only: global and weak ones alone (no file's static function)."""
        result = []
        for _, typ, off, size, link, entsize in self._sections:
            if typ != section_type or not entsize:
                continue
            strtab = self._sections[link][2]
            for at in range(off, off + size, entsize):
                if self.is_64:
                    name, info, _, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", self._data, at)
                else:
                    name, value, sym_size, info, _, shndx = struct.unpack_from("<IIIBBH", self._data, at)
                if _defined(info, shndx, value, types) and not (linked_only and info >> 4 == STB_LOCAL):
                    result.append((Symbol(self._cstring(strtab + name), value, sym_size), shndx))
        return result

    @cached_property
    def dynamic_functions(self) -> dict[str, int]:
        """Exported function name -> address (link-time virtual address)."""
        return {sym.name.split("@")[0]: sym.value for sym, _ in self._symbols_of(SHT_DYNSYM)}

    def take_symbols_from(self, debug: ElfFile | None) -> None:
        """Names this file's functions (their extents too) by debug's symbols: a stripped
        program's separate debug file, of the same build."""
        self.symbol_file = debug
        self.__dict__.pop("_function_index", None)

    @cached_property
    def linked_functions(self) -> dict[str, int]:
        """The functions of .symtab by name -> address: global and weak ones, then a local one
        where its name is that of no other (a static-pie's malloc is local: glibc hides it)."""
        found = {sym.name: sym.value for sym, _ in self._symbols_of(SHT_SYMTAB, linked_only=True)}
        locals_: dict[str, set[int]] = {}
        for sym, _ in self._symbols_of(SHT_SYMTAB):
            if sym.name not in found:
                locals_.setdefault(sym.name, set()).add(sym.value)
        found.update((name, addresses.pop()) for name, addresses in locals_.items() if len(addresses) == 1)
        return found

    @property
    def probe_functions(self) -> dict[str, int]:
        """Name -> address of the functions where this module's allocator is probed: a
        library's exports; for a program with its allocator linked in (static, or its malloc
        kept to itself), the functions of its .symtab, else of symbol_file's."""
        exported = self.dynamic_functions
        if "malloc" in exported:
            return exported
        for source in (self, self.symbol_file):
            if source is not None and "malloc" in source.linked_functions:
                return source.linked_functions
        return exported

    def exports_function(self, name: str) -> bool:
        """Whether the library exports a function of this name: one probe of the GNU hash
        table (a full symbol read of libLLVM takes Python a second), else every symbol."""
        table = next((s for s in self._sections if s[1] == SHT_GNU_HASH), None)
        if table is None or not self.is_64:
            return name in self.dynamic_functions
        wanted = 5381
        for byte in name.encode():
            wanted = (wanted * 33 + byte) & 0xFFFFFFFF
        try:
            _, _, off, _, dynsym_index, _ = table
            _, _, symbols_at, _, strtab_index, entsize = self._sections[dynsym_index]
            strings_at = self._sections[strtab_index][2]
            buckets, first_hashed, bloom_words, _ = struct.unpack_from("<IIII", self._data, off)
            buckets_at = off + 16 + 8 * bloom_words
            chain_at = buckets_at + 4 * buckets
            (index,) = struct.unpack_from("<I", self._data, buckets_at + 4 * (wanted % buckets))
            while index >= first_hashed:  # bucket 0: none of the symbols has this hash
                (chained,) = struct.unpack_from("<I", self._data, chain_at + 4 * (index - first_hashed))
                if chained | 1 == wanted | 1:
                    name_at, info, _, shndx, value = struct.unpack_from(
                        "<IBBHQ", self._data, symbols_at + index * entsize
                    )
                    if _defined(info, shndx, value) and self._cstring(strings_at + name_at) == name:
                        return True
                if chained & 1:  # the chain's last symbol
                    return False
                index += 1
            return False
        except (struct.error, IndexError, ZeroDivisionError):
            raise ElfError(f"{self.path}: damaged GNU hash table") from None

    @cached_property
    def dynamic_objects(self) -> dict[str, int]:
        """Exported variable name -> address (link-time virtual address)."""
        return {sym.name.split("@")[0]: sym.value for sym, _ in self._symbols_of(SHT_DYNSYM, (STT_OBJECT,))}

    @cached_property
    def variables(self) -> dict[str, int]:
        """Every variable of either symbol table (locals too, as a debug file has them) -> its
        link-time address, or for a thread-local one its offset in the module's TLS block."""
        return {
            sym.name.split("@")[0]: sym.value
            for table in (SHT_SYMTAB, SHT_DYNSYM)
            for sym, _ in self._symbols_of(table, (STT_OBJECT, STT_TLS))
        }

    def read_file_bytes(self, pattern: bytes) -> bytes | None:
        """The first match of a regular expression over the whole file (a version string)."""
        found = re.search(pattern, self._data)
        return found.group(0) if found else None

    @cached_property
    def _function_index(self) -> tuple[list[int], list[Symbol]]:
        by_addr: dict[int, Symbol] = {}
        named = self._symbols_of(SHT_DYNSYM) + self._symbols_of(SHT_SYMTAB)
        if self.symbol_file is not None:
            named += self.symbol_file._symbols_of(SHT_SYMTAB)
        for sym, _ in named:
            known = by_addr.get(sym.value)
            # Prefer a sized, public-looking name among aliases (malloc over __libc_malloc).
            if known is None or (sym.size, -sym.name.startswith("_")) > (known.size, -known.name.startswith("_")):
                by_addr[sym.value] = sym
        starts = sorted(by_addr)
        return starts, [by_addr[s] for s in starts]

    def extents_of(self, names: tuple[str, ...]) -> list[tuple[int, int]]:
        """[start, end) of each sized function of these names its symbols hold (locals too)."""
        return [(sym.value, sym.value + sym.size) for sym in self._function_index[1] if sym.name in names and sym.size]

    def function_at(self, vaddr: int) -> Symbol | None:
        starts, symbols = self._function_index
        i = bisect.bisect_right(starts, vaddr) - 1
        if i < 0:
            return None
        sym = symbols[i]
        if sym.size and vaddr >= sym.value + sym.size:
            return None
        return sym

    def segment_containing(self, vaddr: int) -> Segment | None:
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.vaddr <= vaddr < seg.vaddr + seg.memsz:
                return seg
        return None

    def read(self, vaddr: int, size: int) -> bytes:
        """Bytes of the file image at a link-time address (up to the end of its segment)."""
        seg = self._file_segment(vaddr)
        start = seg.offset + vaddr - seg.vaddr
        return bytes(self._data[start : min(start + size, seg.offset + seg.filesz)])

    def vaddr_to_file_offset(self, vaddr: int) -> int:
        """Where the file holds a link-time address of its code (uprobes are placed by file offset)."""
        seg = self._file_segment(vaddr)
        return seg.offset + vaddr - seg.vaddr

    def _file_segment(self, vaddr: int) -> Segment:
        """The loaded segment whose file contents hold vaddr."""
        seg = self.segment_containing(vaddr)
        if seg is None or vaddr - seg.vaddr >= seg.filesz:
            raise ElfError(f"{self.path}: no file contents at {vaddr:#x}")
        return seg

    def file_offset_to_vaddr(self, file_offset: int) -> int | None:
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.offset <= file_offset < seg.offset + max(seg.filesz, 1):
                return file_offset - seg.offset + seg.vaddr
        return None

    @property
    def has_debug_lines(self) -> bool:
        return ".debug_line" in self.section_names()

    @property
    def has_symtab(self) -> bool:
        """Local symbols (static functions, main) are here: the file was not stripped."""
        return ".symtab" in self.section_names()

    @cached_property
    def debuglink(self) -> tuple[str, int] | None:
        """.gnu_debuglink: the separate debug file's name and its CRC-32."""
        section = next((s for s in self._sections if s[0] == ".gnu_debuglink"), None)
        if section is None:
            return None
        _, _, offset, size, _, _ = section
        data = bytes(self._data[offset : offset + size])
        name, _, _ = data.partition(b"\0")
        crc_at = (len(name) + 1 + 3) // 4 * 4
        if not name or crc_at + 4 > len(data):
            return None
        return name.decode("utf-8", "replace"), struct.unpack_from("<I", data, crc_at)[0]

    def crc32(self) -> int:
        return zlib.crc32(self._data)
