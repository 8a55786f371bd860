"""Symbolization: return addresses -> frames (function, offset, module, file:line).

Works from the maps text a snapshot carries, so a process that has exited
since is symbolized as it was. Function names come from the module's own
symbol tables, or its separate debug file's where it was stripped; file:line from
addr2line on whichever of the two has line tables.
Module files are opened with the process's own rights (module_files.py).
"""
from __future__ import annotations

import bisect
import os
import subprocess
from dataclasses import dataclass

from .elf import ElfFile
from .module_files import ModuleFiles
from .process import Mapping, parse_maps, printable
from .snapshot import AllocationGroup, ProcessInfo, Snapshot


@dataclass(frozen=True)
class Frame:
    address: int
    function: str | None = None
    offset: int = 0            # from the function's start, else from the module's load address
    module: str | None = None  # path of the mapped file, or a pseudo-name such as [vdso]
    file: str | None = None
    line: int | None = None
    module_offset: int | None = None   # the address as a virtual address of the module's ELF
    build_id: str | None = None        # the module's GNU build-id, in hexadecimal

    def describe(self) -> str:
        module = os.path.basename(self.module) if self.module else None
        if self.function:
            text = f"{self.function}+{self.offset:#x}"
            text += f" ({module})" if module else ""
        elif module:
            text = f"{self.address:#x} ({module}+{self.offset:#x})"
        else:
            text = f"{self.address:#x} [unknown]"
        if self.file:
            text += f" {self.file}:{self.line}"
        return text


@dataclass(frozen=True)
class SymbolizedSnapshot:
    snapshot: Snapshot
    frames: dict[tuple[int, int], Frame]   # (pid, address) -> frame

    def stack_of(self, group: AllocationGroup) -> list[Frame]:
        return [self.frames[group.pid, address] for address in group.stack]


class _AddressSpace:
    """One process's mappings, searchable by address, and the files of those looked at so far."""

    def __init__(self, maps_text: str):
        self.mappings = sorted(parse_maps(maps_text), key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]
        self.modules: dict[int, ElfFile | None] = {}   # mapping start -> its file, once opened
        self.debug: dict[int, ElfFile | None] = {}     # mapping start -> its file's separate debug file

    @classmethod
    def of(cls, process: ProcessInfo) -> "_AddressSpace":
        """The process's maps, and the mappings unmapped since where no mapping is now."""
        return cls(process.maps + ("\n" + process.unmapped if process.unmapped else ""))

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None


LineKey = tuple[ElfFile, int]   # a module and a virtual address in it


class Symbolizer:
    """Caches ELF files and line lookups across snapshots; reuse one per trace."""

    def __init__(self, line_info: bool = True):
        self.line_info = line_info
        self._modules = ModuleFiles()
        self._lines: dict[tuple[tuple, int], tuple[str | None, int | None]] = {}   # (identity, vaddr) ->
        self._demangled: dict[str, str] = {}
        self._spaces: dict[int, tuple[tuple[str, str], _AddressSpace]] = {}

    def _space(self, process: ProcessInfo) -> _AddressSpace:
        cached = self._spaces.get(process.pid)
        if cached is None or cached[0] != (process.maps, process.unmapped):
            cached = ((process.maps, process.unmapped), _AddressSpace.of(process))
            self._spaces[process.pid] = cached
        return cached[1]

    def _open_modules(self, process: ProcessInfo, space: _AddressSpace, addresses: set[int]) -> None:
        """Opens the files of the mappings these addresses fall in, that are not open yet: in one go."""
        missing = {m.start: m for m in map(space.find, addresses) if m and m.start not in space.modules}
        if missing:
            opened = self._modules.open(process, missing.values())
            space.modules.update(opened)
            for start, elf in opened.items():
                stripped = elf is not None and not (elf.has_symtab and elf.has_debug_lines)
                space.debug[start] = self._modules.debug_file(process, elf) if stripped else None

    def _frame(self, space: _AddressSpace, address: int) -> tuple[Frame, LineKey | None]:
        """The frame without file:line, and the (module, vaddr) to ask addr2line about."""
        mapping = space.find(address)
        if mapping is None:
            return Frame(address), None
        if not mapping.path.startswith("/"):
            return Frame(address, offset=address - mapping.start, module=mapping.path or None), None
        elf = space.modules.get(mapping.start)
        file_offset = address - mapping.start + mapping.offset
        vaddr = elf.file_offset_to_vaddr(file_offset) if elf else None
        if vaddr is None:
            return Frame(address, offset=file_offset, module=mapping.path, build_id=elf.build_id if elf else None), None
        # A return address follows its call; look up the call instruction itself. A separate
        # debug file (same build, same addresses) serves what the module was stripped of.
        debug = space.debug.get(mapping.start)
        lines_from = elf if elf.has_debug_lines else debug if debug and debug.has_debug_lines else None
        line_key = (lines_from, vaddr - 1) if self.line_info and lines_from else None
        symbol = elf.function_at(vaddr - 1)
        if debug and not elf.has_symtab:   # the module's exported name wins at the same address
            local = debug.function_at(vaddr - 1)
            symbol = local if local and (symbol is None or local.value != symbol.value) else symbol
        if symbol is None:
            return Frame(address, offset=vaddr, module=mapping.path, module_offset=vaddr,
                         build_id=elf.build_id), line_key
        return Frame(address, symbol.name, vaddr - symbol.value, mapping.path, module_offset=vaddr,
                     build_id=elf.build_id), line_key

    def _lookup_lines(self, wanted: dict[ElfFile, set[int]]) -> None:
        for elf, vaddrs in wanted.items():
            todo = sorted(v for v in vaddrs if (elf.identity, v) not in self._lines)
            if not todo:
                continue
            # addr2line reads the file opened with the target's rights, not whatever the path names by then.
            answers = subprocess.run(["addr2line", "-e", elf.descriptor, *(f"{v:#x}" for v in todo)],
                                     capture_output=True, text=True, check=False,
                                     pass_fds=(elf.fd,)).stdout.splitlines()
            for vaddr, answer in zip(todo, answers + [""] * (len(todo) - len(answers))):
                location = answer.split(" (discriminator")[0]
                file, _, line = location.rpartition(":")
                known = file and file != "??" and line.isdigit() and line != "0"
                self._lines[elf.identity, vaddr] = (file, int(line)) if known else (None, None)

    def _demangle(self, names: set[str]) -> None:
        todo = sorted(n for n in names if n.startswith("_Z") and n not in self._demangled)
        if not todo:
            return
        try:
            result = subprocess.run(["c++filt"], input="\n".join(todo), capture_output=True,
                                    text=True, check=False)
            plain = result.stdout.splitlines()
        except OSError:
            plain = []
        self._demangled.update(zip(todo, plain if len(plain) == len(todo) else todo))

    def symbolize(self, snapshot: Snapshot) -> SymbolizedSnapshot:
        unreachable = snapshot.unreachable.leaks if snapshot.unreachable else ()
        addresses: dict[int, set[int]] = {}
        for item in (*snapshot.groups, *(snapshot.allocations or ()), *unreachable):
            addresses.setdefault(item.pid, set()).update(item.stack)
        partial: dict[tuple[int, int], tuple[Frame, LineKey | None]] = {}
        for pid, wanted in addresses.items():
            process = snapshot.processes.get(pid) or ProcessInfo(pid)
            space = self._space(process)
            self._open_modules(process, space, wanted)
            for address in wanted:
                partial[pid, address] = self._frame(space, address)
        lines: dict[ElfFile, set[int]] = {}
        for _, line_key in partial.values():
            if line_key:
                lines.setdefault(line_key[0], set()).add(line_key[1])
        self._lookup_lines(lines)
        self._demangle({frame.function for frame, _ in partial.values() if frame.function})
        frames = {}
        for key, (frame, line_key) in partial.items():
            file, line = self._lines.get((line_key[0].identity, line_key[1]), (None, None)) if line_key \
                else (None, None)
            function = self._demangled.get(frame.function, frame.function) if frame.function else None
            # Names come from the target's files: printable, so that no report carries its escapes.
            frames[key] = Frame(frame.address, function and printable(function), frame.offset,
                                frame.module and printable(frame.module), file and printable(file), line,
                                frame.module_offset, frame.build_id)
        # Processes come and go (systemwide): keep the maps of those still in view.
        self._spaces = {pid: space for pid, space in self._spaces.items() if pid in snapshot.processes}
        return SymbolizedSnapshot(snapshot, frames)
