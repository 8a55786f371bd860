"""The version table against the interpreters themselves: for each CPython on the machine
(python_interpreters.py), the row leaktrace reads from its module (the table's, or its
_Py_DebugOffsets) holds where a live code object and str keep their fields, the thread-state
key it finds gives the interpreter's own thread state, and the line-table parser gives the
interpreter's own line (co_positions) for every instruction of some of its modules. Then a
_Py_DebugOffsets that is not one the walk knows is refused, and the BPF walk's shim words fold."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from python_interpreters import INTERPRETERS, Interpreter, placed

from leaktrace.interpreters.python.frame_words import encode_python_word, folded_shims, line_of
from leaktrace.interpreters.python.interpreter import interpreter_offsets, thread_state_key
from leaktrace.interpreters.python.layout import PYTHON_NO_CFRAME, PYTHON_SHIM_WORD
from leaktrace.interpreters.python.versions import (
    DEBUG_COOKIE,
    DEBUG_FREE_THREADED_WORD,
    DEBUG_VERSION_WORD,
    DEBUG_WORD_COUNT,
    DEBUG_WORDS,
    ROWS,
    PythonOffsets,
    debug_words,
    offsets_from_debug,
)
from leaktrace.platform.elf import ElfFile

FACTS = Path(__file__).parent / "native" / "python_facts.py"


def interpreter_module(program: str) -> str:
    """The file that holds the interpreter: its libpython where it has one, else the program."""
    linked = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    found = [line.split()[2] for line in linked.splitlines() if "libpython" in line and "=>" in line]
    return found[0] if found else program


# One in a root of its own runs there by chroot, which needs root: the root run of the suite has it.
RUNNABLE = [i for i in INTERPRETERS if i.root is None or os.geteuid() == 0]


@pytest.fixture(scope="module", params=RUNNABLE, ids=lambda i: i.name)
def facts(request, tmp_path_factory) -> tuple[Interpreter, ElfFile, dict]:
    interpreter: Interpreter = request.param
    module = interpreter_module(interpreter.wanted())
    elf = ElfFile(module)
    key = thread_state_key(elf)
    assert key is not None, f"{module}: no thread-state key found"
    relative = key - elf.file_offset_to_vaddr(0)
    _, facts_script = placed(interpreter, FACTS, tmp_path_factory.mktemp("facts"))
    seen_module = interpreter.pattern if interpreter.root else module
    said = subprocess.run(
        interpreter.command(facts_script, seen_module, hex(relative)), capture_output=True, text=True, check=True
    )
    return interpreter, elf, json.loads(said.stdout)


def test_the_row_holds_where_live_objects_keep_their_fields(facts):
    interpreter, elf, said = facts
    row = interpreter_offsets(elf)
    assert row is not None and f"{row.version >> 8}.{row.version & 0xFF}" == interpreter.version
    assert row.code_instructions == said["code_instructions"]
    for field in ("code_filename", "code_qualname", "code_linetable", "code_first_line"):
        assert getattr(row, field) in said[field], field
    assert (row.str_ascii_data, row.str_compact_data) == (said["str_ascii_data"], said["str_compact_data"])
    assert (row.cframe_frame == PYTHON_NO_CFRAME) == (row.version >= 0x030D)


def test_the_thread_state_key_gives_the_interpreter_s_own_thread_state(facts):
    _, _, said = facts
    assert said["key"] == [1, True]


def test_the_line_table_gives_the_interpreter_s_own_line_for_every_instruction(facts):
    _, _, said = facts
    checked = 0
    for table, first_line, lines in said["positions"]:
        for index, line in enumerate(lines):
            assert line_of(bytes.fromhex(table), first_line, index) == line, (first_line, index)
            checked += 1
    assert checked > 5_000


def debug_block(version: int = 0x030D00F0, free_threaded: int = 0) -> list[int]:
    """A _Py_DebugOffsets as 3.13.0 lays it out, as words (its cookie first)."""
    words = [0] * DEBUG_WORD_COUNT
    words[0] = int.from_bytes(DEBUG_COOKIE, "little")
    words[DEBUG_VERSION_WORD], words[DEBUG_FREE_THREADED_WORD] = version, free_threaded
    for name, value in zip(DEBUG_WORDS, (0, 0x48, 0, 0, 8, 0x38, 0x46, 0, 0x44, 0x70, 0x80, 0x88, 0xC8, 0x28)):
        word, _ = DEBUG_WORDS[name]
        if word >= 0:
            words[word] = value
    words[47], words[65], words[66], words[68], words[69] = 24, 16, 32, 32, 16
    return words


def test_a_debug_offsets_block_gives_its_row_and_others_are_refused():
    row = offsets_from_debug(debug_block())
    assert row is not None and row.version == 0x030D and row.tstate_frame == 0x48 and row.shim_owner == 3
    assert (row.str_ascii_data, row.str_compact_data, row.cframe_frame) == (0x28, 0x38, PYTHON_NO_CFRAME)
    assert offsets_from_debug(debug_block(free_threaded=1)) is None  # 3.13t: not walked
    assert offsets_from_debug(debug_block(version=0x030E00F0)) is None  # 3.14 lays it out otherwise
    shifted = debug_block()
    shifted[47] = 32  # a field where 3.13.0 has another: not the layout known
    assert offsets_from_debug(shifted) is None
    far = debug_block()
    far[31] = 0x100  # a frame field past the head the walks read
    assert offsets_from_debug(far) is None
    assert debug_words(b"notdebug" + bytes(DEBUG_WORD_COUNT * 8)) is None
    assert set(ROWS) == {0x030B, 0x030C} and tuple(DEBUG_WORDS) == PythonOffsets._fields


def test_shim_words_mark_the_frame_before_them_and_go():
    native, one, two = 0x401000, encode_python_word(0x1000, 3, False), encode_python_word(0x2000, 4, False)
    stack = (native, one, PYTHON_SHIM_WORD, two, PYTHON_SHIM_WORD, native + 1)
    assert folded_shims(stack) == (
        native,
        encode_python_word(0x1000, 3, True),
        encode_python_word(0x2000, 4, True),
        native + 1,
    )
    assert folded_shims((native, PYTHON_SHIM_WORD)) == (native,)  # no Python frame before it: nothing to mark
    assert folded_shims((native, one)) == (native, one)
