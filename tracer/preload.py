"""The in-process engine: the LD_PRELOAD library (preload/*.c) as a source.

A command runs with the library (or a process started with it elsewhere is read).
A snapshot of a launched command stops it for a moment (ptrace, as the reachability
check does) and reads the library's table of live blocks in place, once no thread
holds the table's lock. A process started elsewhere is asked for a heap dump, as
upstream's users do (SIGRTMAX-17, written at its next allocator call), and read in
place only if none comes. At exit a launched command writes a last dump
(backtrace_dump_on_exit). Dumps are Android's v1.2 text, MAPS included, so a
snapshot from one symbolizes like one from the BPF engine. The reachability check
reads the table from the frozen copy of the process.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import glob
import os
import re
import shutil
import signal
import struct
import tempfile
import time
from collections import Counter
from pathlib import Path

from .android_records import return_addresses
from .elf import ElfFile
from .errors import RuntimeFailure
from .freeze import FrozenImage, freeze_and_copy, frozen
from .malloc_options import DEFAULT_DUMP_PREFIX, OptionError, parse_malloc_debug_options
from .process import Mapping, alive, parse_maps, read_process, resolve_executable
from .render_leak_info import LeakInfoEntry, decode_leak_info
from .snapshot import (AllocationGroup, Counters, LiveAllocation, ProcessInfo, Snapshot, StackStatus,
                       UnreachableReport)
from .unreachable import DEFAULT_LIMIT, scanned_mapping, sweep_image

DUMP_SIGNAL = signal.SIGRTMAX - 17
DUMP_WAIT = 1.0        # seconds for a program to make an allocator call and write the dump asked for
TABLE_TRIES = 100      # stops of the process to find its table unlocked (a lock is held for microseconds)
SPAN_GAP, SPAN_MAX = 64 << 10, 64 << 20   # stacks closer than SPAN_GAP are read together, up to SPAN_MAX
_RECORD = re.compile(r"z (\d)  sz +(\d+)  num +(\d+)  bt((?: [0-9a-f]+)*)$")
# struct record of preload/malloc_debug.h: pointer, size, flags, frame_count, frames.
RECORD = struct.Struct("<QQIIQ")
RECORD_ZYGOTE = 1   # the flag bit of a block allocated before a fork


def _status(stack: tuple[int, ...]) -> StackStatus:
    """The library keeps a stack for every size in its backtrace range: none means filtered."""
    return StackStatus.CAPTURED if stack else StackStatus.FILTERED


def preload_library() -> str:
    """Path of the library that pip install built into the package."""
    found = sorted(glob.glob(str(Path(__file__).parent / "_malloc_debug*.so")))
    if not found:
        raise RuntimeFailure("leaktrace's preload library is not built: reinstall leaktrace (pip install)")
    return found[0]


def snapshot_from_heap_dump(text: str, pid: int, comm: str, taken_at: float, exited: bool = False) -> Snapshot:
    """A snapshot from an "Android Native Heap Dump v1.2": its records as groups, its maps."""
    if not text.startswith("Android Native Heap Dump v1.2"):
        raise ValueError("not an Android Native Heap Dump v1.2")
    body, _, maps = text.partition("\nMAPS\n")
    depth = int(re.search(r"^Backtrace size: (\d+)$", body, re.M).group(1))
    groups = []
    for line in body.splitlines():
        found = _RECORD.match(line)
        if not found:
            continue
        zygote, size, count, frames = found.groups()
        stack = return_addresses(tuple(int(pc, 16) for pc in frames.split()))
        groups.append(AllocationGroup(pid, int(size), int(count), stack, _status(stack), zygote == "1"))
    info = ProcessInfo(pid, comm, comm, maps.removesuffix("END\n"), exited)
    return Snapshot(taken_at, tuple(groups), Counters(), {pid: info}, depth)


class PreloadTrace:
    """A process running with the library: launched with it (launch) or started with it
    elsewhere (attach); the same snapshots as a BPF trace, from the dumps it writes (or,
    when it makes no allocator call to write one, from its table read in place)."""

    def __init__(self, pid: int, prefix: str, comm: str, backtrace_frames: int, workdir: str | None = None):
        self.pid = pid
        self.prefix = prefix              # the library's backtrace_dump_prefix
        self.comm = comm
        self.backtrace_frames = backtrace_frames
        self.workdir = workdir            # ours to delete (launch only)
        self.is_child = workdir is not None
        self.exit_status: int | None = None
        self._gone = False
        self.final_snapshot: Snapshot | None = None
        self._last: Snapshot | None = None

    @classmethod
    def launch(cls, argv: list[str], options: str) -> "PreloadTrace":
        """Runs argv with the library, told options (plus a dump at exit into a directory of ours)."""
        path = resolve_executable(argv[0])
        workdir = tempfile.mkdtemp(prefix="leaktrace-preload-")
        prefix = os.path.join(workdir, "heap")
        env = dict(os.environ, LD_PRELOAD=preload_library(),
                   LIBC_DEBUG_MALLOC_OPTIONS=f"{options} backtrace_dump_on_exit backtrace_dump_prefix={prefix}")
        frames = parse_malloc_debug_options(options).backtrace_frames
        return cls(os.spawnve(os.P_NOWAIT, path, argv, env), prefix, os.path.basename(path)[:15], frames, workdir)

    @classmethod
    def attach(cls, pid: int) -> "PreloadTrace":
        """A process already running with the library; its dumps go where its options say."""
        info = read_process(pid)
        if info is None:
            raise RuntimeFailure(f"no process with pid {pid}")
        if _library_base(parse_maps(info.maps), preload_library()) is None:
            raise RuntimeFailure(f"pid {pid} does not run with leaktrace's preload library (see --preload-lib)")
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            config = parse_malloc_debug_options(environ.get(b"LIBC_DEBUG_MALLOC_OPTIONS", b"").decode())
        except (OSError, OptionError) as e:
            raise RuntimeFailure(f"cannot read pid {pid}'s malloc debug options: {e}") from None
        return cls(pid, str(config.values.get("backtrace_dump_prefix", DEFAULT_DUMP_PREFIX)), info.comm,
                   config.backtrace_frames)

    @property
    def exited(self) -> bool:
        return self._gone

    def _read_dump(self, suffix: str, exited: bool) -> Snapshot | None:
        try:
            text = Path(f"{self.prefix}.{self.pid}{suffix}").read_text()
        except FileNotFoundError:
            return None
        return snapshot_from_heap_dump(text, self.pid, self.comm, time.time(), exited)

    def snapshot(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live blocks now (the final dump once the process has exited).

        A launched command is stopped for a moment and its table read in place: no signal
        reaches it, so none of its system calls is cut short. A process started elsewhere
        is asked for a dump, as malloc_debug's users do (SIGRTMAX-17; it writes one at its
        next allocator call); if none comes within DUMP_WAIT, its table is read in place.
        The library keeps no ages: older_than_ms is refused."""
        if older_than_ms is not None:
            raise RuntimeFailure("the preload engine keeps no allocation ages")
        if self.exited:
            return self.final_snapshot or Snapshot(time.time(), (), Counters())
        if not self.is_child and not with_allocations:
            found = self._requested_dump(DUMP_WAIT)
            if found:
                self._last = found
                return found
        try:
            self._last = table_snapshot(self.pid, self.comm, self.backtrace_frames)
        except RuntimeFailure:
            if not self.poll():
                return self.snapshot()
            raise
        return self._last

    def _requested_dump(self, wait: float) -> Snapshot | None:
        """Asks for a dump and reads it; None if none comes within wait seconds."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.prefix}.{self.pid}.txt")   # so that the next one is known to be new
        os.kill(self.pid, DUMP_SIGNAL)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            found = self._read_dump(".txt", False)
            if found or not self.poll():
                return found or self.snapshot()
            time.sleep(0.01)
        return None

    def poll(self) -> bool:
        """False once the process has exited; its exit dump (or else its last snapshot) is then final."""
        if self._gone:
            return False
        if self.is_child:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return True
            self.exit_status = os.waitstatus_to_exitcode(status)
        elif alive(self.pid):
            return True
        self._gone = True
        last = self._last and dataclasses.replace(self._last, processes={
            pid: dataclasses.replace(info, exited=True) for pid, info in self._last.processes.items()})
        self.final_snapshot = self._read_dump(".exit.txt", True) or last
        return False

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def check_unreachable(self, limit: int = DEFAULT_LIMIT) -> UnreachableReport:
        """The reachability check, with the allocations read from the library's own table
        in the frozen copy: exactly the blocks live at the freeze."""
        if self.exited:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        for _ in range(TABLE_TRIES):
            image = freeze_and_copy(self.pid, scanned_mapping)
            found = allocations_in_image(image)
            if found:
                allocations, table = found
                return sweep_image(image, allocations, complete=True, limit=limit, excluded=table)
            time.sleep(0.001)
        raise RuntimeFailure(f"pid {self.pid} kept its table locked through {TABLE_TRIES} tries")

    def close(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "PreloadTrace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def leak_info_in_process() -> list[LeakInfoEntry]:
    """get_malloc_leak_info() of this very process, which must run with the library
    preloaded (LD_PRELOAD=$(leaktrace --preload-lib) python ...)."""
    try:
        function = ctypes.CDLL(None).get_malloc_leak_info
    except AttributeError:
        raise RuntimeFailure("this process was not started with leaktrace's preload library") from None
    info, sizes = ctypes.POINTER(ctypes.c_uint8)(), [ctypes.c_size_t() for _ in range(4)]
    function(ctypes.byref(info), *(ctypes.byref(s) for s in sizes))
    overall, _, _, backtrace_size = (s.value for s in sizes)
    try:
        return decode_leak_info(ctypes.string_at(info, overall), backtrace_size) if overall else []
    finally:
        ctypes.CDLL(None).free_malloc_leak_info(info)


def _library_base(maps: list[Mapping], library: str) -> int | None:
    """Where the library is loaded in a process (its mapping at file offset 0)."""
    real = os.path.realpath(library)
    for mapping in maps:
        if mapping.offset == 0 and mapping.path and os.path.realpath(mapping.path) == real:
            return mapping.start
    return None


@functools.lru_cache(maxsize=1)
def _table_symbols() -> dict[str, int]:
    symbols = ElfFile(preload_library()).dynamic_objects
    return {name: symbols[name] for name in ("leaktrace_table", "leaktrace_table_slots", "leaktrace_table_lock")}


def _table_addresses(maps: list[Mapping], pid: int) -> dict[str, int]:
    """Where the library's table variables are in a process."""
    base = _library_base(maps, preload_library())
    if base is None:
        raise RuntimeFailure(f"pid {pid} does not run with leaktrace's preload library")
    return {name: base + offset for name, offset in _table_symbols().items()}


def _table_busy(read, addresses: dict[str, int]) -> bool:
    """A thread was stopped while changing the table (its lock is held): read it again later."""
    return read(addresses["leaktrace_table_lock"], 4) != b"\0\0\0\0"


def _read_table(read, pid: int, addresses: dict[str, int]) -> tuple[list[LiveAllocation], tuple[int, int]]:
    """The live blocks in the library's table, through read(address, size) (a stopped process
    or a copy of one), and the range the table occupies."""
    table, slots = (struct.unpack("<Q", read(addresses[name], 8).ljust(8, b"\0"))[0]
                    for name in ("leaktrace_table", "leaktrace_table_slots"))
    records = read(table, slots * RECORD.size)
    whole = len(records) // RECORD.size * RECORD.size
    live = [record for record in RECORD.iter_unpack(records[:whole]) if record[0] > 1]   # 0 empty, 1 deleted
    frames = _read_many(read, [(frames_at, 8 * count) for _, _, _, count, frames_at in live if count])
    allocations = []
    for pointer, size, flags, frame_count, frames_at in live:
        pcs = frames.get(frames_at, b"") if frame_count else b""
        stack = return_addresses(struct.unpack(f"<{len(pcs) // 8}Q", pcs))
        allocations.append(LiveAllocation(pid, pointer, size, stack, _status(stack), bool(flags & RECORD_ZYGOTE)))
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


def allocations_in_image(image: FrozenImage) -> tuple[list[LiveAllocation], tuple[tuple[int, int], ...]] | None:
    """The library's table of live blocks, read from a frozen copy of the process, and the
    range the table itself occupies (never a root: it points to every block); None if the
    copy caught a thread changing the table."""
    addresses = _table_addresses(image.maps, image.pid)
    if _table_busy(image.read, addresses):
        return None
    allocations, table = _read_table(image.read, image.pid, addresses)
    return allocations, (table,)


def table_snapshot(pid: int, comm: str, backtrace_frames: int) -> Snapshot:
    """A snapshot read from the library's table in the stopped process, with pointers: for
    a program that makes no allocator call (and so writes no dump)."""
    for _ in range(TABLE_TRIES):
        with frozen(pid) as process:
            addresses = _table_addresses(process.maps, pid)
            if not _table_busy(process.read, addresses):
                allocations, _ = _read_table(process.read, pid, addresses)
                maps = process.maps_text
                break
        time.sleep(0.001)
    else:
        raise RuntimeFailure(f"pid {pid} kept its table locked through {TABLE_TRIES} tries")
    tally = Counter((a.size, a.stack, a.stack_status, a.inherited) for a in allocations)
    groups = tuple(AllocationGroup(pid, size, count, stack, status, inherited)
                   for (size, stack, status, inherited), count in tally.items())
    return Snapshot(time.time(), groups, Counters(), {pid: ProcessInfo(pid, comm, comm, maps)}, backtrace_frames,
                    tuple(allocations))
