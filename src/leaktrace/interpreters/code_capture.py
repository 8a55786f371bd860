"""The code objects a snapshot's interpreter frames name, read from the traced process the
first time each address is seen (both engines), unless the source kept them itself (the
preload library does, when a frame first names one). The process is hostile input: its
interpreter's reader bounds every read, and an address that holds other fields on a later
look is marked changed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator

from leaktrace.interpreters.interface import InterpreterProcess, Read
from leaktrace.interpreters.table import interpreter_of
from leaktrace.model.snapshot import InterpretedCode, Snapshot
from leaktrace.platform.arch import HOST

InterpreterIn = Callable[[int], InterpreterProcess | None]  # pid -> the interpreter it runs (None: none known)


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


class CodeCapture:
    """Code objects kept across one trace's snapshots, by (pid, address); interpreter_in gives
    each process's interpreter."""

    def __init__(self, interpreter_in: InterpreterIn) -> None:
        self._interpreter_in = interpreter_in
        self._known: dict[tuple[int, int], InterpretedCode] = {}
        self._fields: dict[tuple[int, int], tuple[int, ...]] = {}

    def attach(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the code its interpreter frames name: read now from each live process
        for addresses not seen before (and checked for those seen), kept from before for the rest."""
        wanted = set()
        for item in snapshot.stacked_items():
            for word in item.stack:
                language = interpreter_of(word)
                if language is not None:
                    wanted.add((item.pid, language.code_address(word)))
        for key, code in snapshot.interpreted_code.items():  # kept by the source itself when first seen
            known = self._known.get(key)
            if known is None or code.changed and not known.changed:
                self._known[key] = code
        if not wanted:
            return snapshot
        for pid in {pid for pid, _ in wanted}:
            process, interpreter = snapshot.processes.get(pid), self._interpreter_in(pid)
            if process is None or process.exited or interpreter is None:
                continue
            try:
                with process_memory(pid) as read:
                    for key in sorted(k for k in wanted if k[0] == pid):
                        self._look(read, interpreter, key)
            except OSError:
                continue  # gone: what was kept serves
        found = {key: self._known[key] for key in wanted if key in self._known}
        return dataclasses.replace(snapshot, interpreted_code=found)

    def _look(self, read: Read, interpreter: InterpreterProcess, key: tuple[int, int]) -> None:
        fields = interpreter.code_fields(read, key[1])
        if fields is None:
            return
        known = self._known.get(key)
        if known is None:
            code = interpreter.read_code(read, fields)
            if code is not None:
                self._known[key], self._fields[key] = code, fields
        elif fields != self._fields.setdefault(key, fields) and not known.changed:
            self._known[key] = dataclasses.replace(known, changed=True)
