"""Mark-and-sweep over a copy of a process's memory, vectorised with numpy.

Every aligned 8-byte word of the copied memory is a possible pointer (a
conservative scan): it references an allocation when its value lies in
[begin, end) of one (interior pointers count, one past the end does not). A word
inside an allocation gives an edge of the heap graph; a word in a root range, or a
register, marks its target directly. Marking then follows edges breadth-first,
one numpy step per level, with an explicit frontier: never recursion.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MemoryRegion:
    base: int  # address of data[0], 8-byte aligned
    data: bytes | bytearray | mmap.mmap
    root_ranges: tuple[tuple[int, int], ...]  # [low, high) parts whose words outside allocations are roots


@dataclass(frozen=True)
class HeapGraph:
    """Allocations (sorted by address) and the references between them."""

    begins: np.ndarray  # uint64
    ends: np.ndarray  # uint64, begin + max(size, 1)
    sources: np.ndarray  # int64: allocation holding the reference
    targets: np.ndarray  # int64: allocation referenced
    rooted: np.ndarray  # bool: referenced from a root or a register
    at_start: np.ndarray  # bool, per reference: it points to its target's first byte
    rooted_at_start: np.ndarray  # bool: a root or register points to its first byte

    def reachable(self, roots: np.ndarray | None = None, edges: np.ndarray | None = None) -> np.ndarray:
        """Which allocations can be reached from the roots (or from these nodes), following every
        reference (or only these)."""
        marked = (self.rooted if roots is None else roots).copy()
        sources, targets = (self.sources, self.targets) if edges is None else (self.sources[edges], self.targets[edges])
        order = np.argsort(sources, kind="stable")
        sources, targets = sources[order], targets[order]
        starts = np.searchsorted(sources, np.arange(len(self.begins) + 1))
        frontier = np.flatnonzero(marked)
        while frontier.size:
            counts = starts[frontier + 1] - starts[frontier]
            # The edge indexes of every frontier node, gathered without a Python loop.
            offsets = np.repeat(starts[frontier] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            reached = np.unique(targets[offsets])
            frontier = reached[~marked[reached]]
            marked[frontier] = True
        return marked


def _owners(addresses: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The allocation each address falls in, or -1."""
    index = np.searchsorted(begins, addresses, side="right").astype(np.int64) - 1
    inside = index >= 0
    inside[inside] = addresses[inside] < ends[index[inside]]
    return np.where(inside, index, -1)


def build_graph(
    begins: np.ndarray, sizes: np.ndarray, regions: list[MemoryRegion], register_values: list[int]
) -> HeapGraph:
    """The graph of references found in regions (begins sorted ascending)."""
    begins = begins.astype(np.uint64)
    ends = begins + np.maximum(sizes.astype(np.uint64), 1)
    rooted = np.zeros(len(begins), dtype=bool)
    rooted_at_start = np.zeros(len(begins), dtype=bool)
    all_sources, all_targets, all_at_start = [], [], []
    if len(begins):
        low, high = begins[0], ends.max()
        for region in regions:
            words = np.frombuffer(region.data, dtype="<u8", count=len(region.data) // 8)
            candidates = np.flatnonzero((words >= low) & (words < high))
            targets = _owners(words[candidates], begins, ends)
            keep = targets >= 0
            candidates, targets = candidates[keep], targets[keep]
            at_start = words[candidates] == begins[targets]
            addresses = np.uint64(region.base) + candidates.astype(np.uint64) * np.uint64(8)
            sources = _owners(addresses, begins, ends)
            inside = sources >= 0
            all_sources.append(sources[inside])
            all_targets.append(targets[inside])
            all_at_start.append(at_start[inside])
            outside = ~inside
            in_roots = np.zeros(len(addresses), dtype=bool)
            for root_low, root_high in region.root_ranges:
                in_roots |= (addresses >= np.uint64(root_low)) & (addresses < np.uint64(root_high))
            rooted[targets[outside & in_roots]] = True
            rooted_at_start[targets[outside & in_roots & at_start]] = True
        values = np.array([v for v in register_values if low <= v < high], dtype=np.uint64)
        held = _owners(values, begins, ends)
        rooted[held[held >= 0]] = True
        rooted_at_start[held[(held >= 0) & (values == begins[np.maximum(held, 0)])]] = True
    return HeapGraph(
        begins,
        ends,
        joined(all_sources, np.int64),
        joined(all_targets, np.int64),
        rooted,
        joined(all_at_start, bool),
        rooted_at_start,
    )


def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """The arrays end to end (an empty one of dtype when there are none)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
