"""The code objects a snapshot's Python frames name, read from the traced process the first
time each address is seen (both engines), unless the source kept them itself (the preload
library does, when a frame first names one): name, file, first line and line table. The
process is hostile input: every read is bounded, every object's type is checked by its
type's name, and an address that holds other fields on a later look is marked changed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
from collections.abc import Callable, Iterator

from leaktrace.interpreters.python.frame_words import is_python_word, python_word
from leaktrace.interpreters.python.layout import (
    PYTHON_BYTES_DATA,
    PYTHON_BYTES_SIZE,
    PYTHON_NAME_MOST,
    PYTHON_STR_LENGTH,
    PYTHON_STR_STATE,
    PYTHON_TYPE_NAME,
)
from leaktrace.interpreters.python.versions import PythonOffsets
from leaktrace.model.snapshot import PythonCode, Snapshot
from leaktrace.platform.arch import HOST

Read = Callable[[int, int], bytes]  # (address, size) -> the bytes there; short where unreadable
OffsetsOf = Callable[[int], PythonOffsets | None]  # pid -> its interpreter's row (None: not known)
ENCODINGS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}  # PEP 393's character widths
MOST_LINETABLE = 1 << 18


@contextlib.contextmanager
def process_memory(pid: int) -> Iterator[Read]:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(address: int, size: int) -> bytes:
        try:
            return os.pread(fd, size, address) if 0 < address < 1 << HOST.user_address_bits else b""
        except OSError:
            return b""

    try:
        yield read
    finally:
        os.close(fd)


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


def read_code(read: Read, row: PythonOffsets, fields: tuple[int, ...]) -> PythonCode | None:
    first_line, filename, qualname, linetable = fields
    name, file = read_string(read, row, qualname), read_string(read, row, filename)
    table = read_bytes(read, linetable)
    if name is None or file is None or table is None:
        return None
    return PythonCode(name, file, first_line, table)


class PythonCodeCapture:
    """Code objects kept across one trace's snapshots, by (pid, address); offsets_of gives
    each process's interpreter row."""

    def __init__(self, offsets_of: OffsetsOf) -> None:
        self._offsets_of = offsets_of
        self._known: dict[tuple[int, int], PythonCode] = {}
        self._fields: dict[tuple[int, int], tuple[int, ...]] = {}

    def attach(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the code its Python frames name: read now from each live process
        for addresses not seen before (and checked for those seen), kept from before for the rest."""
        wanted = {
            (item.pid, python_word(word).code)
            for item in snapshot.stacked_items()
            for word in item.stack
            if is_python_word(word)
        }
        for key, code in snapshot.python_code.items():  # kept by the source itself when first seen
            known = self._known.get(key)
            if known is None or code.changed and not known.changed:
                self._known[key] = code
        if not wanted:
            return snapshot
        for pid in {pid for pid, _ in wanted}:
            process, row = snapshot.processes.get(pid), self._offsets_of(pid)
            if process is None or process.exited or row is None:
                continue
            try:
                with process_memory(pid) as read:
                    for key in sorted(k for k in wanted if k[0] == pid):
                        self._look(read, row, key)
            except OSError:
                continue  # gone: what was kept serves
        found = {key: self._known[key] for key in wanted if key in self._known}
        return dataclasses.replace(snapshot, python_code=found)

    def _look(self, read: Read, row: PythonOffsets, key: tuple[int, int]) -> None:
        fields = code_fields(read, row, key[1])
        if fields is None:
            return
        known = self._known.get(key)
        if known is None:
            code = read_code(read, row, fields)
            if code is not None:
                self._known[key], self._fields[key] = code, fields
        elif fields != self._fields.setdefault(key, fields) and not known.changed:
            self._known[key] = dataclasses.replace(known, changed=True)
