"""malloc_debug's list of live allocations: its sort and its adjacent merge.

The leak-info buffer, the heap dump and the exit leak log all read this list.
Upstream sorts one entry per pointer and merges *adjacent* entries with equal
(zygote, size, backtrace); ties between different backtraces of equal depth
are broken by pointer, so they can interleave and stay split. With per-pointer
data (Snapshot.allocations) that is reproduced exactly; from groups alone each
group is one entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cmp_to_key
from typing import Protocol

from leaktrace.interpreters.table import interpreter_of
from leaktrace.model.snapshot import ProcessInfo, Snapshot, StackStatus
from leaktrace.platform.arch import HOST


@dataclass(frozen=True)
class LeakRecord:
    zygote: bool  # made in a forked child, by the child (ProcessInfo.zygote_bit)
    size: int
    frames: tuple[int, ...]  # pcs as malloc_debug stores them: inside the call instruction
    num_allocations: int = 1
    pointer: int = 0
    stack: tuple[int, ...] = ()  # the return addresses the frames come from (symbolization keys)


def android_pcs(stack: tuple[int, ...]) -> tuple[int, ...]:
    """Return addresses -> pcs inside the call, as bionic's unwinder callback moves them back
    (the machine's call_site_back); interpreter frames, which Android's formats have no place for, left out."""
    back = HOST.call_site_back
    return tuple(pc - back if pc >= 4096 else pc for pc in stack if interpreter_of(pc) is None)


def return_addresses(pcs: tuple[int, ...], back: int = HOST.call_site_back) -> tuple[int, ...]:
    """The inverse of android_pcs: stored pcs (a dump, the preload library's table) -> the
    return addresses snapshots keep (interpreter frames' words as they are); back: the call_site_back
    of the machine that stored them."""
    return tuple(pc + back if pc >= 4096 - back and interpreter_of(pc) is None else pc for pc in pcs)


@dataclass(frozen=True)
class AndroidFrame:
    """A frame as malloc_debug prints it: pc relative to its module, offset from its function."""

    module: str | None
    rel_pc: int
    function: str | None
    function_offset: int


class SymbolizedFrame(Protocol):
    """What android_frame reads of a symbolized frame (analysis/symbolize.py's Frame)."""

    @property
    def module(self) -> str | None: ...
    @property
    def module_offset(self) -> int | None: ...
    @property
    def function(self) -> str | None: ...
    @property
    def offset(self) -> int: ...


def android_frame(frames: Mapping[tuple[int, int], SymbolizedFrame], pid: int, pc: int, address: int) -> AndroidFrame:
    """pc (as stored) from return address `address`, looked up in symbolized frames."""
    frame = frames.get((pid, address))
    if frame is None:
        return AndroidFrame(None, pc, None, 0)
    back = HOST.call_site_back
    rel_pc = frame.module_offset - back if frame.module_offset is not None else pc
    function_offset = frame.offset - back if frame.function else 0
    return AndroidFrame(frame.module, rel_pc, frame.function, function_offset)


def _compare(a: LeakRecord, b: LeakRecord) -> int:
    if a.zygote != b.zygote:
        return 1 if a.zygote else -1  # z 0 first
    if a.size != b.size:
        return -1 if a.size > b.size else 1  # larger first
    if bool(a.frames) != bool(b.frames):
        return -1 if a.frames else 1  # with frames first
    if not a.frames or len(a.frames) == len(b.frames):
        return (a.pointer > b.pointer) - (a.pointer < b.pointer)
    return -1 if len(a.frames) > len(b.frames) else 1  # deeper first


def sorted_records(snapshot: Snapshot, pid: int) -> list[LeakRecord]:
    """One record per live pointer (or per group without pointers), in upstream's order."""
    zygote_bit = (snapshot.processes.get(pid) or ProcessInfo(pid)).zygote_bit
    if snapshot.allocations is not None:
        records = [
            LeakRecord(zygote_bit(a.inherited), a.size, android_pcs(a.stack), 1, a.address, a.stack)
            for a in snapshot.allocations
            if a.pid == pid
        ]
    else:
        records = [
            LeakRecord(zygote_bit(g.inherited), g.size, android_pcs(g.stack), g.count, 0, g.stack)
            for g in snapshot.groups
            if g.pid == pid
        ]
    return sorted(records, key=cmp_to_key(_compare))


def merged_records(records: list[LeakRecord]) -> list[LeakRecord]:
    merged: list[LeakRecord] = []
    for record in records:
        last = merged[-1] if merged else None
        if last and (last.zygote, last.size, last.frames) == (record.zygote, record.size, record.frames):
            merged[-1] = replace(last, num_allocations=last.num_allocations + record.num_allocations)
        else:
            merged.append(record)
    return merged


def stack_status(stack: tuple[int, ...]) -> StackStatus:
    """malloc_debug keeps a stack for every size in its backtrace range: none means filtered."""
    return StackStatus.CAPTURED if stack else StackStatus.FILTERED
