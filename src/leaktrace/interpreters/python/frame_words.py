"""Python frames in a stack (python_frames.h's words): what a word says, and the line an instruction
is on from a code object's line table (the location table of CPython 3.11 to 3.13,
Objects/locations.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from leaktrace.interpreters.python.layout import (
    PYTHON_FRAME_CODE_MASK,
    PYTHON_FRAME_CODE_SHIFT,
    PYTHON_FRAME_ENTRY,
    PYTHON_FRAME_INDEX_MASK,
    PYTHON_FRAME_INDEX_SHIFT,
    PYTHON_FRAME_TAG,
    PYTHON_SHIM_WORD,
)

# The interpreter's C function whose frames the Python frames stand for, and its cold part
# (named by the module's local symbols, else found by cold_part).
EVAL_FUNCTION = "_PyEval_EvalFrameDefault"
EVAL_COLD = EVAL_FUNCTION + ".cold"
EVAL_FUNCTIONS = frozenset({EVAL_FUNCTION, EVAL_COLD})


def cold_part(fdes: list[tuple[int, int]], function: int) -> tuple[int, int] | None:
    """The range of a function's cold part, from a module's FDE ranges in .eh_frame's order: GCC
    emits a split function's two FDEs one after the other, so the FDE after the function's own,
    where it lies before it (.text.unlikely comes first), is the cold part. Where the function
    was not split the next FDE is another function's, after it (pyenv's 3.13.0): none."""
    for (start, _), after in zip(fdes, fdes[1:]):
        if start == function:
            return after if after[1] <= start else None
    return None


def named_like_python(path: str) -> bool:
    """Whether a file's name says it may hold a CPython: python* (a program), libpython* (a library)."""
    return os.path.basename(path).startswith(("python", "libpython"))


class PythonWord(NamedTuple):
    code: int  # the code object's address
    instruction: int | None  # its last instruction's index, in code units; None: not started, or past what a word holds
    entry: bool  # the first frame of its eval loop's run: the next frame out is another run's


def is_python_word(word: int) -> bool:
    return word & PYTHON_FRAME_TAG == PYTHON_FRAME_TAG


def python_word(word: int) -> PythonWord:
    index = word >> PYTHON_FRAME_INDEX_SHIFT & PYTHON_FRAME_INDEX_MASK
    return PythonWord(
        (word & PYTHON_FRAME_CODE_MASK) << PYTHON_FRAME_CODE_SHIFT,
        None if index == PYTHON_FRAME_INDEX_MASK else index,
        bool(word & PYTHON_FRAME_ENTRY),
    )


def encode_python_word(code: int, index: int | None, entry: bool) -> int:
    """The word the engines write (python_frame_word), for tests and recorded stacks."""
    held = PYTHON_FRAME_INDEX_MASK if index is None else min(index, PYTHON_FRAME_INDEX_MASK)
    return (
        PYTHON_FRAME_TAG
        | (PYTHON_FRAME_ENTRY if entry else 0)
        | held << PYTHON_FRAME_INDEX_SHIFT
        | (code >> PYTHON_FRAME_CODE_SHIFT) & PYTHON_FRAME_CODE_MASK
    )


def folded_shims(stack: tuple[int, ...]) -> tuple[int, ...]:
    """A stack as the BPF walk wrote it, each eval loop's shim word (3.12 on) folded into the
    Python frame before it, which began that run (the preload library folds them itself)."""
    if PYTHON_SHIM_WORD not in stack:
        return stack
    folded: list[int] = []
    for word in stack:
        if word != PYTHON_SHIM_WORD:
            folded.append(word)
        elif folded and is_python_word(folded[-1]):
            folded[-1] |= PYTHON_FRAME_ENTRY
    return tuple(folded)


def _varint(table: bytes, at: int) -> tuple[int, int]:
    """An unsigned varint of the table (6 bits a byte, 0x40: more follow) and where it ends."""
    value = shift = 0
    while at < len(table):
        byte = table[at]
        at += 1
        value |= (byte & 0x3F) << shift
        shift += 6
        if not byte & 0x40:
            break
    return value, at


def _signed_varint(table: bytes, at: int) -> tuple[int, int]:
    value, at = _varint(table, at)
    return (-(value >> 1) if value & 1 else value >> 1), at


def line_of(linetable: bytes, first_line: int, index: int) -> int | None:
    """The line of the instruction at index (code units), None where the table gives none."""
    line, at, unit = first_line, 0, 0
    while at < len(linetable):
        head = linetable[at]
        at += 1
        code, length = head >> 3 & 0xF, (head & 7) + 1
        here: int | None = line
        if code == 15:  # no location
            here = None
        elif code == 14:  # long form: line delta, end line delta, column, end column
            delta, at = _signed_varint(linetable, at)
            line += delta
            here = line
            for _ in range(3):
                _, at = _varint(linetable, at)
        elif code == 13:  # no column: line delta
            delta, at = _signed_varint(linetable, at)
            line += delta
            here = line
        elif code >= 10:  # one line: line delta code - 10, then two column bytes
            line += code - 10
            here = line
            at += 2
        else:  # short form: the same line, one column byte
            at += 1
        if unit <= index < unit + length:
            return here
        unit += length
    return None


def spliced_stack(stack: tuple[int, ...], runs_python: Callable[[int], bool]) -> tuple[int, ...]:
    """A stack's words in the order shown, innermost first: each run of Python frames (up to
    its entry frame) in place of the native frame of the interpreter that ran it (runs_python),
    paired in order. Where the two counts differ (a stack cut short), nothing is paired: the
    native frames, then the Python ones."""
    python = [word for word in stack if is_python_word(word)]
    if not python:
        return stack
    native = [word for word in stack if not is_python_word(word)]
    runs: list[list[int]] = [[]]
    for word in python:
        runs[-1].append(word)
        if python_word(word).entry:
            runs.append([])
    whole = not runs.pop()  # the last run ended at an entry frame
    interpreters = [at for at, word in enumerate(native) if runs_python(word)]
    if not whole or len(interpreters) != len(runs):
        return (*native, *python)
    shown: list[int] = []
    for at, word in enumerate(native):
        shown += runs.pop(0) if at in interpreters else [word]
    return tuple(shown)
