"""The systemwide text report: a table of processes, the likely leaks, then the top
stacks of the largest processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from leaktrace.analysis.growth import Growth, stack_id
from leaktrace.analysis.process_table import process_rows
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.outputs.text import clock, drops_text, ranked_stacks, rate_text, stack_table, totals_text

if TYPE_CHECKING:
    from leaktrace.outputs.renderers import RenderContext


def render_process_report(
    symbolized: SymbolizedSnapshot,
    growth: Growth,
    top_processes: int = 10,
    top_stacks: int = 5,
    min_bytes: int = 0,
    frames: int | None = None,
) -> str:
    snap = symbolized.snapshot
    rows = process_rows(symbolized, growth)
    shown = [row for row in rows if row.live_bytes >= min_bytes]
    lines = [f"{clock(snap)} {len(rows)} processes: {totals_text(snap)}", drops_text(snap.counters)]
    if not shown:
        lines.append("no process holds live allocations" + (f" of {min_bytes} bytes or more" if min_bytes else ""))
        return "\n".join(lines) + "\n"
    from tabulate import tabulate  # 20 ms of imports (importlib.metadata): for a report that has rows

    contained = any(row.container for row in shown[:top_processes])  # a column only where one is
    table = [
        [
            row.pid,
            row.comm + (" (exited)" if row.exited else ""),
            *([row.container.short_id if row.container else "-"] if contained else []),
            row.live_bytes,
            row.live_allocations,
            f"{row.growth_bytes:+d}",
            rate_text(row.growth_rate),
        ]
        for row in shown[:top_processes]
    ]
    lines.append(
        f"top {len(table)} of {len(shown)} processes by live bytes"
        + (f" ({len(rows) - len(shown)} under {min_bytes} bytes left out)" if len(shown) < len(rows) else "")
        + ":"
    )
    lines.append(
        tabulate(
            table,
            headers=[
                "pid",
                "comm",
                *(["container"] if contained else []),
                "live bytes",
                "allocs",
                "growth",
                "growth/s",
            ],
            tablefmt="simple",
            colalign=["right", "left", *(["left"] if contained else []), "right", "right", "right", "right"],
            disable_numparse=True,
        )
    )
    listed = {row.pid for row in shown}
    ranked = ranked_stacks(snap.groups)
    leaks = [groups for groups in ranked if groups[0].pid in listed and stack_id(groups[0]) in growth.likely_leaks]
    if leaks:
        lines.append(f"likely leaks (live bytes rose in each of the last {growth.intervals} intervals):")
        lines.append(stack_table(symbolized, leaks, top_stacks * top_processes, 1, growth))
    for row in shown[:top_processes]:
        own = [groups for groups in ranked if groups[0].pid == row.pid]
        label = snap.processes[row.pid].label if row.pid in snap.processes else f"{row.pid} ({row.comm})"
        lines.append(f"pid {label}: top {min(top_stacks, len(own))} of {len(own)} stacks by live bytes:")
        lines.append(stack_table(symbolized, own, top_stacks, frames, growth))
    return "\n".join(lines) + "\n"


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    report = render_process_report(symbolized, context.growth, context.top_processes, context.top, context.min_bytes)
    return report.encode()
