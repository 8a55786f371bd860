"""The compiled program as user space holds it: bcc's object (its maps) and the control
array the program and user space signal each other through."""

from __future__ import annotations

import ctypes as ct
from typing import Any

from leaktrace.abi.layout import (
    CTL_EXIT_STOP,
    CTL_HOLDS_OFF,
    CTL_INTERPRETER_STOP,
    CTL_NEXT_GEN,
    CTL_TABLES_GEN,
    CTL_TABLES_STOP,
    CTL_TARGET_GEN,
    NO_TABLES_STOP,
)


class KernelState:
    """The program's maps, once the compile is taken, and its control slots (layout.h's CTL_*)."""

    def __init__(self) -> None:
        self.bpf: Any = None  # bcc's BPF, once the compile is taken; None again once closed

    def set_control(self, slot: int, value: int) -> None:
        self.bpf[b"control"][ct.c_int(slot)] = ct.c_uint32(value)

    def control(self, slot: int) -> int:
        return self.bpf[b"control"][ct.c_int(slot)].value

    def next_gen(self) -> int:
        gen = self.control(CTL_NEXT_GEN)
        self.set_control(CTL_NEXT_GEN, gen + 1)
        return gen

    def target_gen(self) -> int:
        return self.control(CTL_TARGET_GEN)

    def tables_stop_pending(self) -> bool:
        """True once the target has been stopped at its first allocator call for its tables."""
        return bool(self.control(CTL_TABLES_STOP))

    def tables_loaded(self) -> bool:
        """The target's current image has its unwind tables (or it is never stopped for them)."""
        loaded = self.control(CTL_TABLES_GEN)
        return loaded == NO_TABLES_STOP or (loaded != 0 and loaded == self.target_gen())

    def clear_tables_stop(self, gen: int) -> None:
        self.set_control(CTL_TABLES_GEN, gen)
        self.set_control(CTL_TABLES_STOP, 0)

    @property
    def holds_images(self) -> bool:
        """The program holds programs exec'd under the trace for their tables (hold_for_tables)."""
        try:
            self.bpf[b"holds"]
        except KeyError:
            return False
        return True

    def stop_holding(self) -> None:
        self.set_control(CTL_HOLDS_OFF, 1)

    def exit_stop_pending(self) -> bool:
        """True once the target has been stopped in _exit by the BPF program."""
        return bool(self.control(CTL_EXIT_STOP))

    def clear_exit_stop(self) -> None:
        self.set_control(CTL_EXIT_STOP, 0)

    def interpreter_stop_pending(self) -> bool:
        """True once the target is stopped where its interpreter frees its code, not yet freed."""
        return bool(self.control(CTL_INTERPRETER_STOP))

    def clear_interpreter_stop(self) -> None:
        self.set_control(CTL_INTERPRETER_STOP, 0)
