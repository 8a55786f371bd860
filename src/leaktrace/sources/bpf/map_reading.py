"""Reading the BPF program's maps: counters, stacks, the live table, the process table,
into plain data (groups, live allocations, traced processes)."""

from __future__ import annotations

import ctypes as ct
import struct
import time
from collections import Counter as Tally
from typing import NamedTuple

from leaktrace.abi.layout import (
    COUNTER_FIELDS,
    CTL_FORKS,
    LIVE_KEY,
    LIVE_VAL,
    PEAK,
    PROC,
    SITE_KEY,
    SITE_VAL,
    STACK_LOST,
    STACK_NONE,
)
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.model.snapshot import AllocationGroup, Counters, LiveAllocation, Peak, SiteTotals, StackStatus
from leaktrace.platform.process import printable
from leaktrace.sources.bpf.kernel_state import KernelState
from leaktrace.sources.bpf.maps import dump_map, gc_paused

MAX_PARSED_PROCS = 65536  # procs records kept parsed (by their bytes)


class TracedProcess(NamedTuple):
    """A process the kernel side knows, as its `procs` record says."""

    gen: int  # current image generation
    exited: bool
    ignored: int  # 0: traced; 1: outside the selection (until it execs); 2: leaktrace's own
    parent: int  # tgid it was forked from, 0 when not followed from a fork
    execed: bool  # exec'd since it was first seen
    comm: str  # as of its fork, exec or first allocator call
    uid: int
    whole: bool  # every block of its image is known (started or exec'd under the trace, or forked from such)

    @property
    def forked(self) -> bool:
        """Forked from a traced process and running the image it inherited (ProcessInfo.forked)."""
        return bool(self.parent) and not self.execed


class LiveEntry(NamedTuple):
    """One record of the live map: a block, or the tombstone of an inherited one."""

    tgid: int
    gen: int
    address: int
    size: int
    ts_ns: int
    stack_key: int
    inherited: int  # 0 or 1, as the map holds them
    tombstone: int


class MapReader:
    """What the maps hold, read in batches; the stacks and process records it parsed, kept."""

    def __init__(self, kernel: KernelState) -> None:
        self.kernel = kernel
        self._stack_cache: dict[int, tuple[int, ...]] = {}
        self._parsed_procs: dict[bytes, TracedProcess] = {}

    def forget_stacks(self, keys: list[int]) -> None:
        """The kernel dropped these stacks: their keys may be used again."""
        for key in keys:
            self._stack_cache.pop(key, None)

    def counters(self) -> Counters:
        table = self.kernel.bpf[b"counters"]
        totals = [sum(table[ct.c_int(i)]) for i in range(len(COUNTER_FIELDS))]
        return Counters(**dict(zip(COUNTER_FIELDS, totals)))

    def _stack(self, key: int) -> tuple[int, ...]:
        frames = self._stack_cache.get(key)
        if frames is None:
            try:
                raw = self.kernel.bpf[b"stacks"][ct.c_uint64(key)]
            except KeyError:
                return ()
            frames = tuple(ip for ip in raw.ip if ip)
            for interpreter in INTERPRETERS:
                frames = interpreter.kernel_words(frames)
            self._stack_cache[key] = frames
        return frames

    def _stack_of(self, stack_key: int) -> tuple[tuple[int, ...], StackStatus]:
        if stack_key == STACK_NONE:
            return (), StackStatus.FILTERED
        frames = self._stack(stack_key) if stack_key != STACK_LOST else ()
        return frames, StackStatus.CAPTURED if frames else StackStatus.LOST

    def _live_records(self):
        """(key, value) tuples of the live map, as unpacked (a record object each would double the walk)."""
        keys, values, _ = dump_map(self.kernel.bpf[b"live"])
        return zip(LIVE_KEY.iter_unpack(keys), LIVE_VAL.iter_unpack(values))

    def live_entries(self) -> list[LiveEntry]:
        return [LiveEntry._make(key + value) for key, value in self._live_records()]

    def _traced_process(self, record: bytes) -> TracedProcess:
        """A `procs` record, as the map holds it (records seldom change: each is parsed once)."""
        known = self._parsed_procs.get(record)
        if known is None:
            gen, exited, parent, execed, comm, uid, ignored, _, whole = PROC.unpack(record)
            known = TracedProcess(
                gen,
                bool(exited),
                ignored,
                parent,
                bool(execed),
                printable(comm.split(b"\0", 1)[0].decode(errors="replace")),
                uid,
                bool(whole),
            )
            if len(self._parsed_procs) >= MAX_PARSED_PROCS:
                self._parsed_procs.clear()
            self._parsed_procs[record] = known
        return known

    def process(self, tgid: int) -> TracedProcess | None:
        """One process's record, if the kernel side knows it."""
        try:
            value = self.kernel.bpf[b"procs"][ct.c_uint32(tgid)]
        except KeyError:
            return None
        return self._traced_process(bytes(value))

    def processes(self) -> dict[int, TracedProcess]:
        """Every process the kernel side knows (traced or ignored), by tgid: one batch read."""
        keys, values, _ = dump_map(self.kernel.bpf[b"procs"])
        return {
            tgid: self._traced_process(values[i * PROC.size : (i + 1) * PROC.size])
            for i, (tgid,) in enumerate(struct.iter_unpack("<I", keys))
        }

    def generations(self, pids: set[int] | None = None) -> dict[int, int]:
        """tgid -> current image generation, of every traced process or of pids."""
        return {tgid: p.gen for tgid, p in self.processes().items() if not p.ignored and (pids is None or tgid in pids)}

    def _current_live(self, gens: dict[int, int]) -> list[tuple[tuple, tuple]]:
        """Live blocks of these images, tombstones left out: (tgid, gen, address), (size,
        ts_ns, stack_key, inherited, tombstone)."""
        return [(key, value) for key, value in self._live_records() if not value[4] and gens.get(key[0]) == key[1]]

    @gc_paused
    def groups(
        self, older_than_ns: int | None = None, pids: set[int] | None = None, images: dict[int, int] | None = None
    ) -> list[AllocationGroup]:
        """Live allocations of the traced processes (or of pids; or of these images, pid ->
        generation, for processes gone from the process tables) grouped by (pid, size, stack).

        Without an age limit and with no fork followed this reads only the
        per-site counts; otherwise it walks every live allocation.
        """
        tally: Tally[tuple[int, int, int, bool]] = Tally()
        gens = self.generations(pids) if images is None else images
        if older_than_ns is None:
            for (tgid, _, stack_key, size), site in self._site_records(gens):
                if site[0] > 0:
                    tally[tgid, stack_key, size, False] += site[0]
            if self.kernel.control(CTL_FORKS):  # inherited blocks are counted from the live map only
                for (tgid, _, _), (size, _, stack_key, inherited, _) in self._current_live(gens):
                    if inherited:
                        tally[tgid, stack_key, size, True] += 1
        else:
            cutoff = time.monotonic_ns() - older_than_ns
            for (tgid, _, _), (size, ts_ns, stack_key, inherited, _) in self._current_live(gens):
                if ts_ns <= cutoff:
                    tally[tgid, stack_key, size, bool(inherited)] += 1
        return [
            AllocationGroup(tgid, size, count, *self._stack_of(key), inherited=inherited)
            for (tgid, key, size, inherited), count in tally.items()
        ]

    def _site_records(self, gens: dict[int, int]) -> list[tuple[tuple, tuple]]:
        """The site map's records of these images: (tgid, gen, stack key, size), (live,
        allocations, frees, short-lived, peak_live, peak_epoch)."""
        keys, values, _ = dump_map(self.kernel.bpf[b"sites"])
        return [
            (key, value)
            for key, value in zip(SITE_KEY.iter_unpack(keys), SITE_VAL.iter_unpack(values))
            if gens.get(key[0]) == key[1]
        ]

    @gc_paused
    def sites_and_peaks(
        self, pids: set[int] | None = None, images: dict[int, int] | None = None
    ) -> tuple[list[SiteTotals], list[Peak]]:
        """From one read of the site map, of the traced processes (or of pids, or of these
        images): what each site made since the trace began, and each process's high-water mark
        of live bytes with its sites' blocks as of the last peak epoch (a moment less than
        PEAK_STEP_PERCENT below it)."""
        gens = self.generations(pids) if images is None else images
        records = self._site_records(gens)
        sites = [
            SiteTotals(tgid, size, allocations, frees, short, *self._stack_of(stack_key))
            for (tgid, _, stack_key, size), (_, allocations, frees, short, _, _) in records
            if allocations
        ]
        keys, values, _ = dump_map(self.kernel.bpf[b"peaks"])
        found = {
            key >> 32: value
            for (key,), value in zip(struct.iter_unpack("<Q", keys), PEAK.iter_unpack(values))
            if gens.get(key >> 32) == key & 0xFFFFFFFF and value[1]
        }
        tally: dict[int, Tally[tuple[int, int]]] = {tgid: Tally() for tgid in found}
        for (tgid, _, stack_key, size), (live, _, _, _, peak_live, peak_epoch) in records:
            if tgid in found:
                count = peak_live if peak_epoch == found[tgid][3] else live
                if count > 0:
                    tally[tgid][stack_key, size] += count
        wall_offset = time.time() - time.monotonic_ns() / 1e9  # bpf_ktime_get_ns is CLOCK_MONOTONIC
        peaks = [
            Peak(
                tgid,
                peak_bytes,
                wall_offset + peak_ns / 1e9,
                tuple(
                    AllocationGroup(tgid, size, count, *self._stack_of(stack_key))
                    for (stack_key, size), count in tally[tgid].items()
                ),
                peak_bytes - epoch_bytes,
            )
            for tgid, (_, peak_bytes, peak_ns, _, epoch_bytes, _, _) in found.items()
        ]
        return sites, peaks

    @gc_paused
    def allocations(self, pids: set[int] | None = None, images: dict[int, int] | None = None) -> list[LiveAllocation]:
        """Every live allocation with its address (a walk of the whole live table), of the traced
        processes, or of pids, or of these images (pid -> generation)."""
        live = self._current_live(self.generations(pids) if images is None else images)
        return [
            LiveAllocation(tgid, address, size, *self._stack_of(stack_key), inherited=bool(inherited))
            for (tgid, _, address), (size, _, stack_key, inherited, _) in live
        ]

    @gc_paused
    def recorded_pids(self) -> dict[str, set[int]]:
        """Table name -> the tgids it holds records of (to prove that exited processes leave none)."""
        return {
            "live": {e.tgid for e in self.live_entries()},
            "sites": {key.tgid for key in self.kernel.bpf[b"sites"].keys()},
            "procs": {key.value for key in self.kernel.bpf[b"procs"].keys()},
            "inherits": {key.value for key in self.kernel.bpf[b"inherits"].keys()},
            "copy_slots": {key.parent for key in self.kernel.bpf[b"copy_slots"].keys()},
            "holds": {key.value for key in self.kernel.bpf[b"holds"].keys()} if self.kernel.holds_images else set(),
        }
