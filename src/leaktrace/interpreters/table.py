"""The interpreters whose frames leaktrace shows: one row a language (CPython the only one),
which both engines and the symbolizer loop over."""

from __future__ import annotations

from leaktrace.interpreters.interface import Interpreter
from leaktrace.interpreters.python.cpython import CPYTHON

INTERPRETERS: tuple[Interpreter, ...] = (CPYTHON,)


def interpreter_of(word: int) -> Interpreter | None:
    """The interpreter whose frame a stack word is; None for a return address."""
    for interpreter in INTERPRETERS:
        if interpreter.owns(word):
            return interpreter
    return None


def may_hold_interpreter(path: str) -> bool:
    """Whether a file's name says it may hold an interpreter of the table."""
    return any(interpreter.may_hold(path) for interpreter in INTERPRETERS)
