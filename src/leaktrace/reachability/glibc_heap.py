"""The blocks in use in a glibc heap, read from a frozen copy of a process (freeze.py).

glibc keeps no list of the blocks it handed out, but its heap is a chain of chunks
(size and flag bits in each header) that can be walked: the main arena's brk heap
from mp_.sbrk_base to its top chunk, each other arena's 64 MiB-aligned heaps (from
the heap holding its top chunk back through heap_info.prev), and mmapped chunks, one
per mapping (or several where the kernel merged neighbouring mappings). A chunk is
in use when the next one's PREV_INUSE bit says so, unless it sits in a fastbin or a
thread's tcache (those keep the bit set): both lists are read, with glibc's pointer
mangling (safe-linking) undone. Each thread's tcache is found through its TLS block
(fs_base, libc's link_map l_tls_offset); the tcache's own chunk is libc's, not a block.

The layout (offsets below) is glibc 2.35 to 2.40's on x86-64; it was checked against
2.36's debug information (gdb ptype /o). main_arena, mp_ and the TLS offset of tcache
come from libc's symbols, i.e. from its debug file where libc is stripped (Debian's
libc6-dbg); without one, main_arena is found by its shape (a malloc_state in libc's
data whose arena ring closes and whose top chunk lies in [heap]) and tcache's offset
by the pointer to the main thread's tcache chunk in libc's TLS block.

Every inconsistency (a size that runs past its heap, a list that loops or leaves the
heap) stops that part of the walk and is named in HeapWalk.problems: the walk is then
incomplete, never silently wrong.
"""

from __future__ import annotations

import bisect
import re
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from leaktrace.errors import RuntimeFailure
from leaktrace.model.heap import ArenaUse, HeapWalk
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform.arch import HOST
from leaktrace.platform.elf import PT_LOAD, PT_TLS, ElfError, ElfFile
from leaktrace.platform.freeze import FrozenImage
from leaktrace.platform.module_files import GLIBC_NAME, ModuleFiles
from leaktrace.platform.process import Mapping
from leaktrace.reachability.heap_graph import joined

SUPPORTED = ((2, 35), (2, 40))  # glibc versions whose malloc layout is the one below
# struct malloc_state
ARENA_FASTBINS, FASTBINS, ARENA_TOP, ARENA_NEXT, ARENA_SIZE = 16, 10, 96, 2160, 2200
# struct malloc_par (mp_)
MP_N_MMAPS, MP_MMAPPED_MEM, MP_SBRK_BASE = 60, 80, 96
# struct _heap_info
HEAP_AR_PTR, HEAP_PREV, HEAP_SIZE, HEAP_INFO_SIZE = 0, 8, 16, 48
HEAP_MAX = 64 << 20  # 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: heaps are aligned to it
# struct tcache_perthread_struct: uint16_t counts[64], then tcache_entry *entries[64]
TCACHE_BINS, TCACHE_ENTRIES, TCACHE_CHUNK = 64, 128, 0x290
PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA = 1, 2, 4
HEADER = 16  # prev_size and size: the user's block starts after them
FENCEPOST = 16  # the chunk sysmalloc leaves at the end of a heap it outgrew
MAX_ARENAS = 4096  # a ring longer than this is a loop
LINK_MAP_NEXT = 24  # struct link_map: l_addr, l_name, l_ld, l_next (public ABI)
R_DEBUG_MAP = 8  # struct r_debug: r_version, r_map
_VERSION = re.compile(rb"release version (\d+)\.(\d+)")


class HeapWalkRefused(RuntimeFailure):
    """The walk does not apply to this process (not glibc's allocator, an unknown layout)."""


class _Memory:
    """Words of a frozen copy, by address (0 where the copy has none)."""

    def __init__(self, image: FrozenImage):
        self._starts = sorted(image.memory)
        self._views = [memoryview(image.memory[s]).cast("Q") for s in self._starts]
        self._arrays = [np.frombuffer(image.memory[s], dtype="<u8") for s in self._starts]

    def region(self, address: int) -> tuple[int, memoryview, np.ndarray] | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._starts[i] + len(self._views[i]) * 8:
            return self._starts[i], self._views[i], self._arrays[i]
        return None

    def word(self, address: int) -> int:
        found = self.region(address) if address % 8 == 0 else None
        return found[1][(address - found[0]) >> 3] if found else 0

    def words(self, address: int, count: int) -> list[int]:
        found = self.region(address) if address % 8 == 0 else None
        if found is None:
            return [0] * count
        first = (address - found[0]) >> 3
        got = found[1][first : first + count].tolist()
        return got + [0] * (count - len(got))


@dataclass
class _Chunks:
    """Chunks of one arena as the walk met them."""

    used: list[np.ndarray] = field(default_factory=list)  # chunk addresses, in-use bit set
    used_sizes: list[np.ndarray] = field(default_factory=list)
    free_chunks: int = 0
    free_bytes: int = 0
    heaps: int = 0
    top_bytes: int = 0


def _walk_chunks(memory: _Memory, start: int, stop: int, chunks: _Chunks, problems: list[str], what: str) -> None:
    """The chunks from start up to stop (the top chunk, or the end marker of a heap the arena
    outgrew); a chunk's in-use bit is in the next one's header (the last one's in stop's)."""
    found = memory.region(start)
    if found is None or stop > found[0] + len(found[1]) * 8 - HEADER or start % 16:
        problems.append(f"{what}: [{start:#x}, {stop:#x}) is not in the copied memory")
        return
    base, view, words = found
    index, stop_index = (start - base) >> 3, (stop - base) >> 3
    positions: list[int] = []
    append = positions.append
    while index < stop_index:  # only the chain here: the rest is done on arrays
        step = view[index + 1] >> 3
        if step < 2:
            break
        append(index)
        index += step
    chain = np.array(positions, dtype=np.int64)
    sizes = words[chain + 1] & np.uint64(~7 & 0xFFFFFFFFFFFFFFFF)
    misaligned = np.flatnonzero(sizes & np.uint64(15))
    damaged = None
    if len(misaligned):
        damaged, chain, sizes = int(chain[misaligned[0]]), chain[: misaligned[0]], sizes[: misaligned[0]]
    elif index < stop_index:
        damaged = index
    elif index > stop_index:
        damaged, chain, sizes = int(chain[-1]), chain[:-1], sizes[:-1]
    if damaged is None:
        following = np.append(chain[1:], stop_index)
    else:
        problems.append(
            f"{what}: the chunk at {base + damaged * 8:#x} has size {view[damaged + 1] & ~7:#x}, which "
            f"runs past {stop:#x}: the rest of this heap was not walked"
        )
        following, chain, sizes = chain[1:], chain[:-1], sizes[:-1]  # the last one's bit is in a damaged header
    in_use = (words[following + 1] & np.uint64(PREV_INUSE)).astype(bool)
    real = sizes != FENCEPOST
    used, free = in_use & real, ~in_use & real
    chunks.used.append(np.uint64(base) + chain[used].astype(np.uint64) * np.uint64(8))
    chunks.used_sizes.append(sizes[used])
    chunks.free_chunks += int(free.sum())
    chunks.free_bytes += int(sizes[free].sum())


class _ChunkIndex:
    """The in-use chunks found, searchable by address."""

    def __init__(self, addresses: np.ndarray, sizes: np.ndarray):
        order = np.argsort(addresses, kind="stable")
        self.addresses, self.sizes = addresses[order], sizes[order]

    def size_of(self, chunk: int) -> int:
        """Its size; 0 if no in-use chunk starts there."""
        if not 0 < chunk < 1 << 64:
            return 0
        i = int(np.searchsorted(self.addresses, np.uint64(chunk)))
        return int(self.sizes[i]) if i < len(self.addresses) and int(self.addresses[i]) == chunk else 0


@dataclass
class _Libc:
    elf: ElfFile
    bias: int
    symbols: dict[str, int]  # main_arena, mp_, tcache (TLS offset): from the debug file
    tls_offset: int | None  # libc's l_tls_offset: its TLS block is at fs_base - this
    tls_size: int


def _version(libc: ElfFile) -> tuple[int, int]:
    found = libc.read_file_bytes(_VERSION.pattern)
    match = _VERSION.match(found) if found else None
    if match is None:
        raise HeapWalkRefused(f"{libc.path} names no glibc version: the heap walk is glibc's")
    return int(match.group(1)), int(match.group(2))


def _load_bias(elf: ElfFile, first_mapping: Mapping) -> int:
    """Address less link-time address, from the mapping of the file's start."""
    return first_mapping.start - (min((s.vaddr for s in elf.segments if s.type == PT_LOAD), default=0) & ~0xFFF)


def _libc_tls_offset(
    memory: _Memory, maps: list[Mapping], libc: ElfFile, bias: int, modules: ModuleFiles, process: ProcessInfo
) -> int | None:
    """libc's l_tls_offset, from its link_map (found through the loader's _r_debug); where in
    struct link_map it sits, libc says itself (the _thread_db descriptor libthread_db reads)."""
    descriptor = libc.variables.get("_thread_db_link_map_l_tls_offset")
    loader_maps = [m for m in maps if re.search(r"/ld-[^/]*\.so[.\d]*$", m.path) and m.offset == 0]
    if descriptor is None or not loader_maps:
        return None
    _, _, field_offset = struct.unpack("<III", libc.read(descriptor, 12))
    loader = modules.open(process, loader_maps[:1])[loader_maps[0].start]
    if loader is None or "_r_debug" not in loader.variables:
        return None
    loader_bias = _load_bias(loader, loader_maps[0])
    link_map = memory.word(loader_bias + loader.variables["_r_debug"] + R_DEBUG_MAP)
    for _ in range(MAX_ARENAS):
        if not link_map:
            return None
        if memory.word(link_map) == bias:
            return memory.word(link_map + field_offset)
        link_map = memory.word(link_map + LINK_MAP_NEXT)
    return None


def _libc_file(process: ProcessInfo, maps: list[Mapping], modules: ModuleFiles) -> tuple[ElfFile, Mapping]:
    """The process's libc, opened, and the mapping of its start; HeapWalkRefused when there is none."""
    libcs = [m for m in maps if GLIBC_NAME.search(m.path) and m.offset == 0]
    if not libcs:
        raise HeapWalkRefused(f"pid {process.pid} maps no glibc (statically linked?): the heap walk is glibc's")
    elf = modules.open(process, libcs[:1])[libcs[0].start]
    if elf is None:
        raise HeapWalkRefused(f"cannot read pid {process.pid}'s libc {libcs[0].path}")
    return elf, libcs[0]


def _open_libc(process: ProcessInfo, maps: list[Mapping], memory: _Memory, modules: ModuleFiles) -> _Libc:
    elf, first = _libc_file(process, maps, modules)
    version = _version(elf)
    if not SUPPORTED[0] <= version <= SUPPORTED[1]:
        raise HeapWalkRefused(
            f"the heap walk knows the malloc layout of glibc {SUPPORTED[0][0]}.{SUPPORTED[0][1]} "
            f"to {SUPPORTED[1][0]}.{SUPPORTED[1][1]}; pid {process.pid} has glibc "
            f"{version[0]}.{version[1]}"
        )
    bias = _load_bias(elf, first)
    debug = modules.debug_file(process, elf)
    wanted = ("main_arena", "mp_", "tcache")
    symbols = {name: elf.variables[name] for name in wanted if name in elf.variables}
    if debug is not None:
        try:
            symbols.update((name, debug.variables[name]) for name in wanted if name in debug.variables)
        except ElfError:
            pass
    tls = next((s for s in elf.segments if s.type == PT_TLS), None)
    return _Libc(
        elf, bias, symbols, _libc_tls_offset(memory, maps, elf, bias, modules, process), tls.memsz if tls else 0
    )


def _arena_by_shape(memory: _Memory, maps: list[Mapping], libc: _Libc) -> int | None:
    """main_arena without symbols: the malloc_state in libc's writable data whose ring of
    arenas closes on itself and whose top chunk lies in [heap]."""
    heap = next((m for m in maps if m.path == "[heap]"), None)
    if heap is None:
        return None
    data = [m for m in maps if m.path == libc.elf.path and "w" in m.perms]
    if data:  # .bss runs on in the anonymous mapping right after
        data += [m for m in maps if m.start == data[-1].end and not m.path]
    for mapping in data:
        found = memory.region(mapping.start)
        if found is None:
            continue
        base, view, _ = found
        for index in range((mapping.start - base) >> 3, ((mapping.end - base) >> 3) - ARENA_SIZE // 8, 2):
            if not heap.start <= view[index + ARENA_TOP // 8] < heap.end:
                continue
            candidate = base + index * 8
            arena = view[index + ARENA_NEXT // 8]
            for _ in range(MAX_ARENAS):
                if arena in (0, candidate):
                    break
                arena = memory.word(arena + ARENA_NEXT)
            if arena == candidate:
                return candidate
    return None


def _tcache_offset_by_shape(memory: _Memory, libc: _Libc, main_fs_base: int, chunks: _ChunkIndex) -> int | None:
    """tcache's offset in libc's TLS block without symbols: the word of the main thread's
    block that points into an in-use chunk of the tcache's size."""
    block = main_fs_base - (libc.tls_offset or 0)
    for offset in range(0, libc.tls_size, 8):
        if chunks.size_of(memory.word(block + offset) - HEADER) == TCACHE_CHUNK:
            return offset
    return None


def _follow_list(
    memory: _Memory,
    first: int,
    limit: int,
    chunks: _ChunkIndex,
    problems: list[str],
    what: str,
    links_to_user_data: bool,
) -> list[int]:
    """Chunks of a singly linked free list: a fastbin (links to chunks) or a tcache bin (links
    to user data); each link is in the chunk's first user word, mangled by safe-linking."""
    found: list[int] = []
    chunk = first
    while chunk:
        if not chunks.size_of(chunk) or len(found) >= limit:
            problems.append(f"{what}: the list leaves the heap or runs on at {chunk:#x}; the rest was not read")
            break
        found.append(chunk)
        slot = chunk + HEADER
        following = memory.word(slot) ^ (slot >> 12)
        chunk = following - HEADER if following and links_to_user_data else following
    return found


def _heap_mappings(maps: list[Mapping], address: int) -> Mapping | None:
    return next((m for m in maps if m.start <= address < m.end), None)


def _mmapped_chunks(
    memory: _Memory, maps: list[Mapping], skip: list[tuple[int, int]], page: int, found: list[tuple[int, int]]
) -> None:
    """Chunks at page starts of anonymous writable mappings (the kernel merges a chunk's mapping
    with its neighbours): prev_size 0, the IS_MMAPPED flag alone, a size of whole pages that
    ends inside the mapping; page starts inside a chunk already found are its data."""
    for mapping in maps:
        if mapping.path or any(low < mapping.end and mapping.start < high for low, high in skip):
            continue
        region = memory.region(mapping.start)
        if region is None or (mapping.end - mapping.start) % page:
            continue
        base, _, words = region
        pages = words[(mapping.start - base) >> 3 : (mapping.end - base) >> 3].reshape(-1, page // 8)
        prev_sizes, size_fields = pages[:, 0], pages[:, 1]
        sizes = size_fields & np.uint64(~7 & 0xFFFFFFFFFFFFFFFF)
        headers = np.flatnonzero(
            (prev_sizes == 0)
            & (size_fields & np.uint64(7) == IS_MMAPPED)
            & (sizes > 0)
            & (sizes % np.uint64(page) == 0)
        )
        taken_to = 0
        for index, size in zip(headers.tolist(), sizes[headers].tolist()):
            at = mapping.start + index * page
            if at >= taken_to and at + size <= mapping.end:
                found.append((at, size))
                taken_to = at + size


def _main_arena(process: ProcessInfo, memory: _Memory, maps: list[Mapping], libc: _Libc) -> tuple[int, str]:
    """main_arena's address, and how it was found; HeapWalkRefused when it is not."""
    if "main_arena" in libc.symbols:
        return libc.bias + libc.symbols["main_arena"], "main_arena from libc's symbols"
    found = _arena_by_shape(memory, maps, libc)
    if found is None:
        raise HeapWalkRefused(
            f"pid {process.pid}'s main_arena was not found (no [heap], or no symbols and no "
            "malloc_state of the expected shape in libc's data)"
        )
    return found, "main_arena found by its shape (libc has no symbols for it: install its debug file)"


EXIT_SCAN_LIMIT = 1 << 20  # bytes of a thread's stack searched for exit's frame


def exit_callers(process: ProcessInfo, image: FrozenImage) -> dict[int, int]:
    """For a thread inside exit (its destructors, or _exit after them): its stack pointer ->
    where the frame that called exit begins. What lies below is exit's own machinery, whose
    frames reuse the stack where the program's allocator calls ran and so keep copies of the
    addresses those returned (valgrind's allocator runs on a stack of its own: it sees none).
    exit's frame is the return address into exit, then at most its own padding, then the
    return address into its caller: the first word above that points into code."""
    try:
        elf, first = _libc_file(process, image.maps, ModuleFiles())
    except HeapWalkRefused:
        return {}
    start = elf.dynamic_functions.get("exit")
    symbol = elf.function_at(start) if start is not None else None
    if symbol is None:
        return {}
    bias = _load_bias(elf, first)
    low, high = bias + symbol.value, bias + symbol.value + symbol.size
    code = [(m.start, m.end) for m in image.maps if "x" in m.perms]
    memory = _Memory(image)
    found = {}
    for regs in image.registers.values():
        sp = regs[HOST.registers.sp]
        region = memory.region(sp) if sp % 8 == 0 else None
        if region is None:
            continue
        words = region[2][(sp - region[0]) >> 3 :][: EXIT_SCAN_LIMIT // 8]
        into_exit = np.flatnonzero((words > low) & (words <= high))
        if not len(into_exit):
            continue
        above = words[into_exit[0] + 1 :].tolist()
        caller = next((i for i, word in enumerate(above) if any(s <= word < e for s, e in code)), None)
        if caller is not None:
            found[sp] = sp + 8 * (int(into_exit[0]) + caller + 2)
    return found


def allocator_state(process: ProcessInfo, image: FrozenImage) -> tuple[tuple[int, int], ...]:
    """The glibc allocator's own state in libc's data (main_arena), which is never a root: its
    top chunk pointer lies inside the last block made; none where it is not found."""
    memory = _Memory(image)
    try:
        main_arena, _ = _main_arena(process, memory, image.maps, _open_libc(process, image.maps, memory, ModuleFiles()))
    except HeapWalkRefused:
        return ()
    return ((main_arena, main_arena + ARENA_SIZE),)


def _arena_ring(memory: _Memory, main_arena: int, problems: list[str]) -> list[int]:
    """The arenas, from main_arena along their ring."""
    arenas = [main_arena]
    while len(arenas) <= MAX_ARENAS:
        following = memory.word(arenas[-1] + ARENA_NEXT)
        if following in (0, main_arena) or following in arenas:
            break
        arenas.append(following)
    if memory.word(arenas[-1] + ARENA_NEXT) != main_arena:
        problems.append(f"the ring of arenas does not close at {arenas[-1]:#x}: arenas after it were not walked")
    return arenas


def _walk_arena(
    memory: _Memory,
    maps: list[Mapping],
    arena: int,
    main: bool,
    sbrk_base: int | None,
    heap_ranges: list[tuple[int, int]],
    problems: list[str],
) -> _Chunks:
    """The chunks of one arena's heaps (main_arena's brk heap, from sbrk_base where mp_ gives
    it; a list of HEAP_MAX heaps for the others); adds each heap's range to heap_ranges."""
    chunks = _Chunks()
    top = memory.word(arena + ARENA_TOP)
    chunks.top_bytes = memory.word(top + 8) & ~7
    if memory.word(arena) & 0xFFFFFFFF:
        problems.append(
            f"arena {arena:#x} was locked when the process stopped (a thread inside malloc): "
            "its lists may have been half-changed"
        )
    if main:
        heap = _heap_mappings(maps, top)
        base = sbrk_base if sbrk_base is not None else (heap.start if heap else 0)
        start = (base + 15) & ~15
        if heap is None or not heap.start <= start <= top:
            problems.append(f"the main arena's top chunk {top:#x} is not in its brk heap: it was not walked")
            return chunks
        chunks.heaps = 1
        heap_ranges.append((heap.start, heap.end))
        _walk_chunks(memory, start, top, chunks, problems, "main arena")
        return chunks
    heap_info, seen = top & ~(HEAP_MAX - 1), 0
    while heap_info and seen < MAX_ARENAS:
        ar_ptr, prev, size = memory.words(heap_info, 3)
        if ar_ptr != arena or not HEAP_INFO_SIZE < size <= HEAP_MAX:
            problems.append(
                f"arena {arena:#x}: heap {heap_info:#x} does not belong to it; its older heaps were not walked"
            )
            break
        first = ((arena + ARENA_SIZE + 15) & ~15) if not prev else heap_info + HEAP_INFO_SIZE
        stop = top if seen == 0 else heap_info + size - HEADER
        heap_ranges.append((heap_info, heap_info + HEAP_MAX))
        if seen and memory.word(stop + 8) & ~7:
            problems.append(f"arena {arena:#x}: heap {heap_info:#x} lacks its end marker; it was not walked")
        else:
            _walk_chunks(memory, first, stop, chunks, problems, f"arena {arena:#x} heap {heap_info:#x}")
        chunks.heaps += 1
        heap_info, seen = prev, seen + 1
    return chunks


def _fastbin_chunks(
    memory: _Memory, arenas: list[int], in_use_chunks: _ChunkIndex, limit: int, problems: list[str]
) -> set[int]:
    """The chunks in the arenas' fastbins: free, though their in-use bit stays set."""
    free: set[int] = set()
    for arena in arenas:
        for bin_index, first in enumerate(memory.words(arena + ARENA_FASTBINS, FASTBINS)):
            where = f"arena {arena:#x} fastbin {bin_index}"
            free.update(_follow_list(memory, first, limit, in_use_chunks, problems, where, links_to_user_data=False))
    return free


def _tcache_chunks(
    process: ProcessInfo,
    image: FrozenImage,
    memory: _Memory,
    libc: _Libc,
    in_use_chunks: _ChunkIndex,
    problems: list[str],
) -> tuple[set[int], set[int], str]:
    """The chunks in every thread's tcache (free, their in-use bit set), the tcaches' own chunks
    (libc's), and how the tcaches were found, in words."""
    free: set[int] = set()
    libc_chunks: set[int] = set()
    tcache_offset = libc.symbols.get("tcache")
    how = "tcaches through each thread's TLS"
    thread_pointer = HOST.registers.thread_pointer or 0  # among the words on x86-64, the one machine it runs on
    fs_bases = {tid: regs[thread_pointer] for tid, regs in image.registers.items()}
    if libc.tls_offset is None:
        problems.append("libc's TLS block was not found (no link_map for it): tcaches were not read")
        return free, libc_chunks, how
    if tcache_offset is None and process.pid in fs_bases:
        tcache_offset = _tcache_offset_by_shape(memory, libc, fs_bases[process.pid], in_use_chunks)
        how = "tcaches through each thread's TLS (offset found by shape)"
    if tcache_offset is None:
        problems.append("tcache's place in libc's TLS block is unknown: tcaches were not read")
        return free, libc_chunks, how
    for tid, fs_base in sorted(fs_bases.items()):
        tcache = memory.word(fs_base - libc.tls_offset + tcache_offset)
        if not tcache:
            continue
        if not in_use_chunks.size_of(tcache - HEADER):
            problems.append(f"thread {tid}'s tcache {tcache:#x} is not an in-use chunk: it was not read")
            continue
        libc_chunks.add(tcache - HEADER)
        fields = memory.words(tcache, (TCACHE_ENTRIES + 8 * TCACHE_BINS) // 8)
        counts = struct.unpack(f"<{TCACHE_BINS}H", struct.pack(f"<{TCACHE_BINS // 4}Q", *fields[:16]))
        for index, (count, entry) in enumerate(zip(counts, fields[16:])):
            reported = len(problems)
            where = f"thread {tid}'s tcache bin {index}"
            first = entry - HEADER if entry else 0
            chain = _follow_list(memory, first, count, in_use_chunks, problems, where, links_to_user_data=True)
            if len(chain) < count and len(problems) == reported:
                problems.append(f"{where} holds {len(chain)} chunks, not {count}")
            free.update(chain)
    return free, libc_chunks, how


def _arena_summary(arena: int, main: bool, chunks: _Chunks, not_blocks: np.ndarray, freed: np.ndarray) -> ArenaUse:
    own, own_sizes = chunks.used[0], chunks.used_sizes[0]
    in_use, in_bins = ~np.isin(own, not_blocks), np.isin(own, freed)
    return ArenaUse(
        arena,
        main,
        chunks.heaps,
        int(in_use.sum()),
        int((own_sizes[in_use] - np.uint64(8)).sum()),
        chunks.free_chunks + int(in_bins.sum()),
        chunks.free_bytes + int(own_sizes[in_bins].sum()),
        chunks.top_bytes,
    )


def walk_heap(
    process: ProcessInfo, image: FrozenImage, modules: ModuleFiles | None = None, use_debug_file: bool = True
) -> HeapWalk:
    """The blocks in use in pid's glibc heap, from a frozen copy of its writable memory;
    raises HeapWalkRefused when the walk does not apply."""
    started = time.monotonic()
    modules = modules or ModuleFiles()
    memory = _Memory(image)
    maps = image.maps
    libc = _open_libc(process, maps, memory, modules)
    if not use_debug_file:
        libc.symbols = {}
    version = ".".join(map(str, _version(libc.elf)))
    problems: list[str] = []
    main_arena, how = _main_arena(process, memory, maps, libc)
    mp = libc.bias + libc.symbols["mp_"] if "mp_" in libc.symbols else None
    if not memory.word(main_arena + ARENA_NEXT) or not memory.word(main_arena + ARENA_TOP):
        raise HeapWalkRefused(f"pid {process.pid} has not set up glibc's malloc yet (or main_arena was misread)")

    arenas = _arena_ring(memory, main_arena, problems)
    heap_ranges: list[tuple[int, int]] = []
    sbrk_base = memory.word(mp + MP_SBRK_BASE) if mp else None
    per_arena = [
        _walk_arena(memory, maps, arena, arena == main_arena, sbrk_base, heap_ranges, problems) for arena in arenas
    ]
    for chunks in per_arena:
        chunks.used, chunks.used_sizes = [joined(chunks.used, np.uint64)], [joined(chunks.used_sizes, np.uint64)]
    used = joined([chunks.used[0] for chunks in per_arena], np.uint64)
    sizes = joined([chunks.used_sizes[0] for chunks in per_arena], np.uint64)
    in_use_chunks = _ChunkIndex(used, sizes)

    # Free chunks that keep their in-use bit: fastbins (per arena) and tcaches (per thread).
    free = _fastbin_chunks(memory, arenas, in_use_chunks, len(used), problems)
    in_tcaches, libc_chunks, how_tcache = _tcache_chunks(process, image, memory, libc, in_use_chunks, problems)
    free |= in_tcaches

    mmapped_chunks: list[tuple[int, int]] = []
    stacks = [
        (m.start, m.end)
        for m in maps
        for regs in image.registers.values()
        if m.start <= regs[HOST.registers.sp] < m.end
    ]
    _mmapped_chunks(memory, maps, heap_ranges + stacks, 4096, mmapped_chunks)
    if mp is not None:
        count, mapped = memory.word(mp + MP_N_MMAPS - 4) >> 32, memory.word(mp + MP_MMAPPED_MEM)
        if count != len(mmapped_chunks) or mapped != sum(size for _, size in mmapped_chunks):
            problems.append(
                f"glibc counts {count} mmapped chunks ({mapped} bytes); the walk found "
                f"{len(mmapped_chunks)} ({sum(size for _, size in mmapped_chunks)} bytes)"
            )
    else:
        how += "; mmapped chunks not checked against glibc's count (no symbol for mp_)"

    not_blocks = np.array(sorted(free | libc_chunks), dtype=np.uint64)
    freed = np.array(sorted(free), dtype=np.uint64)
    keep = ~np.isin(used, not_blocks)
    summaries = [
        _arena_summary(arena, arena == main_arena, chunks, not_blocks, freed)
        for arena, chunks in zip(arenas, per_arena)
    ]
    mapped_at = np.array([at for at, _ in mmapped_chunks], dtype=np.uint64)
    mapped_sizes = np.array([size for _, size in mmapped_chunks], dtype=np.uint64)
    addresses = np.concatenate([used[keep], mapped_at]) + np.uint64(HEADER)
    usable = np.concatenate([sizes[keep] - np.uint64(8), mapped_sizes - np.uint64(HEADER)])
    mmapped = np.concatenate([np.zeros(int(keep.sum()), dtype=bool), np.ones(len(mapped_at), dtype=bool)])
    order = np.argsort(addresses, kind="stable")
    return HeapWalk(
        version,
        f"{how}; {how_tcache}",
        addresses[order],
        usable[order],
        mmapped[order],
        tuple(summaries),
        len(libc_chunks),
        tuple(problems),
        time.monotonic() - started,
        ((main_arena, main_arena + ARENA_SIZE),),
    )
