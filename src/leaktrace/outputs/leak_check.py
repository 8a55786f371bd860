"""The leak check at a command's exit, in valgrind's shape: each loss record of the kinds
shown (smallest first, as valgrind lists them), with its stack and, when asked, a
suppression for it; then the LEAK SUMMARY and the suppressions used."""

from __future__ import annotations

from leaktrace.analysis.suppressions import LeakCheckSettings, suppression_text
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.model.snapshot import LeakCheck, LeakKind, LossRecord


def listed_records(check: LeakCheck, settings: LeakCheckSettings) -> list[LossRecord]:
    """The loss records a leak check lists: of the kinds shown, no suppression matched,
    smallest first (as valgrind numbers them)."""
    return sorted(
        (r for r in check.records if r.kind in settings.shown and r.suppressed_by is None),
        key=lambda r: (r.bytes, r.blocks),
    )


def loss_record_title(record: LossRecord, number: int, count: int) -> str:
    """valgrind's line for a loss record: its bytes, blocks, kind and place in the list."""
    return (
        f"{record.bytes:,} bytes in {record.blocks:,} blocks are {record.kind.words} in loss record {number} of {count}"
    )


def render_leak_check(symbolized: SymbolizedSnapshot, check: LeakCheck, settings: LeakCheckSettings) -> str:
    pause = f"{check.pause_seconds * 1000:.1f} ms"
    command = f" ({check.command})" if check.command else ""
    lines = [f"leak check of pid {check.pid}{command} (valgrind's kinds; it stood still {pause}):"]
    shown = listed_records(check, settings)
    for number, record in enumerate(() if settings.summary_only else shown, 1):
        lines.append(loss_record_title(record, number, len(shown)))
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
