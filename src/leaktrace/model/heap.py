"""What a walk of a glibc heap found (reachability/glibc_heap.py), and `leaktrace heap`'s report: plain data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leaktrace.model.snapshot import ProcessInfo, UnreachableReport


@dataclass(frozen=True)
class ArenaUse:
    address: int
    main: bool
    heaps: int
    blocks: int  # in use
    block_bytes: int  # usable bytes of those
    free_chunks: int  # in bins, fastbins or tcaches
    free_bytes: int
    top_bytes: int  # the top chunk: room never handed out


@dataclass(frozen=True)
class HeapWalk:
    """Every block in use in the heap when the process stood still."""

    glibc: str  # "2.36"
    method: str  # how main_arena and the tcaches were found, in words
    addresses: np.ndarray  # uint64, ascending: what malloc returned
    usable: np.ndarray  # uint64: malloc_usable_size of each (the request is not kept by glibc)
    mmapped: np.ndarray  # bool: an mmapped chunk
    arenas: tuple[ArenaUse, ...]
    libc_blocks: int  # the tcaches' own chunks: libc's, left out of the blocks
    problems: tuple[str, ...]  # each one stopped part of the walk (or made it doubtful)
    walk_seconds: float
    # main_arena's malloc_state: its top and bin pointers aim at chunk headers, which overlap the
    # last 8 usable bytes of the block before, so they are never roots of a reachability check.
    allocator_state: tuple[tuple[int, int], ...] = ()

    @property
    def complete(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class HeapReport:
    """A process's heap as one walk found it, with no probe attached."""

    process: ProcessInfo
    walk: HeapWalk
    pause_seconds: float  # how long the process stood still
    unreachable: UnreachableReport | None  # when asked for: every block judged, none with a stack
