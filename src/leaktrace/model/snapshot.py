"""Snapshots: plain data produced by a source, read by everything downstream.

A snapshot holds live allocations grouped by (pid, size, stack), the counters of
what the source dropped, and what is needed to symbolize it later (each
process's maps as read at snapshot time). Nothing here knows which source made it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields


class StackStatus(str, enum.Enum):
    CAPTURED = "captured"  # frames present
    FILTERED = "filtered"  # size outside the backtrace size range: counted, no stack
    LOST = "lost"  # wanted, but dropped (see the loss counters)
    BEFORE_TRACE = "before_trace"  # found by the heap walk, made before the trace: sized by its usable size


@dataclass(frozen=True)
class AllocationGroup:
    """Live allocations of one process with the same size and stack."""

    pid: int
    size: int
    count: int
    stack: tuple[int, ...] = ()  # return addresses, innermost first
    stack_status: StackStatus = StackStatus.CAPTURED
    inherited: bool = False  # allocated by the parent before fork (see ProcessInfo.forked)
    samples: int | None = None  # a sampled trace: the blocks kept, of which count is the estimate

    @property
    def bytes(self) -> int:
        return self.size * self.count

    def bytes_variance(self, sample_rate: int) -> float:
        """The variance of bytes as an estimate from samples kept at sample_rate (0: exact, none):
        each kept block of chance p stands for size / p bytes, with variance (1 - p) (size / p)^2."""
        if not sample_rate or self.samples is None:
            return 0.0
        chance = keep_probability(self.size, sample_rate)
        return self.samples * (1 - chance) * (self.size / chance) ** 2 if chance else 0.0


def keep_probability(size: int, rate: int) -> float:
    """The chance that a block of size bytes is sampled at rate (Poisson sampling over bytes)."""
    return -math.expm1(-size / rate) if size else 0.0


@dataclass(frozen=True)
class SiteTotals:
    """What one process made at one size and stack since the trace began, freed or not."""

    pid: int
    size: int
    allocations: int  # blocks made (an estimate when sampled)
    frees: int  # of those, freed
    # Freed before their thread's next allocation (heaptrack's temporary); None: not counted (--sample).
    short_lived: int | None
    stack: tuple[int, ...] = ()
    stack_status: StackStatus = StackStatus.CAPTURED
    samples: int | None = None  # a sampled trace: the blocks kept, of which allocations is the estimate

    @property
    def allocated_bytes(self) -> int:
        return self.size * self.allocations


@dataclass(frozen=True)
class Peak:
    """A process's high-water mark of live bytes, and what was live then (memray's high-water mark)."""

    pid: int
    bytes: int  # the most live bytes it held (an estimate when sampled)
    time: float  # wall-clock seconds when it first held them
    groups: tuple[AllocationGroup, ...]  # live then: of a moment at most `bound` bytes below it
    bound: int = 0  # how far below bytes the groups' moment may be, and bytes below the true peak (0: exact)
    estimate: bool = False  # sampled: bytes and groups are estimates


class Measure(enum.StrEnum):
    """What a report, a flame graph or a profile is drawn or ranked by."""

    LIVE = "live"  # bytes live now
    ALLOCATED = "allocated"  # bytes allocated since the trace began
    PEAK = "peak"  # bytes live at each process's peak
    SHORT_LIVED = "short-lived"  # blocks freed by their thread's next allocator call


@dataclass(frozen=True)
class LiveAllocation:
    """One live allocation, for outputs that list pointers (the exit leak log)."""

    pid: int
    address: int
    size: int
    stack: tuple[int, ...] = ()
    stack_status: StackStatus = StackStatus.CAPTURED
    inherited: bool = False  # allocated by the parent before fork (see ProcessInfo.forked)


@dataclass(frozen=True)
class Counters:
    """Event and drop counters of a source; every field but the first two is shown as a drop."""

    allocations: int = 0  # allocations recorded since the trace began
    frees: int = 0  # frees of recorded allocations
    live_map_full: int = 0
    site_map_full: int = 0
    stack_map_full: int = 0
    stack_collisions: int = 0
    pending_lost: int = 0
    stale_calls: int = 0
    unknown_frees: int = 0  # frees by the program of blocks not recorded (made before -p attached)
    internal_frees: int = 0  # frees by the allocator itself of blocks it kept (not a loss)
    missed_frees: int = 0
    nested_calls: int = 0  # allocator calls made inside another (internal, not lost)
    unfollowed_children: int = 0  # child processes not traced (process table full)
    inheritance_lost: int = 0  # child processes traced without the blocks they inherited
    python_frames_cut: int = 0  # stacks whose Python frames were cut at 32 (their native frames whole)
    python_codes_full: int = 0  # code objects the preload library had no room to keep (their frames show no name)
    stops_unshared: int = 0  # processes stopped while the map shared with other leaktraces was full
    peak_map_full: int = 0  # processes whose peak was not followed (no room to keep it)
    stacks_truncated: int = 0  # stacks that end before the outermost frame (a frame not followed)
    # Why (their sum is stacks_truncated; the preload library's stacks are not counted here):
    stacks_truncated_no_tables: int = 0  # the process's unwind tables were not in yet
    stacks_truncated_unknown_code: int = 0  # a return address in no executable mapping the walk knows
    stacks_truncated_unreadable_stack: int = 0  # a read of the stack failed
    stacks_truncated_bad_frame: int = 0  # a rule's frame address not above the stack pointer
    stacks_truncated_no_rule: int = 0  # no CFI row at the pc, and the frame-pointer chain did not check out
    stacks_truncated_walk_budget: int = 0  # the kernel's tail calls ran out before the frame limit
    stacks_truncated_not_entered: int = 0  # the unwinder program could not be entered

    @classmethod
    def loss_names(cls) -> tuple[str, ...]:
        """The drop counters, less the reasons of stacks_truncated (see truncation_reasons)."""
        return tuple(f.name for f in fields(cls)[2:] if not f.name.startswith(TRUNCATION_PREFIX))

    def truncation_reasons(self) -> dict[str, int]:
        """Why stacks were truncated (reason -> stacks), where not zero."""
        return {
            f.name[len(TRUNCATION_PREFIX) :]: getattr(self, f.name)
            for f in fields(self)
            if f.name.startswith(TRUNCATION_PREFIX) and getattr(self, f.name)
        }

    def losses(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.loss_names()}

    def unrecorded(self) -> dict[str, int]:
        """The counters of allocations (or processes, or inherited blocks) that are missing
        from the live figures, where not zero: a report's figures are then low."""
        return {name: getattr(self, name) for name in UNRECORDED if getattr(self, name)}

    def incompleteness(self) -> str | None:
        """A report's warning that its live figures are low, and by how much; None if they are whole."""
        missing = self.unrecorded()
        if not missing:
            return None
        blocks = sum(missing.get(name, 0) for name in ("live_map_full", "site_map_full", "pending_lost"))
        parts = ", ".join(f"{name} {value}" for name, value in missing.items())
        what = f"up to {blocks} allocations missing" if blocks else "blocks of untraced processes missing"
        return f"INCOMPLETE: live figures are low ({what}: {parts})"


TRUNCATION_PREFIX = "stacks_truncated_"
# Drops that leave allocations out of the live figures (the rest lose stacks, or are not losses).
UNRECORDED = ("live_map_full", "site_map_full", "pending_lost", "unfollowed_children", "inheritance_lost")


@dataclass(frozen=True)
class InterpretedCode:
    """A code object of an interpreter in a traced process, as first seen (its frames name it by address)."""

    qualname: str
    filename: str
    first_line: int
    line_table: bytes  # the interpreter's own table: instruction -> line
    changed: bool = False  # the address has held another code object since: frames may name the wrong one


@dataclass(frozen=True)
class Credentials:
    """A process's file-system identity: the rights files it names are opened with."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


NOBODY = Credentials(65534, 65534)  # whose rights serve when a process's own are not known


@dataclass(frozen=True)
class Container:
    """The container a process runs in, as its cgroup path names it (platform/containers.py):
    a label for the reader, never a credential (a user can name cgroups of their own)."""

    id: str  # the runtime's container id (64 hex digits)
    runtime: str  # podman, docker, containerd or cri-o
    pod_uid: str = ""  # the Kubernetes pod's uid, where the path names one

    @property
    def short_id(self) -> str:
        return self.id[:12]


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    comm: str = ""
    name: str = ""  # program name (basename of argv[0]), as getprogname() says
    maps: str = ""  # /proc/PID/maps text as read at snapshot time
    exited: bool = False
    credentials: Credentials = NOBODY  # its module files are opened with these rights
    # Executable mappings of this image that are gone from maps (a dlclose'd library), in
    # maps' form: frames recorded while they were mapped are symbolized from them.
    unmapped: str = ""
    # Forked from a traced process, with its image: as in an app forked from Android's zygote,
    # the blocks it made itself carry the zygote bit (z 1) and those it inherited do not.
    forked: bool = False
    container: Container | None = None  # read once, from /proc/PID/cgroup

    @property
    def label(self) -> str:
        """The process as text outputs name it: "pid (comm)", with its container where it has one."""
        where = f", {self.container.runtime} {self.container.short_id}" if self.container else ""
        return f"{self.pid} ({self.comm}{where})"

    def zygote_bit(self, inherited: bool) -> bool:
        """Android's zygote bit of one of this process's blocks."""
        return self.forked and not inherited


UNREACHABLE_LIMIT = 100  # leaks listed by a reachability check, as libmemunreachable's default
CONTENTS_LENGTH = 32  # bytes of each unreachable leak kept (libmemunreachable's contents_length)


@dataclass(frozen=True)
class UnreachableLeak:
    """One reported leak: an allocation nothing reachable points to, with what it holds."""

    pid: int
    address: int
    size: int
    referenced_count: int
    referenced_size: int
    stack: tuple[int, ...] = ()
    stack_status: StackStatus = StackStatus.CAPTURED
    contents: bytes = b""
    similar_count: int = 0  # other leaks with the same backtrace, merged into this one
    similar_size: int = 0
    similar_referenced_count: int = 0
    similar_referenced_size: int = 0

    @property
    def total_size(self) -> int:
        return self.size + self.referenced_size + self.similar_size + self.similar_referenced_size


class LeakKind(str, enum.Enum):
    """valgrind's kinds of a block still allocated at exit, by how the roots reach it."""

    DEFINITE = "definite"  # no pointer to it at all from the roots or from reachable blocks
    INDIRECT = "indirect"  # pointed to only from lost blocks
    POSSIBLE = "possible"  # reached from the roots only through a pointer into its middle
    REACHABLE = "reachable"  # a chain of pointers to block starts leads to it from the roots

    @property
    def words(self) -> str:
        """As valgrind's summary names it."""
        return {"definite": "definitely lost", "indirect": "indirectly lost", "possible": "possibly lost"}.get(
            self.value, "still reachable"
        )


@dataclass(frozen=True)
class LossRecord:
    """The blocks of one kind with the same stack (valgrind's loss record)."""

    pid: int
    kind: LeakKind
    blocks: int
    bytes: int
    stack: tuple[int, ...] = ()
    stack_status: StackStatus = StackStatus.CAPTURED
    suppressed_by: str | None = None  # the suppression that matched it, once they were applied


@dataclass(frozen=True)
class SuppressionUse:
    """How much one suppression matched (valgrind's used_suppression)."""

    name: str
    source: str  # file:line
    blocks: int
    bytes: int


@dataclass(frozen=True)
class LeakCheck:
    """Every block a process still had at its exit, judged into valgrind's kinds."""

    pid: int
    records: tuple[LossRecord, ...]  # largest first
    pause_seconds: float  # how long the exiting process stood still for its copy
    unreadable_pages: int = 0
    suppressions_used: tuple[SuppressionUse, ...] = ()
    command: str = ""  # its command line (--all: a process judged at its exit)

    def total(self, kind: LeakKind | None) -> tuple[int, int]:
        """(bytes, blocks) of one kind left after the suppressions (None: of those suppressed)."""
        records = [
            r
            for r in self.records
            if (r.suppressed_by is not None if kind is None else r.kind == kind and r.suppressed_by is None)
        ]
        return sum(r.bytes for r in records), sum(r.blocks for r in records)

    def errors(self, kinds: frozenset[LeakKind]) -> list[LossRecord]:
        """The records of these kinds no suppression matched."""
        return [r for r in self.records if r.kind in kinds and r.suppressed_by is None]


def request_range(usable: int, page: int = 4096) -> tuple[int, int]:
    """The request sizes glibc may serve with a block of this usable size: a heap chunk's usable
    size is 8 more than a multiple of 16, and up to 31 bytes more than the request (a chunk is
    not split for a remainder under 32 bytes); an mmapped chunk's is a multiple of 16 (whole
    pages less its header: a page of requests)."""
    if usable % 16 == 0:
        return max(1, usable - page - 7), usable - 8
    return (1 if usable <= 40 else usable - 31), usable  # the smallest chunk serves requests from 1


@dataclass(frozen=True)
class UnreachableReport:
    pid: int
    leaks: tuple[UnreachableLeak, ...]  # the first `limit`, largest total first
    reported: int  # leaks before the limit
    num_leaks: int  # every unreachable allocation
    leak_bytes: int
    num_allocations: int  # every allocation judged
    allocation_bytes: int
    complete: bool  # False: blocks made before the trace began were not judged
    pause_seconds: float  # how long the process stood still
    sweep_seconds: float
    unreadable_pages: int  # read as zeros (PROT_NONE, or vanished)
    heap_walk: str = ""  # how the heap walk went (or why there was none); "" without one
    before_trace: int = 0  # blocks judged that the walk found and the trace had not seen
    walk_problems: tuple[str, ...] = ()  # each stopped part of the walk: the verdicts are then partial

    def seed_options(self) -> str:
        """malloc_debug options that take stacks for exactly the unreachable sizes' range."""
        ranges = [
            request_range(leak.size) if leak.stack_status == StackStatus.BEFORE_TRACE else (leak.size, leak.size)
            for leak in self.leaks
        ]
        if not ranges:
            return ""
        low, high = min(low for low, _ in ranges), max(high for _, high in ranges)
        if low == high:
            return f"backtrace_size={low}"
        return f"backtrace_min_size={low} backtrace_max_size={high}"


Stacked = AllocationGroup | SiteTotals | LiveAllocation | UnreachableLeak | LossRecord  # what carries a stack


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # wall-clock seconds
    groups: tuple[AllocationGroup, ...]
    counters: Counters
    processes: dict[int, ProcessInfo] = field(default_factory=dict)
    backtrace_frames: int = 16
    # Each live allocation, when the source was asked for them (they cost a walk of every one);
    # may cover only the processes that exited, for their exit leak log.
    allocations: tuple[LiveAllocation, ...] | None = None
    # The reachability check of the target, when one was asked for (--unreachable).
    unreachable: UnreachableReport | None = None
    # valgrind's leak kinds (--leak-check): of a -c command at its exit, of a -p process at the
    # trace's end, of each --all process that exited since the last snapshot.
    leak_checks: tuple[LeakCheck, ...] = ()
    # (pid, code object address) -> the code, for the interpreter frames the stacks hold.
    interpreted_code: dict[tuple[int, int], InterpretedCode] = field(default_factory=dict)
    # A sampled trace (--sample): mean bytes between samples, and the generator's seed; 0: exact.
    sample_rate: int = 0
    sample_seed: int = 0
    # Per site, since the trace began: every block made, the freed ones too.
    sites: tuple[SiteTotals, ...] = ()
    peaks: tuple[Peak, ...] = ()  # each process's high-water mark, where the source follows it

    def stacked_items(self) -> tuple[Stacked, ...]:
        """Everything here that carries a stack."""
        unreachable = self.unreachable.leaks if self.unreachable else ()
        return (
            *self.groups,
            *self.sites,
            *(group for peak in self.peaks for group in peak.groups),
            *(self.allocations or ()),
            *unreachable,
            *(record for check in self.leak_checks for record in check.records),
        )

    @property
    def live_bytes(self) -> int:
        return sum(group.bytes for group in self.groups)

    @property
    def live_allocations(self) -> int:
        return sum(group.count for group in self.groups)

    def measured(self, measure: Measure) -> tuple[AllocationGroup, ...]:
        """Groups whose count is the measure's: blocks live now, made since the trace began,
        live at each process's peak, or short-lived."""
        if measure == Measure.LIVE:
            return self.groups
        if measure == Measure.PEAK:
            return tuple(group for peak in self.peaks for group in peak.groups)
        counted = (
            (site, site.allocations if measure == Measure.ALLOCATED else site.short_lived or 0) for site in self.sites
        )
        return tuple(
            AllocationGroup(site.pid, site.size, count, site.stack, site.stack_status)
            for site, count in counted
            if count
        )
