"""The version table against the interpreters themselves: for each CPython on the machine
(python_interpreters.py), the row leaktrace reads from its module (the table's, or its
_Py_DebugOffsets) holds where a live code object and str keep their fields, the thread-state
key it finds gives the interpreter's own thread state, and the line-table parser gives the
interpreter's own line (co_positions) for every instruction of some of its modules. Then a
_Py_DebugOffsets that is not one the walk knows is refused, the BPF walk's shim words fold, and
the eval loop's cold part is found from the FDEs where the module has no name for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from python_interpreters import INTERPRETERS, Interpreter, placed

from leaktrace.analysis.symbolize import Symbolizer
from leaktrace.interpreters.python.frame_words import (
    EVAL_COLD,
    EVAL_FUNCTION,
    cold_part,
    encode_python_word,
    folded_shims,
    line_of,
)
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
from leaktrace.model.snapshot import AllocationGroup, Counters, ProcessInfo, Snapshot
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.process import parse_maps
from leaktrace.unwind.tables import compile_eh_frame

FACTS = Path(__file__).parent / "native" / "python_facts.py"


def interpreter_module(program: str) -> str:
    """The file that holds the interpreter: its libpython where it has one, else the program."""
    linked = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    found = [line.split()[2] for line in linked.splitlines() if "libpython" in line and "=>" in line]
    return found[0] if found else program


# Those on the machine and the required ones (missing: a failure in CI); one in a root of its own
# runs there by chroot, which needs root: the root run of the suite has it.
RUNNABLE = [i for i in INTERPRETERS if (i.required or i.path) and (i.root is None or os.geteuid() == 0)]


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


def jumps_before(module: str, function: int, end: int) -> set[int]:
    """Targets of the function's jumps that lie before its start (objdump's reading)."""
    listing = subprocess.run(
        ["objdump", "-d", f"--start-address={function:#x}", f"--stop-address={end:#x}", module],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    targets = set()
    for line in listing.splitlines():
        words = line.split("\t")
        if len(words) == 3 and words[2].startswith("j"):
            target = words[2].split()[1:2]
            if target and all(c in "0123456789abcdef" for c in target[0]) and int(target[0], 16) < function:
                targets.add(int(target[0], 16))
    return targets


def named_cold_part(module: str) -> tuple[int, int] | None:
    """The cold part's range where the module's own symbols name it (nm's reading)."""
    listing = subprocess.run(["nm", "-S", "--defined-only", module], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        words = line.split()
        if len(words) == 4 and words[3] == EVAL_COLD:
            return int(words[0], 16), int(words[0], 16) + int(words[1], 16)
    return None


def test_the_eval_loop_s_cold_part_is_found_from_its_fdes(facts):
    """cold_part, from the FDEs alone, against the module's own name for it where it keeps one
    (pyenv's 3.12), else against the function's code: its jumps out to before its start all
    land in the part found; where it was not split there are none (pyenv's 3.13)."""
    _, elf, _ = facts
    function = elf.dynamic_functions[EVAL_FUNCTION]
    fdes = [(start, end) for start, end, _ in compile_eh_frame(elf)]
    [end] = [end for start, end in fdes if start == function]
    cold, named = cold_part(fdes, function), named_cold_part(elf.path)
    if named is not None:
        assert cold == named
        return
    targets = jumps_before(elf.path, function, end)
    if cold is None:
        assert not targets
    else:
        assert targets and all(cold[0] <= target < cold[1] for target in targets), (cold, sorted(targets)[:5])


def test_a_frame_in_the_unnamed_cold_part_is_spliced():
    """Debian's python3.11 (this process's program) keeps no name for the cold part: a return
    address there is named for it, and the Python run takes its place (as root: the symbolizer
    opens modules through /proc/PID/map_files, which only root may)."""
    elf = ElfFile("/usr/bin/python3.11")
    cold = cold_part([(s, e) for s, e, _ in compile_eh_frame(elf)], elf.dynamic_functions[EVAL_FUNCTION])
    assert cold is not None and elf.function_at(cold[0] + 16) is None
    if os.geteuid() != 0:
        return
    with open("/proc/self/maps") as maps:
        text = maps.read()
    program = os.path.realpath(sys.executable)
    start = min(m.start for m in parse_maps(text) if m.path == program)
    address = start - elf.file_offset_to_vaddr(0) + cold[0] + 17  # a return address in the cold part
    native, python = 0x1000, encode_python_word(0x7000, 2, True)
    me = ProcessInfo(os.getpid(), "pytest", maps=text)
    snapshot = Snapshot(0.0, (AllocationGroup(me.pid, 8, 1, (native, address, python)),), Counters(), {me.pid: me})
    symbolized = Symbolizer(line_info=False).symbolize(snapshot)
    assert symbolized.frames[me.pid, address].function == EVAL_COLD
    assert symbolized.words_of(symbolized.snapshot.groups[0]) == (native, python)
