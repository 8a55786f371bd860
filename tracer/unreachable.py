"""Unreachable memory, as libmemunreachable finds it, for a Linux process.

The allocations come from leaktrace's own live table, with their sizes and
stacks. The process is frozen for a moment (tracer/freeze.py) while its
registers and writable memory are copied; the copy is then swept offline
(tracer/heap_graph.py) and the unreachable allocations are folded into leaks
(tracer/leak_folding.py) and merged by backtrace, as upstream does.

Roots: every writable mapping that holds no known allocation (.data and .bss of
each ELF file, anonymous memory, TLS), each thread's stack from its stack
pointer (less the 128-byte red zone) up, and every thread's registers. A mapping
that holds known allocations (the heap) is scanned only inside them, unless the
set of allocations is incomplete (a trace attached to a running process does
not know the blocks made before it): then the rest of the heap counts as roots
too, so that those blocks keep alive what they point to.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from .freeze import FrozenImage, freeze_and_copy
from .heap_graph import MemoryRegion, build_graph
from .leak_folding import fold_leaks
from .process import Mapping
from .snapshot import CONTENTS_LENGTH, UNREACHABLE_LIMIT, LiveAllocation, UnreachableLeak, UnreachableReport

RED_ZONE = 128            # x86-64 ABI: below the stack pointer, still the function's


def scanned_mapping(mapping: Mapping) -> bool:
    """The mappings a check copies: readable and writable ones."""
    return "r" in mapping.perms and "w" in mapping.perms and mapping.path not in ("[vvar]", "[vsyscall]")


def _without(ranges: tuple[tuple[int, int], ...], excluded: tuple[tuple[int, int], ...]):
    """The parts of ranges outside every excluded range."""
    for low, high in excluded:
        ranges = tuple(part for start, end in ranges
                       for part in ((start, min(end, low)), (max(start, high), end)) if part[0] < part[1])
    return ranges


def _regions(image: FrozenImage, begins: np.ndarray, complete: bool,
             excluded: tuple[tuple[int, int], ...]) -> list[MemoryRegion]:
    stack_pointers = image.stack_pointers()
    regions = []
    for mapping in image.maps:
        data = image.memory.get(mapping.start)
        if data is None:
            continue
        first = np.searchsorted(begins, np.uint64(mapping.start))
        holds_allocations = first < len(begins) and int(begins[first]) < mapping.end
        pointers = [sp for sp in stack_pointers if mapping.start <= sp < mapping.end]
        if holds_allocations:
            roots = () if complete else ((mapping.start, mapping.end),)
        elif pointers:
            roots = ((max(mapping.start, min(pointers) - RED_ZONE), mapping.end),)
        else:
            roots = ((mapping.start, mapping.end),)
        regions.append(MemoryRegion(mapping.start, data, _without(roots, excluded)))
    return regions


def _merge_by_backtrace(leaks: list[UnreachableLeak]) -> list[UnreachableLeak]:
    """Leaks with the same (non-empty) backtrace become one, with `similar` totals (upstream)."""
    merged: list[UnreachableLeak] = []
    by_stack: dict[tuple[int, ...], int] = {}
    for leak in leaks:
        earlier = by_stack.get(leak.stack) if leak.stack else None
        if earlier is None:
            if leak.stack:
                by_stack[leak.stack] = len(merged)
            merged.append(leak)
            continue
        first = merged[earlier]
        merged[earlier] = dataclasses.replace(
            first, similar_count=first.similar_count + 1, similar_size=first.similar_size + leak.size,
            similar_referenced_count=first.similar_referenced_count + leak.referenced_count,
            similar_referenced_size=first.similar_referenced_size + leak.referenced_size)
    return merged


def find_unreachable(pid: int, allocations: list[LiveAllocation], complete: bool,
                     limit: int = UNREACHABLE_LIMIT) -> UnreachableReport:
    """Freezes pid, copies what the check needs, lets it go, and sweeps the copy."""
    return sweep_image(freeze_and_copy(pid, scanned_mapping), allocations, complete, limit)


def sweep_image(image: FrozenImage, allocations: list[LiveAllocation], complete: bool,
                limit: int = UNREACHABLE_LIMIT, excluded: tuple[tuple[int, int], ...] = ()) -> UnreachableReport:
    """The check on a frozen copy; excluded ranges are never roots (the tracer's own records
    of the blocks, when they live in the process)."""
    pid = image.pid
    ordered = sorted((a for a in allocations if a.pid == pid), key=lambda a: a.address)
    begins = np.array([a.address for a in ordered], dtype=np.uint64)
    sizes = np.array([a.size for a in ordered], dtype=np.uint64)
    started = time.monotonic()
    registers = [value for regs in image.registers.values() for value in regs]
    graph = build_graph(begins, sizes, _regions(image, begins, complete, excluded), registers)
    reachable = graph.reachable()
    lost = np.flatnonzero(~reachable).tolist()
    among_lost = ~reachable[graph.sources] & ~reachable[graph.targets]
    edges = list(zip(graph.sources[among_lost].tolist(), graph.targets[among_lost].tolist()))
    folded = fold_leaks(lost, {i: ordered[i].size for i in lost}, edges)
    leaks = [UnreachableLeak(pid, ordered[f.node].address, ordered[f.node].size, f.referenced_count,
                             f.referenced_size, ordered[f.node].stack, ordered[f.node].stack_status,
                             image.read(ordered[f.node].address, min(ordered[f.node].size, CONTENTS_LENGTH)))
             for f in folded]
    leaks = sorted(_merge_by_backtrace(leaks), key=lambda leak: -leak.total_size)
    return UnreachableReport(pid, tuple(leaks[:limit]), len(leaks), len(lost),
                             sum(ordered[i].size for i in lost), len(ordered), int(sizes.sum()), complete,
                             image.pause_seconds, time.monotonic() - started, image.unreadable_pages)

