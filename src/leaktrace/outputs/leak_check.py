"""The leak check at a command's exit, in valgrind's shape: each loss record of the kinds
shown (smallest first, as valgrind lists them), with its stack and, when asked, a
suppression for it; then the LEAK SUMMARY and the suppressions used."""

from __future__ import annotations

from leaktrace.analysis.suppressions import LeakCheckSettings, suppression_text
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.model.snapshot import LeakCheck, LeakKind


def render_leak_check(symbolized: SymbolizedSnapshot, check: LeakCheck, settings: LeakCheckSettings) -> str:
    pause = f"{check.pause_seconds * 1000:.1f} ms"
    command = f" ({check.command})" if check.command else ""
    lines = [f"leak check of pid {check.pid}{command} (valgrind's kinds; it stood still {pause}):"]
    shown = sorted(
        (r for r in check.records if r.kind in settings.shown and r.suppressed_by is None),
        key=lambda r: (r.bytes, r.blocks),
    )
    for number, record in enumerate(() if settings.summary_only else shown, 1):
        lines.append(
            f"{record.bytes:,} bytes in {record.blocks:,} blocks are {record.kind.words}"
            f" in loss record {number} of {len(shown)}"
        )
        frames = symbolized.stack_of(record)
        lines += [f"   {'at' if i == 0 else 'by'} {frame.describe()}" for i, frame in enumerate(frames)]
        if not frames:
            lines.append(f"   (no stack: {record.stack_status.value})")
        if settings.generate:
            lines += suppression_text(record.kind, frames).splitlines()
        lines.append("")
    lines.append("LEAK SUMMARY:")
    for kind in LeakKind:
        size, blocks = check.total(kind)
        lines.append(f"   {kind.words:>15}: {size:,} bytes in {blocks:,} blocks")
    size, blocks = check.total(None)
    lines.append(f"   {'suppressed':>15}: {size:,} bytes in {blocks:,} blocks")
    lines += [
        f"used_suppression: {used.blocks:,} blocks, {used.bytes:,} bytes: {used.name} {used.source}"
        for used in check.suppressions_used
    ]
    return "\n".join(lines) + "\n"
