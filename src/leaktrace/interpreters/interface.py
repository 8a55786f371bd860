"""What an interpreter whose frames leaktrace shows among native ones provides, in three parts
as the OpenTelemetry profiler's interpreters do: the language (Interpreter, a row of
table.py's INTERPRETERS), what one ELF file that holds it says (InterpreterFile, read once a
file: the loader's data), and the interpreter running in one process (InterpreterProcess:
its code objects read). The engines, the symbolizer and the outputs use only these: none
names a language, its symbols or its layouts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import InterpretedCode
from leaktrace.platform.elf import ElfFile

Read = Callable[[int, int], bytes]  # (address, size) -> the bytes there; short where unreadable
Codes = dict[tuple[int, int], InterpretedCode]  # (pid, code object address) -> its code
FdeRanges = Callable[[], list[tuple[int, int]]]  # a module's FDE ranges in .eh_frame's order, read on a call


class DamagedCodes(RuntimeFailure):
    """A value of the preload library's code table that the library could not have written."""


class InterpretedFrame(NamedTuple):
    """What a frame word names, from its code object where that was read."""

    function: str | None
    file: str | None
    line: int | None
    code_changed: bool  # the code object's address has held another since: the name may be another's


class InterpreterProcess(Protocol):
    """The interpreter in one process: the code objects its frames name, read from its memory."""

    def code_fields(self, read: Read, address: int) -> tuple[int, ...] | None:
        """What tells one code object from another at an address; None where none is."""
        ...

    def read_code(self, read: Read, fields: tuple[int, ...]) -> InterpretedCode | None:
        """The code object of those fields; None where its parts cannot be read."""
        ...


class InterpreterFile(Protocol):
    """An ELF file that holds the interpreter, read once a file."""

    def unwalked(self, in_kernel: bool, on_musl: bool) -> str | None:
        """The line that says the engine (the BPF walk, in_kernel, else the preload library's)
        does not walk this file's frames; None where it does."""
        ...

    def attach(self, pid: int) -> InterpreterProcess | None:
        """Its code objects' reader in a process that runs it; None where they cannot be read."""
        ...

    def kernel_entry(self, load_bias: int, gen: int) -> bytes | None:
        """The BPF walk's entry for a process whose image gen maps the file at load_bias; None
        where the walk cannot find its frames."""
        ...


class Interpreter(Protocol):
    """A language whose frames the stacks hold, as words the engines write among return addresses."""

    name: str  # its frames' kind in every report
    code_freed_by: str  # its function that frees its code objects: the BPF engine stops a target there once
    kernel_map: bytes  # the BPF walk's map of the processes that run it (absent: compiled without the walk)
    kept_codes_symbol: str  # the preload library's pointer to the code objects it keeps
    exit_codes_suffix: str  # the file those are written to at exit: PREFIX.PID<suffix>
    kept_codes_most: int  # the most bytes that file holds

    def may_hold(self, path: str) -> bool:
        """Whether a file's name says it may hold the interpreter (a program or a library)."""
        ...

    def load(self, elf: ElfFile) -> InterpreterFile | None:
        """What an ELF file that holds the interpreter says; None for any other file."""
        ...

    def owns(self, word: int) -> bool:
        """Whether a stack word is one of its frames (else a return address, or another's)."""
        ...

    def code_address(self, word: int) -> int:
        """The address of the code object a frame word names."""
        ...

    def frame(self, word: int, code: InterpretedCode | None) -> InterpretedFrame:
        """What a frame word says, with its code object where that was read."""
        ...

    def runs_frames(self, function: str | None) -> bool:
        """Whether a native function is the one whose frames its frames stand for (its eval loop)."""
        ...

    def spliced(self, stack: tuple[int, ...], runs_frames: Callable[[int], bool]) -> tuple[int, ...]:
        """A stack's words in the order shown: its frames in place of the native frames that
        ran them (runs_frames of a native word)."""
        ...

    def unnamed_part(self, elf: ElfFile, fdes: FdeRanges) -> tuple[str, tuple[int, int]] | None:
        """A part of its runner a stripped module leaves unnamed, named and with its range; None
        where the module has none."""
        ...

    def kernel_words(self, stack: tuple[int, ...]) -> tuple[int, ...]:
        """A stack as the BPF walk wrote it, in the words the preload library writes."""
        ...

    def kernel_headers(self) -> Mapping[str, str]:
        """The headers of its BPF walk, by the name the program includes them by -> their path."""
        ...

    def kernel_cflags(self, wanted: bool) -> Sequence[str]:
        """The BPF program's flags for its walk: room and the walk where wanted and possible."""
        ...

    def kept_codes(self, data: bytes, pid: int) -> Codes:
        """The code objects in the file the preload library writes at exit."""
        ...

    def kept_codes_in_place(self, read: Read, pointer_at: int, pid: int) -> Codes | None:
        """The code objects the library keeps, read in a stopped process through its pointer at
        pointer_at; None while a thread is writing them (read again later)."""
        ...

    def attach_notice(self, pid: int, module_paths: Sequence[str]) -> str | None:
        """The in-process attach's limit for a process that maps these modules, in one line."""
        ...
