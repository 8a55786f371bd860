"""Unwind tables: a module's call frame information (.eh_frame, else .debug_frame) compiled
into the sorted rows the BPF stack walk searches.

.eh_frame is interpreted by cfi.c (the _cfi module, through ctypes), the interpreter the
preload library walks its stacks with; binutils' `readelf --debug-dump=frames-interp` serves
a module with only .debug_frame, and tests hold both to the same rows. Per address range,
only what an x86-64 walk needs is kept: how to find the CFA (rsp+N, rbp+N), where
the caller's rbp was saved, and where a stack ends (the return address is undefined, as in
_start and clone3). The return address is always at CFA-8 on x86-64. Signal trampolines
(CIE augmentation "S", as glibc's __restore_rt) get a rule of their own: the registers are
in the ucontext on the stack. A range no FDE covers, and a CFA the walk cannot compute (a
DWARF expression), get CFA_UNKNOWN: there the walk tries the frame-pointer chain and checks it.
"""

from __future__ import annotations

import ctypes as ct
import dataclasses
import functools
import hashlib
import os
import re
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import built_here
from leaktrace.platform.atomic_write import write_atomically
from leaktrace.platform.elf import PF_X, PT_LOAD, ElfFile, FileIdentity
from leaktrace.platform.process import Mapping
from leaktrace.platform.safe_directory import open_trusted_directory
from leaktrace.unwind.rows import (  # the rules and rows as the BPF walk reads them
    CFA_END,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNKNOWN,
    CFI_SECTION_ROW,
    EXEC_MAP,
    MAX_FILE_PAGES,
    RBP_SAME,
    RBP_SAVED,
    ROW_PAGE_SHIFT,
    UNWIND_ROW,
)

PAGE = struct.Struct("<II")  # a page's rows: [low, high), counted from the file's first row

_SECTION = re.compile(r"^Contents of the (\.eh_frame|\.debug_frame) section")
_CIE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE \"([^\"]*)\"")
_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_ROW = re.compile(r"^([0-9a-f]{8,16}) +(\S+)((?: +\S+)*) *$")
_OFFSET_RULE = re.compile(r"^(rsp|rbp)\+(\d+)$")
_IN_REGISTER = re.compile(r" \((\w+)\)")


class Rule(NamedTuple):
    cfa_rule: int
    cfa_offset: int = 0
    rbp_rule: int = RBP_SAME
    rbp_offset: int = 0


UNKNOWN = Rule(CFA_UNKNOWN)


@functools.lru_cache(maxsize=4096)
def _rule_of_row(cfa: str, registers: str, columns: tuple[str, ...], signal_frame: bool) -> Rule:
    """The rule of a row of readelf's table (its CFA column and the register columns after it);
    rows repeat a few rules many times over, so each is worked out once."""
    # A register kept in another prints as "r10 (r10)": one column, whose space must not split it.
    return _rule(cfa, dict(zip(columns, _IN_REGISTER.sub(r"(\1)", registers).split())), signal_frame)


def _rule(cfa: str, columns: dict[str, str], signal_frame: bool) -> Rule:
    if signal_frame:
        return Rule(CFA_SIGNAL)
    if columns.get("ra") == "u":
        return Rule(CFA_END)
    found = _OFFSET_RULE.match(cfa)
    if not found or columns.get("ra", "c-8") != "c-8" or int(found.group(2)) >= 1 << 31:
        return UNKNOWN
    rbp = columns.get("rbp", "u")
    saved = re.fullmatch(r"c(-?\d+)", rbp)
    if rbp not in ("u", "s") and not (saved and -(1 << 15) <= int(saved.group(1)) < 1 << 15):
        return UNKNOWN  # rbp kept in another register, or by an expression: not followed
    return Rule(
        CFA_RSP if found.group(1) == "rsp" else CFA_RBP,
        int(found.group(2)),
        RBP_SAVED if saved else RBP_SAME,
        int(saved.group(1)) if saved else 0,
    )


def parse_frames_interp(text: str) -> list[tuple[int, int, list[tuple[int, Rule]]]]:
    """readelf's interpreted CFI -> [(start, end, [(pc, rule)])] per FDE, from .eh_frame if it
    has any, else from .debug_frame."""
    by_section: dict[str, list[tuple[int, int, list[tuple[int, Rule]], bool, Rule | None]]] = {}
    cies: dict[str, tuple[bool, Rule | None]] = {}  # offset -> (signal frame, initial rule)
    section, fdes = "", []
    current: list[tuple[int, Rule]] | None = None  # the rows of the FDE (or CIE) being read
    columns: tuple[str, ...] = ()
    cie_offset = None
    for line in text.splitlines():
        if found := _SECTION.match(line):
            section = found.group(1)
            fdes = by_section.setdefault(section, [])
            cies = {}
            current = None
        elif found := _CIE.match(line):
            cie_offset = found.group(1)
            cies[cie_offset] = ("S" in found.group(2), None)
            current = None
        elif found := _FDE.match(line):
            signal_frame, initial = cies.get(found.group(1), (False, None))
            start, end = int(found.group(2), 16), int(found.group(3), 16)
            current = []
            fdes.append((start, end, current, signal_frame, initial))
            cie_offset = None
        elif line.endswith(" ZERO terminator"):  # a section's end, not a row
            current = None
        elif line.startswith("   LOC"):
            columns = tuple(line.split()[2:])
        elif (found := _ROW.match(line)) and columns:
            if cie_offset is not None and cies.get(cie_offset, (False, None))[1] is None:
                signal_frame = cies[cie_offset][0]
                cies[cie_offset] = (signal_frame, _rule_of_row(found.group(2), found.group(3), columns, signal_frame))
            elif current is not None:
                signal_frame = fdes[-1][3]
                current.append(
                    (int(found.group(1), 16), _rule_of_row(found.group(2), found.group(3), columns, signal_frame))
                )
    chosen = by_section.get(".eh_frame") or by_section.get(".debug_frame") or []
    result = []
    for start, end, rows, signal_frame, initial in chosen:
        if not rows:  # no instructions of its own: the CIE's initial rule holds throughout
            rows = [(start, Rule(CFA_SIGNAL) if signal_frame else initial or UNKNOWN)]
        result.append((start, end, rows))
    return result


@functools.cache
def _cfi_module() -> ct.CDLL:
    """cfi.c as pip install built it, for ctypes."""
    found = built_here(Path(__file__).parent, "_cfi")
    if found is None:
        raise RuntimeFailure("leaktrace's CFI module is not built: reinstall leaktrace (pip install)")
    module = ct.CDLL(found)
    module.cfi_section_rows.restype = ct.c_long
    module.cfi_section_rows.argtypes = [ct.c_char_p, ct.c_size_t, ct.c_uint64, ct.c_void_p, ct.c_size_t]
    return module


def section_rows(data: bytes, address: int) -> list[tuple[int, ...]]:
    """cfi.c's rows of an .eh_frame section loaded at address: (FDE start, FDE end, pc, CFA
    offset, rbp offset, CFA rule, rbp rule), FDE after FDE."""
    room = len(data) // 4 + 1024
    while True:
        out = ct.create_string_buffer(room * CFI_SECTION_ROW.size)
        count = _cfi_module().cfi_section_rows(data, len(data), address, out, room)
        if count >= 0:
            return list(CFI_SECTION_ROW.iter_unpack(out.raw[: count * CFI_SECTION_ROW.size]))
        room *= 2


def compile_eh_frame(elf: ElfFile) -> list[tuple[int, int, list[tuple[int, Rule]]]] | None:
    """The module's .eh_frame as [(start, end, [(pc, rule)])] per FDE, as parse_frames_interp
    gives readelf's; None when it has no .eh_frame with an FDE."""
    section = elf.section_bytes(".eh_frame")
    if section is None:
        return None
    fdes: list[tuple[int, int, list[tuple[int, Rule]]]] = []
    for start, end, pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule in section_rows(*section):
        if not fdes or fdes[-1][:2] != (start, end):  # the next FDE
            fdes.append((start, end, []))
        fdes[-1][2].append((pc, Rule(cfa_rule, cfa_offset, rbp_rule, rbp_offset)))
    return fdes or None


def readelf_frames(elf: ElfFile) -> str:
    """readelf's interpreted CFI of the module (it exits 1 over warnings some libraries give,
    libc's among them, with its table whole)."""
    return subprocess.run(
        ["readelf", "--wide", "--debug-dump=frames-interp", elf.descriptor],
        capture_output=True,
        text=True,
        check=False,
        pass_fds=(elf.fd,),
    ).stdout


def clip_to_code(
    fdes: list[tuple[int, int, list[tuple[int, Rule]]]], code: list[tuple[int, int]]
) -> tuple[list[tuple[int, int, list[tuple[int, Rule]]]], int]:
    """The FDEs as far as they describe the module's own code (its executable segments, [start,
    end) each): one that runs past its segment is cut at the segment's end, one outside every
    segment dropped, so that a forged pc_range (0x7fffffff) costs nothing in proportion to it.
    Returns them with the number cut or dropped."""
    kept, refused = [], 0
    for start, end, rows in fdes:
        segment_end = next((high for low, high in code if low <= start < high), None)
        if segment_end is None:
            refused += 1
            continue
        if end > segment_end:
            refused += 1
            end = segment_end
        kept.append((start, end, [(pc, rule) for pc, rule in rows if pc < end]))
    return kept, refused


def code_ranges(elf: ElfFile) -> list[tuple[int, int]]:
    """The module's executable segments, as [start, end) of link-time addresses."""
    return [(s.vaddr, s.vaddr + s.memsz) for s in elf.segments if s.type == PT_LOAD and s.flags & PF_X]


def compile_rows(fdes: list[tuple[int, int, list[tuple[int, Rule]]]]) -> list[tuple[int, Rule]]:
    """One sorted list of (pc, rule): each rule holds from its pc to the next row's; a range no
    FDE covers is CFA_UNKNOWN; equal neighbours merged."""
    rows: list[tuple[int, Rule]] = []
    fdes = sorted(fdes, key=lambda fde: fde[0])
    for i, (start, end, fde_rows) in enumerate(fdes):
        for pc, rule in fde_rows:
            if start <= pc < end:
                rows.append((pc, rule))
        following = fdes[i + 1][0] if i + 1 < len(fdes) else None
        if following is None or following > end:
            rows.append((end, UNKNOWN))
    merged: list[tuple[int, Rule]] = []
    for pc, rule in rows:
        if merged and merged[-1][0] == pc:
            merged[-1] = (pc, rule)  # a later FDE starts where one ended
        elif not merged or merged[-1][1] != rule:
            merged.append((pc, rule))
    return merged


@dataclass(frozen=True)
class FileTable:
    """A file's rows, packed as the kernel's row table holds them, and their page index: for
    each 2^page_shift bytes from page_origin on, the rows that can hold the rule of an
    address there: from the one in effect where the page starts to the one where the next does."""

    rows: bytes
    pages: bytes
    page_origin: int
    page_shift: int = ROW_PAGE_SHIFT  # at most MAX_FILE_PAGES pages, however large the module
    refused: int = 0  # FDEs cut or dropped: they reached outside the module's code

    @property
    def row_count(self) -> int:
        return len(self.rows) // UNWIND_ROW.size

    @property
    def page_count(self) -> int:
        return len(self.pages) // PAGE.size


def file_table(rows: list[tuple[int, Rule]]) -> FileTable:
    """Rows packed for the kernel, and their page index."""
    rows = [(pc, rule) for pc, rule in rows if pc < 1 << 32]
    packed = b"".join(
        UNWIND_ROW.pack(pc, rule.cfa_offset, rule.rbp_offset, rule.cfa_rule, rule.rbp_rule) for pc, rule in rows
    )
    if not rows:
        return FileTable(b"", b"", 0)
    shift = ROW_PAGE_SHIFT
    while (rows[-1][0] - (rows[0][0] >> shift << shift)) >> shift >= MAX_FILE_PAGES:
        shift += 1
    origin = rows[0][0] >> shift << shift
    starts, row = [], 0  # the row in effect where each page starts
    for page in range(((rows[-1][0] - origin) >> shift) + 1):
        start = origin + (page << shift)
        while row + 1 < len(rows) and rows[row + 1][0] <= start:
            row += 1
        starts.append(row)
    ends = [following + 1 for following in starts[1:]] + [len(rows)]
    return FileTable(packed, b"".join(PAGE.pack(low, high) for low, high in zip(starts, ends)), origin, shift)


CACHE_FORMAT = 5  # of the cache's files: bump whenever the rows a file compiles to change
CACHE_HEADER = struct.Struct("<4sIIIIII")  # magic, format, page origin, page shift, rows, pages, FDEs refused
CACHE_KEEP = 1000  # cache files kept: the least recently used go first
CACHE_FILE_LIMIT = 64 << 20  # a larger cache file is not read (the kernel's tables hold less)
# The names leaktrace gives cache files (this format's, and the build-ids and file identities
# of earlier ones): pruning removes these and nothing else.
CACHE_FILE_NAME = re.compile(r"(?:[0-9a-f]{2,128}|\d+-\d+-\d+-\d+)\.v\d+")
CFI_SECTIONS = (".eh_frame", ".debug_frame")  # what a module's rows are compiled from


def cfi_digest(elf: ElfFile, walk_ends: tuple[tuple[int, int], ...] = ()) -> str:
    """What a module's rows are a function of: its CFI sections' bytes and load addresses,
    and the functions where walks end, hashed. A target chooses its build-id, so a build-id
    is no proof that two files compile to the same rows; this digest is."""
    digest = hashlib.sha256(CACHE_HEADER.pack(b"LTUW", CACHE_FORMAT, 0, 0, 0, 0, 0))
    for start, end in walk_ends:
        digest.update(struct.pack("<QQ", start, end))
    for start, end in code_ranges(elf):  # the rows are clipped to them
        digest.update(struct.pack("<QQ", start, end))
    for name in CFI_SECTIONS:
        section = elf.section_bytes(name)
        data, address = section if section else (b"", 0)
        digest.update(struct.pack("<8sQQ", name.encode(), address, len(data)))
        digest.update(data)
    return digest.hexdigest()


class TableCache:
    """Compiled tables on disk, one file per module, named by the digest of the sections
    they come from, so that a module seen at an earlier start is not compiled again. The
    directory and every directory above it is root's (or leaktrace's user's) and writable by
    nobody else: tables steer the kernel's walk, so a directory anybody else could write or
    redirect (a symlink at any component) is not used. Files are opened relative to the
    directory's descriptor, and pruning removes only files named as leaktrace names them."""

    def __init__(self, directory: str):
        self.directory = directory
        try:
            self._fd: int | None = open_trusted_directory(os.path.abspath(directory), create_mode=0o700)
        except RuntimeFailure as e:
            self._fd = None
            self.refused = str(e)  # why the cache is not used, for -v

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    @staticmethod
    def _name(digest: str) -> str:
        return f"{digest}.v{CACHE_FORMAT}"

    def load(self, digest: str) -> FileTable | None:
        """The table compiled from sections of this digest, if the cache holds a whole one."""
        if self._fd is None:
            return None
        try:
            fd = os.open(
                self._name(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._fd
            )
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > CACHE_FILE_LIMIT:
                return None
            data = f.read(CACHE_FILE_LIMIT)
            os.utime(fd)  # recently used
        if len(data) < CACHE_HEADER.size:
            return None
        magic, version, origin, shift, rows, pages, refused = CACHE_HEADER.unpack_from(data)
        body = data[CACHE_HEADER.size :]
        if (magic, version) != (b"LTUW", CACHE_FORMAT) or len(body) != rows * UNWIND_ROW.size + pages * PAGE.size:
            return None
        if not ROW_PAGE_SHIFT <= shift < 32 or pages > MAX_FILE_PAGES:
            return None
        return FileTable(body[: rows * UNWIND_ROW.size], body[rows * UNWIND_ROW.size :], origin, shift, refused)

    def store(self, digest: str, table: FileTable) -> None:
        if self._fd is None:
            return
        header = CACHE_HEADER.pack(
            b"LTUW",
            CACHE_FORMAT,
            table.page_origin,
            table.page_shift,
            table.row_count,
            table.page_count,
            table.refused,
        )
        try:
            write_atomically(self._name(digest), header + table.rows + table.pages, dir_fd=self._fd)
            self._prune()
        except (RuntimeFailure, OSError):
            pass  # a cache that cannot be written only costs the next start its compile

    def _prune(self) -> None:
        """Removes the least recently used of leaktrace's own files past CACHE_KEEP."""
        assert self._fd is not None
        own = []
        with os.scandir(self._fd) as entries:
            for entry in entries:
                if CACHE_FILE_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    own.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
        own.sort()
        for _, name in own[: max(0, len(own) - CACHE_KEEP)]:
            os.unlink(name, dir_fd=self._fd)


class UnwindTables:
    """Compiled rows per file, each compiled once per (device, inode, mtime, size), and kept
    across starts in a TableCache when given one."""

    def __init__(self, cache: TableCache | None = None):
        self._tables: dict[FileIdentity, FileTable] = {}
        self._cache = cache
        self._notices: list[str] = []
        self._walk_ends: dict[FileIdentity, tuple[tuple[int, int], ...]] = {}  # a file -> where stacks begin

    def end_walks_in(self, elf: ElfFile, extents: list[tuple[int, int]]) -> None:
        """The walk ends in these functions of elf (a thread's first frames, with no CFI of
        their own), as where CFI says a stack ends; said before elf's table is made."""
        if extents:
            self._walk_ends[elf.identity] = tuple(sorted(extents))

    def take_notices(self) -> list[str]:
        """What compiling met since the last call (FDEs outside their module's code), each once."""
        notices, self._notices = self._notices, []
        return notices

    @property
    def cache_refused(self) -> str | None:
        """Why the table cache given is not used (its directory is not to be trusted), or None."""
        return None if self._cache is None or self._cache.usable else self._cache.refused

    def table_of(self, elf: ElfFile) -> FileTable:
        """A module file's rows and page index (none when it has no CFI)."""
        if elf.identity not in self._tables:
            ends = self._walk_ends.get(elf.identity, ())
            digest = cfi_digest(elf, ends) if self._cache and self._cache.usable else None
            table = self._cache.load(digest) if self._cache and digest else None
            if table is None:
                fdes, refused = clip_to_code(
                    (compile_eh_frame(elf) or parse_frames_interp(readelf_frames(elf)))
                    + [(start, end, [(start, Rule(CFA_END))]) for start, end in ends],
                    code_ranges(elf),
                )
                table = dataclasses.replace(file_table(compile_rows(fdes)), refused=refused)
                if self._cache and digest:
                    self._cache.store(digest, table)
            if table.refused:
                self._notices.append(f"{elf.path}: {table.refused} FDEs reach outside its code: cut to it")
            self._tables[elf.identity] = table
        return self._tables[elf.identity]


def exec_map_entry(
    mapping: Mapping, elf: ElfFile | None, table: FileTable | None, located: tuple[int, int, int, int]
) -> bytes:
    """An executable mapping as the walk's struct exec_map: its bias (address - module virtual
    address; the address itself when the file is unknown), and where its file's rows and pages
    are in the walk's tables (located: first row, row count, first page, page count)."""
    vaddr = elf.file_offset_to_vaddr(mapping.offset) if elf is not None else None
    if vaddr is None:
        return EXEC_MAP.pack(mapping.start, mapping.end, mapping.start, 0, 0, 0, 0, 0, 0)
    page_origin, page_shift = (table.page_origin, table.page_shift) if table is not None else (0, 0)
    return EXEC_MAP.pack(mapping.start, mapping.end, mapping.start - vaddr, *located, page_origin, page_shift)
