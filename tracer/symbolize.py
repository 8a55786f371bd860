"""Symbolization: return addresses -> frames (function, offset, module, file:line).

Works from the maps text a snapshot carries, so a process that has exited
since is symbolized as it was. Function names come from the module's own
symbol tables; file:line from addr2line where the module has line tables.
"""
from __future__ import annotations

import bisect
import contextlib
import os
import subprocess
from dataclasses import dataclass

from .elf import ElfError, ElfFile
from .process import Mapping, host_path, parse_maps
from .snapshot import AllocationGroup, Snapshot
from .target_files import open_regular


@dataclass(frozen=True)
class Frame:
    address: int
    function: str | None = None
    offset: int = 0            # from the function's start, else from the module's load address
    module: str | None = None  # path of the mapped file, or a pseudo-name such as [vdso]
    file: str | None = None
    line: int | None = None
    module_offset: int | None = None   # the address as a virtual address of the module's ELF

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
    """One process's mappings, searchable by address."""

    def __init__(self, maps_text: str):
        self.mappings = sorted(parse_maps(maps_text), key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None


class Symbolizer:
    """Caches ELF files and line lookups across snapshots; reuse one per trace."""

    def __init__(self, line_info: bool = True):
        self.line_info = line_info
        self._elves: dict[str, ElfFile | None] = {}
        self._lines: dict[tuple[str, int], tuple[str | None, int | None]] = {}
        self._demangled: dict[str, str] = {}
        self._spaces: dict[int, tuple[str, _AddressSpace]] = {}

    def _elf(self, path: str) -> ElfFile | None:
        if path not in self._elves:
            try:
                self._elves[path] = ElfFile(path)
            except ElfError:
                self._elves[path] = None
        return self._elves[path]

    def _space(self, pid: int, maps_text: str) -> _AddressSpace:
        cached = self._spaces.get(pid)
        if cached is None or cached[0] != maps_text:
            cached = (maps_text, _AddressSpace(maps_text))
            self._spaces[pid] = cached
        return cached[1]

    def _frame(self, pid: int, space: _AddressSpace, address: int) -> tuple[Frame, tuple[str, int] | None]:
        """The frame without file:line, and the (path, vaddr) to ask addr2line about."""
        mapping = space.find(address)
        if mapping is None:
            return Frame(address), None
        if not mapping.path.startswith("/"):
            return Frame(address, offset=address - mapping.start, module=mapping.path or None), None
        path = host_path(pid, mapping.path)
        elf = self._elf(path)
        file_offset = address - mapping.start + mapping.offset
        vaddr = elf.file_offset_to_vaddr(file_offset) if elf else None
        if vaddr is None:
            return Frame(address, offset=file_offset, module=mapping.path), None
        # A return address follows its call; look up the call instruction itself.
        line_key = (path, vaddr - 1) if self.line_info and elf.has_debug_lines else None
        symbol = elf.function_at(vaddr - 1)
        if symbol is None:
            return Frame(address, offset=vaddr, module=mapping.path, module_offset=vaddr), line_key
        return Frame(address, symbol.name, vaddr - symbol.value, mapping.path, module_offset=vaddr), line_key

    def _lookup_lines(self, wanted: dict[str, set[int]]) -> None:
        for path, vaddrs in wanted.items():
            todo = sorted(v for v in vaddrs if (path, v) not in self._lines)
            if not todo:
                continue
            try:   # addr2line reads the file checked here, not whatever the path names by then
                fd = open_regular(path)
            except OSError:
                answers = []
            else:
                with contextlib.closing(os.fdopen(fd, "rb")):
                    answers = subprocess.run(["addr2line", "-e", f"/proc/self/fd/{fd}", *(f"{v:#x}" for v in todo)],
                                             capture_output=True, text=True, check=False,
                                             pass_fds=(fd,)).stdout.splitlines()
            for vaddr, answer in zip(todo, answers + [""] * (len(todo) - len(answers))):
                location = answer.split(" (discriminator")[0]
                file, _, line = location.rpartition(":")
                known = file and file != "??" and line.isdigit() and line != "0"
                self._lines[path, vaddr] = (file, int(line)) if known else (None, None)

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
        partial: dict[tuple[int, int], tuple[Frame, tuple[str, int] | None]] = {}
        unreachable = snapshot.unreachable.leaks if snapshot.unreachable else ()
        for item in (*snapshot.groups, *(snapshot.allocations or ()), *unreachable):
            process = snapshot.processes.get(item.pid)
            space = self._space(item.pid, process.maps if process else "")
            for address in item.stack:
                if (item.pid, address) not in partial:
                    partial[item.pid, address] = self._frame(item.pid, space, address)
        wanted: dict[str, set[int]] = {}
        for _, line_key in partial.values():
            if line_key:
                wanted.setdefault(line_key[0], set()).add(line_key[1])
        self._lookup_lines(wanted)
        self._demangle({frame.function for frame, _ in partial.values() if frame.function})
        frames = {}
        for key, (frame, line_key) in partial.items():
            file, line = self._lines.get(line_key, (None, None)) if line_key else (None, None)
            function = self._demangled.get(frame.function, frame.function) if frame.function else None
            frames[key] = Frame(frame.address, function, frame.offset, frame.module, file, line,
                                frame.module_offset)
        # Processes come and go (systemwide): keep the maps of those still in view.
        self._spaces = {pid: space for pid, space in self._spaces.items() if pid in snapshot.processes}
        return SymbolizedSnapshot(snapshot, frames)
