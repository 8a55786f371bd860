"""Every report format, one entry each in RENDERERS, behind one interface: the entry's module
defines `render(symbolized, RenderContext) -> bytes`. An entry goes to standard output (the
trace command picks one by name: text, processes for --all, json) or to a file (the trace
command adds its --NAME FILE option and writes the file at every report). A new format is its
module and one line here; the modules load with the first report, not at start-up. A plain-text
entry is followed by the unreachable leaks and the leak checks the snapshot carries, in text."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaktrace.model.snapshot import Measure

if TYPE_CHECKING:
    from leaktrace.analysis.growth import Growth
    from leaktrace.analysis.suppressions import LeakCheckSettings
    from leaktrace.analysis.symbolize import SymbolizedSnapshot


@dataclass(frozen=True)
class RenderContext:
    """What a renderer may use beside the symbolized snapshot."""

    growth: Growth  # the likely leaks so far
    seconds: float = 0.0  # since the trace began
    measure: Measure = Measure.LIVE  # what the report is drawn or ranked by
    top: int = 10  # stacks listed (per process, in the per-process report)
    top_processes: int = 10
    min_bytes: int = 0  # the per-process report leaves out processes holding less
    contents: bool = False  # unreachable leaks with their first bytes
    leak_check: LeakCheckSettings | None = None


@dataclass(frozen=True)
class Renderer:
    name: str  # the stdout report's name, or the file format's option (--NAME FILE)
    module: str  # leaktrace.outputs.MODULE, which defines render
    to_file: bool
    help: str = ""  # a file format's option help
    what: str = ""  # how the line that says where a file went names it
    plain_text: bool = False  # followed by the unreachable leaks and leak checks in text

    def render(self, symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
        data = importlib.import_module(f"leaktrace.outputs.{self.module}").render(symbolized, context)
        return data + _text_sections(symbolized, context).encode() if self.plain_text else data


def _text_sections(symbolized: SymbolizedSnapshot, context: RenderContext) -> str:
    from leaktrace.android.unreachable_report import render_unreachable
    from leaktrace.outputs.leak_check import render_leak_check

    snapshot, text = symbolized.snapshot, ""
    if snapshot.unreachable:
        text += f"unreachable memory of pid {snapshot.unreachable.pid}:\n"
        text += render_unreachable(symbolized, snapshot.unreachable, context.contents)
    if context.leak_check:
        text += "".join(render_leak_check(symbolized, check, context.leak_check) for check in snapshot.leak_checks)
    return text


RENDERERS = {
    entry.name: entry
    for entry in (
        Renderer("text", "text", to_file=False, plain_text=True),  # one process's stacks (-p, -c)
        Renderer("processes", "process_report", to_file=False, plain_text=True),  # per process (--all)
        Renderer("json", "json_report", to_file=False),  # --json: one object a report
        Renderer(
            "pprof",
            "pprof",
            to_file=True,
            help="write each report as a gzip'd pprof profile (go tool pprof, Pyroscope, Parca)",
            what="pprof profile",
        ),
        Renderer(
            "folded",
            "folded",
            to_file=True,
            help="write each report as collapsed stacks (flamegraph.pl, inferno, speedscope)",
            what="folded stacks",
        ),
        Renderer(
            "html",
            "html_page",
            to_file=True,
            help="write each report as one self-contained HTML page with a flame graph",
            what="HTML page",
        ),
    )
}
FILE_FORMATS = tuple(entry for entry in RENDERERS.values() if entry.to_file)
