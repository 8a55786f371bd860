"""The report formats written to files (--pprof, --folded, --html): one entry each, and one
interface, `render_file(symbolized, context) -> bytes` in the entry's module. The trace
command adds an option per entry and writes each file given at every report; a new format
is its module and one line here. The modules load with the first report, not at start-up."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaktrace.analysis.growth import Growth
    from leaktrace.analysis.symbolize import SymbolizedSnapshot


@dataclass(frozen=True)
class FileContext:
    """What a file's renderer may use beside the symbolized snapshot."""

    growth: Growth  # the likely leaks so far
    seconds: float  # since the trace began
    measure: str = "live"  # what the file is drawn by (MEASURES)


@dataclass(frozen=True)
class FileFormat:
    option: str  # --OPTION FILE
    what: str  # how the line that says where it went names it
    help: str
    module: str  # leaktrace.outputs.MODULE, which defines render_file

    def render(self, symbolized: SymbolizedSnapshot, context: FileContext) -> bytes:
        return importlib.import_module(f"leaktrace.outputs.{self.module}").render_file(symbolized, context)


FILE_FORMATS = (
    FileFormat(
        "pprof",
        "pprof profile",
        "write each report as a gzip'd pprof profile (go tool pprof, Pyroscope, Parca)",
        "pprof",
    ),
    FileFormat(
        "folded",
        "folded stacks",
        "write each report as collapsed stacks (flamegraph.pl, inferno, speedscope)",
        "folded",
    ),
    FileFormat(
        "html", "HTML page", "write each report as one self-contained HTML page with a flame graph", "html_page"
    ),
)
