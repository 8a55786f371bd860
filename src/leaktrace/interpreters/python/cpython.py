"""CPython's row of the interpreters' table: the interface (interpreters/interface.py) over
this folder's version table, frame words, code-object readers, kept-code table and walks."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from leaktrace.interpreters.interface import Codes, FdeRanges, InterpretedFrame, Read
from leaktrace.interpreters.python.code_objects import code_fields, read_code
from leaktrace.interpreters.python.frame_words import (
    EVAL_COLD,
    EVAL_FUNCTION,
    EVAL_FUNCTIONS,
    cold_part,
    folded_shims,
    is_python_word,
    line_of,
    named_like_python,
    python_word,
    spliced_stack,
)
from leaktrace.interpreters.python.interpreter import (
    ctypes_attach_notice,
    interpreter_offsets,
    interpreter_version,
    thread_state_key,
    unknown_interpreter,
)
from leaktrace.interpreters.python.kept_codes import TABLE_BYTES, parse_python_codes, python_codes_in_place
from leaktrace.interpreters.python.layout import PYTHON_MAX_FRAMES, PYTHON_PROC
from leaktrace.interpreters.python.versions import PythonOffsets
from leaktrace.model.snapshot import InterpretedCode
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.kernel_types import member_offsets

FSBASE_MEMBERS = (("task_struct", "thread"), ("thread_struct", "fsbase"))  # a task's TLS base: their sum
_HERE = os.path.dirname(__file__)


class CPythonProcess:
    """A CPython in one process: its code objects read by its version's row."""

    def __init__(self, row: PythonOffsets) -> None:
        self._row = row

    def code_fields(self, read: Read, address: int) -> tuple[int, ...] | None:
        return code_fields(read, self._row, address)

    def read_code(self, read: Read, fields: tuple[int, ...]) -> InterpretedCode | None:
        return read_code(read, self._row, fields)


class CPythonFile:
    """A module that is a CPython: its version's row and thread-state key (None: not known)."""

    def __init__(self, elf: ElfFile) -> None:
        self.path = elf.path
        self.row = interpreter_offsets(elf)
        self.key = thread_state_key(elf) if self.row is not None else None
        self._unknown = unknown_interpreter(elf, False)  # why neither engine walks it, where neither does

    def unwalked(self, in_kernel: bool, on_musl: bool) -> str | None:
        if in_kernel and on_musl:
            return (
                f"{self.path} is CPython on musl: its Python frames are left out "
                "(the walk knows glibc's thread layout, not musl's)"
            )
        walked = self.row is not None and (self.key is not None or not in_kernel)
        return None if walked else self._unknown

    def attach(self, pid: int) -> CPythonProcess | None:
        return CPythonProcess(self.row) if self.row is not None else None

    def kernel_entry(self, load_bias: int, gen: int) -> bytes | None:
        if self.row is None or self.key is None:
            return None
        return PYTHON_PROC.pack(self.key + load_bias, gen, 0, *self.row)


class CPython:
    """CPython 3.11 to 3.13: its frames are tagged words (python_frames.h) both engines write."""

    name = "python"
    code_freed_by = "Py_FinalizeEx"
    kernel_map = b"python_procs"
    kept_codes_symbol = "leaktrace_python_codes"
    exit_codes_suffix = ".exit.python"
    kept_codes_most = TABLE_BYTES

    def may_hold(self, path: str) -> bool:
        return named_like_python(path)

    def load(self, elf: ElfFile) -> CPythonFile | None:
        return CPythonFile(elf) if interpreter_version(elf) is not None else None

    def owns(self, word: int) -> bool:
        return is_python_word(word)

    def code_address(self, word: int) -> int:
        return python_word(word).code

    def frame(self, word: int, code: InterpretedCode | None) -> InterpretedFrame:
        if code is None:
            return InterpretedFrame(None, None, None, False)
        index = python_word(word).instruction
        line = line_of(code.line_table, code.first_line, index) if index is not None else code.first_line
        return InterpretedFrame(code.qualname, code.filename, line, code.changed)

    def runs_frames(self, function: str | None) -> bool:
        return function in EVAL_FUNCTIONS

    def spliced(self, stack: tuple[int, ...], runs_frames: Callable[[int], bool]) -> tuple[int, ...]:
        return spliced_stack(stack, runs_frames)

    def unnamed_part(self, elf: ElfFile, fdes: FdeRanges) -> tuple[str, tuple[int, int]] | None:
        function = elf.dynamic_functions.get(EVAL_FUNCTION)
        found = cold_part(fdes(), function) if function is not None else None
        return (EVAL_COLD, found) if found else None

    def kernel_words(self, stack: tuple[int, ...]) -> tuple[int, ...]:
        return folded_shims(stack)

    def kernel_headers(self) -> Mapping[str, str]:
        return {name: os.path.join(_HERE, name) for name in ("python_frames.h", "python_walk.bpf.h")}

    def kernel_cflags(self, wanted: bool) -> Sequence[str]:
        """Room and the walk for its frames, where the kernel's BTF says where a task's TLS base is."""
        offsets = member_offsets(FSBASE_MEMBERS) if wanted else {}
        if len(offsets) != len(FSBASE_MEMBERS):
            return ["-DPYTHON_FRAMES=0"]
        return [f"-DPYTHON_FRAMES={PYTHON_MAX_FRAMES}", f"-DTASK_FSBASE={sum(offsets.values())}"]

    def kept_codes(self, data: bytes, pid: int) -> Codes:
        return parse_python_codes(data, pid)

    def kept_codes_in_place(self, read: Read, pointer_at: int, pid: int) -> Codes | None:
        return python_codes_in_place(read, pointer_at, pid)

    def attach_notice(self, pid: int, module_paths: Sequence[str]) -> str | None:
        return ctypes_attach_notice(pid, list(module_paths))


CPYTHON = CPython()
