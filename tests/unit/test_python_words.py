"""The Python frames' pieces in user space: the word format, the splice, code objects read
from a live process (this one: the tests run on Debian's CPython 3.11), the library's code
table, and the line for a version the walk does not know (test_python_versions.py holds the
table, the key and the line tables against each interpreter)."""

from __future__ import annotations

import os
import subprocess
import types

import pytest

from leaktrace.abi.record import PYTHON_CODE, PYTHON_CODE_TABLE, PYTHON_CODES, PYTHON_TEXT
from leaktrace.interpreters.code_capture import CodeCapture, process_memory
from leaktrace.interpreters.interface import DamagedCodes
from leaktrace.interpreters.python.code_objects import read_bytes, read_string
from leaktrace.interpreters.python.cpython import CPYTHON
from leaktrace.interpreters.python.frame_words import (
    encode_python_word,
    is_python_word,
    python_word,
    spliced_stack,
)
from leaktrace.interpreters.python.interpreter import interpreter_offsets, interpreter_version
from leaktrace.interpreters.python.kept_codes import TEXT_AT, python_codes_in_place
from leaktrace.interpreters.table import interpreter_of
from leaktrace.model.snapshot import AllocationGroup, Counters, InterpretedCode, ProcessInfo, Snapshot
from leaktrace.platform.elf import ElfFile


def code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def test_words_say_their_code_index_and_entry_and_are_no_address():
    word = encode_python_word(0x7F12_3456_7890, 4321, True)
    assert is_python_word(word) and python_word(word) == (0x7F12_3456_7890, 4321, True)
    assert python_word(encode_python_word(0x1000, None, False)) == (0x1000, None, False)
    assert not any(is_python_word(address) for address in (0, 0x401000, 0x7FFF_FFFF_F000, (1 << 47) - 1))
    assert interpreter_of(word) is CPYTHON and CPYTHON.code_address(word) == 0x7F12_3456_7890
    assert interpreter_of(0x401000) is None


NATIVE, EVAL = 0x1000, 0x2000  # a native frame, and one of the interpreter's eval loop


def py(code: int, entry: bool = False) -> int:
    return encode_python_word(code << 4, 1, entry)


def test_runs_of_python_frames_take_the_places_of_the_eval_frames():
    stack = (NATIVE, EVAL, NATIVE + 1, EVAL, NATIVE + 2, py(1), py(2, True), py(3), py(4, True))
    shown = spliced_stack(stack, lambda address: address == EVAL)
    assert shown == (NATIVE, py(1), py(2, True), NATIVE + 1, py(3), py(4, True), NATIVE + 2)


@pytest.mark.parametrize(
    "stack",
    [
        (NATIVE, EVAL, py(1, True), py(2, True)),  # more runs than eval frames (a native stack cut short)
        (NATIVE, EVAL, EVAL, py(1, True)),  # fewer
        (NATIVE, EVAL, py(1), py(2)),  # the Python frames cut before their entry frame
    ],
)
def test_no_splice_where_the_counts_disagree(stack):
    natives = tuple(word for word in stack if not is_python_word(word))
    pythons = tuple(word for word in stack if is_python_word(word))
    assert spliced_stack(stack, lambda address: address == EVAL) == natives + pythons


def sample_function():
    return 1


def test_code_objects_are_read_from_the_process_and_hostile_words_give_nothing():
    code = sample_function.__code__
    words = (encode_python_word(id(code), 0, True), encode_python_word(id([]) & ~7, 0, True), py(0x10))
    me = ProcessInfo(os.getpid(), "pytest")
    snapshot = Snapshot(0.0, (AllocationGroup(me.pid, 8, 1, (NATIVE, *words)),), Counters(), {me.pid: me})
    interpreter = CPYTHON.load(ElfFile("/usr/bin/python3.11")).attach(me.pid)  # this process's
    found = CodeCapture(lambda pid: interpreter).attach(snapshot).interpreted_code
    assert list(found) == [(me.pid, id(code))]  # a list, and an unmapped address: no code there
    read = found[me.pid, id(code)]
    assert (read.qualname, read.filename, read.first_line) == (code.co_qualname, code.co_filename, code.co_firstlineno)
    assert read.line_table == code.co_linetable and not read.changed
    frame = CPYTHON.frame(words[0], read)
    assert (frame.function, frame.line) == (code.co_qualname, next(code.co_lines())[2])


def test_strings_and_bytes_are_read_by_their_type_and_nothing_else_is():
    row = interpreter_offsets(ElfFile("/usr/bin/python3.11"))  # this process's
    wide, ascii_text, data = "Wörker ✓", "plain", b"\x00line table"
    with process_memory(os.getpid()) as read:
        assert (read_string(read, row, id(wide)), read_string(read, row, id(ascii_text))) == (wide, ascii_text)
        assert read_bytes(read, id(data)) == data
        assert read_string(read, row, id(data)) is None and read_bytes(read, id(wide)) is None
        assert read_string(read, row, 8) is None  # no object there


def test_the_library_s_table_is_read_in_place_only_when_unlocked():
    text = b"run" + b"/a.py"
    table = code_table(len(text), (0x7000, 1, 0, 3, 0, 3, 5, 0, 1, 1)) + text
    locked = PYTHON_CODE_TABLE.pack(1, 1, len(text)) + table[PYTHON_CODE_TABLE.size :]
    memory = {0x100: (0x5000).to_bytes(8, "little")}

    def reader(held: bytes):
        def read(address: int, size: int) -> bytes:
            if address == 0x5000:
                return held[:size]
            if address == 0x5000 + TEXT_AT:
                return held[TEXT_AT : TEXT_AT + size]
            return memory.get(address, b"\0" * 8)[:size]

        return read

    assert python_codes_in_place(reader(table), 0x200, 9) == {}  # no pointer: not a Python program
    assert python_codes_in_place(reader(locked), 0x100, 9) is None  # a thread is writing it
    assert python_codes_in_place(reader(table), 0x100, 9) == {(9, 0x7000): InterpretedCode("run", "/a.py", 3, b"")}


def code_table(text_used: int, slot: tuple) -> bytes:
    """The library's code table (record.h) with one slot filled, and its text."""
    slots = bytearray(PYTHON_CODES * PYTHON_CODE.size)
    PYTHON_CODE.pack_into(slots, 5 * PYTHON_CODE.size, *slot)
    return PYTHON_CODE_TABLE.pack(0, 1, text_used) + bytes(slots)


def test_the_library_s_code_table_is_read_and_a_damaged_one_refused():
    name, file, table = "Worker.run", "/srv/ü.py".encode("utf-16-le"), bytes([0x80, 0x81, 0x82])
    text = name.encode() + file + table
    good = (0x7000, 1, 0, 12, 0, len(name), len(file), len(table), 1, 2)
    assert CPYTHON.kept_codes(code_table(len(text), good) + text, 9) == {
        (9, 0x7000): InterpretedCode("Worker.run", "/srv/ü.py", 12, table)
    }
    for damaged in (
        code_table(len(text), (*good[:7], len(table) + 1, 1, 2)) + text,  # past the text used
        code_table(len(text), (*good[:8], 3, 2)) + text,  # no such character width
        code_table(PYTHON_TEXT + 1, good) + text,  # more text than the table holds
        code_table(len(text), good),  # its text cut off
    ):
        with pytest.raises(DamagedCodes):
            CPYTHON.kept_codes(damaged, 9)


def test_an_interpreter_the_walk_does_not_know_is_said(tmp_path):
    """A module exporting 3.15's Py_Version (built here): not walked, and one line says so."""
    source, library = tmp_path / "fake.c", tmp_path / "libpython3.15.so"
    source.write_text(
        "const unsigned long Py_Version = 0x030f00a1;\nvoid *PyGILState_GetThisThreadState(void) { return 0; }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    fake, debian = CPYTHON.load(ElfFile(str(library))), CPYTHON.load(ElfFile("/usr/bin/python3.11"))
    assert interpreter_version(ElfFile(str(library))) == 0x030F00A1
    assert fake.kernel_entry(0, 1) is None and fake.attach(1) is None
    said = (
        f"{library} is CPython 3.15, a version it does not know: leaktrace does not walk its frames"
        " (it walks 3.11, 3.12 and 3.13), so its stacks have native frames only"
    )
    assert fake.unwalked(in_kernel=True, on_musl=False) == fake.unwalked(in_kernel=False, on_musl=False) == said
    assert debian.unwalked(in_kernel=True, on_musl=False) is None and debian.kernel_entry(0, 1) is not None
    assert "on musl" in debian.unwalked(in_kernel=True, on_musl=True)
    assert CPYTHON.load(ElfFile("/bin/true")) is None
