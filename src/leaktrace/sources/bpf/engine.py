"""The BPF engine: compiles leaktrace.bpf.c with bcc, attaches it, reads its maps."""

from __future__ import annotations

import contextlib
import ctypes as ct
import dataclasses
import errno
import os
import re
import struct
import time
from collections import Counter as Tally
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from bcc.libbcc import lib

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import AllocationGroup, Counters, LiveAllocation, ProcessInfo, StackStatus
from leaktrace.platform.arch import ARGUMENT_REGISTERS
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.module_files import ModuleFiles
from leaktrace.platform.process import Mapping, parse_maps, printable, read_process
from leaktrace.sources.bpf.compile import EngineSettings, bcc_output, claim_or_start_compile
from leaktrace.sources.bpf.layout import (  # shared with leaktrace.bpf.c: generated from layout.h
    COUNTER_FIELDS,
    CTL_COPIES_DONE,
    CTL_EXIT_STOP,
    CTL_FORKS,
    CTL_NEXT_GEN,
    CTL_TABLES_GEN,
    CTL_TABLES_STOP,
    CTL_TARGET_GEN,
    CTL_TEXT_AFTER_FREE,
    CTL_TEXT_BEFORE_FREE,
    EXEC_MAP,
    F_ALIGNED_ALLOC,
    F_CALLOC,
    F_MALLOC,
    F_POSIX_MEMALIGN,
    F_PVALLOC,
    F_REALLOC,
    F_REALLOCARRAY,
    F_VALLOC,
    IGNORED_UNSELECTED,
    LIVE_KEY,
    LIVE_VAL,
    MAX_EXEC_MAPS,
    NO_TABLES_STOP,
    PROC,
    SITE_KEY,
    STACK_LOST,
    STACK_NONE,
)
from leaktrace.sources.bpf.links import attach_uprobes, reference_counter_conflicts
from leaktrace.sources.bpf.maps import delete_keys, dump_map, gc_paused, update_array
from leaktrace.sources.bpf.unwind_tables import FileTable, TableCache, UnwindTables

if TYPE_CHECKING:
    from leaktrace.sources.bpf.probe_placement import Placement

BPF_NOEXIST = 1
MAX_PARSED_PROCS = 65536  # procs records kept parsed (by their bytes)

RDI, RSI, RDX = ARGUMENT_REGISTERS
# Allocating function -> (its cookie on alloc_enter's probes, enum function in the BPF
# source; argument registers the program reads). Each also gets a return probe.
PROBES = {
    "malloc": (F_MALLOC, (RDI,)),
    "calloc": (F_CALLOC, (RDI, RSI)),
    "realloc": (F_REALLOC, (RDI, RSI)),
    "reallocarray": (F_REALLOCARRAY, (RDI, RSI, RDX)),
    "posix_memalign": (F_POSIX_MEMALIGN, (RDI, RDX)),
    "aligned_alloc": (F_ALIGNED_ALLOC, (RSI,)),
    "memalign": (F_ALIGNED_ALLOC, (RSI,)),
    "valloc": (F_VALLOC, (RDI,)),
    "pvalloc": (F_PVALLOC, (RDI,)),
}
FREE_ARGUMENTS = (RDI,)


def _why_refused(error: OSError, library: ElfFile, offsets: list[int]) -> str:
    """Why the kernel refused a uprobe_multi link, as far as can be known."""
    if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
        return error.strerror
    if tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2]) < (6, 6):
        return f"{error.strerror} (uprobe_multi links need Linux 6.6 or later)"
    conflicts = reference_counter_conflicts(os.stat(library.descriptor).st_ino, offsets)
    if not conflicts:
        return error.strerror
    offset, counter = min(conflicts.items())
    symbol = library.function_at(library.file_offset_to_vaddr(offset) or 0)
    where = f"{symbol.name if symbol else 'the function'} (file offset {offset:#x})"
    return (
        f"another tool's uprobe is on {where} with reference counter {counter:#x} (ours: 0), and the "
        f"kernel refuses a second reference counter on one instruction; stop that tool and run leaktrace "
        f"again (bcc 0.26's Python attach_uprobe passes an uninitialised one: bcc issue 5236)"
    )


class TracedProcess(NamedTuple):
    """A process the kernel side knows, as its `procs` record says."""

    gen: int  # current image generation
    exited: bool
    ignored: int  # 0: traced; 1: outside the selection (until it execs); 2: leaktrace's own
    parent: int  # tgid it was forked from, 0 when not followed from a fork
    execed: bool  # exec'd since it was first seen
    comm: str  # as of its fork, exec or first allocator call
    uid: int

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


@dataclass(frozen=True)
class AttachedProbe:
    library: str
    function: str
    address: int  # the function's entry (link-time address)
    placement: Placement  # where its probes went, and why
    aliases: tuple[str, ...] = ()


def place_probes(elf: ElfFile, functions: dict[str, int]) -> dict[str, Placement]:
    """Where each allocator function's probe goes in a library, free's included."""
    # Imported here: capstone's 25 ms then overlap the compile (see BpfEngine.start).
    from leaktrace.sources.bpf.probe_placement import place_probe

    placements = {
        function: place_probe(elf, function, functions[function], arguments)
        for function, (_, arguments) in PROBES.items()
        if function in functions
    }
    placements["free"] = place_probe(elf, "free", functions["free"], FREE_ARGUMENTS)
    return placements


def file_offsets(elf: ElfFile, addresses: list[int]) -> list[int]:
    """The file offsets uprobes are placed by, of link-time addresses of elf's code."""
    try:
        return [elf.vaddr_to_file_offset(address) for address in addresses]
    except ElfError as e:
        raise RuntimeFailure(f"cannot place uprobes: {e}") from None


class BpfEngine:
    """One compiled BPF program tracing one process and, with -f, its children; or, with
    target 0, every process that calls into the libraries (each from its first call)."""

    def __init__(
        self,
        settings: EngineSettings,
        target: int,
        libraries: tuple[ElfFile, ...],
        arm_on_exec: bool = False,
        stop_library: str | None = None,
        loader: str | None = None,
    ):
        if not target:
            settings = dataclasses.replace(settings, follow_forks=True)
        self.settings = settings
        self.target = target
        self.libraries = libraries
        self.arm_on_exec = arm_on_exec
        self.stop_library = stop_library  # library with _exit, to stop the target there
        self.loader = loader  # -c: the command's ld.so, whose _dl_debug_state says modules changed
        self.probes: list[AttachedProbe] = []
        self._bpf: Any = None  # bcc's BPF, once the compile is taken
        self._programs: dict[bytes, int] = {}  # program name -> fd
        self._links: list[int] = []  # uprobe_multi link fds
        self._text_around_free = (0, 0)
        self._stack_cache: dict[int, tuple[int, ...]] = {}
        self._tables = UnwindTables(TableCache(settings.table_cache) if settings.table_cache else None)
        # A file's packed rows -> (first row, row count, first page, page count) in the kernel's tables.
        self._uploaded: dict[bytes, tuple[int, int, int, int]] = {}
        self._next_row = self._next_page = 0
        self._exec_maps: dict[int, tuple[int, str]] = {}  # pid -> (generation, executable lines) loaded
        self._modules = ModuleFiles()
        self._parsed_procs: dict[bytes, TracedProcess] = {}

    @property
    def library_paths(self) -> list[str]:
        return [library.path for library in self.libraries]

    def _link(
        self, program: bytes, library: ElfFile, offsets: list[int], cookies: list[int], returns: bool = False
    ) -> None:
        # Children are only seen by probes that fire in every process (pid 0).
        pid = 0 if self.settings.follow_forks else self.target
        try:  # by descriptor: the very file that was read (a target's, with its rights)
            self._links.append(
                attach_uprobes(self._programs[program], library.descriptor, offsets, cookies, pid, returns)
            )
        except OSError as e:
            if self.target and not os.path.exists(f"/proc/{self.target}"):
                raise RuntimeFailure(f"pid {self.target} exited before the probes were attached") from None
            raise RuntimeFailure(
                f"cannot attach uprobes to {library.path}: {_why_refused(e, library, offsets)}"
            ) from None

    def _placements(self, elf: ElfFile) -> tuple[dict[str, int], dict[str, Placement]]:
        """The library's allocator functions (name -> entry) and where each one's probe goes."""
        try:
            functions = elf.dynamic_functions
        except ElfError as e:
            raise RuntimeFailure(f"cannot read allocator library: {e}") from None
        if "malloc" not in functions or "free" not in functions:
            raise RuntimeFailure(f"{elf.path} does not export malloc and free")
        placements = place_probes(elf, functions)
        free_probe = placements["free"].address
        text = elf.segment_containing(free_probe)
        if text is not None:
            # One extent serves every library: the widest (it only sorts unknown frees).
            before, after = self._text_around_free
            self._text_around_free = (
                max(before, free_probe - text.vaddr),
                max(after, text.vaddr + text.memsz - free_probe),
            )
        return functions, placements

    def _attach_library(self, elf: ElfFile, functions: dict[str, int], placements: dict[str, Placement]) -> None:
        by_address: dict[int, AttachedProbe] = {}
        for function, (cookie, _) in PROBES.items():
            address = functions.get(function)
            if address is None:
                continue
            known = by_address.get(address)
            if known is not None:
                # An alias of a function already probed (glibc: memalign = aligned_alloc).
                if PROBES[known.function][0] != cookie:
                    raise RuntimeFailure(f"{elf.path}: {function} and {known.function} share an address")
                by_address[address] = dataclasses.replace(known, aliases=known.aliases + (function,))
                continue
            by_address[address] = AttachedProbe(elf.path, function, address, placements[function])
        allocating = list(by_address.values())
        free = AttachedProbe(elf.path, "free", functions["free"], placements["free"])
        offsets = file_offsets(elf, [probe.placement.address for probe in allocating + [free]])
        cookies = [PROBES[probe.function][0] for probe in allocating]
        self._link(b"alloc_enter", elf, offsets[:-1], cookies)
        # The return probe shares the spot: the stack pointer, so the return address, is unchanged there.
        self._link(b"alloc_return", elf, offsets[:-1], cookies, returns=True)
        self._link(b"free_enter", elf, offsets[-1:], [0])
        self.probes += allocating + [free]

    def start(self) -> None:
        """Compiles, arms (unless waiting for exec or tracing all) and attaches every probe."""
        # clang runs without the GIL: the libraries are read and disassembled meanwhile
        # (nothing there prints: fds 1 and 2 are the compile's log until it ends).
        compile_job = claim_or_start_compile(self.settings, self.target)
        attached = self.target and not self.arm_on_exec
        target_maps = read_process(self.target) if attached else None
        try:
            layouts = [(library, *self._placements(library)) for library in self.libraries]
            stop = self._exit_stop()
            if target_maps is not None and self.settings.unwind == "dwarf":  # readelf meanwhile too
                for elf in self._modules.open(target_maps, self._executable_mappings(target_maps.maps)).values():
                    if elf is not None:
                        self._tables.table_of(elf)
        finally:
            self._bpf, self._programs = compile_job.result()
        self._set_control(CTL_TEXT_BEFORE_FREE, self._text_around_free[0])
        self._set_control(CTL_TEXT_AFTER_FREE, self._text_around_free[1])
        self._set_control(CTL_NEXT_GEN, 1)
        self._bpf[b"unwind_programs"][ct.c_int(0)] = ct.c_int(self._programs[b"unwind_frames"])
        # -c's command stops at its first allocator call until its tables are in (tables_stop_pending).
        self._set_control(CTL_TABLES_GEN, 0 if self.arm_on_exec else NO_TABLES_STOP)
        if attached:
            procs, gen = self._bpf[b"procs"], self._next_gen()
            procs[ct.c_uint32(self.target)] = procs.Leaf(gen=gen)
            self._set_control(CTL_TARGET_GEN, gen)
            if target_maps is not None and target_maps.maps:
                self.load_tables(target_maps, gen)
        self._bpf.attach_raw_tracepoint(tp=b"sched_process_exec", fn_name=b"process_exec")
        if self.settings.follow_forks:
            for tracepoint, program in (
                (b"task:task_newtask", b"task_newtask"),
                (b"sched:sched_process_exit", b"process_exit"),
            ):
                try:
                    with bcc_output():
                        self._bpf.attach_tracepoint(tp=tracepoint, fn_name=program)
                except Exception as e:
                    raise RuntimeFailure(f"cannot attach the {tracepoint.decode()} tracepoint: {e}") from None
        for library, functions, placements in layouts:
            self._attach_library(library, functions, placements)
        if stop is not None:
            self._link(b"exit_stop", *stop, [0])
        if self.loader and self.arm_on_exec:
            try:
                loader = ElfFile(self.loader)
                debug_state = loader.dynamic_functions.get("_dl_debug_state")
            except ElfError:
                debug_state = None
            if debug_state:  # without it, a module dlopen'ed later gets its table within MAPS_REFRESH
                self._link(b"modules_changed", loader, file_offsets(loader, [debug_state]), [0])

    def _exit_stop(self) -> tuple[ElfFile, list[int]] | None:
        """Where exit_stop's probe goes: _exit of the stop library, if it has one."""
        if not self.stop_library:
            return None
        elf = next((library for library in self.libraries if library.path == self.stop_library), None) or ElfFile(
            self.stop_library
        )
        exit_address = elf.dynamic_functions.get("_exit")
        return (elf, file_offsets(elf, [exit_address])) if exit_address else None

    def _set_control(self, slot: int, value: int) -> None:
        self._bpf[b"control"][ct.c_int(slot)] = ct.c_uint32(value)

    def _control(self, slot: int) -> int:
        return self._bpf[b"control"][ct.c_int(slot)].value

    def _next_gen(self) -> int:
        gen = self._control(CTL_NEXT_GEN)
        self._set_control(CTL_NEXT_GEN, gen + 1)
        return gen

    def target_gen(self) -> int:
        return self._control(CTL_TARGET_GEN)

    def tables_stop_pending(self) -> bool:
        """True once the target has been stopped at its first allocator call for its tables."""
        return bool(self._control(CTL_TABLES_STOP))

    def tables_loaded(self) -> bool:
        """The target's current image has its unwind tables (or it is never stopped for them)."""
        loaded = self._control(CTL_TABLES_GEN)
        return loaded == NO_TABLES_STOP or (loaded != 0 and loaded == self.target_gen())

    def clear_tables_stop(self, gen: int) -> None:
        self._set_control(CTL_TABLES_GEN, gen)
        self._set_control(CTL_TABLES_STOP, 0)

    def _upload(self, table: FileTable) -> tuple[int, int, int, int]:
        """(first row, row count, first page, page count) of a file's table in the kernel's, uploaded
        on first use; no rows when they do not fit (its frames then go by the checked frame-pointer
        chain), no pages when they do not (its row searches then cover every row of the file)."""
        if table.rows not in self._uploaded:
            rows, pages = table.row_count, table.page_count
            if self._next_row + rows > self.settings.max_unwind_rows:
                rows = pages = 0
            if self._next_page + pages > self.settings.max_unwind_pages:
                pages = 0
            first_row, first_page = self._next_row, self._next_page
            if rows:
                update_array(self._bpf[b"unwind_rows"], first_row, table.rows, rows)
                self._next_row += rows
            if pages:
                update_array(self._bpf[b"unwind_pages"], first_page, table.pages, pages)
                self._next_page += pages
            self._uploaded[table.rows] = (first_row, rows, first_page, pages)
        return self._uploaded[table.rows]

    @staticmethod
    def _executable_mappings(maps: str) -> list[Mapping]:
        return sorted(
            (m for m in parse_maps(maps) if "x" in m.perms and m.path != "[vsyscall]"), key=lambda m: m.start
        )[:MAX_EXEC_MAPS]

    def load_tables(self, process: ProcessInfo, gen: int) -> None:
        """Gives the stack walk the executable mappings of the process's image gen, with the
        unwind rows of each file (compiled once per file); nothing to do if they are unchanged."""
        pid = process.pid
        executable = self._executable_mappings(process.maps)
        lines = "\n".join(f"{m.start:x}-{m.end:x} {m.offset:x} {m.path}" for m in executable)
        if self._exec_maps.get(pid) == (gen, lines):
            return
        modules = self._modules.open(process, executable)
        entries = []
        for m in executable:
            bias, located, page_origin = m.start, (0, 0, 0, 0), 0
            elf = modules[m.start]
            vaddr = elf.file_offset_to_vaddr(m.offset) if elf else None
            if elf is not None and vaddr is not None:  # address - module virtual address
                bias = m.start - vaddr
                if self.settings.unwind == "dwarf":
                    file_table = self._tables.table_of(elf)
                    located, page_origin = self._upload(file_table), file_table.page_origin
            entries.append(EXEC_MAP.pack(m.start, m.end, bias, *located, page_origin, 0))
        table = self._bpf[b"exec_maps"]
        value = table.Leaf()
        packed = struct.pack("<II", gen, len(entries)) + b"".join(entries)
        ct.memmove(ct.addressof(value), packed, len(packed))
        table[ct.c_uint32(pid)] = value
        self._exec_maps[pid] = (gen, lines)

    def exit_stop_pending(self) -> bool:
        """True once the target has been stopped in _exit by the BPF program."""
        return bool(self._control(CTL_EXIT_STOP))

    def clear_exit_stop(self) -> None:
        self._set_control(CTL_EXIT_STOP, 0)

    def counters(self) -> Counters:
        table = self._bpf[b"counters"]
        totals = [sum(table[ct.c_int(i)]) for i in range(len(COUNTER_FIELDS))]
        return Counters(**dict(zip(COUNTER_FIELDS, totals)))

    def _stack(self, key: int) -> tuple[int, ...]:
        frames = self._stack_cache.get(key)
        if frames is None:
            try:
                raw = self._bpf[b"stacks"][ct.c_uint64(key)]
            except KeyError:
                return ()
            frames = tuple(ip for ip in raw.ip if ip)
            self._stack_cache[key] = frames
        return frames

    def _stack_of(self, stack_key: int) -> tuple[tuple[int, ...], StackStatus]:
        if stack_key == STACK_NONE:
            return (), StackStatus.FILTERED
        frames = self._stack(stack_key) if stack_key != STACK_LOST else ()
        return frames, StackStatus.CAPTURED if frames else StackStatus.LOST

    def _live_records(self):
        """(key, value) tuples of the live map, as unpacked (a record object each would double the walk)."""
        keys, values, _ = dump_map(self._bpf[b"live"])
        return zip(LIVE_KEY.iter_unpack(keys), LIVE_VAL.iter_unpack(values))

    def _live_entries(self) -> list[LiveEntry]:
        return [LiveEntry._make(key + value) for key, value in self._live_records()]

    def _traced_process(self, record: bytes) -> TracedProcess:
        """A `procs` record, as the map holds it (records seldom change: each is parsed once)."""
        known = self._parsed_procs.get(record)
        if known is None:
            gen, exited, parent, execed, comm, uid, ignored, _ = PROC.unpack(record)
            known = TracedProcess(
                gen,
                bool(exited),
                ignored,
                parent,
                bool(execed),
                printable(comm.split(b"\0", 1)[0].decode(errors="replace")),
                uid,
            )
            if len(self._parsed_procs) >= MAX_PARSED_PROCS:
                self._parsed_procs.clear()
            self._parsed_procs[record] = known
        return known

    def processes(self) -> dict[int, TracedProcess]:
        """Every process the kernel side knows (traced or ignored), by tgid: one batch read."""
        keys, values, _ = dump_map(self._bpf[b"procs"])
        return {
            tgid: self._traced_process(values[i * PROC.size : (i + 1) * PROC.size])
            for i, (tgid,) in enumerate(struct.iter_unpack("<I", keys))
        }

    def ignore(self, images: dict[int, int]) -> None:
        """Stops tracing these processes (pid -> generation) until they exec; sweep() then
        drops their records. One that exec'd since is left alone: its new image is judged anew."""
        procs = self._bpf[b"procs"]
        for pid, gen in images.items():
            with contextlib.suppress(KeyError):
                value = procs[ct.c_uint32(pid)]
                if not value.ignored and value.gen == gen:
                    value.ignored = IGNORED_UNSELECTED
                    procs[ct.c_uint32(pid)] = value

    def _generations(self, pids: set[int] | None = None) -> dict[int, int]:
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
        gens = self._generations(pids) if images is None else images
        if older_than_ns is None:
            keys, values, _ = dump_map(self._bpf[b"sites"])
            for (tgid, gen, stack_key, size), (count,) in zip(
                SITE_KEY.iter_unpack(keys), struct.iter_unpack("<q", values)
            ):
                if count > 0 and gens.get(tgid) == gen:
                    tally[tgid, stack_key, size, False] += count
            if self._control(CTL_FORKS):  # inherited blocks are counted from the live map only
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

    @gc_paused
    def allocations(self, pids: set[int] | None = None, images: dict[int, int] | None = None) -> list[LiveAllocation]:
        """Every live allocation with its address (a walk of the whole live table), of the traced
        processes, or of pids, or of these images (pid -> generation)."""
        live = self._current_live(self._generations(pids) if images is None else images)
        return [
            LiveAllocation(tgid, address, size, *self._stack_of(stack_key), inherited=bool(inherited))
            for (tgid, _, address), (size, _, stack_key, inherited, _) in live
        ]

    @gc_paused
    def copy_inherited(self) -> None:
        """Gives each new child its own records of the blocks it inherited.

        Until then the BPF program finds them in the parent (see the BPF
        source); records the child already has (its own frees and the
        parent's hand-overs) win, as every copy is inserted with NOEXIST.
        """
        forks = self._control(CTL_FORKS)
        if forks == self._control(CTL_COPIES_DONE):
            return
        inherits = self._bpf[b"inherits"]
        links = sorted(
            ((k.value, v.parent, v.parent_gen, v.fork_ts) for k, v in inherits.items()), key=lambda link: link[3]
        )
        if links:
            gens = self._generations()
            by_image: dict[tuple[int, int], list[LiveEntry]] = {}
            for e in self._live_entries():
                by_image.setdefault((e.tgid, e.gen), []).append(e)
            live_fd = self._bpf[b"live"].map_fd
            for child, parent, parent_gen, fork_ts in links:
                child_gen = gens.get(child)
                if child_gen is None:  # gone (or left out) before its copy was made
                    with contextlib.suppress(KeyError):
                        del inherits[ct.c_uint32(child)]
                    continue
                copied = by_image.setdefault((child, child_gen), [])
                for e in by_image.get((parent, parent_gen), ()):
                    if e.tombstone or e.ts_ns >= fork_ts:
                        continue
                    key = ct.create_string_buffer(LIVE_KEY.pack(child, child_gen, e.address), LIVE_KEY.size)
                    value = ct.create_string_buffer(LIVE_VAL.pack(e.size, e.ts_ns, e.stack_key, 1, 0), LIVE_VAL.size)
                    if lib.bpf_update_elem(live_fd, key, value, BPF_NOEXIST) == 0:
                        copied.append(e._replace(tgid=child, gen=child_gen, inherited=1))
                with contextlib.suppress(KeyError):
                    del inherits[ct.c_uint32(child)]
            slots = self._bpf[b"copy_slots"]
            waiting = {child for child, *_ in links}
            for key, child in list(slots.items()):
                if child.value in waiting:
                    with contextlib.suppress(KeyError):
                        del slots[key]
        self._set_control(CTL_COPIES_DONE, forks)

    @gc_paused
    def recorded_pids(self) -> dict[str, set[int]]:
        """Table name -> the tgids it holds records of (to prove that exited processes leave none)."""
        return {
            "live": {e.tgid for e in self._live_entries()},
            "sites": {key.tgid for key in self._bpf[b"sites"].keys()},
            "procs": {key.value for key in self._bpf[b"procs"].keys()},
            "inherits": {key.value for key in self._bpf[b"inherits"].keys()},
            "copy_slots": {key.parent for key in self._bpf[b"copy_slots"].keys()},
        }

    def drop_processes(self, pids: set[int]) -> None:
        """Takes processes that exited out of the process table, once user space has read that
        they did (the kernel side dropped their mappings, inheritance and copy slots at their
        exit); their live and site records stay for sweep()."""
        for pid in pids:
            self._exec_maps.pop(pid, None)
        delete_keys(self._bpf[b"procs"], struct.pack(f"<{len(pids)}I", *pids))

    @gc_paused
    def sweep(self, exited: dict[int, int]) -> None:
        """Drops the live and site records of images that exited (pid -> the last generation to
        drop), were replaced by an exec, or were left out; those a waiting child still inherits
        from stay; then the stacks no record left refers to. Generations only grow, and a
        process not in the table yet may be one that starts during this walk: its records stay."""
        wanted_from = {tgid: p.gen + bool(p.ignored) for tgid, p in self.processes().items()}
        needed = {(v.parent, v.parent_gen) for v in self._bpf[b"inherits"].values()}

        def stale(tgid: int, gen: int) -> bool:
            return (gen <= exited.get(tgid, 0) or gen < wanted_from.get(tgid, 0)) and (tgid, gen) not in needed

        # Stacks first: one stored after this read is not looked at; one stored before it has its
        # record (made in the same program run, microseconds later) in the reads below.
        stacks, _, _ = dump_map(self._bpf[b"stacks"])
        keys, values, _ = dump_map(self._bpf[b"live"])
        referenced = self._drop_stale(
            b"live",
            LIVE_KEY,
            stale,
            ((key, value[2]) for key, value in zip(LIVE_KEY.iter_unpack(keys), LIVE_VAL.iter_unpack(values))),
        )
        keys, _, _ = dump_map(self._bpf[b"sites"])
        referenced |= self._drop_stale(b"sites", SITE_KEY, stale, ((key, key[2]) for key in SITE_KEY.iter_unpack(keys)))
        unreferenced = [key for (key,) in struct.iter_unpack("<Q", stacks) if key not in referenced]
        for key in unreferenced:
            self._stack_cache.pop(key, None)
        delete_keys(self._bpf[b"stacks"], struct.pack(f"<{len(unreferenced)}Q", *unreferenced))

    def _drop_stale(self, name: bytes, key_format: struct.Struct, stale, records) -> set[int]:
        """Deletes the records of a table whose (tgid, generation) is stale; records: (key, its
        stack key). Returns the stack keys of the records that stay."""
        gone, kept = [], set()
        for key, stack_key in records:
            if stale(key[0], key[1]):
                gone.append(key_format.pack(*key))
            else:
                kept.add(stack_key)
        delete_keys(self._bpf[name], b"".join(gone))
        return kept

    def close(self) -> None:
        """Detaches every probe and frees the maps; safe to call twice."""
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            links, self._links = self._links, []
            for link in links:
                os.close(link)
            with bcc_output():
                bpf.cleanup()
