"""Which module of a process is a CPython interpreter the Python-frame walk knows (3.11,
python_frames.h), and where it keeps its thread-state key: read from the module's file,
checked against its Py_Version and its code type's sizes."""

from __future__ import annotations

import struct

from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.unwind.python_layout import PY311_CODE_ADAPTIVE, PY311_CODE_UNIT, PY311_TYPE_BASICSIZE, PY311_VERSION

KEY_FUNCTION = "PyGILState_GetThisThreadState"
# Its code in a program (Debian's python3.11): `cmpq $0, autoInterpreterState(%rip)`, `je`,
# then `mov autoTSSkey._key(%rip), %edi`.
COMPARE_RIP = b"\x48\x83\x3d"
LOAD_RIP_EDI = b"\x8b\x3d"
LOAD_AT = 14  # where the load starts, after the 8-byte compare and the 6-byte je
# In a shared libpython: `mov &_PyRuntime(%rip), %rax`, `cmpq $0, autoInterpreterState(%rax)`,
# `je` (short), then `lea autoTSSkey(%rax), %rdi`: the key is the int after its "made" int.
RUNTIME_FROM_GOT = b"\x48\x8b\x05"
COMPARE_RAX = b"\x48\x83\xb8"
ADDRESS_RAX_RDI = b"\x48\x8d\xb8"
ADDRESS_AT = 17


def interpreter_version(elf: ElfFile) -> int | None:
    """PY_VERSION_HEX of a module that is a CPython interpreter (3.11 on: Py_Version), else None."""
    try:
        if not elf.exports_function(KEY_FUNCTION):
            return None
        at = elf.dynamic_objects.get("Py_Version")
        return struct.unpack("<Q", elf.read(at, 8))[0] if at is not None else None
    except (ElfError, struct.error, ValueError):
        return None


def thread_state_key(elf: ElfFile) -> int | None:
    """The link-time address of the thread-state key (_PyRuntime.gilstate.autoTSSkey._key) of a
    CPython 3.11 module whose layout python_frames.h describes; None for any other module."""
    version = interpreter_version(elf)
    if version is None or version >> 16 != PY311_VERSION:
        return None
    try:
        code_type = elf.dynamic_objects["PyCode_Type"]
        function = elf.dynamic_functions[KEY_FUNCTION]
        basicsize, itemsize = struct.unpack("<qq", elf.read(code_type + PY311_TYPE_BASICSIZE, 16))
        code = elf.read(function, ADDRESS_AT + 7)
        if (basicsize, itemsize) != (PY311_CODE_ADAPTIVE, PY311_CODE_UNIT):
            return None
        if code.startswith(COMPARE_RIP) and code[LOAD_AT : LOAD_AT + 2] == LOAD_RIP_EDI:
            return function + LOAD_AT + 6 + struct.unpack_from("<i", code, LOAD_AT + 2)[0]
        if code.startswith(RUNTIME_FROM_GOT) and code[7:10] == COMPARE_RAX and code[15] == 0x74:
            if code[ADDRESS_AT : ADDRESS_AT + 3] == ADDRESS_RAX_RDI:
                offset = struct.unpack_from("<i", code, ADDRESS_AT + 3)[0]
                return elf.dynamic_objects["_PyRuntime"] + offset + 4
    except (ElfError, struct.error, ValueError, KeyError, IndexError):
        return None
    return None


def unknown_interpreter(elf: ElfFile, walked: bool) -> str | None:
    """The line that says a module is a CPython whose frames are not walked (walked: whether
    the engine walks it), else None."""
    version = interpreter_version(elf)
    if version is None or walked:
        return None
    return (
        f"{elf.path} is CPython {version >> 24}.{version >> 16 & 0xFF}, whose frames leaktrace does not"
        " walk (it knows 3.11's): its stacks have native frames only"
    )
