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
from leaktrace.interpreters.python.code_objects import PythonCodeCapture
from leaktrace.interpreters.python.frame_words import (
    encode_python_word,
    is_python_word,
    python_word,
    spliced_stack,
)
from leaktrace.interpreters.python.interpreter import (
    interpreter_offsets,
    interpreter_version,
    unknown_interpreter,
    walked_interpreter,
)
from leaktrace.model.snapshot import AllocationGroup, Counters, ProcessInfo, PythonCode, Snapshot
from leaktrace.platform.elf import ElfFile
from leaktrace.sources.preload.python_code_table import DamagedCodes, parse_python_codes


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
    row = interpreter_offsets(ElfFile("/usr/bin/python3.11"))  # this process's
    found = PythonCodeCapture(lambda pid: row).attach(snapshot).python_code
    assert list(found) == [(me.pid, id(code))]  # a list, and an unmapped address: no code there
    read = found[me.pid, id(code)]
    assert (read.qualname, read.filename, read.first_line) == (code.co_qualname, code.co_filename, code.co_firstlineno)
    assert read.linetable == code.co_linetable and not read.changed


def code_table(text_used: int, slot: tuple) -> bytes:
    """The library's code table (record.h) with one slot filled, and its text."""
    slots = bytearray(PYTHON_CODES * PYTHON_CODE.size)
    PYTHON_CODE.pack_into(slots, 5 * PYTHON_CODE.size, *slot)
    return PYTHON_CODE_TABLE.pack(0, 1, text_used) + bytes(slots)


def test_the_library_s_code_table_is_read_and_a_damaged_one_refused():
    name, file, table = "Worker.run", "/srv/ü.py".encode("utf-16-le"), bytes([0x80, 0x81, 0x82])
    text = name.encode() + file + table
    good = (0x7000, 1, 0, 12, 0, len(name), len(file), len(table), 1, 2)
    assert parse_python_codes(code_table(len(text), good) + text, 9) == {
        (9, 0x7000): PythonCode("Worker.run", "/srv/ü.py", 12, table)
    }
    for damaged in (
        code_table(len(text), (*good[:7], len(table) + 1, 1, 2)) + text,  # past the text used
        code_table(len(text), (*good[:8], 3, 2)) + text,  # no such character width
        code_table(PYTHON_TEXT + 1, good) + text,  # more text than the table holds
        code_table(len(text), good),  # its text cut off
    ):
        with pytest.raises(DamagedCodes):
            parse_python_codes(damaged, 9)


def test_an_interpreter_the_walk_does_not_know_is_said(tmp_path):
    """A module exporting 3.15's Py_Version (built here): not walked, and one line says so."""
    source, library = tmp_path / "fake.c", tmp_path / "libpython3.15.so"
    source.write_text(
        "const unsigned long Py_Version = 0x030f00a1;\nvoid *PyGILState_GetThisThreadState(void) { return 0; }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    fake, debian = ElfFile(str(library)), ElfFile("/usr/bin/python3.11")
    assert walked_interpreter(fake) is None and interpreter_version(fake) == 0x030F00A1
    assert unknown_interpreter(fake, walked=False) == (
        f"{library} is CPython 3.15, a version it does not know: leaktrace does not walk its frames"
        " (it walks 3.11, 3.12 and 3.13), so its stacks have native frames only"
    )
    assert unknown_interpreter(debian, walked=walked_interpreter(debian) is not None) is None
