"""The text report: totals, drop counters, then the top stacks by live bytes."""
from __future__ import annotations

import time
from collections import defaultdict

from tabulate import tabulate

from .snapshot import AllocationGroup, StackStatus
from .symbolize import SymbolizedSnapshot

_NO_STACK = {
    StackStatus.FILTERED: "(no stack: size outside the backtrace size range)",
    StackStatus.LOST: "(stack lost: see the drop counters)",
}


def _sizes(groups: list[AllocationGroup]) -> str:
    ordered = sorted(groups, key=lambda g: (-g.bytes, g.size))
    text = ", ".join(f"{g.size}" if g.count == 1 and len(groups) == 1 else f"{g.size} x{g.count}"
                     for g in ordered)
    return text + (" (inherited)" if groups[0].inherited else "")


def _stack_text(symbolized: SymbolizedSnapshot, group: AllocationGroup, frames: int | None) -> str:
    if group.stack_status != StackStatus.CAPTURED:
        return _NO_STACK[group.stack_status]
    shown = symbolized.stack_of(group)[:frames]
    return "\n".join(frame.describe() for frame in shown)


def render_text(symbolized: SymbolizedSnapshot, top: int = 10, frames: int | None = None) -> str:
    snap = symbolized.snapshot
    counters = snap.counters
    lines = []
    names = ", ".join(f"{p.pid} ({p.comm}){' exited' if p.exited else ''}"
                      for p in sorted(snap.processes.values(), key=lambda p: p.pid)) or "none"
    lines.append(f"[{time.strftime('%H:%M:%S', time.localtime(snap.taken_at))}] pid {names}: "
                 f"{snap.live_bytes} live bytes in {snap.live_allocations} allocations "
                 f"({counters.allocations} allocated, {counters.frees} freed since the trace began)")
    drops = ", ".join(f"{name} {value}" for name, value in counters.losses().items())
    lines.append(f"drops: {drops}")

    by_stack: dict[tuple[int, tuple[int, ...], StackStatus, bool], list[AllocationGroup]] = defaultdict(list)
    for group in snap.groups:
        by_stack[group.pid, group.stack, group.stack_status, group.inherited].append(group)
    ranked = sorted(by_stack.values(),
                    key=lambda gs: (-sum(g.bytes for g in gs), -sum(g.count for g in gs), gs[0].stack,
                                    gs[0].inherited))
    if not ranked:
        lines.append("no live allocations")
        return "\n".join(lines) + "\n"
    lines.append(f"top {min(top, len(ranked))} of {len(ranked)} stacks by live bytes:")
    several = len({gs[0].pid for gs in ranked}) > 1
    rows = []
    for groups in ranked[:top]:
        row = [sum(g.bytes for g in groups), sum(g.count for g in groups), _sizes(groups),
               _stack_text(symbolized, groups[0], frames)]
        rows.append(([groups[0].pid] if several else []) + row)
    headers = (["pid"] if several else []) + ["bytes", "allocs", "sizes", "stack"]
    align = (["right"] if several else []) + ["right", "right", "left", "left"]
    lines.append(tabulate(rows, headers=headers, tablefmt="simple", colalign=align, disable_numparse=True))
    return "\n".join(lines) + "\n"
