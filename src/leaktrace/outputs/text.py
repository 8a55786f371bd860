"""The text report: totals, drop counters, then the top stacks by live bytes (or by another
measure: bytes allocated since the trace began, live at the peak, short-lived blocks), and
each process's peak."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from leaktrace.analysis.growth import Growth, StackId, stack_id
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.model.snapshot import AllocationGroup, Counters, Measure, Snapshot, StackStatus

if TYPE_CHECKING:
    from leaktrace.outputs.renderers import RenderContext

_NO_STACK = {
    StackStatus.FILTERED: "(no stack: size outside the backtrace size range)",
    StackStatus.LOST: "(stack lost: see the drop counters)",
}


SIZES_SHOWN = 4  # sizes listed per stack; the rest are summed up


def sizes_text(groups: list[AllocationGroup]) -> str:
    ordered = sorted(groups, key=lambda g: (-g.bytes, g.size))
    text = ", ".join(
        f"{g.size}" if g.count == 1 and len(groups) == 1 else f"{g.size} x{g.count}" for g in ordered[:SIZES_SHOWN]
    )
    rest = ordered[SIZES_SHOWN:]
    if rest:
        text += f", {len(rest)} more sizes x{sum(g.count for g in rest)}"
    return text + (" (inherited)" if groups[0].inherited else "")


def stack_text(symbolized: SymbolizedSnapshot, group: AllocationGroup, frames: int | None) -> str:
    if group.stack_status != StackStatus.CAPTURED:
        return _NO_STACK[group.stack_status]
    shown = symbolized.stack_of(group)[:frames]
    return "\n".join(frame.describe() for frame in shown)


def clock(snapshot: Snapshot) -> str:
    return f"[{time.strftime('%H:%M:%S', time.localtime(snapshot.taken_at))}]"


def totals_text(snapshot: Snapshot) -> str:
    counters = snapshot.counters
    if snapshot.sample_rate:
        samples = sum(group.samples or 0 for group in snapshot.groups)
        rate = next(
            (f"{snapshot.sample_rate // unit} {name}" for name, unit in UNITS if snapshot.sample_rate % unit == 0),
            f"{snapshot.sample_rate} bytes",
        )
        return (
            f"{snapshot.live_bytes} live bytes in {snapshot.live_allocations} allocations, estimated from "
            f"{samples} samples at {rate} (seed {snapshot.sample_seed}; {counters.allocations} sampled "
            f"allocations, {counters.frees} of them freed)"
        )
    return (
        f"{snapshot.live_bytes} live bytes in {snapshot.live_allocations} allocations "
        f"({counters.allocations} allocated, {counters.frees} freed since the trace began)"
    )


UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))  # a sampling rate as people say it


def drops_text(counters: Counters) -> str:
    """The drop counters, after the warning that the figures are low when some say so; all of
    them when any is not zero, else "drops: none" (JSON always has every one)."""
    warning = counters.incompleteness()
    losses = counters.losses()
    listed = ", ".join(f"{name} {value}" for name, value in losses.items()) if any(losses.values()) else "none"
    reasons = counters.truncation_reasons()
    if reasons:  # after stacks_truncated, the last of the drops
        listed += " (" + ", ".join(f"{reason} {value}" for reason, value in reasons.items()) + ")"
    return (f"{warning}\n" if warning else "") + "drops: " + listed


def rate_text(bytes_per_second: float) -> str:
    return f"{bytes_per_second:+.0f} B/s"


def ranked_stacks(groups, by_count: bool = False) -> list[list[AllocationGroup]]:
    """Groups merged per stack (one process, one stack), largest bytes first (most blocks first, by_count)."""
    by_stack: dict[StackId, list[AllocationGroup]] = defaultdict(list)
    for group in groups:
        by_stack[stack_id(group)].append(group)

    def rank(gs: list[AllocationGroup]) -> tuple:
        size, count = sum(g.bytes for g in gs), sum(g.count for g in gs)
        return (-count, -size) if by_count else (-size, -count), gs[0].pid, gs[0].stack, gs[0].inherited

    return sorted(by_stack.values(), key=rank)


# measure -> what its table ranks, and whether by blocks rather than bytes
MEASURE_TITLES = {
    Measure.LIVE: ("live bytes", False),
    Measure.ALLOCATED: ("bytes allocated since the trace began", False),
    Measure.PEAK: ("bytes live at the peak", False),
    Measure.SHORT_LIVED: ("short-lived blocks (freed by their thread's next allocator call)", True),
}


def peak_text(snapshot: Snapshot) -> str:
    """Each process's peak: its bytes, when, and how near the groups drawn for it are."""
    parts = []
    for peak in sorted(snapshot.peaks, key=lambda p: (-p.bytes, p.pid)):
        when = time.strftime("%H:%M:%S", time.localtime(peak.time))
        shown = sum(g.bytes for g in peak.groups)
        what = "estimated " if peak.estimate else ""
        near = f"; its stacks from a moment up to {peak.bound} bytes away ({shown} bytes)" if peak.bound else ""
        parts.append(f"peak of pid {peak.pid}: {peak.bytes} {what}live bytes at {when}{near}")
    return "\n".join(parts)


def stack_table(
    symbolized: SymbolizedSnapshot,
    ranked: list[list[AllocationGroup]],
    top: int,
    frames: int | None = None,
    growth: Growth | None = None,
) -> str:
    """The top stacks as a table; a pid column when they come from several processes, a
    growth column when a stack is a likely leak."""
    shown = ranked[:top]
    several = len({gs[0].pid for gs in ranked}) > 1
    leaks = growth.likely_leaks if growth else {}
    growing = any(stack_id(gs[0]) in leaks for gs in shown)
    rows = []
    for groups in shown:
        row = [sum(g.bytes for g in groups), sum(g.count for g in groups), sizes_text(groups)]
        if growing:
            rate = leaks.get(stack_id(groups[0]))
            row.append("" if rate is None else rate_text(rate))
        rows.append(([groups[0].pid] if several else []) + row + [stack_text(symbolized, groups[0], frames)])
    headers = (["pid"] if several else []) + ["bytes", "allocs", "sizes"] + (["growing"] if growing else []) + ["stack"]
    align = (["right"] if several else []) + ["right", "right", "left"] + (["right"] if growing else []) + ["left"]
    from tabulate import tabulate  # 20 ms of imports (importlib.metadata): for a report that has rows

    return tabulate(rows, headers=headers, tablefmt="simple", colalign=align, disable_numparse=True)


def render_text(
    symbolized: SymbolizedSnapshot,
    top: int = 10,
    frames: int | None = None,
    growth: Growth | None = None,
    measure: Measure = Measure.LIVE,
) -> str:
    snap = symbolized.snapshot
    names = (
        ", ".join(
            f"{p.label}{' exited' if p.exited else ''}" for p in sorted(snap.processes.values(), key=lambda p: p.pid)
        )
        or "none"
    )
    lines = [f"{clock(snap)} pid {names}: {totals_text(snap)}", drops_text(snap.counters)]
    title, by_count = MEASURE_TITLES[measure]
    ranked = ranked_stacks(snap.measured(measure), by_count)
    if not ranked:
        if measure == Measure.SHORT_LIVED and snap.sample_rate:
            lines.append("short-lived blocks are not counted when sampled (--sample): trace exactly to see them")
        elif measure != Measure.LIVE:
            lines.append(f"no stacks by {title}")
        elif snap.counters.incompleteness() is None:
            lines.append("no live allocations")
        else:
            lines.append("no live allocations recorded")
    else:
        lines.append(f"top {min(top, len(ranked))} of {len(ranked)} stacks by {title}:")
        lines.append(stack_table(symbolized, ranked, top, frames, growth if measure == Measure.LIVE else None))
    if snap.peaks:
        lines.append(peak_text(snap))
    return "\n".join(lines) + "\n"


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    return render_text(symbolized, context.top, growth=context.growth, measure=context.measure).encode()
