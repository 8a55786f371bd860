"""Symbolization: return addresses -> frames (function, offset, module, file:line).

Works from the maps text a snapshot carries, so a process that has exited
since is symbolized as it was. Function names come from the module's own
symbol tables, or its separate debug file's where it was stripped; file:line from
addr2line on whichever of the two has line tables.
Module files are opened with the process's own rights (module_files.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from leaktrace.interpreters.interface import Interpreter
from leaktrace.interpreters.table import INTERPRETERS, interpreter_of
from leaktrace.model.snapshot import (
    InterpretedCode,
    ProcessInfo,
    Snapshot,
    Stacked,
)
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.module_files import ModuleFiles
from leaktrace.platform.process import Mapping, parse_maps, printable
from leaktrace.unwind.tables import compile_eh_frame


@dataclass(frozen=True)
class Frame:
    address: int
    function: str | None = None
    offset: int = 0  # from the function's start, else from the module's load address
    module: str | None = None  # path of the mapped file, or a pseudo-name such as [vdso]
    file: str | None = None
    line: int | None = None
    module_offset: int | None = None  # the address as a virtual address of the module's ELF
    build_id: str | None = None  # the module's GNU build-id, in hexadecimal
    inlined: bool = False  # a function inlined at this address into the next frame's
    kind: str = "native"  # or an interpreter's name: a function it runs (address: its frame word)
    code_changed: bool = False  # an interpreter frame whose code object's address has held another since

    @property
    def interpreted(self) -> bool:
        """A function an interpreter runs: named by its code object, with no address of its own."""
        return self.kind != "native"

    def describe(self) -> str:
        module = os.path.basename(self.module) if self.module else None
        if self.interpreted:
            where = f"{self.file}:{self.line}" if self.line is not None else self.file
            text = f"{self.function} ({where})" if self.function else f"[{self.kind} frame: code not read]"
            return text + " (code changed)" if self.code_changed else text
        if self.inlined:
            text = f"{self.function} (inlined)"
        elif self.function:
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
    frames: dict[tuple[int, int], Frame]  # (pid, address) -> the frame of the function the address is in
    # (pid, address) -> the functions inlined there, innermost first (each inlined into the next,
    # the last into frames[pid, address]'s function); absent where none are.
    inlined: dict[tuple[int, int], tuple[Frame, ...]] = field(default_factory=dict)

    def frames_at(self, pid: int, address: int) -> list[Frame]:
        """The frames one return address stands for: inlined ones first, then its function's."""
        return [*self.inlined.get((pid, address), ()), self.frames[pid, address]]

    def words_of(self, group: Stacked) -> tuple[int, ...]:
        """A stack's words as shown, innermost first: each interpreter's frames spliced in where
        the native frames that ran them are (Interpreter.spliced)."""
        stack = group.stack
        for interpreter in INTERPRETERS:
            stack = interpreter.spliced(stack, functools.partial(self._runs_frames, interpreter, group.pid))
        return stack

    def _runs_frames(self, interpreter: Interpreter, pid: int, word: int) -> bool:
        frame = self.frames.get((pid, word))
        return frame is not None and not frame.interpreted and interpreter.runs_frames(frame.function)

    def stack_of(self, group: Stacked) -> list[Frame]:
        """Every frame of a stack, innermost first, inlined ones included."""
        return [frame for address in self.words_of(group) for frame in self.frames_at(group.pid, address)]


def interpreted_frame(interpreter: Interpreter, word: int, code: InterpretedCode | None) -> Frame:
    """The frame of an interpreter's frame word: its function, file and line where its code was read."""
    function, file, line, changed = interpreter.frame(word, code)
    return Frame(word, function, file=file, line=line, kind=interpreter.name, code_changed=changed)


class AddressSpace:
    """One process's mappings, searchable by address, and the files of those looked at so far."""

    def __init__(self, maps_text: str):
        self.mappings = sorted(parse_maps(maps_text), key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]
        self.modules: dict[int, ElfFile | None] = {}  # mapping start -> its file, once opened
        self.debug: dict[int, ElfFile | None] = {}  # mapping start -> its file's separate debug file

    @classmethod
    def of(cls, process: ProcessInfo) -> AddressSpace:
        """The process's maps, and the mappings unmapped since where no mapping is now."""
        return cls(process.maps + ("\n" + process.unmapped if process.unmapped else ""))

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None


LineKey = tuple[ElfFile, int]  # a module and a virtual address in it


def _location(function: str, place: str) -> tuple[str | None, str | None, int | None]:
    """A symbolizer's answer for one function at an address (file:line): (function, file, line), None where unknown."""
    file, _, line = place.split(" (discriminator")[0].rpartition(":")
    known = file and file != "??" and line.isdigit() and line != "0"
    return (None if function == "??" else function, file if known else None, int(line) if known else None)


def addr2line_answers(out: str) -> dict[int, list[tuple[str, str]]]:
    """`addr2line -a -i -f` output (each address, then a function and a file:line per function
    there, inlined ones first; eu-addr2line's too): address -> its (function, place) pairs."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for answer in out.splitlines():
        if answer.startswith("0x") and (current is None or len(current) % 2 == 0):
            current = found.setdefault(int(answer, 16), [])
        elif current is not None:
            current.append(answer)
    return {address: list(zip(lines[::2], lines[1::2])) for address, lines in found.items()}


def llvm_symbolizer_answers(out: str) -> dict[int, tuple[tuple[str | None, str | None, int | None], ...]]:
    """`llvm-symbolizer --inlining --output-style=JSON` output (a JSON object per address, so no
    name a module chooses, newlines and all, can shift an answer onto another address):
    address -> (function, file, line) of each function there, inlined ones first."""
    found = {}
    for text in out.splitlines():
        try:
            answer = json.loads(text)
            address = int(answer["Address"], 16)
            symbols = answer.get("Symbol", [])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not an answer: nothing of it is taken
        chain = []
        for symbol in symbols if isinstance(symbols, list) else []:
            function, file, line = (symbol.get(key) for key in ("FunctionName", "FileName", "Line"))
            known = isinstance(file, str) and file not in ("", "??") and isinstance(line, int) and line > 0
            chain.append(
                (
                    function if isinstance(function, str) and function not in ("", "??") else None,
                    file if known else None,
                    line if known else None,
                )
            )
        found[address] = tuple(chain)
    return found


def _inline_chains(elf: ElfFile, vaddrs: list[int]) -> dict[int, tuple[tuple[str | None, str | None, int | None], ...]]:
    """Address -> (function, file, line) of each function there, inlined ones first. The file
    read is the one opened with the target's rights, not whatever its path names by then.
    llvm-symbolizer where installed (binutils' addr2line names the wrong file for 7% of libc's
    addresses: bench/symbolizer_bench.py), else addr2line."""
    if shutil.which("llvm-symbolizer"):
        out = subprocess.run(
            ["llvm-symbolizer", "--inlining", "--demangle", "--output-style=JSON", f"--obj={elf.descriptor}"],
            input="".join(f"{v:#x}\n" for v in vaddrs),
            capture_output=True,
            text=True,
            check=False,
            pass_fds=(elf.fd,),
        ).stdout
        return llvm_symbolizer_answers(out)
    out = subprocess.run(
        ["addr2line", "-a", "-i", "-f", "-e", elf.descriptor, *(f"{v:#x}" for v in vaddrs)],
        capture_output=True,
        text=True,
        check=False,
        pass_fds=(elf.fd,),
    ).stdout
    return {v: tuple(_location(f, p) for f, p in pairs) for v, pairs in addr2line_answers(out).items()}


class Symbolizer:
    """Caches ELF files and line lookups across snapshots; reuse one per trace."""

    def __init__(self, line_info: bool = True):
        self.line_info = line_info
        self._modules = ModuleFiles()
        # (identity, vaddr) -> (function, file, line) of each function there, innermost (inlined) first
        self._lines: dict[tuple[tuple, int], tuple[tuple[str | None, str | None, int | None], ...]] = {}
        self._demangled: dict[str, str] = {}
        self._spaces: dict[int, tuple[tuple[str, str], AddressSpace]] = {}
        # module identity -> the unnamed parts of the interpreters' runners in it (unnamed_part)
        self._unnamed: dict[tuple, list[tuple[str, tuple[int, int]]]] = {}

    def _space(self, process: ProcessInfo) -> AddressSpace:
        cached = self._spaces.get(process.pid)
        if cached is None or cached[0] != (process.maps, process.unmapped):
            cached = ((process.maps, process.unmapped), AddressSpace.of(process))
            self._spaces[process.pid] = cached
        return cached[1]

    def _open_modules(self, process: ProcessInfo, space: AddressSpace, addresses: set[int]) -> None:
        """Opens the files of the mappings these addresses fall in, that are not open yet: in one go."""
        missing = {m.start: m for m in map(space.find, addresses) if m and m.start not in space.modules}
        if missing:
            opened = self._modules.open(process, missing.values())
            space.modules.update(opened)
            for start, elf in opened.items():
                stripped = elf is not None and not (elf.has_symtab and elf.has_debug_lines)
                space.debug[start] = self._modules.debug_file(process, elf) if elf is not None and stripped else None

    def _frame(self, space: AddressSpace, address: int) -> tuple[Frame, LineKey | None]:
        """The frame without file:line, and the (module, vaddr) to ask addr2line about."""
        mapping = space.find(address)
        if mapping is None:
            return Frame(address), None
        if not mapping.path.startswith("/"):
            return Frame(address, offset=address - mapping.start, module=mapping.path or None), None
        elf = space.modules.get(mapping.start)
        file_offset = address - mapping.start + mapping.offset
        vaddr = elf.file_offset_to_vaddr(file_offset) if elf else None
        if elf is None or vaddr is None:
            return Frame(address, offset=file_offset, module=mapping.path, build_id=elf.build_id if elf else None), None
        # A return address follows its call; look up the call instruction itself. A separate
        # debug file (same build, same addresses) serves what the module was stripped of.
        debug = space.debug.get(mapping.start)
        lines_from = elf if elf.has_debug_lines else debug if debug and debug.has_debug_lines else None
        line_key = (lines_from, vaddr - 1) if self.line_info and lines_from else None
        symbol = elf.function_at(vaddr - 1)
        if debug and not elf.has_symtab:  # the module's exported name wins at the same address
            local = debug.function_at(vaddr - 1)
            symbol = local if local and (symbol is None or local.value != symbol.value) else symbol
        if symbol is None:
            for name, (start, end) in self._unnamed_parts(elf):
                if start <= vaddr - 1 < end:
                    return Frame(
                        address, name, vaddr - start, mapping.path, module_offset=vaddr, build_id=elf.build_id
                    ), line_key
            return Frame(
                address, offset=vaddr, module=mapping.path, module_offset=vaddr, build_id=elf.build_id
            ), line_key
        return Frame(
            address, symbol.name, vaddr - symbol.value, mapping.path, module_offset=vaddr, build_id=elf.build_id
        ), line_key

    def _unnamed_parts(self, elf: ElfFile) -> list[tuple[str, tuple[int, int]]]:
        """The parts of an interpreter's runner a stripped module leaves unnamed, named (from its
        FDEs, once per module; none for any other module)."""
        if elf.identity not in self._unnamed:

            def fdes() -> list[tuple[int, int]]:
                return [(start, end) for start, end, _ in compile_eh_frame(elf) or ()]

            found = (interpreter.unnamed_part(elf, fdes) for interpreter in INTERPRETERS)
            self._unnamed[elf.identity] = [part for part in found if part is not None]
        return self._unnamed[elf.identity]

    def _lookup_lines(self, wanted: dict[ElfFile, set[int]]) -> None:
        for elf, vaddrs in wanted.items():
            todo = sorted(v for v in vaddrs if (elf.identity, v) not in self._lines)
            chains = _inline_chains(elf, todo) if todo else {}
            for vaddr in todo:
                self._lines[elf.identity, vaddr] = chains.get(vaddr, ())

    def _demangle(self, names: set[str]) -> None:
        todo = sorted(n for n in names if n.startswith("_Z") and n not in self._demangled)
        if not todo:
            return
        try:
            result = subprocess.run(["c++filt"], input="\n".join(todo), capture_output=True, text=True, check=False)
            plain = result.stdout.splitlines()
        except OSError:
            plain = []
        self._demangled.update(zip(todo, plain if len(plain) == len(todo) else todo))

    def symbolize(self, snapshot: Snapshot) -> SymbolizedSnapshot:
        addresses: dict[int, set[int]] = {}
        interpreted: dict[tuple[int, int], Interpreter] = {}
        for item in snapshot.stacked_items():
            for word in item.stack:
                language = interpreter_of(word)
                if language is not None:
                    interpreted[item.pid, word] = language
                else:
                    addresses.setdefault(item.pid, set()).add(word)
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
        chains = {
            key: self._lines.get((line_key[0].identity, line_key[1]), ()) if line_key else ()
            for key, (_, line_key) in partial.items()
        }
        self._demangle(
            {frame.function for frame, _ in partial.values() if frame.function}
            | {function for chain in chains.values() for function, _, _ in chain[:-1] if function}
        )
        frames, inlined = {}, {}
        for key, (frame, _) in partial.items():
            chain = chains[key]
            # The last of the chain is the function the address is in; those before were inlined into it.
            file, line = chain[-1][1:] if chain else (None, None)
            frames[key] = self._printable(dataclasses.replace(frame, file=file, line=line))
            if len(chain) > 1:
                inlined[key] = tuple(
                    self._printable(
                        Frame(
                            frame.address,
                            function,
                            0,
                            frame.module,
                            file,
                            line,
                            frame.module_offset,
                            frame.build_id,
                            inlined=True,
                        )
                    )
                    for function, file, line in chain[:-1]
                )
        for (pid, word), language in interpreted.items():
            code = snapshot.interpreted_code.get((pid, language.code_address(word)))
            frames[pid, word] = self._printable(interpreted_frame(language, word, code))
        # Processes come and go (systemwide): keep the maps of those still in view.
        self._spaces = {pid: space for pid, space in self._spaces.items() if pid in snapshot.processes}
        return SymbolizedSnapshot(snapshot, frames, inlined)

    def _printable(self, frame: Frame) -> Frame:
        """Names come from the target's files: printable, so that no report carries their escapes."""
        function = self._demangled.get(frame.function, frame.function) if frame.function else None
        return dataclasses.replace(
            frame,
            function=function and printable(function),
            module=frame.module and printable(frame.module),
            file=frame.file and printable(frame.file),
        )
