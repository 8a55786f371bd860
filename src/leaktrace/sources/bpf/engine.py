"""The BPF engine: compiles leaktrace.bpf.c with bcc, attaches it, reads its maps."""

from __future__ import annotations

import ctypes as ct
import dataclasses
import errno
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaktrace.abi.layout import (  # shared with leaktrace.bpf.c: generated from layout.h
    AR_RAX,
    COOKIE_FUNCTION_BITS,
    COOKIE_REGISTER_BITS,
    CTL_JUDGE_EXITS,
    CTL_NEXT_GEN,
    CTL_TABLES_GEN,
    CTL_TARGET_GEN,
    CTL_TEXT_AFTER_FREE,
    CTL_TEXT_BEFORE_FREE,
    F_ALIGNED_ALLOC,
    F_CALLOC,
    F_MALLOC,
    F_POSIX_MEMALIGN,
    F_PVALLOC,
    F_REALLOC,
    F_REALLOCARRAY,
    F_VALLOC,
    NO_TABLES_STOP,
)
from leaktrace.allocators import ALLOCATING, FREE, Family, family_of
from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import HOST
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.module_files import ModuleFiles
from leaktrace.platform.process import MapsFollower, live_thread, maps_device, read_process
from leaktrace.sources.bpf.compile import bcc_output, claim_or_start_compile, returns_by_session
from leaktrace.sources.bpf.cookie_stubs import COOKIE_TARGETS, CookieStubs
from leaktrace.sources.bpf.inheritance import ForkInheritance
from leaktrace.sources.bpf.kernel_features import PERF_LINK_COOKIE, TASK_STORAGE, UPROBE_MULTI, offers
from leaktrace.sources.bpf.kernel_state import KernelState
from leaktrace.sources.bpf.links import (
    BPF_TRACE_UPROBE_MULTI,
    BPF_TRACE_UPROBE_SESSION,
    attach_perf_uprobes,
    attach_uprobes,
    reference_counter_conflicts,
)
from leaktrace.sources.bpf.map_reading import MapReader
from leaktrace.sources.bpf.process_registry import ProcessRegistry
from leaktrace.sources.bpf.unwind_upload import UnwindUpload
from leaktrace.sources.settings import EngineSettings
from leaktrace.sources.target import TargetKind, TraceTarget
from leaktrace.unwind.tables import TableCache, UnwindTables

if TYPE_CHECKING:
    from leaktrace.sources.bpf.probe_placement import Placement


# The BPF source's enum function of each allocating function: its probes' cookie.
FUNCTION_CODES = {
    "malloc": F_MALLOC,
    "calloc": F_CALLOC,
    "realloc": F_REALLOC,
    "reallocarray": F_REALLOCARRAY,
    "posix_memalign": F_POSIX_MEMALIGN,
    "aligned_alloc": F_ALIGNED_ALLOC,
    "memalign": F_ALIGNED_ALLOC,
    "valloc": F_VALLOC,
    "pvalloc": F_PVALLOC,
}
# Allocating function (allocators' ALLOCATING) -> (its cookie's function code; the argument
# registers the program reads). Each also gets a return probe.
PROBES = {function.name: (FUNCTION_CODES[function.name], function.arguments) for function in ALLOCATING}
# A general register -> its code in a probe's cookie (layout.h's enum argument_register).
REGISTER_CODES = {
    name: code
    for code, name in enumerate(
        ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"), start=AR_RAX
    )
}


def probe_cookie(function_code: int, arguments: tuple[str, ...], placement: Placement) -> int:
    """The cookie of a probe: the function, and where each argument it reads is at the probe."""
    cookie = function_code
    for argument, register in zip(arguments, placement.registers):
        if register != argument:
            shift = COOKIE_FUNCTION_BITS + HOST.argument_registers.index(argument) * COOKIE_REGISTER_BITS
            cookie |= REGISTER_CODES[register] << shift
    return cookie


def _why_refused(error: OSError, library: ElfFile, offsets: list[int]) -> str:
    """Why the kernel refused a uprobe_multi link, as far as can be known."""
    if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
        return error.strerror
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
    from leaktrace.sources.bpf.probe_placement import only_tail_calls, place_probe

    placements = {
        function: place_probe(elf, function, functions[function], arguments)
        for function, (_, arguments) in PROBES.items()
        if function in functions
    }
    for described in ALLOCATING:
        placement, forwarded = placements.get(described.name), placements.get(described.tail_calls)
        if (
            placement is not None
            and forwarded is not None
            and placement.single_stepped
            and only_tail_calls(elf, functions[described.name])
        ):
            placements[described.name] = dataclasses.replace(
                placement,
                unprobed=True,
                why=f"{described.name}: not probed: it only checks its arguments and tail-calls "
                f"{described.tail_calls}, whose probe counts its calls (its own would be single-stepped)",
            )
    if "free" in functions:  # a static program that never frees has none linked in
        placements["free"] = place_probe(elf, "free", functions["free"], FREE.arguments)
    return placements


def file_offsets(elf: ElfFile, addresses: list[int]) -> list[int]:
    """The file offsets uprobes are placed by, of link-time addresses of elf's code."""
    try:
        return [elf.vaddr_to_file_offset(address) for address in addresses]
    except ElfError as e:
        raise RuntimeFailure(f"cannot place uprobes: {e}") from None


class BpfEngine:
    """One compiled BPF program tracing one process and, with -f, its children; or every
    process that calls into the libraries (each from its first call). Its
    parts share the compiled program through kernel: reader (the maps, read), upload (unwind
    tables and mappings), registry (processes taken out), inheritance (copies across fork)."""

    def __init__(
        self,
        settings: EngineSettings,
        target: TraceTarget,
        libraries: tuple[ElfFile, ...],
        stop_library: str | None = None,
        loader: str | None = None,
        code_freed_at: tuple[ElfFile, str] | None = None,
    ):
        if target.is_every_process:
            settings = dataclasses.replace(settings, follow_forks=True)
        self.settings = settings
        self.target = target
        self.libraries = libraries
        self.stop_library = stop_library  # library with _exit, to stop the target there
        self.loader = loader  # -c: the command's ld.so, whose _dl_debug_state says modules changed
        # The target's interpreter module and its function that frees its code: stopped there once.
        self.code_freed_at = code_freed_at
        self.probes: list[AttachedProbe] = []
        self.exit_hold_spots: tuple[tuple[str, int, int], ...] = ()  # (device, inode, file offset) of _exit's probes
        self.unprobed: list[Placement] = []  # functions left to the probe of the one they tail-call
        # The target's first thread had exited (pthread_exit) when it was attached to.
        self.leader_exited = target.pid is not None and live_thread(target.pid) not in (target.pid, None)
        self.kernel = KernelState()
        self._programs: dict[bytes, int] = {}  # program name -> fd
        self._links: list[int] = []  # uprobe_multi link fds (before 6.6: perf event links and events)
        self._cookie_stubs: CookieStubs | None = None  # before Linux 5.15: while probes are attached
        self._text_around_free = (0, 0)
        self.tables = UnwindTables(TableCache(settings.table_cache) if settings.table_cache else None)
        self.notices: list[str] = []  # said at the next report (BpfTrace.take_notices)
        self._modules = ModuleFiles()
        self.reader = MapReader(self.kernel)
        self.upload = UnwindUpload(self.kernel, settings, self.tables, self._modules, self.notices)
        self.registry = ProcessRegistry(self.kernel, self.reader, self.upload)
        self.inheritance = ForkInheritance(self.kernel, self.reader)

    @property
    def library_paths(self) -> list[str]:
        return [library.path for library in self.libraries]

    @property
    def library_names(self) -> list[str]:
        """Each probed library's path, with its allocator family where it is one described."""
        named = []
        for library in self.libraries:
            family = self._family(library)
            named.append(f"{library.path} ({family.name})" if family else library.path)
        return named

    @property
    def families(self) -> list[Family]:
        """The allocator families of the probed libraries, where described."""
        return [family for family in map(self._family, self.libraries) if family is not None]

    @staticmethod
    def _family(library: ElfFile) -> Family | None:
        """The allocator family of a probed module, from the functions it defines."""
        try:
            return family_of(library.probe_functions.keys() | library.linked_functions.keys())
        except ElfError:
            return None

    def _link(
        self,
        program: bytes,
        library: ElfFile,
        offsets: list[int],
        cookies: list[int],
        returns: bool = False,
        attach_type: int = BPF_TRACE_UPROBE_MULTI,
    ) -> None:
        # Children are only seen by probes that fire in every process (pid 0); so is a process whose
        # first thread has exited (the kernel's pid filter matches its address space, gone with it).
        pid = self.target.pid if not (self.settings.follow_forks or self.leader_exited) else None
        try:  # by descriptor: the very file that was read (a target's, with its rights)
            if offers(UPROBE_MULTI):
                self._links.append(
                    attach_uprobes(
                        self._programs[program], library.descriptor, offsets, cookies, pid, returns, attach_type
                    )
                )
            else:  # before 5.15 no perf link carries a cookie: a program that reads one runs its cookie's stub
                linked = offers(PERF_LINK_COOKIE)
                if not linked and program in COOKIE_TARGETS:
                    assert self._cookie_stubs is not None  # made at start where perf links lack cookies
                    programs = [self._cookie_stubs.program(program, cookie) for cookie in cookies]
                else:
                    programs = [self._programs[program]] * len(offsets)
                self._links += attach_perf_uprobes(
                    programs, library.descriptor, offsets, cookies if linked else None, pid, returns
                )
        except OSError as e:
            if self.target.pid is not None and not os.path.exists(f"/proc/{self.target.pid}"):
                raise RuntimeFailure(f"pid {self.target.pid} exited before the probes were attached") from None
            raise RuntimeFailure(
                f"cannot attach uprobes to {library.path}: {_why_refused(e, library, offsets)}"
            ) from None

    def _placements(self, elf: ElfFile) -> tuple[dict[str, int], dict[str, Placement]]:
        """The library's allocator functions (name -> entry) and where each one's probe goes."""
        try:
            functions = elf.probe_functions
        except ElfError as e:
            raise RuntimeFailure(f"cannot read allocator library: {e}") from None
        # A library exports both; a program with its allocator linked in may never free.
        if "malloc" not in functions or ("free" not in functions and elf.exports_function("malloc")):
            raise RuntimeFailure(f"{elf.path} defines no malloc and free that its symbols name")
        placements = place_probes(elf, functions)
        free = placements.get("free")
        text = elf.segment_containing(free.address) if free else None
        if free and text:
            # One extent serves every library: the widest (it only sorts unknown frees).
            before, after = self._text_around_free
            self._text_around_free = (
                max(before, free.address - text.vaddr),
                max(after, text.vaddr + text.memsz - free.address),
            )
        return functions, placements

    def _attach_library(self, elf: ElfFile, functions: dict[str, int], placements: dict[str, Placement]) -> None:
        by_address: dict[int, AttachedProbe] = {}
        for function, (cookie, _) in PROBES.items():
            address = functions.get(function)
            if address is None:
                continue
            if placements[function].unprobed:
                self.unprobed.append(placements[function])
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
        offsets = file_offsets(elf, [probe.placement.address for probe in allocating])
        cookies = [probe_cookie(*PROBES[probe.function], probe.placement) for probe in allocating]
        # The return probe shares the spot: the stack pointer, so the return address, is unchanged there.
        if returns_by_session(self.settings):
            self._link(b"alloc_session", elf, offsets, cookies, attach_type=BPF_TRACE_UPROBE_SESSION)
        else:
            self._link(b"alloc_enter", elf, offsets, cookies)
            self._link(b"alloc_return", elf, offsets, cookies, returns=True)
        self.probes += allocating
        if "free" in placements:
            free = AttachedProbe(elf.path, "free", functions["free"], placements["free"])
            offset = file_offsets(elf, [free.placement.address])
            self._link(b"free_enter", elf, offset, [probe_cookie(0, FREE.arguments, free.placement)])
            self.probes.append(free)

    def start(self) -> None:
        """Compiles, arms (unless waiting for exec or tracing all) and attaches every probe."""
        # clang runs without the GIL: the libraries are read and disassembled meanwhile
        # (nothing there prints: fds 1 and 2 are the compile's log until it ends).
        compile_job = claim_or_start_compile(self.settings, self.target)
        attached = self.target.kind is TargetKind.PROCESS
        target_maps = read_process(self.target.single_pid) if attached else None
        try:
            layouts = [(library, *self._placements(library)) for library in self.libraries]
            for library in self.libraries:
                family = self._family(library)
                if family is not None and family.stack_starts:
                    self.tables.end_walks_in(library, library.extents_of(family.stack_starts))
            stops = self._exit_stops()
            # Where a process held at its exit stands: below its stack pointer lies nothing live.
            self.exit_hold_spots = tuple(
                (maps_device(elf.identity[0]), elf.identity[1], offset) for elf, offsets in stops for offset in offsets
            )
            target_follower = MapsFollower()
            if target_maps is not None:
                target_follower.follow(target_maps.maps)
            if target_maps is not None and self.settings.unwind == "dwarf":  # readelf meanwhile too
                for elf in self._modules.open(target_maps, target_follower.executable).values():
                    if elf is not None:
                        self.tables.table_of(elf)
        finally:
            self.kernel.bpf, self._programs = compile_job.result()
        self.kernel.set_control(CTL_TEXT_BEFORE_FREE, self._text_around_free[0])
        self.kernel.set_control(CTL_TEXT_AFTER_FREE, self._text_around_free[1])
        if self.kernel.holds_images:  # before any probe is live: no process may exit unjudged
            self.kernel.set_control(CTL_JUDGE_EXITS, int(self.settings.leak_check_at_exit))
        self.kernel.set_control(CTL_NEXT_GEN, 1)
        self.kernel.bpf[b"unwind_programs"][ct.c_int(0)] = ct.c_int(self._programs[b"unwind_frames"])
        # -c's command stops at its first allocator call until its tables are in (tables_stop_pending).
        self.kernel.set_control(CTL_TABLES_GEN, 0 if self.target.is_command else NO_TABLES_STOP)
        if attached:
            procs, gen = self.kernel.bpf[b"procs"], self.kernel.next_gen()
            procs[ct.c_uint32(self.target.single_pid)] = procs.Leaf(gen=gen)
            self.kernel.set_control(CTL_TARGET_GEN, gen)
            if target_maps is not None and target_maps.maps:
                self.upload.load_tables(target_maps, gen, target_follower)
        self.kernel.bpf.attach_raw_tracepoint(tp=b"sched_process_exec", fn_name=b"process_exec")
        if not offers(TASK_STORAGE):
            self.kernel.bpf.attach_raw_tracepoint(tp=b"sched_process_exit", fn_name=b"thread_exit")
        if not offers(PERF_LINK_COOKIE):
            targets = self.kernel.bpf[b"cookie_targets"]
            for index, program in enumerate(COOKIE_TARGETS):
                targets[ct.c_int(index)] = ct.c_int(self._programs[program])
            self._cookie_stubs = CookieStubs(self.kernel.bpf[b"stub_cookie"].map_fd, targets.map_fd)
        try:
            self._attach_probes(layouts, stops)
        finally:
            if self._cookie_stubs is not None:  # each perf event holds its stub
                self._cookie_stubs.close()

    def _attach_probes(
        self,
        layouts: list[tuple[ElfFile, dict[str, int], dict[str, Placement]]],
        stops: list[tuple[ElfFile, list[int]]],
    ) -> None:
        """The tracepoints and every uprobe: the allocators', the stops', the loader's."""
        if self.settings.follow_forks:
            for tracepoint, program in (
                (b"task:task_newtask", b"task_newtask"),
                (b"sched:sched_process_exit", b"process_exit"),
            ):
                try:
                    with bcc_output():
                        self.kernel.bpf.attach_tracepoint(tp=tracepoint, fn_name=program)
                except Exception as e:
                    raise RuntimeFailure(f"cannot attach the {tracepoint.decode()} tracepoint: {e}") from None
        for library, functions, placements in layouts:
            self._attach_library(library, functions, placements)
        for library, offsets in stops:
            self._link(b"exit_stop", library, offsets, [0])
        if self.code_freed_at and self.settings.interpreter_frames:
            module, function = self.code_freed_at
            frees = module.dynamic_functions.get(function)
            if frees:
                self._link(b"interpreter_stop", module, file_offsets(module, [frees]), [0])
        if self.loader and self.target.is_command:
            try:
                loader = ElfFile(self.loader)
                debug_state = loader.dynamic_functions.get("_dl_debug_state")
                r_debug = loader.dynamic_objects.get("_r_debug")
            except ElfError:
                debug_state = r_debug = None
            if debug_state:  # without it, a module dlopen'ed later gets its table within MAPS_REFRESH
                to_r_debug = (r_debug - debug_state) % (1 << 64) if r_debug else 0
                self._link(b"modules_changed", loader, file_offsets(loader, [debug_state]), [to_r_debug])

    def _exit_stops(self) -> list[tuple[ElfFile, list[int]]]:
        """Where exit_stop's probes go: _exit of the stop library (-c), or of every library
        probed that has one (--all: each process may be judged at its exit)."""
        if not self.target.is_every_process:
            if not self.stop_library:
                return []
            found = next((library for library in self.libraries if library.path == self.stop_library), None)
            candidates = [found or ElfFile(self.stop_library)]
        else:
            candidates = list(self.libraries)
        stops = []
        for elf in candidates:
            # musl's exit() ends in _Exit, which its _exit calls; glibc's _Exit is its _exit.
            functions = elf.probe_functions
            exit_address = functions.get("_Exit") or functions.get("_exit")
            if exit_address:
                stops.append((elf, file_offsets(elf, [exit_address])))
        return stops

    def close(self) -> None:
        """Detaches every probe and frees the maps; safe to call twice."""
        if self.kernel.bpf is not None:
            bpf, self.kernel.bpf = self.kernel.bpf, None
            links, self._links = self._links, []
            for link in links:
                os.close(link)
            with bcc_output():
                bpf.cleanup()
