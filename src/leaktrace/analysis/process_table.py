"""Processes as rows (pid, comm, live bytes, allocations, growth, peak, totals since the trace
began, top site), for the systemwide report and the top view; pure functions of a symbolized
snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from leaktrace.analysis.growth import Growth, StackId, stack_id
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.model.snapshot import AllocationGroup, Container, StackStatus


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    comm: str
    exited: bool
    live_bytes: int
    live_allocations: int
    growth_bytes: int  # since the previous snapshot
    growth_rate: float  # bytes per second
    top_site: str  # the caller of its largest stack
    peak_bytes: int = 0  # its high-water mark of live bytes (0: not followed)
    allocated_bytes: int = 0  # made since the trace began, freed or not
    short_lived: int = 0  # blocks freed by their thread's next allocator call
    container: Container | None = None


# Sort keys of the top view and of the report: name -> (row key, largest first).
SORT_KEYS = {
    "live": (lambda row: row.live_bytes, True),
    "allocs": (lambda row: row.live_allocations, True),
    "growth": (lambda row: row.growth_rate, True),
    "pid": (lambda row: row.pid, False),
    "comm": (lambda row: row.comm, False),
    "peak": (lambda row: row.peak_bytes, True),
    "allocated": (lambda row: row.allocated_bytes, True),
    "short-lived": (lambda row: row.short_lived, True),
}


def sort_rows(rows: list[ProcessRow], key: str, reverse: bool = False) -> list[ProcessRow]:
    extract, descending = SORT_KEYS[key]
    return sorted(
        rows, key=lambda row: (extract(row), -row.pid if descending else row.pid), reverse=descending != reverse
    )


def process_rows(symbolized: SymbolizedSnapshot, growth: Growth) -> list[ProcessRow]:
    """One row per process of the snapshot, largest live bytes first."""
    snap = symbolized.snapshot
    totals: dict[int, list[int]] = {pid: [0, 0] for pid in snap.processes}
    largest: dict[int, tuple[int, AllocationGroup | None]] = {}
    stack_bytes: dict[StackId, int] = {}
    for group in snap.groups:
        total = totals.setdefault(group.pid, [0, 0])
        total[0] += group.bytes
        total[1] += group.count
        key = stack_id(group)
        stack_bytes[key] = stack_bytes.get(key, 0) + group.bytes
        if stack_bytes[key] > largest.get(group.pid, (0, None))[0]:
            largest[group.pid] = (stack_bytes[key], group)
    made: dict[int, list[int]] = {}
    for totals_of_site in snap.sites:
        figures = made.setdefault(totals_of_site.pid, [0, 0])
        figures[0] += totals_of_site.allocated_bytes
        figures[1] += totals_of_site.short_lived or 0
    peaks = {peak.pid: peak.bytes for peak in snap.peaks}
    rows = []
    for pid, (live_bytes, live_allocations) in totals.items():
        info = snap.processes.get(pid)
        top_group = largest.get(pid, (0, None))[1]
        if top_group is None:
            site = ""
        elif top_group.stack_status == StackStatus.CAPTURED and top_group.stack:
            site = symbolized.stack_of(top_group)[0].describe()
        else:
            site = f"({top_group.stack_status.value} stack)"
        change = growth.of_process(pid)
        rows.append(
            ProcessRow(
                pid,
                info.comm if info else "",
                bool(info and info.exited),
                live_bytes,
                live_allocations,
                change.delta_bytes,
                change.rate,
                site,
                peaks.get(pid, 0),
                allocated_bytes=made.get(pid, [0, 0])[0],
                short_lived=made.get(pid, [0, 0])[1],
                container=info.container if info else None,
            )
        )
    return sort_rows(rows, "live")
