"""The preload library's table of live blocks, read from outside the process: in place
while the process is stopped (table_snapshot), or from a frozen copy of it
(copy_with_table, for the reachability check). Every change the library makes
to the table is made under its exported lock, so a stopped process whose lock is
free holds a consistent table; one caught with the lock held is let go and stopped
again a moment later.
"""
from __future__ import annotations

import bisect
import functools
import glob
import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .android_records import return_addresses
from .elf import ElfFile
from .errors import RuntimeFailure
from .freeze import FrozenImage, freeze_and_copy, frozen
from .process import Mapping
from .snapshot import AllocationGroup, Counters, Credentials, LiveAllocation, ProcessInfo, Snapshot, StackStatus

TABLE_TRIES = 100      # stops of the process to find its table unlocked (a lock is held for microseconds)
SPAN_GAP, SPAN_MAX = 64 << 10, 64 << 20   # stacks closer than SPAN_GAP are read together, up to SPAN_MAX
# struct record of preload/malloc_debug.h: pointer, size, flags, frame_count, frames.
RECORD = struct.Struct("<QQIIQ")
RECORD_ZYGOTE = 1   # the flag bit of a block allocated before a fork
T = TypeVar("T")


def preload_library() -> str:
    """Path of the library that pip install built into the package."""
    found = sorted(glob.glob(str(Path(__file__).parent / "_malloc_debug*.so")))
    if not found:
        raise RuntimeFailure("leaktrace's preload library is not built: reinstall leaktrace (pip install)")
    return found[0]


def stack_status(stack: tuple[int, ...]) -> StackStatus:
    """The library keeps a stack for every size in its backtrace range: none means filtered."""
    return StackStatus.CAPTURED if stack else StackStatus.FILTERED


def library_base(maps: list[Mapping], library: str) -> int | None:
    """Where the library is loaded in a process (its mapping at file offset 0), found by the
    device and inode maps show, else by its path as text (no path the process names is looked up)."""
    st = os.stat(library)
    device, real = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", os.path.realpath(library)
    for mapping in maps:
        if mapping.offset == 0 and ((mapping.device, mapping.inode) == (device, st.st_ino) or mapping.path == real):
            return mapping.start
    return None


@functools.lru_cache(maxsize=1)
def _table_symbols() -> dict[str, int]:
    symbols = ElfFile(preload_library()).dynamic_objects
    return {name: symbols[name] for name in ("leaktrace_table", "leaktrace_table_slots", "leaktrace_table_lock")}


def _table_addresses(maps: list[Mapping], pid: int) -> dict[str, int]:
    """Where the library's table variables are in a process."""
    base = library_base(maps, preload_library())
    if base is None:
        raise RuntimeFailure(f"pid {pid} does not run with leaktrace's preload library")
    return {name: base + offset for name, offset in _table_symbols().items()}


def _table_busy(read, addresses: dict[str, int]) -> bool:
    """A thread was stopped while changing the table (its lock is held): read it again later."""
    return read(addresses["leaktrace_table_lock"], 4) != b"\0\0\0\0"


class DamagedTable(RuntimeFailure):
    """A value read from the library's table that the library could not have written."""


ADDRESS_LIMIT = 1 << 47   # user addresses end below this on x86-64 (4-level page tables)
MAX_RECORD_FRAMES = 256   # the library's MAX_FRAMES


class _Readable:
    """A process's readable mappings: whether one of them holds a range."""

    def __init__(self, maps: list[Mapping]):
        self.mappings = sorted((m for m in maps if "r" in m.perms), key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def holds(self, start: int, size: int) -> bool:
        i = bisect.bisect_right(self.starts, start) - 1
        return i >= 0 and start + size <= self.mappings[i].end


def _read_table(read, maps: list[Mapping], pid: int,
                addresses: dict[str, int]) -> tuple[list[LiveAllocation], tuple[int, int]]:
    """The live blocks in the library's table, through read(address, size) (a stopped process
    or a copy of one), and the range the table occupies. Every value comes from the target:
    DamagedTable names the first that the library could not have written (a table outside
    its mappings, a frame count past its maximum, frames or blocks outside the address space)."""
    table, slots = (struct.unpack("<Q", read(addresses[name], 8).ljust(8, b"\0"))[0]
                    for name in ("leaktrace_table", "leaktrace_table_slots"))
    readable = _Readable(maps)
    if slots and not readable.holds(table, slots * RECORD.size):
        raise DamagedTable(f"the library's table in pid {pid} is damaged: {slots} slots at {table:#x} "
                           "are not in its memory")
    records = read(table, slots * RECORD.size)
    whole = len(records) // RECORD.size * RECORD.size
    live = [record for record in RECORD.iter_unpack(records[:whole]) if record[0] > 1]   # 0 empty, 1 deleted
    for pointer, size, _, frame_count, frames_at in live:
        if pointer + size >= ADDRESS_LIMIT or frame_count > MAX_RECORD_FRAMES or \
                (frame_count and not readable.holds(frames_at, 8 * frame_count)):
            raise DamagedTable(f"the library's table in pid {pid} is damaged: a record of {size} bytes at "
                               f"{pointer:#x} with {frame_count} frames at {frames_at:#x}")
    frames = _read_many(read, [(frames_at, 8 * count) for _, _, _, count, frames_at in live if count])
    allocations = []
    for pointer, size, flags, frame_count, frames_at in live:
        pcs = frames.get(frames_at, b"") if frame_count else b""
        stack = return_addresses(struct.unpack(f"<{len(pcs) // 8}Q", pcs))
        allocations.append(LiveAllocation(pid, pointer, size, stack, stack_status(stack), bool(flags & RECORD_ZYGOTE)))
    return allocations, (table, table + slots * RECORD.size)


def _read_many(read, ranges: list[tuple[int, int]]) -> dict[int, bytes]:
    """address -> read(address, size) for many small ranges, as a few large reads of the
    spans they cluster in (a stopped process is read one system call per read)."""
    found: dict[int, bytes] = {}
    ranges = sorted(set(ranges))
    i = 0
    while i < len(ranges):
        start = ranges[i][0]
        end = start + ranges[i][1]
        j = i + 1
        while j < len(ranges) and ranges[j][0] - end <= SPAN_GAP and ranges[j][0] + ranges[j][1] - start <= SPAN_MAX:
            end = max(end, ranges[j][0] + ranges[j][1])
            j += 1
        span = read(start, end - start)
        for address, size in ranges[i:j]:
            piece = span[address - start:address - start + size]
            found[address] = piece if len(piece) == size else read(address, size)   # across a hole: one by one
        i = j
    return found


def _until_unlocked(pid: int, attempt: Callable[[], T | None]) -> T:
    """attempt() until it finds the table unlocked (it returns None while a thread holds it)."""
    for _ in range(TABLE_TRIES):
        found = attempt()
        if found is not None:
            return found
        time.sleep(0.001)
    raise RuntimeFailure(f"pid {pid} kept its table locked through {TABLE_TRIES} tries")


def copy_with_table(pid: int, wanted) -> tuple[FrozenImage, list[LiveAllocation], tuple[int, int]]:
    """A frozen copy of the process (the mappings wanted) taken while the table was unlocked,
    the live blocks in that table, and the range the table occupies (never a root of a
    reachability check: it points to every block)."""
    def attempt():
        image = freeze_and_copy(pid, wanted)
        addresses = _table_addresses(image.maps, pid)
        if _table_busy(image.read, addresses):
            return None
        return image, *_read_table(image.read, image.maps, pid, addresses)
    return _until_unlocked(pid, attempt)


def table_snapshot(pid: int, comm: str, backtrace_frames: int, credentials: Credentials) -> Snapshot:
    """A snapshot read from the library's table in the stopped process, with pointers."""
    def attempt():
        with frozen(pid) as process:
            addresses = _table_addresses(process.maps, pid)
            if _table_busy(process.read, addresses):
                return None
            allocations, _ = _read_table(process.read, process.maps, pid, addresses)
            return allocations, process.maps_text
    allocations, maps = _until_unlocked(pid, attempt)
    tally = Counter((a.size, a.stack, a.stack_status, a.inherited) for a in allocations)
    groups = tuple(AllocationGroup(pid, size, count, stack, status, inherited)
                   for (size, stack, status, inherited), count in tally.items())
    return Snapshot(time.time(), groups, Counters(), {pid: ProcessInfo(pid, comm, comm, maps, credentials=credentials)},
                    backtrace_frames,
                    tuple(allocations))
