"""Which module of a process is a CPython interpreter the Python-frame walk knows, its row of
versions.py, and where it keeps its thread-state key: read from the module's file, checked
against its Py_Version and its code type's sizes."""

from __future__ import annotations

import os
import struct

from leaktrace.interpreters.python.layout import PYTHON_CODE_UNIT, PYTHON_TYPE_BASICSIZE
from leaktrace.interpreters.python.versions import (
    DEBUG_WORD_COUNT,
    ROWS,
    PythonOffsets,
    debug_words,
    free_threaded,
    offsets_for,
)
from leaktrace.platform.elf import ElfError, ElfFile

KEY_FUNCTION = "PyGILState_GetThisThreadState"
# Its code in a program (Debian's python3.11): `cmpq $0, autoInterpreterState(%rip)`, `je`,
# then `mov autoTSSkey._key(%rip), %edi`.
COMPARE_RIP = b"\x48\x83\x3d"
LOAD_RIP_EDI = b"\x8b\x3d"
LOAD_AT = 14  # where the load starts, after the 8-byte compare and the 6-byte je
# In a shared libpython 3.11: `mov &_PyRuntime(%rip), %rax`, `cmpq $0, autoInterpreterState(%rax)`,
# `je` (short), then `lea autoTSSkey(%rax), %rdi`: the key is the int after its "made" int.
RUNTIME_FROM_GOT = b"\x48\x8b\x05"
COMPARE_RAX = b"\x48\x83\xb8"
ADDRESS_RAX_RDI = b"\x48\x8d\xb8"
ADDRESS_AT = 17
# In a shared libpython 3.12 on: `mov &_PyRuntime(%rip), %rax`, `push %rbx`, then
# `lea autoTSSkey(%rax), %rbx` (PyThread_tss_is_created, then PyThread_tss_get, of it).
PUSH_RBX_ADDRESS_RAX_RBX = b"\x53\x48\x8d\x98"
# In a program 3.13 (Debian 13's python3.13): `endbr64`, `cmpl $0, autoTSSkey._is_initialized(%rip)`,
# `je` (near), then `mov autoTSSkey._key(%rip), %edi`.
ENDBR64 = b"\xf3\x0f\x1e\xfa"
COMPARE_INT_RIP = b"\x83\x3d"  # then rel32 and the byte compared with
JE_NEAR = b"\x0f\x84"


def interpreter_version(elf: ElfFile) -> int | None:
    """PY_VERSION_HEX of a module that is a CPython interpreter (3.11 on: Py_Version), else None."""
    try:
        if not elf.exports_function(KEY_FUNCTION):
            return None
        at = elf.dynamic_objects.get("Py_Version")
        return struct.unpack("<Q", elf.read(at, 8))[0] if at is not None else None
    except (ElfError, struct.error, ValueError):
        return None


def _runtime_start(elf: ElfFile) -> bytes:
    """_PyRuntime's first bytes as the file initialises them (3.13 on: _Py_DebugOffsets)."""
    try:
        at = elf.dynamic_objects.get("_PyRuntime")
        return elf.read(at, DEBUG_WORD_COUNT * 8) if at is not None else b""
    except (ElfError, ValueError):
        return b""


def interpreter_offsets(elf: ElfFile) -> PythonOffsets | None:
    """The row of a CPython module the walks know, checked against its code type's sizes."""
    version = interpreter_version(elf)
    if version is None:
        return None
    try:
        row = offsets_for(version, b"" if version >> 16 in ROWS else _runtime_start(elf))
        if row is None:
            return None
        basicsize, itemsize = struct.unpack(
            "<qq", elf.read(elf.dynamic_objects["PyCode_Type"] + PYTHON_TYPE_BASICSIZE, 16)
        )
    except (ElfError, struct.error, ValueError, KeyError):
        return None
    return row if (basicsize, itemsize) == (row.code_instructions, PYTHON_CODE_UNIT) else None


def thread_state_key(elf: ElfFile) -> int | None:
    """The link-time address of the thread-state key (autoTSSkey._key) of a CPython module,
    from PyGILState_GetThisThreadState's code; None where that code has none of the shapes known."""
    try:
        function = elf.dynamic_functions[KEY_FUNCTION]
        code = elf.read(function, ADDRESS_AT + 7)
        if code.startswith(COMPARE_RIP) and code[LOAD_AT : LOAD_AT + 2] == LOAD_RIP_EDI:
            return function + LOAD_AT + 6 + struct.unpack_from("<i", code, LOAD_AT + 2)[0]
        at = len(ENDBR64) if code.startswith(ENDBR64) else 0
        if code[at : at + 2] == COMPARE_INT_RIP and code[at + 6] == 0 and code[at + 7 : at + 9] == JE_NEAR:
            if code[at + 13 : at + 15] == LOAD_RIP_EDI:
                return function + at + 19 + struct.unpack_from("<i", code, at + 15)[0]
        if not code.startswith(RUNTIME_FROM_GOT):
            return None
        runtime = elf.dynamic_objects["_PyRuntime"]
        if code[7:10] == COMPARE_RAX and code[15] == 0x74 and code[ADDRESS_AT : ADDRESS_AT + 3] == ADDRESS_RAX_RDI:
            return runtime + struct.unpack_from("<i", code, ADDRESS_AT + 3)[0] + 4
        if code[7:11] == PUSH_RBX_ADDRESS_RAX_RBX:
            return runtime + struct.unpack_from("<i", code, 11)[0] + 4
    except (ElfError, struct.error, ValueError, KeyError, IndexError):
        return None
    return None


def unknown_interpreter(elf: ElfFile, walked: bool) -> str | None:
    """The line that says a module is a CPython whose frames are not walked (walked: whether
    the engine walks it), else None."""
    version = interpreter_version(elf)
    if version is None or walked:
        return None
    words = debug_words(_runtime_start(elf))
    why = "a free-threaded build" if words is not None and free_threaded(words) else "a version it does not know"
    return (
        f"{elf.path} is CPython {version >> 24}.{version >> 16 & 0xFF}, {why}: leaktrace does not walk its"
        " frames (it walks 3.11, 3.12 and 3.13), so its stacks have native frames only"
    )


def ctypes_attach_notice(pid: int, module_paths: list[str]) -> str | None:
    """The in-process attach's limit in one line, where pid has ctypes' module loaded: a C
    function ctypes looked up before the attach is called through its pointer, never a GOT
    slot the attach hooks (None: no ctypes)."""
    if not any(os.path.basename(path).startswith("_ctypes") and ".so" in path for path in module_paths):
        return None
    return (
        f"pid {pid} has ctypes loaded: a C function it looked up before the attach "
        "(ctypes.CDLL(None).malloc) is called through its pointer, and those calls are not seen "
        "(the BPF engine sees them)"
    )
