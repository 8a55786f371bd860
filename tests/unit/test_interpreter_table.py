"""A second interpreter is a row, not an edit: a toy language added to INTERPRETERS (its frame
words tagged 0xa, its code objects 16 bytes of this process's memory) is captured, named,
spliced in place of its runner's native frames, kept out of Android's records and drawn as
interpreted in the folded stacks, by the same code that serves CPython (no real runner is
symbolized here: that needs root, so its name is put in by hand)."""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable

import pytest

from leaktrace.analysis import symbolize
from leaktrace.analysis.symbolize import Frame, SymbolizedSnapshot, Symbolizer
from leaktrace.android.records import android_pcs
from leaktrace.interpreters import table
from leaktrace.interpreters.code_capture import CodeCapture
from leaktrace.interpreters.interface import InterpretedFrame, Read
from leaktrace.interpreters.python.cpython import CPYTHON
from leaktrace.model.snapshot import AllocationGroup, Counters, InterpretedCode, ProcessInfo, Snapshot
from leaktrace.outputs.folded import stack_path
from leaktrace.platform.arch import HOST

TAG, ENTRY = 0xA000_0000_0000_0000, 0x0800_0000_0000_0000
RUNNER = "toy_run"  # the toy's native function whose frames its frames stand for


class ToyProcess:
    """A toy code object: its line (an int) and its name's length, then the name."""

    def code_fields(self, read: Read, address: int) -> tuple[int, ...] | None:
        head = read(address, 8)
        return struct.unpack("<ii", head) if len(head) == 8 else None

    def read_code(self, read: Read, fields: tuple[int, ...]) -> InterpretedCode | None:
        line, length = fields
        return InterpretedCode(f"f{length}", "/srv/lib.toy", line, b"")


class Toy:
    name = "toy"

    def owns(self, word: int) -> bool:
        return word & 0xF000_0000_0000_0000 == TAG

    def code_address(self, word: int) -> int:
        return word & 0xFFFF_FFFF_FFFF

    def frame(self, word: int, code: InterpretedCode | None) -> InterpretedFrame:
        if code is None:
            return InterpretedFrame(None, None, None, False)
        return InterpretedFrame(code.qualname, code.filename, code.first_line, code.changed)

    def runs_frames(self, function: str | None) -> bool:
        return function == RUNNER

    def spliced(self, stack: tuple[int, ...], runs_frames: Callable[[int], bool]) -> tuple[int, ...]:
        """Each run of toy words (ended by its entry word) in place of one runner frame, in order."""
        runs, run = [], []
        for word in (w for w in stack if self.owns(w)):
            run.append(word)
            if word & ENTRY:
                runs, run = [*runs, run], []
        shown: list[int] = []
        for word in (w for w in stack if not self.owns(w)):
            shown += runs.pop(0) if runs_frames(word) and runs else [word]
        return tuple(shown)

    def kernel_words(self, stack: tuple[int, ...]) -> tuple[int, ...]:
        return stack


@pytest.fixture
def toy(monkeypatch):
    row = Toy()
    for module in (table, symbolize):
        monkeypatch.setattr(module, "INTERPRETERS", (CPYTHON, row))
    return row


def word(code: int, entry: bool = False) -> int:
    return TAG | (ENTRY if entry else 0) | code


def test_a_second_interpreter_s_frames_are_captured_named_and_spliced(toy):
    me = ProcessInfo(os.getpid(), "pytest")
    code = ctypes.create_string_buffer(struct.pack("<ii", 42, 7))  # a code object in this process
    native, runner, inner, outer = 0x1000, 0x2000, word(ctypes.addressof(code)), word(0x10, entry=True)
    group = AllocationGroup(me.pid, 64, 1, (native, runner, inner, outer))
    kept = {(me.pid, 0x10): InterpretedCode("main", "/srv/app.toy", 3, b"")}  # kept by its source
    snapshot = Snapshot(0.0, (group,), Counters(), {me.pid: me}, interpreted_code=kept)

    captured = CodeCapture(lambda pid: ToyProcess()).attach(snapshot)
    assert set(captured.interpreted_code) == {(me.pid, 0x10), (me.pid, ctypes.addressof(code))}

    symbolized = Symbolizer(line_info=False).symbolize(captured)
    assert symbolized.frames[me.pid, outer] == Frame(outer, "main", file="/srv/app.toy", line=3, kind="toy")
    assert symbolized.frames[me.pid, inner].describe() == "f7 (/srv/lib.toy:42)"
    assert not symbolized.frames[me.pid, native].interpreted and symbolized.frames[me.pid, outer].interpreted
    named = dict(symbolized.frames)
    named[me.pid, runner] = Frame(runner, RUNNER)
    shown = SymbolizedSnapshot(captured, named)
    assert shown.words_of(group) == (native, inner, outer)
    assert stack_path(shown, group)[1:] == ["main (/srv/app.toy:3)", "f7 (/srv/lib.toy:42)", "0x1000"]
    assert android_pcs(group.stack) == (native - HOST.call_site_back, runner - HOST.call_site_back)
