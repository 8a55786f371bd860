"""Unreachable memory, as libmemunreachable finds it, for a Linux process.

The allocations come from leaktrace's own live table, with their sizes and
stacks; for a process traced since it was attached (not launched), from the walk of
its glibc heap too (reachability/glibc_heap.py), so that blocks made before the trace are
judged as well, without a stack and sized by their usable size. The process is frozen for a moment (freeze.py) while its
registers and writable memory are copied; the copy is then swept offline
(heap_graph.py) and the unreachable allocations are folded into leaks
(leak_folding.py) and merged by backtrace, as upstream does.

Roots: every writable mapping that holds no known allocation (.data and .bss of
each ELF file, anonymous memory, TLS), each thread's stack from its stack
pointer (less the 128-byte red zone, unless it stands in a system call or at an exit hold)
up, and every thread's registers. A mapping
that holds known allocations (the heap) is scanned only inside them, unless the
set of allocations is incomplete (a trace attached to a running process does
not know the blocks made before it, and no heap walk found them): then the rest of
the heap counts as roots too, so that those blocks keep alive what they point to.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from leaktrace.model.heap import HeapReport, HeapWalk
from leaktrace.model.snapshot import (
    CONTENTS_LENGTH,
    UNREACHABLE_LIMIT,
    LeakCheck,
    LeakKind,
    LiveAllocation,
    LossRecord,
    ProcessInfo,
    StackStatus,
    UnreachableLeak,
    UnreachableReport,
)
from leaktrace.platform.freeze import FrozenImage, freeze_and_copy
from leaktrace.platform.module_files import GLIBC_NAME, ModuleFiles, allocator_library_of_process
from leaktrace.platform.process import Mapping, read_target
from leaktrace.reachability.glibc_heap import HeapWalkRefused, allocator_state, exit_callers, walk_heap
from leaktrace.reachability.heap_graph import HeapGraph, MemoryRegion, build_graph
from leaktrace.reachability.leak_folding import fold_leaks, lost_leaders

HoldSpot = tuple[str, int, int]  # a hold's probe: its file's device (as maps prints it), inode, file offset


def scanned_mapping(mapping: Mapping) -> bool:
    """The mappings a check copies: readable and writable ones."""
    return "r" in mapping.perms and "w" in mapping.perms and mapping.path not in ("[vvar]", "[vsyscall]")


def _without(ranges: tuple[tuple[int, int], ...], excluded: tuple[tuple[int, int], ...]):
    """The parts of ranges outside every excluded range."""
    for low, high in excluded:
        ranges = tuple(
            part
            for start, end in ranges
            for part in ((start, min(end, low)), (max(start, high), end))
            if part[0] < part[1]
        )
    return ranges


def _regions(
    image: FrozenImage,
    begins: np.ndarray,
    sizes: np.ndarray,
    complete: bool,
    excluded: tuple[tuple[int, int], ...],
    holds: frozenset[int] = frozenset(),
    exiting: dict[int, int] | None = None,
) -> list[MemoryRegion]:
    """exiting: a thread in exit's stack pointer -> where its live frames begin (exit_callers)."""
    scan_starts = [(sp, max(start, (exiting or {}).get(sp, start))) for sp, start in image.stack_scan_starts(holds)]
    regions = []
    for mapping in image.maps:
        data = image.memory.get(mapping.start)
        if data is None:
            continue
        first = np.searchsorted(begins, np.uint64(mapping.start))
        holds_allocations = first < len(begins) and int(begins[first]) < mapping.end
        starts = [start for sp, start in scan_starts if mapping.start <= sp < mapping.end]
        if holds_allocations and complete and mapping.path.startswith("/"):
            # A module's data where its allocator put blocks (musl gives malloc the spare ends
            # of each module's .bss): its variables are roots, the blocks in it are not.
            last = np.searchsorted(begins, np.uint64(mapping.end))
            blocks = tuple((int(b), int(b) + int(n)) for b, n in zip(begins[first:last], sizes[first:last]))
            roots = _without(((mapping.start, mapping.end),), blocks)
        elif holds_allocations:
            roots = () if complete else ((mapping.start, mapping.end),)
        elif starts:
            roots = ((max(mapping.start, min(starts)), mapping.end),)
        else:
            roots = ((mapping.start, mapping.end),)
        regions.append(MemoryRegion(mapping.start, data, _without(roots, excluded)))
    return regions


def _similarity(leak: UnreachableLeak) -> tuple | None:
    """What makes leaks one entry: the same backtrace (upstream); with no stack (a block the
    heap walk found), the same size and contents."""
    if leak.stack:
        return leak.stack
    if leak.stack_status == StackStatus.BEFORE_TRACE:
        return (leak.size, leak.contents)
    return None


def _merge_by_backtrace(leaks: list[UnreachableLeak]) -> list[UnreachableLeak]:
    """Similar leaks become one, with `similar` totals (upstream's merge by backtrace)."""
    merged: list[UnreachableLeak] = []
    by_key: dict[tuple, int] = {}
    for leak in leaks:
        key = _similarity(leak)
        earlier = by_key.get(key) if key is not None else None
        if earlier is None:
            if key is not None:
                by_key[key] = len(merged)
            merged.append(leak)
            continue
        first = merged[earlier]
        merged[earlier] = dataclasses.replace(
            first,
            similar_count=first.similar_count + 1,
            similar_size=first.similar_size + leak.size,
            similar_referenced_count=first.similar_referenced_count + leak.referenced_count,
            similar_referenced_size=first.similar_referenced_size + leak.referenced_size,
        )
    return merged


def find_unreachable(
    process: ProcessInfo,
    allocations: list[LiveAllocation],
    complete: bool,
    limit: int = UNREACHABLE_LIMIT,
    allocator: str = "",
) -> UnreachableReport:
    """Freezes the process, copies what the check needs, lets it go, and sweeps the copy. When
    the allocations are incomplete and the allocator (its library's path) is glibc's, the
    blocks of the heap the trace did not see are judged too."""
    image = freeze_and_copy(process.pid, scanned_mapping)
    if complete:
        return sweep_image(image, allocations, complete, limit, allocator_state(process, image))
    return sweep_with_heap_walk(process, image, allocations, limit, allocator)


def sweep_with_heap_walk(
    process: ProcessInfo,
    image: FrozenImage,
    allocations: list[LiveAllocation],
    limit: int,
    allocator: str,
    tracer_blocks: Sequence[int] = (),
    excluded: tuple[tuple[int, int], ...] = (),
) -> UnreachableReport:
    """The check when the tracer's allocations are not all the process's: glibc's heap walk
    adds the blocks it never saw (the tracer's own blocks left out, excluded never roots);
    without a walk, the heap counts as roots."""
    try:
        refuse_other_allocators(process.pid, allocator)
        walk = walk_heap(process, image)
    except HeapWalkRefused as e:
        report = sweep_image(image, allocations, False, limit, excluded)
        return dataclasses.replace(report, heap_walk=f"no heap walk: {e}")
    return sweep_walked(image, allocations, walk, limit, tracer_blocks, excluded)


def sweep_walked(
    image: FrozenImage,
    allocations: list[LiveAllocation],
    walk: HeapWalk,
    limit: int,
    tracer_blocks: Sequence[int] = (),
    excluded: tuple[tuple[int, int], ...] = (),
) -> UnreachableReport:
    """The check over every block the walk found: the trace's record where it has one (its size
    and stack), else a block made before the trace. A traced allocation the walk did not find was
    freed while its record was read, unless the walk is incomplete: then it is judged too. The
    tracer's own blocks in the heap (tracer_blocks) are left out, and excluded are never roots."""
    begins, sizes, allocation_at, traced = _walked_blocks(image, allocations, walk, tracer_blocks)
    report = _sweep_blocks(image, begins, sizes, allocation_at, walk.complete, limit, walk.allocator_state + excluded)
    return dataclasses.replace(
        report, heap_walk=heap_walk_line(walk), walk_problems=walk.problems, before_trace=len(begins) - traced
    )


def _walked_blocks(
    image: FrozenImage, allocations: list[LiveAllocation], walk: HeapWalk, tracer_blocks: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray, Callable[[int], LiveAllocation], int]:
    """Every block the walk found (begins ascending, sizes), each the trace's record where it has
    one (its size and stack), else a block made before the trace; and how many had a record."""
    traced = {a.address: a for a in allocations if a.pid == image.pid}
    begins, sizes = walk.addresses, walk.usable.copy()
    if len(tracer_blocks):
        kept = ~np.isin(begins, np.array(tracer_blocks, dtype=np.uint64))
        begins, sizes = begins[kept], sizes[kept]
    wanted = np.array(sorted(traced), dtype=np.uint64)
    at = np.minimum(np.searchsorted(begins, wanted), max(len(begins) - 1, 0))
    found = begins[at] == wanted if len(begins) else np.zeros(len(wanted), dtype=bool)
    if not walk.complete and not found.all():
        begins = np.concatenate([begins, wanted[~found]])
        sizes = np.concatenate([sizes, np.zeros(int((~found).sum()), dtype=np.uint64)])
        order = np.argsort(begins, kind="stable")
        begins, sizes = begins[order], sizes[order]
        at, found = np.searchsorted(begins, wanted), np.ones(len(wanted), dtype=bool)
    records = {int(i): traced[int(address)] for i, address in zip(at[found], wanted[found])}
    for i, record in records.items():
        sizes[i] = record.size

    def allocation_at(i: int) -> LiveAllocation:
        return records.get(i) or LiveAllocation(image.pid, int(begins[i]), int(sizes[i]), (), StackStatus.BEFORE_TRACE)

    return begins, sizes, allocation_at, len(records)


def refuse_other_allocators(pid: int, allocator: str) -> None:
    """HeapWalkRefused unless the process's allocator (its library's path) is glibc's."""
    if not GLIBC_NAME.search(allocator):
        raise HeapWalkRefused(f"pid {pid} allocates with {allocator}: the heap walk is glibc's")


def examine_heap(pid: int, unreachable: bool = False, limit: int = UNREACHABLE_LIMIT) -> HeapReport:
    """Freezes pid, copies its writable memory, lets it go, and walks its glibc heap (and with
    unreachable, sweeps it); raises HeapWalkRefused where its allocator is not glibc's."""
    process = read_target(pid)
    refuse_other_allocators(pid, allocator_library_of_process(process, ModuleFiles()).path)
    image = freeze_and_copy(pid, scanned_mapping)
    walk = walk_heap(process, image)
    report = sweep_walked(image, [], walk, limit) if unreachable else None
    return HeapReport(process, walk, image.pause_seconds, report)


def heap_walk_line(walk: HeapWalk) -> str:
    return (
        f"heap walk (glibc {walk.glibc}): {len(walk.addresses)} blocks in use in {len(walk.arenas)} "
        f"arena{'' if len(walk.arenas) == 1 else 's'} and {int(walk.mmapped.sum())} mmapped chunks, "
        f"walked in {walk.walk_seconds * 1000:.1f} ms; {walk.method}"
    )


def sweep_image(
    image: FrozenImage,
    allocations: list[LiveAllocation],
    complete: bool,
    limit: int = UNREACHABLE_LIMIT,
    excluded: tuple[tuple[int, int], ...] = (),
) -> UnreachableReport:
    """The check on a frozen copy; excluded ranges are never roots (the tracer's own records
    of the blocks, when they live in the process)."""
    return _sweep_blocks(image, *_known_blocks(image, allocations), complete, limit, excluded)


def _known_blocks(
    image: FrozenImage, allocations: list[LiveAllocation]
) -> tuple[np.ndarray, np.ndarray, Callable[[int], LiveAllocation]]:
    """The process's allocations as blocks (begins ascending, sizes, the allocation at each)."""
    ordered = sorted((a for a in allocations if a.pid == image.pid), key=lambda a: a.address)
    begins = np.array([a.address for a in ordered], dtype=np.uint64)
    sizes = np.array([a.size for a in ordered], dtype=np.uint64)
    return begins, sizes, ordered.__getitem__


def _graph(
    image: FrozenImage,
    begins: np.ndarray,
    sizes: np.ndarray,
    complete: bool,
    excluded: tuple[tuple[int, int], ...],
    holds: frozenset[int] = frozenset(),
    exiting: dict[int, int] | None = None,
) -> HeapGraph:
    """The references among the blocks, and from the roots, in the frozen copy."""
    registers = image.root_registers(holds)
    return build_graph(begins, sizes, _regions(image, begins, sizes, complete, excluded, holds, exiting), registers)


def _sweep_blocks(
    image: FrozenImage,
    begins: np.ndarray,
    sizes: np.ndarray,
    allocation_at: Callable[[int], LiveAllocation],
    complete: bool,
    limit: int,
    excluded: tuple[tuple[int, int], ...],
) -> UnreachableReport:
    """The check over blocks given as arrays (begins ascending); allocation_at(i) is asked only
    for the unreachable ones."""
    started = time.monotonic()
    graph = _graph(image, begins, sizes, complete, excluded)
    reachable = graph.reachable()
    lost = np.flatnonzero(~reachable).tolist()
    among_lost = ~reachable[graph.sources] & ~reachable[graph.targets]
    edges = list(zip(graph.sources[among_lost].tolist(), graph.targets[among_lost].tolist()))
    lost_sizes = sizes[lost].tolist()
    folded = fold_leaks(lost, dict(zip(lost, lost_sizes)), edges)
    leaks = []
    for f in folded:
        block = allocation_at(f.node)
        leaks.append(
            UnreachableLeak(
                image.pid,
                block.address,
                block.size,
                f.referenced_count,
                f.referenced_size,
                block.stack,
                block.stack_status,
                image.read(block.address, min(block.size, CONTENTS_LENGTH)),
            )
        )
    leaks = sorted(_merge_by_backtrace(leaks), key=lambda leak: -leak.total_size)
    return UnreachableReport(
        image.pid,
        tuple(leaks[:limit]),
        len(leaks),
        len(lost),
        sum(lost_sizes),
        len(begins),
        int(sizes.sum()),
        complete,
        image.pause_seconds,
        time.monotonic() - started,
        image.unreadable_pages,
    )


def judge_leak_kinds(
    process: ProcessInfo, allocations: list[LiveAllocation], holds: tuple[HoldSpot, ...] = ()
) -> LeakCheck:
    """valgrind's verdict on every block of a process whose blocks are all known (traced from
    its start; standing in _exit, at one of the holds), frozen a moment for its copy."""
    image = freeze_and_copy(process.pid, scanned_mapping)
    return _judge_blocks(
        image,
        *_known_blocks(image, allocations),
        True,
        allocator_state(process, image),
        hold_addresses(image, holds),
        exit_callers(process, image),
    )


def judge_leak_kinds_copied(
    process: ProcessInfo, image: FrozenImage, allocations: list[LiveAllocation], excluded: tuple[tuple[int, int], ...]
) -> LeakCheck:
    """valgrind's verdict on every block of a process whose blocks are all known, from a copy
    already frozen (the in-process library's table read in it); excluded: ranges that are
    never roots (that table, which points to every block)."""
    return _judge_blocks(
        image,
        *_known_blocks(image, allocations),
        True,
        allocator_state(process, image) + excluded,
        exiting=exit_callers(process, image),
    )


def hold_addresses(image: FrozenImage, holds: tuple[HoldSpot, ...]) -> frozenset[int]:
    """Where in the image's memory each hold's probe is: its file (device, inode) mapped there."""
    found = set()
    for device, inode, offset in holds:
        for mapping in image.maps:
            if (mapping.device, mapping.inode) == (device, inode) and "x" in mapping.perms:
                if mapping.offset <= offset < mapping.offset + mapping.end - mapping.start:
                    found.add(mapping.start + offset - mapping.offset)
    return frozenset(found)


def judge_leak_kinds_walked(process: ProcessInfo, allocations: list[LiveAllocation], allocator: str) -> LeakCheck:
    """valgrind's verdict on every block of a process traced since it was attached to, frozen a
    moment: those made before the trace come from glibc's heap walk (no stack, usable sizes).
    Raises HeapWalkRefused where there is no walk (another allocator): the judgement would be partial."""
    refuse_other_allocators(process.pid, allocator)
    image = freeze_and_copy(process.pid, scanned_mapping)
    walk = walk_heap(process, image)
    begins, sizes, allocation_at, _ = _walked_blocks(image, allocations, walk)
    return _judge_blocks(image, begins, sizes, allocation_at, walk.complete, walk.allocator_state)


def _judge_blocks(
    image: FrozenImage,
    begins: np.ndarray,
    sizes: np.ndarray,
    allocation_at: Callable[[int], LiveAllocation],
    complete: bool,
    excluded: tuple[tuple[int, int], ...],
    holds: frozenset[int] = frozenset(),
    exiting: dict[int, int] | None = None,
) -> LeakCheck:
    """valgrind's kinds: still reachable through pointers to block starts from the roots,
    possibly lost when only a pointer into a block's middle leads there, else lost:
    definitely for the lowest block of each group of lost blocks no other lost block points
    into, indirectly for the rest. Blocks given as in _sweep_blocks."""
    graph = _graph(image, begins, sizes, complete, excluded, holds, exiting)
    reachable = graph.reachable(graph.rooted_at_start, graph.at_start)
    possible = graph.reachable(graph.rooted | reachable) & ~reachable
    lost = ~(reachable | possible)
    among_lost = lost[graph.sources] & lost[graph.targets]
    edges = list(zip(graph.sources[among_lost].tolist(), graph.targets[among_lost].tolist()))
    leaders = lost_leaders(np.flatnonzero(lost).tolist(), edges)
    records: dict[tuple, list[int]] = {}
    for i in range(len(begins)):
        allocation = allocation_at(i)
        kind = (
            LeakKind.REACHABLE
            if reachable[i]
            else LeakKind.POSSIBLE
            if possible[i]
            else LeakKind.DEFINITE
            if i in leaders
            else LeakKind.INDIRECT
        )
        record = records.setdefault((kind, allocation.stack, allocation.stack_status), [0, 0])
        record[0] += 1
        record[1] += allocation.size
    return LeakCheck(
        image.pid,
        tuple(
            sorted(
                (
                    LossRecord(image.pid, kind, blocks, size, stack, status)
                    for (kind, stack, status), (blocks, size) in records.items()
                ),
                key=lambda r: (-r.bytes, r.kind, r.stack),
            )
        ),
        image.pause_seconds,
        image.unreadable_pages,
    )
