"""The "Android Native Heap Dump v1.2" text: written as malloc_debug's write_dump writes it
(render_heap_dump), and read back into a snapshot (read_heap_dump, on a target's dump)."""

from __future__ import annotations

import os
import re
from collections import Counter

from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.android.records import (
    LeakRecord,
    android_frame,
    merged_records,
    return_addresses,
    sorted_records,
    stack_status,
)
from leaktrace.model.snapshot import NOBODY, AllocationGroup, Counters, Credentials, ProcessInfo, Snapshot
from leaktrace.platform.arch import HOST, TABLES

MAX_FRAMES = 256  # malloc_debug's largest backtrace option
# Numbers are bounded by their digits: a size fits 64 bits, a count 32, a pc 64.
_RECORD = re.compile(rf"z ([01])  sz +(\d{{1,20}})  num +(\d{{1,10}})  bt((?: [0-9a-f]{{1,16}}){{0,{MAX_FRAMES}}})$")
_MAPS_LINE = re.compile(
    r"[0-9a-f]{1,16}-[0-9a-f]{1,16} [-rwxps]{4} [0-9a-f]{1,16} [0-9a-f]{1,8}:[0-9a-f]{1,8} \d{1,20}"
    r"(?: +[^\0\n]{0,4096})?"
)


def build_fingerprint() -> str:
    """Linux has no build fingerprint: the kernel's name, release and machine stand in."""
    uname = os.uname()
    return f"{uname.sysname}/{uname.release}/{uname.machine}"


def _dump_machine_back(body: str) -> int:
    """How far the dump's machine moved its return addresses back: its fingerprint names the
    machine where the library wrote it (build_fingerprint); a dump that names none is this one's."""
    found = re.search(r"^Build fingerprint: 'Linux/[^/\n]*/(\w{1,32})'$", body, re.M)
    if not found:
        return HOST.call_site_back
    table = TABLES.get(found.group(1))
    if table is None:
        raise ValueError(f"a dump from {found.group(1)}, a machine leaktrace has no table for")
    return table.call_site_back


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


def read_heap_dump(
    text: str, pid: int, comm: str, taken_at: float, exited: bool = False, credentials: Credentials = NOBODY
) -> Snapshot:
    """A snapshot from an "Android Native Heap Dump v1.2": its records as groups, its maps.
    The text is a target's: ValueError names the first thing in it that cannot be real. The
    files its MAPS name are opened with credentials (the target's) when it is symbolized."""
    if not text.startswith("Android Native Heap Dump v1.2"):
        raise ValueError("not an Android Native Heap Dump v1.2")
    body, _, maps = text.partition("\nMAPS\n")
    found = re.search(r"^Backtrace size: (\d{1,3})$", body, re.M)
    if not found or not 0 < int(found.group(1)) <= MAX_FRAMES:
        raise ValueError("no valid 'Backtrace size' line")
    # A dump lists records as bionic sorts and merges them (adjacent ones only): a (size, stack)
    # can come back many times, and is one group here.
    back = _dump_machine_back(body)
    counts: Counter[tuple[int, tuple[int, ...], bool]] = Counter()
    for line in body.splitlines():
        record = _RECORD.match(line)
        if not record:
            if line.startswith("z "):
                raise ValueError(f"damaged record {line[:80]!r}")
            continue
        zygote, size, count, frames = record.groups()
        if int(size) >= 1 << 64 or int(count) >= 1 << 32:
            raise ValueError(f"record out of range {line[:80]!r}")
        stack = return_addresses(tuple(int(pc, 16) for pc in frames.split()), back)
        counts[int(size), stack, zygote == "1"] += int(count)
    # z 1: made by a forked child since its fork; a dump has no other sign of a fork, so a child
    # that has made nothing since shows its inherited blocks as its own.
    forked = any(zygote for _, _, zygote in counts)
    groups = [
        AllocationGroup(pid, size, count, stack, stack_status(stack), forked and not zygote)
        for (size, stack, zygote), count in counts.items()
    ]
    maps = maps.removesuffix("END\n")
    for line in maps.splitlines():
        if not _MAPS_LINE.fullmatch(line):
            raise ValueError(f"damaged MAPS line {line[:80]!r}")
    info = ProcessInfo(pid, comm, comm, maps, exited, credentials, forked=forked)
    return Snapshot(taken_at, tuple(groups), Counters(), {pid: info}, int(found.group(1)))
