"""The "Android Native Heap Dump v1.2" text, as malloc_debug's write_dump writes it."""

from __future__ import annotations

import os

from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.android.records import LeakRecord, android_frame, merged_records, sorted_records


def build_fingerprint() -> str:
    """Linux has no build fingerprint: the kernel's name, release and machine stand in."""
    uname = os.uname()
    return f"{uname.sysname}/{uname.release}/{uname.machine}"


def _bt_info(symbolized: SymbolizedSnapshot, pid: int, record: LeakRecord, depth: int) -> str:
    parts = []
    for pc, address in list(zip(record.frames, record.stack))[:depth]:
        frame = android_frame(symbolized.frames, pid, pc, address)
        parts.append(f' {{"{frame.module or ""}" {frame.rel_pc:x} "{frame.function or ""}" {frame.function_offset:x}}}')
    return "  bt_info" + "".join(parts) + "\n"


def render_heap_dump(
    symbolized: SymbolizedSnapshot, pid: int, fingerprint: str | None = None, backtrace_full: bool = False
) -> str:
    snapshot = symbolized.snapshot
    records = merged_records(sorted_records(snapshot, pid))
    depth = snapshot.backtrace_frames
    out = [
        "Android Native Heap Dump v1.2\n\n",
        f"Build fingerprint: '{build_fingerprint() if fingerprint is None else fingerprint}'\n\n",
        f"Total memory: {sum(r.size * r.num_allocations for r in records)}\n",
        f"Allocation records: {len(records)}\n",
        f"Backtrace size: {depth}\n\n",
    ]
    for record in records:
        frames = record.frames[:depth]
        out.append(
            f"z {int(record.zygote)}  sz {record.size:8d}  num    {record.num_allocations}  bt"
            + "".join(f" {pc:x}" for pc in frames)
            + "\n"
        )
        if backtrace_full and frames:
            out.append(_bt_info(symbolized, pid, record, depth))
    process = snapshot.processes.get(pid)
    out.append("MAPS\n")
    out.append(process.maps if process and process.maps else "Could not open /proc/self/maps\n")
    out.append("END\n")
    return "".join(out)
