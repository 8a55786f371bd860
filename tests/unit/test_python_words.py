"""The Python frames' pieces in user space: the word format, the 3.11 line table against
CPython's own answer, the splice, the interpreter's thread-state key, and code objects read
from a live process (this one: the tests run on Debian's CPython 3.11)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import types

import pytest

from leaktrace.model.snapshot import AllocationGroup, Counters, ProcessInfo, PythonCode, Snapshot
from leaktrace.platform.elf import ElfFile
from leaktrace.sources.preload.layout import PYTHON_CODE, PYTHON_CODE_TABLE, PYTHON_CODES, PYTHON_TEXT
from leaktrace.sources.preload.python_codes import DamagedCodes, parse_python_codes
from leaktrace.sources.python_code import PythonCodeCapture
from leaktrace.unwind.python_code import encode_python_word, is_python_word, line_of, python_word, spliced_stack
from leaktrace.unwind.python_interpreter import interpreter_version, thread_state_key, unknown_interpreter


def code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def test_line_table_gives_cpython_s_own_line_for_every_instruction():
    import asyncio.base_events
    import email.message
    import json.decoder

    checked = 0
    for module in (asyncio.base_events, email.message, json.decoder):
        with open(module.__file__) as source:
            top = compile(source.read(), module.__file__, "exec")
        for code in code_objects(top):
            for index, (line, *_) in enumerate(code.co_positions()):
                assert line_of(code.co_linetable, code.co_firstlineno, index) == line, (code, index)
                checked += 1
    assert checked > 10_000


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


def test_thread_state_key_of_debian_python_is_the_one_this_thread_uses():
    key_at = thread_state_key(ElfFile("/usr/bin/python3.11"))
    assert key_at is not None  # /usr/bin/python3.11 is not PIE: its addresses are its link-time ones
    made, key = ctypes.c_int.from_address(key_at - 4).value, ctypes.c_uint.from_address(key_at).value
    libc = ctypes.CDLL(None)
    libc.pthread_getspecific.restype = ctypes.c_void_p
    ctypes.pythonapi.PyGILState_GetThisThreadState.restype = ctypes.c_void_p
    assert made == 1
    assert libc.pthread_getspecific(key) == ctypes.pythonapi.PyGILState_GetThisThreadState()


def sample_function():
    return 1


def test_code_objects_are_read_from_the_process_and_hostile_words_give_nothing():
    code = sample_function.__code__
    words = (encode_python_word(id(code), 0, True), encode_python_word(id([]) & ~7, 0, True), py(0x10))
    me = ProcessInfo(os.getpid(), "pytest")
    snapshot = Snapshot(0.0, (AllocationGroup(me.pid, 8, 1, (NATIVE, *words)),), Counters(), {me.pid: me})
    found = PythonCodeCapture().attach(snapshot).python_code
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
    """A module exporting 3.12's Py_Version (built here): not walked, and one line says so."""
    source, library = tmp_path / "fake.c", tmp_path / "libpython3.12.so"
    source.write_text(
        "const unsigned long Py_Version = 0x030c01f0;\nvoid *PyGILState_GetThisThreadState(void) { return 0; }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    fake, debian = ElfFile(str(library)), ElfFile("/usr/bin/python3.11")
    assert thread_state_key(fake) is None and interpreter_version(fake) == 0x030C01F0
    assert unknown_interpreter(fake, walked=False) == (
        f"{library} is CPython 3.12, whose frames leaktrace does not walk (it knows 3.11's):"
        " its stacks have native frames only"
    )
    assert unknown_interpreter(debian, walked=thread_state_key(debian) is not None) is None
