"""What the trace command writes at each report, on SIGUSR2 and at the target's exit."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

from leaktrace.analysis.growth import GrowthTracker
from leaktrace.analysis.suppressions import LeakCheckSettings, apply_suppressions
from leaktrace.analysis.symbolize import Symbolizer
from leaktrace.android.heap_dump import render_heap_dump
from leaktrace.android.leak_info import get_malloc_leak_info
from leaktrace.android.leak_log import render_leak_log
from leaktrace.android.options import DEFAULT_DUMP_PREFIX
from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import LeakCheck, LeakKind, Snapshot
from leaktrace.outputs.files import FILE_FORMATS, FileContext
from leaktrace.outputs.junit import GateCase, render_junit
from leaktrace.outputs.leak_check import render_leak_check
from leaktrace.outputs.stdout_reports import STDOUT_FORMATS, ReportContext
from leaktrace.outputs.valgrind_xml import render_valgrind_xml
from leaktrace.platform.atomic_write import write_atomically

UNWRITTEN_OUTPUT = 3  # exit status: the trace ran to its end, but an output file could not be written


def write_fully(stream, text: str) -> None:
    """Writes text to a standard stream with os.write until all of it is out. Python's
    buffered writer drops the rest of a large write that a signal interrupts on a full
    pipe (seen with reports of 200 KB and SIGINT), and reports must arrive whole."""
    stream.flush()
    view = memoryview(text.encode())
    while view:
        view = view[os.write(stream.fileno(), view) :]


def _say(text: str) -> None:
    print(f"leaktrace: {text}", file=sys.stderr, flush=True)


@dataclass
class Outputs:
    json: bool = False
    top: int = 10
    leak_info: str | None = None  # raw get_malloc_leak_info buffer, rewritten each report (children: FILE.PID)
    dump_prefix: str = DEFAULT_DUMP_PREFIX  # heap dumps go to PREFIX.PID.txt and PREFIX.PID.exit.txt
    dump_each_report: bool = False  # PREFIX.PID.txt at each report (always on SIGUSR2)
    dump_on_exit: bool = False  # PREFIX.PID.exit.txt once, when a traced process exits
    backtrace_full: bool = False
    leak_track: bool = False  # the +++ leak log on stderr when a traced process exits
    systemwide: bool = False  # the per-process report; leak info in FILE.PID for every process
    top_processes: int = 10
    min_bytes: int = 0  # systemwide: processes holding less are left out of the report
    growth_intervals: int = 3  # rises in a row that flag a stack as a likely leak
    contents: bool = False  # unreachable leaks with their first bytes
    files: dict[str, str] = field(default_factory=dict)  # FileFormat.option -> path, rewritten each report
    leak_check: LeakCheckSettings | None = None  # --leak-check: valgrind's kinds (-c and --all at exit, -p at the end)
    xml_file: str | None = None  # --xml-file: each leak check in valgrind's XML (%p: its pid)
    junit_file: str | None = None  # --junit: the gate's cases so far, rewritten as they come
    tool_argv: tuple[str, ...] = ()  # leaktrace's own, for the XML's <vargv>
    measure: str = "live"  # what the text table, folded stacks, HTML and pprof are drawn by (MEASURES)

    def __post_init__(self):
        self.symbolizer = Symbolizer()
        self.growth = GrowthTracker(self.growth_intervals)
        self.unwritten = 0  # output files that could not be written (exit status 3)
        self.leaking: list[LeakCheck] = []  # leak checks with errors left after the suppressions
        self.judged: set[int] = set()  # pids whose leak check a report carried
        self.gate_cases: list[GateCase] = []  # --junit's, one a process judged or left unjudged
        self._announced: set[str] = set()  # paths said once ("written to"), not at every report
        self.started_at = time.time()

    @property
    def stdout_format(self) -> str:
        """The entry of STDOUT_FORMATS each report is written in."""
        return "json" if self.json else "processes" if self.systemwide else "text"

    def exit_status(self) -> int:
        """--error-exitcode's N when the leak check found errors; else UNWRITTEN_OUTPUT once an
        output file could not be written (the trace itself ran); else 0."""
        if self.leaking and self.leak_check is not None and self.leak_check.error_exitcode:
            return self.leak_check.error_exitcode
        return UNWRITTEN_OUTPUT if self.unwritten else 0

    def _write(self, path: str, data: bytes, what: str) -> None:
        try:
            write_atomically(path, data)
        except RuntimeFailure as e:
            self.unwritten += 1
            _say(str(e))
            return
        if path not in self._announced:
            self._announced.add(path)
            _say(f"{what} written to {path}")

    def _heap_dump(self, symbolized, pid: int, suffix: str) -> None:
        text = render_heap_dump(symbolized, pid, backtrace_full=self.backtrace_full)
        self._write(f"{self.dump_prefix}.{pid}{suffix}", text.encode(), "heap dump")

    def report(self, snapshot: Snapshot) -> None:
        """The report; per process, the leak-info file, heap dumps and, for one that exited, its leak log."""
        symbolized = self.symbolizer.symbolize(snapshot)
        if snapshot.leak_checks and self.leak_check is not None:
            settings = self.leak_check
            judged = tuple(apply_suppressions(c, symbolized, settings.suppressions) for c in snapshot.leak_checks)
            snapshot = dataclasses.replace(snapshot, leak_checks=judged)
            symbolized = dataclasses.replace(symbolized, snapshot=snapshot)
            for check in judged:
                self.judged.add(check.pid)
                leaks = bool(check.errors(settings.errors_for))
                if leaks:
                    self.leaking.append(check)
                if self.xml_file:
                    xml = render_valgrind_xml(symbolized, check, settings, list(self.tool_argv))
                    self._write(self.xml_file.replace("%p", str(check.pid)), xml, "valgrind XML")
                if self.junit_file:
                    self.gate_cases.append(
                        GateCase(
                            f"{check.command or check.pid} (pid {check.pid})",
                            check.pause_seconds,
                            self.leak_line(check) if leaks else None,
                            output=render_leak_check(symbolized, check, settings),
                        )
                    )
            if self.junit_file:
                self._write(self.junit_file, render_junit(self.gate_cases), "JUnit XML")
        growth = self.growth.observe(snapshot)
        context = ReportContext(
            growth, self.top, self.top_processes, self.min_bytes, self.contents, self.leak_check, self.measure
        )
        write_fully(sys.stdout, STDOUT_FORMATS[self.stdout_format].render(symbolized, context))
        file_context = FileContext(growth, snapshot.taken_at - self.started_at, self.measure)
        for output in FILE_FORMATS:
            if output.option in self.files:
                self._write(self.files[output.option], output.render(symbolized, file_context), output.what)
        for index, (pid, process) in enumerate(snapshot.processes.items()):
            if self.leak_info:
                info = get_malloc_leak_info(snapshot, pid)
                path = self.leak_info if index == 0 and not self.systemwide else f"{self.leak_info}.{pid}"
                self._write(path, info.buffer, "leak info")
                _say(
                    f"leak info of pid {pid}: overall_size {info.overall_size}, info_size {info.info_size}, "
                    f"total_memory {info.total_memory}, backtrace_size {info.backtrace_size}"
                    + (f" ({info.left_out} allocations over 2^31-1 bytes left out)" if info.left_out else "")
                )
            if self.leak_track and process.exited and snapshot.allocations is not None:
                lines = render_leak_log(symbolized, pid, process.name or process.comm)
                write_fully(sys.stderr, "".join(line + "\n" for line in lines))
            if self.dump_each_report:
                self._heap_dump(symbolized, pid, ".txt")
            if self.dump_on_exit and process.exited:
                self._heap_dump(symbolized, pid, ".exit.txt")

    def leaking_lines(self) -> list[str]:
        """At the end: each process judged with leaks of the error kinds left, with its command line."""
        if self.leak_check is None:
            return []
        return [self.leak_line(check) for check in self.leaking]

    def leak_line(self, check: LeakCheck) -> str:
        """A process's leaks of the error kinds, in one line with its command line."""
        assert self.leak_check is not None
        kinds = ", ".join(
            f"{kind.words}: {size:,} bytes in {blocks:,} blocks"
            for kind in sorted(self.leak_check.errors_for, key=list(LeakKind).index)
            for size, blocks in [check.total(kind)]
            if blocks
        )
        return f"leaks in pid {check.pid}" + (f" ({check.command})" if check.command else "") + f": {kinds}"

    def note_unjudged(self, what: str, why: str) -> None:
        """A command the gate could not judge: an error case in --junit's file."""
        if self.junit_file:
            self.gate_cases.append(GateCase(what, 0.0, error=why))
            self._write(self.junit_file, render_junit(self.gate_cases), "JUnit XML")

    def dump_now(self, snapshot: Snapshot) -> None:
        symbolized = self.symbolizer.symbolize(snapshot)
        for pid in snapshot.processes:
            self._heap_dump(symbolized, pid, ".txt")
