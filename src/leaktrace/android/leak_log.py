"""malloc_debug's leak_track log at exit: one entry per live pointer, upstream's order."""

from __future__ import annotations

from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.android.records import android_frame, android_pcs, sorted_records


def backtrace_lines(symbolized: SymbolizedSnapshot, pid: int, stack: tuple[int, ...]) -> list[str]:
    """A stack as malloc_debug's backtrace_string prints it (libmemunreachable uses it too)."""
    lines = []
    for number, (pc, address) in enumerate(zip(android_pcs(stack), stack)):
        frame = android_frame(symbolized.frames, pid, pc, address)
        line = f"          #{number:02d}  pc {frame.rel_pc:016x}  {frame.module or '<unknown>'}"
        if frame.function:
            line += f" ({frame.function}+{frame.function_offset})"
        lines.append(line)
    return lines


def render_leak_log(symbolized: SymbolizedSnapshot, pid: int, program_name: str) -> list[str]:
    """The log lines; needs a snapshot with per-pointer allocations."""
    snapshot = symbolized.snapshot
    if snapshot.allocations is None:
        raise ValueError("the leak log lists pointers: take the snapshot with allocations")
    records = sorted_records(snapshot, pid)
    lines = []
    for index, record in enumerate(records, 1):
        lines.append(
            f"+++ {program_name} leaked block of size {record.size} at 0x{record.pointer:x} "
            f"(leak {index} of {len(records)})"
        )
        if record.frames:
            lines.append("Backtrace at time of allocation:")
            lines.extend(backtrace_lines(symbolized, pid, record.stack))
    return lines
