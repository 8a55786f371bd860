"""The CPython versions whose frames both engines walk, one row a version of python_frames.h's struct
python_offsets. 3.11 and 3.12 are rows of ours (CPython's headers, checked on the interpreters
the tests run); from 3.13 on, the interpreter says where things are in _Py_DebugOffsets, at the
start of _PyRuntime, and DEBUG_WORDS says which of its words gives each field. The preload
library reads the same table from python_versions.h, which this module writes:

    python -m leaktrace.interpreters.python.versions

tests/unit/test_layouts.py fails when that header is stale.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from leaktrace.interpreters.python.layout import (
    PYTHON_BYTES_DATA,
    PYTHON_BYTES_SIZE,
    PYTHON_FRAME_HEAD,
    PYTHON_NO_CFRAME,
    PYTHON_OFFSETS,
    PYTHON_STR_LENGTH,
    PYTHON_STR_STATE,
    PYTHON_TYPE_NAME,
)


class PythonOffsets(NamedTuple):
    """python_frames.h's struct python_offsets, field for field."""

    version: int
    tstate_frame: int
    cframe_frame: int
    frame_code: int
    frame_previous: int
    frame_instruction: int
    frame_entry: int
    shim_owner: int
    code_first_line: int
    code_filename: int
    code_qualname: int
    code_linetable: int
    code_instructions: int
    str_ascii_data: int
    str_compact_data: int
    unused: int = 0

    def packed(self) -> bytes:
        return PYTHON_OFFSETS.pack(*self)


# Include/internal/pycore_frame.h, pycore_code.h, cpython/unicodeobject.h of each version.
ROWS = {
    0x030B: PythonOffsets(0x030B, 0x38, 0x08, 0x20, 0x30, 0x38, 0x44, 0, 0x48, 0x70, 0x80, 0x88, 0xB8, 48, 72),
    0x030C: PythonOffsets(0x030C, 0x38, 0x00, 0x00, 0x08, 0x38, 0x46, 3, 0x44, 0x70, 0x80, 0x88, 0xC0, 40, 56),
}

DEBUG_COOKIE = b"xdebugpy"
DEBUG_VERSIONS = (0x030D,)  # the versions whose _Py_DebugOffsets is laid out as DEBUG_WORDS says
DEBUG_VERSION_WORD = 1  # PY_VERSION_HEX
DEBUG_FREE_THREADED_WORD = 2
# Each field, in PythonOffsets' order: (the word of _Py_DebugOffsets that gives it, or -1 for none;
# what is added).
DEBUG_WORDS: dict[str, tuple[int, int]] = {
    "version": (-1, 0),  # from DEBUG_VERSION_WORD
    "tstate_frame": (23, 0),  # thread_state.current_frame
    "cframe_frame": (-1, PYTHON_NO_CFRAME),
    "frame_code": (30, 0),  # interpreter_frame.executable
    "frame_previous": (29, 0),
    "frame_instruction": (31, 0),  # instr_ptr
    "frame_entry": (33, 0),  # owner
    "shim_owner": (-1, 3),  # FRAME_OWNED_BY_CSTACK
    "code_first_line": (39, 0),
    "code_filename": (35, 0),
    "code_qualname": (37, 0),
    "code_linetable": (38, 0),
    "code_instructions": (43, 0),  # co_code_adaptive
    "str_ascii_data": (70, 0),  # unicode_object.asciiobject_size
    "str_compact_data": (70, 16),  # then utf8_length and utf8
    "unused": (-1, 0),
}
# Words that must hold what python_frames.h assumes of every version, else the layout is not the one known.
DEBUG_CHECKS = {
    47: PYTHON_TYPE_NAME,
    68: PYTHON_STR_STATE,
    69: PYTHON_STR_LENGTH,
    65: PYTHON_BYTES_SIZE,
    66: PYTHON_BYTES_DATA,
}
DEBUG_WORD_COUNT = 1 + max(max(word for word, _ in DEBUG_WORDS.values()), *DEBUG_CHECKS)
FRAME_FIELDS = ("frame_code", "frame_previous", "frame_instruction")  # words of a frame's head


def debug_words(runtime: bytes) -> tuple[int, ...] | None:
    """_PyRuntime's first words, where they are a _Py_DebugOffsets (its cookie); else None."""
    if len(runtime) < DEBUG_WORD_COUNT * 8 or not runtime.startswith(DEBUG_COOKIE):
        return None
    return struct.unpack_from(f"<{DEBUG_WORD_COUNT}Q", runtime)


def free_threaded(words: Sequence[int]) -> bool:
    return bool(words[DEBUG_FREE_THREADED_WORD])


def offsets_from_debug(words: Sequence[int]) -> PythonOffsets | None:
    """The row a _Py_DebugOffsets gives, where its version's layout is known and it holds
    what the walks assume (a free-threaded build's frames are not walked)."""
    version = words[DEBUG_VERSION_WORD] >> 16
    if version not in DEBUG_VERSIONS or free_threaded(words):
        return None
    if any(words[word] != value for word, value in DEBUG_CHECKS.items()):
        return None
    values = [(words[word] if word >= 0 else 0) + addend for word, addend in DEBUG_WORDS.values()]
    row = PythonOffsets(*values)._replace(version=version)
    return row if sound(row) else None


def sound(row: PythonOffsets) -> bool:
    """Whether a row's frame fields lie in the head the walks read, and its others in a page."""
    in_head = all(getattr(row, name) + 8 <= PYTHON_FRAME_HEAD for name in FRAME_FIELDS)
    return (
        in_head
        and row.frame_entry < PYTHON_FRAME_HEAD
        and all(value < 4096 for value in row[1:15] if value != PYTHON_NO_CFRAME)
    )


def offsets_for(version: int, runtime: bytes) -> PythonOffsets | None:
    """The row of a CPython (version: PY_VERSION_HEX; runtime: _PyRuntime's first bytes), None
    for one the walks do not know."""
    if version >> 16 in ROWS:
        return ROWS[version >> 16]
    words = debug_words(runtime)
    return offsets_from_debug(words) if words is not None and words[DEBUG_VERSION_WORD] == version else None


HEADER = Path(__file__).with_name("python_versions.h")


def generated() -> str:
    """python_versions.h: the rows and the words of _Py_DebugOffsets, for the preload library."""
    rows = ",\n".join("    {" + ", ".join(f"{value:#x}" for value in row) + "}" for row in ROWS.values())
    words = ", ".join(str(word) for word, _ in DEBUG_WORDS.values())
    addends = ", ".join(f"{addend:#x}" for _, addend in DEBUG_WORDS.values())
    checks = ", ".join(f"{{{word}, {value}}}" for word, value in DEBUG_CHECKS.items())
    return f"""// Generated by interpreters/python/versions.py (the table); tests/unit/test_layouts.py checks it.
#ifndef LEAKTRACE_PYTHON_VERSIONS_H
#define LEAKTRACE_PYTHON_VERSIONS_H
// clang-format off

#define PYTHON_ROWS {len(ROWS)}
static const struct python_offsets python_rows[PYTHON_ROWS] = {{
{rows},
}};
#define PYTHON_DEBUG_COOKIE "{DEBUG_COOKIE.decode()}"
#define PYTHON_DEBUG_VERSIONS {{{", ".join(f"{v:#x}" for v in DEBUG_VERSIONS)}}}
#define PYTHON_DEBUG_VERSION_WORD {DEBUG_VERSION_WORD}
#define PYTHON_DEBUG_FREE_THREADED_WORD {DEBUG_FREE_THREADED_WORD}
#define PYTHON_DEBUG_WORD_COUNT {DEBUG_WORD_COUNT}
static const int python_debug_words[{len(DEBUG_WORDS)}] = {{{words}}};
static const uint32_t python_debug_addends[{len(DEBUG_WORDS)}] = {{{addends}}};
static const uint32_t python_debug_checks[][2] = {{{checks}}};

// clang-format on
#endif
"""


def main() -> None:
    HEADER.write_text(generated())


if __name__ == "__main__":
    main()
