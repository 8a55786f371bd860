"""The sweep and the leak folding on synthetic memory: libmemunreachable's
HeapWalker and LeakFolding test vectors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from leaktrace.reachability.heap_graph import MemoryRegion, build_graph
from leaktrace.reachability.leak_folding import fold_leaks

HEAP = 0x10000


def words(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def sweep(sizes: list[int], contents: dict[int, bytes], roots: bytes = b"", registers=()) -> list[bool]:
    """Allocations laid out from HEAP, 0x100 apart, with contents; roots in a region of their own."""
    begins = np.array([HEAP + 0x100 * i for i in range(len(sizes))], dtype=np.uint64)
    heap = bytearray(0x100 * len(sizes))
    for index, data in contents.items():
        heap[0x100 * index : 0x100 * index + len(data)] = data
    regions = [MemoryRegion(HEAP, bytes(heap), ())]
    if roots:
        regions.append(MemoryRegion(0x1000, roots, ((0x1000, 0x1000 + len(roots)),)))
    graph = build_graph(begins, np.array(sizes, dtype=np.uint64), regions, list(registers))
    return graph.reachable().tolist()


def test_unreferenced_allocation_leaks():
    assert sweep([16], {}) == [False]


@pytest.mark.parametrize("offset", range(16))
def test_interior_pointers_count_and_one_past_the_end_does_not(offset):
    assert sweep([16], {}, roots=words(HEAP + offset)) == [True]
    assert sweep([16], {}, roots=words(HEAP + 16)) == [False]


def test_zero_size_allocation_is_one_byte():
    assert sweep([0], {}, roots=words(HEAP)) == [True]
    assert sweep([0], {}, roots=words(HEAP + 1)) == [False]


def test_cycle_without_roots_leaks_and_chains_are_followed():
    assert sweep([16, 16], {0: words(HEAP + 0x100), 1: words(HEAP)}) == [False, False]
    chain = {0: words(HEAP + 0x100), 1: words(HEAP + 0x200)}
    assert sweep([16, 16, 16], chain, roots=words(HEAP)) == [True, True, True]
    assert sweep([16, 16, 16], chain, registers=[HEAP + 0x108]) == [False, True, True]


def test_heap_words_outside_allocations_are_not_roots():
    begins = np.array([HEAP, HEAP + 0x100], dtype=np.uint64)
    heap = bytearray(0x200)
    heap[0x80:0x88] = words(HEAP + 0x100)  # between the two allocations: allocator metadata
    graph = build_graph(begins, np.array([16, 16], dtype=np.uint64), [MemoryRegion(HEAP, bytes(heap), ())], [])
    assert graph.reachable().tolist() == [False, False]
    rooted = build_graph(
        begins, np.array([16, 16], dtype=np.uint64), [MemoryRegion(HEAP, bytes(heap), ((HEAP, HEAP + 0x200),))], []
    )
    assert rooted.reachable().tolist() == [False, True]


def fold(count: int, edges: list[tuple[int, int]], sizes: dict[int, int] | None = None) -> list[tuple]:
    nodes = list(range(1, count + 1))
    found = fold_leaks(nodes, sizes or {n: 8 for n in nodes}, edges)
    return [(leak.node, leak.referenced_count, leak.referenced_size) for leak in found]


def test_leak_folding_vectors():
    assert fold(1, []) == [(1, 0, 0)]
    assert fold(2, []) == [(1, 0, 0), (2, 0, 0)]
    assert fold(2, [(1, 2)]) == [(1, 1, 8)]  # dominator
    assert fold(3, [(1, 2), (2, 3), (3, 2)]) == [(1, 2, 16)]  # cycle
    assert fold(3, [(1, 2), (2, 1), (2, 3)], {1: 16, 2: 16, 3: 8}) == [(1, 2, 24), (2, 2, 24)]
    assert fold(6, [(1, 3), (3, 4), (4, 3), (2, 5), (5, 6), (6, 5)]) == [(1, 2, 16), (2, 2, 16)]
    assert fold(4, [(1, 2), (2, 1), (3, 4), (4, 3)]) == [(n, 1, 8) for n in range(1, 5)]
    ring = [(n, n % 1000 + 1) for n in range(1, 1001)]
    assert fold(1000, ring) == [(n, 999, 7992) for n in range(1, 1001)]  # giant dominator cycle
    assert fold(1001, ring + [(1001, 1)]) == [(1001, 1000, 8000)]  # giant cycle with a head
    assert fold(4, [(1, 2), (1, 3), (2, 4), (3, 4)]) == [(1, 3, 24)]  # multipath: counted once
    assert fold(4, [(1, 2), (2, 3), (3, 1), (2, 4), (4, 3)], {n: 16 for n in range(1, 5)}) == [
        (n, 3, 48) for n in range(1, 5)
    ]  # multicycle
