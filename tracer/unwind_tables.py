"""Unwind tables: a module's call frame information (.eh_frame, else .debug_frame) compiled
into the sorted rows the BPF stack walk searches.

binutils' `readelf --debug-dump=frames-interp` interprets the CFI programs (a parser
binutils keeps right for every compiler's output); this module reads its table and keeps,
per address range, only what an x86-64 walk needs: how to find the CFA (rsp+N, rbp+N), where
the caller's rbp was saved, and where a stack ends (the return address is undefined, as in
_start and clone3). The return address is always at CFA-8 on x86-64. Signal trampolines
(CIE augmentation "S", as glibc's __restore_rt) get a rule of their own: the registers are
in the ucontext on the stack. A range no FDE covers, and a CFA the walk cannot compute (a
DWARF expression), get CFA_UNKNOWN: there the walk tries the frame-pointer chain and checks it.
"""
from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass

from .elf import ElfFile

# Rules, as bpf/leaktrace.bpf.c reads them.
CFA_UNKNOWN, CFA_RSP, CFA_RBP, CFA_END, CFA_SIGNAL = 0, 1, 2, 3, 4
RBP_SAME, RBP_SAVED = 0, 1
ROW = struct.Struct("<IihBB")   # struct unwind_row: pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule

_SECTION = re.compile(r"^Contents of the (\.eh_frame|\.debug_frame) section")
_CIE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE \"([^\"]*)\"")
_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_ROW = re.compile(r"^([0-9a-f]{8,16}) +(\S+)((?: +\S+)*) *$")
_OFFSET_RULE = re.compile(r"^(rsp|rbp)\+(\d+)$")


@dataclass(frozen=True)
class Rule:
    cfa_rule: int
    cfa_offset: int = 0
    rbp_rule: int = RBP_SAME
    rbp_offset: int = 0


UNKNOWN = Rule(CFA_UNKNOWN)


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
        return UNKNOWN   # rbp kept in another register, or by an expression: not followed
    return Rule(CFA_RSP if found.group(1) == "rsp" else CFA_RBP, int(found.group(2)),
                RBP_SAVED if saved else RBP_SAME, int(saved.group(1)) if saved else 0)


def parse_frames_interp(text: str) -> list[tuple[int, int, list[tuple[int, Rule]]]]:
    """readelf's interpreted CFI -> [(start, end, [(pc, rule)])] per FDE, from .eh_frame if it
    has any, else from .debug_frame."""
    by_section: dict[str, list] = {}
    cies: dict[str, tuple[bool, Rule | None]] = {}   # offset -> (signal frame, initial rule)
    section, fdes = "", []
    current: list | None = None       # the rows of the FDE (or CIE) being read
    columns: list[str] = []
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
        elif line.startswith("   LOC"):
            columns = line.split()[2:]
        elif (found := _ROW.match(line)) and columns:
            values = dict(zip(columns, found.group(3).split()))
            if cie_offset is not None and cies.get(cie_offset, (False, None))[1] is None:
                signal_frame = cies[cie_offset][0]
                cies[cie_offset] = (signal_frame, _rule(found.group(2), values, signal_frame))
            elif current is not None:
                signal_frame = fdes[-1][3]
                current.append((int(found.group(1), 16), _rule(found.group(2), values, signal_frame)))
    chosen = by_section.get(".eh_frame") or by_section.get(".debug_frame") or []
    result = []
    for start, end, rows, signal_frame, initial in chosen:
        if not rows:   # no instructions of its own: the CIE's initial rule holds throughout
            rows = [(start, Rule(CFA_SIGNAL) if signal_frame else initial or UNKNOWN)]
        result.append((start, end, rows))
    return result


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
            merged[-1] = (pc, rule)      # a later FDE starts where one ended
        elif not merged or merged[-1][1] != rule:
            merged.append((pc, rule))
    return merged


def pack_rows(rows: list[tuple[int, Rule]]) -> bytes:
    return b"".join(ROW.pack(pc, rule.cfa_offset, rule.rbp_offset, rule.cfa_rule, rule.rbp_rule)
                    for pc, rule in rows if pc < 1 << 32)


class UnwindTables:
    """Compiled rows per file, each compiled once per (device, inode, mtime, size)."""

    def __init__(self):
        self._rows: dict[tuple, bytes] = {}

    def rows_of(self, elf: ElfFile) -> bytes:
        """The packed rows of a module file (empty when it has no CFI)."""
        if elf.identity not in self._rows:
            listing = subprocess.run(["readelf", "--wide", "--debug-dump=frames-interp", elf.descriptor],
                                     capture_output=True, text=True, check=False, pass_fds=(elf.fd,))
            self._rows[elf.identity] = pack_rows(compile_rows(parse_frames_interp(listing.stdout)))
        return self._rows[elf.identity]
