"""libmemunreachable's text for an unreachable-memory report (UnreachableMemoryInfo::ToString
and Leak::ToString), with two upstream quirks decided: the contents header says
"first 32 bytes" in decimal (upstream's stream is left in hex there and prints "first
20 bytes" unless a referencing line came before), and bytes print as two hex digits
(upstream sign-extends bytes >= 0x80 to "ffffffeb" on x86, where char is signed)."""

from __future__ import annotations

from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.android.leak_log import backtrace_lines
from leaktrace.model.snapshot import CONTENTS_LENGTH, StackStatus, UnreachableLeak, UnreachableReport
from leaktrace.platform import arch


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _hexdump(address: int, contents: bytes) -> list[str]:
    lines = []
    for offset in range(0, len(contents), 16):
        row = contents[offset : offset + 16]
        hex_part = "".join(f"{byte:02x} " for byte in row) + "   " * (16 - len(row))
        text = "".join(chr(byte) if 0x20 <= byte < 0x7F else "." for byte in row)
        lines.append(f"   {address + offset:x}: {hex_part}{text}")
    return lines


def _leak_lines(symbolized: SymbolizedSnapshot, leak: UnreachableLeak, contents: bool, traced: bool) -> list[str]:
    lines = [f"  {leak.size} bytes unreachable at {leak.address:x}"]
    if leak.referenced_count:
        lines.append(
            f"   referencing {leak.referenced_size} unreachable bytes in {leak.referenced_count} "
            f"allocation{_plural(leak.referenced_count)}"
        )
    if leak.similar_count:
        lines.append(
            f"   and {leak.similar_size} similar unreachable bytes in {leak.similar_count} "
            f"allocation{_plural(leak.similar_count)}"
        )
        if leak.similar_referenced_count:
            lines.append(
                f"   referencing {leak.similar_referenced_size} unreachable bytes in "
                f"{leak.similar_referenced_count} allocation{_plural(leak.similar_referenced_count)}"
            )
    if contents:
        shown = min(leak.size, CONTENTS_LENGTH)
        lines.append("   contents:" if shown == leak.size else f"   first {shown} bytes of contents:")
        lines += _hexdump(leak.address, leak.contents[:shown])
    if leak.stack:
        lines += backtrace_lines(symbolized, leak.pid, leak.stack)
    elif leak.stack_status == StackStatus.BEFORE_TRACE:
        lines.append(
            "   allocated before the trace: no stack, and the size is glibc's usable size"
            if traced
            else "   no stack (found by the heap walk, no trace ran); the size is glibc's usable size"
        )
    return lines


def render_unreachable(
    symbolized: SymbolizedSnapshot, report: UnreachableReport, contents: bool = False, traced: bool = True
) -> str:
    """The summary, then each leak followed by a blank line; then how the check went (traced:
    a trace ran beside the heap walk, as against `leaktrace heap`)."""
    lines = [
        f"  {report.leak_bytes} bytes in {report.num_leaks} unreachable allocation{_plural(report.num_leaks)}",
        f"  ABI: '{arch.HOST.abi}'",
        "",
    ]
    for leak in report.leaks:
        lines += _leak_lines(symbolized, leak, contents, traced) + [""]
    lines.append(
        f"  {report.num_allocations} allocations ({report.allocation_bytes} bytes) judged; "
        f"the process stood still {report.pause_seconds * 1000:.1f} ms, the sweep took "
        f"{report.sweep_seconds * 1000:.1f} ms"
        + (f"; {report.unreadable_pages} unreadable pages read as zeros" if report.unreadable_pages else "")
    )
    if report.heap_walk:
        lines.append(f"  {report.heap_walk}")
    if report.before_trace and traced:
        lines.append(
            f"  {report.before_trace} of the allocations judged have no stack: the heap walk found them, "
            "the trace had not seen them"
        )
    lines += [f"  heap walk incomplete: {problem}" for problem in dict.fromkeys(report.walk_problems)]
    if not report.complete:
        lines.append(
            "  blocks allocated before the trace began are not all known: those not found were not judged, "
            "and the heap around the known ones counted as roots"
        )
    if report.reported > len(report.leaks):
        lines.append(f"  {len(report.leaks)} of {report.reported} leaks shown (--limit)")
    if report.leaks:
        lines.append(f"  to take stacks of only these sizes: --options '{report.seed_options()}'")
    return "\n".join(lines) + "\n"
