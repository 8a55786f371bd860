"""CPython's code objects read from a traced process (interpreters/code_capture.py calls these
through the interpreter's row): name, file, first line and line table. The process is hostile
input: every read is bounded, and every object's type is checked by its type's name."""

from __future__ import annotations

import struct

from leaktrace.interpreters.interface import Read
from leaktrace.interpreters.python.layout import (
    PYTHON_BYTES_DATA,
    PYTHON_BYTES_SIZE,
    PYTHON_NAME_MOST,
    PYTHON_STR_LENGTH,
    PYTHON_STR_STATE,
    PYTHON_TYPE_NAME,
)
from leaktrace.interpreters.python.versions import PythonOffsets
from leaktrace.model.snapshot import InterpretedCode

ENCODINGS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}  # PEP 393's character widths
MOST_LINETABLE = 1 << 18


def _type_name(read: Read, obj: int) -> bytes:
    head = read(obj, 16)
    if len(head) < 16:
        return b""
    (name_at,) = struct.unpack("<Q", read(struct.unpack_from("<Q", head, 8)[0] + PYTHON_TYPE_NAME, 8) or b"\0" * 8)
    return read(name_at, 8).split(b"\0")[0]


def read_string(read: Read, row: PythonOffsets, obj: int) -> str | None:
    """A str object's text (its first PYTHON_NAME_MOST characters); None if it is not a compact str."""
    head = read(obj, PYTHON_STR_STATE + 4)
    if len(head) < PYTHON_STR_STATE + 4 or _type_name(read, obj) != b"str":
        return None
    (length,) = struct.unpack_from("<q", head, PYTHON_STR_LENGTH)
    (state,) = struct.unpack_from("<I", head, PYTHON_STR_STATE)
    kind, compact, ascii_only = state >> 2 & 7, state >> 5 & 1, state >> 6 & 1
    if not compact or kind not in ENCODINGS or length < 0:
        return None
    length = min(length, PYTHON_NAME_MOST)
    data = read(obj + (row.str_ascii_data if ascii_only else row.str_compact_data), length * kind)
    return data[: len(data) // kind * kind].decode(ENCODINGS[kind], errors="replace")


def read_bytes(read: Read, obj: int) -> bytes | None:
    head = read(obj, PYTHON_BYTES_SIZE + 8)
    if len(head) < PYTHON_BYTES_SIZE + 8 or _type_name(read, obj) != b"bytes":
        return None
    (size,) = struct.unpack_from("<q", head, PYTHON_BYTES_SIZE)
    return read(obj + PYTHON_BYTES_DATA, min(size, MOST_LINETABLE)) if 0 <= size else None


def code_fields(read: Read, row: PythonOffsets, code: int) -> tuple[int, ...] | None:
    """What tells one code object from another at an address; None if no code object is there."""
    head = read(code, row.code_instructions)
    if len(head) < row.code_instructions or _type_name(read, code) != b"code":
        return None
    first_line = struct.unpack_from("<i", head, row.code_first_line)[0]
    pointers = (row.code_filename, row.code_qualname, row.code_linetable)
    return (first_line, *(struct.unpack_from("<Q", head, at)[0] for at in pointers))


def read_code(read: Read, row: PythonOffsets, fields: tuple[int, ...]) -> InterpretedCode | None:
    first_line, filename, qualname, linetable = fields
    name, file = read_string(read, row, qualname), read_string(read, row, filename)
    table = read_bytes(read, linetable)
    if name is None or file is None or table is None:
        return None
    return InterpretedCode(name, file, first_line, table)
