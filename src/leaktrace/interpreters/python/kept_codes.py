"""The code objects the preload library keeps for CPython's frames (abi/record.h's
python_code_table at leaktrace_python_codes): read in place from the stopped process, or
from the file the library writes at exit. The process wrote them: every size is bounded
and every range checked."""

from __future__ import annotations

from leaktrace.abi.record import PYTHON_CODE, PYTHON_CODE_TABLE, PYTHON_CODES, PYTHON_TEXT
from leaktrace.interpreters.interface import Codes, DamagedCodes, Read
from leaktrace.interpreters.python.code_objects import ENCODINGS
from leaktrace.model.snapshot import InterpretedCode

SLOTS_AT = PYTHON_CODE_TABLE.size
TEXT_AT = SLOTS_AT + PYTHON_CODES * PYTHON_CODE.size
TABLE_BYTES = TEXT_AT + PYTHON_TEXT  # the whole table: the most its exit file holds


def parse_python_codes(data: bytes, pid: int) -> Codes:
    """(pid, code address) -> the code, from the table's bytes (its struct, slots and used text)."""
    if len(data) < TEXT_AT:
        raise DamagedCodes(f"pid {pid}'s Python code table is cut short ({len(data)} bytes)")
    _, count, text_used = PYTHON_CODE_TABLE.unpack_from(data)
    if count > PYTHON_CODES or text_used > PYTHON_TEXT or len(data) < TEXT_AT + text_used:
        raise DamagedCodes(f"pid {pid}'s Python code table says {count} codes in {text_used} bytes")
    found = {}
    for (
        code,
        _,
        text,
        first_line,
        changed,
        name_length,
        file_length,
        table_length,
        name_kind,
        file_kind,
    ) in PYTHON_CODE.iter_unpack(data[SLOTS_AT:TEXT_AT]):
        if not code:
            continue
        end = text + name_length + file_length + table_length
        if end > text_used or name_kind not in ENCODINGS or file_kind not in ENCODINGS:
            raise DamagedCodes(f"pid {pid}'s Python code at {code:#x} lies outside its table")
        at = TEXT_AT + text
        name = data[at : at + name_length].decode(ENCODINGS[name_kind], errors="replace")
        at += name_length
        file = data[at : at + file_length].decode(ENCODINGS[file_kind], errors="replace")
        at += file_length
        line = first_line - (1 << 32) if first_line >= 1 << 31 else first_line  # an int in the object
        found[pid, code] = InterpretedCode(name, file, line, data[at : at + table_length], bool(changed))
    return found


def python_codes_in_place(read: Read, pointer_at: int, pid: int) -> Codes | None:
    """The table of a stopped process, found through the library's pointer to it ({} where it
    has none: not a Python program); None while a thread holds its lock (read again later)."""
    pointer = read(pointer_at, 8)
    table = int.from_bytes(pointer, "little") if len(pointer) == 8 else 0
    if not table:
        return {}
    head = read(table, TEXT_AT)
    if len(head) < TEXT_AT:
        raise DamagedCodes(f"pid {pid}'s Python code table at {table:#x} cannot be read")
    lock, _, text_used = PYTHON_CODE_TABLE.unpack_from(head)
    if lock:
        return None
    return parse_python_codes(head + read(table + TEXT_AT, min(text_used, PYTHON_TEXT)), pid)
