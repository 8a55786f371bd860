"""Collapsed ("folded") stacks, as flamegraph.pl, inferno and speedscope read them: one
line per stack, frames root first joined by ';', then a space and the live bytes (or the
bytes of another measure: allocated since the trace began, live at the peak, short-lived).

Each stack's root is its process, `comm (pid)`; a block a child inherited through fork
sits under `[inherited]`, and one without a stack under `[filtered]` or `[lost]`; an
inlined function is a frame of its own, `name (inlined)`.
"""

from __future__ import annotations

import os
from collections import Counter

from leaktrace.analysis.symbolize import Frame, SymbolizedSnapshot
from leaktrace.model.snapshot import AllocationGroup, Measure, StackStatus
from leaktrace.outputs.renderers import RenderContext


def frame_label(frame: Frame) -> str:
    """A frame's name in one token of a folded line (no ';', which separates frames)."""
    if frame.interpreted:
        label = frame.describe()
    elif frame.function:
        label = frame.function + (" (inlined)" if frame.inlined else "")
    elif frame.module:
        label = f"{os.path.basename(frame.module)}+{frame.offset:#x}"
    else:
        label = f"{frame.address:#x}"
    return label.replace(";", ":")


def stack_path(symbolized: SymbolizedSnapshot, group: AllocationGroup) -> list[str]:
    """A group's stack as names, root first: its process, [inherited], then its frames (or
    [filtered] / [lost])."""
    process = symbolized.snapshot.processes.get(group.pid)
    path = [f"{(process.comm if process else '') or '?'} ({group.pid})".replace(";", ":")]
    if group.inherited:
        path.append("[inherited]")
    if group.stack_status == StackStatus.CAPTURED:
        path += [frame_label(frame) for frame in reversed(symbolized.stack_of(group))]
    else:
        path.append(f"[{group.stack_status.value}]")
    return path


def render_folded(symbolized: SymbolizedSnapshot, measure: Measure = Measure.LIVE) -> str:
    totals: Counter[tuple[str, ...]] = Counter()
    for group in symbolized.snapshot.measured(measure):
        totals[tuple(stack_path(symbolized, group))] += group.bytes
    return "".join(f"{';'.join(path)} {total}\n" for path, total in sorted(totals.items()) if total)


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    return render_folded(symbolized, context.measure).encode()
