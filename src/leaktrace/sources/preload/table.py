"""The preload library's table of live blocks, read from outside the process: in place
while the process is stopped (table_snapshot), or from a frozen copy of it
(copy_with_table, for the reachability check). The table is TABLE_SHARDS shards, and
every change the library makes to one is made under the shard's lock, so a stopped
process whose locks are all free holds a consistent table; one caught with a lock held
is let go and stopped again a moment later.
"""

from __future__ import annotations

import bisect
import dataclasses
import fcntl
import functools
import os
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from leaktrace.abi.layout import C_COUNTERS, COUNTER_FIELDS, PEAK  # the library counts as the BPF engine
from leaktrace.abi.record import (  # from abi/record.h
    MAX_FRAMES,
    OWN_MAP,
    OWN_MAPS,
    RECORD,
    RECORD_INHERITED,
    SHARD_SITES_MOST,
    SITE,
    SITE_COUNTS,
    SITE_SHARD,
    SITE_SHARDS,
    SITE_SLOTS,
    TABLE_SHARD,
    TABLE_SHARDS,
)
from leaktrace.android.records import return_addresses, stack_status
from leaktrace.errors import RuntimeFailure
from leaktrace.interpreters.interface import Codes, DamagedCodes
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.model.snapshot import (
    AllocationGroup,
    Counters,
    LiveAllocation,
    Peak,
    ProcessInfo,
    SiteTotals,
    Snapshot,
    StackStatus,
)
from leaktrace.platform.arch import HOST, built_here
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.freeze import FrozenImage, freeze_and_copy, frozen
from leaktrace.platform.module_files import runs_on_musl
from leaktrace.platform.process import Mapping, mapped_identity, maps_device, parse_maps, proc_path, read_target

MEMFD_NAME = b"leaktrace-preload"  # an attach's sealed copy of the library (inject.py)
F_GET_SEALS = 1034
SEALED = 1 | 2 | 4 | 8  # F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE
TABLE_TRIES = 100  # stops of the process to find its table unlocked (a lock is held for microseconds)
SPAN_GAP, SPAN_MAX = 64 << 10, 64 << 20  # stacks closer than SPAN_GAP are read together, up to SPAN_MAX
T = TypeVar("T")
ReadMemory = Callable[[int, int], bytes]  # (address, size) -> what could be read there


def preload_library(on_musl: bool = False) -> str:
    """Path of the library that pip install built into the package, for glibc's loader or
    musl's (setup.py builds that one with musl-gcc)."""
    here = Path(__file__).parent
    found = str(here / "malloc_debug_musl.so") if on_musl else built_here(here, "_malloc_debug")
    if found is None or not os.path.isfile(found):
        what = "for musl (musl-gcc was not found when it was built) " if on_musl else ""
        raise RuntimeFailure(f"leaktrace's preload library {what}is not built: reinstall leaktrace (pip install)")
    return found


@functools.lru_cache(maxsize=2)
def library_bytes(on_musl: bool = False) -> bytes:
    with open(preload_library(on_musl), "rb") as f:
        return f.read()


# (device, inode, on_musl) of memfds known to hold a build's bytes, sealed
SEALED_COPIES: set[tuple[str, int, bool]] = set()


def sealed_copy_base(pid: int, mapping: Mapping, on_musl: bool = False) -> int | None:
    """mapping's start if it is a sealed memfd holding exactly leaktrace's library (one this
    leaktrace wrote, or an earlier attach's, read through the kernel's own link to the mapped
    file); else None."""
    if mapping.offset != 0 or not mapping.path.startswith("/memfd:" + MEMFD_NAME.decode()):
        return None
    if (mapping.device, mapping.inode, on_musl) in SEALED_COPIES:
        return mapping.start
    try:
        fd = os.open(proc_path(pid, f"map_files/{mapping.start:x}-{mapping.end:x}"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st, library = os.fstat(fd), library_bytes(on_musl)
        if (
            not stat.S_ISREG(st.st_mode)
            or maps_device(st.st_dev) != mapping.device
            or st.st_ino != mapping.inode
            or st.st_size != len(library)
            or fcntl.fcntl(fd, F_GET_SEALS) & SEALED != SEALED
            or os.pread(fd, len(library) + 1, 0) != library
        ):
            return None
        SEALED_COPIES.add((mapping.device, mapping.inode, on_musl))
        return mapping.start
    except OSError:
        return None
    finally:
        os.close(fd)


def library_base(pid: int, maps: list[Mapping]) -> int | None:
    """Where leaktrace's library (the build for the process's libc) is loaded in pid: the
    installed file's mapping at offset 0 (by device and inode, never by the path the process
    names) or a sealed copy of it; None if neither is mapped."""
    on_musl = runs_on_musl(maps)
    try:
        identity = mapped_identity(preload_library(on_musl))
    except RuntimeFailure:
        return None  # not built: not loaded either
    for mapping in maps:
        if mapping.offset == 0 and (mapping.device, mapping.inode) == identity:
            return mapping.start
    return next((b for b in (sealed_copy_base(pid, m, on_musl) for m in maps) if b is not None), None)


@functools.lru_cache(maxsize=2)
def library_symbols(on_musl: bool) -> dict[str, int]:
    """The library's exported functions and objects, by the build for a libc."""
    elf = ElfFile(preload_library(on_musl))
    return {**elf.dynamic_functions, **elf.dynamic_objects}


TABLE_SYMBOLS = (
    "leaktrace_shards",
    "leaktrace_forked",
    "leaktrace_counters",
    *(interpreter.kept_codes_symbol for interpreter in INTERPRETERS),
    "leaktrace_site_shards",
    "leaktrace_peak",
    "leaktrace_own_maps",
    "leaktrace_own_maps_unlisted",
)


def _table_addresses(maps: list[Mapping], pid: int) -> dict[str, int]:
    """Where the library's table variables are in a process."""
    base = library_base(pid, maps)
    if base is None:
        raise RuntimeFailure(f"pid {pid} does not run with leaktrace's preload library")
    symbols = library_symbols(runs_on_musl(maps))
    return {name: base + symbols[name] for name in TABLE_SYMBOLS}


class DamagedTable(RuntimeFailure):
    """A value read from the library's table that the library could not have written."""


@dataclass(frozen=True)
class Shard:
    """One struct table_shard as read from the target."""

    locked: bool  # a thread was stopped while changing it: the table is read again later
    records: int  # address of its slots
    slots: int
    allocations: int
    frees: int


def _read_shards(read: ReadMemory, addresses: dict[str, int], pid: int) -> list[Shard]:
    data = read(addresses["leaktrace_shards"], TABLE_SHARDS * TABLE_SHARD.size)
    if len(data) != TABLE_SHARDS * TABLE_SHARD.size:
        raise DamagedTable(f"the library's table in pid {pid} could not be read")
    return [
        Shard(lock != 0, records, slots, allocations, frees)
        for lock, _, records, slots, _, _, allocations, frees, _ in TABLE_SHARD.iter_unpack(data)
    ]


def counters_from_words(words: tuple[int, ...] | list[int], pid: int) -> Counters:
    """The library's leaktrace_counters, in layout.h's enum counter order."""
    if len(words) != C_COUNTERS:
        raise DamagedTable(f"pid {pid}'s library gave {len(words)} counters, not {C_COUNTERS}")
    return Counters(**dict(zip(COUNTER_FIELDS, words)))


def _read_counters(read: ReadMemory, addresses: dict[str, int], pid: int, shards: list[Shard]) -> Counters:
    """leaktrace_counters, with the allocations and frees its shards count under their locks."""
    data = read(addresses["leaktrace_counters"], 8 * C_COUNTERS)
    counters = counters_from_words(struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8]), pid)
    return dataclasses.replace(
        counters,
        allocations=counters.allocations + sum(shard.allocations for shard in shards),
        frees=counters.frees + sum(shard.frees for shard in shards),
    )


def _in_place(pid: int, work: Callable[[ReadMemory, dict[str, int], list[Mapping]], T]) -> T:
    """work(read, the table's addresses, maps) on the process as it runs, through its mem file."""
    maps = parse_maps(read_target(pid).maps)
    addresses = _table_addresses(maps, pid)
    fd = os.open(proc_path(pid, "mem"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        return work(lambda address, size: os.pread(fd, size, address), addresses, maps)
    finally:
        os.close(fd)


def counters_in_place(pid: int) -> Counters:
    """The library's counters, read from the process as it runs (each one a word written whole)."""
    return _in_place(
        pid, lambda read, addresses, _: _read_counters(read, addresses, pid, _read_shards(read, addresses, pid))
    )


ADDRESS_LIMIT = 1 << HOST.user_address_bits  # user addresses end below this (4-level page tables)


class _Readable:
    """A process's readable mappings: whether one of them holds a range."""

    def __init__(self, maps: list[Mapping]):
        self.mappings = sorted((m for m in maps if "r" in m.perms), key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def holds(self, start: int, size: int) -> bool:
        i = bisect.bisect_right(self.starts, start) - 1
        return i >= 0 and start + size <= self.mappings[i].end


@dataclass
class CopiedTable:
    """The library's table as bytes copied out of the target (while it stood still), with the
    spans of memory its records' frames are in; decoded after the target goes on."""

    pid: int
    maps: list[Mapping]
    occupied: tuple[tuple[int, int], ...]  # the ranges the shards' slots take in the target
    records: list[tuple[int, ...]]  # live ones: pointer, size, flags, frame count, frames at, site
    spans: list[tuple[int, bytes]]  # (start, bytes) of the memory holding the frames, sorted
    forked: bool  # the library's leaktrace_forked
    counters: Counters  # the library's leaktrace_counters
    sites: list[SiteRecord] = dataclasses.field(default_factory=list)
    peak: tuple[int, ...] = (0,) * len(PEAK.format[1:])  # the library's leaktrace_peak (PEAK's fields)
    own_maps: tuple[tuple[int, int], ...] = ()  # the library's leaktrace_own_maps: its memory, mapped
    own_maps_unlisted: int = 0  # mappings of its own the library could not list (scanned as roots)

    @property
    def library_memory(self) -> tuple[tuple[int, int], ...]:
        """The ranges of the library's own memory that hold the program's addresses: never roots."""
        return self.occupied + self.own_maps

    def own_blocks(self) -> list[int]:
        """The heap blocks that are the library's own (the shards' arrays of slots; the sites
        and their frames are in memory of its own): not the program's, whatever a heap walk finds."""
        return [start for start, _ in self.occupied]

    def _frames(self, at: int, count: int, starts: list[int]) -> bytes:
        i = bisect.bisect_right(starts, at) - 1
        if i < 0:
            return b""
        start, data = self.spans[i]
        return data[at - start : at - start + 8 * count]

    def allocations(self) -> list[LiveAllocation]:
        """The live blocks. DamagedTable names the first record whose frames are outside the
        target's memory."""
        readable, starts = _Readable(self.maps), [start for start, _ in self.spans]
        stacks: dict[bytes, tuple[int, ...]] = {}  # records of one call site share their frames' values
        allocations = []
        for pointer, size, flags, frame_count, frames_at, _ in self.records:
            pcs = b""
            if frame_count:
                pcs = self._frames(frames_at, frame_count, starts)
                if len(pcs) != 8 * frame_count or not readable.holds(frames_at, 8 * frame_count):
                    raise DamagedTable(
                        f"the library's table in pid {self.pid} is damaged: a record of {size} "
                        f"bytes at {pointer:#x} with {frame_count} frames at {frames_at:#x}"
                    )
            stack = stacks.get(pcs)
            if stack is None:
                stack = stacks[pcs] = return_addresses(struct.unpack(f"<{len(pcs) // 8}Q", pcs))
            allocations.append(
                LiveAllocation(self.pid, pointer, size, stack, stack_status(stack), bool(flags & RECORD_INHERITED))
            )
        return allocations


SITE_BYTES = SITE.size + SITE_SLOTS * SITE_COUNTS.size  # a site's header and its slots, before its frames


class SiteRecord(NamedTuple):
    """One site as the library keeps it: its size, each slot's counts (SITE_COUNTS), its frames."""

    size: int
    slots: tuple[tuple[int, ...], ...]
    pcs: bytes

    def count(self, field: int) -> int:
        """A SITE_COUNTS field summed over the slots."""
        return sum(slot[field] for slot in self.slots)

    def at_epoch(self, epoch: int) -> int:
        """Its blocks at the start of epoch: a slot changed since keeps them, one unchanged has them still."""
        return sum(slot[6] if slot[7] == epoch else slot[2] for slot in self.slots)  # peak_live, live

    def stack_and_status(self) -> tuple[tuple[int, ...], StackStatus]:
        stack = return_addresses(struct.unpack(f"<{len(self.pcs) // 8}Q", self.pcs))
        return stack, stack_status(stack)


def _site_head(data: bytes, pid: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """A site's header (SITE) and slots, from SITE_BYTES bytes; DamagedTable past MAX_FRAMES."""
    head = SITE.unpack_from(data)
    if head[0] > MAX_FRAMES:
        raise DamagedTable(
            f"the library's sites in pid {pid} are damaged: a site of {head[3]} bytes with {head[0]} frames"
        )
    return head, tuple(SITE_COUNTS.iter_unpack(data[SITE.size : SITE_BYTES]))


def site_totals(pid: int, sites: list[SiteRecord]) -> tuple[SiteTotals, ...]:
    """What each site made since the trace began (sites that made nothing left out)."""
    return tuple(
        SiteTotals(pid, site.size, site.count(3), site.count(4), site.count(5), *site.stack_and_status())
        for site in sites
        if site.count(3)
    )


def peak_of(pid: int, sites: list[SiteRecord], peak: tuple[int, ...]) -> tuple[Peak, ...]:
    """The high-water mark (PEAK's fields), with each site's blocks then; none before the first block."""
    _, peak_bytes, peak_ns, epoch, epoch_bytes, _, unpublished = peak
    if not peak_bytes:
        return ()
    groups = []
    for site in sites:
        count = site.at_epoch(epoch)
        if count > 0:
            groups.append(AllocationGroup(pid, site.size, count, *site.stack_and_status()))
    wall = time.time() - time.monotonic() + peak_ns / 1e9  # the library's clock is CLOCK_MONOTONIC
    return (Peak(pid, peak_bytes, wall, tuple(groups), peak_bytes - epoch_bytes + unpublished),)


def parse_sites(data: bytes, pid: int) -> tuple[list[SiteRecord], tuple[int, ...]]:
    """The sites file the library writes at exit (write_sites): the peak, then each site, its
    slots and its frames."""
    if len(data) < PEAK.size:
        raise DamagedTable(f"pid {pid}'s sites file is cut short")
    peak, at, sites = PEAK.unpack_from(data), PEAK.size, []
    while at < len(data):
        if len(data) - at < SITE_BYTES:
            raise DamagedTable(f"pid {pid}'s sites file is cut short")
        head, slots = _site_head(data[at : at + SITE_BYTES], pid)
        at += SITE_BYTES
        pcs = data[at : at + 8 * head[0]]
        if len(pcs) != 8 * head[0]:
            raise DamagedTable(f"pid {pid}'s sites file is cut short")
        at += len(pcs)
        sites.append(SiteRecord(head[3], slots, pcs))
    return sites, peak


def sites_in_place(pid: int) -> tuple[list[SiteRecord], tuple[int, ...]] | None:
    """The sites and peak, read from the process as it runs; None if a site was changing."""

    def work(
        read: ReadMemory, addresses: dict[str, int], maps: list[Mapping]
    ) -> tuple[list[SiteRecord], tuple[int, ...]] | None:
        sites = _read_sites(read, addresses, pid, _Readable(maps))
        peak = read(addresses["leaktrace_peak"], PEAK.size)
        return None if sites is None or len(peak) != PEAK.size else (sites, PEAK.unpack(peak))

    return _in_place(pid, work)


def _read_sites(read: ReadMemory, addresses: dict[str, int], pid: int, readable: _Readable) -> list[SiteRecord] | None:
    """Every site with its slots and frames; None while a site shard or a slot is locked."""
    data = read(addresses["leaktrace_site_shards"], SITE_SHARDS * SITE_SHARD.size)
    if len(data) != SITE_SHARDS * SITE_SHARD.size:
        raise DamagedTable(f"the library's sites in pid {pid} could not be read")
    pointers: list[int] = []
    for lock, _, slots, slot_count, _, _ in SITE_SHARD.iter_unpack(data):
        if lock:
            return None
        if not slot_count:
            continue
        if (
            slot_count & (slot_count - 1)
            or slot_count > 4 * SHARD_SITES_MOST
            or not readable.holds(slots, 8 * slot_count)
        ):
            raise DamagedTable(f"the library's sites in pid {pid} are damaged: {slot_count} slots at {slots:#x}")
        words = read(slots, 8 * slot_count)
        pointers += [word for (word,) in struct.iter_unpack("<Q", words[: len(words) // 8 * 8]) if word]
    spans = _read_spans(read, [(at, SITE_BYTES) for at in pointers])
    starts = [start for start, _ in spans]
    heads = []
    for at in sorted(pointers):
        i = bisect.bisect_right(starts, at) - 1
        start, span = spans[i] if i >= 0 else (0, b"")
        raw = span[at - start : at - start + SITE_BYTES]
        if len(raw) != SITE_BYTES:
            raise DamagedTable(f"the library's sites in pid {pid} are damaged: a site at {at:#x} is not in its memory")
        head, slots = _site_head(raw, pid)
        if any(slot[0] for slot in slots):
            return None
        if head[0] and not readable.holds(head[4], 8 * head[0]):
            raise DamagedTable(
                f"the library's sites in pid {pid} are damaged: a site of {head[3]} bytes with {head[0]} frames "
                f"at {head[4]:#x}"
            )
        heads.append((head, slots))
    frames = _read_spans(read, [(head[4], 8 * head[0]) for head, _ in heads if head[0]])
    frame_starts = [start for start, _ in frames]
    found = []
    for head, slots in heads:
        pcs = b""
        if head[0]:
            i = bisect.bisect_right(frame_starts, head[4]) - 1
            start, span = frames[i] if i >= 0 else (0, b"")
            pcs = span[head[4] - start : head[4] - start + 8 * head[0]]
        found.append(SiteRecord(head[3], slots, pcs))
    return found


def _copy_table(read: ReadMemory, maps: list[Mapping], pid: int, addresses: dict[str, int]) -> CopiedTable | None:
    """The library's table and its frames, through read(address, size) (a stopped process or a
    copy of one); None while a shard is locked. Every value comes from the target: DamagedTable
    names the first that sizes a read and that the library could not have written (a shard
    outside its mappings, a frame count past its maximum, a block past the end of the
    address space)."""
    shards = _read_shards(read, addresses, pid)
    if any(shard.locked for shard in shards):
        return None
    readable, live, occupied = _Readable(maps), [], []
    for shard in shards:
        if not shard.slots:
            continue
        if not readable.holds(shard.records, shard.slots * RECORD.size):
            raise DamagedTable(
                f"the library's table in pid {pid} is damaged: {shard.slots} slots at {shard.records:#x} "
                "are not in its memory"
            )
        records = read(shard.records, shard.slots * RECORD.size)
        whole = len(records) // RECORD.size * RECORD.size
        live += [record for record in RECORD.iter_unpack(records[:whole]) if record[0] > 1]  # 0 empty, 1 deleted
        occupied.append((shard.records, shard.records + shard.slots * RECORD.size))
    for pointer, size, _, frame_count, frames_at, _ in live:
        if pointer + size >= ADDRESS_LIMIT or frame_count > MAX_FRAMES:
            raise DamagedTable(
                f"the library's table in pid {pid} is damaged: a record of {size} bytes at "
                f"{pointer:#x} with {frame_count} frames at {frames_at:#x}"
            )
    spans = _read_spans(read, [(frames_at, 8 * count) for _, _, _, count, frames_at, _ in live if count])
    forked = read(addresses["leaktrace_forked"], 4) not in (b"\0\0\0\0", b"")
    counters = _read_counters(read, addresses, pid, shards)
    sites = _read_sites(read, addresses, pid, readable)
    peak = read(addresses["leaktrace_peak"], PEAK.size)
    if sites is None or len(peak) != PEAK.size:
        return None
    own_maps, unlisted = _read_own_maps(read, addresses, pid)
    return CopiedTable(
        pid, maps, tuple(occupied), live, spans, forked, counters, sites, PEAK.unpack(peak), own_maps, unlisted
    )


def _read_own_maps(read: ReadMemory, addresses: dict[str, int], pid: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """leaktrace_own_maps' ranges in use, and how many mappings the library could not list."""
    data = read(addresses["leaktrace_own_maps"], OWN_MAPS * OWN_MAP.size)
    unlisted = read(addresses["leaktrace_own_maps_unlisted"], 4)
    if len(data) != OWN_MAPS * OWN_MAP.size or len(unlisted) != 4:
        raise DamagedTable(f"the library's list of its own memory in pid {pid} could not be read")
    ranges = tuple((start, end) for start, end in OWN_MAP.iter_unpack(data) if start)
    for start, end in ranges:
        if not start < end < ADDRESS_LIMIT:
            raise DamagedTable(f"the library's list of its own memory in pid {pid} is damaged: {start:#x}-{end:#x}")
    return ranges, struct.unpack("<I", unlisted)[0]


def _read_spans(read: ReadMemory, ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    """The memory holding many small ranges, as a few large reads of the spans they cluster in
    (a stopped process is read one system call per read), sorted by start."""
    ends: dict[int, int] = {}
    for start, size in ranges:
        ends[start] = max(ends.get(start, 0), start + size)
    starts = sorted(ends)  # ints sort several times faster than (start, size) pairs
    spans = []
    i = 0
    while i < len(starts):
        first, end = starts[i], ends[starts[i]]
        j = i + 1
        while j < len(starts) and starts[j] - end <= SPAN_GAP and ends[starts[j]] - first <= SPAN_MAX:
            end = max(end, ends[starts[j]])
            j += 1
        span = read(first, end - first)
        if len(span) == end - first:
            spans.append((first, span))
        else:  # across a hole: range by range
            spans += [(start, read(start, ends[start] - start)) for start in starts[i:j]]
        i = j
    return spans


def _until_unlocked(pid: int, attempt: Callable[[], T | None]) -> T:
    """attempt() until it finds the table unlocked (it returns None while a thread holds a shard)."""
    for _ in range(TABLE_TRIES):
        found = attempt()
        if found is not None:
            return found
        time.sleep(0.001)
    raise RuntimeFailure(f"pid {pid} kept its table locked through {TABLE_TRIES} tries")


def copy_with_table(
    pid: int, wanted: Callable[[Mapping], bool]
) -> tuple[FrozenImage, list[LiveAllocation], CopiedTable]:
    """A frozen copy of the process (the mappings wanted) taken while the table was unlocked,
    the live blocks in that table, and the table (its ranges are never roots of a
    reachability check: they point to every block)."""

    def attempt() -> tuple[FrozenImage, CopiedTable] | None:
        image = freeze_and_copy(pid, wanted)
        table = _copy_table(image.read, image.maps, pid, _table_addresses(image.maps, pid))
        return None if table is None else (image, table)

    image, table = _until_unlocked(pid, attempt)
    return image, table.allocations(), table


def table_snapshot(identity: ProcessInfo, backtrace_frames: int) -> Snapshot:
    """A snapshot read from the library's table in the stopped process, with pointers; the
    process as identity names it (its names, rights and container, read once)."""
    pid = identity.pid

    def attempt() -> tuple[CopiedTable, str, Codes] | None:
        with frozen(pid) as process:
            addresses = _table_addresses(process.maps, pid)
            table = _copy_table(process.read, process.maps, pid, addresses)
            codes: Codes = {}
            for interpreter in INTERPRETERS:
                try:
                    kept = interpreter.kept_codes_in_place(process.read, addresses[interpreter.kept_codes_symbol], pid)
                except DamagedCodes:  # its frames go unnamed ("code not read"), its blocks are counted
                    kept = {}
                if kept is None:
                    return None
                codes.update(kept)
            return None if table is None else (table, process.maps_text, codes)

    table, maps, codes = _until_unlocked(pid, attempt)
    allocations = table.allocations()  # decoded with the process running again
    tally = Counter((a.size, a.stack, a.stack_status, a.inherited) for a in allocations)
    groups = tuple(
        AllocationGroup(pid, size, count, stack, status, inherited)
        for (size, stack, status, inherited), count in tally.items()
    )
    info = dataclasses.replace(identity, maps=maps, forked=table.forked)
    return Snapshot(
        time.time(),
        groups,
        table.counters,
        {pid: info},
        backtrace_frames,
        tuple(allocations),
        interpreted_code=codes,
        sites=site_totals(pid, table.sites),
        peaks=peak_of(pid, table.sites, table.peak),
    )
