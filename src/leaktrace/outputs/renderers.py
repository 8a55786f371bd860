"""Every output leaktrace writes, one entry each in RENDERERS, behind one interface: an entry
names a typed function from what it renders (its input: a trace's `Report`, a process's
`Judgement` by the gate, a `ProcessView` for malloc_debug's files, a `HeapWalk`, a
`SiteChanges`, the gate's cases) to bytes, and the media type they are served or written as.
Every caller takes its entries here: the trace command (its report on stdout, its --NAME FILE
formats, the gate's and Android's files), the agent's routes, `heap` and `diff`. A new format
is its module and one entry here. Each function imports its module at its first call, so a
renderer's imports cost nothing at start-up; a plain-text report is followed by the
unreachable leaks and the leak checks the snapshot carries, in text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from leaktrace.model.snapshot import Measure

if TYPE_CHECKING:
    from leaktrace.analysis.growth import Growth
    from leaktrace.analysis.suppressions import LeakCheckSettings
    from leaktrace.analysis.symbolize import SymbolizedSnapshot
    from leaktrace.model.heap import HeapReport
    from leaktrace.model.snapshot import LeakCheck, UnreachableReport
    from leaktrace.outputs.junit import GateCase
    from leaktrace.outputs.report_diff import SiteChange

Input = TypeVar("Input")


@dataclass(frozen=True)
class RenderContext:
    """What a report's renderer may use beside the symbolized snapshot."""

    growth: Growth  # the likely leaks so far
    seconds: float = 0.0  # since the trace began
    measure: Measure = Measure.LIVE  # what the report is drawn or ranked by
    top: int = 10  # stacks listed (per process, in the per-process report)
    top_processes: int = 10
    min_bytes: int = 0  # the per-process report leaves out processes holding less
    contents: bool = False  # unreachable leaks with their first bytes
    leak_check: LeakCheckSettings | None = None


@dataclass(frozen=True)
class Report:
    """A trace's report: its symbolized snapshot, and the context it is drawn in."""

    symbolized: SymbolizedSnapshot
    context: RenderContext


@dataclass(frozen=True)
class Judgement:
    """One process's leak check as the gate judged it (its suppressions applied)."""

    symbolized: SymbolizedSnapshot
    check: LeakCheck
    settings: LeakCheckSettings
    tool_argv: tuple[str, ...] = ()  # leaktrace's own, for valgrind's XML <vargv>


@dataclass(frozen=True)
class ProcessView:
    """One process of a report, for malloc_debug's files of it."""

    symbolized: SymbolizedSnapshot
    pid: int
    program: str = ""  # as the leak log names it
    backtrace_full: bool = False


@dataclass(frozen=True)
class HeapWalk:
    """`leaktrace heap`'s walk of one process, its unreachable blocks symbolized."""

    report: HeapReport
    symbolized: SymbolizedSnapshot
    contents: bool = False


@dataclass(frozen=True)
class SiteChanges:
    """`leaktrace diff`'s comparison of two reports."""

    changes: list[SiteChange]
    old: str
    new: str
    top: int = 50


@dataclass(frozen=True)
class Renderer(Generic[Input]):
    name: str
    render: Callable[[Input], bytes]
    media_type: str
    option_help: str = ""  # a trace file format's: the trace command adds --NAME FILE
    what: str = ""  # how the line that says where a file went names it


def _unreachable_text(
    symbolized: SymbolizedSnapshot, unreachable: UnreachableReport, contents: bool, traced: bool
) -> str:
    from leaktrace.android.unreachable_report import render_unreachable

    text = render_unreachable(symbolized, unreachable, contents, traced=traced)
    return f"unreachable memory of pid {unreachable.pid}:\n" + text


def _text_sections(report: Report) -> bytes:
    symbolized, context = report.symbolized, report.context
    snapshot, text = symbolized.snapshot, ""
    if snapshot.unreachable:
        text += _unreachable_text(symbolized, snapshot.unreachable, context.contents, traced=True)
    settings = context.leak_check
    if settings:
        text += "".join(_leak_check(Judgement(symbolized, check, settings)).decode() for check in snapshot.leak_checks)
    return text.encode()


def _text(report: Report) -> bytes:
    from leaktrace.outputs.text import render

    return render(report.symbolized, report.context) + _text_sections(report)


def _processes(report: Report) -> bytes:
    from leaktrace.outputs.process_report import render

    return render(report.symbolized, report.context) + _text_sections(report)


def _json(report: Report) -> bytes:
    from leaktrace.outputs.json_report import render

    return render(report.symbolized, report.context)


def _pprof(report: Report) -> bytes:
    from leaktrace.outputs.pprof import render

    return render(report.symbolized, report.context)


def _folded(report: Report) -> bytes:
    from leaktrace.outputs.folded import render

    return render(report.symbolized, report.context)


def _html(report: Report) -> bytes:
    from leaktrace.outputs.html_page import render

    return render(report.symbolized, report.context)


def _metrics(report: Report) -> bytes:
    from leaktrace.outputs.metrics import render_metrics

    context = report.context
    return render_metrics(report.symbolized, context.growth, context.top_processes, context.min_bytes, context.seconds)


def _leak_check(judgement: Judgement) -> bytes:
    from leaktrace.outputs.leak_check import render_leak_check

    return render_leak_check(judgement.symbolized, judgement.check, judgement.settings).encode()


def _valgrind_xml(judgement: Judgement) -> bytes:
    from leaktrace.outputs.valgrind_xml import render_valgrind_xml

    return render_valgrind_xml(judgement.symbolized, judgement.check, judgement.settings, list(judgement.tool_argv))


def _junit(cases: list[GateCase]) -> bytes:
    from leaktrace.outputs.junit import render_junit

    return render_junit(cases)


def _heap_dump(process: ProcessView) -> bytes:
    from leaktrace.android.heap_dump import render_heap_dump

    return render_heap_dump(process.symbolized, process.pid, backtrace_full=process.backtrace_full).encode()


def _leak_log(process: ProcessView) -> bytes:
    from leaktrace.android.leak_log import render_leak_log

    return "".join(line + "\n" for line in render_leak_log(process.symbolized, process.pid, process.program)).encode()


def _heap_text(walk: HeapWalk) -> bytes:
    from leaktrace.outputs.heap_summary import render_heap_text

    text, unreachable = render_heap_text(walk.report), walk.report.unreachable
    if unreachable:
        text += _unreachable_text(walk.symbolized, unreachable, walk.contents, traced=False)
    return text.encode()


def _heap_json(walk: HeapWalk) -> bytes:
    from leaktrace.outputs.heap_summary import render_heap_json
    from leaktrace.outputs.json_report import unreachable_to_dict

    unreachable = walk.report.unreachable
    found = unreachable_to_dict(walk.symbolized, unreachable) if unreachable else None
    return render_heap_json(walk.report, found).encode()


def _diff_text(diff: SiteChanges) -> bytes:
    from leaktrace.outputs.report_diff import render_diff_text

    return render_diff_text(diff.changes, diff.old, diff.new, diff.top).encode()


def _diff_json(diff: SiteChanges) -> bytes:
    import json

    from leaktrace.outputs.report_diff import diff_to_dict

    return (json.dumps(diff_to_dict(diff.changes, diff.old, diff.new), separators=(",", ":")) + "\n").encode()


TEXT, JSON, XML = "text/plain; charset=utf-8", "application/json", "application/xml"


@dataclass(frozen=True)
class Renderers:
    """The table: one field an entry, typed by what the entry renders."""

    text: Renderer[Report]  # one process's stacks (-p, -c), on stdout
    processes: Renderer[Report]  # per process (--all), on stdout
    json: Renderer[Report]  # --json: one object a report; the agent's /status
    pprof: Renderer[Report]  # --pprof FILE; the agent's /debug/pprof/heap
    folded: Renderer[Report]
    html: Renderer[Report]
    metrics: Renderer[Report]  # the agent's /metrics
    leak_check: Renderer[Judgement]  # the gate's text, and its JUnit case's output
    valgrind_xml: Renderer[Judgement]  # --xml-file
    junit: Renderer[list[GateCase]]  # --junit
    heap_dump: Renderer[ProcessView]  # malloc_debug's heap dump (PREFIX.PID.txt)
    leak_log: Renderer[ProcessView]  # malloc_debug's leak log (+++ lines on stderr)
    heap_text: Renderer[HeapWalk]  # leaktrace heap
    heap_json: Renderer[HeapWalk]  # leaktrace heap --json
    diff_text: Renderer[SiteChanges]  # leaktrace diff
    diff_json: Renderer[SiteChanges]  # leaktrace diff --json

    def entries(self) -> list[Renderer[Any]]:
        return [getattr(self, entry.name) for entry in fields(self)]

    def file_formats(self) -> list[Renderer[Report]]:
        """The trace's --NAME FILE formats, written at every report."""
        return [entry for entry in self.entries() if entry.option_help]


RENDERERS = Renderers(
    text=Renderer("text", _text, TEXT),
    processes=Renderer("processes", _processes, TEXT),
    json=Renderer("json", _json, JSON),
    pprof=Renderer(
        "pprof",
        _pprof,
        "application/octet-stream",  # gzip'd protobuf, as Go's net/http/pprof serves it
        option_help="write each report as a gzip'd pprof profile (go tool pprof, Pyroscope, Parca)",
        what="pprof profile",
    ),
    folded=Renderer(
        "folded",
        _folded,
        TEXT,
        option_help="write each report as collapsed stacks (flamegraph.pl, inferno, speedscope)",
        what="folded stacks",
    ),
    html=Renderer(
        "html",
        _html,
        "text/html; charset=utf-8",
        option_help="write each report as one self-contained HTML page with a flame graph",
        what="HTML page",
    ),
    metrics=Renderer("metrics", _metrics, "text/plain; version=0.0.4; charset=utf-8"),
    leak_check=Renderer("leak_check", _leak_check, TEXT),
    valgrind_xml=Renderer("valgrind_xml", _valgrind_xml, XML, what="valgrind XML"),
    junit=Renderer("junit", _junit, XML, what="JUnit XML"),
    heap_dump=Renderer("heap_dump", _heap_dump, TEXT, what="heap dump"),
    leak_log=Renderer("leak_log", _leak_log, TEXT),
    heap_text=Renderer("heap_text", _heap_text, TEXT),
    heap_json=Renderer("heap_json", _heap_json, JSON),
    diff_text=Renderer("diff_text", _diff_text, TEXT),
    diff_json=Renderer("diff_json", _diff_json, JSON),
)
