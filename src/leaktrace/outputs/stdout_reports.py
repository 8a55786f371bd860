"""The reports written to standard output at each report: one entry each, and one interface,
`render_stdout(symbolized, context) -> str` in the entry's module. The trace command picks
one by name; a new format is its module and one line here. A plain-text entry is followed
by the unreachable leaks and the leak checks the snapshot carries, in text."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaktrace.analysis.growth import Growth
    from leaktrace.analysis.suppressions import LeakCheckSettings
    from leaktrace.analysis.symbolize import SymbolizedSnapshot


@dataclass(frozen=True)
class ReportContext:
    """What a standard-output report may use beside the symbolized snapshot."""

    growth: Growth
    top: int = 10  # stacks listed (per process, in the per-process report)
    top_processes: int = 10
    min_bytes: int = 0  # the per-process report leaves out processes holding less
    contents: bool = False  # unreachable leaks with their first bytes
    leak_check: LeakCheckSettings | None = None
    measure: str = "live"  # what the text report's table ranks (MEASURES)


@dataclass(frozen=True)
class StdoutFormat:
    name: str
    module: str  # leaktrace.outputs.MODULE, which defines render_stdout
    plain_text: bool  # followed by the unreachable leaks and leak checks in text

    def render(self, symbolized: SymbolizedSnapshot, context: ReportContext) -> str:
        text = importlib.import_module(f"leaktrace.outputs.{self.module}").render_stdout(symbolized, context)
        return text + _text_sections(symbolized, context) if self.plain_text else text


def _text_sections(symbolized: SymbolizedSnapshot, context: ReportContext) -> str:
    from leaktrace.android.unreachable_report import render_unreachable
    from leaktrace.outputs.leak_check import render_leak_check

    snapshot, text = symbolized.snapshot, ""
    if snapshot.unreachable:
        text += f"unreachable memory of pid {snapshot.unreachable.pid}:\n"
        text += render_unreachable(symbolized, snapshot.unreachable, context.contents)
    if context.leak_check:
        text += "".join(render_leak_check(symbolized, check, context.leak_check) for check in snapshot.leak_checks)
    return text


STDOUT_FORMATS = {
    entry.name: entry
    for entry in (
        StdoutFormat("text", "text", plain_text=True),  # one process's stacks (-p, -c)
        StdoutFormat("processes", "process_report", plain_text=True),  # per process (--all)
        StdoutFormat("json", "json_report", plain_text=False),  # --json: one object a report
    )
}
